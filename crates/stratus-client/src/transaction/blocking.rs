//! The blocking twin of [`Transaction`]: the same transaction, each call run to its end on the
//! blocking client's runtime.

use std::time::Instant;

use bytes::Bytes;
use stratus_types::TableId;

use super::retry::ConflictRetries;
use super::{AbortReason, Transaction, TransactionError, TxOutcome};
use crate::blocking::BlockingClient;
use crate::error::Result;

/// A transaction of a [`BlockingClient`]: see [`Transaction`], whose calls these are.
#[derive(Debug)]
pub struct BlockingTransaction<'client> {
    client: &'client BlockingClient,
    transaction: Transaction,
}

impl BlockingClient {
    /// Starts a transaction (see [`Client::transaction`](crate::Client::transaction)).
    pub fn transaction(&self) -> BlockingTransaction<'_> {
        BlockingTransaction { client: self, transaction: self.async_client().transaction() }
    }

    /// See [`Client::settle_transactions`](crate::Client::settle_transactions).
    pub fn settle_transactions(&self, timeout: std::time::Duration) -> bool {
        self.block_on(self.async_client().settle_transactions(timeout))
    }

    /// Runs `body` on a fresh transaction and commits it, again after a conflict, as
    /// [`Client::run_transaction`](crate::Client::run_transaction) does.
    pub fn run_transaction<T>(
        &self,
        mut body: impl FnMut(&BlockingTransaction<'_>) -> Result<T>,
    ) -> std::result::Result<T, TransactionError> {
        let started = Instant::now();
        let client = self.async_client();
        let mut retries = ConflictRetries::new(client.config().operation_timeout);
        loop {
            let transaction = self.transaction();
            let value = body(&transaction)?;
            let reason = match transaction.commit()? {
                TxOutcome::Committed => return Ok(value),
                TxOutcome::Aborted(reason) => reason,
            };
            let pause = match reason {
                AbortReason::Conflict { .. } => {
                    retries.next_pause(client.inner.entropy(), started.elapsed())
                }
                AbortReason::Timeout => None,
            };
            match pause {
                Some(pause) => std::thread::sleep(pause),
                None => return Err(TransactionError::Aborted(reason)),
            }
        }
    }
}

impl BlockingTransaction<'_> {
    /// See [`Transaction::read`].
    pub fn read(&self, table_id: TableId, key: &[u8]) -> Result<Option<Bytes>> {
        self.client.block_on(self.transaction.read(table_id, key))
    }

    /// See [`Transaction::read_many`].
    pub fn read_many(&self, objects: &[(TableId, &[u8])]) -> Result<Vec<Option<Bytes>>> {
        self.client.block_on(self.transaction.read_many(objects))
    }

    /// See [`Transaction::write`].
    pub fn write(&self, table_id: TableId, key: &[u8], value: &[u8]) -> Result<()> {
        self.transaction.write(table_id, key, value)
    }

    /// See [`Transaction::remove`].
    pub fn remove(&self, table_id: TableId, key: &[u8]) -> Result<()> {
        self.transaction.remove(table_id, key)
    }

    /// See [`Transaction::increment`].
    pub fn increment(&self, table_id: TableId, key: &[u8], delta: i64) -> Result<i64> {
        self.client.block_on(self.transaction.increment(table_id, key, delta))
    }

    /// See [`Transaction::commit`].
    pub fn commit(self) -> Result<TxOutcome> {
        self.client.block_on(self.transaction.commit())
    }
}
