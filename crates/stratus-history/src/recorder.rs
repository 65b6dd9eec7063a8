//! Recording: a thread-safe log of operations, and a client wrapper that records every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use stratus_client::{Client, Error, IncrementItem, KeyItem, Result, WriteItem};
use stratus_types::{RejectRules, TableId, Version};

use crate::history::{History, Operation, OperationRecord, Outcome};

/// Collects operations from any number of threads.
///
/// Invocation and completion stamps come from one sequentially consistent counter: if one call
/// completes before another is invoked (in real time, on any threads), its completion stamp is
/// smaller. That is the only property linearizability needs of time, and it costs one atomic
/// add per event instead of a clock read.
#[derive(Debug, Default)]
pub struct Recorder {
    clock: AtomicU64,
    operations: Mutex<Vec<OperationRecord>>,
    /// Operations recorded as items of multi-operations.
    multi_operation_items: AtomicU64,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    /// A fresh logical time, larger than every one handed out before.
    pub fn tick(&self) -> u64 {
        // Starts at 1 so that 0 never names an event.
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Adds a finished operation.
    pub fn record(&self, operation: OperationRecord) {
        assert!(operation.invoked < operation.completed, "completion precedes invocation");
        self.lock().push(operation);
    }

    /// Every operation recorded so far, ordered by invocation.
    pub fn history(&self) -> History {
        let mut operations = self.lock().clone();
        operations.sort_by_key(|operation| operation.invoked);
        History { operations }
    }

    /// Of the operations recorded so far (or about to be), those that were items of
    /// multi-operations.
    pub fn multi_operation_items(&self) -> u64 {
        self.multi_operation_items.load(Ordering::SeqCst)
    }

    /// Number of operations recorded so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<OperationRecord>> {
        // A panic while pushing cannot leave the vector half-changed, so a poisoned lock still
        // holds a consistent history.
        self.operations.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A [`Client`] whose object calls are recorded, as one sequential client of the history
/// (give each concurrent task its own `client_id`). A multi-operation is recorded item by
/// item: each item is an operation on its key, invoked before the call and completed after
/// it, with the item's own outcome.
#[derive(Clone, Debug)]
pub struct RecordingClient {
    client: Client,
    recorder: Arc<Recorder>,
    client_id: u32,
}

/// Maps a failed call to its outcome: an object refusal is known to have had no effect; any
/// other failure may hide an attempt that took effect (the client retries transparently).
fn failure_outcome(error: &Error) -> Outcome {
    if Outcome::is_refusal(error.status) {
        Outcome::Refused { status: error.status, version: error.version }
    } else {
        Outcome::Unknown { status: error.status }
    }
}

impl RecordingClient {
    /// Records the calls made through `client` into `recorder` as client `client_id`.
    pub fn new(client: Client, recorder: Arc<Recorder>, client_id: u32) -> RecordingClient {
        RecordingClient { client, recorder, client_id }
    }

    /// The wrapped client (calls made on it directly are not recorded).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Reads an object subject to reject rules (see [`Client::read_with`]).
    pub async fn read_with(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<(Bytes, Version)> {
        let invoked = self.recorder.tick();
        let result = self.client.read_with(table_id, key, rules).await;
        let outcome = match &result {
            Ok((value, version)) => Outcome::Read { value: value.clone(), version: *version },
            Err(error) => failure_outcome(error),
        };
        self.finish(table_id, key, Operation::Read { rules }, invoked, outcome);
        result
    }

    /// Reads an object.
    pub async fn read(&self, table_id: TableId, key: &[u8]) -> Result<(Bytes, Version)> {
        self.read_with(table_id, key, RejectRules::NONE).await
    }

    /// Writes an object subject to reject rules (see [`Client::write_with`]).
    pub async fn write_with(
        &self,
        table_id: TableId,
        key: &[u8],
        value: Bytes,
        rules: RejectRules,
    ) -> Result<Version> {
        let operation = Operation::Write { value: value.clone(), rules };
        let invoked = self.recorder.tick();
        let result = self.client.write_with(table_id, key, value, rules).await;
        let outcome = match &result {
            Ok(version) => Outcome::Written { version: *version },
            Err(error) => failure_outcome(error),
        };
        self.finish(table_id, key, operation, invoked, outcome);
        result
    }

    /// Writes an object.
    pub async fn write(&self, table_id: TableId, key: &[u8], value: &[u8]) -> Result<Version> {
        self.write_with(table_id, key, Bytes::copy_from_slice(value), RejectRules::NONE).await
    }

    /// Removes an object subject to reject rules (see [`Client::remove_with`]).
    pub async fn remove_with(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<Version> {
        let invoked = self.recorder.tick();
        let result = self.client.remove_with(table_id, key, rules).await;
        let outcome = match &result {
            Ok(version) => Outcome::Removed { version: *version },
            Err(error) => failure_outcome(error),
        };
        self.finish(table_id, key, Operation::Remove { rules }, invoked, outcome);
        result
    }

    /// Removes an object.
    pub async fn remove(&self, table_id: TableId, key: &[u8]) -> Result<Version> {
        self.remove_with(table_id, key, RejectRules::NONE).await
    }

    /// Increments an object subject to reject rules (see [`Client::increment_with`]).
    pub async fn increment_with(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version)> {
        let invoked = self.recorder.tick();
        let result = self.client.increment_with(table_id, key, delta, rules).await;
        let outcome = match &result {
            Ok((value, version)) => Outcome::Incremented { value: *value, version: *version },
            Err(error) => failure_outcome(error),
        };
        self.finish(table_id, key, Operation::Increment { delta, rules }, invoked, outcome);
        result
    }

    /// Increments an object.
    pub async fn increment(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
    ) -> Result<(i64, Version)> {
        self.increment_with(table_id, key, delta, RejectRules::NONE).await
    }

    /// Reads many objects (see [`Client::multi_read`]); each item is recorded as a read.
    pub async fn multi_read(&self, items: &[KeyItem]) -> Vec<Result<(Bytes, Version)>> {
        let invoked = self.invoke_items(items.len());
        let results = self.client.multi_read(items).await;
        for ((item, result), invoked) in items.iter().zip(&results).zip(invoked) {
            let outcome = match result {
                Ok((value, version)) => Outcome::Read { value: value.clone(), version: *version },
                Err(error) => failure_outcome(error),
            };
            let operation = Operation::Read { rules: item.rules };
            self.finish(item.table_id, &item.key, operation, invoked, outcome);
        }
        results
    }

    /// Writes many objects (see [`Client::multi_write`]); each item is recorded as a write.
    pub async fn multi_write(&self, items: &[WriteItem]) -> Vec<Result<Version>> {
        let invoked = self.invoke_items(items.len());
        let results = self.client.multi_write(items).await;
        for ((item, result), invoked) in items.iter().zip(&results).zip(invoked) {
            let outcome = match result {
                Ok(version) => Outcome::Written { version: *version },
                Err(error) => failure_outcome(error),
            };
            let operation = Operation::Write { value: item.value.clone(), rules: item.rules };
            self.finish(item.table_id, &item.key, operation, invoked, outcome);
        }
        results
    }

    /// Removes many objects (see [`Client::multi_remove`]); each item is recorded as a remove.
    pub async fn multi_remove(&self, items: &[KeyItem]) -> Vec<Result<Version>> {
        let invoked = self.invoke_items(items.len());
        let results = self.client.multi_remove(items).await;
        for ((item, result), invoked) in items.iter().zip(&results).zip(invoked) {
            let outcome = match result {
                Ok(version) => Outcome::Removed { version: *version },
                Err(error) => failure_outcome(error),
            };
            let operation = Operation::Remove { rules: item.rules };
            self.finish(item.table_id, &item.key, operation, invoked, outcome);
        }
        results
    }

    /// Increments many objects (see [`Client::multi_increment`]); each item is recorded as an
    /// increment.
    pub async fn multi_increment(&self, items: &[IncrementItem]) -> Vec<Result<(i64, Version)>> {
        let invoked = self.invoke_items(items.len());
        let results = self.client.multi_increment(items).await;
        for ((item, result), invoked) in items.iter().zip(&results).zip(invoked) {
            let outcome = match result {
                Ok((value, version)) => Outcome::Incremented { value: *value, version: *version },
                Err(error) => failure_outcome(error),
            };
            let operation = Operation::Increment { delta: item.delta, rules: item.rules };
            self.finish(item.table_id, &item.key, operation, invoked, outcome);
        }
        results
    }

    /// Invocation stamps for the `count` items of a multi-operation about to start (one
    /// each, so that each has its own id).
    fn invoke_items(&self, count: usize) -> Vec<u64> {
        self.recorder.multi_operation_items.fetch_add(count as u64, Ordering::SeqCst);
        (0..count).map(|_| self.recorder.tick()).collect()
    }

    fn finish(
        &self,
        table: TableId,
        key: &[u8],
        operation: Operation,
        invoked: u64,
        outcome: Outcome,
    ) {
        let completed = self.recorder.tick();
        self.recorder.record(OperationRecord {
            id: invoked,
            client: self.client_id,
            table,
            key: Bytes::copy_from_slice(key),
            operation,
            invoked,
            completed,
            outcome,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use stratus_client::Status;

    #[test]
    fn ticks_increase_across_threads_and_history_is_ordered_by_invocation() {
        let recorder = Recorder::new();
        let threads: Vec<_> = (0..4u32)
            .map(|client| {
                let recorder = recorder.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..1000 {
                        let invoked = recorder.tick();
                        let completed = recorder.tick();
                        assert!(last < invoked && invoked < completed, "ticks increase");
                        last = completed;
                        recorder.record(OperationRecord {
                            id: invoked,
                            client,
                            table: TableId(1),
                            key: Bytes::from_static(b"k"),
                            operation: Operation::Read { rules: RejectRules::NONE },
                            invoked,
                            completed,
                            outcome: Outcome::Unknown { status: Status::Timeout },
                        });
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("recording thread");
        }
        let history = recorder.history();
        assert_eq!(history.len(), 4000);
        assert!(history.operations.windows(2).all(|pair| pair[0].invoked < pair[1].invoked));
    }

    #[test]
    fn failures_map_to_refusals_or_unknown_outcomes() {
        let refusal = Error::with_version(Status::WrongVersion, Version(7));
        assert_eq!(
            failure_outcome(&refusal),
            Outcome::Refused { status: Status::WrongVersion, version: Version(7) }
        );
        // A timeout or a lost connection may hide an attempt that took effect.
        for status in [Status::Timeout, Status::CouldntConnect, Status::InternalError] {
            let error = Error::new(status, "");
            assert_eq!(failure_outcome(&error), Outcome::Unknown { status });
        }
    }
}
