//! Table enumeration with a resumable cursor.
//!
//! Masters return a tablet's objects in ascending order of bit-reversed key hash (then key),
//! an order that does not depend on which master holds the tablet or how big its hash table
//! is. The enumeration keeps a queue of (hash range, cursor) work items, starting with the whole
//! hash space. Each step takes the first item, finds the tablet holding its first hash, and asks
//! that tablet's master for the part of the item inside the tablet; the rest of the item is put
//! back with the *same* cursor, because every object before the cursor in that rest was already
//! returned too. So an object present for the whole enumeration is returned exactly once, even
//! when tablets split or move between calls.

use std::collections::VecDeque;

use stratus_rpc::Backoff;
use stratus_types::limits::ENUMERATE_RESPONSE_BYTES_MAX;
use stratus_types::{HashRange, KeyHash, TableId};
use stratus_wire::{EnumeratedObject, EnumerationCursor, Request, Response, ResponseBody, Status};

use crate::client::{
    failure, operation_deadline, out_of_time, time_left, Attempt, Client, Route, UnavailableTables,
};
use crate::error::Result;

/// An enumeration in progress; see [`Client::enumerate`].
#[derive(Debug)]
pub struct Enumeration {
    client: Client,
    table_id: TableId,
    work: VecDeque<(HashRange, EnumerationCursor)>,
    batch_bytes: u32,
}

impl Enumeration {
    pub(crate) fn new(client: Client, table_id: TableId) -> Enumeration {
        let mut work = VecDeque::new();
        work.push_back((HashRange::FULL, EnumerationCursor::default()));
        Enumeration { client, table_id, work, batch_bytes: ENUMERATE_RESPONSE_BYTES_MAX as u32 }
    }

    /// Asks masters for at most `bytes` of objects per response (they always return at least
    /// one object when one remains). Smaller batches mean more round trips.
    pub fn with_batch_bytes(mut self, bytes: u32) -> Enumeration {
        self.batch_bytes = bytes.max(1);
        self
    }

    /// The next non-empty batch of objects, or `None` when the table is exhausted.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<EnumeratedObject>>> {
        while let Some((range, cursor)) = self.work.pop_front() {
            let objects = self.step(range, cursor).await?;
            if !objects.is_empty() {
                return Ok(Some(objects));
            }
        }
        Ok(None)
    }

    /// Every remaining object.
    pub async fn collect_all(mut self) -> Result<Vec<EnumeratedObject>> {
        let mut all = Vec::new();
        while let Some(batch) = self.next_batch().await? {
            all.extend(batch);
        }
        Ok(all)
    }

    /// One request's worth of the work item (`range`, `cursor`): the objects of its part in
    /// the tablet holding its first hash, the rest put back in the queue. Retried as a
    /// single-object read would be (the same route and the same judgement of each attempt),
    /// within one operation timeout.
    async fn step(
        &mut self,
        range: HashRange,
        cursor: EnumerationCursor,
    ) -> Result<Vec<EnumeratedObject>> {
        let inner = self.client.inner.clone();
        let deadline = operation_deadline(inner.config().operation_timeout);
        let mut backoff = Backoff::for_client();
        let mut unavailable = UnavailableTables::default();
        loop {
            let hash = KeyHash(range.start);
            let routed = match inner.route(self.table_id, hash, deadline, &mut unavailable).await {
                // One tablet at a time: waiting for its recovery holds nothing else back.
                Route::Recovering(error) => {
                    inner.await_recovery(self.table_id, hash, deadline, error, None).await
                }
                routed => routed,
            };
            let error = match routed {
                Route::Fail(error) => return Err(error),
                Route::Wait(error) | Route::Recovering(error) => error,
                Route::Send(tablet) => {
                    let part = range.intersection(&tablet.range).unwrap_or(range);
                    let request = Request::Enumerate {
                        table_id: self.table_id,
                        range: part,
                        cursor: cursor.clone(),
                        bytes_max: self.batch_bytes,
                    };
                    let address = &tablet.owner_address;
                    let Some(left) = time_left(deadline) else {
                        return Err(out_of_time(&format!("master {address}")));
                    };
                    match inner.send_once(self.table_id, address, &request, left).await {
                        Attempt::Finished(Ok((
                            Status::Ok,
                            ResponseBody::Operation(Response::Enumerate { objects, next }),
                        ))) => {
                            self.put_back(range, part, cursor, next);
                            return Ok(objects);
                        }
                        Attempt::Finished(Ok((status, body))) => return Err(failure(status, body)),
                        Attempt::Finished(Err(error)) => return Err(error),
                        Attempt::Retry(error) | Attempt::Unreachable(error) => error,
                    }
                }
            };
            if time_left(deadline).is_none() {
                return Err(error);
            }
            inner.pause(&mut backoff, deadline).await;
        }
    }

    /// After a step returned the objects of `part` (of the work item `range`) up to `next`:
    /// the rest of `part` from `next` goes first, then the rest of `range` past `part` with
    /// the step's own cursor.
    fn put_back(
        &mut self,
        range: HashRange,
        part: HashRange,
        cursor: EnumerationCursor,
        next: Option<EnumerationCursor>,
    ) {
        if part.end < range.end {
            let rest = HashRange { start: part.end + 1, end: range.end };
            self.work.push_front((rest, cursor));
        }
        if let Some(next) = next {
            self.work.push_front((part, next));
        }
    }
}
