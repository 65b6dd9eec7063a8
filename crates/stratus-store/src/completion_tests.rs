//! Exactly-once mutations in the store: recorded with their effect, answered again from the
//! record, forgotten on acknowledgement, kept by the cleaner, replay and migration.

use stratus_log::format::CompletionRecord;
use stratus_log::{Certificate, Entry, EntryType, SegmentIterator};
use stratus_types::{key_hash, HashRange, LeaseId, RejectRules, RpcId, RpcIdentity, ServerId};
use stratus_types::{TableId, Version};

use crate::{Expiry, Mutated, Mutation, ObjectError, ObjectStore, StoreConfig, WallTime};

const TABLE: TableId = TableId(4);
const NOW: WallTime = WallTime::from_seconds(100);

fn store() -> ObjectStore {
    ObjectStore::new(StoreConfig::for_testing(), ServerId(1)).unwrap()
}

fn rpc(lease: u64, id: u64, acknowledged: u64) -> Option<RpcIdentity> {
    Some(RpcIdentity { lease: LeaseId(lease), rpc: RpcId(id), acknowledged: RpcId(acknowledged) })
}

fn mutate(
    store: &ObjectStore,
    key: &[u8],
    mutation: Mutation<'_>,
    rpc: Option<RpcIdentity>,
) -> Result<Mutated, ObjectError> {
    store.mutate((TABLE, key, key_hash(TABLE, key)), &RejectRules::NONE, mutation, rpc, NOW)
}

fn increment(
    store: &ObjectStore,
    key: &[u8],
    rpc: Option<RpcIdentity>,
) -> Result<Mutated, ObjectError> {
    mutate(store, key, Mutation::Increment { delta: 1 }, rpc)
}

fn value_of(store: &ObjectStore, key: &[u8]) -> Option<(Version, Vec<u8>)> {
    let mut value = Vec::new();
    let hash = key_hash(TABLE, key);
    store.read(TABLE, key, hash, &RejectRules::NONE, NOW, &mut value).ok().map(|v| (v, value))
}

fn counter(store: &ObjectStore, key: &[u8]) -> i64 {
    value_of(store, key).map_or(0, |(_, value)| i64::from_le_bytes(value.try_into().unwrap()))
}

fn segments(store: &ObjectStore) -> Vec<(Vec<u8>, Certificate)> {
    let log = store.log();
    log.segment_ids().into_iter().filter_map(|id| log.segment_contents(id)).collect()
}

#[test]
fn a_retried_increment_applies_once_and_gets_the_first_answer() {
    let store = store();
    let first = increment(&store, b"c", rpc(7, 1, 0)).unwrap();
    assert_eq!(first.integer, Some(1));
    assert!(!first.repeated);
    // The same RPC again (its answer was lost): the first answer, nothing applied.
    let again = increment(&store, b"c", rpc(7, 1, 0)).unwrap();
    assert_eq!(again, Mutated { repeated: true, ..first });
    assert_eq!(counter(&store, b"c"), 1);
    // Another RPC applies.
    let second = increment(&store, b"c", rpc(7, 2, 0)).unwrap();
    assert_eq!(second.integer, Some(2));
    assert_eq!(counter(&store, b"c"), 2);
    // Without an identity, a mutation applies every time it arrives.
    increment(&store, b"c", None).unwrap();
    increment(&store, b"c", None).unwrap();
    assert_eq!(counter(&store, b"c"), 4);
}

#[test]
fn a_retried_conditional_write_gets_its_answer_not_a_version_mismatch() {
    let store = store();
    let created =
        mutate(&store, b"k", Mutation::Write { value: b"a", expiry: Expiry::Never }, None).unwrap();
    let rules = RejectRules::version_equals(created.version);
    let write = Mutation::Write { value: b"b", expiry: Expiry::Never };
    let hash = key_hash(TABLE, b"k");
    let first = store.mutate((TABLE, b"k", hash), &rules, write, rpc(3, 5, 4), NOW).unwrap();
    // Its retry would fail the rule (the version moved on), but it is answered from the record.
    let retry = store.mutate((TABLE, b"k", hash), &rules, write, rpc(3, 5, 4), NOW).unwrap();
    assert_eq!(retry.version, first.version);
    assert!(retry.repeated);
    assert_eq!(value_of(&store, b"k"), Some((first.version, b"b".to_vec())));
}

#[test]
fn acknowledged_results_are_forgotten_and_their_rpcs_refused_as_stale() {
    let store = store();
    for id in 1..=10 {
        increment(&store, b"c", rpc(9, id, 0)).unwrap();
    }
    let statistics = store.completion_statistics();
    assert_eq!(statistics.records, 10);
    assert!(statistics.record_bytes >= 10 * 20, "{statistics:?}");
    let live_before = store.statistics().log_bytes_live;
    // RPC 11 says the client has the results of 1..=6.
    increment(&store, b"c", rpc(9, 11, 6)).unwrap();
    let statistics = store.completion_statistics();
    assert_eq!(statistics.records, 5, "7..=11 are kept");
    // The entries of 1..=6 died in the log (RPC 11 added an object and a completion, and its
    // old object died: the live bytes fell by six completions less one).
    let live_after = store.statistics().log_bytes_live;
    assert!(live_after < live_before, "{live_before} -> {live_after}");
    // A delayed copy of RPC 3 is refused, and applies nothing.
    assert_eq!(increment(&store, b"c", rpc(9, 3, 0)), Err(ObjectError::StaleRpc));
    assert_eq!(counter(&store, b"c"), 11);
    // RPC 8 is still answered from its record.
    let retry = increment(&store, b"c", rpc(9, 8, 0)).unwrap();
    assert_eq!((retry.integer, retry.repeated), (Some(8), true));
    assert_eq!(store.completion_statistics().stale_refused, 1);
}

#[test]
fn refused_and_ineffective_mutations_record_nothing() {
    let store = store();
    let hash = key_hash(TABLE, b"k");
    // Refused by a rule: nothing recorded, so the retry is evaluated again, and may succeed.
    let write = Mutation::Write { value: b"v", expiry: Expiry::Never };
    let must_exist = RejectRules { doesnt_exist: true, ..RejectRules::NONE };
    let refused = store.mutate((TABLE, b"k", hash), &must_exist, write, rpc(2, 1, 0), NOW);
    assert!(matches!(refused, Err(ObjectError::Rejected { .. })));
    // The remove of a missing object changes nothing: nothing recorded.
    assert_eq!(mutate(&store, b"k", Mutation::Remove, rpc(2, 2, 0)).unwrap().version, Version(0));
    assert_eq!(store.completion_statistics().records, 0);
    mutate(&store, b"k", write, None).unwrap();
    let retried = store.mutate((TABLE, b"k", hash), &must_exist, write, rpc(2, 1, 0), NOW).unwrap();
    assert!(!retried.repeated);
    // A remove that removes something is recorded with the removed version.
    let removed = mutate(&store, b"k", Mutation::Remove, rpc(2, 3, 0)).unwrap();
    assert_eq!(removed.version, retried.version);
    let again = mutate(&store, b"k", Mutation::Remove, rpc(2, 3, 0)).unwrap();
    assert_eq!((again.version, again.repeated), (removed.version, true));
}

#[test]
fn identities_that_cannot_be_right_are_refused() {
    let store = store();
    assert_eq!(increment(&store, b"c", rpc(0, 1, 0)), Err(ObjectError::InvalidRpcIdentity));
    assert_eq!(increment(&store, b"c", rpc(1, 0, 0)), Err(ObjectError::InvalidRpcIdentity));
    assert_eq!(increment(&store, b"c", rpc(1, 4, 4)), Err(ObjectError::InvalidRpcIdentity));
    assert_eq!(counter(&store, b"c"), 0);
}

#[test]
fn a_lease_holds_a_bounded_number_of_unacknowledged_results() {
    let store = ObjectStore::new(
        StoreConfig { log_bytes: 64 << 20, ..StoreConfig::for_testing() },
        ServerId(1),
    )
    .unwrap();
    let limit = stratus_types::limits::COMPLETIONS_PER_LEASE_MAX as u64;
    for id in 1..=limit {
        increment(&store, b"c", rpc(5, id, 0)).unwrap();
    }
    assert_eq!(
        increment(&store, b"c", rpc(5, limit + 1, 0)),
        Err(ObjectError::TooManyUnacknowledged)
    );
    // Retries of recorded RPCs are still answered; another lease is not held back.
    assert!(increment(&store, b"c", rpc(5, 1, 0)).unwrap().repeated);
    increment(&store, b"c", rpc(6, 1, 0)).unwrap();
    // Acknowledging makes room.
    increment(&store, b"c", rpc(5, limit + 1, limit)).unwrap();
    assert_eq!(counter(&store, b"c"), limit as i64 + 2);
}

#[test]
fn the_completion_entry_is_appended_with_the_object_it_records() {
    let store = store();
    increment(&store, b"c", None).unwrap();
    increment(&store, b"c", rpc(8, 1, 0)).unwrap();
    mutate(&store, b"c", Mutation::Remove, rpc(8, 2, 1)).unwrap();
    let mut types = Vec::new();
    for (bytes, certificate) in segments(&store) {
        for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
            let entry = entry.unwrap();
            if let Entry::Completion(record) = entry.entry {
                assert_eq!(record.table, TABLE);
                assert_eq!(record.key_hash, key_hash(TABLE, b"c").0);
            }
            types.push(entry.entry_type);
        }
    }
    let tail: Vec<EntryType> = types.iter().rev().take(5).rev().copied().collect();
    assert_eq!(
        tail,
        [
            EntryType::Object,
            EntryType::Tombstone,
            EntryType::Completion,
            EntryType::Tombstone,
            EntryType::Completion
        ]
    );
}

/// Unacknowledged results survive cleaning (moved with the live objects), acknowledged ones
/// are dropped by it, and retries are answered the same afterwards.
#[test]
fn the_cleaner_keeps_unacknowledged_results_and_drops_the_rest() {
    let store = store();
    let value = vec![7u8; 2_000];
    // Lease 1's results stay unacknowledged; lease 2 acknowledges all but its last.
    for id in 1..=300u64 {
        let key = format!("k{}", id % 40).into_bytes();
        let write = Mutation::Write { value: &value, expiry: Expiry::Never };
        mutate(&store, &key, write, rpc(1, id, 0)).unwrap();
        mutate(&store, &key, write, rpc(2, id, id - 1)).unwrap();
    }
    assert_eq!(store.completion_statistics().records, 301);
    for _ in 0..20 {
        store.clean_combined_now(NOW);
        store.compact_now(NOW);
    }
    let cleaner = store.cleaner_statistics();
    assert!(cleaner.segments_cleaned > 0, "{cleaner:?}");
    assert!(cleaner.completion_bytes_relocated > 0, "{cleaner:?}");
    // Every live entry the log counts is one the table or the index names: nothing leaked,
    // nothing freed twice (the log asserts the latter).
    assert_eq!(store.completion_statistics().records, 301);
    for id in [1u64, 150, 300] {
        let key = format!("k{}", id % 40).into_bytes();
        let write = Mutation::Write { value: b"other", expiry: Expiry::Never };
        let retry = mutate(&store, &key, write, rpc(1, id, 0)).unwrap();
        assert!(retry.repeated, "rpc {id}");
    }
    // The cleaned log holds lease 1's records and lease 2's last only.
    let mut replayed = Vec::new();
    for (bytes, certificate) in segments(&store) {
        for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
            if let Entry::Completion(record) = entry.unwrap().entry {
                replayed.push((record.lease_id, record.rpc_id));
            }
        }
    }
    assert!(replayed.iter().filter(|(lease, _)| *lease == 2).count() < 300);
}

/// A recovery replays the results with their objects: a retry reaching the recovery master
/// gets the original answer; results acknowledged by a later RPC are not brought back.
#[test]
fn replay_restores_the_unacknowledged_results_of_the_replayed_tablets() {
    let source = store();
    for id in 1..=20u64 {
        increment(&source, b"c", rpc(3, id, if id > 10 { 5 } else { 0 })).unwrap();
    }
    increment(&source, b"elsewhere", rpc(3, 21, 5)).unwrap();
    let copies = segments(&source);
    let borrowed: Vec<(&[u8], Certificate)> =
        copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
    let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(2)).unwrap();
    let only_c = key_hash(TABLE, b"c");
    let statistics = target.replay(&borrowed, &|_, hash| hash == only_c, NOW).unwrap();
    // 6..=20 on "c": 1..=5 were acknowledged by RPC 11's mark.
    assert_eq!(statistics.completions_replayed, 15);
    assert_eq!(counter(&target, b"c"), 20);
    let retry = increment(&target, b"c", rpc(3, 12, 5)).unwrap();
    assert_eq!((retry.integer, retry.repeated), (Some(12), true));
    assert_eq!(increment(&target, b"c", rpc(3, 4, 0)), Err(ObjectError::StaleRpc));
    // The other key's result stayed with its own tablet.
    assert!(!increment(&target, b"elsewhere", rpc(3, 21, 5)).unwrap().repeated);
}

/// A tablet transfer carries the tablet's results; the source forgets them with the tablet.
#[test]
fn migrated_results_answer_retries_at_the_new_master() {
    let source = store();
    for id in 1..=5u64 {
        increment(&source, b"c", rpc(4, id, 0)).unwrap();
    }
    let everything = HashRange { start: 0, end: u64::MAX };
    let records: Vec<CompletionRecord> = source.completions_in_range(TABLE, everything);
    assert_eq!(records.len(), 5);
    assert!(source.completions_in_range(TableId(99), everything).is_empty());
    let target = store();
    target.insert_migrated(TABLE, b"c", &5i64.to_le_bytes(), Version(5), None, NOW).unwrap();
    assert_eq!(target.import_completions(&records).unwrap(), 5);
    // Importing again keeps nothing twice.
    assert_eq!(target.import_completions(&records).unwrap(), 0);
    let retry = increment(&target, b"c", rpc(4, 3, 0)).unwrap();
    assert_eq!((retry.integer, retry.repeated), (Some(3), true));
    assert_eq!(counter(&target, b"c"), 5);
    source.drop_range(TABLE, everything);
    assert_eq!(source.completion_statistics().records, 0);
}

#[test]
fn an_expired_lease_s_results_are_forgotten() {
    let store = store();
    increment(&store, b"c", rpc(6, 1, 0)).unwrap();
    increment(&store, b"d", rpc(6, 2, 0)).unwrap();
    assert_eq!(store.client_leases(), vec![LeaseId(6)]);
    assert_eq!(store.forget_client_lease(LeaseId(6)), 2);
    assert_eq!(store.completion_statistics().records, 0);
    assert!(store.client_leases().is_empty());
}

#[test]
fn an_rpc_id_reused_on_another_object_gets_no_answer_of_the_first_and_applies_nothing() {
    let store = store();
    for _ in 0..42 {
        increment(&store, b"secret", None).unwrap();
    }
    let first = increment(&store, b"secret", rpc(9, 1, 0)).unwrap();
    assert_eq!(first.integer, Some(43));
    // The same lease and id on another object (a client reusing an id, or one that guessed
    // another client's lease): refused, without the first object's value.
    let reused = increment(&store, b"other", rpc(9, 1, 0));
    assert!(matches!(reused, Err(ObjectError::InvalidRpcIdentity)), "{reused:?}");
    let other_table = TableId(5);
    let key = b"secret";
    let elsewhere = store.mutate(
        (other_table, key, key_hash(other_table, key)),
        &RejectRules::NONE,
        Mutation::Increment { delta: 1 },
        rpc(9, 1, 0),
        NOW,
    );
    assert!(matches!(elsewhere, Err(ObjectError::InvalidRpcIdentity)), "{elsewhere:?}");
    assert_eq!(counter(&store, b"other"), 0);
    // The real retry still gets its answer.
    let retry = increment(&store, b"secret", rpc(9, 1, 0)).unwrap();
    assert_eq!((retry.integer, retry.repeated), (Some(43), true));
}
