//! The commit of a transaction: versions of blind writes, tickets, PREPARE, the decision, and
//! what the caller is told (see the module documentation of `transaction`).
//!
//! What the outcome rests on (docs/design/transactions.md): a PREPARED vote is durable on its
//! master before it is answered, and an ABORT vote is the op's recorded result, so
//! - every op voted PREPARED: the transaction is committed, whether or not every master hears
//!   of the decision in time (the recovery of an unfinished transaction finds the votes);
//! - some op voted ABORT: it can never commit;
//! - otherwise some op has no vote the client knows of (a master unreachable, a request still
//!   in flight that may yet prepare it, a lease that expired, an op refused): the transaction
//!   has not committed, and cannot later only once every master acknowledged the ABORT
//!   decision, which makes a master record ABORT for an op it never prepared (a PREPARE that
//!   arrives later then votes ABORT).

use std::sync::Arc;

use stratus_types::limits::{MULTI_OP_ITEMS_MAX, TRANSACTION_REQUEST_BYTES_MAX};
use stratus_types::{key_hash, LeaseId, RejectRules, RpcId, TxDecision, TxOpKind, TxVote, Version};
use stratus_wire::{KeyItem, Request, Response, Status, TxDecisionOp, TxOp};

use super::buffer::PlannedOp;
use super::fanout::{self, OpState, Phase, TxObject};
use super::{AbortReason, TxOutcome};
use crate::client::{operation_deadline, Inner};
use crate::error::{Error, Result};
use crate::exactly_once::RpcTicket;
use crate::multi::MultiItems;

/// Bytes of a TX_PREPARE op besides its key and value: table id, key length, rpc id, kind,
/// version read, value length.
const PREPARE_OP_FIXED_BYTES: usize = 8 + 2 + 8 + 1 + 8 + 4;
/// Bytes of a TX_DECISION op besides its key: table id, key length, rpc id.
const DECISION_OP_FIXED_BYTES: usize = 8 + 2 + 8;

/// Commits the transaction whose ops `plan` lists.
pub(super) async fn commit(inner: &Arc<Inner>, plan: Vec<PlannedOp>) -> Result<TxOutcome> {
    if plan.iter().all(|op| op.kind == TxOpKind::Read) {
        return validate(inner, plan).await;
    }
    let objects = in_commit_order(with_versions(inner, plan).await?);
    let all: Vec<usize> = (0..objects.len()).collect();
    let deadline = operation_deadline(inner.config().operation_timeout);
    let tickets = Tickets(inner.lease_agent().tickets(inner, objects.len(), deadline).await?);
    let prepare = Prepare { objects: &objects, tickets: &tickets, validate_only: false };
    let votes = fanout::run(inner, &objects, &all, &prepare, deadline).await;
    tickets.note_lease_expiry(inner, &votes);
    let committed = votes.iter().all(|vote| matches!(vote, OpState::Answered(TxVote::Prepared)));
    let decision = if committed { TxDecision::Commit } else { TxDecision::Abort };
    let decide = Decide { objects: &objects, tickets: &tickets, decision };
    let deadline = operation_deadline(inner.config().operation_timeout);
    let acknowledgements = fanout::run(inner, &objects, &all, &decide, deadline).await;
    tickets.note_lease_expiry(inner, &acknowledgements);
    let undelivered = acknowledgements
        .iter()
        .filter(|acknowledgement| !matches!(acknowledgement, OpState::Answered(())))
        .count();
    // Every op's outcome is settled on its master (or left to recovery): its result may be
    // forgotten.
    drop(tickets);
    outcome(&objects, &votes, undelivered)
}

/// Commits a transaction that only read: nothing to do for one object (it was read at one
/// instant); otherwise a validate-only PREPARE of every object, which locks and logs nothing,
/// so no decision follows.
async fn validate(inner: &Arc<Inner>, plan: Vec<PlannedOp>) -> Result<TxOutcome> {
    if plan.len() <= 1 {
        return Ok(TxOutcome::Committed);
    }
    let objects = in_commit_order(
        plan.into_iter()
            .map(|op| {
                debug_assert!(op.version_read.is_some(), "a read has its version");
                TxObject {
                    table_id: op.table_id,
                    key: op.key,
                    kind: TxOpKind::Read,
                    version_read: op.version_read.unwrap_or(Version::NONEXISTENT),
                    value: op.value,
                }
            })
            .collect(),
    );
    let all: Vec<usize> = (0..objects.len()).collect();
    let deadline = operation_deadline(inner.config().operation_timeout);
    // The wire wants rpc ids (never 0) even where nothing is recorded.
    let tickets = Tickets(inner.lease_agent().tickets(inner, objects.len(), deadline).await?);
    let prepare = Prepare { objects: &objects, tickets: &tickets, validate_only: true };
    let votes = fanout::run(inner, &objects, &all, &prepare, deadline).await;
    tickets.note_lease_expiry(inner, &votes);
    drop(tickets);
    validation_outcome(&objects, &votes)
}

/// The ops of `plan` with a version each: the version read, or for an object written without
/// being read, its current version (0: absent), read now, so that its PREPARE can lock it at
/// a version the transaction observed.
async fn with_versions(inner: &Arc<Inner>, plan: Vec<PlannedOp>) -> Result<Vec<TxObject>> {
    let blind: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].version_read.is_none()).collect();
    let mut versions: Vec<Option<Version>> = plan.iter().map(|op| op.version_read).collect();
    // A multi-read splits by count, not by bytes: keep each one's keys within a request's.
    let chunks = fanout::batches(
        [(String::new(), blind)].into_iter().collect(),
        |index| plan[index].key.len() + DECISION_OP_FIXED_BYTES,
        MULTI_OP_ITEMS_MAX,
        TRANSACTION_REQUEST_BYTES_MAX,
    );
    for chunk in chunks {
        let items = chunk
            .indices
            .iter()
            .map(|&index| KeyItem {
                table_id: plan[index].table_id,
                key: plan[index].key.clone(),
                rules: RejectRules::NONE,
            })
            .collect();
        let outcomes = inner.clone().multi(MultiItems::Read(items)).await;
        for (&index, outcome) in chunk.indices.iter().zip(outcomes) {
            versions[index] = Some(match outcome {
                Ok((_, version, _)) => version,
                Err(error) if error.status == Status::ObjectDoesntExist => Version::NONEXISTENT,
                Err(error) => return Err(error),
            });
        }
    }
    Ok(plan
        .into_iter()
        .zip(versions)
        .map(|(op, version)| TxObject {
            table_id: op.table_id,
            key: op.key,
            kind: op.kind,
            version_read: version.unwrap_or(Version::NONEXISTENT),
            value: op.value,
        })
        .collect())
}

/// The objects in (table, key hash, key) order: the first one's master is the transaction's
/// recovery owner (transactions.md, "Commit"), and its ticket, the first taken, is the
/// transaction's id.
fn in_commit_order(mut objects: Vec<TxObject>) -> Vec<TxObject> {
    objects.sort_by_cached_key(|object| {
        (object.table_id, key_hash(object.table_id, &object.key), object.key.clone())
    });
    objects
}

/// One ticket per object, in the objects' order, all under one lease (taken in one go).
/// Invariant: not empty (a commit with no object sends nothing).
struct Tickets(Vec<RpcTicket>);

impl Tickets {
    fn first(&self) -> &RpcTicket {
        &self.0[0]
    }

    fn lease(&self) -> LeaseId {
        self.first().lease()
    }

    /// The transaction's id under its lease: its first op's rpc id.
    fn transaction(&self) -> RpcId {
        self.first().rpc()
    }

    /// What the client has acknowledged now: below the transaction's first op while its
    /// tickets are out.
    fn acknowledged(&self) -> RpcId {
        self.first().identity().acknowledged
    }

    fn rpc(&self, index: usize) -> RpcId {
        self.0[index].rpc()
    }

    /// Forgets the lease if a master said it expired: the client's next mutation takes a new
    /// one.
    fn note_lease_expiry<T>(&self, inner: &Inner, states: &[OpState<T>]) {
        if states.iter().any(|state| matches!(state, OpState::LeaseExpired)) {
            inner.lease_agent().lost(self.lease());
        }
    }
}

/// The PREPARE phase (or, validate-only, a read-only transaction's validation).
struct Prepare<'a> {
    objects: &'a [TxObject],
    tickets: &'a Tickets,
    validate_only: bool,
}

impl Phase for Prepare<'_> {
    type Answer = TxVote;

    fn request(&self, indices: &[usize]) -> Request {
        let ops = indices
            .iter()
            .map(|&index| {
                let object = &self.objects[index];
                TxOp {
                    table_id: object.table_id,
                    key: object.key.clone(),
                    rpc: self.tickets.rpc(index),
                    kind: object.kind,
                    version_read: object.version_read,
                    value: object.value.clone(),
                }
            })
            .collect();
        Request::TxPrepare {
            lease: self.tickets.lease(),
            acknowledged: self.tickets.acknowledged(),
            transaction: self.tickets.transaction(),
            validate_only: self.validate_only,
            ops,
        }
    }

    fn answers(&self, response: Response) -> Option<Vec<(Status, TxVote)>> {
        match response {
            Response::TxPrepare { votes } => {
                Some(votes.into_iter().map(|vote| (vote.status, vote.vote)).collect())
            }
            _ => None,
        }
    }

    fn op_bytes(&self, index: usize) -> usize {
        let object = &self.objects[index];
        PREPARE_OP_FIXED_BYTES + object.key.len() + object.value.len()
    }

    /// Once an op voted ABORT, or can never be voted on, the transaction aborts whatever the
    /// others vote: learning their votes is no use (their ABORT decisions cover them).
    fn settled(&self, votes: &[OpState<TxVote>]) -> bool {
        votes.iter().any(|vote| {
            matches!(
                vote,
                OpState::Answered(TxVote::Abort) | OpState::Refused(_) | OpState::LeaseExpired
            )
        })
    }
}

/// The DECISION phase.
struct Decide<'a> {
    objects: &'a [TxObject],
    tickets: &'a Tickets,
    decision: TxDecision,
}

impl Phase for Decide<'_> {
    type Answer = ();

    fn request(&self, indices: &[usize]) -> Request {
        let ops = indices
            .iter()
            .map(|&index| TxDecisionOp {
                table_id: self.objects[index].table_id,
                key: self.objects[index].key.clone(),
                rpc: self.tickets.rpc(index),
            })
            .collect();
        Request::TxDecision {
            lease: self.tickets.lease(),
            acknowledged: self.tickets.acknowledged(),
            transaction: self.tickets.transaction(),
            decision: self.decision,
            ops,
        }
    }

    fn answers(&self, response: Response) -> Option<Vec<(Status, ())>> {
        match response {
            Response::TxDecision { results } => {
                Some(results.into_iter().map(|status| (status, ())).collect())
            }
            _ => None,
        }
    }

    fn op_bytes(&self, index: usize) -> usize {
        DECISION_OP_FIXED_BYTES + self.objects[index].key.len()
    }
}

/// The first op that voted ABORT, as the conflict to report.
fn conflict(objects: &[TxObject], votes: &[OpState<TxVote>]) -> Option<AbortReason> {
    let index = votes.iter().position(|vote| matches!(vote, OpState::Answered(TxVote::Abort)))?;
    let object = &objects[index];
    Some(AbortReason::Conflict { table: object.table_id, key: object.key.clone() })
}

/// The first op refused for a reason retrying cannot cure, as the error to report: nothing
/// of the transaction was applied.
fn refusal(votes: &[OpState<TxVote>]) -> Option<Error> {
    votes.iter().find_map(|vote| match vote {
        OpState::Refused(error) => Some(Error {
            status: error.status,
            version: error.version,
            message: format!(
                "the transaction was aborted, nothing of it applied: {}",
                error.message
            ),
        }),
        _ => None,
    })
}

/// What a read-write transaction's caller is told, from its votes and the number of its
/// decisions no master acknowledged (see the module documentation).
fn outcome(
    objects: &[TxObject],
    votes: &[OpState<TxVote>],
    undelivered: usize,
) -> Result<TxOutcome> {
    if votes.iter().all(|vote| matches!(vote, OpState::Answered(TxVote::Prepared))) {
        if undelivered > 0 {
            tracing::warn!(
                undelivered,
                "transaction committed, but {undelivered} of its ops' masters did not \
                 acknowledge the decision in time: they apply it when they learn it (their \
                 objects stay locked until then)"
            );
        }
        return Ok(TxOutcome::Committed);
    }
    if let Some(reason) = conflict(objects, votes) {
        if undelivered > 0 {
            tracing::warn!(
                undelivered,
                "transaction aborted, but {undelivered} of its ops' masters did not \
                 acknowledge the decision in time: objects it prepared stay locked until \
                 they learn it"
            );
        }
        return Ok(TxOutcome::Aborted(reason));
    }
    if undelivered > 0 {
        let unvoted = votes.iter().filter(|vote| !matches!(vote, OpState::Answered(_))).count();
        let cause = votes.iter().find_map(|vote| match vote {
            OpState::Waiting(Some(error)) | OpState::Refused(error) => Some(error.to_string()),
            OpState::LeaseExpired => Some("the client's lease expired".to_string()),
            OpState::Waiting(None) | OpState::Answered(_) => None,
        });
        return Err(Error::new(
            Status::Timeout,
            format!(
                "the transaction's outcome is unknown: {unvoted} of its ops have no vote \
                 (first cause: {}), and {undelivered} could not be told to abort in time; it \
                 committed only if every op was prepared",
                cause.unwrap_or_else(|| "no time left".to_string())
            ),
        ));
    }
    if let Some(error) = refusal(votes) {
        return Err(error);
    }
    Ok(TxOutcome::Aborted(AbortReason::Timeout))
}

/// What a read-only transaction's caller is told, from its validation's votes (nothing was
/// locked, so an unknown vote only means the reads could not be shown consistent).
fn validation_outcome(objects: &[TxObject], votes: &[OpState<TxVote>]) -> Result<TxOutcome> {
    if votes.iter().all(|vote| matches!(vote, OpState::Answered(TxVote::Prepared))) {
        return Ok(TxOutcome::Committed);
    }
    if let Some(reason) = conflict(objects, votes) {
        return Ok(TxOutcome::Aborted(reason));
    }
    if let Some(error) = refusal(votes) {
        return Err(error);
    }
    Ok(TxOutcome::Aborted(AbortReason::Timeout))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use stratus_types::TableId;

    use super::*;

    fn objects(count: usize) -> Vec<TxObject> {
        (0..count)
            .map(|index| TxObject {
                table_id: TableId(1),
                key: Bytes::from(format!("k{index}")),
                kind: TxOpKind::Write,
                version_read: Version(1),
                value: Bytes::from_static(b"v"),
            })
            .collect()
    }

    use OpState::{Answered, LeaseExpired, Refused, Waiting};
    const PREPARED: OpState<TxVote> = Answered(TxVote::Prepared);
    const ABORT: OpState<TxVote> = Answered(TxVote::Abort);

    fn refused() -> OpState<TxVote> {
        Refused(Error::new(Status::ValueTooLarge, "value of 2 MiB"))
    }

    fn waiting() -> OpState<TxVote> {
        Waiting(Some(Error::new(Status::CouldntConnect, "master a:1")))
    }

    #[test]
    fn every_op_prepared_is_committed_even_if_a_decision_is_not_delivered() {
        let objects = objects(2);
        assert_eq!(outcome(&objects, &[PREPARED, PREPARED], 0), Ok(TxOutcome::Committed));
        assert_eq!(outcome(&objects, &[PREPARED, PREPARED], 2), Ok(TxOutcome::Committed));
    }

    #[test]
    fn an_abort_vote_is_a_conflict_on_its_object_whatever_else_happened() {
        let objects = objects(3);
        let conflict = TxOutcome::Aborted(AbortReason::Conflict {
            table: TableId(1),
            key: Bytes::from_static(b"k1"),
        });
        for (votes, undelivered) in [
            ([PREPARED, ABORT, PREPARED], 0),
            ([waiting(), ABORT, ABORT], 3),
            ([refused(), ABORT, LeaseExpired], 1),
        ] {
            assert_eq!(outcome(&objects, &votes, undelivered), Ok(conflict.clone()));
        }
    }

    #[test]
    fn unknown_votes_abort_only_once_every_master_acknowledged_the_abort() {
        let objects = objects(2);
        assert_eq!(
            outcome(&objects, &[PREPARED, waiting()], 0),
            Ok(TxOutcome::Aborted(AbortReason::Timeout))
        );
        assert_eq!(
            outcome(&objects, &[PREPARED, Waiting(None)], 0),
            Ok(TxOutcome::Aborted(AbortReason::Timeout))
        );
        for votes in [[PREPARED, waiting()], [PREPARED, LeaseExpired], [refused(), PREPARED]] {
            let error = outcome(&objects, &votes, 1).unwrap_err();
            assert_eq!(error.status, Status::Timeout);
            assert!(error.message.contains("outcome is unknown"), "{error}");
        }
    }

    #[test]
    fn a_refused_op_is_the_error_once_the_abort_is_delivered() {
        let objects = objects(2);
        let error = outcome(&objects, &[PREPARED, refused()], 0).unwrap_err();
        assert_eq!(error.status, Status::ValueTooLarge);
        assert!(error.message.contains("nothing of it applied"), "{error}");
    }

    #[test]
    fn a_validation_commits_when_every_read_is_unchanged() {
        let objects = objects(2);
        assert_eq!(validation_outcome(&objects, &[PREPARED, PREPARED]), Ok(TxOutcome::Committed));
        assert!(matches!(
            validation_outcome(&objects, &[ABORT, waiting()]),
            Ok(TxOutcome::Aborted(AbortReason::Conflict { .. }))
        ));
        assert_eq!(
            validation_outcome(&objects, &[PREPARED, waiting()]),
            Ok(TxOutcome::Aborted(AbortReason::Timeout))
        );
        assert_eq!(
            validation_outcome(&objects, &[PREPARED, refused()]).unwrap_err().status,
            Status::ValueTooLarge
        );
    }

    #[test]
    fn the_commit_order_is_by_table_then_key_hash() {
        let mut objects = objects(20);
        objects[3].table_id = TableId(0);
        let ordered = in_commit_order(objects.clone());
        assert_eq!(ordered[0], objects[3], "the lowest table first");
        for pair in ordered[1..].windows(2) {
            let hash = |object: &TxObject| key_hash(object.table_id, &object.key);
            assert!(hash(&pair[0]) <= hash(&pair[1]));
        }
    }
}
