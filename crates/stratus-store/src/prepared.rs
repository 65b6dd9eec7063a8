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

use stratus_log::Reference;
use stratus_types::{HashRange, KeyHash, LeaseId, RpcId, TableId, TxOpKind, Version};

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

#[derive(Debug, Default)]
struct Inner {
    ops: HashMap<OpId, PreparedOp>,
    /// Which operation locks each object.
    locks: HashMap<(TableId, Box<[u8]>), OpId>,
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
        // A boxed key to look up with: the map's keys are boxes, and a borrowed form of the
        // pair does not exist. Only paid while some operation is prepared.
        self.lock().locks.get(&(table, Box::from(key))).copied()
    }

    /// The prepared operation `op`, if it is prepared here.
    pub(crate) fn get(&self, op: OpId) -> Option<PreparedOp> {
        if self.operations.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().ops.get(&op).cloned()
    }

    /// Records `prepared` as `op`, locking its object. The caller holds the key's bucket lock
    /// and checked that nothing locks the object and that `op` is not prepared.
    pub(crate) fn insert(&self, op: OpId, prepared: PreparedOp) {
        let mut inner = self.lock();
        let object = (prepared.table, prepared.key.clone());
        let bytes = prepared.entry_bytes;
        let previous_lock = inner.locks.insert(object, op);
        assert!(previous_lock.is_none(), "two prepared operations lock one object");
        let previous = inner.ops.insert(op, prepared);
        assert!(previous.is_none(), "an operation prepared twice");
        self.operations.fetch_add(1, Ordering::AcqRel);
        self.entry_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Forgets `op` and releases its lock; returns it.
    pub(crate) fn remove(&self, op: OpId) -> Option<PreparedOp> {
        let mut inner = self.lock();
        let prepared = inner.ops.remove(&op)?;
        let holder = inner.locks.remove(&(prepared.table, prepared.key.clone()));
        assert_eq!(holder, Some(op), "a prepared operation without its lock");
        self.operations.fetch_sub(1, Ordering::AcqRel);
        self.entry_bytes.fetch_sub(prepared.entry_bytes, Ordering::Relaxed);
        Some(prepared)
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
    /// master, or its table was dropped); returns them.
    pub(crate) fn remove_range(&self, table: TableId, range: HashRange) -> Vec<(OpId, PreparedOp)> {
        let gone: Vec<OpId> = {
            let inner = self.lock();
            inner
                .ops
                .iter()
                .filter(|(_, op)| op.table == table && range.contains(KeyHash(op.key_hash)))
                .map(|(id, _)| *id)
                .collect()
        };
        gone.into_iter().filter_map(|id| self.remove(id).map(|op| (id, op))).collect()
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

    fn op(key: &[u8], reference: u64) -> PreparedOp {
        PreparedOp {
            table: TableId(1),
            key: key.into(),
            key_hash: stratus_types::key_hash(TableId(1), key).0,
            kind: TxOpKind::Write,
            version_read: Version(3),
            transaction: RpcId(1),
            reference: Reference(reference),
            entry_bytes: 80,
        }
    }

    #[test]
    fn a_prepared_operation_locks_its_object_until_removed() {
        let table = PreparedTable::default();
        assert_eq!(table.holder(TableId(1), b"a"), None);
        let id = (LeaseId(1), RpcId(2));
        table.insert(id, op(b"a", 10));
        assert_eq!(table.holder(TableId(1), b"a"), Some(id));
        assert_eq!(table.holder(TableId(1), b"b"), None);
        assert_eq!(table.holder(TableId(2), b"a"), None);
        assert_eq!(table.statistics(), PreparedStatistics { operations: 1, entry_bytes: 80 });
        assert!(table.any_in_range(TableId(1), HashRange::FULL));
        assert_eq!(table.remove(id).map(|op| op.reference), Some(Reference(10)));
        assert_eq!(table.holder(TableId(1), b"a"), None);
        assert_eq!(table.remove(id), None);
        assert_eq!(table.statistics(), PreparedStatistics::default());
    }

    #[test]
    fn relocation_follows_only_the_named_copy() {
        let table = PreparedTable::default();
        let id = (LeaseId(1), RpcId(2));
        table.insert(id, op(b"a", 10));
        assert_eq!(table.relocate(id, Reference(11), || Some(Reference(12))), Relocation::Dead);
        assert_eq!(table.relocate(id, Reference(10), || None), Relocation::Failed);
        assert_eq!(table.relocate(id, Reference(10), || Some(Reference(12))), Relocation::Moved);
        assert_eq!(table.get(id).map(|op| op.reference), Some(Reference(12)));
    }

    #[test]
    #[should_panic(expected = "two prepared operations lock one object")]
    fn two_locks_on_one_object_stop_the_store() {
        let table = PreparedTable::default();
        table.insert((LeaseId(1), RpcId(2)), op(b"a", 10));
        table.insert((LeaseId(1), RpcId(3)), op(b"a", 11));
    }
}
