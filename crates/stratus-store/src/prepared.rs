//! The prepared table (docs/design/transactions.md): every transaction operation this store
//! has prepared and not yet seen decided, each with the reference of the PREPARED entry that
//! holds it in the log, and the lock it holds on its object.
//!
//! Like the completion table, a record lives exactly as long as its entry: it enters the table
//! in the same step as its PREPARED entry enters the log (under the key's bucket lock), and
//! leaves it exactly when the entry is freed — at the decision, or when its tablet leaves this
//! master — so the cleaner keeps a PREPARED entry exactly when this table names it. Lock order:
//! bucket lock, then this table's lock, then the log's own lock.
//!
//! At most one operation holds a key: a PREPARE of a locked key votes ABORT (FaRM's no-wait
//! rule: no waiting, so no deadlocks).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use stratus_log::format::TxParticipant;
use stratus_log::Reference;
use stratus_types::limits::{TX_RECOVERY_DELAY_MAX_MILLIS, TX_RECOVERY_DELAY_MILLIS};
use stratus_types::{key_hash, HashRange, KeyHash, LeaseId, RpcId, TableId, TxOpKind, Version};

use crate::completions::Relocation;

/// One prepared operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PreparedOp {
    pub(crate) table: TableId,
    pub(crate) key: Box<[u8]>,
    pub(crate) key_hash: u64,
    pub(crate) kind: TxOpKind,
    pub(crate) version_read: Version,
    /// The transaction: the rpc id of its first operation, under the same lease.
    pub(crate) transaction: RpcId,
    /// Its PREPARED entry.
    pub(crate) reference: Reference,
    /// Bytes of that entry, header included.
    pub(crate) entry_bytes: u64,
}

/// An operation's identity: its client's lease and its rpc id.
pub(crate) type OpId = (LeaseId, RpcId);

/// A transaction's identity: its client's lease and the rpc id of its first operation.
pub(crate) type TransactionKey = (LeaseId, RpcId);

/// A transaction with operations prepared here: every operation it has (the TX_PARTICIPANTS
/// entry holding them), how many are prepared here, and when this master finishes it itself if
/// its client has not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransactionRecord {
    pub(crate) participants: Vec<TxParticipant>,
    /// Its TX_PARTICIPANTS entry.
    pub(crate) reference: Reference,
    /// Bytes of that entry, header included.
    pub(crate) entry_bytes: u64,
    /// Operations of the transaction prepared here (the record goes with the last).
    prepared_here: usize,
    /// When the next recovery of the transaction starts, in wall-clock milliseconds.
    recovery_at_millis: u64,
    /// The delay before the one after.
    recovery_delay_millis: u64,
}

impl TransactionRecord {
    /// A record of a transaction whose first operation here is prepared at `now_millis`.
    pub(crate) fn new(
        participants: Vec<TxParticipant>,
        (reference, entry_bytes): (Reference, u64),
        now_millis: u64,
    ) -> TransactionRecord {
        TransactionRecord {
            participants,
            reference,
            entry_bytes,
            prepared_here: 0,
            recovery_at_millis: now_millis + TX_RECOVERY_DELAY_MILLIS,
            recovery_delay_millis: TX_RECOVERY_DELAY_MILLIS,
        }
    }
}

/// A transaction this master should finish now: its client has not decided it in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionToFinish {
    /// The client's lease.
    pub lease: LeaseId,
    /// The rpc id of its first operation.
    pub transaction: RpcId,
    /// Every operation, on every master.
    pub participants: Vec<TxParticipant>,
}

/// An object a prepared operation locks: its key and the operation.
type LockedObject = (Box<[u8]>, OpId);

#[derive(Debug, Default)]
struct Inner {
    ops: HashMap<OpId, PreparedOp>,
    /// Which operation locks each object, by the object's key hash (looked up without
    /// allocating a key): the objects of one hash, nearly always one.
    locks: HashMap<(TableId, KeyHash), Vec<LockedObject>>,
    /// The transactions of the prepared operations.
    transactions: HashMap<TransactionKey, TransactionRecord>,
}

/// Totals, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreparedStatistics {
    /// Operations prepared and not yet decided (each locks one object).
    pub operations: u64,
    /// Bytes of their PREPARED entries in the log.
    pub entry_bytes: u64,
}

/// The prepared table of one store.
#[derive(Debug, Default)]
pub(crate) struct PreparedTable {
    inner: Mutex<Inner>,
    /// Operations held: reads and writes of objects check locks only while this is not 0, so
    /// a store without transactions pays one atomic load per operation.
    operations: AtomicU64,
    entry_bytes: AtomicU64,
}

impl PreparedTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The operation that locks (`table`, `key`), if any.
    pub(crate) fn holder(&self, table: TableId, key: &[u8]) -> Option<OpId> {
        if self.operations.load(Ordering::Acquire) == 0 {
            return None;
        }
        let hash = key_hash(table, key);
        let inner = self.lock();
        let objects = inner.locks.get(&(table, hash))?;
        objects.iter().find(|(locked, _)| &locked[..] == key).map(|&(_, op)| op)
    }

    /// The prepared operation `op`, if it is prepared here.
    pub(crate) fn get(&self, op: OpId) -> Option<PreparedOp> {
        if self.operations.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().ops.get(&op).cloned()
    }

    /// Whether the transaction has a record here already.
    pub(crate) fn knows_transaction(&self, transaction: TransactionKey) -> bool {
        self.lock().transactions.contains_key(&transaction)
    }

    /// Records `prepared` as `op`, locking its object, with `transaction`'s record when this
    /// is its first operation here (the caller appended its TX_PARTICIPANTS entry with the
    /// PREPARED entry). The caller holds the key's bucket lock and checked that nothing locks
    /// the object, that `op` is not prepared, and that the transaction has a record here
    /// unless it brings one.
    pub(crate) fn insert(
        &self,
        op: OpId,
        prepared: PreparedOp,
        transaction: Option<TransactionRecord>,
    ) {
        let mut inner = self.lock();
        let key = (op.0, prepared.transaction);
        if let Some(record) = transaction {
            let previous = inner.transactions.insert(key, record);
            assert!(previous.is_none(), "a transaction recorded twice");
        }
        inner
            .transactions
            .get_mut(&key)
            .expect("a prepared operation's transaction is recorded")
            .prepared_here += 1;
        let hash = key_hash(prepared.table, &prepared.key);
        let bytes = prepared.entry_bytes;
        let objects = inner.locks.entry((prepared.table, hash)).or_default();
        assert!(
            objects.iter().all(|(locked, _)| *locked != prepared.key),
            "two prepared operations lock one object"
        );
        objects.push((prepared.key.clone(), op));
        let previous = inner.ops.insert(op, prepared);
        assert!(previous.is_none(), "an operation prepared twice");
        self.operations.fetch_add(1, Ordering::AcqRel);
        self.entry_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Forgets `op` and releases its lock; returns it, with its transaction's record when it
    /// was the transaction's last operation here (whose entry the caller frees too).
    pub(crate) fn remove(&self, op: OpId) -> Option<(PreparedOp, Option<TransactionRecord>)> {
        let mut inner = self.lock();
        let prepared = inner.ops.remove(&op)?;
        let hash = key_hash(prepared.table, &prepared.key);
        let objects = inner.locks.get_mut(&(prepared.table, hash));
        let objects = objects.expect("a prepared operation without its lock");
        let position = objects.iter().position(|(locked, _)| *locked == prepared.key);
        let (_, holder) = objects.swap_remove(position.expect("a prepared operation's lock"));
        assert_eq!(holder, op, "a prepared operation's object locked by another");
        if objects.is_empty() {
            inner.locks.remove(&(prepared.table, hash));
        }
        let key = (op.0, prepared.transaction);
        let record = inner.transactions.get_mut(&key).expect("a prepared operation's transaction");
        record.prepared_here -= 1;
        let finished = (record.prepared_here == 0)
            .then(|| inner.transactions.remove(&key).expect("the transaction was just found"));
        self.operations.fetch_sub(1, Ordering::AcqRel);
        self.entry_bytes.fetch_sub(prepared.entry_bytes, Ordering::Relaxed);
        Some((prepared, finished))
    }

    /// The cleaner met the TX_PARTICIPANTS entry of `transaction` at `reference`: as
    /// [`PreparedTable::relocate`].
    pub(crate) fn relocate_transaction(
        &self,
        transaction: TransactionKey,
        reference: Reference,
        copy: impl FnOnce() -> Option<Reference>,
    ) -> Relocation {
        let mut inner = self.lock();
        let Some(record) =
            inner.transactions.get_mut(&transaction).filter(|record| record.reference == reference)
        else {
            return Relocation::Dead;
        };
        match copy() {
            Some(moved) => {
                record.reference = moved;
                Relocation::Moved
            }
            None => Relocation::Failed,
        }
    }

    /// Whether the table names the TX_PARTICIPANTS entry of `transaction` at `reference`.
    pub(crate) fn names_transaction(
        &self,
        transaction: TransactionKey,
        reference: Reference,
    ) -> bool {
        self.lock()
            .transactions
            .get(&transaction)
            .is_some_and(|record| record.reference == reference)
    }

    /// The transactions due for recovery at `now_millis` (at most `limit`); each one's next
    /// recovery is pushed back by its delay, which doubles up to its maximum.
    pub(crate) fn due_for_recovery(
        &self,
        now_millis: u64,
        limit: usize,
    ) -> Vec<TransactionToFinish> {
        if self.operations.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut inner = self.lock();
        let mut due = Vec::new();
        for ((lease, transaction), record) in inner.transactions.iter_mut() {
            if due.len() == limit {
                break;
            }
            if record.recovery_at_millis > now_millis {
                continue;
            }
            record.recovery_at_millis = now_millis + record.recovery_delay_millis;
            record.recovery_delay_millis =
                (record.recovery_delay_millis * 2).min(TX_RECOVERY_DELAY_MAX_MILLIS);
            due.push(TransactionToFinish {
                lease: *lease,
                transaction: *transaction,
                participants: record.participants.clone(),
            });
        }
        due
    }

    /// Whether the table names the PREPARED entry of `op` at `reference`.
    pub(crate) fn names(&self, op: OpId, reference: Reference) -> bool {
        self.lock().ops.get(&op).is_some_and(|prepared| prepared.reference == reference)
    }

    /// The cleaner met the PREPARED entry of `op` at `reference`: if the table names it,
    /// `copy` moves it (returns the copy's reference, or `None` without memory) and the table
    /// names the copy. Under the table's lock, so a decision cannot free the entry while it
    /// moves.
    pub(crate) fn relocate(
        &self,
        op: OpId,
        reference: Reference,
        copy: impl FnOnce() -> Option<Reference>,
    ) -> Relocation {
        let mut inner = self.lock();
        let Some(prepared) = inner.ops.get_mut(&op).filter(|op| op.reference == reference) else {
            return Relocation::Dead;
        };
        match copy() {
            Some(moved) => {
                prepared.reference = moved;
                Relocation::Moved
            }
            None => Relocation::Failed,
        }
    }

    /// Whether some operation on an object of `table` whose key hash lies in `range` is
    /// prepared (a migration of the range waits for it to be decided).
    pub(crate) fn any_in_range(&self, table: TableId, range: HashRange) -> bool {
        if self.operations.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.lock().ops.values().any(|op| op.table == table && range.contains(KeyHash(op.key_hash)))
    }

    /// Forgets every operation on `table` whose key hash lies in `range` (the tablet left this
    /// master, or its table was dropped); returns them, each with its transaction's record
    /// when it was the last here.
    pub(crate) fn remove_range(
        &self,
        table: TableId,
        range: HashRange,
    ) -> Vec<(PreparedOp, Option<TransactionRecord>)> {
        let gone: Vec<OpId> = {
            let inner = self.lock();
            inner
                .ops
                .iter()
                .filter(|(_, op)| op.table == table && range.contains(KeyHash(op.key_hash)))
                .map(|(id, _)| *id)
                .collect()
        };
        gone.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    pub(crate) fn statistics(&self) -> PreparedStatistics {
        PreparedStatistics {
            operations: self.operations.load(Ordering::Relaxed),
            entry_bytes: self.entry_bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer() -> Option<TransactionRecord> {
        let participants = vec![TxParticipant { table: TableId(1), key_hash: 1, rpc_id: 2 }];
        Some(TransactionRecord::new(participants, (Reference(99), 50), 1_000))
    }

    fn op(key: &[u8], reference: u64) -> PreparedOp {
        PreparedOp {
            table: TableId(1),
            key: key.into(),
            key_hash: stratus_types::key_hash(TableId(1), key).0,
            kind: TxOpKind::Write,
            version_read: Version(3),
            transaction: RpcId(2),
            reference: Reference(reference),
            entry_bytes: 80,
        }
    }

    #[test]
    fn a_prepared_operation_locks_its_object_until_removed() {
        let table = PreparedTable::default();
        assert_eq!(table.holder(TableId(1), b"a"), None);
        let id = (LeaseId(1), RpcId(2));
        table.insert(id, op(b"a", 10), transfer());
        assert_eq!(table.holder(TableId(1), b"a"), Some(id));
        assert_eq!(table.holder(TableId(1), b"b"), None);
        assert_eq!(table.holder(TableId(2), b"a"), None);
        assert_eq!(table.statistics(), PreparedStatistics { operations: 1, entry_bytes: 80 });
        assert!(table.any_in_range(TableId(1), HashRange::FULL));
        let (removed, finished) = table.remove(id).unwrap();
        assert_eq!(removed.reference, Reference(10));
        assert_eq!(finished.map(|record| record.reference), Some(Reference(99)));
        assert_eq!(table.holder(TableId(1), b"a"), None);
        assert_eq!(table.remove(id), None);
        assert_eq!(table.statistics(), PreparedStatistics::default());
    }

    #[test]
    fn relocation_follows_only_the_named_copy() {
        let table = PreparedTable::default();
        let id = (LeaseId(1), RpcId(2));
        table.insert(id, op(b"a", 10), transfer());
        assert_eq!(table.relocate(id, Reference(11), || Some(Reference(12))), Relocation::Dead);
        assert_eq!(table.relocate(id, Reference(10), || None), Relocation::Failed);
        assert_eq!(table.relocate(id, Reference(10), || Some(Reference(12))), Relocation::Moved);
        assert_eq!(table.get(id).map(|op| op.reference), Some(Reference(12)));
    }

    #[test]
    fn a_transaction_is_due_for_recovery_after_its_delay_then_less_and_less_often() {
        let table = PreparedTable::default();
        table.insert((LeaseId(1), RpcId(2)), op(b"a", 10), transfer());
        assert!(table.due_for_recovery(1_000, 16).is_empty());
        let due = table.due_for_recovery(1_000 + TX_RECOVERY_DELAY_MILLIS, 16);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].lease, due[0].transaction), (LeaseId(1), RpcId(2)));
        let next = 1_000 + 2 * TX_RECOVERY_DELAY_MILLIS;
        assert!(table.due_for_recovery(next - 1, 16).is_empty());
        assert_eq!(table.due_for_recovery(next, 16).len(), 1);
        assert!(table.due_for_recovery(next + TX_RECOVERY_DELAY_MILLIS, 16).is_empty());
        assert_eq!(table.due_for_recovery(u64::MAX / 2, 0).len(), 0, "the limit holds");
    }

    #[test]
    #[should_panic(expected = "two prepared operations lock one object")]
    fn two_locks_on_one_object_stop_the_store() {
        let table = PreparedTable::default();
        table.insert((LeaseId(1), RpcId(2)), op(b"a", 10), transfer());
        table.insert((LeaseId(1), RpcId(3)), op(b"a", 11), None);
    }
}
