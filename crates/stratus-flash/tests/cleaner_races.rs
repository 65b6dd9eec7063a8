//! The cleaner on its own thread against writers overwriting and deleting, and readers reading
//! what the index says: a reader gets the exact version it looked up, or `SegmentFreed` (the
//! index moved on: it looks again), never another object's bytes and never a read error from a
//! segment freed under it (read epochs). At the end, the index holds exactly the last writes,
//! and so does a restart.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{append_all_flushing, small_config, Located, TABLE};
use stratus_flash::{
    recover, EntryRef, FlashAddress, FlashError, FlashLog, MemoryDevice, Relocation,
    RelocationIndex,
};

const KEYS: u64 = 40;
const WRITES: u64 = 3000;

type SharedIndex = Arc<Mutex<HashMap<Vec<u8>, Located>>>;

fn key_of(number: u64) -> Vec<u8> {
    format!("key-{number}").into_bytes()
}

fn value_of(version: u64) -> Vec<u8> {
    vec![version as u8; 200 + (version % 7) as usize * 150]
}

/// The cleaner's view: the compare on the old address runs under the index lock.
struct SharedRelocation<'a>(&'a Mutex<HashMap<Vec<u8>, Located>>);

impl RelocationIndex for SharedRelocation<'_> {
    fn is_live(&mut self, entry: &EntryRef<'_>, address: FlashAddress) -> bool {
        self.0.lock().unwrap().get(entry.key).is_some_and(|located| located.address == address)
    }

    fn relocate(
        &mut self,
        entry: &EntryRef<'_>,
        old: FlashAddress,
        copy: &mut dyn FnMut() -> Result<FlashAddress, FlashError>,
    ) -> Result<Relocation, FlashError> {
        match self.0.lock().unwrap().get_mut(entry.key) {
            Some(located) if located.address == old => {
                located.address = copy()?;
                Ok(Relocation::Moved)
            }
            _ => Ok(Relocation::Superseded),
        }
    }
}

/// One write (or delete, every fifth version) of `key`, done under the index lock so index
/// order is log order for a key.
fn write(log: &FlashLog, index: &Mutex<HashMap<Vec<u8>, Located>>, key: &[u8], version: u64) {
    let mut index = index.lock().unwrap();
    let old = index.get(key).copied();
    let value = value_of(version);
    let delete = version.is_multiple_of(5);
    let object = EntryRef::object(TABLE, key, &value, version);
    let addresses = match (old, delete) {
        (None, true) => return,
        (Some(old), true) => {
            append_all_flushing(log, &[EntryRef::tombstone(TABLE, key, old.version, old.address)])
                .unwrap()
        }
        (Some(old), false) => {
            let tombstone = EntryRef::tombstone(TABLE, key, old.version, old.address);
            append_all_flushing(log, &[object, tombstone]).unwrap()
        }
        (None, false) => append_all_flushing(log, &[object]).unwrap(),
    };
    if let Some(old) = old {
        log.note_dead(old.address, old.entry_bytes);
    }
    if delete {
        index.remove(key);
    } else {
        let address = addresses[0];
        index.insert(
            key.to_vec(),
            Located { address, version, entry_bytes: object.encoded_bytes() },
        );
    }
}

#[test]
fn readers_never_see_wrong_bytes_or_freed_segments_while_the_cleaner_runs() {
    let device = MemoryDevice::new(64 << 10, 256 * (64 << 10));
    let log = Arc::new(FlashLog::create(Arc::new(device.clone()), small_config()).unwrap());
    let index: SharedIndex = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let segments_cleaned = Arc::new(AtomicU64::new(0));
    let reads_done = Arc::new(AtomicU64::new(0));

    let cleaner = {
        let (log, index, done, cleaned) = (
            Arc::clone(&log),
            Arc::clone(&index),
            Arc::clone(&done),
            Arc::clone(&segments_cleaned),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if let Some(&segment) = log.segments_to_clean().first() {
                    let outcome =
                        log.clean_segment(segment, &mut SharedRelocation(&index)).unwrap();
                    assert!(!outcome.gave_up_on_lock);
                    cleaned.fetch_add(1, Ordering::SeqCst);
                }
                log.flush_ready().unwrap();
                std::thread::yield_now();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|reader| {
            let (log, index, done) = (Arc::clone(&log), Arc::clone(&index), Arc::clone(&done));
            let reads_done = Arc::clone(&reads_done);
            std::thread::spawn(move || {
                let (mut reads, mut retries) = (0u64, 0u64);
                let mut number = reader;
                while !done.load(Ordering::SeqCst) {
                    number = (number + 7) % KEYS;
                    let key = key_of(number);
                    loop {
                        let Some(located) = index.lock().unwrap().get(&key).copied() else { break };
                        if (reads + retries).is_multiple_of(8) {
                            // Hold the address a while, as a slow reader would: by the time it
                            // reads, the cleaner may have moved and freed it.
                            (0..100).for_each(|_| std::thread::yield_now());
                        }
                        match log.read(located.address) {
                            Ok(entry) => {
                                assert_eq!(entry.key, key);
                                assert_eq!(entry.version, located.version);
                                assert_eq!(entry.value, value_of(located.version));
                                reads += 1;
                                reads_done.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            Err(FlashError::SegmentFreed { .. }) => retries += 1,
                            Err(other) => panic!("read of {key:?} at {located:?}: {other:?}"),
                        }
                    }
                }
                (reads, retries)
            })
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let (log, index) = (Arc::clone(&log), Arc::clone(&index));
            std::thread::spawn(move || {
                for step in 0..WRITES {
                    let version = step * 2 + writer + 1;
                    write(&log, &index, &key_of(version % KEYS), version);
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    // On a loaded machine the writers may finish before the cleaner or a reader got a turn:
    // the race is only tested once both have worked, so wait for that (bounded).
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while (segments_cleaned.load(Ordering::SeqCst) == 0 || reads_done.load(Ordering::SeqCst) == 0)
        && std::time::Instant::now() < patience
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    done.store(true, Ordering::SeqCst);
    cleaner.join().unwrap();
    let (reads, _retries) = readers
        .into_iter()
        .map(|reader| reader.join().unwrap())
        .fold((0, 0), |sum, (reads, retries)| (sum.0 + reads, sum.1 + retries));
    assert!(reads > 0);
    assert!(segments_cleaned.load(Ordering::SeqCst) > 0, "the cleaner ran");
    log.sync().unwrap();

    let index = index.lock().unwrap().clone();
    for (key, located) in &index {
        let entry = log.read(located.address).unwrap();
        assert_eq!((&entry.key, entry.version), (key, located.version));
    }
    drop(log);
    let (_, recovery) = recover(Arc::new(device), small_config()).unwrap();
    let recovered: HashMap<Vec<u8>, u64> =
        recovery.objects.iter().map(|((_, key), object)| (key.clone(), object.version)).collect();
    let expected: HashMap<Vec<u8>, u64> =
        index.iter().map(|(key, located)| (key.clone(), located.version)).collect();
    assert_eq!(recovered, expected);
}
