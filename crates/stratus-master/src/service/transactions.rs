//! Transaction requests (docs/design/transactions.md): TX_PREPARE votes on operations of a
//! transaction whose objects this master serves, TX_DECISION applies the outcome. Each
//! operation is admitted like a single-object mutation (the lease serves, the key is valid,
//! the tablet is owned, the client lease is vouched for), and answered per operation, so the
//! client re-routes only the operations whose tablet moved.

use stratus_store::TxPrepareOp;
use stratus_types::{LeaseId, RpcId, RpcIdentity, TableId, TxDecision, TxOpKind, TxVote, Version};
use stratus_wire::{Status, TxDecisionOp, TxOp, TxVoteItem};

use super::objects::status_of;
use super::Master;
use crate::ownership::WriteRefusal;

/// A transaction as a request names it: the client's lease, what it acknowledged, and the
/// transaction's first rpc id.
#[derive(Clone, Copy, Debug)]
pub(super) struct TransactionId {
    pub(super) lease: LeaseId,
    pub(super) acknowledged: RpcId,
    pub(super) transaction: RpcId,
}

impl TransactionId {
    fn identity(&self, rpc: RpcId) -> RpcIdentity {
        RpcIdentity { lease: self.lease, rpc, acknowledged: self.acknowledged }
    }
}

/// An answer to an operation that was not voted on.
fn unvoted(status: Status, version: Version) -> TxVoteItem {
    TxVoteItem { status, vote: TxVote::Abort, version }
}

fn refusal_status(refusal: WriteRefusal) -> Status {
    match refusal {
        WriteRefusal::NotOwned => Status::UnknownTablet,
        // A transfer of the tablet is under way: the operation goes again, to whichever
        // master serves the key by then.
        WriteRefusal::Frozen => Status::Retry,
    }
}

impl Master {
    /// TX_PREPARE: one vote per operation, in order.
    pub(super) fn tx_prepare(
        &self,
        transaction: TransactionId,
        validate_only: bool,
        ops: &[TxOp],
    ) -> Vec<TxVoteItem> {
        ops.iter()
            .map(|op| {
                if validate_only {
                    self.validate_op(op)
                } else {
                    self.prepare_op(transaction, op)
                }
            })
            .collect()
    }

    fn prepare_op(&self, transaction: TransactionId, op: &TxOp) -> TxVoteItem {
        let hash = match self.admit_key(op.table_id, &op.key) {
            Ok(hash) => hash,
            Err(status) => return unvoted(status, Version(0)),
        };
        let rpc = transaction.identity(op.rpc);
        if let Err(status) = self.admit_rpc(Some(rpc)) {
            return unvoted(status, Version(0));
        }
        let prepare = TxPrepareOp {
            table: op.table_id,
            key: &op.key,
            hash,
            rpc,
            transaction: transaction.transaction,
            kind: op.kind,
            version_read: op.version_read,
            value: &op.value,
        };
        let now = self.now();
        let voted = self
            .ownership
            .while_not_transferring(op.table_id, hash, || self.store.prepare(&prepare, now));
        match voted {
            Ok(Ok(voted)) => {
                TxVoteItem { status: Status::Ok, vote: voted.vote, version: voted.version }
            }
            Ok(Err(error)) => {
                let (status, version) = status_of(error);
                unvoted(status, version)
            }
            Err(refusal) => unvoted(refusal_status(refusal), Version(0)),
        }
    }

    /// A read-only transaction's validation of one read: no lock, no log entry, so no lease
    /// of the client is needed either.
    fn validate_op(&self, op: &TxOp) -> TxVoteItem {
        debug_assert_eq!(op.kind, TxOpKind::Read, "the wire admits only reads to validate");
        let hash = match self.admit(op.table_id, &op.key) {
            Ok(hash) => hash,
            Err(status) => return unvoted(status, Version(0)),
        };
        let object = (op.table_id, &op.key[..], hash);
        match self.store.validate_read(object, op.version_read, self.now()) {
            Ok(voted) => {
                TxVoteItem { status: Status::Ok, vote: voted.vote, version: voted.version }
            }
            Err(error) => {
                let (status, version) = status_of(error);
                unvoted(status, version)
            }
        }
    }

    /// TX_DECISION: one status per operation, in order.
    pub(super) fn tx_decision(
        &self,
        transaction: TransactionId,
        decision: TxDecision,
        ops: &[TxDecisionOp],
    ) -> Vec<Status> {
        ops.iter().map(|op| self.decide_op(transaction, decision, op)).collect()
    }

    fn decide_op(
        &self,
        transaction: TransactionId,
        decision: TxDecision,
        op: &TxDecisionOp,
    ) -> Status {
        let rpc = transaction.identity(op.rpc);
        let (table, key): (TableId, &[u8]) = (op.table_id, &op.key);
        let now = self.now();
        // Admitted as a mutation: it may append (the decision's effect and records), and a
        // transfer copying the tablet must see the key as changed.
        let decided = self.mutate(table, key, Some(rpc), |hash| {
            self.store.decide((table, key, hash), rpc, decision, now)
        });
        match decided {
            Ok(_) => Status::Ok,
            Err((status, _)) => status,
        }
    }
}
