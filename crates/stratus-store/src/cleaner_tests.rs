//! Cleaner tests: combined cleaning frees memory and keeps every value, epochs hold memory for
//! readers, the replication hooks, a model check with cleaning interleaved and the log
//! replayed, a long run at about 90 % live utilization with changing object sizes, and
//! writers racing a cleaner thread.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use stratus_env::SplitMix64;
use stratus_log::{Certificate, SegmentIterator};
use stratus_types::{key_hash, RejectRules, SegmentId, ServerId, TableId, Version};

use crate::tests::{replay, tally_of_model};
use crate::{CleanOutcome, CleanerConfig, CostBenefit, ObjectError, ObjectStore, StoreConfig};
use crate::{CleanStep, DurabilityError, Expiry, SegmentDurability, StoreStatistics, WallTime};

const TABLE: TableId = TableId(7);
const NOW: u32 = 1_700_000_000;

/// A small log: 4 MiB of 1 KiB seglets in 160 KiB segments (the smallest that hold the
/// largest key twice, as an overwrite's object and tombstone), values up to 4 KiB.
pub(crate) fn small_config() -> StoreConfig {
    StoreConfig {
        log_bytes: 4 << 20,
        segment_bytes: 160 << 10,
        seglet_bytes: 1 << 10,
        hash_table_bytes: 64 << 10,
        value_bytes_max: 4 << 10,
        cleaner: CleanerConfig::default(),
        prefault_memory: false,
        flash_image_bytes: 0,
        ..StoreConfig::with_log_bytes(4 << 20)
    }
}

fn store_with(config: StoreConfig) -> ObjectStore {
    ObjectStore::new(config, ServerId(1)).unwrap()
}

fn write_at(
    store: &ObjectStore,
    key: &[u8],
    value: &[u8],
    now: u32,
) -> Result<Version, ObjectError> {
    store.write(
        TABLE,
        key,
        key_hash(TABLE, key),
        value,
        &RejectRules::NONE,
        Expiry::Never,
        WallTime::from_seconds(now),
    )
}

fn remove_at(store: &ObjectStore, key: &[u8], now: u32) -> Result<Version, ObjectError> {
    store.remove(TABLE, key, key_hash(TABLE, key), &RejectRules::NONE, WallTime::from_seconds(now))
}

fn read(store: &ObjectStore, key: &[u8]) -> Option<(Vec<u8>, Version)> {
    let mut value = Vec::new();
    let version = store
        .read(
            TABLE,
            key,
            key_hash(TABLE, key),
            &RejectRules::NONE,
            WallTime::from_seconds(0),
            &mut value,
        )
        .ok()?;
    Some((value, version))
}

/// A value whose bytes identify (key, generation), so a stale or torn read is detected.
fn value_for(key: u32, generation: u32, length: usize) -> Vec<u8> {
    let seed = key.wrapping_mul(31).wrapping_add(generation.wrapping_mul(17));
    (0..length).map(|index| (seed as usize + index) as u8).collect()
}

fn free_seglets(statistics: &StoreStatistics) -> u64 {
    statistics.seglets_free + statistics.seglets_waiting_for_readers
}

#[test]
fn cost_benefit_formulas() {
    let source = CostBenefit::AgeOverUtilization;
    let text = CostBenefit::AgeOverOnePlusUtilization;
    assert_eq!(source.score(0.0, 5), f64::INFINITY);
    assert_eq!(source.score(0.5, 9), 10.0);
    assert!((text.score(0.5, 9) - 10.0 / 3.0).abs() < 1e-9);
    // Both prefer emptier and older segments.
    for formula in [source, text] {
        assert!(formula.score(0.2, 10) > formula.score(0.8, 10));
        assert!(formula.score(0.5, 100) > formula.score(0.5, 10));
    }
}

#[test]
fn combined_cleaning_frees_dead_memory_and_keeps_values() {
    let store = store_with(small_config());
    let mut now = NOW;
    for generation in 0..6u32 {
        for key in 0..200u32 {
            let value = value_for(key, generation, 900);
            write_at(&store, format!("key-{key}").as_bytes(), &value, now).unwrap();
        }
        now += 10;
    }
    for key in 0..10u32 {
        remove_at(&store, format!("key-{key}").as_bytes(), now).unwrap();
    }
    let before = store.statistics();
    let mut passes = 0;
    while let CleanOutcome::Combined { .. } = store.clean_combined_now(WallTime::from_seconds(now))
    {
        passes += 1;
        assert!(passes < 100, "cleaning never finishes");
    }
    let after = store.statistics();
    assert!(passes > 0);
    assert!(
        free_seglets(&after) > free_seglets(&before) + 100,
        "cleaning freed too little: {before:?} → {after:?}"
    );
    assert_eq!(after.seglets_waiting_for_readers, 0, "no reader held the memory");
    assert!(after.cleaner.segments_cleaned > 0);
    assert!(after.cleaner.object_bytes_relocated > 0);
    for key in 0..200u32 {
        let found = read(&store, format!("key-{key}").as_bytes());
        if key < 10 {
            assert!(found.is_none());
        } else {
            assert_eq!(found.unwrap().0, value_for(key, 5, 900));
        }
    }
    let replayed = replay(&store);
    assert_eq!(replayed.len(), 190);
    // Every remaining segment validates and the newest digest lists exactly the log.
    let ids = store.log().segment_ids();
    let head = store.log().head_segment_id().unwrap();
    let (bytes, certificate) = store.log().segment_contents(head).unwrap();
    let digest = SegmentIterator::new(&bytes, &certificate)
        .unwrap()
        .find_map(|entry| match entry.unwrap().entry {
            stratus_log::Entry::LogDigest(ids) => Some(ids),
            _ => None,
        })
        .unwrap();
    assert_eq!(digest, ids);
}

#[test]
fn epoch_guard_holds_cleaned_memory_until_the_reader_finishes() {
    let store = store_with(small_config());
    for generation in 0..8u32 {
        for key in 0..60u32 {
            write_at(&store, format!("k{key}").as_bytes(), &value_for(key, generation, 800), NOW)
                .unwrap();
        }
    }
    // A reader that pinned before the pass: what it can see must not be reused.
    let reader = store.log().pin();
    let outcome = store.clean_combined_now(WallTime::from_seconds(NOW + 100));
    assert!(
        matches!(outcome, CleanOutcome::Combined { segments_cleaned, .. } if segments_cleaned > 0)
    );
    let held = store.statistics();
    assert!(held.seglets_waiting_for_readers > 0, "{held:?}");
    store.log().reclaim();
    assert_eq!(store.statistics().seglets_waiting_for_readers, held.seglets_waiting_for_readers);
    drop(reader);
    store.log().reclaim();
    let released = store.statistics();
    assert_eq!(released.seglets_waiting_for_readers, 0);
    assert_eq!(released.seglets_free, held.seglets_free + held.seglets_waiting_for_readers);
    for key in 0..60u32 {
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, value_for(key, 7, 800));
    }
}

/// Records what the cleaner asked to make durable.
#[derive(Debug, Default)]
struct RecordingDurability {
    made_durable: Mutex<Vec<(SegmentId, usize, Certificate)>>,
}

impl SegmentDurability for RecordingDurability {
    fn make_durable(
        &self,
        segment_id: SegmentId,
        bytes: &[u8],
        certificate: Certificate,
    ) -> Result<(), DurabilityError> {
        // The bytes are a whole, valid segment.
        for entry in SegmentIterator::new(bytes, &certificate).unwrap() {
            entry.unwrap();
        }
        self.made_durable.lock().unwrap().push((segment_id, bytes.len(), certificate));
        Ok(())
    }
}

/// A durability hook that fails as scripted (one outcome per call, then `Ok`), and notes
/// whether the combined-cleaner lock was free while it ran.
#[derive(Debug)]
struct ScriptedDurability {
    store: std::sync::Weak<ObjectStore>,
    failures: Mutex<Vec<DurabilityError>>,
    calls: Mutex<Vec<SegmentId>>,
    lock_held_during_a_call: AtomicBool,
}

impl ScriptedDurability {
    fn install(store: &Arc<ObjectStore>, failures: Vec<DurabilityError>) -> Arc<Self> {
        let durability = Arc::new(ScriptedDurability {
            store: Arc::downgrade(store),
            failures: Mutex::new(failures),
            calls: Mutex::new(Vec::new()),
            lock_held_during_a_call: AtomicBool::new(false),
        });
        store.set_segment_durability(Some(durability.clone()));
        durability
    }
}

impl SegmentDurability for ScriptedDurability {
    fn make_durable(
        &self,
        segment_id: SegmentId,
        _bytes: &[u8],
        _certificate: Certificate,
    ) -> Result<(), DurabilityError> {
        let store = self.store.upgrade().expect("the store outlives its cleaning");
        if store.cleaner.combined.try_lock().is_err() {
            self.lock_held_during_a_call.store(true, Ordering::SeqCst);
        }
        self.calls.lock().unwrap().push(segment_id);
        let mut failures = self.failures.lock().unwrap();
        if failures.is_empty() {
            return Ok(());
        }
        Err(failures.remove(0))
    }
}

/// A store with enough dead versions that a combined pass with survivors is worth running.
fn store_needing_a_combined_pass() -> Arc<ObjectStore> {
    let store = Arc::new(store_with(small_config()));
    for generation in 0..8u32 {
        for key in 0..60u32 {
            write_at(&store, format!("k{key}").as_bytes(), &value_for(key, generation, 800), NOW)
                .unwrap();
        }
    }
    store
}

#[test]
fn survivors_are_made_durable_without_the_combined_cleaner_lock() {
    let store = store_needing_a_combined_pass();
    let durability = ScriptedDurability::install(&store, Vec::new());
    let outcome = store.clean_combined_now(WallTime::from_seconds(NOW));
    assert!(
        matches!(outcome, CleanOutcome::Combined { survivor_segments, .. } if survivor_segments > 0)
    );
    assert!(!durability.calls.lock().unwrap().is_empty());
    assert!(
        !durability.lock_held_during_a_call.load(Ordering::SeqCst),
        "the cleaner held its lock while waiting for replication"
    );
}

#[test]
fn a_pass_whose_survivors_were_not_replicated_in_time_waits_and_goes_on_later() {
    let store = store_needing_a_combined_pass();
    let durability = ScriptedDurability::install(&store, vec![DurabilityError::TimedOut]);
    let segments_before = store.log().segment_ids();
    let outcome = store.clean_combined_now(WallTime::from_seconds(NOW));
    assert_eq!(outcome, CleanOutcome::SurvivorsNotDurable(DurabilityError::TimedOut));
    assert_eq!(store.cleaner_statistics().survivors_not_durable, 1);
    // Nothing was fused or dropped, and every value reads back (from the survivors).
    assert_eq!(store.log().segment_ids(), segments_before);
    for key in 0..60u32 {
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, value_for(key, 7, 800));
    }
    // No other combined pass starts meanwhile: the next call goes on with this one, from
    // the survivor that failed.
    let first_survivor = durability.calls.lock().unwrap()[0];
    let outcome = store.clean_once(WallTime::from_seconds(NOW));
    assert!(matches!(outcome, CleanOutcome::Combined { .. }), "{outcome:?}");
    let calls = durability.calls.lock().unwrap().clone();
    assert_eq!(calls[1], first_survivor, "the pass went on with the survivor that failed");
    assert_eq!(calls.iter().filter(|&&call| call == first_survivor).count(), 2);
    for key in 0..60u32 {
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, value_for(key, 7, 800));
    }
}

#[test]
fn a_fenced_master_s_cleaner_is_told_so_instead_of_waiting() {
    let store = store_needing_a_combined_pass();
    ScriptedDurability::install(&store, vec![DurabilityError::Fenced]);
    let outcome = store.clean_combined_now(WallTime::from_seconds(NOW));
    assert_eq!(outcome, CleanOutcome::SurvivorsNotDurable(DurabilityError::Fenced));
    assert!(DurabilityError::Fenced.is_final() && DurabilityError::Stopped.is_final());
    assert!(!DurabilityError::TimedOut.is_final());
}

#[test]
fn replication_hooks_see_survivors_dropped_segments_and_ranges() {
    let store = store_with(small_config());
    let durability = Arc::new(RecordingDurability::default());
    store.set_segment_durability(Some(durability.clone()));
    for generation in 0..8u32 {
        for key in 0..60u32 {
            write_at(&store, format!("k{key}").as_bytes(), &value_for(key, generation, 800), NOW)
                .unwrap();
        }
    }
    let before: Vec<SegmentId> = store.log().segment_ids();
    let CleanOutcome::Combined { segments_cleaned, survivor_segments, .. } =
        store.clean_combined_now(WallTime::from_seconds(NOW))
    else {
        panic!("nothing cleaned");
    };
    let made_durable = durability.made_durable.lock().unwrap().clone();
    assert_eq!(made_durable.len() as u64, survivor_segments);
    let after = store.log().segment_ids();
    for (segment_id, _, _) in &made_durable {
        assert!(after.contains(segment_id), "survivor {segment_id:?} was fused into the log");
    }
    let dropped = store.log().take_dropped_segments();
    assert_eq!(dropped.len() as u64, segments_cleaned);
    for segment_id in &dropped {
        assert!(before.contains(segment_id) && !after.contains(segment_id));
    }
    assert!(store.log().take_dropped_segments().is_empty(), "handed out once");
    // A range ending on an entry boundary comes with the certificate valid there.
    let head = store.log().head_segment_id().unwrap();
    let (bytes, certificate) = store.log().segment_contents(head).unwrap();
    let (range, range_certificate) =
        store.log().segment_range(head, 0, certificate.segment_length).unwrap();
    assert_eq!((range, range_certificate), (bytes.clone(), certificate));
    let first_entry_end = 2 + 32;
    let (prefix, prefix_certificate) = store.log().segment_range(head, 0, first_entry_end).unwrap();
    assert_eq!(SegmentIterator::new(&prefix, &prefix_certificate).unwrap().count(), 1);
    let (tail, _) = store.log().segment_range(head, 10, first_entry_end).unwrap();
    assert_eq!(tail, bytes[10..first_entry_end as usize]);
    assert!(store.log().segment_range(head, 0, first_entry_end + 1).is_none());
}

/// The two-step combined pass for callers that must not block: survivors come back to be
/// replicated, the log does not fuse them (or start another pass) until the caller finishes,
/// requests are served meanwhile from the survivors, and finishing fuses them.
#[test]
fn a_stepped_combined_pass_waits_for_its_caller_to_replicate_the_survivors() {
    let mut config = small_config();
    config.cleaner.replicas = 0; // memory-only: the balancer goes straight to combined cleaning
    let store = store_with(config);
    let durability = Arc::new(RecordingDurability::default());
    store.set_segment_durability(Some(durability.clone()));
    // Fill the log with overwrites until the balancer asks for cleaning.
    let mut generation = 0u32;
    let pending = loop {
        for key in 0..60u32 {
            write_at(&store, format!("k{key}").as_bytes(), &value_for(key, generation, 800), NOW)
                .unwrap();
        }
        generation += 1;
        assert!(generation < 200, "the balancer never asked for a combined pass");
        if let CleanStep::Replicate(pass) = store.clean_step(WallTime::from_seconds(NOW)) {
            break pass;
        }
    };
    assert!(!pending.survivor_segments().is_empty());
    assert!(durability.made_durable.lock().unwrap().is_empty(), "the hook is not called");
    let segments_before = store.log().segment_ids();
    for survivor in pending.survivor_segments() {
        assert!(!segments_before.contains(survivor), "not fused before the caller finishes");
    }
    // Reads see every value meanwhile (some now live in the unfused survivors).
    for key in 0..60u32 {
        let expected = value_for(key, generation - 1, 800);
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, expected);
    }
    // No second combined pass while one is pending.
    match store.clean_step(WallTime::from_seconds(NOW)) {
        CleanStep::Replicate(_) => panic!("a second combined pass started"),
        CleanStep::Finished(outcome) => {
            assert!(!matches!(outcome, CleanOutcome::Combined { .. }), "{outcome:?}")
        }
    }
    let survivors = pending.survivor_segments().to_vec();
    let CleanOutcome::Combined { survivor_segments, .. } = store.finish_combined_pass(pending)
    else {
        panic!("finishing did not report the pass");
    };
    assert_eq!(survivor_segments, survivors.len() as u64);
    let after = store.log().segment_ids();
    for survivor in &survivors {
        assert!(after.contains(survivor), "survivor {survivor:?} fused once finished");
    }
    for key in 0..60u32 {
        let expected = value_for(key, generation - 1, 800);
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, expected);
    }
}

#[test]
fn compaction_rewrites_a_segment_in_place_in_fewer_seglets() {
    let mut config = small_config();
    config.cleaner.replicas = 1;
    let store = store_with(config);
    for generation in 0..8u32 {
        for key in 0..60u32 {
            write_at(&store, format!("k{key}").as_bytes(), &value_for(key, generation, 800), NOW)
                .unwrap();
        }
    }
    let ids_before = store.log().segment_ids();
    let before = store.statistics();
    let CleanOutcome::Compacted { segment_id, seglets_freed } =
        store.compact_now(WallTime::from_seconds(NOW))
    else {
        panic!("nothing compacted");
    };
    assert!(seglets_freed > 0);
    // Same segments, same ids: compaction never changes the log's membership.
    assert_eq!(store.log().segment_ids(), ids_before);
    let after = store.statistics();
    assert_eq!(free_seglets(&after), free_seglets(&before) + seglets_freed);
    assert_eq!(after.cleaner.compactions, 1);
    assert_eq!(after.cleaner.seglets_freed_by_compaction, seglets_freed);
    // The compacted segment is valid, starts with its own header and tombstones come first.
    let (bytes, certificate) = store.log().segment_contents(segment_id).unwrap();
    let entries: Vec<_> = SegmentIterator::new(&bytes, &certificate)
        .unwrap()
        .map(|entry| entry.unwrap().entry)
        .collect();
    assert!(
        matches!(entries[0], stratus_log::Entry::SegmentHeader(header) if header.segment_id == segment_id)
    );
    let first_object =
        entries.iter().position(|entry| matches!(entry, stratus_log::Entry::Object(_)));
    let last_tombstone =
        entries.iter().rposition(|entry| matches!(entry, stratus_log::Entry::Tombstone(_)));
    if let (Some(object), Some(tombstone)) = (first_object, last_tombstone) {
        assert!(tombstone < object, "tombstones are written first");
    }
    for key in 0..60u32 {
        assert_eq!(read(&store, format!("k{key}").as_bytes()).unwrap().0, value_for(key, 7, 800));
    }
    assert_eq!(replay(&store).len(), 60);
    // Compacting until nothing is left to gain reports failure, which forces combined
    // cleaning in the balancer.
    let mut compactions = 0;
    while let CleanOutcome::Compacted { seglets_freed, .. } =
        store.compact_now(WallTime::from_seconds(NOW))
    {
        compactions += 1;
        assert!(compactions < 100 && seglets_freed > 0);
    }
    assert!(store.cleaner_statistics().compactions_failed > 0);
    assert_eq!(replay(&store).len(), 60);
}

#[test]
fn a_full_log_recovers_through_removes_and_cleaning() {
    for replicas in [0, 3] {
        let mut config = small_config();
        config.cleaner.replicas = replicas;
        let store = store_with(config);
        // Fill with distinct keys until writes are refused: everything is live, nothing to
        // clean.
        let mut keys = 0u32;
        loop {
            let value = value_for(keys, 0, 1000);
            match write_at(&store, format!("key-{keys}").as_bytes(), &value, NOW) {
                Ok(_) => keys += 1,
                Err(ObjectError::LogFull) => break,
                Err(other) => panic!("unexpected {other:?}"),
            }
            store.clean_once(WallTime::from_seconds(NOW));
            assert!(keys < 100_000, "the log never filled");
        }
        let full = store.statistics();
        assert!(full.live_object_fraction() > 0.8, "{full:?}");
        // Removes still work at this utilization (the tombstone reserve)...
        for key in (0..keys).step_by(2) {
            remove_at(&store, format!("key-{key}").as_bytes(), NOW).unwrap();
        }
        // ...and the cleaner, which always has its own reserve, turns them into free memory.
        let mut rounds = 0;
        while write_at(&store, b"after", &value_for(0, 1, 1000), NOW + 1).is_err() {
            store.clean_once(WallTime::from_seconds(NOW + 1));
            rounds += 1;
            assert!(rounds < 10_000, "the cleaner deadlocked: {:?}", store.statistics());
        }
        // Writes flow again for a while, with the cleaner between them.
        for index in 0..(keys / 4) {
            let key = 2 * index;
            write_at(&store, format!("key-{key}").as_bytes(), &value_for(key, 2, 1000), NOW + 2)
                .unwrap_or_else(|error| panic!("{error:?}: {:?}", store.statistics()));
            store.clean_once(WallTime::from_seconds(NOW + 2));
        }
        for key in 0..keys {
            let found = read(&store, format!("key-{key}").as_bytes());
            match (key % 2, key < 2 * (keys / 4)) {
                (1, _) => assert_eq!(found.unwrap().0, value_for(key, 0, 1000)),
                (_, true) => assert_eq!(found.unwrap().0, value_for(key, 2, 1000)),
                _ => assert!(found.is_none()),
            }
        }
        assert_eq!(replay(&store).len() as u64, store.statistics().objects_live);
    }
}

/// Compaction shrinks segments but never removes one. A log turned into many small, dense
/// segments (compactor threads running ahead of the combined cleaner) reaches its segment limit
/// while memory is almost empty: the combined cleaner must then merge segments to lower the
/// count, even though no such pass frees memory. (A concurrent test once livelocked here: every
/// write refused, both cleaner threads idle.)
#[test]
fn compacted_segments_at_the_segment_limit_are_merged_so_writes_go_on() {
    let mut config = small_config();
    config.cleaner.replicas = 3;
    let store = store_with(config);
    let segment_limit = store.log().config().segment_count_max() as u64;
    let keys = 20u32;
    let mut highest_segment_count = 0;
    // 12 000 writes of 2 000 bytes fill 150 segments' worth: three times the limit.
    let writes = 12_000u32;
    for iteration in 0..writes {
        let key = iteration % keys;
        let value = value_for(key, iteration, 2000);
        let name = format!("k{key}").into_bytes();
        let mut cleaner_calls = 0;
        loop {
            match write_at(&store, &name, &value, NOW) {
                Ok(_) => break,
                Err(ObjectError::LogFull) => {
                    cleaner_calls += 1;
                    assert!(
                        cleaner_calls < 100,
                        "writes refused for good: {:?} {:?}",
                        store.statistics(),
                        store.log().statistics()
                    );
                    store.clean_once(WallTime::from_seconds(NOW));
                }
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        // Compact all that can shrink, as eager compactor threads would.
        while let CleanOutcome::Compacted { .. } = store.compact_now(WallTime::from_seconds(NOW)) {}
        highest_segment_count =
            highest_segment_count.max(store.log().statistics().segments_in_next_digest);
    }
    let statistics = store.statistics();
    assert!(statistics.cleaner.compactions > 0, "{statistics:?}");
    assert!(statistics.cleaner.segments_cleaned > 0, "{statistics:?}");
    // The test did drive the log to its limit.
    assert!(highest_segment_count * 100 >= segment_limit * 90, "{highest_segment_count}");
    assert!(highest_segment_count < segment_limit);
    for key in 0..keys {
        let generation = writes - keys + key;
        let (found, _) = read(&store, format!("k{key}").as_bytes()).unwrap();
        assert_eq!(found, value_for(key, generation, 2000));
    }
    assert_eq!(replay(&store).len() as u32, keys);
}

#[test]
fn segments_of_dead_tombstones_are_found_by_scanning_and_cleaned() {
    let store = store_with(small_config());
    // Long keys and empty values: each remove's tombstone is as large as its object.
    let key = |index: u32| format!("{index:0900}").into_bytes();
    let keys = 1500u32;
    for index in 0..keys {
        write_at(&store, &key(index), b"", NOW).unwrap();
    }
    for index in 0..keys {
        remove_at(&store, &key(index), NOW + 10).unwrap();
    }
    let removed = store.statistics();
    assert!(removed.log_bytes_tombstones > 1_000_000, "{removed:?}");
    let mut rounds = 0;
    loop {
        let outcome = store.clean_combined_now(WallTime::from_seconds(NOW + 20 + rounds));
        rounds += 1;
        assert!(rounds < 500, "never converged: {:?}", store.statistics());
        if outcome == CleanOutcome::NothingToClean && rounds > 50 {
            break;
        }
    }
    let cleaned = store.statistics();
    // Every object and every tombstone is gone: the log is back to (nearly) empty.
    assert_eq!(cleaned.objects_live, 0);
    assert!(cleaned.cleaner.tombstone_scans > 0);
    assert!(cleaned.cleaner.dead_tombstone_bytes_found > 0);
    assert!(
        cleaned.log_bytes_tombstones < 200_000,
        "tombstones left: {} of {}",
        cleaned.log_bytes_tombstones,
        removed.log_bytes_tombstones
    );
    assert!(free_seglets(&cleaned) > free_seglets(&removed) + 2000, "{cleaned:?}");
    assert!(replay(&store).is_empty());
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Step {
    Write { key: u8, length: usize },
    Remove { key: u8 },
    Clean,
    Compact,
    Balance,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..24, prop_oneof![0usize..64, 500usize..4000])
            .prop_map(|(key, length)| Step::Write { key, length }),
        2 => (0u8..24).prop_map(|key| Step::Remove { key }),
        1 => Just(Step::Clean),
        1 => Just(Step::Compact),
        1 => Just(Step::Balance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn store_with_cleaning_matches_a_model_and_replays_to_it(
        steps in proptest::collection::vec(step_strategy(), 1..400),
        text_formula in any::<bool>(),
        replicas in 0u32..2,
    ) {
        let mut config = small_config();
        config.cleaner.replicas = replicas;
        if text_formula {
            config.cleaner.cost_benefit = CostBenefit::AgeOverOnePlusUtilization;
        }
        let store = store_with(config);
        let mut model: BTreeMap<Vec<u8>, (Vec<u8>, Version)> = BTreeMap::new();
        let mut now = NOW;
        for (index, step) in steps.into_iter().enumerate() {
            now += (index % 3) as u32;
            match step {
                Step::Write { key, length } => {
                    let name = format!("model-key-{key}").into_bytes();
                    let value = value_for(u32::from(key), index as u32, length);
                    match write_at(&store, &name, &value, now) {
                        Ok(version) => {
                            if let Some((_, old)) = model.get(&name) {
                                prop_assert!(version > *old);
                            }
                            model.insert(name, (value, version));
                        }
                        Err(ObjectError::LogFull) => {
                            // Memory is short: let the cleaner catch up, as the master's
                            // client would retry.
                            store.clean_combined_now(WallTime::from_seconds(now));
                        }
                        Err(other) => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Step::Remove { key } => {
                    let name = format!("model-key-{key}").into_bytes();
                    let removed = remove_at(&store, &name, now).unwrap();
                    let expected = model.remove(&name).map_or(Version(0), |(_, version)| version);
                    prop_assert_eq!(removed, expected);
                }
                Step::Clean => {
                    store.clean_combined_now(WallTime::from_seconds(now));
                }
                Step::Compact => {
                    store.compact_now(WallTime::from_seconds(now));
                }
                Step::Balance => {
                    store.clean_once(WallTime::from_seconds(now));
                }
            }
        }
        for (key, (value, version)) in &model {
            prop_assert_eq!(read(&store, key), Some((value.clone(), *version)));
        }
        for key in 0..24u8 {
            let name = format!("model-key-{key}").into_bytes();
            if !model.contains_key(&name) {
                prop_assert_eq!(read(&store, &name), None);
            }
        }
        prop_assert_eq!(store.statistics().objects_live, model.len() as u64);
        prop_assert_eq!(&replay(&store), &model);
        prop_assert_eq!(store.log().table_tallies().of(TABLE), tally_of_model(TABLE, &model));
        // Cleaning everything possible keeps the model, and so does the replay; moving
        // objects changes no table's live data.
        while let CleanOutcome::Combined { .. } = store.clean_combined_now(WallTime::from_seconds(now + 1000)) {}
        prop_assert_eq!(&replay(&store), &model);
        prop_assert_eq!(store.log().table_tallies().of(TABLE), tally_of_model(TABLE, &model));
        // The log counts the same live object bytes on its own, per segment, wherever the
        // cleaner moved them.
        prop_assert_eq!(
            store.log().table_tallies().of(TABLE).bytes,
            store.statistics().log_bytes_live_objects
        );
        for (key, (value, version)) in &model {
            prop_assert_eq!(read(&store, key), Some((value.clone(), *version)));
        }
    }
}

/// A number in `0..bound` by modulo: the draw these tests' fixed seeds were tuned on (the stall
/// reproduction in particular), kept so their sequences stay what was verified.
fn below(random: &mut SplitMix64, bound: u64) -> u64 {
    random.next_u64() % bound
}

/// Runs the high-utilization workload; returns the final statistics and the lowest memory
/// utilization seen once the log was full.
fn run_at_high_utilization(
    cost_benefit: CostBenefit,
    replicas: u32,
    skewed: bool,
) -> (StoreStatistics, f64, u64) {
    let config = StoreConfig {
        log_bytes: 16 << 20,
        segment_bytes: 160 << 10,
        seglet_bytes: 1 << 10,
        hash_table_bytes: 512 << 10,
        value_bytes_max: 8 << 10,
        cleaner: CleanerConfig { cost_benefit, replicas, ..CleanerConfig::default() },
        prefault_memory: false,
        flash_image_bytes: 0,
        ..StoreConfig::for_testing()
    };
    let store = store_with(config);
    let target_live_bytes = (config.log_bytes as f64 * 0.90) as u64;
    let mut random = SplitMix64::new(42);
    // Live keys (for uniform picks) and key → (generation, value length).
    let mut keys: Vec<u32> = Vec::new();
    let mut live: HashMap<u32, (u32, usize)> = HashMap::new();
    let mut live_bytes = 0u64;
    // Key, entry header and object header bytes per object, roughly.
    let overhead_bytes = 32u64;
    let mut next_key = 0u32;
    let mut written_bytes = 0u64;
    let mut utilization_min = f64::MAX;
    let mut operations = 0u64;
    // Phase 1 writes 100–1 000 B values; phase 2 (after one log size) 1 000–3 000 B ones, so
    // the sizes change while the log is full. Until the live data reaches 90 % new keys are
    // written; then existing keys are overwritten (uniformly, or 90 % of writes to the first
    // 15 % of the keys when `skewed`), and random keys removed whenever the live data would
    // pass 90 %.
    while written_bytes < 3 * config.log_bytes {
        operations += 1;
        let now = NOW + (operations / 200) as u32;
        let (low, high) = if written_bytes < config.log_bytes { (100, 1000) } else { (1000, 3000) };
        let length = (low + below(&mut random, high - low)) as usize;
        let cost = length as u64 + overhead_bytes;
        let key = if live_bytes + cost <= target_live_bytes || keys.is_empty() {
            next_key += 1;
            keys.push(next_key);
            next_key
        } else if skewed && below(&mut random, 10) < 9 {
            keys[below(&mut random, (keys.len() as u64 * 15).div_ceil(100)) as usize]
        } else {
            keys[below(&mut random, keys.len() as u64) as usize]
        };
        let generation = operations as u32;
        let value = value_for(key, generation, length);
        if let Err(error) = write_at(&store, format!("key-{key:06}").as_bytes(), &value, now) {
            panic!("write failed with {error:?} after {written_bytes} B: {:?}", store.statistics());
        }
        if let Some((_, old_length)) = live.insert(key, (generation, length)) {
            live_bytes -= old_length as u64 + overhead_bytes;
        }
        live_bytes += cost;
        written_bytes += length as u64;
        while live_bytes > target_live_bytes {
            let victim = keys.swap_remove(below(&mut random, keys.len() as u64) as usize);
            let (_, old_length) = live.remove(&victim).unwrap();
            live_bytes -= old_length as u64 + overhead_bytes;
            remove_at(&store, format!("key-{victim:06}").as_bytes(), now).unwrap();
        }
        store.clean_once(WallTime::from_seconds(now));
        if written_bytes > config.log_bytes && operations.is_multiple_of(64) {
            utilization_min = utilization_min.min(store.statistics().memory_utilization());
        }
    }
    for (key, (generation, length)) in &live {
        let (value, _) = read(&store, format!("key-{key:06}").as_bytes()).unwrap();
        assert_eq!(value, value_for(*key, *generation, *length), "key {key}");
    }
    assert_eq!(store.statistics().objects_live, live.len() as u64);
    (store.statistics(), utilization_min, written_bytes)
}

fn report_high_utilization_run(cost_benefit: CostBenefit, replicas: u32, skewed: bool) {
    let (statistics, utilization_min, written_bytes) =
        run_at_high_utilization(cost_benefit, replicas, skewed);
    let live_fraction = statistics.live_object_fraction();
    let cleaner = statistics.cleaner;
    let moved = cleaner.object_bytes_relocated
        + cleaner.tombstone_bytes_relocated
        + cleaner.bytes_compacted;
    eprintln!(
        "90% run ({cost_benefit:?}, replicas {replicas}, skewed {skewed}): written \
         {written_bytes} B, live objects {live_fraction:.3} of the log, memory utilization min \
         {utilization_min:.3}, cleaner bytes per new byte {:.2}, {cleaner:?}",
        moved as f64 / written_bytes as f64
    );
    assert!(live_fraction > 0.85, "live fraction {live_fraction}");
    assert!(cleaner.segments_cleaned > 0);
    if replicas > 0 {
        assert!(cleaner.compactions > 0, "two-level cleaning compacts");
    }
}

#[test]
fn ninety_percent_live_with_changing_sizes_never_refuses_writes() {
    // Memory-only (combined cleaning only) and replicated (two-level: compaction too).
    report_high_utilization_run(CostBenefit::AgeOverUtilization, 0, false);
    report_high_utilization_run(CostBenefit::AgeOverUtilization, 3, false);
}

/// The measurement behind the default cost-benefit formula (docs/design/cleaner.md); run with
/// `cargo test -p stratus-store cost_benefit_formulas_compared -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement (a few seconds), not a check"]
fn cost_benefit_formulas_compared_at_ninety_percent() {
    for skewed in [false, true] {
        report_high_utilization_run(CostBenefit::AgeOverUtilization, 0, skewed);
        report_high_utilization_run(CostBenefit::AgeOverOnePlusUtilization, 0, skewed);
    }
}

#[test]
fn writers_and_a_cleaner_thread_run_concurrently() {
    run_writers_against_cleaners(0, 1);
}

#[test]
fn writers_and_two_cleaner_threads_with_compaction_run_concurrently() {
    run_writers_against_cleaners(3, 2);
}

/// Writers overwrite their own keys and read them back while `cleaner_threads` threads call
/// `clean_once` in a loop; every read sees the writer's latest value.
fn run_writers_against_cleaners(replicas: u32, cleaner_threads: usize) {
    let mut config = small_config();
    config.cleaner.replicas = replicas;
    let store = store_with(config);
    let writers = 3u32;
    let iterations = 6000u32;
    let keys_per_writer = 20u32;
    let done = AtomicBool::new(false);
    let final_values: Mutex<HashMap<u32, (u32, usize)>> = Mutex::new(HashMap::new());
    std::thread::scope(|scope| {
        let store = &store;
        let done = &done;
        let cleaners: Vec<_> = (0..cleaner_threads)
            .map(|_| {
                scope.spawn(move || {
                    // Bounded: stops when writers are done (they do bounded work).
                    while !done.load(Ordering::Acquire) {
                        if let CleanOutcome::Idle | CleanOutcome::NothingToClean =
                            store.clean_once(WallTime::from_seconds(NOW))
                        {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut handles = Vec::new();
        for writer in 0..writers {
            let final_values = &final_values;
            handles.push(scope.spawn(move || {
                let mut mine: HashMap<u32, (u32, usize)> = HashMap::new();
                for iteration in 0..iterations {
                    let key = writer * 1000 + iteration % keys_per_writer;
                    let name = format!("w{key}").into_bytes();
                    let length = 200 + ((iteration as usize * 97) % 2500);
                    let value = value_for(key, iteration, length);
                    let mut attempts = 0;
                    loop {
                        match write_at(store, &name, &value, NOW) {
                            Ok(_) => break,
                            Err(ObjectError::LogFull) => {
                                // RETRY: the cleaner thread frees memory.
                                attempts += 1;
                                // Bounded by count, not time: a livelock (the cleaners idle
                                // while writes are refused) fails here with the evidence.
                                assert!(
                                    attempts < 200_000,
                                    "the cleaner never caught up: {:?} {:?}",
                                    store.statistics(),
                                    store.log().statistics()
                                );
                                std::thread::yield_now();
                            }
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    mine.insert(key, (iteration, length));
                    // Read back a key this writer owns: always its latest value.
                    let probe = writer * 1000 + (iteration * 7) % keys_per_writer;
                    if let Some(&(generation, length)) = mine.get(&probe) {
                        let (found, _) = read(store, format!("w{probe}").as_bytes()).unwrap();
                        assert_eq!(found, value_for(probe, generation, length));
                    }
                }
                final_values.lock().unwrap().extend(mine);
            }));
        }
        // Stop the cleaners before propagating a writer's panic: the scope waits for every
        // thread, so a panic here with the cleaners still looping would hang the test.
        let writer_results: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        done.store(true, Ordering::Release);
        for cleaner in cleaners {
            cleaner.join().unwrap();
        }
        for result in writer_results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let statistics = store.statistics();
    assert!(
        statistics.cleaner.combined_passes + statistics.cleaner.compactions > 0,
        "{statistics:?}"
    );
    for (key, (generation, length)) in final_values.into_inner().unwrap() {
        let (found, _) = read(&store, format!("w{key}").as_bytes()).unwrap();
        assert_eq!(found, value_for(key, generation, length));
    }
    let replayed = replay(&store);
    assert_eq!(replayed.len() as u64, u64::from(writers * keys_per_writer));
}

/// Overwrites 100-byte objects at 90 % live data with two-level cleaning, calling the
/// cleaner once every `clean_every` writes and whenever a write is refused; panics if the
/// cleaner stops making progress while writes are refused.
fn overwrite_at_ninety_percent_with_two_levels(
    config: StoreConfig,
    clean_every: u64,
    log_sizes: u64,
) {
    let store = store_with(config);
    let entry_bytes = 140;
    let objects = config.log_bytes * 90 / 100 / entry_bytes;
    let value = vec![0x5a_u8; 100];
    let mut random = SplitMix64::new(7 + clean_every);
    let total = objects + log_sizes * config.log_bytes / entry_bytes;
    for write in 0..total {
        let index = if write < objects { write } else { below(&mut random, objects) };
        let key = format!("object-{index:012}");
        let mut refused = 0u64;
        while let Err(error) = write_at(&store, key.as_bytes(), &value, NOW) {
            assert_eq!(error, ObjectError::LogFull);
            refused += 1;
            let outcome = store.clean_once(WallTime::from_seconds(NOW));
            assert!(
                refused < 1_000,
                "write {write} (cleaning every {clean_every}) refused {refused} times, the \
                 cleaner answering {outcome:?}: {:#?}",
                store.statistics()
            );
        }
        if write.is_multiple_of(clean_every) {
            store.clean_once(WallTime::from_seconds(NOW));
        }
    }
    assert_eq!(store.statistics().objects_live, objects);
}

/// Found by `stratus bench cleaner-latency --levels 2`: compaction empties old segments of
/// objects, leaving one-seglet segments that hold a few live tombstones each. A memory pass
/// once required every candidate to free a seglet on its own, which such a segment cannot;
/// the rest of the log was compacted dense, so no pass was worth running and writes were
/// refused forever. Merging many of those segments into one survivor is the best pass there is.
#[test]
fn two_level_cleaning_at_ninety_percent_merges_segments_of_tombstones() {
    let config = StoreConfig {
        log_bytes: 8 << 20,
        segment_bytes: 160 << 10,
        seglet_bytes: 4 << 10,
        hash_table_bytes: 256 << 10,
        value_bytes_max: 8 << 10,
        cleaner: CleanerConfig { replicas: 3, ..CleanerConfig::default() },
        prefault_memory: false,
        flash_image_bytes: 0,
        ..StoreConfig::for_testing()
    };
    overwrite_at_ninety_percent_with_two_levels(config, 1, 2);
}

/// Memory that tracks the data: with a memory target the log cleans ahead of need and gives the
/// pages of free seglets back, so churn over a small live set keeps the resident log near
/// live / target; without one the same churn fills the region before cleaning starts.
#[test]
fn a_memory_target_keeps_the_resident_log_near_the_live_data() {
    const KEYS: u32 = 200;
    const VALUE_BYTES: usize = 1000;
    for target_percent in [None, Some(90)] {
        for replicas in [0, 3] {
            let mut config = small_config();
            config.cleaner.memory_target_percent = target_percent;
            config.cleaner.replicas = replicas;
            let store = store_with(config);
            let clean_until_idle = |store: &ObjectStore| {
                for _ in 0..1_000 {
                    match store.clean_once(WallTime::from_seconds(NOW)) {
                        CleanOutcome::Idle | CleanOutcome::NothingToClean => return,
                        _ => {}
                    }
                }
                panic!("the cleaner never went idle");
            };
            let mut resident_peak = 0;
            // 40 generations of 200 KB: twice the 4 MiB region written.
            for generation in 0..40 {
                for key in 0..KEYS {
                    let value = value_for(key, generation, VALUE_BYTES);
                    let name = format!("key-{key}");
                    while let Err(error) = write_at(&store, name.as_bytes(), &value, NOW) {
                        assert_eq!(error, ObjectError::LogFull, "{error:?}");
                        store.clean_once(WallTime::from_seconds(NOW));
                    }
                }
                clean_until_idle(&store);
                resident_peak = resident_peak.max(store.statistics().log_bytes_resident);
            }
            for key in 0..KEYS {
                let (value, _) = read(&store, format!("key-{key}").as_bytes()).unwrap();
                assert_eq!(value, value_for(key, 39, VALUE_BYTES), "key {key}");
            }
            let statistics = store.statistics();
            let context = format!("target {target_percent:?}, replicas {replicas}: {statistics:?}");
            match target_percent {
                None => {
                    assert!(resident_peak >= 3 << 20, "{context}");
                    assert_eq!(statistics.cleaner.seglets_released, 0, "{context}");
                    assert_eq!(statistics.log_bytes_target, 0, "{context}");
                }
                Some(_) => {
                    // Live ~210 KB of objects (and, with two levels, as much again of
                    // tombstones, live until their segments are cleaned): the target is live
                    // / 0.9 plus one 160 KiB segment, a fraction of the 4 MiB region.
                    let target = statistics.log_bytes_target;
                    assert!(target < 1 << 20, "{context}");
                    assert!(statistics.log_bytes_resident <= target + (64 << 10), "{context}");
                    assert!(resident_peak <= 2 * target, "peak {resident_peak}: {context}");
                    assert!(statistics.cleaner.seglets_released > 0, "{context}");
                }
            }
        }
    }
}

/// With a memory target the hash table starts at 1 Ki buckets and follows the object count
/// (the cleaner resizes it a few thousand units per call, a writer helps when it falls far
/// behind): it grows under 20 000 objects, an enumeration running across the resize returns
/// every object exactly once, and it shrinks back once most objects are gone; drop_range still
/// finds every object of the range.
#[test]
fn a_memory_target_sizes_the_hash_table_for_the_objects() {
    let mut config = StoreConfig::for_testing();
    config.hash_table_bytes = 1 << 20;
    config.cleaner.memory_target_percent = Some(90);
    let store = store_with(config);
    assert_eq!(store.statistics().hash_table_buckets, 1024);
    let now = WallTime::from_seconds(NOW);
    let mut enumerated: Vec<Vec<u8>> = Vec::new();
    let mut cursor: Option<(u64, Option<Vec<u8>>)> = Some((0, None));
    // One call of the enumeration, a few objects at a time; false once it is done.
    let mut enumerate_step = |enumerated: &mut Vec<Vec<u8>>| {
        let Some((reversed, after)) = cursor.take() else { return false };
        cursor = store
            .enumerate(
                TABLE,
                stratus_types::HashRange::FULL,
                (reversed, after.as_deref()),
                200,
                now,
                &mut |key, _, _, _| enumerated.push(key.to_vec()),
            )
            .unwrap();
        cursor.is_some()
    };
    let mut enumeration_done = false;
    let mut buckets_at_enumeration_start = None;
    for key in 0..20_000u32 {
        write_at(&store, format!("key-{key}").as_bytes(), &value_for(key, 0, 16), NOW).unwrap();
        if key % 500 == 499 {
            store.clean_once(now);
        }
        // An enumeration of the first 2 000 keys' table runs alongside, a few objects a call.
        if key >= 2_000 && !enumeration_done && key % 50 == 0 {
            buckets_at_enumeration_start.get_or_insert(store.statistics().hash_table_buckets);
            enumeration_done = !enumerate_step(&mut enumerated);
        }
    }
    // The table grew while the enumeration ran.
    assert!(buckets_at_enumeration_start.unwrap() < 8192, "{buckets_at_enumeration_start:?}");
    assert!(!enumerated.is_empty());
    // The rest of the enumeration, after the table settled.
    while enumerate_step(&mut enumerated) {
        store.clean_once(now);
    }
    for _ in 0..100 {
        store.clean_once(now);
    }
    let buckets = store.statistics().hash_table_buckets;
    assert_eq!(buckets, 8192, "20 000 objects at up to 4 per bucket");
    // Every key written before the enumeration began is returned exactly once.
    let mut seen = std::collections::HashSet::new();
    for key in &enumerated {
        assert!(seen.insert(key.clone()), "{} twice", String::from_utf8_lossy(key));
    }
    for key in 0..2_000u32 {
        assert!(seen.contains(format!("key-{key}").as_bytes()), "key-{key} missed");
    }
    for key in 0..20_000u32 {
        assert_eq!(read(&store, format!("key-{key}").as_bytes()).unwrap().0, value_for(key, 0, 16));
    }
    for key in 500..20_000u32 {
        remove_at(&store, format!("key-{key}").as_bytes(), NOW).unwrap();
    }
    for _ in 0..100 {
        store.clean_once(now);
    }
    assert_eq!(store.statistics().hash_table_buckets, 1024);
    for key in 0..500u32 {
        assert_eq!(read(&store, format!("key-{key}").as_bytes()).unwrap().0, value_for(key, 0, 16));
    }
    assert_eq!(store.drop_range(TABLE, stratus_types::HashRange::FULL), 500);
    assert_eq!(store.statistics().objects_live, 0);
}

#[test]
fn a_segment_pinned_to_one_a_pass_keeps_stays_too_through_a_chain() {
    use std::collections::{BTreeMap, BTreeSet};
    use stratus_types::SegmentId;
    let ids: Vec<SegmentId> = (1..=5).map(SegmentId).collect();
    // 2 is pinned to 1, 3 to 2 (a chain), 5 to 4; only 1 is not wholly moved.
    let pins: BTreeMap<SegmentId, BTreeSet<SegmentId>> = [
        (SegmentId(2), BTreeSet::from([SegmentId(1)])),
        (SegmentId(3), BTreeSet::from([SegmentId(2)])),
        (SegmentId(5), BTreeSet::from([SegmentId(4)])),
    ]
    .into_iter()
    .collect();
    let stays = crate::cleaner::segments_that_stay(&ids, &[1, 0, 0, 0, 0], &pins);
    assert_eq!(stays, [true, true, true, false, false]);
    // Nothing kept: everything leaves, pins or not.
    assert_eq!(crate::cleaner::segments_that_stay(&ids, &[0; 5], &pins), [false; 5]);
    // The source of a chain left wholly moved, its middle kept: the rest of the chain stays.
    let stays = crate::cleaner::segments_that_stay(&ids, &[0, 2, 0, 0, 0], &pins);
    assert_eq!(stays, [false, true, true, false, false]);
}
