//! A minimal owner of a flash log for tests: an index from key to address, as a server's hash
//! table would hold it, with overwrites and deletes done the way the log expects (the new
//! object, then a tombstone for the replaced version, in one batch; `note_dead` for what
//! died), and a relocation index for the cleaner that can simulate racing writers and locks.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use stratus_flash::{
    recover, CostBenefit, EntryKind, EntryRef, FlashAddress, FlashConfig, FlashError, FlashLog,
    Geometry, MemoryDevice, Recovery, Relocation, RelocationIndex,
};

pub const TABLE: u64 = 9;

/// Where the index says an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    pub address: FlashAddress,
    pub version: u64,
    pub entry_bytes: usize,
}

pub fn small_config() -> FlashConfig {
    FlashConfig {
        geometry: Geometry::new(64 << 10, 16 << 10).unwrap(),
        flush_buffers: 3,
        log_id: 0x5eed,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 1,
    }
}

/// Retries an append after flushing while every buffer is busy.
pub fn append_all_flushing(
    log: &FlashLog,
    entries: &[EntryRef<'_>],
) -> Result<Vec<FlashAddress>, FlashError> {
    loop {
        match log.append_all(entries) {
            Err(FlashError::BuffersBusy) => {
                log.flush_ready()?;
            }
            other => return other,
        }
    }
}

/// Writes `key` = `value` at `version` over what `index` holds; returns the new object's end.
pub fn put(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    key: &[u8],
    value: &[u8],
    version: u64,
) -> Result<FlashAddress, FlashError> {
    let object = EntryRef::object(TABLE, key, value, version);
    let old = index.get(key).copied();
    let addresses = match old {
        Some(old) => {
            // The object first: a write torn between the two leaves the new version (which
            // wins by version), never the old one's tombstone without it.
            let tombstone = EntryRef::tombstone(TABLE, key, old.version, old.address);
            append_all_flushing(log, &[object, tombstone])?[0]
        }
        None => append_all_flushing(log, &[object])?[0],
    };
    if let Some(old) = old {
        log.note_dead(old.address, old.entry_bytes);
    }
    let entry_bytes = object.encoded_bytes();
    index.insert(key.to_vec(), Located { address: addresses, version, entry_bytes });
    Ok(FlashAddress(addresses.0 + entry_bytes as u64))
}

/// Deletes `key`; returns the tombstone's end, or `None` when the key was absent.
pub fn delete(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    key: &[u8],
) -> Result<Option<FlashAddress>, FlashError> {
    let Some(old) = index.get(key).copied() else { return Ok(None) };
    let tombstone = EntryRef::tombstone(TABLE, key, old.version, old.address);
    let address = append_all_flushing(log, &[tombstone])?[0];
    log.note_dead(old.address, old.entry_bytes);
    index.remove(key);
    Ok(Some(FlashAddress(address.0 + tombstone.encoded_bytes() as u64)))
}

/// The index a recovery rebuilt.
pub fn index_from(recovery: &Recovery) -> HashMap<Vec<u8>, Located> {
    recovery
        .objects
        .iter()
        .map(|((table, key), object)| {
            assert_eq!(*table, TABLE);
            let located = Located {
                address: object.address,
                version: object.version,
                entry_bytes: object.entry_bytes,
            };
            (key.clone(), located)
        })
        .collect()
}

/// Recovers a log from `device` (a restart on the same disk).
pub fn restart(device: &MemoryDevice, config: FlashConfig) -> (FlashLog, Recovery) {
    recover(Arc::new(device.clone()), config).expect("recovery")
}

/// Reads every key of `index` and checks the model holds exactly those values.
pub fn assert_matches_model(
    log: &FlashLog,
    index: &HashMap<Vec<u8>, Located>,
    model: &HashMap<Vec<u8>, Vec<u8>>,
) {
    assert_eq!(
        index.keys().collect::<HashSet<_>>(),
        model.keys().collect::<HashSet<_>>(),
        "the index and the model hold different keys"
    );
    for (key, located) in index {
        let entry = log.read(located.address).expect("reading an indexed object");
        assert_eq!(entry.kind, EntryKind::Object);
        assert_eq!(&entry.key, key);
        assert_eq!(entry.version, located.version);
        assert_eq!(&entry.value, &model[key], "key {key:?}");
    }
}

/// The cleaner's view of the index, with a racing writer: the first time the cleaner looks at
/// a key of `racing`, a write of that key lands between its look and its compare; keys of
/// `locked` are held by a transaction; relocating a key of `failing` fails (as a full disk
/// would) with [`INJECTED_RELOCATION_ERROR`], without a copy.
pub const INJECTED_RELOCATION_ERROR: FlashError = FlashError::Full { budget_bytes: u64::MAX };

pub struct RacingIndex<'a> {
    pub log: &'a FlashLog,
    pub index: &'a mut HashMap<Vec<u8>, Located>,
    pub racing: HashSet<Vec<u8>>,
    pub locked: HashSet<Vec<u8>>,
    pub failing: HashSet<Vec<u8>>,
    pub next_version: &'a mut u64,
    /// (key, value) of every racing write done.
    pub raced: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RelocationIndex for RacingIndex<'_> {
    fn is_live(&mut self, entry: &EntryRef<'_>, address: FlashAddress) -> bool {
        let live = self.index.get(entry.key).is_some_and(|located| located.address == address);
        if live && self.racing.remove(entry.key) {
            let value = format!("raced-{}", *self.next_version).into_bytes();
            let written =
                retrying_frees(|| put(self.log, self.index, entry.key, &value, *self.next_version));
            *self.next_version += 1;
            match written {
                Ok(_) => self.raced.push((entry.key.to_vec(), value)),
                // A full disk refuses the racing write: nothing was written.
                Err(FlashError::Full { .. }) => {}
                Err(error) => panic!("racing write: {error:?}"),
            }
        }
        live
    }

    fn relocate(
        &mut self,
        entry: &EntryRef<'_>,
        old: FlashAddress,
        copy: &mut dyn FnMut() -> Result<FlashAddress, FlashError>,
    ) -> Result<Relocation, FlashError> {
        let Some(located) = self.index.get_mut(entry.key) else {
            return Ok(Relocation::Superseded);
        };
        if located.address != old {
            return Ok(Relocation::Superseded);
        }
        if self.locked.contains(entry.key) {
            return Ok(Relocation::Locked);
        }
        if self.failing.contains(entry.key) {
            return Err(INJECTED_RELOCATION_ERROR);
        }
        located.address = copy()?;
        Ok(Relocation::Moved)
    }
}

/// Runs `operation` again while it fails only because freeing a retired segment failed (an
/// injected fault): the flush that reported it had made its writes durable, and an append
/// that got it had not appended yet.
pub fn retrying_frees<T>(
    mut operation: impl FnMut() -> Result<T, FlashError>,
) -> Result<T, FlashError> {
    loop {
        match operation() {
            Err(FlashError::Io { operation: stratus_flash::IoOperation::Free, .. }) => {}
            other => return other,
        }
    }
}
