//! Regression tests: cleaning, appending and restarting never lose an acknowledged object and
//! never bring back a deleted one, whatever the index answers, the media rots or the
//! configuration asks for.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::{delete, put, restart, small_config, Located, RacingIndex, TABLE};
use stratus_flash::{
    recover, CleanOutcome, CostBenefit, EntryRef, FlashAddress, FlashConfig, FlashError, FlashLog,
    FormatError, Geometry, MemoryDevice, SegmentNumber, SegmentState,
};

fn segment_of(log: &FlashLog, address: FlashAddress) -> SegmentNumber {
    log.config().geometry.segment_of(address)
}

fn head_segment(log: &FlashLog) -> SegmentNumber {
    log.segment_stats().last().unwrap().segment
}

/// Writes 1 000-byte fillers until `until` holds.
fn fill_until(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    next: &mut u64,
    mut until: impl FnMut(&FlashLog) -> bool,
) {
    while !until(log) {
        let key = format!("filler-{next}").into_bytes();
        put(log, index, &key, &[1u8; 1000], *next).unwrap();
        *next += 1;
    }
}

fn state(log: &FlashLog, segment: SegmentNumber) -> Option<SegmentState> {
    log.segment_stats().into_iter().find(|stats| stats.segment == segment).map(|stats| stats.state)
}

fn clean(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    segment: SegmentNumber,
    locked: &[&[u8]],
    next: &mut u64,
) -> Result<CleanOutcome, FlashError> {
    let mut racing = RacingIndex {
        log,
        index,
        racing: HashSet::new(),
        locked: locked.iter().map(|key| key.to_vec()).collect(),
        failing: Default::default(),
        next_version: next,
        raced: Vec::new(),
    };
    log.clean_segment(segment, &mut racing)
}

/// A pass that meets a locked object makes no copy of it: a copy no tombstone names would come
/// back at restart once the object is deleted and the original's segment freed.
#[test]
fn a_deleted_object_stays_deleted_after_a_locked_pass_cleaning_and_restart() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    put(&log, &mut index, b"K", &[7u8; 1000], 1).unwrap();
    let first = segment_of(&log, index[b"K".as_slice()].address);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > first);
    log.sync().unwrap();
    assert_eq!(state(&log, first), Some(SegmentState::Closed));

    // Pass 1: K is locked by a transaction; the pass gives the segment up.
    let outcome = clean(&log, &mut index, first, &[b"K"], &mut next).unwrap();
    assert!(outcome.gave_up_on_lock);
    let copy_segment = head_segment(&log);
    // Other writes move the head on, then K is deleted: the tombstone names `first`.
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > copy_segment);
    delete(&log, &mut index, b"K").unwrap();
    let tombstone_segment = head_segment(&log);
    assert_ne!(tombstone_segment, copy_segment);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > tombstone_segment);
    log.sync().unwrap();

    // Pass 2 over `first`: K is dead now; the segment goes.
    clean(&log, &mut index, first, &[], &mut next).unwrap();
    log.sync().unwrap();
    log.flush_ready().unwrap();
    assert_eq!(state(&log, first), None, "first segment freed");
    // The tombstone's segment is cleaned: its dead segment is gone, so it is dropped.
    clean(&log, &mut index, tombstone_segment, &[], &mut next).unwrap();
    log.sync().unwrap();
    log.flush_ready().unwrap();
    assert_eq!(state(&log, tombstone_segment), None, "tombstone segment freed");

    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(
        !recovery.objects.contains_key(&(TABLE, b"K".to_vec())),
        "deleted key K came back: {:?}",
        recovery.objects.get(&(TABLE, b"K".to_vec()))
    );
}

/// With fewer slots per segment than flush buffers, several segments could be allocated ahead
/// of the flusher and a crash would leave header-less segments that are not the highest: such
/// a configuration is refused up front.
#[test]
fn a_config_with_fewer_slots_per_segment_than_flush_buffers_is_refused() {
    let config = FlashConfig {
        geometry: Geometry::new(16 << 10, 16 << 10).unwrap(),
        flush_buffers: 3,
        log_id: 1,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 0,
    };
    let refusal = FlashError::FlushBuffersInvalid { flush_buffers: 3, slots_per_segment: 1 };
    let device = MemoryDevice::new(16 << 10, 64 << 20);
    assert_eq!(FlashLog::create(Arc::new(device.clone()), config).err(), Some(refusal.clone()));
    assert_eq!(recover(Arc::new(device), config).err(), Some(refusal));
}

/// The appender refuses what the decoder would reject: such an entry would make the restart
/// scan skip the rest of its slot, acknowledged entries included.
#[test]
fn entries_the_decoder_would_reject_are_refused_by_append() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    put(&log, &mut index, b"before", b"1", 1).unwrap();
    let no_dead_address = EntryRef::tombstone(TABLE, b"never-on-flash", 2, FlashAddress(0));
    let mut object_with_dead_address = EntryRef::object(TABLE, b"o", b"v", 2);
    object_with_dead_address.dead_address = FlashAddress(1 << 20);
    let mut tombstone_with_value = EntryRef::tombstone(TABLE, b"t", 2, FlashAddress(1 << 20));
    tombstone_with_value.value = b"value";
    for bad in [no_dead_address, object_with_dead_address, tombstone_with_value] {
        assert!(
            matches!(log.append(&bad), Err(FlashError::InvalidEntry { .. })),
            "accepted {bad:?}"
        );
    }
    put(&log, &mut index, b"after", b"3", 3).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(recovery.tears.is_empty(), "{:?}", recovery.tears);
    assert!(recovery.objects.contains_key(&(TABLE, b"after".to_vec())));
}

/// A segment whose walk meets bytes that do not verify is not cleaned: live objects after the
/// bad entry in its slot would be freed without being relocated.
#[test]
fn cleaning_a_segment_with_a_corrupt_entry_refuses_and_keeps_the_live_objects_after_it() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    put(&log, &mut index, b"A", &[1u8; 100], 1).unwrap();
    put(&log, &mut index, b"B", &[2u8; 100], 2).unwrap();
    let first = segment_of(&log, index[b"A".as_slice()].address);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > first);
    log.sync().unwrap();
    // One byte of A's value rots on the media.
    let a = log.config().geometry.offset_in_segment(index[b"A".as_slice()].address) as usize;
    device.corrupt(first, a + 45, &[0xff]);
    let refused = clean(&log, &mut index, first, &[], &mut next);
    assert!(
        matches!(refused, Err(FlashError::Format { error: FormatError::ChecksumMismatch, .. })),
        "{refused:?}"
    );
    log.sync().unwrap();
    log.flush_ready().unwrap();
    assert_eq!(state(&log, first), Some(SegmentState::Closed), "left for the operator");
    let b = index[b"B".as_slice()];
    assert_eq!(log.read(b.address).unwrap().value, vec![2u8; 100]);
}

/// A bad header on the highest segment is taken for a torn first write only when nothing past
/// it verifies; a segment holding verified (possibly acknowledged) entries is never deleted.
#[test]
fn a_corrupt_header_on_a_synced_highest_segment_is_refused_not_deleted() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    put(&log, &mut index, b"durable", b"1", 1).unwrap();
    log.sync().unwrap();
    drop(log);
    device.corrupt(SegmentNumber(1), 20, &[0xee]);
    let refused = recover(Arc::new(device.clone()), small_config()).err();
    assert!(
        matches!(refused, Some(FlashError::Format { address, .. }) if address.0 == 64 << 10),
        "{refused:?}"
    );
    assert_eq!(device.segments_present(), vec![SegmentNumber(1)], "nothing deleted");
}

/// A segment number whose addresses would not fit 64 bits is refused, not an overflow.
#[test]
fn a_segment_numbered_past_the_address_space_is_refused_at_restart() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let huge = SegmentNumber(u64::MAX / (64 << 10));
    stratus_flash::FlashDevice::allocate(&device, huge).unwrap();
    assert_eq!(
        recover(Arc::new(device), small_config()).err(),
        Some(FlashError::ForeignSegment { segment: huge })
    );
}

/// Puts `keys` (1 000 bytes each) in one segment and fills until it is closed; returns it.
fn closed_segment_holding(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    keys: &[&[u8]],
    next: &mut u64,
) -> SegmentNumber {
    for key in keys {
        put(log, index, key, &[3u8; 1000], *next).unwrap();
        *next += 1;
    }
    let segment = segment_of(log, index[keys[0]].address);
    assert!(keys.iter().all(|key| segment_of(log, index[*key].address) == segment));
    fill_until(log, index, next, |log| head_segment(log) > segment);
    log.sync().unwrap();
    assert_eq!(state(log, segment), Some(SegmentState::Closed));
    segment
}

/// Cleans every closed segment that holds entries other than `except`, until none is left
/// (whatever the cost-benefit ranking says), so every dropped tombstone is dropped.
fn clean_everything(
    log: &FlashLog,
    index: &mut HashMap<Vec<u8>, Located>,
    next: &mut u64,
    except: &[SegmentNumber],
) {
    for _round in 0..4 {
        let closed: Vec<SegmentNumber> = log
            .segment_stats()
            .into_iter()
            .filter(|stats| stats.state == SegmentState::Closed && !except.contains(&stats.segment))
            .map(|stats| stats.segment)
            .collect();
        for segment in closed {
            let outcome = clean(log, index, segment, &[], next).unwrap();
            assert!(!outcome.gave_up_on_lock);
        }
        // Close the head so what the passes appended is cleanable too.
        let head = head_segment(log);
        fill_until(log, index, next, |log| head_segment(log) > head);
        log.sync().unwrap();
    }
}

/// A crash after a cleaning pass moved an object and its copy became durable, but before the
/// victim segment was freed: the restart finds the same version twice. It takes the later
/// copy (the one the index pointed at), and records the victim as holding a stale copy of the
/// key, so the tombstone of a later delete (which names the copy) is kept while the victim
/// exists, even after the copy's segment is cleaned.
#[test]
fn a_crash_before_a_cleaned_segment_is_freed_cannot_bring_a_deleted_key_back() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let victim = closed_segment_holding(&log, &mut index, &[b"K", b"L"], &mut next);
    // L is locked: the pass moves K, then gives up; the victim stays closed with K's original.
    let outcome = clean(&log, &mut index, victim, &[b"L"], &mut next).unwrap();
    assert!(outcome.gave_up_on_lock && outcome.objects_relocated >= 1);
    let copy = index[b"K".as_slice()];
    assert_ne!(segment_of(&log, copy.address), victim);
    log.sync().unwrap();
    // Crash (nothing unsynced matters here): the restart sees K twice and takes the copy.
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    assert_eq!(recovery.objects[&(TABLE, b"K".to_vec())].address, copy.address);
    let mut index = common::index_from(&recovery);
    delete(&log, &mut index, b"K").unwrap();
    log.sync().unwrap();
    // Clean everything but the victim: the copy goes, and the tombstone must survive.
    clean_everything(&log, &mut index, &mut next, &[victim]);
    assert_eq!(state(&log, victim), Some(SegmentState::Closed));
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(
        !recovery.objects.contains_key(&(TABLE, b"K".to_vec())),
        "deleted key K came back from the victim's stale copy"
    );
}

/// The same with a complete pass whose victim's free fails (so it is still on the device at
/// the crash), and the restart's own bookkeeping only: nothing of the first run's memory helps.
#[test]
fn a_crash_while_a_cleaned_segment_waits_for_its_free_cannot_bring_a_deleted_key_back() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let victim = closed_segment_holding(&log, &mut index, &[b"K"], &mut next);
    clean(&log, &mut index, victim, &[], &mut next).unwrap();
    device.fail_next_frees(1);
    assert!(log.sync().is_err(), "the victim's free fails");
    assert!(matches!(state(&log, victim), Some(SegmentState::Freeing { .. })));
    drop(log);
    let (log, recovery) = restart(&device, small_config());
    let mut index = common::index_from(&recovery);
    assert_ne!(segment_of(&log, index[b"K".as_slice()].address), victim, "the copy wins");
    delete(&log, &mut index, b"K").unwrap();
    log.sync().unwrap();
    clean_everything(&log, &mut index, &mut next, &[victim]);
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(!recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "deleted key K came back");
}

/// Once the segment holding stale copies is freed, the tombstones it kept alive are dropped by
/// the next pass over their segment: stale copies cost space only while they exist.
#[test]
fn tombstones_kept_for_stale_copies_are_dropped_once_the_stale_segment_is_freed() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let victim = closed_segment_holding(&log, &mut index, &[b"K", b"L"], &mut next);
    assert!(clean(&log, &mut index, victim, &[b"L"], &mut next).unwrap().gave_up_on_lock);
    delete(&log, &mut index, b"K").unwrap();
    let tombstone_segment = head_segment(&log);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > tombstone_segment);
    log.sync().unwrap();
    let kept = clean(&log, &mut index, tombstone_segment, &[], &mut next).unwrap();
    assert_eq!(kept.tombstones_kept, 1, "the victim still holds K's stale original");
    // The victim goes (L is no longer locked); then the tombstone's copy is not needed.
    assert!(!clean(&log, &mut index, victim, &[], &mut next).unwrap().gave_up_on_lock);
    log.sync().unwrap();
    assert_eq!(state(&log, victim), None);
    clean_everything(&log, &mut index, &mut next, &[]);
    let tombstones_left: u64 = (1..=head_segment(&log).0)
        .filter_map(|segment| log.read_segment(SegmentNumber(segment)).ok())
        .map(|image| {
            image
                .entries()
                .filter(|item| item.entry.kind == stratus_flash::EntryKind::Tombstone)
                .filter(|item| item.entry.key == b"K")
                .count() as u64
        })
        .sum();
    assert_eq!(tombstones_left, 0, "K's tombstone outlived every copy it protects against");
}

/// Found by the model: a segment whose objects were all dead was freed at the next flush, its
/// pass having copied nothing, while the tombstone that killed one of them was still in a
/// buffer. A crash then lost the delete (unacknowledged: allowed) and the object it killed
/// (acknowledged: not allowed). A cleaned segment now waits until everything appended before
/// its pass ended is durable.
#[test]
fn a_cleaned_segment_is_not_freed_before_the_deletes_that_emptied_it_are_durable() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    put(&log, &mut index, b"K", &[7u8; 1000], 1).unwrap();
    let first = segment_of(&log, index[b"K".as_slice()].address);
    // Overwrites of one filler key: everything in `first` but K is dead once the head leaves.
    while head_segment(&log) == first {
        put(&log, &mut index, b"F", &[1u8; 1000], next).unwrap();
        next += 1;
    }
    log.sync().unwrap();
    // The delete stays in the current buffer: not durable, not acknowledged.
    delete(&log, &mut index, b"K").unwrap();
    let outcome = clean(&log, &mut index, first, &[], &mut next).unwrap();
    assert_eq!(outcome.objects_relocated, 0, "nothing in the segment is live");
    log.flush_ready().unwrap();
    assert!(device.segments_present().contains(&first), "kept until the delete is durable");
    // Crash: the delete is lost, so K's acknowledged value must still be there.
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "acknowledged K was lost");
}

/// After a crash the kernel may have persisted a later unsynced slot and not an earlier one:
/// here a delete's tombstone (which names the relocated copy) reached the device and the copy
/// did not, so the restart finds only the original, killed by a tombstone that names another
/// segment. The restart records the original's segment as holding a stale copy of the key, so
/// the tombstone is kept while that segment exists, even once the segment it names is gone.
#[test]
fn a_tombstone_that_outlived_the_copy_it_names_still_protects_against_the_original() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let victim = closed_segment_holding(&log, &mut index, &[b"K", b"L"], &mut next);
    assert!(clean(&log, &mut index, victim, &[b"L"], &mut next).unwrap().gave_up_on_lock);
    let copy = index[b"K".as_slice()].address;
    let geometry = log.config().geometry;
    let copy_slot_end = geometry.slot_of(copy).0 + geometry.buffer_bytes();
    // The tombstone goes in a later slot than the copy.
    fill_until(&log, &mut index, &mut next, |log| log.durable_end().0 >= copy_slot_end);
    delete(&log, &mut index, b"K").unwrap();
    log.sync().unwrap();
    drop(log);
    // The copy's slot never reached the device (from the copy on; never its segment header).
    let copy_segment = geometry.segment_of(copy);
    let from = geometry.offset_in_segment(copy) as usize;
    let to =
        (geometry.offset_in_segment(geometry.slot_of(copy)) + geometry.buffer_bytes()) as usize;
    device.corrupt(copy_segment, from, &vec![0u8; to - from]);
    let (log, recovery) = restart(&device, small_config());
    assert!(!recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "the tombstone kills it");
    let mut index = common::index_from(&recovery);
    clean_everything(&log, &mut index, &mut next, &[victim]);
    assert!(!device.segments_present().contains(&copy_segment), "the named segment is gone");
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(!recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "deleted key K came back");
}

/// The known bug without a restart in between (so only the cleaner's own bookkeeping can
/// help): a pass moves K and gives up on locked L; K is deleted (the tombstone names K's copy);
/// every segment but the victim is cleaned, the copy's first. The tombstone must be kept while
/// the victim holds K's stale original, or the next restart brings K back.
#[test]
fn a_pass_that_gives_up_keeps_the_tombstones_of_what_it_moved_without_a_restart() {
    let device = MemoryDevice::new(64 << 10, 64 << 20);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let victim = closed_segment_holding(&log, &mut index, &[b"K", b"L"], &mut next);
    assert!(clean(&log, &mut index, victim, &[b"L"], &mut next).unwrap().gave_up_on_lock);
    let copy_segment = segment_of(&log, index[b"K".as_slice()].address);
    delete(&log, &mut index, b"K").unwrap();
    let head = head_segment(&log);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > head);
    log.sync().unwrap();
    clean_everything(&log, &mut index, &mut next, &[victim]);
    assert!(!device.segments_present().contains(&copy_segment), "the copy's segment is gone");
    assert_eq!(state(&log, victim), Some(SegmentState::Closed));
    drop(log);
    let (_log, recovery) = restart(&device, small_config());
    assert!(!recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "deleted key K came back");
}

/// A device whose frees of one chosen segment fail (a stuck unlink), all else as `MemoryDevice`.
#[derive(Debug)]
struct StuckFree {
    device: MemoryDevice,
    stuck: std::sync::Mutex<Option<SegmentNumber>>,
}

impl stratus_flash::FlashDevice for StuckFree {
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.device.allocate(segment)
    }
    fn write_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FlashError> {
        self.device.write_at(segment, offset, bytes)
    }
    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError> {
        self.device.read_at(segment, offset, out)
    }
    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.device.sync(segment)
    }
    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        if *self.stuck.lock().unwrap() == Some(segment) {
            return Err(FlashError::Io {
                operation: stratus_flash::IoOperation::Free,
                segment,
                kind: std::io::ErrorKind::Other,
                os_code: None,
            });
        }
        self.device.free(segment)
    }
    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError> {
        self.device.segments()
    }
    fn budget_bytes(&self) -> u64 {
        self.device.budget_bytes()
    }
}

/// The cleaner drops a tombstone once the segment it names is being freed; so that segment
/// must leave the device before the tombstone's own segment does. While its free fails, the
/// segments retired after it wait: were the tombstone's segment freed first, a crash would
/// leave the killed object on the device with nothing to kill it.
#[test]
fn a_segment_retired_later_is_not_freed_while_an_earlier_ones_free_fails() {
    let memory = MemoryDevice::new(64 << 10, 64 << 20);
    let device = Arc::new(StuckFree { device: memory.clone(), stuck: Default::default() });
    let log = FlashLog::create(device.clone(), small_config()).unwrap();
    let mut index = HashMap::new();
    let mut next = 10;
    let killed = closed_segment_holding(&log, &mut index, &[b"K"], &mut next);
    delete(&log, &mut index, b"K").unwrap();
    let tombstone = head_segment(&log);
    fill_until(&log, &mut index, &mut next, |log| head_segment(log) > tombstone);
    log.sync().unwrap();
    clean(&log, &mut index, killed, &[], &mut next).unwrap();
    *device.stuck.lock().unwrap() = Some(killed);
    assert!(log.sync().is_err(), "the killed object's segment fails to go");
    assert!(matches!(state(&log, killed), Some(SegmentState::Freeing { .. })));
    // Its segment is going, so the tombstone is dropped.
    assert_eq!(clean(&log, &mut index, tombstone, &[], &mut next).unwrap().tombstones_kept, 0);
    assert!(log.sync().is_err(), "the earlier segment is still stuck");
    assert!(matches!(state(&log, tombstone), Some(SegmentState::Freeing { .. })));
    assert!(memory.segments_present().contains(&tombstone), "waits for the earlier one");
    // Crash now: the tombstone is still on the device with the object it kills.
    drop(log);
    let (_log, recovery) = restart(&memory, small_config());
    assert!(!recovery.objects.contains_key(&(TABLE, b"K".to_vec())), "deleted key K came back");
}
