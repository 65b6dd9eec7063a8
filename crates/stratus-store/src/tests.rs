//! Store tests: object semantics, reject rules, memory-full behaviour, enumeration, a model
//! check with log replay, and a concurrency stress test.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use stratus_log::{Entry, SegmentIterator};
use stratus_types::{key_hash, HashRange, RejectReason, RejectRules, ServerId, TableId, Version};

use crate::{Expiry, ObjectError, ObjectStore, StoreConfig, WallTime};

const TABLE: TableId = TableId(7);
const NOW: u32 = 1_700_000_000;

fn store() -> ObjectStore {
    ObjectStore::new(StoreConfig::for_testing(), ServerId(1)).unwrap()
}

fn write(store: &ObjectStore, key: &[u8], value: &[u8]) -> Result<Version, ObjectError> {
    store.write(
        TABLE,
        key,
        key_hash(TABLE, key),
        value,
        &RejectRules::NONE,
        Expiry::Never,
        WallTime::from_seconds(NOW),
    )
}

fn read(store: &ObjectStore, key: &[u8]) -> Result<(Vec<u8>, Version), ObjectError> {
    let mut value = Vec::new();
    let version = store.read(
        TABLE,
        key,
        key_hash(TABLE, key),
        &RejectRules::NONE,
        WallTime::from_seconds(0),
        &mut value,
    )?;
    Ok((value, version))
}

fn remove(store: &ObjectStore, key: &[u8]) -> Result<Version, ObjectError> {
    store.remove(TABLE, key, key_hash(TABLE, key), &RejectRules::NONE, WallTime::from_seconds(NOW))
}

fn rejected(reason: RejectReason, current: u64) -> ObjectError {
    ObjectError::Rejected { reason, current: Version(current) }
}

#[test]
fn versions_increase_across_overwrite_remove_and_recreate() {
    let store = store();
    assert_eq!(read(&store, b"a"), Err(rejected(RejectReason::ObjectDoesntExist, 0)));
    assert_eq!(write(&store, b"a", b"one"), Ok(Version(1)));
    assert_eq!(write(&store, b"b", b"x"), Ok(Version(2)));
    assert_eq!(write(&store, b"a", b"two"), Ok(Version(2)));
    assert_eq!(read(&store, b"a"), Ok((b"two".to_vec(), Version(2))));
    assert_eq!(remove(&store, b"a"), Ok(Version(2)));
    assert_eq!(remove(&store, b"a"), Ok(Version(0)));
    assert_eq!(read(&store, b"a"), Err(rejected(RejectReason::ObjectDoesntExist, 0)));
    // The safe version was 3 (two creates) and was raised to 3 by the remove: next is 3.
    assert_eq!(write(&store, b"a", b"three"), Ok(Version(3)));
    for _ in 0..5 {
        write(&store, b"b", b"y").unwrap();
    }
    assert_eq!(remove(&store, b"b"), Ok(Version(7)));
    assert_eq!(write(&store, b"b", b"again"), Ok(Version(8)));
    // Same key in another table is another object.
    let other = TableId(8);
    assert!(store
        .read(
            other,
            b"a",
            key_hash(other, b"a"),
            &RejectRules::NONE,
            WallTime::from_seconds(0),
            &mut Vec::new()
        )
        .is_err());
    assert_eq!(store.statistics().objects_live, 2);
}

#[test]
fn every_reject_rule_on_missing_and_present_objects() {
    let all_rules = |given: u64| {
        let base = RejectRules { given_version: Version(given), ..RejectRules::NONE };
        [
            RejectRules { doesnt_exist: true, ..base },
            RejectRules { exists: true, ..base },
            RejectRules { version_le_given: true, ..base },
            RejectRules { version_ne_given: true, ..base },
        ]
    };
    for given in [0u64, 1, 5, 6, 100] {
        for rules in all_rules(given) {
            // Missing object: the store agrees with RejectRules::check at version 0, except that
            // a read of a missing object is always ObjectDoesntExist.
            let store = store();
            let hash = key_hash(TABLE, b"k");
            let expected = rules.check(Version(0)).map_err(|reason| rejected(reason, 0));
            assert_eq!(
                store.read(TABLE, b"k", hash, &rules, WallTime::from_seconds(0), &mut Vec::new()),
                Err(rejected(RejectReason::ObjectDoesntExist, 0))
            );
            assert_eq!(
                store.remove(TABLE, b"k", hash, &rules, WallTime::from_seconds(NOW)),
                expected.map(|()| Version(0))
            );
            assert_eq!(
                store
                    .write(
                        TABLE,
                        b"k",
                        hash,
                        b"v",
                        &rules,
                        Expiry::Never,
                        WallTime::from_seconds(NOW)
                    )
                    .map(|_| ()),
                expected
            );
            let store_for_increment = self::store();
            assert_eq!(
                store_for_increment
                    .increment(TABLE, b"k", hash, 1, &rules, WallTime::from_seconds(NOW))
                    .map(|_| ()),
                expected
            );

            // Present object at version 6.
            let store = self::store();
            for _ in 0..6 {
                write(&store, b"k", &5i64.to_le_bytes()).unwrap();
            }
            let expected = rules.check(Version(6)).map_err(|reason| rejected(reason, 6));
            let mut value = Vec::new();
            assert_eq!(
                store.read(TABLE, b"k", hash, &rules, WallTime::from_seconds(0), &mut value),
                expected.map(|()| Version(6))
            );
            assert_eq!(value.is_empty(), expected.is_err());
            assert_eq!(
                store.increment(TABLE, b"k", hash, 2, &rules, WallTime::from_seconds(NOW)),
                expected.map(|()| (Version(7), 7))
            );
            let current = if expected.is_ok() { 7 } else { 6 };
            let expected = rules.check(Version(current)).map_err(|r| rejected(r, current));
            assert_eq!(
                store.write(
                    TABLE,
                    b"k",
                    hash,
                    b"w",
                    &rules,
                    Expiry::Never,
                    WallTime::from_seconds(NOW)
                ),
                expected.map(|()| Version(current + 1))
            );
            let current = if expected.is_ok() { current + 1 } else { current };
            let expected = rules.check(Version(current)).map_err(|r| rejected(r, current));
            assert_eq!(
                store.remove(TABLE, b"k", hash, &rules, WallTime::from_seconds(NOW)),
                expected.map(|()| Version(current))
            );
        }
    }
}

#[test]
fn increment_semantics() {
    let store = store();
    let hash = key_hash(TABLE, b"counter");
    let increment = |delta| {
        store.increment(
            TABLE,
            b"counter",
            hash,
            delta,
            &RejectRules::NONE,
            WallTime::from_seconds(NOW),
        )
    };
    assert_eq!(increment(5), Ok((Version(1), 5)));
    assert_eq!(increment(-7), Ok((Version(2), -2)));
    assert_eq!(read(&store, b"counter"), Ok(((-2i64).to_le_bytes().to_vec(), Version(2))));
    write(&store, b"counter", &i64::MAX.to_le_bytes()).unwrap();
    assert_eq!(increment(1), Err(ObjectError::IncrementOverflow { current: Version(3) }));
    write(&store, b"counter", b"short").unwrap();
    assert_eq!(increment(1), Err(ObjectError::NotAnInteger { current: Version(4) }));
    assert_eq!(read(&store, b"counter"), Ok((b"short".to_vec(), Version(4))));
}

#[test]
fn invalid_keys_and_large_values() {
    let store = store();
    assert_eq!(write(&store, b"", b"v"), Err(ObjectError::InvalidKey));
    assert_eq!(read(&store, b""), Err(ObjectError::InvalidKey));
    assert_eq!(remove(&store, b""), Err(ObjectError::InvalidKey));
    let long_key = vec![1u8; 65_536];
    assert_eq!(write(&store, &long_key, b"v"), Err(ObjectError::InvalidKey));
    let longest_key = vec![2u8; 65_535];
    let largest_value = vec![3u8; 128 << 10];
    assert_eq!(write(&store, &longest_key, &largest_value), Ok(Version(1)));
    assert_eq!(write(&store, &longest_key, &largest_value), Ok(Version(2)));
    assert_eq!(read(&store, &longest_key), Ok((largest_value.clone(), Version(2))));
    let too_large = vec![3u8; (128 << 10) + 1];
    assert_eq!(write(&store, b"k", &too_large), Err(ObjectError::ValueTooLarge));
}

#[test]
fn values_straddling_seglets_read_back_equal() {
    let store = store();
    let mut expected = BTreeMap::new();
    for index in 0..200u32 {
        let key = format!("key-{index}").into_bytes();
        // Sizes around the 64 KiB seglet so that many values straddle seglet boundaries.
        let length = [1usize, 100, 20_000, 65_000, 65_536, 70_000, 131_072][index as usize % 7];
        let value: Vec<u8> = (0..length).map(|byte| (byte as u32 ^ index) as u8).collect();
        write(&store, &key, &value).unwrap();
        expected.insert(key, value);
        if index % 40 == 39 {
            // Keep within the log: remove a few to make room is not possible (no cleaner), so
            // just stop before the log fills.
            if store.statistics().seglets_free < 64 {
                break;
            }
        }
    }
    for (key, value) in &expected {
        assert_eq!(&read(&store, key).unwrap().0, value);
    }
}

#[test]
fn log_full_then_remove_still_works() {
    let store = store();
    let value = vec![9u8; 100 << 10];
    let mut keys = Vec::new();
    for index in 0.. {
        let key = format!("k{index}").into_bytes();
        match write(&store, &key, &value) {
            Ok(_) => keys.push(key),
            Err(ObjectError::LogFull) => break,
            Err(other) => panic!("unexpected {other:?}"),
        }
        assert!(index < 1000, "log never filled");
    }
    let statistics = store.statistics();
    assert!(statistics.seglets_free >= 32, "the reserve is kept: {statistics:?}");
    // Small writes may still fill the head's last allocated seglet, then they are refused too.
    let mut small_writes = 0;
    while write(&store, format!("s{small_writes}").as_bytes(), b"").is_ok() {
        small_writes += 1;
        assert!(small_writes < 10_000, "small writes never refused");
    }
    assert_eq!(write(&store, b"another", b"small but refused"), Err(ObjectError::LogFull));
    assert_eq!(
        store.increment(
            TABLE,
            b"n",
            key_hash(TABLE, b"n"),
            1,
            &RejectRules::NONE,
            WallTime::from_seconds(NOW)
        ),
        Err(ObjectError::LogFull)
    );
    for key in &keys[..10] {
        remove(&store, key).unwrap();
        assert!(read(&store, key).is_err());
    }
    // Reads of the rest still work.
    assert_eq!(read(&store, &keys[10]).unwrap().0, value);
    assert_eq!(store.statistics().objects_live, keys.len() as u64 - 10 + small_writes);
}

/// Enumerates everything with batches of `bytes_max`, checking cursor order.
fn enumerate_all(
    store: &ObjectStore,
    range: HashRange,
    bytes_max: usize,
    mut between_calls: impl FnMut(usize),
) -> Vec<(Vec<u8>, Vec<u8>, Version)> {
    let mut all = Vec::new();
    let mut cursor = (0u64, None::<Vec<u8>>);
    for call in 0.. {
        let mut batch = Vec::new();
        let next = store
            .enumerate(
                TABLE,
                range,
                (cursor.0, cursor.1.as_deref()),
                bytes_max,
                WallTime::from_seconds(0),
                &mut |k, v, version, _| batch.push((k.to_vec(), v.to_vec(), version)),
            )
            .unwrap();
        let batch_bytes: usize = batch.iter().map(|(k, v, _)| k.len() + v.len()).sum();
        assert!(batch.len() <= 1 || batch_bytes <= bytes_max);
        all.extend(batch);
        match next {
            Some(next) => {
                assert!(next >= cursor, "cursor went backwards");
                cursor = next;
            }
            None => break,
        }
        between_calls(call);
    }
    // Emitted in strictly ascending (reversed hash, key) order.
    let order: Vec<(u64, Vec<u8>)> =
        all.iter().map(|(k, _, _)| (key_hash(TABLE, k).0.reverse_bits(), k.clone())).collect();
    assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "not in cursor order");
    all
}

#[test]
fn enumeration_returns_every_object_exactly_once() {
    for hash_table_bytes in [64u64, 64 * 4, 64 << 10] {
        let config = StoreConfig { hash_table_bytes, ..StoreConfig::for_testing() };
        let store = ObjectStore::new(config, ServerId(1)).unwrap();
        let mut expected = BTreeMap::new();
        for index in 0..300u32 {
            let key = format!("object-{index}").into_bytes();
            let value = vec![index as u8; index as usize % 50];
            let version = write(&store, &key, &value).unwrap();
            expected.insert(key, (value, version));
        }
        // Objects of another table are never returned.
        let other = TableId(99);
        store
            .write(
                other,
                b"object-1",
                key_hash(other, b"object-1"),
                b"x",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(NOW),
            )
            .unwrap();
        for bytes_max in [1usize, 60, 1000, usize::MAX] {
            let all = enumerate_all(&store, HashRange::FULL, bytes_max, |_| {});
            let got: BTreeMap<_, _> =
                all.into_iter().map(|(k, v, version)| (k, (v, version))).collect();
            assert_eq!(got, expected, "hash table {hash_table_bytes} bytes_max {bytes_max}");
        }
        // A range returns exactly the objects whose hash is in it.
        for range in HashRange::split_evenly(3) {
            let all = enumerate_all(&store, range, 200, |_| {});
            let wanted: BTreeSet<_> = expected
                .keys()
                .filter(|key| range.contains(key_hash(TABLE, key)))
                .cloned()
                .collect();
            let got: BTreeSet<_> = all.into_iter().map(|(k, _, _)| k).collect();
            assert_eq!(got, wanted);
        }
    }
}

#[test]
fn enumeration_under_interleaved_writes() {
    let store = store();
    let mut stable = BTreeSet::new();
    for index in 0..400u32 {
        let key = format!("stable-{index}").into_bytes();
        write(&store, &key, b"value").unwrap();
        stable.insert(key);
    }
    let mut extra = 0u32;
    let all = enumerate_all(&store, HashRange::FULL, 100, |call| {
        // Other keys come and go, and stable keys are overwritten, between calls.
        for _ in 0..5 {
            let key = format!("extra-{extra}").into_bytes();
            write(&store, &key, b"transient").unwrap();
            if extra.is_multiple_of(2) {
                remove(&store, &key).unwrap();
            }
            extra += 1;
        }
        let key = format!("stable-{}", call % 400).into_bytes();
        write(&store, &key, b"overwritten").unwrap();
    });
    let mut seen = BTreeMap::new();
    for (key, _, _) in all {
        *seen.entry(key).or_insert(0) += 1;
    }
    for key in &stable {
        assert_eq!(seen.get(key), Some(&1), "stable key {:?}", String::from_utf8_lossy(key));
    }
    assert!(seen.values().all(|&count| count == 1));
}

#[test]
fn drop_range_forgets_objects() {
    let store = store();
    let other = TableId(8);
    for index in 0..200u32 {
        let key = format!("k{index}").into_bytes();
        write(&store, &key, b"v").unwrap();
        store
            .write(
                other,
                &key,
                key_hash(other, &key),
                b"v",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(NOW),
            )
            .unwrap();
    }
    let live_before = store.statistics().log_bytes_live;
    let [low, high] = HashRange::split_evenly(2)[..] else { unreachable!() };
    let in_low = (0..200u32)
        .filter(|index| low.contains(key_hash(TABLE, format!("k{index}").as_bytes())))
        .count() as u64;
    assert_eq!(store.drop_range(TABLE, low), in_low);
    assert!(store.statistics().log_bytes_live < live_before);
    for index in 0..200u32 {
        let key = format!("k{index}").into_bytes();
        let present = read(&store, &key).is_ok();
        assert_eq!(present, high.contains(key_hash(TABLE, &key)));
        assert!(store
            .read(
                other,
                &key,
                key_hash(other, &key),
                &RejectRules::NONE,
                WallTime::from_seconds(0),
                &mut Vec::new()
            )
            .is_ok());
    }
    assert_eq!(store.drop_range(TABLE, HashRange::FULL), 200 - in_low);
    assert_eq!(store.statistics().objects_live, 200);
}

#[test]
fn table_tallies_follow_every_table_and_each_new_head_records_them() {
    let store = store();
    let other = TableId(8);
    let mut models: BTreeMap<TableId, Model> = BTreeMap::new();
    for index in 0..300u32 {
        let table = if index % 3 == 0 { other } else { TABLE };
        let key = format!("k{}", index % 120).into_bytes();
        let value = vec![b'v'; (index as usize * 37) % 900];
        let version = store
            .write(
                table,
                &key,
                key_hash(table, &key),
                &value,
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(NOW),
            )
            .unwrap();
        models.entry(table).or_default().insert(key, (value, version));
    }
    let remove_key = b"k5".to_vec();
    remove(&store, &remove_key).unwrap();
    models.get_mut(&TABLE).unwrap().remove(&remove_key);
    let [low, _] = HashRange::split_evenly(2)[..] else { unreachable!() };
    store.drop_range(other, low);
    models.get_mut(&other).unwrap().retain(|key, _| !low.contains(key_hash(other, key)));
    for (table, model) in &models {
        assert_eq!(store.log().table_tallies().of(*table), tally_of_model(*table, model));
    }
    // A new head records what was live when it opened.
    let head = store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let (bytes, certificate) = store.log().segment_contents(head).unwrap();
    let recorded: Vec<_> = SegmentIterator::new(&bytes, &certificate)
        .unwrap()
        .filter_map(|entry| match entry.unwrap().entry {
            Entry::TableStats(statistics) => Some(statistics),
            _ => None,
        })
        .collect();
    let expected: Vec<_> =
        models.iter().map(|(table, model)| (*table, tally_of_model(*table, model))).collect();
    assert_eq!(
        recorded,
        vec![stratus_log::TableStats { tables: expected, others: Default::default() }]
    );
}

#[test]
fn statistics_track_the_log() {
    let store = store();
    let empty = store.statistics();
    assert_eq!(empty.seglets_total, 256);
    // Seglet 0 is never handed out (reference 0 means "no entry" in the hash table).
    assert_eq!(empty.seglets_free, 255);
    assert_eq!(empty.segments_in_log, 0);
    assert_eq!(empty.log_bytes_total, 16 << 20);
    write(&store, b"a", &[0; 1000]).unwrap();
    let one = store.statistics();
    assert_eq!(one.segments_in_log, 1);
    assert_eq!(one.seglets_free, 254);
    assert_eq!(one.log_bytes_allocated, 64 << 10);
    assert!(one.log_bytes_live > 1000);
    write(&store, b"a", &[0; 1000]).unwrap();
    let two = store.statistics();
    // The old object died; the new object and the tombstone are live.
    assert!(two.log_bytes_live < one.log_bytes_live + 1100);
    assert_eq!(two.objects_live, 1);
    assert_eq!(two.safe_version, 2);
}

/// One model operation.
#[derive(Debug, Clone)]
enum Operation {
    Write { key: u8, length: usize, rules: RejectRules },
    Remove { key: u8, rules: RejectRules },
    Increment { key: u8, delta: i64, rules: RejectRules },
    Read { key: u8, rules: RejectRules },
}

fn rules_strategy() -> impl Strategy<Value = RejectRules> {
    (0u64..6, any::<[bool; 4]>(), 0u8..4).prop_map(|(given, flags, unconditional)| {
        if unconditional > 0 {
            return RejectRules::NONE;
        }
        RejectRules {
            given_version: Version(given),
            doesnt_exist: flags[0],
            exists: flags[1],
            version_le_given: flags[2],
            version_ne_given: flags[3],
        }
    })
}

fn operation_strategy() -> impl Strategy<Value = Operation> {
    let key = 0u8..12;
    prop_oneof![
        (key.clone(), prop_oneof![0usize..200, 60_000usize..70_000], rules_strategy())
            .prop_map(|(key, length, rules)| Operation::Write { key, length, rules }),
        (key.clone(), rules_strategy()).prop_map(|(key, rules)| Operation::Remove { key, rules }),
        (key.clone(), -5i64..5, rules_strategy())
            .prop_map(|(key, delta, rules)| Operation::Increment { key, delta, rules }),
        (key, rules_strategy()).prop_map(|(key, rules)| Operation::Read { key, rules }),
    ]
}

fn model_key(key: u8) -> Vec<u8> {
    format!("model-key-{key}").into_bytes()
}

/// What a store should hold: key → (value, version).
pub(crate) type Model = BTreeMap<Vec<u8>, (Vec<u8>, Version)>;

/// The live data of `table` that `model` implies: whole object entries.
pub(crate) fn tally_of_model(table: TableId, model: &Model) -> stratus_log::TableTally {
    let bytes = model
        .iter()
        .map(|(key, (value, version))| {
            // The timestamp is a fixed-width field: any time gives the same length.
            let content =
                stratus_log::format::encode_object(table, *version, NOW, None, key, value);
            let header = stratus_log::format::EntryHeader::new(
                stratus_log::EntryType::Object,
                content.len() as u32,
            );
            (header.header_bytes() + content.len()) as u64
        })
        .sum();
    stratus_log::TableTally { bytes, objects: model.len() as u64 }
}

/// Replays every segment through the validating iterator with RAMCloud's version rules:
/// per key, the newest object is live unless a tombstone with a version >= it exists.
pub(crate) fn replay(store: &ObjectStore) -> BTreeMap<Vec<u8>, (Vec<u8>, Version)> {
    let mut objects: HashMap<Vec<u8>, (Vec<u8>, Version)> = HashMap::new();
    let mut tombstones: HashMap<Vec<u8>, Version> = HashMap::new();
    let mut safe_version_max = Version(0);
    let log = store.log();
    for segment_id in log.segment_ids() {
        // What a backup holds: a segment with objects on flash is replicated from its image.
        let (bytes, certificate) = match store.replication_image(segment_id) {
            Some(image) => image.unwrap(),
            None => log.segment_contents(segment_id).unwrap(),
        };
        for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
            match entry.unwrap().entry {
                Entry::Object(object) => {
                    assert_eq!(object.table, TABLE);
                    let slot =
                        objects.entry(object.key.to_vec()).or_insert((Vec::new(), Version(0)));
                    if object.version > slot.1 {
                        *slot = (object.value.to_vec(), object.version);
                    }
                }
                Entry::Tombstone(tombstone) => {
                    let slot = tombstones.entry(tombstone.key.to_vec()).or_default();
                    *slot = (*slot).max(tombstone.object_version);
                }
                Entry::SafeVersion(version) => safe_version_max = safe_version_max.max(version),
                Entry::SegmentHeader(header) => assert_eq!(header.segment_id, segment_id),
                Entry::LogDigest(ids) => assert_eq!(ids.last(), Some(&segment_id)),
                Entry::TableStats(_)
                | Entry::Completion(_)
                | Entry::Prepared(_)
                | Entry::PreparedTombstone(_)
                | Entry::TxParticipants(_) => {}
            }
        }
    }
    assert!(safe_version_max <= store.log().safe_version());
    objects
        .into_iter()
        .filter(|(key, (_, version))| tombstones.get(key).is_none_or(|dead| dead < version))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_a_model_and_the_log_replays_to_it(operations in proptest::collection::vec(operation_strategy(), 1..120)) {
        let store = store();
        let mut model: BTreeMap<Vec<u8>, (Vec<u8>, Version)> = BTreeMap::new();
        let mut highest_version: HashMap<Vec<u8>, Version> = HashMap::new();
        for operation in operations {
            let (key, rules) = match &operation {
                Operation::Write { key, rules, .. }
                | Operation::Remove { key, rules }
                | Operation::Increment { key, rules, .. }
                | Operation::Read { key, rules } => (model_key(*key), *rules),
            };
            let hash = key_hash(TABLE, &key);
            let current = model.get(&key).map_or(Version(0), |(_, version)| *version);
            let check = rules.check(current).map_err(|reason| rejected(reason, current.0));
            let new_version = match operation {
                Operation::Write { length, .. } => {
                    let value = vec![length as u8; length];
                    let result = store.write(TABLE, &key, hash, &value, &rules, Expiry::Never, WallTime::from_seconds(NOW));
                    prop_assert_eq!(result.map(|_| ()), check);
                    result.ok().inspect(|version| {
                        model.insert(key.clone(), (value, *version));
                    })
                }
                Operation::Remove { .. } => {
                    let result = store.remove(TABLE, &key, hash, &rules, WallTime::from_seconds(NOW));
                    prop_assert_eq!(result, check.map(|()| current));
                    if result.is_ok() {
                        model.remove(&key);
                    }
                    None
                }
                Operation::Increment { delta, .. } => {
                    let result = store.increment(TABLE, &key, hash, delta, &rules, WallTime::from_seconds(NOW));
                    let expected = check.and_then(|()| match model.get(&key) {
                        None => Ok(delta),
                        Some((value, _)) => <[u8; 8]>::try_from(&value[..])
                            .map(|bytes| i64::from_le_bytes(bytes) + delta)
                            .map_err(|_| ObjectError::NotAnInteger { current }),
                    });
                    prop_assert_eq!(result.map(|(_, value)| value), expected);
                    result.ok().map(|(version, value)| {
                        model.insert(key.clone(), (value.to_le_bytes().to_vec(), version));
                        version
                    })
                }
                Operation::Read { .. } => {
                    let mut value = Vec::new();
                    let result = store.read(TABLE, &key, hash, &rules, WallTime::from_seconds(0), &mut value);
                    match model.get(&key) {
                        None => prop_assert_eq!(result, Err(rejected(RejectReason::ObjectDoesntExist, 0))),
                        Some((expected, version)) => {
                            prop_assert_eq!(result, check.map(|()| *version));
                            if result.is_ok() {
                                prop_assert_eq!(&value, expected);
                            }
                        }
                    }
                    None
                }
            };
            if let Some(version) = new_version {
                let highest = highest_version.entry(key.clone()).or_default();
                prop_assert!(version > *highest, "versions of a key must strictly increase");
                *highest = version;
            }
        }
        prop_assert_eq!(store.statistics().objects_live, model.len() as u64);
        prop_assert_eq!(store.log().table_tallies().of(TABLE), tally_of_model(TABLE, &model));
        // The log counts the same live object bytes on its own, per segment.
        prop_assert_eq!(
            store.log().table_tallies().of(TABLE).bytes,
            store.statistics().log_bytes_live_objects
        );
        prop_assert_eq!(replay(&store), model.clone());
        let enumerated: BTreeMap<_, _> = enumerate_all(&store, HashRange::FULL, 300, |_| {})
            .into_iter()
            .map(|(key, value, version)| (key, (value, version)))
            .collect();
        prop_assert_eq!(enumerated, model);
    }
}

#[test]
fn concurrent_writers_and_readers_on_overlapping_keys() {
    let store = store();
    let threads = 4u32;
    let iterations = 400u32;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let store = &store;
            scope.spawn(move || {
                let mut last_seen: HashMap<u32, Version> = HashMap::new();
                for iteration in 0..iterations {
                    let key_number = (iteration * 7 + thread) % 16;
                    let key = format!("shared-{key_number}").into_bytes();
                    let hash = key_hash(TABLE, &key);
                    match iteration % 4 {
                        0 | 1 => {
                            let value = vec![thread as u8; (iteration as usize * 13) % 3000];
                            store
                                .write(
                                    TABLE,
                                    &key,
                                    hash,
                                    &value,
                                    &RejectRules::NONE,
                                    Expiry::Never,
                                    WallTime::from_seconds(NOW),
                                )
                                .unwrap();
                        }
                        2 => {
                            store
                                .increment(
                                    TABLE,
                                    b"counter",
                                    key_hash(TABLE, b"counter"),
                                    1,
                                    &RejectRules::NONE,
                                    WallTime::from_seconds(NOW),
                                )
                                .unwrap();
                        }
                        _ => {
                            let mut value = Vec::new();
                            if let Ok(version) = store.read(
                                TABLE,
                                &key,
                                hash,
                                &RejectRules::NONE,
                                WallTime::from_seconds(0),
                                &mut value,
                            ) {
                                // Values are uniform: a torn read would mix bytes.
                                assert!(value.windows(2).all(|pair| pair[0] == pair[1]));
                                let previous =
                                    last_seen.insert(key_number, version).unwrap_or_default();
                                assert!(version >= previous, "a key's version went backwards");
                            }
                        }
                    }
                }
            });
        }
    });
    let (value, _) = read(&store, b"counter").unwrap();
    let increments = threads * iterations / 4;
    assert_eq!(i64::from_le_bytes(value.try_into().unwrap()), i64::from(increments));
    replay(&store);
}
