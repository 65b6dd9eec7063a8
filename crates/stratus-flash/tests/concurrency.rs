//! Many appenders copying into the same flush buffers while a flusher writes and recycles them
//! and readers read addresses that move from DRAM to the device under them: every entry reads
//! back identical before and after its flush, and after a restart.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use stratus_flash::{
    recover, CostBenefit, EntryRef, FlashAddress, FlashConfig, FlashError, FlashLog, Geometry,
    MemoryDevice,
};

const APPENDERS: u64 = 4;
const ENTRIES_PER_APPENDER: u64 = 1500;

fn config() -> FlashConfig {
    FlashConfig {
        geometry: Geometry::new(256 << 10, 16 << 10).unwrap(),
        flush_buffers: 4,
        log_id: 3,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 1,
    }
}

fn key_of(appender: u64, index: u64) -> Vec<u8> {
    format!("{appender}/{index}").into_bytes()
}

/// Sizes from 0 to ~2 KiB, different per entry, so reservations interleave at odd offsets.
fn value_of(appender: u64, index: u64) -> Vec<u8> {
    let length = ((appender * 7919 + index * 104_729) % 2100) as usize;
    (0..length).map(|byte| (byte as u64 ^ appender ^ index) as u8).collect()
}

fn check(log: &FlashLog, address: FlashAddress, appender: u64, index: u64) {
    let entry = log.read(address).unwrap_or_else(|error| panic!("{appender}/{index}: {error:?}"));
    assert_eq!(entry.key, key_of(appender, index));
    assert_eq!(entry.value, value_of(appender, index));
    assert_eq!(entry.version, appender << 32 | index);
}

#[test]
fn every_entry_appended_concurrently_reads_back_identical_before_and_after_flush() {
    let device = MemoryDevice::new(256 << 10, 64 << 20);
    let log = Arc::new(FlashLog::create(Arc::new(device.clone()), config()).unwrap());
    let written: Arc<Mutex<Vec<(FlashAddress, u64, u64)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));

    let flusher = {
        let (log, done) = (Arc::clone(&log), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                log.flush_ready().unwrap();
                std::thread::yield_now();
            }
        })
    };
    let reader = {
        let (log, done, written) = (Arc::clone(&log), Arc::clone(&done), Arc::clone(&written));
        std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut position = 0usize;
            while !done.load(Ordering::SeqCst) {
                let sample = {
                    let written = written.lock().unwrap();
                    if written.is_empty() {
                        None
                    } else {
                        position = (position + 7919) % written.len();
                        // Mostly the newest entries: those are the ones in buffers being recycled.
                        let newest = written.len().saturating_sub(1 + position % 64);
                        Some(written[if reads.is_multiple_of(2) { newest } else { position }])
                    }
                };
                if let Some((address, appender, index)) = sample {
                    check(&log, address, appender, index);
                    reads += 1;
                }
            }
            reads
        })
    };
    let appenders: Vec<_> = (0..APPENDERS)
        .map(|appender| {
            let (log, written) = (Arc::clone(&log), Arc::clone(&written));
            std::thread::spawn(move || {
                for index in 0..ENTRIES_PER_APPENDER {
                    let (key, value) = (key_of(appender, index), value_of(appender, index));
                    let entry = EntryRef::object(1, &key, &value, appender << 32 | index);
                    let address = loop {
                        match log.append(&entry) {
                            Err(FlashError::BuffersBusy) => std::thread::yield_now(),
                            other => break other.unwrap(),
                        }
                    };
                    check(&log, address, appender, index);
                    written.lock().unwrap().push((address, appender, index));
                }
            })
        })
        .collect();
    for appender in appenders {
        appender.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    flusher.join().unwrap();
    let reads = reader.join().unwrap();
    assert!(reads > 0);
    log.sync().unwrap();

    let written = written.lock().unwrap().clone();
    assert_eq!(written.len() as u64, APPENDERS * ENTRIES_PER_APPENDER);
    let mut by_address = written.clone();
    by_address.sort();
    for pair in by_address.windows(2) {
        let (first, appender, index) = pair[0];
        let length = EntryRef::object(1, &key_of(appender, index), &value_of(appender, index), 0)
            .encoded_bytes() as u64;
        assert!(first.0 + length <= pair[1].0 .0, "entries overlap at {first:?}");
    }
    for &(address, appender, index) in &written {
        check(&log, address, appender, index);
    }

    let (recovered_log, recovery) = recover(Arc::new(device), config()).unwrap();
    assert!(recovery.tears.is_empty());
    let recovered: HashMap<Vec<u8>, FlashAddress> =
        recovery.objects.iter().map(|((_, key), object)| (key.clone(), object.address)).collect();
    assert_eq!(recovered.len(), written.len());
    for &(address, appender, index) in &written {
        assert_eq!(recovered[&key_of(appender, index)], address);
        check(&recovered_log, address, appender, index);
    }
}
