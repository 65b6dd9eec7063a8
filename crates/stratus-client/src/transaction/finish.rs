//! Finishing a transaction once its PREPARE round is over: making unknown votes final
//! (TX_REQUEST_ABORT), deciding from the final votes, and delivering the decision
//! (TX_DECISION). The commit uses it with its own tickets; [`Client::finish_transaction`] is
//! the same for a participant finishing a transaction whose client went silent.
//!
//! Why a vote must be final before anyone decides on it (docs/design/transactions.md,
//! "Failures"): a PREPARE still in flight may yet prepare its op, so deciding ABORT for an op
//! whose vote is unknown could contradict a participant's recovery that finds every op
//! PREPARED and commits. TX_REQUEST_ABORT makes the vote final (a participant that had not
//! voted records ABORT, and a PREPARE that arrives later votes ABORT), so whoever decides,
//! the client or any participant, decides alike: COMMIT iff every op voted PREPARED.
//!
//! Why the client keeps its tickets until every op acknowledged the decision: a participant's
//! recovery asks every op for its vote, and a master forgets an op's vote once the client
//! acknowledged it, after which the op could not answer. So a decision not delivered within
//! the operation's time goes on in the background ([`finish_in_background`]) holding the
//! tickets, for at most half a client lease term; then they are given back anyway (the
//! participants' recovery finishes the transaction).

use std::sync::Arc;
use std::time::Duration;

use stratus_rpc::Backoff;
use stratus_types::limits::{CLIENT_LEASE_TERM_MILLIS, TRANSACTION_OBJECTS_MAX};
use stratus_types::{LeaseId, RpcId, TxDecision, TxVote};
use stratus_wire::{Request, Response, Status, TxDecisionOp};
use tokio::time::Instant;

use super::commit::Tickets;
use super::fanout::{self, OpState, Phase};
use crate::client::{operation_deadline, Client, Inner};
use crate::error::{Error, Result};

/// Bytes of a TX_DECISION or TX_REQUEST_ABORT op: table id, key hash, rpc id.
const OP_NAME_BYTES: usize = 8 + 8 + 8;

/// How long a commit's tickets are held in the background, at most, while its decision (or
/// its votes) are still being delivered (or learnt): half a lease term, so the lease the
/// client renews meanwhile keeps the participants' records of its ops.
const BACKGROUND_FINISH: Duration = Duration::from_millis(CLIENT_LEASE_TERM_MILLIS / 2);

impl Client {
    /// Finishes the transaction `(lease, transaction)`, whose ops are `participants` (every op
    /// of the transaction, as its TX_PREPARE requests listed them), and returns its decision.
    ///
    /// Meant for participants: a master's recovery manager calls it for a transaction whose
    /// client went silent (docs/design/transactions.md, "The client dies mid-commit").
    /// Applications commit with [`Transaction::commit`](crate::Transaction::commit).
    ///
    /// 1. TX_REQUEST_ABORT for every op, each to the master of its table and key hash
    ///    (re-routed after a stale map, RETRY or a lost connection, as a commit's ops are),
    ///    until every op answered its final vote: an op that had not voted is recorded ABORT
    ///    by its master, so it can never prepare later.
    /// 2. COMMIT if every vote is PREPARED, ABORT otherwise.
    /// 3. TX_DECISION (under `lease`, acknowledging nothing) for every op, until each master
    ///    acknowledged its ops.
    ///
    /// Each round has the client's operation timeout. An error with status TIMEOUT means a
    /// round could not complete (its message says which, and why): calling again is safe,
    /// and decides the same. INVALID_PARAMETER: `participants` is empty or too long
    /// ([`TRANSACTION_OBJECTS_MAX`]), or an id is 0.
    pub async fn finish_transaction(
        &self,
        lease: LeaseId,
        transaction: RpcId,
        participants: &[TxDecisionOp],
    ) -> Result<TxDecision> {
        if participants.is_empty()
            || participants.len() > TRANSACTION_OBJECTS_MAX
            || lease.0 == 0
            || transaction.0 == 0
            || participants.iter().any(|op| op.rpc.0 == 0)
        {
            return Err(Error::new(
                Status::InvalidParameter,
                format!(
                    "cannot finish transaction {transaction} of lease {lease} with {} \
                     participants (1 to {TRANSACTION_OBJECTS_MAX}, ids not 0)",
                    participants.len()
                ),
            ));
        }
        let finishing =
            Finishing { inner: &self.inner, lease, transaction, tickets: None, ops: participants };
        let all: Vec<usize> = (0..participants.len()).collect();
        let timeout = self.config().operation_timeout;
        let answers = finishing.request_aborts(&all, operation_deadline(timeout)).await;
        let votes: Vec<Option<TxVote>> = answers.iter().map(answered).collect();
        let Some(decision) = decided(&votes) else {
            return Err(incomplete("its votes could not all be learnt", &answers));
        };
        let acknowledgements = finishing.deliver(decision, &all, operation_deadline(timeout)).await;
        if acknowledgements.iter().any(|state| !matches!(state, OpState::Answered(()))) {
            let what = format!("decided {decision:?}, but not every master acknowledged it");
            return Err(incomplete(&what, &acknowledgements));
        }
        Ok(decision)
    }
}

/// The answer of an op of a finished phase, if it has one.
pub(super) fn answered<T: Copy>(state: &OpState<T>) -> Option<T> {
    match state {
        OpState::Answered(answer) => Some(*answer),
        _ => None,
    }
}

/// The decision from every op's final vote (`None` while some vote is unknown): COMMIT iff
/// every op voted PREPARED; ABORT as soon as one voted ABORT.
pub(super) fn decided(votes: &[Option<TxVote>]) -> Option<TxDecision> {
    if votes.contains(&Some(TxVote::Abort)) {
        return Some(TxDecision::Abort);
    }
    votes.iter().all(Option::is_some).then_some(TxDecision::Commit)
}

/// The TIMEOUT error of a finish whose round ended with ops unanswered (`states`).
fn incomplete<T>(what: &str, states: &[OpState<T>]) -> Error {
    let unanswered = states.iter().filter(|state| !matches!(state, OpState::Answered(_))).count();
    Error::new(
        Status::Timeout,
        format!(
            "the transaction could not be finished: {what} ({unanswered} of its {} ops \
             unanswered; first cause: {})",
            states.len(),
            first_cause(states)
        ),
    )
}

/// Why the first op without an answer has none.
pub(super) fn first_cause<T>(states: &[OpState<T>]) -> String {
    let cause = states.iter().find_map(|state| match state {
        OpState::Waiting(Some(error)) | OpState::Refused(error) => Some(error.to_string()),
        OpState::LeaseExpired => Some("the client's lease expired".to_string()),
        OpState::Waiting(None) | OpState::Answered(_) => None,
    });
    cause.unwrap_or_else(|| "no time left".to_string())
}

/// One transaction being finished: its identity, its ops, and what its requests acknowledge.
pub(super) struct Finishing<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) lease: LeaseId,
    pub(super) transaction: RpcId,
    /// The client's own tickets (it acknowledges below them); `None` for a participant
    /// finishing another client's transaction (it acknowledges nothing).
    pub(super) tickets: Option<&'a Tickets>,
    pub(super) ops: &'a [TxDecisionOp],
}

impl Finishing<'_> {
    /// TX_REQUEST_ABORT for the ops at `indices`, until each has its final vote or `deadline`
    /// passes.
    pub(super) async fn request_aborts(
        &self,
        indices: &[usize],
        deadline: Instant,
    ) -> Vec<OpState<TxVote>> {
        let phase = RequestAbort { finishing: self };
        let states = fanout::run(self.inner, self.ops, indices, &phase, deadline).await;
        self.note_lease_expiry(&states);
        states
    }

    /// TX_DECISION of `decision` for the ops at `indices`, until each master acknowledged
    /// its ops or `deadline` passes.
    pub(super) async fn deliver(
        &self,
        decision: TxDecision,
        indices: &[usize],
        deadline: Instant,
    ) -> Vec<OpState<()>> {
        let phase = Decide { finishing: self, decision };
        let states = fanout::run(self.inner, self.ops, indices, &phase, deadline).await;
        self.note_lease_expiry(&states);
        states
    }

    fn acknowledged(&self) -> RpcId {
        self.tickets.map_or(RpcId(0), Tickets::acknowledged)
    }

    fn note_lease_expiry<T>(&self, states: &[OpState<T>]) {
        if let Some(tickets) = self.tickets {
            tickets.note_lease_expiry(self.inner, states);
        }
    }

    fn names(&self, indices: &[usize]) -> Vec<TxDecisionOp> {
        indices.iter().map(|&index| self.ops[index]).collect()
    }
}

/// The REQUEST_ABORT phase.
struct RequestAbort<'a> {
    finishing: &'a Finishing<'a>,
}

impl Phase for RequestAbort<'_> {
    type Answer = TxVote;

    fn request(&self, indices: &[usize]) -> Request {
        Request::TxRequestAbort {
            lease: self.finishing.lease,
            transaction: self.finishing.transaction,
            ops: self.finishing.names(indices),
        }
    }

    fn answers(&self, response: Response) -> Option<Vec<(Status, TxVote)>> {
        match response {
            Response::TxRequestAbort { votes } => {
                Some(votes.into_iter().map(|vote| (vote.status, vote.vote)).collect())
            }
            _ => None,
        }
    }

    fn op_bytes(&self, _index: usize) -> usize {
        OP_NAME_BYTES
    }

    /// One final ABORT decides the transaction: the other votes no longer matter.
    fn settled(&self, votes: &[OpState<TxVote>]) -> bool {
        votes.iter().any(|vote| matches!(vote, OpState::Answered(TxVote::Abort)))
    }
}

/// The DECISION phase.
struct Decide<'a> {
    finishing: &'a Finishing<'a>,
    decision: TxDecision,
}

impl Phase for Decide<'_> {
    type Answer = ();

    fn request(&self, indices: &[usize]) -> Request {
        Request::TxDecision {
            lease: self.finishing.lease,
            acknowledged: self.finishing.acknowledged(),
            transaction: self.finishing.transaction,
            decision: self.decision,
            ops: self.finishing.names(indices),
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

    fn op_bytes(&self, _index: usize) -> usize {
        OP_NAME_BYTES
    }
}

/// What a commit left unfinished when its operation's time was up.
#[derive(Debug)]
pub(super) enum Unfinished {
    /// Some votes are still unknown (`None`): they must be made final before deciding.
    Votes(Vec<Option<TxVote>>),
    /// Decided; the ops at these indices have not acknowledged the decision.
    Delivery(TxDecision, Vec<usize>),
}

/// Goes on with what a commit left unfinished in a task of its own, holding the commit's
/// tickets (so the client acknowledges none of its ops meanwhile), for at most
/// [`BACKGROUND_FINISH`]; then gives the tickets back, with a warning if it did not finish.
/// `permit`, when given, is held until then (the bound on the decisions of committed
/// transactions in the background, which `Client::settle_transactions` waits for).
pub(super) fn finish_in_background(
    inner: Arc<Inner>,
    tickets: Tickets,
    ops: Vec<TxDecisionOp>,
    unfinished: Unfinished,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // A commit always runs on a runtime; without one, nothing could be sent anyway.
        return;
    };
    runtime.spawn(async move {
        let finished = finish(&inner, &tickets, &ops, unfinished).await;
        if !finished {
            tracing::warn!(
                lease = %tickets.lease(),
                transaction = %tickets.transaction(),
                "a transaction's decision could not be delivered to every op within {:?}: its \
                 ops are acknowledged now, and the participants' recovery finishes it",
                BACKGROUND_FINISH
            );
        }
        drop(tickets);
        drop(permit);
    });
}

/// The work of [`finish_in_background`]: rounds of at most an operation's time each (so a
/// master that stopped answering is asked again), until finished (true) or out of time or
/// lease (false).
async fn finish(
    inner: &Arc<Inner>,
    tickets: &Tickets,
    ops: &[TxDecisionOp],
    mut unfinished: Unfinished,
) -> bool {
    let end = Instant::now() + BACKGROUND_FINISH;
    let finishing = Finishing {
        inner,
        lease: tickets.lease(),
        transaction: tickets.transaction(),
        tickets: Some(tickets),
        ops,
    };
    let mut backoff = Backoff::for_client();
    while Instant::now() < end {
        let deadline = operation_deadline(inner.config().operation_timeout).min(end);
        unfinished = match unfinished {
            Unfinished::Votes(mut votes) => {
                let unknown: Vec<usize> =
                    (0..votes.len()).filter(|&i| votes[i].is_none()).collect();
                let states = finishing.request_aborts(&unknown, deadline).await;
                for &index in &unknown {
                    votes[index] = answered(&states[index]);
                }
                if states.iter().any(|state| matches!(state, OpState::LeaseExpired)) {
                    return false;
                }
                match decided(&votes) {
                    Some(decision) => Unfinished::Delivery(decision, (0..ops.len()).collect()),
                    None => Unfinished::Votes(votes),
                }
            }
            Unfinished::Delivery(decision, undelivered) => {
                let states = finishing.deliver(decision, &undelivered, deadline).await;
                if states.iter().any(|state| matches!(state, OpState::LeaseExpired)) {
                    return false;
                }
                let undelivered: Vec<usize> = undelivered
                    .into_iter()
                    .filter(|&index| !matches!(states[index], OpState::Answered(())))
                    .collect();
                if undelivered.is_empty() {
                    tracing::debug!(
                        ?decision,
                        "a transaction's decision was delivered in the background"
                    );
                    return true;
                }
                Unfinished::Delivery(decision, undelivered)
            }
        };
        inner.pause(&mut backoff, end).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_needs_every_vote_unless_one_is_abort() {
        use TxVote::{Abort, Prepared};
        assert_eq!(decided(&[Some(Prepared), Some(Prepared)]), Some(TxDecision::Commit));
        assert_eq!(decided(&[Some(Prepared), None]), None);
        assert_eq!(decided(&[None, Some(Abort)]), Some(TxDecision::Abort));
        assert_eq!(decided(&[Some(Prepared), Some(Abort)]), Some(TxDecision::Abort));
    }
}
