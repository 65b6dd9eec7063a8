//! The commit of a transaction: versions of blind writes, tickets, PREPARE, final votes, the
//! decision, and what the caller is told (see the module documentation of `transaction`).
//!
//! What the outcome rests on (docs/design/transactions.md): a PREPARED vote is durable on its
//! master before it is answered, an ABORT vote is the op's recorded result, and
//! TX_REQUEST_ABORT makes the vote of an op the client did not hear from final (`finish`), so
//! - every op's vote is known, or made final: the transaction is committed iff every one is
//!   PREPARED, whether or not every master hears of the decision in time (a participant's
//!   recovery finds the same votes);
//! - some op voted ABORT: it can never commit, whatever the others' votes;
//! - otherwise some vote could neither be learnt nor made final in time: the outcome is
//!   unknown (the participants' recovery decides it, as the client would have).

use std::sync::Arc;

use bytes::Bytes;
use stratus_types::limits::{MULTI_OP_ITEMS_MAX, TRANSACTION_REQUEST_BYTES_MAX};
use stratus_types::{
    key_hash, LeaseId, RejectRules, RpcId, TableId, TxDecision, TxOpKind, TxVote, Version,
};
use stratus_wire::{KeyItem, Request, Response, Status, TxDecisionOp, TxOp};

use super::buffer::PlannedOp;
use super::fanout::{self, OpState, Phase, TxObject};
use super::finish::{self, answered, decided, first_cause, Finishing, Unfinished};
use super::{AbortReason, TxOutcome};
use crate::client::{operation_deadline, Inner};
use crate::error::{Error, Result};
use crate::exactly_once::RpcTicket;
use crate::multi::MultiItems;

/// Bytes of a TX_PREPARE op besides its key and value: table id, key length, rpc id, kind,
/// version read, value length.
const PREPARE_OP_FIXED_BYTES: usize = 8 + 2 + 8 + 1 + 8 + 4;
/// Bytes of a MULTI_READ item besides its key: table id, key length, reject rules.
const KEY_ITEM_FIXED_BYTES: usize = 8 + 2 + 9;

/// Commits the transaction whose ops `plan` lists.
pub(super) async fn commit(inner: &Arc<Inner>, plan: Vec<PlannedOp>) -> Result<TxOutcome> {
    if plan.iter().all(|op| op.kind == TxOpKind::Read) {
        return validate(inner, plan).await;
    }
    let objects = in_commit_order(with_versions(inner, plan).await?);
    let all: Vec<usize> = (0..objects.len()).collect();
    let timeout = inner.config().operation_timeout;
    let deadline = operation_deadline(timeout);
    let tickets = Tickets(inner.lease_agent().tickets(inner, objects.len(), deadline).await?);
    let participants = participants(&objects, &tickets);
    let prepare = Prepare {
        objects: &objects,
        tickets: &tickets,
        participants: &participants,
        validate_only: false,
    };
    let votes = fanout::run(inner, &participants, &all, &prepare, deadline).await;
    tickets.note_lease_expiry(inner, &votes);
    let finishing = Finishing {
        inner,
        lease: tickets.lease(),
        transaction: tickets.transaction(),
        tickets: Some(&tickets),
        ops: &participants,
    };
    // Every vote final before deciding: the ones the client did not hear are asked for with
    // TX_REQUEST_ABORT (unless an ABORT decided the transaction already).
    let mut final_votes: Vec<Option<TxVote>> = votes.iter().map(answered).collect();
    if decided(&final_votes).is_none() {
        let unknown: Vec<usize> =
            all.iter().copied().filter(|&i| final_votes[i].is_none()).collect();
        let answers = finishing.request_aborts(&unknown, operation_deadline(timeout)).await;
        for &index in &unknown {
            final_votes[index] = answered(&answers[index]);
        }
        if decided(&final_votes).is_none() {
            let error = unknown_outcome(&final_votes, &votes, &answers);
            finish::finish_in_background(
                inner.clone(),
                tickets,
                participants,
                Unfinished::Votes(final_votes),
                None,
            );
            return Err(error);
        }
    }
    let decision = decided(&final_votes).unwrap_or(TxDecision::Abort);
    if decision == TxDecision::Commit {
        // Every vote is PREPARED, in its master's replicated log: the transaction is committed
        // whoever decides (a participant finishing it for a dead client asks the same votes),
        // so the client hears it now, as RAMCloud's does, and the decision reaches the masters
        // in the background. Until it does their objects stay locked: a read of one answers
        // RETRY, so nobody sees the transaction half applied, nor the old values after this
        // returns. An abort is still delivered first: the caller's retry would otherwise meet
        // its own earlier attempt's locks.
        if let Ok(permit) = inner.background_decisions.clone().try_acquire_owned() {
            finish::finish_in_background(
                inner.clone(),
                tickets,
                participants,
                Unfinished::Delivery(decision, all),
                Some(permit),
            );
            return outcome(&objects, &votes, decision);
        }
    }
    let acknowledgements = finishing.deliver(decision, &all, operation_deadline(timeout)).await;
    let undelivered: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&index| !matches!(acknowledgements[index], OpState::Answered(())))
        .collect();
    if undelivered.is_empty() {
        // Every op's outcome is settled on its master: its result may be forgotten.
        drop(tickets);
    } else {
        tracing::warn!(
            undelivered = undelivered.len(),
            ?decision,
            "{} of a transaction's ops' masters did not acknowledge its decision in time \
             (first cause: {}): it goes on in the background, and their objects stay locked \
             until they learn it",
            undelivered.len(),
            first_cause(&acknowledgements)
        );
        finish::finish_in_background(
            inner.clone(),
            tickets,
            participants,
            Unfinished::Delivery(decision, undelivered),
            None,
        );
    }
    outcome(&objects, &votes, decision)
}

/// Every op of the transaction, as TX_PREPARE lists its participants and as the later
/// phases name its ops: table, key hash and rpc id.
fn participants(objects: &[TxObject], tickets: &Tickets) -> Vec<TxDecisionOp> {
    objects
        .iter()
        .enumerate()
        .map(|(index, object)| TxDecisionOp {
            table_id: object.table_id,
            key_hash: key_hash(object.table_id, &object.key).0,
            rpc: tickets.rpc(index),
        })
        .collect()
}

/// The value (`None`: absent) and version of every object, read from every master involved in
/// parallel, in multi-reads whose keys stay within a request's bytes (a multi-read splits by
/// count only). A locked object's item is retried as any multi-read item answered RETRY.
pub(super) async fn read_objects(
    inner: &Arc<Inner>,
    objects: &[(TableId, Bytes)],
) -> Result<Vec<(Option<Bytes>, Version)>> {
    let mut read = vec![(None, Version::NONEXISTENT); objects.len()];
    let chunks = fanout::batches(
        [(String::new(), (0..objects.len()).collect())].into_iter().collect(),
        |index| objects[index].1.len() + KEY_ITEM_FIXED_BYTES,
        MULTI_OP_ITEMS_MAX,
        TRANSACTION_REQUEST_BYTES_MAX,
    );
    for chunk in chunks {
        let items = chunk
            .indices
            .iter()
            .map(|&index| KeyItem {
                table_id: objects[index].0,
                key: objects[index].1.clone(),
                rules: RejectRules::NONE,
            })
            .collect();
        let outcomes = inner.clone().multi(MultiItems::Read(items)).await;
        for (&index, outcome) in chunk.indices.iter().zip(outcomes) {
            read[index] = match outcome {
                Ok((value, version, _)) => (Some(value), version),
                Err(error) if error.status == Status::ObjectDoesntExist => {
                    (None, Version::NONEXISTENT)
                }
                Err(error) => return Err(error),
            };
        }
    }
    Ok(read)
}

/// Commits a transaction that only read: nothing to do for one object it read itself (it
/// was read at one instant); otherwise (more objects, or a version the caller gave) a
/// validate-only PREPARE of every object, which locks and logs nothing, so no decision
/// follows.
async fn validate(inner: &Arc<Inner>, plan: Vec<PlannedOp>) -> Result<TxOutcome> {
    if plan.len() <= 1 && plan.iter().all(|op| !op.version_given) {
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
    // Only to route the ops: a validation names no participants.
    let names = participants(&objects, &tickets);
    let prepare =
        Prepare { objects: &objects, tickets: &tickets, participants: &[], validate_only: true };
    let votes = fanout::run(inner, &names, &all, &prepare, deadline).await;
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
    let objects: Vec<(TableId, Bytes)> =
        blind.iter().map(|&index| (plan[index].table_id, plan[index].key.clone())).collect();
    for (index, (_, version)) in blind.into_iter().zip(read_objects(inner, &objects).await?) {
        versions[index] = Some(version);
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

/// The objects in (table, key hash, key) order, the same for every attempt of the same
/// objects: the first one's ticket, the first taken, is the transaction's id (every
/// participant holds the whole participant list, so no master is singled out to finish it).
fn in_commit_order(mut objects: Vec<TxObject>) -> Vec<TxObject> {
    objects.sort_by_cached_key(|object| {
        (object.table_id, key_hash(object.table_id, &object.key), object.key.clone())
    });
    objects
}

/// One ticket per object, in the objects' order, all under one lease (taken in one go).
/// Invariant: not empty (a commit with no object sends nothing). Dropping them acknowledges
/// the transaction's ops: only once every op acknowledged the decision (or the commit gave up
/// on it, see `finish`).
pub(super) struct Tickets(Vec<RpcTicket>);

impl Tickets {
    fn first(&self) -> &RpcTicket {
        &self.0[0]
    }

    pub(super) fn lease(&self) -> LeaseId {
        self.first().lease()
    }

    /// The transaction's id under its lease: its first op's rpc id.
    pub(super) fn transaction(&self) -> RpcId {
        self.first().rpc()
    }

    /// What the client has acknowledged now: below the transaction's first op while its
    /// tickets are out.
    pub(super) fn acknowledged(&self) -> RpcId {
        self.first().identity().acknowledged
    }

    fn rpc(&self, index: usize) -> RpcId {
        self.0[index].rpc()
    }

    /// Forgets the lease if a master said it expired: the client's next mutation takes a new
    /// one.
    pub(super) fn note_lease_expiry<T>(&self, inner: &Inner, states: &[OpState<T>]) {
        if states.iter().any(|state| matches!(state, OpState::LeaseExpired)) {
            inner.lease_agent().lost(self.lease());
        }
    }
}

/// The PREPARE phase (or, validate-only, a read-only transaction's validation).
struct Prepare<'a> {
    objects: &'a [TxObject],
    tickets: &'a Tickets,
    /// Every op of the transaction, in every request (empty for a validation).
    participants: &'a [TxDecisionOp],
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
            participants: self.participants.to_vec(),
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

    /// Once an op voted ABORT, or can never be voted on here, the transaction aborts (or, for
    /// an op refused after it may have reached its master, is decided by the final votes):
    /// waiting for more votes is no use, and TX_REQUEST_ABORT makes the others final.
    fn settled(&self, votes: &[OpState<TxVote>]) -> bool {
        votes.iter().any(|vote| {
            matches!(
                vote,
                OpState::Answered(TxVote::Abort) | OpState::Refused(_) | OpState::LeaseExpired
            )
        })
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

/// What a read-write transaction's caller is told once `decision` is taken from the final
/// votes, given the votes its PREPARE round learnt (`votes`): committed; or aborted in a
/// conflict (an op voted ABORT on PREPARE), with the error of an op refused for a reason
/// retrying cannot cure (nothing was applied), or for want of votes (made ABORT by
/// TX_REQUEST_ABORT).
fn outcome(
    objects: &[TxObject],
    votes: &[OpState<TxVote>],
    decision: TxDecision,
) -> Result<TxOutcome> {
    if decision == TxDecision::Commit {
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

/// The error of a commit whose votes could neither all be learnt nor all be made final:
/// `final_votes` as they stand, `votes` of the PREPARE round, `answers` of TX_REQUEST_ABORT.
fn unknown_outcome(
    final_votes: &[Option<TxVote>],
    votes: &[OpState<TxVote>],
    answers: &[OpState<TxVote>],
) -> Error {
    let unknown = final_votes.iter().filter(|vote| vote.is_none()).count();
    Error::new(
        Status::Timeout,
        format!(
            "the transaction's outcome is unknown: {unknown} of its {} ops have no vote (first \
             cause: {}), and their masters could not be asked in time to make it final \
             (first cause: {}); it commits only if every op was prepared, which the \
             participants settle",
            final_votes.len(),
            first_cause(votes),
            first_cause(answers)
        ),
    )
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
    use TxOutcome::Committed;
    const PREPARED: OpState<TxVote> = Answered(TxVote::Prepared);
    const ABORT: OpState<TxVote> = Answered(TxVote::Abort);

    fn refused() -> OpState<TxVote> {
        Refused(Error::new(Status::ValueTooLarge, "value of 2 MiB"))
    }

    fn waiting() -> OpState<TxVote> {
        Waiting(Some(Error::new(Status::CouldntConnect, "master a:1")))
    }

    #[test]
    fn the_outcome_is_the_decision_with_its_reason() {
        let objects = objects(3);
        let commit = TxDecision::Commit;
        let abort = TxDecision::Abort;
        // Committed, even when some votes were made final by TX_REQUEST_ABORT.
        assert_eq!(outcome(&objects, &[PREPARED, waiting(), PREPARED], commit), Ok(Committed));
        // An ABORT on PREPARE is a conflict on its object, whatever else happened.
        let conflict = TxOutcome::Aborted(AbortReason::Conflict {
            table: TableId(1),
            key: Bytes::from_static(b"k1"),
        });
        for votes in [
            [PREPARED, ABORT, PREPARED],
            [waiting(), ABORT, ABORT],
            [refused(), ABORT, LeaseExpired],
        ] {
            assert_eq!(outcome(&objects, &votes, abort), Ok(conflict.clone()));
        }
        // Aborted by votes made final: for want of votes, or for an op refused.
        assert_eq!(
            outcome(&objects, &[PREPARED, waiting(), Waiting(None)], abort),
            Ok(TxOutcome::Aborted(AbortReason::Timeout))
        );
        let error = outcome(&objects, &[PREPARED, refused(), waiting()], abort).unwrap_err();
        assert_eq!(error.status, Status::ValueTooLarge);
        assert!(error.message.contains("nothing of it applied"), "{error}");
    }

    #[test]
    fn votes_neither_learnt_nor_made_final_leave_the_outcome_unknown() {
        let error = unknown_outcome(
            &[Some(TxVote::Prepared), None],
            &[PREPARED, waiting()],
            &[Waiting(None), LeaseExpired],
        );
        assert_eq!(error.status, Status::Timeout);
        assert!(error.message.contains("outcome is unknown"), "{error}");
        assert!(error.message.contains("1 of its 2 ops"), "{error}");
        assert!(error.message.contains("master a:1"), "{error}");
        assert!(error.message.contains("lease expired"), "{error}");
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
