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
use stratus_types::{HashRange, KeyHash, TableId, TabletState};
use stratus_wire::{EnumeratedObject, EnumerationCursor, Request, Response, ResponseBody, Status};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};

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

    async fn step(
        &mut self,
        range: HashRange,
        cursor: EnumerationCursor,
    ) -> Result<Vec<EnumeratedObject>> {
        let inner = &self.client.inner;
        let deadline = Instant::now() + inner.config().operation_timeout;
        let mut backoff = Backoff::for_client();
        // Whether the map was fetched afresh after it said the tablet is unavailable.
        let mut unavailable_confirmed = false;
        loop {
            let last = match inner.locate(self.table_id, KeyHash(range.start), deadline).await {
                Err(error) if error.status == Status::TableDoesntExist => return Err(error),
                Err(error) => error,
                // Its owner may be gone (the address may even be empty): wait for recovery.
                Ok(tablet) if tablet.state == TabletState::Unavailable => {
                    // A cached map may be old (the loss accepted since): ask once more.
                    inner.forget_table(self.table_id);
                    if unavailable_confirmed {
                        return Err(crate::client::unavailable_error(&tablet));
                    }
                    unavailable_confirmed = true;
                    continue;
                }
                Ok(tablet) if tablet.state == TabletState::Recovering => {
                    inner.forget_table(self.table_id);
                    crate::client::recovering_error(&tablet)
                }
                Ok(tablet) => {
                    let part = range.intersection(&tablet.range).unwrap_or(range);
                    let request = Request::Enumerate {
                        table_id: self.table_id,
                        range: part,
                        cursor: cursor.clone(),
                        bytes_max: self.batch_bytes,
                    };
                    match inner.enumerate_call(&tablet.owner_address, &request).await {
                        Ok((
                            Status::Ok,
                            ResponseBody::Operation(Response::Enumerate { objects, next }),
                        )) => {
                            if part.end < range.end {
                                let rest = HashRange { start: part.end + 1, end: range.end };
                                self.work.push_front((rest, cursor));
                            }
                            if let Some(next) = next {
                                self.work.push_front((part, next));
                            }
                            return Ok(objects);
                        }
                        Ok((status, ResponseBody::Error { message }))
                            if matches!(
                                status,
                                Status::UnknownTablet | Status::WrongServer | Status::Retry
                            ) =>
                        {
                            inner.forget_table(self.table_id);
                            Error::new(status, message)
                        }
                        Ok((status, body)) => return Err(Error::new(status, format!("{body:?}"))),
                        Err(error) => {
                            inner.forget_table(self.table_id);
                            error
                        }
                    }
                }
            };
            if Instant::now() >= deadline {
                return Err(last);
            }
            tokio::time::sleep(backoff.next_delay(inner.entropy())).await;
        }
    }
}
