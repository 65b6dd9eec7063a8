//! Disk faults with the in-memory device: torn writes, write and sync errors, read errors and a
//! full disk. Each gives a typed error, and nothing acknowledged (durable) is lost.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{assert_matches_model, put, restart, small_config, Located};
use stratus_flash::{
    recover, EntryRef, FlashAddress, FlashError, FlashLog, FormatError, IoOperation, MemoryDevice,
    SegmentNumber,
};

fn new_log(budget_segments: u64) -> (FlashLog, MemoryDevice) {
    let device = MemoryDevice::new(64 << 10, budget_segments * (64 << 10));
    (FlashLog::create(Arc::new(device.clone()), small_config()).unwrap(), device)
}

/// Puts `count` keys starting at `first`, 1000-byte values; returns (key, value, address, end).
fn put_keys(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    model: &mut HashMap<Vec<u8>, Vec<u8>>,
    first: u64,
    count: u64,
) -> Vec<(Vec<u8>, FlashAddress)> {
    (first..first + count)
        .map(|number| {
            let key = format!("k{number}").into_bytes();
            let value = vec![number as u8; 1000];
            let end = put(log, index, &key, &value, number + 1).unwrap();
            model.insert(key.clone(), value);
            (key, end)
        })
        .collect()
}

#[test]
fn a_torn_flush_loses_only_unacknowledged_entries_and_restart_recovers_all_before_the_tear() {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    put_keys(&log, &mut index, &mut model, 0, 40);
    let acknowledged_end = log.sync().unwrap();
    let acknowledged = model.clone();

    // Five more entries sit in the current buffer; its write tears 3000 bytes in (inside the
    // third entry, each ~1048 bytes).
    let pending = put_keys(&log, &mut index, &mut model, 100, 5);
    let slot_start = log.durable_end().0;
    device.tear_next_write(3000);
    let error = log.sync().unwrap_err();
    assert!(matches!(error, FlashError::Io { operation: IoOperation::Write, .. }), "{error:?}");
    assert_eq!(log.durable_end(), acknowledged_end, "nothing torn is acknowledged");
    // Still readable from DRAM: the buffer stays sealed until a write succeeds.
    assert_matches_model(&log, &index, &model);

    // The machine dies here. Restart on the same disk.
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_eq!(recovery.tears.len(), 1, "{:?}", recovery.tears);
    assert!(recovery.tears[0].address.0 < slot_start + 3000);
    let recovered: HashMap<Vec<u8>, Vec<u8>> =
        recovery.objects.keys().map(|(_, key)| (key.clone(), model[key].clone())).collect();
    for (key, value) in &acknowledged {
        assert_eq!(recovered.get(key), Some(value), "acknowledged {key:?} lost");
    }
    // Exactly the pending entries that ended inside the persisted prefix survive.
    for (key, end) in &pending {
        assert_eq!(recovered.contains_key(key), end.0 <= slot_start + 3000, "{key:?}");
    }
    let index = common::index_from(&recovery);
    assert_matches_model(&log, &index, &recovered);
}

#[test]
fn a_torn_write_retried_before_any_crash_leaves_everything_durable() {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    put_keys(&log, &mut index, &mut model, 0, 30);
    device.tear_next_write(5000);
    assert!(log.sync().is_err());
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert!(recovery.tears.is_empty(), "the retry rewrote the torn slot whole");
    assert_matches_model(&log, &common::index_from(&recovery), &model);
}

#[test]
fn a_segment_whose_header_tore_is_discarded_at_restart() {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    // 61 entries of 1048 bytes: fifteen fill each 16 KiB slot, so sixty fill segment 1 and
    // the sixty-first starts segment 2.
    put_keys(&log, &mut index, &mut model, 0, 61);
    log.flush_ready().unwrap();
    let acknowledged_end = log.durable_end();
    assert_eq!(acknowledged_end, FlashAddress(2 * (64 << 10)), "segment 1 whole on the device");
    device.tear_next_write(20);
    assert!(log.sync().is_err());
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert!(matches!(
        recovery.discarded_segment,
        Some((SegmentNumber(2), FormatError::ChecksumMismatch | FormatError::Truncated))
    ));
    assert_eq!(device.segments_present(), vec![SegmentNumber(1)]);
    for object in recovery.objects.values() {
        assert!(object.address < acknowledged_end);
    }
    assert_matches_model(&log, &common::index_from(&recovery), &{
        let recovered = common::index_from(&recovery);
        model.retain(|key, _| recovered.contains_key(key));
        model
    });
    // The new head starts after the discarded number: addresses are never reused.
    let address = log.append(&EntryRef::object(9, b"after", b"restart", 1000)).unwrap();
    assert_eq!(address, FlashAddress(3 * (64 << 10) + 40));
}

#[test]
fn a_failed_write_or_sync_is_reported_and_retried_by_the_next_flush() {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    put_keys(&log, &mut index, &mut model, 0, 10);
    device.fail_next_writes(1);
    assert!(matches!(log.sync(), Err(FlashError::Io { operation: IoOperation::Write, .. })));
    device.fail_next_syncs(1);
    assert!(matches!(log.sync(), Err(FlashError::Io { operation: IoOperation::Sync, .. })));
    assert_matches_model(&log, &index, &model);
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_matches_model(&log, &common::index_from(&recovery), &model);
}

#[test]
fn a_read_error_is_a_typed_error_and_the_next_read_succeeds() {
    let (log, device) = new_log(16);
    let address = log.append(&EntryRef::object(1, b"k", b"v", 1)).unwrap();
    log.sync().unwrap();
    device.fail_next_reads(1);
    assert!(matches!(
        log.read(address),
        Err(FlashError::Io { operation: IoOperation::Read, segment: SegmentNumber(1), .. })
    ));
    assert_eq!(log.read(address).unwrap().value, b"v");
}

#[test]
fn corrupt_bytes_on_the_device_read_as_a_format_error_never_a_panic() {
    let (log, device) = new_log(16);
    let address = log.append(&EntryRef::object(1, b"k", b"value", 1)).unwrap();
    log.sync().unwrap();
    device.corrupt(SegmentNumber(1), 40 + 41, b"X");
    assert!(matches!(
        log.read(address),
        Err(FlashError::Format { error: FormatError::ChecksumMismatch, .. })
    ));
}

#[test]
fn a_full_disk_refuses_new_segments_with_full_and_loses_nothing_appended() {
    let (log, device) = new_log(2);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    let mut number = 0u64;
    let error = loop {
        let key = format!("k{number}").into_bytes();
        let value = vec![number as u8; 1000];
        match put(&log, &mut index, &key, &value, number + 1) {
            Ok(_) => {
                model.insert(key, value);
                number += 1;
            }
            Err(error) => break error,
        }
        assert!(number < 1000, "two segments hold about 120 entries");
    };
    assert_eq!(error, FlashError::Full { budget_bytes: 2 * (64 << 10) });
    // Everything appended is readable, and syncs: only a new segment needed space.
    assert_matches_model(&log, &index, &model);
    log.sync().unwrap();
    assert_eq!(
        log.append(&EntryRef::object(1, b"more", b"x", 5000)),
        Err(FlashError::Full { budget_bytes: 2 * (64 << 10) }),
        "still full, still typed"
    );
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_matches_model(&log, &common::index_from(&recovery), &model);
}

#[test]
fn a_segment_of_another_log_or_geometry_is_refused_at_restart() {
    let (log, device) = new_log(16);
    log.append(&EntryRef::object(1, b"k", b"v", 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    let mut other_log = small_config();
    other_log.log_id += 1;
    assert_eq!(
        recover(Arc::new(device.clone()), other_log).err(),
        Some(FlashError::ForeignSegment { segment: SegmentNumber(1) })
    );
    let mut other_geometry = small_config();
    other_geometry.geometry = stratus_flash::Geometry::new(64 << 10, 32 << 10).unwrap();
    // Two slots a segment take at most two buffers (`FlashConfig::check`).
    other_geometry.flush_buffers = 2;
    assert_eq!(
        recover(Arc::new(device), other_geometry).err(),
        Some(FlashError::GeometryMismatch { segment: SegmentNumber(1) })
    );
}

#[test]
fn a_full_disk_is_cleaned_through_the_cleaners_reserve_and_appends_resume() {
    // Four segments; the config keeps one for the cleaner, so clients fill three.
    let (log, device) = new_log(4);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    let mut version = 1u64;
    let error = loop {
        let key = format!("k{}", version % 10).into_bytes();
        let value = vec![version as u8; 1000];
        match put(&log, &mut index, &key, &value, version) {
            Ok(_) => {
                model.insert(key, value);
                version += 1;
            }
            Err(error) => break error,
        }
    };
    assert_eq!(error, FlashError::Full { budget_bytes: 4 * (64 << 10) });
    log.sync().unwrap();
    assert_eq!(device.segments_present().len(), 3, "the fourth is the cleaner's");

    let segment = log.segments_to_clean()[0];
    let mut cleaner_index = common::RacingIndex {
        log: &log,
        index: &mut index,
        racing: Default::default(),
        locked: Default::default(),
        failing: Default::default(),
        next_version: &mut version,
        raced: Vec::new(),
    };
    log.clean_segment(segment, &mut cleaner_index).unwrap();
    log.sync().unwrap();
    assert!(!device.segments_present().contains(&segment), "the cleaned segment is freed");

    let key = b"after".to_vec();
    put(&log, &mut index, &key, b"cleaning", version + 1).unwrap();
    model.insert(key, b"cleaning".to_vec());
    assert_matches_model(&log, &index, &model);
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_matches_model(&log, &common::index_from(&recovery), &model);
}

/// A log restarted after a crash that tore its last write.
struct TornRestart {
    log: FlashLog,
    device: MemoryDevice,
    /// The index the restart rebuilt, and the values it holds.
    index: HashMap<Vec<u8>, Located>,
    recovered: HashMap<Vec<u8>, Vec<u8>>,
    /// The segment the tear is in.
    torn: SegmentNumber,
}

/// Crashes with the last slot torn 3000 bytes in, and restarts.
fn restart_after_a_torn_write() -> TornRestart {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    put_keys(&log, &mut index, &mut model, 0, 40);
    log.sync().unwrap();
    put_keys(&log, &mut index, &mut model, 100, 5);
    device.tear_next_write(3000);
    log.sync().unwrap_err();
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_eq!(recovery.tears.len(), 1, "{:?}", recovery.tears);
    let torn = log.config().geometry.segment_of(recovery.tears[0].address);
    let index = common::index_from(&recovery);
    let recovered = index.keys().map(|key| (key.clone(), model[key].clone())).collect();
    TornRestart { log, device, index, recovered, torn }
}

fn clean_with(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    segment: SegmentNumber,
) -> Result<stratus_flash::CleanOutcome, FlashError> {
    let mut next_version = 1_000;
    let mut relocation = common::RacingIndex {
        log,
        index,
        racing: Default::default(),
        locked: Default::default(),
        failing: Default::default(),
        next_version: &mut next_version,
        raced: Vec::new(),
    };
    log.clean_segment(segment, &mut relocation)
}

/// A segment the restart scan found torn (the crash cut its last write) is cleaned like any
/// other: the live objects before the tear are relocated, the segment is freed, and a second
/// restart finds everything the first one did and no tear.
#[test]
fn a_segment_torn_by_a_crash_is_cleaned_and_freed_after_restart() {
    let TornRestart { log, device, mut index, recovered, torn } = restart_after_a_torn_write();
    let live_in_torn = index
        .values()
        .filter(|located| log.config().geometry.segment_of(located.address) == torn)
        .count() as u64;
    assert!(live_in_torn > 0);
    let outcome = clean_with(&log, &mut index, torn).unwrap();
    assert_eq!(outcome.objects_relocated, live_in_torn);
    log.sync().unwrap();
    assert!(!device.segments_present().contains(&torn), "the torn segment is freed");
    assert_matches_model(&log, &index, &recovered);
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert!(recovery.tears.is_empty(), "{:?}", recovery.tears);
    assert_matches_model(&log, &common::index_from(&recovery), &recovered);
}

/// A torn segment whose bytes rot after the restart (a tear the restart scan did not see) is
/// still refused: the index may point past the new tear.
#[test]
fn a_torn_segment_with_a_new_tear_since_restart_is_refused() {
    let TornRestart { log, device, mut index, recovered, torn } = restart_after_a_torn_write();
    let victim = index
        .values()
        .find(|located| log.config().geometry.segment_of(located.address) == torn)
        .copied()
        .unwrap();
    let offset = log.config().geometry.offset_in_segment(victim.address) as usize;
    device.corrupt(torn, offset + 45, &[0xa5, 0x5a]);
    let refused = clean_with(&log, &mut index, torn);
    assert!(
        matches!(refused, Err(FlashError::Format { address, .. }) if address == victim.address),
        "{refused:?}"
    );
    log.sync().unwrap();
    assert!(device.segments_present().contains(&torn), "kept for the operator");
    let untouched: HashMap<_, _> =
        recovered.into_iter().filter(|(key, _)| index[key].address != victim.address).collect();
    let index = index.into_iter().filter(|(key, _)| untouched.contains_key(key)).collect();
    assert_matches_model(&log, &index, &untouched);
}

/// Found by the model: an overwrite appended the old version's tombstone before the new
/// object, so a crash that tore the write between them killed the acknowledged old value and
/// left nothing. The object now comes first: a write torn after it is a whole overwrite (the
/// new version wins by version), and the old version, which no tombstone names, is recorded
/// by the restart as a stale copy, so a later delete's tombstone outlives it.
#[test]
fn an_overwrite_torn_between_its_object_and_its_tombstone_is_whole_and_stays_deletable() {
    let (log, device) = new_log(16);
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    put_keys(&log, &mut index, &mut model, 0, 3);
    log.sync().unwrap();
    let slot_start = log.durable_end().0;
    let new_end = put(&log, &mut index, b"k1", b"new", 50).unwrap();
    device.tear_next_write((new_end.0 - slot_start) as usize);
    log.sync().unwrap_err();
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    let mut index = common::index_from(&recovery);
    assert_eq!(log.read(index[b"k1".as_slice()].address).unwrap().value, b"new");
    // Delete k1 and clean every segment but the old version's: its tombstone must survive.
    let old_segment = log.config().geometry.segment_of(FlashAddress(slot_start - 1));
    common::delete(&log, &mut index, b"k1").unwrap();
    log.sync().unwrap();
    let mut next_version = 100;
    for _ in 0..3 {
        while log.segment_stats().last().unwrap().state == stratus_flash::SegmentState::Open {
            let key = format!("f{next_version}").into_bytes();
            put(&log, &mut index, &key, &[1u8; 1000], next_version).unwrap();
            next_version += 1;
            log.sync().unwrap();
        }
        let closed: Vec<SegmentNumber> = log
            .segment_stats()
            .into_iter()
            .filter(|stats| stats.state == stratus_flash::SegmentState::Closed)
            .map(|stats| stats.segment)
            .filter(|&segment| segment != old_segment)
            .collect();
        for segment in closed {
            clean_with(&log, &mut index, segment).unwrap();
        }
        log.sync().unwrap();
    }
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(!recovery.objects.contains_key(&(common::TABLE, b"k1".to_vec())), "k1 came back");
}
