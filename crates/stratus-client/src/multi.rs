//! Multi-operations: many objects in one call. Items are grouped by master and sent as one
//! request per master (at most [`MULTI_OP_ITEMS_MAX`] items each), all in parallel, in rounds
//! until every item has an outcome or the operation's deadline passes; each item gets its own
//! result, in the caller's order.
//!
//! Each item is treated as a single-object request of its own would be: [`Inner::route`]
//! finds its master (or says to wait: a recovering tablet, a map that cannot be fetched), and
//! [`Inner::judge_status`] and [`Inner::judge_transport`] — the retry policy single-object
//! requests use too — decide whether it goes again and drop the cached map and connection
//! where the outcome shows them stale. Every request is bounded by the time the operation has
//! left, and every pause ends at its deadline.
//!
//! Each item of a mutating multi-operation of an exactly-once client has its own ticket (its
//! own rpc id), which every attempt of the item carries whichever master it goes to and
//! whichever items it travels with.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use stratus_rpc::{Backoff, RpcError};
use stratus_types::limits::MULTI_OP_ITEMS_MAX;
use stratus_types::{key_hash, RpcIdentity, TableId, Version};
use stratus_wire::{
    IncrementItem, KeyItem, RemoveItem, Request, Response, ResponseBody, Status, WriteItem,
};
use tokio::time::Instant;

use crate::client::{
    check_key, failure, lease_lost_error, may_have_run, operation_deadline, out_of_time, time_left,
    Inner, Judgement, Route, UnavailableTables,
};
use crate::error::{Error, Result};
use crate::exactly_once::RpcTicket;

/// The items of one multi-operation, all of one kind.
#[derive(Clone, Debug)]
pub(crate) enum MultiItems {
    Read(Vec<KeyItem>),
    Write(Vec<WriteItem>),
    Remove(Vec<RemoveItem>),
    Increment(Vec<IncrementItem>),
}

/// Value, version and integer of a finished item (unused parts are empty or zero).
pub(crate) type ItemOutcome = Result<(Bytes, Version, i64)>;

impl MultiItems {
    fn len(&self) -> usize {
        match self {
            MultiItems::Read(items) => items.len(),
            MultiItems::Remove(items) => items.len(),
            MultiItems::Write(items) => items.len(),
            MultiItems::Increment(items) => items.len(),
        }
    }

    fn table_and_key(&self, index: usize) -> (TableId, &Bytes) {
        match self {
            MultiItems::Read(items) => (items[index].table_id, &items[index].key),
            MultiItems::Remove(items) => (items[index].table_id, &items[index].key),
            MultiItems::Write(items) => (items[index].table_id, &items[index].key),
            MultiItems::Increment(items) => (items[index].table_id, &items[index].key),
        }
    }

    /// Whether the items change objects.
    fn are_mutations(&self) -> bool {
        !matches!(self, MultiItems::Read(_))
    }

    /// Sets (or clears) the exactly-once identity of item `index`.
    fn set_identity(&mut self, index: usize, identity: Option<RpcIdentity>) {
        match self {
            MultiItems::Read(_) => {}
            MultiItems::Remove(items) => items[index].rpc = identity,
            MultiItems::Write(items) => items[index].rpc = identity,
            MultiItems::Increment(items) => items[index].rpc = identity,
        }
    }

    /// The request carrying the items at `indices`.
    fn request(&self, indices: &[usize]) -> Request {
        fn pick<T: Clone>(items: &[T], indices: &[usize]) -> Vec<T> {
            indices.iter().map(|&index| items[index].clone()).collect()
        }
        match self {
            MultiItems::Read(items) => Request::MultiRead { items: pick(items, indices) },
            MultiItems::Write(items) => Request::MultiWrite { items: pick(items, indices) },
            MultiItems::Remove(items) => Request::MultiRemove { items: pick(items, indices) },
            MultiItems::Increment(items) => Request::MultiIncrement { items: pick(items, indices) },
        }
    }
}

/// Per-item (status, outcome) from a multi-operation response.
fn item_results(response: Response) -> Option<Vec<(Status, ItemOutcome)>> {
    let convert = |status: Status, version: Version, ok: (Bytes, Version, i64)| {
        if status == Status::Ok {
            (status, Ok(ok))
        } else {
            (status, Err(Error::with_version(status, version)))
        }
    };
    match response {
        Response::MultiRead { results } => Some(
            results
                .into_iter()
                .map(|item| convert(item.status, item.version, (item.value, item.version, 0)))
                .collect(),
        ),
        Response::MultiWrite { results } | Response::MultiRemove { results } => Some(
            results
                .into_iter()
                .map(|item| convert(item.status, item.version, (Bytes::new(), item.version, 0)))
                .collect(),
        ),
        Response::MultiIncrement { results } => Some(
            results
                .into_iter()
                .map(|item| {
                    convert(item.status, item.version, (Bytes::new(), item.version, item.value))
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Where each item of a multi-operation stands.
struct Progress {
    /// The outcome of each item that has one.
    outcomes: Vec<Option<ItemOutcome>>,
    /// For each item without an outcome, the failure of its last attempt (what it reports if
    /// the deadline passes first).
    last_failures: Vec<Option<Error>>,
    /// Each item's exactly-once ticket (mutations of an exactly-once client), held until
    /// the item ends.
    tickets: Vec<Option<RpcTicket>>,
    /// Whether an attempt of the item may have been applied.
    may_have_run: Vec<bool>,
    /// Items whose lease a master said expired before any attempt may have been applied:
    /// they take a new ticket before the next round.
    lease_expired: Vec<usize>,
}

impl Progress {
    /// Every item pending, but those whose key no request may carry.
    fn new(items: &MultiItems) -> Progress {
        let count = items.len();
        let mut progress = Progress {
            outcomes: vec![None; count],
            last_failures: vec![None; count],
            tickets: (0..count).map(|_| None).collect(),
            may_have_run: vec![false; count],
            lease_expired: Vec::new(),
        };
        for index in 0..count {
            if let Err(error) = check_key(items.table_and_key(index).1) {
                progress.finish(index, Err(error));
            }
        }
        progress
    }

    fn pending(&self) -> Vec<usize> {
        (0..self.outcomes.len()).filter(|&index| self.outcomes[index].is_none()).collect()
    }

    fn is_done(&self) -> bool {
        self.outcomes.iter().all(Option::is_some)
    }

    /// The item's outcome, final; its ticket is given back (acknowledged).
    fn finish(&mut self, index: usize, outcome: ItemOutcome) {
        debug_assert!(self.outcomes[index].is_none(), "item {index} finished twice");
        self.outcomes[index] = Some(outcome);
        self.last_failures[index] = None;
        self.tickets[index] = None;
    }

    /// The item failed in a way that another attempt may cure.
    fn failed(&mut self, index: usize, error: Error) {
        self.may_have_run[index] |= may_have_run(&error);
        self.last_failures[index] = Some(error);
    }

    /// One result per item: its outcome, or the failure of its last attempt.
    fn into_outcomes(self) -> Vec<ItemOutcome> {
        self.outcomes
            .into_iter()
            .zip(self.last_failures)
            .map(|(outcome, failed)| {
                outcome.unwrap_or_else(|| {
                    Err(failed.unwrap_or_else(|| out_of_time("the multi-operation")))
                })
            })
            .collect()
    }
}

/// The items of one request to one master.
struct Batch {
    address: String,
    indices: Vec<usize>,
}

impl Inner {
    /// Runs a multi-operation: rounds of routing the items still pending, sending one request
    /// per master, and judging each item's outcome, with a pause between rounds, until every
    /// item has an outcome or the operation's deadline passes.
    pub(crate) async fn multi(self: Arc<Self>, mut items: MultiItems) -> Vec<ItemOutcome> {
        let deadline = operation_deadline(self.config().operation_timeout);
        let mut progress = Progress::new(&items);
        let mut unavailable = UnavailableTables::default();
        let mut backoff = Backoff::for_client();
        let exactly_once = self.config().exactly_once && items.are_mutations();
        if exactly_once {
            progress.lease_expired = progress.pending();
        }
        while !progress.is_done() {
            if exactly_once {
                self.ticket_items(&mut items, &mut progress, deadline).await;
                if progress.is_done() {
                    break;
                }
            }
            let batches =
                self.route_pending(&items, &mut progress, &mut unavailable, deadline).await;
            self.send_batches(&items, batches, &mut progress, deadline).await;
            if progress.is_done() || Instant::now() >= deadline {
                break;
            }
            self.pause(&mut backoff, deadline).await;
        }
        progress.into_outcomes()
    }

    /// Gives each item that needs one a ticket (at the start, and after its lease expired),
    /// and every pending item its identity as it stands now (the acknowledged mark grows).
    async fn ticket_items(
        &self,
        items: &mut MultiItems,
        progress: &mut Progress,
        deadline: Instant,
    ) {
        for index in std::mem::take(&mut progress.lease_expired) {
            if let Some(old) = progress.tickets[index].take() {
                self.lease_agent().lost(old.lease());
            }
            if progress.may_have_run[index] {
                progress.finish(index, Err(lease_lost_error()));
                continue;
            }
            match self.lease_agent().ticket(self, deadline).await {
                Ok(ticket) => progress.tickets[index] = Some(ticket),
                Err(error) => progress.finish(index, Err(error)),
            }
        }
        self.lease_agent().renew_if_due(self.me());
        for index in progress.pending() {
            let identity = progress.tickets[index].as_ref().map(RpcTicket::identity);
            items.set_identity(index, identity);
        }
    }

    /// Groups the pending items by the master their tablet names; items with nowhere to go
    /// yet note why, and items that never will have their outcome.
    async fn route_pending(
        &self,
        items: &MultiItems,
        progress: &mut Progress,
        unavailable: &mut UnavailableTables,
        deadline: Instant,
    ) -> Vec<Batch> {
        let mut by_master: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for index in progress.pending() {
            let (table_id, key) = items.table_and_key(index);
            match self.route(table_id, key_hash(table_id, key), deadline, unavailable).await {
                Route::Send(tablet) => {
                    by_master.entry(tablet.owner_address).or_default().push(index)
                }
                Route::Wait(error) | Route::Recovering(error) => progress.failed(index, error),
                Route::Fail(error) => progress.finish(index, Err(error)),
            }
        }
        let mut batches = Vec::new();
        for (address, indices) in by_master {
            for chunk in indices.chunks(MULTI_OP_ITEMS_MAX) {
                batches.push(Batch { address: address.clone(), indices: chunk.to_vec() });
            }
        }
        batches
    }

    /// Sends every batch at once, each within the time the operation has left, and judges
    /// each item's outcome as its answer arrives.
    async fn send_batches(
        self: &Arc<Self>,
        items: &MultiItems,
        batches: Vec<Batch>,
        progress: &mut Progress,
        deadline: Instant,
    ) {
        // Out of time: nothing is sent, each item keeps the failure it has.
        let Some(left) = time_left(deadline) else { return };
        let mut calls = tokio::task::JoinSet::new();
        for batch in batches {
            let request = items.request(&batch.indices);
            let inner = self.clone();
            calls.spawn(async move {
                let sent = inner.pool().call_within(&batch.address, &request, left).await;
                (batch, sent)
            });
        }
        while let Some(joined) = calls.join_next().await {
            // Nothing cancels these tasks: an error is a panic in the RPC layer, passed on.
            let (batch, sent) =
                joined.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
            self.judge_batch(items, &batch, sent, progress);
        }
    }

    /// Judges the answer to one batch, item by item.
    fn judge_batch(
        &self,
        items: &MultiItems,
        batch: &Batch,
        sent: std::result::Result<(Status, ResponseBody), RpcError>,
        progress: &mut Progress,
    ) {
        match sent {
            Ok((Status::Ok, ResponseBody::Operation(response))) => match item_results(response) {
                Some(results) if results.len() == batch.indices.len() => {
                    for (&index, (status, outcome)) in batch.indices.iter().zip(results) {
                        self.judge_item(items, index, status, outcome, progress);
                    }
                }
                _ => self.malformed_answer(batch, progress),
            },
            Ok((Status::Ok, _)) => self.malformed_answer(batch, progress),
            // One status for the whole request (refused, or a master that does not own the
            // tablets): it is each item's.
            Ok((status, body)) => {
                let error = failure(status, body);
                for &index in &batch.indices {
                    self.judge_item(items, index, status, Err(error.clone()), progress);
                }
            }
            Err(error) => {
                let failed =
                    Error::new(error.status(), format!("master {}: {error}", batch.address));
                let mutation = items.are_mutations() && !self.config().exactly_once;
                for &index in &batch.indices {
                    let table_id = items.table_and_key(index).0;
                    match self.judge_transport(table_id, &batch.address, &error, mutation) {
                        Judgement::Retry => progress.failed(index, failed.clone()),
                        Judgement::Final => progress.finish(index, Err(failed.clone())),
                    }
                }
            }
        }
    }

    /// Judges one item's status as a single-object request's would be judged.
    fn judge_item(
        &self,
        items: &MultiItems,
        index: usize,
        status: Status,
        outcome: ItemOutcome,
        progress: &mut Progress,
    ) {
        let table_id = items.table_and_key(index).0;
        if status == Status::ExpiredLease && progress.tickets[index].is_some() {
            progress.lease_expired.push(index);
            return;
        }
        let unprotected = items.are_mutations() && !self.config().exactly_once;
        match (self.judge_status(table_id, status, unprotected), outcome) {
            (Judgement::Retry, Err(error)) => progress.failed(index, error),
            (Judgement::Retry, Ok(_)) => unreachable!("an OK item is never retried"),
            (Judgement::Final, outcome) => progress.finish(index, outcome),
        }
    }

    /// An answer that does not fit the request: a broken peer, not retried (the master may
    /// have applied the items).
    fn malformed_answer(&self, batch: &Batch, progress: &mut Progress) {
        let message = format!("master {}: malformed multi-operation response", batch.address);
        let error = Error::new(Status::InternalError, message);
        for &index in &batch.indices {
            progress.finish(index, Err(error.clone()));
        }
    }
}
