//! A participant's side of transactions in the store: votes, locks, decisions, and the
//! prepared state kept by the cleaner and brought back by replay.

use stratus_log::format::TxParticipant;
use stratus_log::{Certificate, Entry, EntryType, SegmentIterator};
use stratus_types::{key_hash, LeaseId, RejectRules, RpcId, RpcIdentity, ServerId};
use stratus_types::{TableId, TxDecision, TxOpKind, TxVote, Version};

use crate::{
    Expiry, Mutation, ObjectError, ObjectStore, StoreConfig, TxDecided, TxPrepareOp, WallTime,
};

const TABLE: TableId = TableId(5);
const NOW: WallTime = WallTime::from_seconds(100);
const LEASE: u64 = 3;

fn store() -> ObjectStore {
    ObjectStore::new(StoreConfig::for_testing(), ServerId(1)).unwrap()
}

fn identity(lease: u64, rpc: u64) -> RpcIdentity {
    RpcIdentity { lease: LeaseId(lease), rpc: RpcId(rpc), acknowledged: RpcId(0) }
}

fn put(store: &ObjectStore, key: &[u8], value: &[u8]) -> Version {
    let hash = key_hash(TABLE, key);
    store.write(TABLE, key, hash, value, &RejectRules::NONE, Expiry::Never, NOW).unwrap()
}

fn read(store: &ObjectStore, key: &[u8]) -> Result<(Version, Vec<u8>), ObjectError> {
    let mut value = Vec::new();
    let hash = key_hash(TABLE, key);
    store.read(TABLE, key, hash, &RejectRules::NONE, NOW, &mut value).map(|v| (v, value))
}

/// The participant list of a one-operation transaction (leaked: tests build a few hundred).
fn alone(key: &[u8], rpc: u64) -> &'static [TxParticipant] {
    let participant = TxParticipant { table: TABLE, key_hash: key_hash(TABLE, key).0, rpc_id: rpc };
    Box::leak(Box::new([participant]))
}

/// A one-operation transaction's operation (its transaction id is its own rpc id).
fn op<'a>(
    key: &'a [u8],
    (lease, rpc): (u64, u64),
    kind: TxOpKind,
    version_read: Version,
    value: &'a [u8],
) -> TxPrepareOp<'a> {
    TxPrepareOp {
        table: TABLE,
        key,
        hash: key_hash(TABLE, key),
        rpc: identity(lease, rpc),
        transaction: RpcId(rpc),
        kind,
        version_read,
        value,
        participants: alone(key, rpc),
    }
}

fn vote(store: &ObjectStore, op: &TxPrepareOp<'_>) -> (TxVote, bool) {
    let voted = store.prepare(op, NOW).unwrap();
    (voted.vote, voted.repeated)
}

fn decide(
    store: &ObjectStore,
    key: &[u8],
    (lease, rpc): (u64, u64),
    decision: TxDecision,
) -> TxDecided {
    let object = (TABLE, key_hash(TABLE, key));
    store.decide(object, identity(lease, rpc), decision, NOW).unwrap()
}

fn segments(store: &ObjectStore) -> Vec<(Vec<u8>, Certificate)> {
    let log = store.log();
    log.segment_ids().into_iter().filter_map(|id| log.segment_contents(id)).collect()
}

#[test]
fn a_prepared_write_locks_its_object_until_the_commit_applies_it() {
    let store = store();
    let read_version = put(&store, b"alice", b"100");
    let debit = op(b"alice", (LEASE, 1), TxOpKind::Write, read_version, b"90");
    assert_eq!(vote(&store, &debit), (TxVote::Prepared, false));
    assert_eq!(store.prepared_statistics().operations, 1);
    // Locked: reads and writes outside the transaction wait (the master answers RETRY).
    assert_eq!(read(&store, b"alice"), Err(ObjectError::Locked));
    let hash = key_hash(TABLE, b"alice");
    let write = Mutation::Write { value: b"x", expiry: Expiry::Never };
    let blocked = store.mutate((TABLE, b"alice", hash), &RejectRules::NONE, write, None, NOW);
    assert_eq!(blocked, Err(ObjectError::Locked));
    // The same PREPARE again (its answer lost) gets the same vote and locks nothing more.
    assert_eq!(vote(&store, &debit), (TxVote::Prepared, true));
    assert_eq!(decide(&store, b"alice", (LEASE, 1), TxDecision::Commit), TxDecided::Applied);
    assert_eq!(read(&store, b"alice"), Ok((Version(read_version.0 + 1), b"90".to_vec())));
    assert_eq!(store.prepared_statistics().operations, 0);
    // The decision again, and a duplicate PREPARE after it: nothing changes, nothing locks.
    assert_eq!(decide(&store, b"alice", (LEASE, 1), TxDecision::Commit), TxDecided::AlreadyDecided);
    assert_eq!(vote(&store, &debit), (TxVote::Prepared, true));
    assert_eq!(store.prepared_statistics().operations, 0);
    assert_eq!(read(&store, b"alice").unwrap().1, b"90".to_vec());
}

#[test]
fn a_changed_or_locked_object_votes_abort_and_the_vote_is_kept() {
    let store = store();
    let first = put(&store, b"k", b"1");
    put(&store, b"k", b"2");
    // Read at the first version, changed since: ABORT, recorded.
    let stale = op(b"k", (LEASE, 1), TxOpKind::Write, first, b"3");
    assert_eq!(vote(&store, &stale), (TxVote::Abort, false));
    assert_eq!(vote(&store, &stale), (TxVote::Abort, true));
    // Another transaction's lock: ABORT (no waiting), even at the right version.
    let current = read(&store, b"k").unwrap().0;
    let holder = op(b"k", (LEASE, 2), TxOpKind::Read, current, b"");
    assert_eq!(vote(&store, &holder), (TxVote::Prepared, false));
    let other = op(b"k", (9, 1), TxOpKind::Write, current, b"4");
    assert_eq!(vote(&store, &other), (TxVote::Abort, false));
    // A read-only validation sees the lock too.
    let object = (TABLE, &b"k"[..], key_hash(TABLE, b"k"));
    assert_eq!(store.validate_read(object, current, NOW).unwrap().vote, TxVote::Abort);
    assert_eq!(decide(&store, b"k", (LEASE, 2), TxDecision::Abort), TxDecided::Applied);
    assert_eq!(store.validate_read(object, current, NOW).unwrap().vote, TxVote::Prepared);
    assert_eq!(store.validate_read(object, first, NOW).unwrap().vote, TxVote::Abort);
    assert_eq!(read(&store, b"k").unwrap(), (current, b"2".to_vec()));
}

#[test]
fn an_abort_decision_for_an_unprepared_operation_keeps_a_late_prepare_out() {
    let store = store();
    let version = put(&store, b"k", b"1");
    assert_eq!(decide(&store, b"k", (LEASE, 4), TxDecision::Abort), TxDecided::NothingPrepared);
    // The PREPARE arrives after the transaction is over: it must not lock anything.
    let late = op(b"k", (LEASE, 4), TxOpKind::Write, version, b"2");
    assert_eq!(vote(&store, &late), (TxVote::Abort, true));
    assert_eq!(store.prepared_statistics().operations, 0);
    assert_eq!(read(&store, b"k").unwrap(), (version, b"1".to_vec()));
}

#[test]
fn removes_creations_and_reads_commit_as_they_should() {
    let store = store();
    let version = put(&store, b"gone", b"x");
    let remove = op(b"gone", (LEASE, 1), TxOpKind::Remove, version, b"");
    let create = op(b"new", (LEASE, 2), TxOpKind::Write, Version(0), b"fresh");
    let read_only = op(b"absent", (LEASE, 3), TxOpKind::Read, Version(0), b"");
    for prepared in [&remove, &create, &read_only] {
        assert_eq!(vote(&store, prepared).0, TxVote::Prepared);
    }
    // The absent key is locked too: a concurrent create waits.
    assert_eq!(read(&store, b"absent"), Err(ObjectError::Locked));
    for (key, rpc) in [(&b"gone"[..], 1), (b"new", 2), (b"absent", 3)] {
        assert_eq!(decide(&store, key, (LEASE, rpc), TxDecision::Commit), TxDecided::Applied);
    }
    assert!(matches!(read(&store, b"gone"), Err(ObjectError::Rejected { .. })));
    assert_eq!(read(&store, b"new").unwrap().1, b"fresh".to_vec());
    assert!(read(&store, b"new").unwrap().0 > version, "versions only grow");
    assert!(matches!(read(&store, b"absent"), Err(ObjectError::Rejected { .. })));
    // A value on a prepared write is checked against the store's limit.
    let huge = vec![0u8; store.config().value_bytes_max as usize + 1];
    let too_large = op(b"big", (LEASE, 5), TxOpKind::Write, Version(0), &huge);
    assert_eq!(store.prepare(&too_large, NOW), Err(ObjectError::ValueTooLarge));
}

/// A participant's recovery master locks what was prepared and undecided, and only that; the
/// decision then applies there.
#[test]
fn replay_locks_the_undecided_operations_again() {
    let source = store();
    let a = put(&source, b"a", b"1");
    let b = put(&source, b"b", b"1");
    assert_eq!(vote(&source, &op(b"a", (LEASE, 1), TxOpKind::Write, a, b"2")).0, TxVote::Prepared);
    assert_eq!(vote(&source, &op(b"b", (LEASE, 2), TxOpKind::Write, b, b"2")).0, TxVote::Prepared);
    decide(&source, b"b", (LEASE, 2), TxDecision::Commit);
    let copies = segments(&source);
    let borrowed: Vec<(&[u8], Certificate)> =
        copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
    let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(2)).unwrap();
    let statistics = target.replay(&borrowed, &|_, _| true, NOW).unwrap();
    assert_eq!(statistics.prepared_replayed, 1);
    assert_eq!(read(&target, b"a"), Err(ObjectError::Locked));
    assert_eq!(read(&target, b"b").unwrap().1, b"2".to_vec());
    // The client's decision, retried to the recovery master, applies there.
    assert_eq!(decide(&target, b"a", (LEASE, 1), TxDecision::Commit), TxDecided::Applied);
    assert_eq!(read(&target, b"a").unwrap().1, b"2".to_vec());
    // The retried decision of the other one finds its record: applied once.
    assert_eq!(decide(&target, b"b", (LEASE, 2), TxDecision::Commit), TxDecided::AlreadyDecided);
    assert_eq!(read(&target, b"b").unwrap().1, b"2".to_vec());
    // And the target's own log, replayed again, holds no lock any more.
    let copies = segments(&target);
    let borrowed: Vec<(&[u8], Certificate)> =
        copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
    let third = ObjectStore::new(StoreConfig::for_testing(), ServerId(3)).unwrap();
    assert_eq!(third.replay(&borrowed, &|_, _| true, NOW).unwrap().prepared_replayed, 0);
    assert_eq!(read(&third, b"a").unwrap().1, b"2".to_vec());
}

/// The cleaner moves a PREPARED entry the table names (the decision then frees the copy) and
/// drops decided ones with their tombstones once their segments are gone.
#[test]
fn the_cleaner_keeps_prepared_entries_while_undecided() {
    let store = store();
    let version = put(&store, b"locked", b"1");
    let held = op(b"locked", (LEASE, 1), TxOpKind::Write, version, b"2");
    assert_eq!(vote(&store, &held).0, TxVote::Prepared);
    let filler = vec![7u8; 10_000];
    for round in 0..400u64 {
        let key = format!("k{}", round % 20).into_bytes();
        put(&store, &key, &filler);
        let decided_key = format!("t{}", round % 10).into_bytes();
        let current = read(&store, &decided_key).map_or(Version(0), |(version, _)| version);
        let rpc = 100 + round;
        let written = op(&decided_key, (7, rpc), TxOpKind::Write, current, &filler[..100]);
        assert_eq!(vote(&store, &written).0, TxVote::Prepared);
        decide(&store, &decided_key, (7, rpc), TxDecision::Commit);
    }
    for _ in 0..20 {
        store.clean_combined_now(NOW);
        store.compact_now(NOW);
    }
    let cleaner = store.cleaner_statistics();
    assert!(cleaner.segments_cleaned + cleaner.compactions > 0, "{cleaner:?}");
    assert_eq!(store.prepared_statistics().operations, 1);
    let mut prepared_in_log = 0;
    for (bytes, certificate) in segments(&store) {
        for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
            let entry = entry.unwrap();
            if entry.entry_type == EntryType::Prepared {
                if let Entry::Prepared(view) = entry.entry {
                    prepared_in_log += u64::from(view.key == b"locked");
                }
            }
        }
    }
    assert!(prepared_in_log >= 1, "the undecided PREPARED entry left the log");
    assert_eq!(decide(&store, b"locked", (LEASE, 1), TxDecision::Commit), TxDecided::Applied);
    assert_eq!(read(&store, b"locked").unwrap().1, b"2".to_vec());
}

/// A participant finishing a transaction whose client died: every operation's vote becomes
/// final (an unprepared one is recorded ABORT, so its late PREPARE cannot lock), and the
/// transaction is due for recovery only after its delay.
#[test]
fn request_abort_makes_every_vote_final() {
    let store = store();
    let version = put(&store, b"a", b"1");
    let participants: &'static [TxParticipant] = Box::leak(Box::new([
        TxParticipant { table: TABLE, key_hash: key_hash(TABLE, b"a").0, rpc_id: 10 },
        TxParticipant { table: TABLE, key_hash: key_hash(TABLE, b"b").0, rpc_id: 11 },
    ]));
    let first = TxPrepareOp {
        transaction: RpcId(10),
        participants,
        ..op(b"a", (LEASE, 10), TxOpKind::Write, version, b"2")
    };
    assert_eq!(vote(&store, &first).0, TxVote::Prepared);
    assert!(store.transactions_to_finish(NOW, 16).is_empty(), "not due before its delay");
    let later = WallTime::from_millis(NOW.millis() + 60_000);
    let due = store.transactions_to_finish(later, 16);
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].lease, due[0].transaction), (LeaseId(LEASE), RpcId(10)));
    assert_eq!(due[0].participants, participants.to_vec());
    let ask = |key: &[u8], rpc| {
        let object = (TABLE, key_hash(TABLE, key));
        store.request_abort(object, identity(LEASE, rpc), NOW).unwrap().vote
    };
    assert_eq!(ask(b"a", 10), TxVote::Prepared);
    assert_eq!(ask(b"b", 11), TxVote::Abort);
    // The PREPARE of the second operation arrives late: it cannot lock anything now.
    let second = TxPrepareOp {
        transaction: RpcId(10),
        participants,
        ..op(b"b", (LEASE, 11), TxOpKind::Write, Version(0), b"new")
    };
    assert_eq!(vote(&store, &second), (TxVote::Abort, true));
    assert_eq!(decide(&store, b"a", (LEASE, 10), TxDecision::Abort), TxDecided::Applied);
    assert_eq!(read(&store, b"a").unwrap(), (version, b"1".to_vec()));
    assert!(store.transactions_to_finish(WallTime::from_millis(u64::MAX / 2), 16).is_empty());
    // An operation the participant list leaves out is refused.
    let unlisted = TxPrepareOp {
        participants: alone(b"other", 12),
        ..op(b"c", (LEASE, 12), TxOpKind::Write, Version(0), b"x")
    };
    assert_eq!(store.prepare(&unlisted, NOW), Err(ObjectError::NotAParticipant));
}
