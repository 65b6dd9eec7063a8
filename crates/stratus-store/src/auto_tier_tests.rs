//! Automatic tiering tests: auto tables stay in DRAM within their budget, the least recently
//! accessed segments leave past it, reads promote objects back keeping their versions, a
//! concurrent write always wins over a promotion, and a model test checks that no sequence of
//! reads, writes, removes, demotions, promotions and cleaning loses or duplicates an object —
//! in the store or in what recovery would replay.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use stratus_types::{key_hash, RejectRules, ServerId, TableId, Tier, Version};

use crate::cleaner_tests::small_config;
use crate::tests::replay;
use crate::WallTime;
use crate::{CleanOutcome, Expiry, MemoryImages, ObjectError, ObjectStore, StoreConfig};

/// The table the shared test helpers (`replay`) expect; auto here.
const AUTO_TABLE: TableId = TableId(7);
const NOW: u32 = 1_700_000_000;

fn auto_store(config: StoreConfig) -> ObjectStore {
    let mut store = ObjectStore::new(config, ServerId(1)).unwrap();
    store.attach_flash(Arc::new(MemoryImages::default()));
    store.set_table_tier(AUTO_TABLE, Tier::Auto);
    store
}

/// A store whose reads promote on the first read from flash (one in `promotion_one_in_reads`).
fn config_with(auto_dram_bytes_max: u64, promotion_one_in_reads: u32) -> StoreConfig {
    StoreConfig {
        auto_dram_bytes_max,
        promotion_one_in_reads,
        promotion_admission: crate::PromotionAdmission::FirstRead,
        ..small_config()
    }
}

fn value_for(key: u32, generation: u32, length: usize) -> Vec<u8> {
    let seed = key.wrapping_mul(31).wrapping_add(generation.wrapping_mul(17));
    (0..length).map(|index| (seed as usize + index) as u8).collect()
}

fn key_of(key: u32) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

fn write_at(store: &ObjectStore, key: u32, value: &[u8], now: u32) -> Result<Version, ObjectError> {
    let key = key_of(key);
    let hash = key_hash(AUTO_TABLE, &key);
    let now = WallTime::from_seconds(now);
    store.write(AUTO_TABLE, &key, hash, value, &RejectRules::NONE, Expiry::Never, now)
}

fn remove_at(store: &ObjectStore, key: u32, now: u32) -> Version {
    let key = key_of(key);
    let hash = key_hash(AUTO_TABLE, &key);
    store.remove(AUTO_TABLE, &key, hash, &RejectRules::NONE, WallTime::from_seconds(now)).unwrap()
}

fn read_at(store: &ObjectStore, key: u32, now: u32) -> Option<(Vec<u8>, Version)> {
    let key = key_of(key);
    let mut value = Vec::new();
    let rules = RejectRules::NONE;
    let hash = key_hash(AUTO_TABLE, &key);
    match store.read(AUTO_TABLE, &key, hash, &rules, WallTime::from_seconds(now), &mut value) {
        Ok(version) => Some((value, version)),
        Err(ObjectError::Rejected { .. }) => None,
        Err(other) => panic!("read failed: {other:?}"),
    }
}

/// Demotes until nothing more is to move; returns the objects moved.
fn demote_all(store: &ObjectStore, now: u32) -> u64 {
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let mut objects = 0;
    for _ in 0..1_000 {
        match store.demote_once(WallTime::from_seconds(now)).unwrap() {
            Some(demoted) => objects += demoted.objects,
            None => return objects,
        }
    }
    panic!("demotion never finishes");
}

#[test]
fn auto_objects_stay_in_dram_within_the_budget() {
    let store = auto_store(config_with(4 << 20, 1));
    for key in 0..300u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    assert_eq!(demote_all(&store, NOW), 0, "under budget: nothing leaves");
    let statistics = store.auto_statistics();
    assert_eq!((statistics.dram_objects, statistics.flash_objects), (300, 0));
    assert_eq!(statistics.dram_bytes, store.log().table_tallies().of(AUTO_TABLE).bytes);
    for key in 0..300u32 {
        assert_eq!(read_at(&store, key, NOW).unwrap().0, value_for(key, 0, 900));
    }
    let statistics = store.auto_statistics();
    assert_eq!((statistics.reads_from_dram, statistics.reads_from_flash), (300, 0));
    assert_eq!(statistics.dram_hit_ratio(), 1.0);
}

#[test]
fn past_the_budget_the_least_recently_read_segments_leave_and_the_hot_ones_stay() {
    // About 930 KB of objects against a budget of 300 KB.
    let store = auto_store(config_with(300 << 10, 1_000_000));
    for key in 0..1_000u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    // The last 100 keys written are the oldest-read once keys 0..100 are read later.
    for key in 0..100u32 {
        read_at(&store, key, NOW + 100).unwrap();
    }
    demote_all(&store, NOW + 100);
    let statistics = store.auto_statistics();
    assert!(statistics.dram_bytes <= 300 << 10, "{statistics:?}");
    assert!(statistics.demotions > 0 && statistics.flash_objects > 600, "{statistics:?}");
    assert_eq!(statistics.dram_objects + statistics.flash_objects, 1_000);
    let before = store.auto_statistics();
    for key in 0..100u32 {
        assert_eq!(read_at(&store, key, NOW + 200).unwrap().0, value_for(key, 0, 900));
    }
    let after = store.auto_statistics();
    assert_eq!(after.reads_from_dram - before.reads_from_dram, 100, "the hot set stayed");
    for key in 0..1_000u32 {
        assert_eq!(read_at(&store, key, NOW + 300).unwrap().0, value_for(key, 0, 900));
    }
    assert_eq!(replay(&store).len(), 1_000);
}

#[test]
fn past_the_budget_a_segment_read_often_stays_where_one_read_as_lately_but_rarely_leaves() {
    // About 930 KB of objects against a budget of 300 KB: every segment is read in the same
    // second, so the latest access time cannot tell them apart, but keys 0..100 are read ten
    // times as often. (Before read counts, the order fell back to segment ids: oldest first,
    // and keys 0..100, written first, left first.)
    let store = auto_store(config_with(300 << 10, 1_000_000));
    for key in 0..1_000u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    for round in 0..10 {
        for key in 0..1_000u32 {
            if key < 100 || round == 0 {
                read_at(&store, key, NOW + 100).unwrap();
            }
        }
    }
    demote_all(&store, NOW + 100);
    let before = store.auto_statistics();
    assert!(before.flash_objects > 600, "{before:?}");
    for key in 0..100u32 {
        assert_eq!(read_at(&store, key, NOW + 100).unwrap().0, value_for(key, 0, 900));
    }
    let after = store.auto_statistics();
    assert_eq!(after.reads_from_dram - before.reads_from_dram, 100, "the frequent set stayed");
}

#[test]
fn by_default_an_object_is_promoted_on_its_second_read_from_flash_not_its_first() {
    let config = StoreConfig { auto_dram_bytes_max: 0, ..small_config() };
    assert_eq!(config.promotion_admission, crate::PromotionAdmission::SecondRead);
    let store = auto_store(config);
    for key in 0..20u32 {
        write_at(&store, key, &value_for(key, 0, 500), NOW).unwrap();
    }
    demote_all(&store, NOW);
    assert_eq!(store.auto_statistics().flash_objects, 20);
    // Read once: served from flash, not promoted.
    for key in 0..20u32 {
        assert_eq!(read_at(&store, key, NOW + 1).unwrap().0, value_for(key, 0, 500));
    }
    assert_eq!(store.auto_statistics().promotions, 0);
    // Keys 0..5 read again: promoted; a third read is served from DRAM.
    for key in 0..5u32 {
        read_at(&store, key, NOW + 2).unwrap();
    }
    let statistics = store.auto_statistics();
    assert_eq!((statistics.promotions, statistics.flash_objects), (5, 15), "{statistics:?}");
    let from_dram = statistics.reads_from_dram;
    for key in 0..5u32 {
        read_at(&store, key, NOW + 3).unwrap();
    }
    assert_eq!(store.auto_statistics().reads_from_dram, from_dram + 5);
    assert_eq!(replay(&store).len(), 20);
}

#[test]
fn a_read_promotes_an_object_from_flash_keeping_its_version_and_one_copy() {
    let store = auto_store(config_with(0, 1));
    let version = write_at(&store, 1, &value_for(1, 0, 500), NOW).unwrap();
    write_at(&store, 2, &value_for(2, 0, 500), NOW).unwrap();
    demote_all(&store, NOW);
    let demoted = store.auto_statistics();
    assert_eq!((demoted.dram_objects, demoted.flash_objects), (0, 2));
    assert_eq!(read_at(&store, 1, NOW + 1), Some((value_for(1, 0, 500), version)));
    let promoted = store.auto_statistics();
    assert_eq!(promoted.promotions, 1);
    assert_eq!((promoted.dram_objects, promoted.flash_objects), (1, 1));
    assert_eq!(promoted.reads_from_flash, 1);
    // The next read is served from DRAM, same version.
    assert_eq!(read_at(&store, 1, NOW + 2), Some((value_for(1, 0, 500), version)));
    assert_eq!(store.auto_statistics().reads_from_dram, 1);
    assert_eq!(store.statistics().objects_live, 2);
    // A conditional write on the version read before the promotion still applies.
    let key = key_of(1);
    let rules = RejectRules { version_ne_given: true, given_version: version, ..RejectRules::NONE };
    let hash = key_hash(AUTO_TABLE, &key);
    let now = WallTime::from_seconds(NOW + 3);
    let written =
        store.write(AUTO_TABLE, &key, hash, b"new value, long enough", &rules, Expiry::Never, now);
    assert_eq!(written, Ok(Version(version.0 + 1)));
    assert_eq!(replay(&store).len(), 2);
}

#[test]
fn each_auto_table_has_its_own_figures_and_they_sum_to_the_stores() {
    let store = auto_store(config_with(0, 1));
    let other = TableId(8);
    store.set_table_tier(other, Tier::Auto);
    write_at(&store, 1, &value_for(1, 0, 500), NOW).unwrap();
    write_at(&store, 2, &value_for(2, 0, 500), NOW).unwrap();
    let key = b"other-key";
    let hash = key_hash(other, key);
    let at = WallTime::from_seconds(NOW);
    store.write(other, key, hash, &[9; 300], &RejectRules::NONE, Expiry::Never, at).unwrap();
    demote_all(&store, NOW);
    // Key 1 is read twice (promoted by the first read), the other table's key once.
    read_at(&store, 1, NOW + 1).unwrap();
    read_at(&store, 1, NOW + 2).unwrap();
    let mut value = Vec::new();
    let at = WallTime::from_seconds(NOW + 3);
    store.read(other, key, hash, &RejectRules::NONE, at, &mut value).unwrap();
    // A memory table's reads are in no auto table's figures.
    store.set_table_tier(TableId(9), Tier::Memory);

    let tables = store.auto_table_statistics(128);
    assert_eq!(tables.iter().map(|table| table.table).collect::<Vec<_>>(), [AUTO_TABLE, other]);
    let (auto, other_table) = (&tables[0], &tables[1]);
    assert_eq!((auto.dram_objects, auto.counts.flash_objects), (1, 1));
    assert_eq!((auto.counts.reads_from_flash, auto.counts.reads_from_dram), (1, 1));
    assert_eq!((auto.counts.promotions, auto.counts.objects_demoted), (1, 2));
    assert_eq!((other_table.dram_objects, other_table.counts.flash_objects), (1, 0));
    assert_eq!((other_table.counts.reads_from_flash, other_table.counts.promotions), (1, 1));
    assert_eq!(other_table.counts.objects_demoted, 1);
    let sum = |field: fn(&crate::AutoTableStatistics) -> u64| tables.iter().map(field).sum::<u64>();
    let whole = store.auto_statistics();
    assert_eq!(whole.dram_objects, sum(|table| table.dram_objects));
    assert_eq!(whole.dram_bytes, sum(|table| table.dram_bytes));
    assert_eq!(whole.flash_bytes, sum(|table| table.counts.flash_bytes));
    assert_eq!(whole.reads_from_flash, sum(|table| table.counts.reads_from_flash));
    assert_eq!(whole.promoted_bytes, sum(|table| table.counts.promoted_bytes));
    // The largest table only, when one is asked for.
    let largest = store.auto_table_statistics(1);
    assert_eq!(largest.len(), 1);
    assert_eq!(largest[0].table, AUTO_TABLE);
}

#[test]
fn promotion_stops_at_its_byte_rate() {
    let config = StoreConfig { promotion_bytes_per_second_max: 2_000, ..config_with(0, 1) };
    let store = auto_store(config);
    for key in 0..10u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    demote_all(&store, NOW);
    for key in 0..10u32 {
        assert_eq!(read_at(&store, key, NOW + 1).unwrap().0, value_for(key, 0, 900));
    }
    let statistics = store.auto_statistics();
    // One second's worth (2 000 bytes) holds two objects of about 930 bytes.
    assert_eq!(statistics.promotions, 2, "{statistics:?}");
    assert_eq!(statistics.promotions_refused, 8);
}

#[test]
fn a_segment_that_received_promotions_is_not_cleaned_before_their_sources() {
    let store = auto_store(config_with(0, 1));
    for key in 0..600u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    demote_all(&store, NOW);
    // The even keys are promoted into three heads; the odd ones keep their sources (dense
    // with objects on flash, so not worth cleaning for memory) in the log.
    let mut heads = Vec::new();
    for batch in 0..3u32 {
        for key in (batch * 200..(batch + 1) * 200).step_by(2) {
            read_at(&store, key, NOW + 1).unwrap();
        }
        heads.push(store.log().head_segment_id().unwrap());
        store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    }
    assert_eq!(store.auto_statistics().promotions, 300);
    let pins = store.promotion_pins();
    assert!(heads.iter().all(|head| pins.contains_key(head)), "{heads:?} {pins:?}");
    // The promoted copies die: their tombstones name the heads, and must outlive the
    // sources' copies of the same versions, or a recovery would bring the objects back.
    for key in (0..600u32).step_by(2) {
        remove_at(&store, key, NOW + 2);
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    for second in 0..20 {
        let now = WallTime::from_seconds(NOW + 3 + second);
        store.clean_combined_now(now);
        store.compact_now(now);
        assert_eq!(replay(&store).len(), 300, "removed objects came back");
    }
    assert!(heads.iter().all(|head| store.log().segment_ids().contains(head)));
    for key in 0..600u32 {
        let expected = (key % 2 == 1).then(|| value_for(key, 0, 900));
        assert_eq!(read_at(&store, key, NOW + 500).map(|(value, _)| value), expected);
    }
}

#[test]
fn a_segment_that_received_promotions_is_cleaned_together_with_its_sources() {
    let store = auto_store(config_with(0, 1));
    for key in 0..600u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    demote_all(&store, NOW);
    let sources = store.log().segment_ids();
    // The even keys are promoted into heads pinned to the sources.
    let mut heads = Vec::new();
    for batch in 0..3u32 {
        for key in (batch * 200..(batch + 1) * 200).step_by(2) {
            read_at(&store, key, NOW + 1).unwrap();
        }
        heads.push(store.log().head_segment_id().unwrap());
        store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    }
    assert!(heads.iter().all(|head| store.promotion_pins().contains_key(head)));
    // Everything dies but a few odd keys: sources and heads alike are worth cleaning, and the
    // heads' tombstones must outlive nothing a recovery could replay.
    for key in 0..600u32 {
        if key % 100 != 1 {
            remove_at(&store, key, NOW + 2);
        }
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    for second in 0..20 {
        let now = WallTime::from_seconds(NOW + 3 + second);
        store.clean_combined_now(now);
        store.compact_now(now);
        assert_eq!(replay(&store).len(), 6, "removed objects came back");
    }
    let in_log = store.log().segment_ids();
    assert!(heads.iter().all(|head| !in_log.contains(head)), "heads stayed: {heads:?}");
    assert!(sources.iter().all(|source| !in_log.contains(source)), "sources stayed");
    for key in 0..600u32 {
        let expected = (key % 100 == 1).then(|| value_for(key, 0, 900));
        assert_eq!(read_at(&store, key, NOW + 500).map(|(value, _)| value), expected);
    }
}

#[test]
fn a_write_racing_promotions_always_wins() {
    let store = Arc::new(auto_store(config_with(0, 1)));
    for key in 0..50u32 {
        write_at(&store, key, &value_for(key, 0, 600), NOW).unwrap();
    }
    // Every object starts on flash, and the writer waits for the reader's first pass, so
    // promotions happen whatever the scheduling; after it, reads, writes and demotions race.
    demote_all(&store, NOW);
    // The reader, the writer and the demoter: the demoter's cleaning reads imaged segments'
    // objects back into memory, so it too waits until every object was read once from flash.
    let first_pass_done = Arc::new(std::sync::Barrier::new(3));
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let rounds = 40u32;
    let writer = {
        let (store, first_pass_done, writing) =
            (store.clone(), first_pass_done.clone(), writing.clone());
        std::thread::spawn(move || {
            first_pass_done.wait();
            // Set when the writer ends, even by a panic, so the other threads stop too.
            struct Done(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.store(false, std::sync::atomic::Ordering::Release);
                }
            }
            let _done = Done(writing);
            let mut last = BTreeMap::new();
            for round in 1..=rounds {
                for key in 0..50u32 {
                    let value = value_for(key, round, 600);
                    // Promotions fill memory too: when it is short the cleaner makes room, as
                    // a server's cleaner thread would while the client retries.
                    let version = loop {
                        match write_at(&store, key, &value, NOW + round) {
                            Ok(version) => break version,
                            Err(ObjectError::LogFull) => {
                                store.clean_combined_now(WallTime::from_seconds(NOW + round));
                            }
                            Err(other) => panic!("write failed: {other:?}"),
                        }
                    };
                    last.insert(key, version);
                }
            }
            last
        })
    };
    let demoter = {
        let (store, first_pass_done, writing) =
            (store.clone(), first_pass_done.clone(), writing.clone());
        std::thread::spawn(move || {
            first_pass_done.wait();
            // The work of a server's cleaner thread: demotions, then cleaning (promoted copies
            // demoted again leave dead bytes that only cleaning frees).
            let mut round = 0;
            while writing.load(std::sync::atomic::Ordering::Acquire) {
                let now = WallTime::from_seconds(NOW + round);
                // A full log has no room for a new head: cleaning below makes some.
                let _ = store.log().roll_head(stratus_log::AppendPriority::Normal);
                while let Ok(Some(_)) = store.demote_once(now) {}
                store.clean_once(now);
                round += 1;
            }
        })
    };
    let mut seen: BTreeMap<u32, Version> = BTreeMap::new();
    let mut round = 0u32;
    while round < 4 || writing.load(std::sync::atomic::Ordering::Acquire) {
        assert!(round < 100_000, "the writer never finished");
        for key in 0..50u32 {
            if let Some((value, version)) = read_at(&store, key, NOW + round / 4) {
                let previous = seen.insert(key, version).unwrap_or(Version(0));
                assert!(version >= previous, "versions go back for key {key}");
                let generation = (0..=rounds).find(|g| value_for(key, *g, 600) == value);
                assert!(generation.is_some(), "a value never written");
            }
        }
        if round == 0 {
            first_pass_done.wait();
        }
        round += 1;
    }
    demoter.join().unwrap();
    let last = writer.join().unwrap();
    for (key, version) in last {
        assert_eq!(read_at(&store, key, NOW + 1_000), Some((value_for(key, rounds, 600), version)));
    }
    assert_eq!(store.statistics().objects_live, 50);
    let statistics = store.auto_statistics();
    assert_eq!(statistics.dram_objects + statistics.flash_objects, 50);
    assert!(statistics.promotions >= 50 && statistics.demotions > 0, "{statistics:?}");
    assert_eq!(replay(&store).len(), 50);
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Step {
    Write { key: u8, length: usize },
    Remove { key: u8 },
    Read { key: u8 },
    Demote,
    Clean,
    Compact,
    Tick,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u8..32, prop_oneof![0usize..64, 300usize..3000])
            .prop_map(|(key, length)| Step::Write { key, length }),
        2 => (0u8..32).prop_map(|key| Step::Remove { key }),
        6 => (0u8..32).prop_map(|key| Step::Read { key }),
        2 => Just(Step::Demote),
        1 => Just(Step::Clean),
        1 => Just(Step::Compact),
        1 => Just(Step::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn auto_tiering_never_loses_or_duplicates_an_object(
        steps in proptest::collection::vec(step_strategy(), 1..400),
        budget_kib in 0u64..64,
        one_in in 1u32..3,
    ) {
        let store = auto_store(config_with(budget_kib << 10, one_in));
        let mut model: BTreeMap<u32, (Vec<u8>, Version)> = BTreeMap::new();
        let mut now = NOW;
        for (index, step) in steps.into_iter().enumerate() {
            match step {
                Step::Write { key, length } => {
                    let key = u32::from(key);
                    let value = value_for(key, index as u32, length);
                    match write_at(&store, key, &value, now) {
                        Ok(version) => {
                            if let Some((_, old)) = model.get(&key) {
                                prop_assert!(version > *old);
                            }
                            model.insert(key, (value, version));
                        }
                        Err(ObjectError::LogFull) => {
                            store.clean_combined_now(WallTime::from_seconds(now));
                        }
                        Err(other) => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Step::Remove { key } => {
                    let key = u32::from(key);
                    let expected = model.remove(&key).map_or(Version(0), |(_, version)| version);
                    prop_assert_eq!(remove_at(&store, key, now), expected);
                }
                Step::Read { key } => {
                    let key = u32::from(key);
                    prop_assert_eq!(read_at(&store, key, now), model.get(&key).cloned());
                }
                Step::Demote => {
                    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
                    store.demote_once(WallTime::from_seconds(now)).unwrap();
                }
                Step::Clean => {
                    store.clean_combined_now(WallTime::from_seconds(now));
                }
                Step::Compact => {
                    store.compact_now(WallTime::from_seconds(now));
                }
                Step::Tick => now += 7,
            }
            let statistics = store.auto_statistics();
            prop_assert_eq!(statistics.dram_objects + statistics.flash_objects, model.len() as u64);
            // The one table's own figures are the store's.
            let table = store.auto_table_statistics(1).first().copied().unwrap_or_default();
            prop_assert_eq!(table.dram_bytes, statistics.dram_bytes);
            prop_assert_eq!(table.counts.flash_objects, statistics.flash_objects);
            prop_assert_eq!(table.counts.flash_bytes, statistics.flash_bytes);
        }
        let model_by_name: BTreeMap<Vec<u8>, (Vec<u8>, Version)> =
            model.iter().map(|(key, object)| (key_of(*key), object.clone())).collect();
        prop_assert_eq!(store.statistics().objects_live, model.len() as u64);
        prop_assert_eq!(&replay(&store), &model_by_name);
        for key in 0..32u32 {
            prop_assert_eq!(read_at(&store, key, now), model.get(&key).cloned());
        }
        // Cleaning all it can (which also frees promotions' pins) keeps the model.
        let mut rounds = 0;
        while let CleanOutcome::Combined { .. } =
            store.clean_combined_now(WallTime::from_seconds(now + 1_000))
        {
            rounds += 1;
            prop_assert!(rounds < 1_000);
        }
        prop_assert_eq!(&replay(&store), &model_by_name);
        for (key, object) in &model {
            prop_assert_eq!(read_at(&store, *key, now + 1_000), Some(object.clone()));
        }
        let statistics = store.auto_statistics();
        prop_assert_eq!(statistics.dram_objects + statistics.flash_objects, model.len() as u64);
    }
}

/// Found in review: a pass that keeps a segment (a flash read of one of its objects failed)
/// must keep every segment pinned to it, and pin its survivors to it.
/// Which reads of single image entries (offset > 0) fail. Whole-image reads (replication,
/// offset 0) always work, so the replay helper can read what backups hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum EntryReads {
    #[default]
    Work,
    /// Every entry read fails.
    AllFail,
    /// Reads of one entry fail: the first entry read after this was set.
    OneFails,
}

/// Memory images whose entry reads fail as `mode` says.
#[derive(Debug, Default)]
struct FailingEntryReads {
    inner: MemoryImages,
    mode: std::sync::Mutex<EntryReads>,
    /// The entry that fails in `OneFails`, once chosen.
    bad: std::sync::Mutex<Option<(stratus_types::SegmentId, u32)>>,
}

impl FailingEntryReads {
    fn set(&self, mode: EntryReads) {
        *self.mode.lock().unwrap() = mode;
    }
}

impl crate::FlashImages for FailingEntryReads {
    fn write_image(
        &self,
        segment: stratus_types::SegmentId,
        bytes: &[u8],
    ) -> Result<(), crate::FlashImageError> {
        self.inner.write_image(segment, bytes)
    }
    fn read(
        &self,
        segment: stratus_types::SegmentId,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, crate::FlashImageError> {
        let fails = offset > 0
            && match *self.mode.lock().unwrap() {
                EntryReads::Work => false,
                EntryReads::AllFail => true,
                EntryReads::OneFails => {
                    *self.bad.lock().unwrap().get_or_insert((segment, offset)) == (segment, offset)
                }
            };
        if fails {
            return Err(crate::FlashImageError::ShortRead);
        }
        self.inner.read(segment, offset, length)
    }
    fn delete_image(&self, segment: stratus_types::SegmentId) {
        self.inner.delete_image(segment)
    }
}

/// An auto store on `images` holding keys 0..600 (900-byte values), every one demoted.
fn demoted_store_on(images: Arc<FailingEntryReads>, config: StoreConfig) -> ObjectStore {
    let mut store = ObjectStore::new(config, ServerId(1)).unwrap();
    store.attach_flash(images);
    store.set_table_tier(AUTO_TABLE, Tier::Auto);
    for key in 0..600u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    demote_all(&store, NOW);
    store
}

#[test]
fn a_flash_read_failure_in_a_source_keeps_its_head_in_the_log_too() {
    let images = Arc::new(FailingEntryReads::default());
    let store = demoted_store_on(images.clone(), config_with(0, 1));
    let sources = store.log().segment_ids();
    let mut heads = Vec::new();
    for batch in 0..3u32 {
        for key in (batch * 200..(batch + 1) * 200).step_by(2) {
            read_at(&store, key, NOW + 1).unwrap();
        }
        heads.push(store.log().head_segment_id().unwrap());
        store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    }
    for key in 0..600u32 {
        if key % 100 != 1 {
            remove_at(&store, key, NOW + 2);
        }
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    // The odd survivors are on flash in the sources: reading them back fails from now on.
    images.set(EntryReads::AllFail);
    for second in 0..20 {
        let now = WallTime::from_seconds(NOW + 3 + second);
        let outcome = store.clean_combined_now(now);
        store.compact_now(now);
        let in_log = store.log().segment_ids();
        let heads_in_log = heads.iter().filter(|head| in_log.contains(head)).count();
        let sources_in_log = sources.iter().filter(|source| in_log.contains(source)).count();
        assert!(
            sources_in_log == 0 || heads_in_log == heads.len(),
            "second {second}: {outcome:?}: {heads_in_log} heads and {sources_in_log} sources left"
        );
        assert_eq!(replay(&store).len(), 6, "removed objects came back at second {second}");
    }
}

#[test]
fn objects_relocated_out_of_a_segment_kept_by_a_flash_failure_stay_dead() {
    let images = Arc::new(FailingEntryReads::default());
    let store = demoted_store_on(images.clone(), config_with(0, 1_000_000));
    // Half the objects die, so the imaged segments are worth cleaning.
    for key in (0..600u32).step_by(2) {
        remove_at(&store, key, NOW + 1);
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    images.set(EntryReads::OneFails);
    let outcome = store.clean_for_segments_now(WallTime::from_seconds(NOW + 2));
    eprintln!("first pass: {outcome:?} {:?}", store.cleaner_statistics());
    // The one object that cannot be read back stays; every other dies.
    let mut bad_key = None;
    for key in (1..600u32).step_by(2) {
        let k = key_of(key);
        let hash = key_hash(AUTO_TABLE, &k);
        let mut value = Vec::new();
        match store.read(
            AUTO_TABLE,
            &k,
            hash,
            &RejectRules::NONE,
            WallTime::from_seconds(NOW + 3),
            &mut value,
        ) {
            Ok(_) => {}
            Err(_) => bad_key = Some(key),
        }
    }
    let bad_key = bad_key.expect("one object fails");
    eprintln!("bad key {bad_key}");
    for key in (1..600u32).step_by(2) {
        if key != bad_key {
            remove_at(&store, key, NOW + 4);
        }
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    for second in 0..30 {
        let now = WallTime::from_seconds(NOW + 5 + second);
        let outcome = store.clean_combined_now(now);
        store.compact_now(now);
        let replayed = replay(&store);
        eprintln!("second {second}: {outcome:?} replayed {}", replayed.len());
        assert_eq!(replayed.len(), 1, "removed objects came back at second {second}");
    }
}

/// Found in the second review: pins of survivors not yet fused into the log, and a segment
/// whose image stays bad.
#[test]
fn pins_on_a_survivor_waiting_to_be_fused_are_kept() {
    let store = auto_store(config_with(0, 1));
    for key in 0..50u32 {
        write_at(&store, key, &value_for(key, 0, 900), NOW).unwrap();
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let kept = *store.log().segment_ids().first().unwrap();
    let survivor = store.log().open_side_segment(stratus_log::AppendPriority::Cleaner).unwrap();
    // As commit_pass with a deferred fusion: committed, not yet fused.
    store.log().commit_cleaning(&[survivor], &[]);
    store.pin_to_sources(&[survivor], &[kept]);
    let pins = store.promotion_pins();
    assert!(
        pins.contains_key(&survivor),
        "pin of FusePending survivor {survivor:?} dropped: {pins:?}"
    );
}

#[test]
fn segments_pinned_to_a_segment_that_stays_unreadable_do_not_pile_up() {
    let images = Arc::new(FailingEntryReads::default());
    let store = demoted_store_on(images.clone(), config_with(0, 1_000_000));
    for key in (0..600u32).step_by(2) {
        remove_at(&store, key, NOW + 1);
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    images.set(EntryReads::OneFails);
    store.clean_for_segments_now(WallTime::from_seconds(NOW + 2));
    let (bad_segment, _) = images.bad.lock().unwrap().expect("a bad entry");
    let mut bad_key = None;
    for key in (1..600u32).step_by(2) {
        let k = key_of(key);
        let hash = key_hash(AUTO_TABLE, &k);
        let mut value = Vec::new();
        if store
            .read(
                AUTO_TABLE,
                &k,
                hash,
                &RejectRules::NONE,
                WallTime::from_seconds(NOW + 2),
                &mut value,
            )
            .is_err()
        {
            bad_key = Some(key);
        }
    }
    let bad_key = bad_key.expect("one bad key");
    for round in 0..15u32 {
        let generation = round + 1;
        let now = NOW + 3 + round * 2;
        // Overwrite a third of the live (odd) keys: the older copies, wherever the cleaner
        // moved them, become dead, so the segments holding them are worth cleaning.
        for key in (1..600u32).step_by(2) {
            if key != bad_key && (key / 2) % 3 == round % 3 {
                let _ = write_at(&store, key, &value_for(key, generation, 900), now);
            }
        }
        store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
        demote_all(&store, now);
        let outcome = store.clean_for_segments_now(WallTime::from_seconds(now + 1));
        store.compact_now(WallTime::from_seconds(now + 1));
        let pins = store.promotion_pins();
        let pinned_to_bad = pins.values().filter(|sources| sources.contains(&bad_segment)).count();
        assert!(
            pinned_to_bad <= 3,
            "round {round}: {outcome:?}: {pinned_to_bad} segments pinned to the unreadable one, \
             {} in the log",
            store.log().segment_ids().len()
        );
    }
    let pins = store.promotion_pins();
    let pinned_to_bad = pins.values().filter(|sources| sources.contains(&bad_segment)).count();
    assert!(pinned_to_bad <= 3, "{pinned_to_bad} segments pinned to the unreadable one");
}
