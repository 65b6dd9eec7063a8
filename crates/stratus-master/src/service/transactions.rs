//! Transaction requests (docs/design/transactions.md): TX_PREPARE votes on operations of a
//! transaction whose objects this master serves, TX_DECISION applies the outcome, and
//! TX_REQUEST_ABORT makes an operation's vote final for a participant finishing the
//! transaction of a dead client. A PREPARE is admitted like a single-object mutation (the
//! lease serves, the key is valid, the tablet is owned and not moving, the client lease is
//! vouched for); every request is answered per operation, so the client re-routes only the
//! operations whose tablet moved.

use stratus_log::format::TxParticipant;
use stratus_store::{ObjectError, TxPrepareOp, TxVoted, WallTime};
use stratus_types::{
    KeyHash, LeaseId, RpcId, RpcIdentity, TableId, TxDecision, TxOpKind, TxVote, Version,
};
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
    /// TX_PREPARE: one vote per operation, in order. `participants` lists every operation of
    /// the transaction (empty for a validation).
    pub(super) fn tx_prepare(
        &self,
        transaction: TransactionId,
        validate_only: bool,
        ops: &[TxOp],
        participants: &[TxDecisionOp],
    ) -> Vec<TxVoteItem> {
        let participants: Vec<TxParticipant> = participants
            .iter()
            .map(|op| TxParticipant { table: op.table_id, key_hash: op.key_hash, rpc_id: op.rpc.0 })
            .collect();
        ops.iter()
            .map(|op| {
                if validate_only {
                    self.validate_op(op)
                } else {
                    self.prepare_op(transaction, op, &participants)
                }
            })
            .collect()
    }

    fn prepare_op(
        &self,
        transaction: TransactionId,
        op: &TxOp,
        participants: &[TxParticipant],
    ) -> TxVoteItem {
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
            participants,
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
        ops.iter()
            .map(|op| {
                let rpc = transaction.identity(op.rpc);
                let decided = self.on_transaction_op(op, |object, now| {
                    self.store.decide(object, rpc, decision, now).map(|_| ())
                });
                decided.map_or_else(|(status, _)| status, |()| Status::Ok)
            })
            .collect()
    }

    /// TX_REQUEST_ABORT: one final vote per operation, in order.
    pub(super) fn tx_request_abort(
        &self,
        (lease, transaction): (LeaseId, RpcId),
        ops: &[TxDecisionOp],
    ) -> Vec<TxVoteItem> {
        // The sender, a participant finishing the transaction, acknowledges nothing.
        let asking = TransactionId { lease, acknowledged: RpcId(0), transaction };
        ops.iter()
            .map(|op| {
                let rpc = asking.identity(op.rpc);
                let voted = self.on_transaction_op(op, |object, now| {
                    self.store.request_abort(object, rpc, now)
                });
                match voted {
                    Ok(TxVoted { vote, version, .. }) => {
                        TxVoteItem { status: Status::Ok, vote, version }
                    }
                    Err((status, version)) => unvoted(status, version),
                }
            })
            .collect()
    }

    /// Runs `apply` on operation `op`'s object while its tablet is served here and not being
    /// transferred. A decision or a request to abort is not refused for its client's lease:
    /// it only finishes what a PREPARE, admitted under the lease, started, and a participant
    /// finishing the transaction of a dead client sends it after the lease may have expired.
    fn on_transaction_op<T>(
        &self,
        op: &TxDecisionOp,
        apply: impl FnOnce((TableId, KeyHash), WallTime) -> Result<T, ObjectError>,
    ) -> Result<T, (Status, Version)> {
        if !self.may_serve() {
            return Err((Status::Retry, Version(0)));
        }
        let hash = KeyHash(op.key_hash);
        let now = self.now();
        let applied = self
            .ownership
            .while_not_transferring(op.table_id, hash, || apply((op.table_id, hash), now));
        match applied {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(error)) => Err(status_of(error)),
            Err(refusal) => Err((refusal_status(refusal), Version(0))),
        }
    }
}
