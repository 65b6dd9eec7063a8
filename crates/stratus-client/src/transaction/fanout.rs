//! One phase of a transaction's commit or finish (PREPARE, REQUEST_ABORT or DECISION) on the
//! wire: rounds of routing the ops still without an answer (by each op's table and key hash), sending one request per master (split at [`MULTI_OP_ITEMS_MAX`] ops and
//! [`TRANSACTION_REQUEST_BYTES_MAX`] bytes), all in parallel, and judging each op's answer,
//! until every op has one, the phase's caller says the rest no longer matters, or the
//! deadline passes.
//!
//! Each op is judged as an item of a multi-operation is (`multi.rs`): [`Inner::route`] finds
//! its master, [`Inner::judge_status`] and [`Inner::judge_transport`] decide whether it goes
//! again (dropping the stale map or connection), with the same rpc id every time. An op's
//! identity makes every attempt safe to repeat, so the ops count as protected mutations.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use stratus_rpc::{Backoff, RpcError};
use stratus_types::limits::{MULTI_OP_ITEMS_MAX, TRANSACTION_REQUEST_BYTES_MAX};
use stratus_types::{KeyHash, TableId, TxOpKind, Version};
use stratus_wire::{Request, Response, ResponseBody, Status, TxDecisionOp};
use tokio::time::Instant;

use crate::client::{failure, out_of_time, time_left, Inner, Judgement, Route, UnavailableTables};
use crate::error::Error;

/// One object of a committing transaction, as its requests name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TxObject {
    pub(super) table_id: TableId,
    pub(super) key: Bytes,
    pub(super) kind: TxOpKind,
    /// The version the transaction observed (0: absent).
    pub(super) version_read: Version,
    /// A write's value; empty for other kinds.
    pub(super) value: Bytes,
}

/// Where one op of a phase stands.
#[derive(Clone, Debug)]
pub(super) enum OpState<T> {
    /// No answer yet; the failure of its last attempt, if it had one (what it reports if the
    /// deadline passes first).
    Waiting(Option<Error>),
    /// Its master's answer (status OK).
    Answered(T),
    /// Refused for a reason retrying cannot cure.
    Refused(Error),
    /// Its master said the transaction's lease expired: no attempt of it can succeed now.
    LeaseExpired,
}

impl<T> OpState<T> {
    fn is_waiting(&self) -> bool {
        matches!(self, OpState::Waiting(_))
    }
}

/// What one phase sends and how it reads the answers.
pub(super) trait Phase {
    /// What an answered op learnt.
    type Answer: Send + 'static;

    /// The request carrying the ops at `indices` (all to one master).
    fn request(&self, indices: &[usize]) -> Request;

    /// Each op's status and answer from a response to a request of this phase; `None` when
    /// the response is of another kind.
    fn answers(&self, response: Response) -> Option<Vec<(Status, Self::Answer)>>;

    /// Bytes op `index` takes in a request (its share of [`TRANSACTION_REQUEST_BYTES_MAX`]).
    fn op_bytes(&self, index: usize) -> usize;

    /// True when the ops still waiting no longer matter (an op of a PREPARE voted ABORT: the
    /// transaction aborts whatever the others vote).
    fn settled(&self, _states: &[OpState<Self::Answer>]) -> bool {
        false
    }
}

/// The ops of one request to one master.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Batch {
    pub(super) address: String,
    pub(super) indices: Vec<usize>,
}

/// Cuts each master's ops into requests of at most `items_max` ops and `bytes_max` bytes (but
/// at least one op), in the masters' order.
pub(super) fn batches(
    by_master: BTreeMap<String, Vec<usize>>,
    op_bytes: impl Fn(usize) -> usize,
    items_max: usize,
    bytes_max: usize,
) -> Vec<Batch> {
    let mut batches = Vec::new();
    for (address, indices) in by_master {
        let mut current = Vec::new();
        let mut bytes = 0;
        for index in indices {
            let size = op_bytes(index);
            if !current.is_empty() && (current.len() == items_max || bytes + size > bytes_max) {
                let indices = std::mem::take(&mut current);
                batches.push(Batch { address: address.clone(), indices });
                bytes = 0;
            }
            current.push(index);
            bytes += size;
        }
        if !current.is_empty() {
            batches.push(Batch { address, indices: current });
        }
    }
    batches
}

/// Runs `phase` for the ops named by `ops` at `indices` (the others keep
/// [`OpState::Waiting`] and are never sent): rounds with a pause between them, until no op
/// waits, the phase is settled, or `deadline` passes. Each op goes to the master of its
/// table and key hash.
pub(super) async fn run<P: Phase>(
    inner: &Arc<Inner>,
    ops: &[TxDecisionOp],
    indices: &[usize],
    phase: &P,
    deadline: Instant,
) -> Vec<OpState<P::Answer>> {
    let mut states: Vec<OpState<P::Answer>> =
        (0..ops.len()).map(|_| OpState::Waiting(None)).collect();
    let waiting = |states: &[OpState<P::Answer>]| -> Vec<usize> {
        indices.iter().copied().filter(|&index| states[index].is_waiting()).collect()
    };
    let mut unavailable = UnavailableTables::default();
    let mut backoff = Backoff::for_client();
    let mut pending = waiting(&states);
    while !pending.is_empty() && !phase.settled(&states) && time_left(deadline).is_some() {
        // Every attempt carries the lease: a commit that retries for long keeps it alive.
        inner.lease_agent().renew_if_due(inner.me());
        let batches =
            route(inner, ops, &pending, phase, &mut states, &mut unavailable, deadline).await;
        send(inner, ops, batches, phase, &mut states, deadline).await;
        pending = waiting(&states);
        if !pending.is_empty() && !phase.settled(&states) {
            inner.pause(&mut backoff, deadline).await;
        }
    }
    states
}

/// Groups the ops at `pending` by their master; ops with nowhere to go yet note why, and ops
/// that never will are refused.
async fn route<P: Phase>(
    inner: &Inner,
    ops: &[TxDecisionOp],
    pending: &[usize],
    phase: &P,
    states: &mut [OpState<P::Answer>],
    unavailable: &mut UnavailableTables,
    deadline: Instant,
) -> Vec<Batch> {
    let mut by_master: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &index in pending {
        let op = &ops[index];
        match inner.route(op.table_id, KeyHash(op.key_hash), deadline, unavailable).await {
            Route::Send(tablet) => by_master.entry(tablet.owner_address).or_default().push(index),
            Route::Wait(error) | Route::Recovering(error) => {
                states[index] = OpState::Waiting(Some(error))
            }
            Route::Fail(error) => states[index] = OpState::Refused(error),
        }
    }
    batches(
        by_master,
        |index| phase.op_bytes(index),
        MULTI_OP_ITEMS_MAX,
        TRANSACTION_REQUEST_BYTES_MAX,
    )
}

/// Sends every batch at once, each within the time the phase has left, and judges each op's
/// answer as its request's arrives.
async fn send<P: Phase>(
    inner: &Arc<Inner>,
    ops: &[TxDecisionOp],
    batches: Vec<Batch>,
    phase: &P,
    states: &mut [OpState<P::Answer>],
    deadline: Instant,
) {
    let Some(left) = time_left(deadline) else {
        for batch in &batches {
            for &index in &batch.indices {
                states[index] = OpState::Waiting(Some(out_of_time("the transaction's phase")));
            }
        }
        return;
    };
    let mut calls = tokio::task::JoinSet::new();
    for batch in batches {
        let request = phase.request(&batch.indices);
        let inner = inner.clone();
        calls.spawn(async move {
            let sent = inner.pool().call_within(&batch.address, &request, left).await;
            (batch, sent)
        });
    }
    while let Some(joined) = calls.join_next().await {
        // Nothing cancels these tasks: an error is a panic in the RPC layer, passed on.
        let (batch, sent) =
            joined.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
        judge_batch(inner, ops, &batch, sent, phase, states);
    }
}

/// Judges the answer to one batch, op by op.
fn judge_batch<P: Phase>(
    inner: &Inner,
    ops: &[TxDecisionOp],
    batch: &Batch,
    sent: std::result::Result<(Status, ResponseBody), RpcError>,
    phase: &P,
    states: &mut [OpState<P::Answer>],
) {
    let address = &batch.address;
    match sent {
        Ok((Status::Ok, ResponseBody::Operation(response))) => match phase.answers(response) {
            Some(answers) if answers.len() == batch.indices.len() => {
                for (&index, (status, answer)) in batch.indices.iter().zip(answers) {
                    let table_id = ops[index].table_id;
                    states[index] = if status == Status::Ok {
                        OpState::Answered(answer)
                    } else {
                        let error = Error::new(status, format!("master {address}"));
                        judge_status(inner, table_id, status, error)
                    };
                }
            }
            // An answer that does not fit the request: a broken peer, not retried.
            _ => {
                let message = format!("master {address}: malformed transaction response");
                for &index in &batch.indices {
                    states[index] = OpState::Refused(Error::new(Status::InternalError, &message));
                }
            }
        },
        Ok((Status::Ok, body)) => {
            let message = format!("master {address}: unexpected response {body:?}");
            for &index in &batch.indices {
                states[index] = OpState::Refused(Error::new(Status::InternalError, &message));
            }
        }
        // One status for the whole request (refused, or a master that does not own the
        // tablets): it is each op's.
        Ok((status, body)) => {
            let error = failure(status, body);
            for &index in &batch.indices {
                let table_id = ops[index].table_id;
                states[index] = judge_status(inner, table_id, status, error.clone());
            }
        }
        Err(error) => {
            let failed = Error::new(error.status(), format!("master {address}: {error}"));
            for &index in &batch.indices {
                let table_id = ops[index].table_id;
                states[index] = match inner.judge_transport(table_id, address, &error, false) {
                    Judgement::Retry => OpState::Waiting(Some(failed.clone())),
                    Judgement::Final => OpState::Refused(failed.clone()),
                };
            }
        }
    }
}

/// An op's state after its master answered `status` (not OK) for it.
fn judge_status<T>(inner: &Inner, table_id: TableId, status: Status, error: Error) -> OpState<T> {
    if status == Status::ExpiredLease {
        return OpState::LeaseExpired;
    }
    match inner.judge_status(table_id, status, false) {
        Judgement::Retry => OpState::Waiting(Some(error)),
        Judgement::Final => OpState::Refused(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(address: &str, indices: &[usize]) -> Batch {
        Batch { address: address.to_string(), indices: indices.to_vec() }
    }

    #[test]
    fn ops_are_grouped_by_master_in_the_masters_order() {
        let mut by_master = BTreeMap::new();
        by_master.insert("b:1".to_string(), vec![0, 2]);
        by_master.insert("a:1".to_string(), vec![1, 3, 4]);
        let batches = batches(by_master, |_| 10, 100, 1_000);
        assert_eq!(batches, [batch("a:1", &[1, 3, 4]), batch("b:1", &[0, 2])]);
    }

    #[test]
    fn a_masters_ops_are_split_by_count_and_by_bytes() {
        let mut by_master = BTreeMap::new();
        by_master.insert("a:1".to_string(), (0..7).collect::<Vec<_>>());
        assert_eq!(
            batches(by_master.clone(), |_| 1, 3, 1_000),
            [batch("a:1", &[0, 1, 2]), batch("a:1", &[3, 4, 5]), batch("a:1", &[6])]
        );
        // Op 2 is large: it ends the first request, and alone over the limit it still goes,
        // alone.
        let sizes = [4, 4, 30, 4, 4, 4, 4];
        assert_eq!(
            batches(by_master, |index| sizes[index], 100, 12),
            [
                batch("a:1", &[0, 1]),
                batch("a:1", &[2]),
                batch("a:1", &[3, 4, 5]),
                batch("a:1", &[6]),
            ]
        );
    }
}
