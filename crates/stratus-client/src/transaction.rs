//! Multi-object transactions (docs/design/transactions.md): strictly serializable reads and
//! writes of objects on any masters, committed by the client with two rounds of requests.
//!
//! How a [`Transaction`] reads, buffers and commits is in its own documentation.
//!
//! Split by concern: [`buffer`] holds what a transaction read and wrote, and its limits;
//! [`commit`] prepares and reports; [`finish`] makes votes final, decides and delivers the
//! decision (for a commit, and for a participant finishing another client's transaction:
//! [`Client::finish_transaction`]); [`fanout`] sends one phase's requests to the masters and
//! judges each op's answer; [`retry`] is the policy of [`Client::run_transaction`];
//! [`blocking`] is the blocking twin.

mod blocking;
mod buffer;
mod commit;
mod fanout;
mod finish;
mod retry;

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use stratus_types::{RejectRules, TableId, Version};
use stratus_wire::{Request, Status};

pub use blocking::BlockingTransaction;

use crate::client::{check_key, read_result, Client};
use crate::error::{Error, Result};
use buffer::{ObjectKey, Seen, TxBuffer};
use retry::ConflictRetries;

/// How a commit ended, when its outcome is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    /// Every op was prepared: the transaction's writes are applied, as of one instant
    /// between the call of [`Transaction::commit`] and its return.
    Committed,
    /// Nothing of the transaction was applied, and nothing will be.
    Aborted(AbortReason),
}

/// Why a transaction aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// The object changed since the transaction read it, or another transaction held it
    /// (its master voted ABORT). Running the transaction again may commit:
    /// [`Client::run_transaction`] does.
    Conflict {
        /// The object's table.
        table: TableId,
        /// The object's key.
        key: Bytes,
    },
    /// Not every vote could be learnt by the operation's deadline (a master could not be
    /// reached, or answered RETRY throughout); the client then asked the masters of the ops
    /// without a vote for their final votes (TX_REQUEST_ABORT, which records ABORT for an op
    /// that had not voted), and not every one was PREPARED, so the transaction can never
    /// commit.
    Timeout,
}

/// Why [`Client::run_transaction`] returned without a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransactionError {
    /// The last attempt aborted: for a conflict, every attempt the retry policy allows did.
    Aborted(AbortReason),
    /// The body or the commit failed (see [`Transaction::commit`] for what a commit's error
    /// says about its outcome).
    Failed(Error),
}

impl From<Error> for TransactionError {
    fn from(error: Error) -> TransactionError {
        TransactionError::Failed(error)
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::Conflict { table, key } => write!(
                f,
                "conflict on key {} of table {table}: it changed since the transaction read it, \
                 or another transaction held it",
                String::from_utf8_lossy(key)
            ),
            AbortReason::Timeout => f.write_str(
                "not every participant's vote could be learnt in time, and one made final \
                 then was ABORT",
            ),
        }
    }
}

impl fmt::Display for TransactionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransactionError::Aborted(reason) => write!(f, "transaction aborted: {reason}"),
            TransactionError::Failed(error) => write!(f, "transaction failed: {error}"),
        }
    }
}

impl std::error::Error for TransactionError {}

/// A multi-object transaction (docs/design/transactions.md): strictly serializable reads
/// and writes of objects on any masters. Cheap to clone; clones are handles to the same
/// transaction (so the body of [`Client::run_transaction`] can own one), and each may be used
/// from any task.
///
/// A transaction reads through the ordinary read path and remembers the version of every
/// object it read (the first read of an object is the one the transaction sees: reading it
/// again returns the same value); it buffers its writes, removals and increments, and a read
/// of an object it wrote returns its own write. Nothing is sent to a master before
/// [`Transaction::commit`], which:
///
/// 1. reads the version of every object written without being read first (one multi-read),
///    so every op carries the version the transaction observed;
/// 2. takes one exactly-once ticket per object, in one go under one lease, in (table, key
///    hash) order: the transaction's id is its lease and its first op's rpc id, and each op's
///    vote is the RIFL result of its own rpc id;
/// 3. sends TX_PREPARE to every master holding an object, all in parallel, and goes on with
///    each op a master could not vote on (a stale map, RETRY, a lost connection) as a
///    multi-operation goes on with its items, with the same rpc id, until every op has a vote
///    or the deadline passes. Every request carries the transaction's participants (every
///    op, by table, key hash and rpc id), so that any participant can finish the transaction
///    if the client dies;
/// 4. when some votes are still unknown (and none is ABORT), sends TX_REQUEST_ABORT for those
///    ops, which makes each vote final (an op that had not voted is recorded ABORT), within
///    another operation's time;
/// 5. decides from the final votes as any participant would: COMMIT if every op voted
///    PREPARED, ABORT otherwise; sends TX_DECISION for every op until each is acknowledged,
///    within another operation's time, and returns the outcome;
/// 6. gives the tickets back once every op acknowledged the decision (until then the client
///    acknowledges none of them, so a participant finishing the transaction can still learn
///    every vote). Ops still unacknowledged then are told in the background, for at most
///    half a client lease term, after which the tickets are given back anyway.
///
/// A transaction that only reads locks nothing: one object needs no request at all, more are
/// validated (TX_PREPARE, validate-only): committed if each is still unlocked at its version.
///
/// Transactions always run under the client's lease, whatever
/// [`ClientConfig::exactly_once`](crate::ClientConfig::exactly_once) says: their votes are
/// RIFL results.
#[derive(Clone, Debug)]
pub struct Transaction {
    client: Client,
    buffer: Arc<Mutex<TxBuffer>>,
}

impl Client {
    /// Starts a transaction. Nothing is sent until it reads or commits.
    pub fn transaction(&self) -> Transaction {
        Transaction { client: self.clone(), buffer: Arc::new(Mutex::new(TxBuffer::default())) }
    }

    /// Waits, at most `timeout`, until the decisions of this client's committed transactions
    /// have reached their masters (a commit returns once every vote is PREPARED, and its
    /// decision follows in the background); true if they all did. A process about to exit
    /// calls it so that its last transactions' objects are unlocked now rather than when the
    /// participants finish them (after
    /// [`TX_RECOVERY_DELAY_MILLIS`](stratus_types::limits::TX_RECOVERY_DELAY_MILLIS)).
    pub async fn settle_transactions(&self, timeout: std::time::Duration) -> bool {
        let all = u32::try_from(stratus_types::limits::TX_BACKGROUND_DECISIONS_MAX)
            .expect("the bound fits a semaphore");
        let settled = self.inner.background_decisions.acquire_many(all);
        matches!(tokio::time::timeout(timeout, settled).await, Ok(Ok(_)))
    }

    /// Runs `body` on a fresh transaction and commits it; when the commit aborts in a
    /// conflict, runs it again on another fresh transaction after a pause (1 ms doubling to
    /// 64 ms, with jitter), up to 32 attempts and while the client's operation timeout since
    /// the first has not passed. Returns the value of the body whose transaction committed.
    ///
    /// The body gets its own handle to the transaction, so an `async move` block can own it
    /// (`|tx| async move { ... }` works on stable Rust); it must not commit it. An error from
    /// the body ends the call without committing ([`TransactionError::Failed`]); so does an
    /// abort other than a conflict, or a conflict on the last attempt allowed
    /// ([`TransactionError::Aborted`]). The body may run several times: it should do nothing
    /// but read and buffer through its transaction.
    ///
    /// ```no_run
    /// # async fn transfer(client: &stratus_client::Client, accounts: stratus_client::TableId)
    /// # -> Result<(), stratus_client::TransactionError> {
    /// client
    ///     .run_transaction(|tx| async move {
    ///         tx.increment(accounts, b"alice", -10).await?;
    ///         tx.increment(accounts, b"bob", 10).await?;
    ///         Ok(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn run_transaction<T, F, Fut>(
        &self,
        body: F,
    ) -> std::result::Result<T, TransactionError>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.run_transaction_retrying_if(body, |_| true).await
    }

    /// [`Client::run_transaction`], retrying only the conflicts `retry_conflict` accepts
    /// (given the [`AbortReason::Conflict`]); another conflict ends the call with
    /// [`TransactionError::Aborted`] at once. The retry policy stays the one of
    /// `run_transaction`. For callers to which some conflicts are an answer: the RESP
    /// gateway's EXEC answers a conflict on a WATCHed key with a null reply, as Redis does,
    /// and retries the others.
    pub async fn run_transaction_retrying_if<T, F, Fut, R>(
        &self,
        mut body: F,
        mut retry_conflict: R,
    ) -> std::result::Result<T, TransactionError>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T>>,
        R: FnMut(&AbortReason) -> bool,
    {
        let started = tokio::time::Instant::now();
        let mut retries = ConflictRetries::new(self.config().operation_timeout);
        loop {
            let transaction = self.transaction();
            let value = body(transaction.clone()).await?;
            let reason = match transaction.commit().await? {
                TxOutcome::Committed => return Ok(value),
                TxOutcome::Aborted(reason) => reason,
            };
            let pause = match reason {
                AbortReason::Conflict { .. } if retry_conflict(&reason) => {
                    retries.next_pause(self.inner.entropy(), started.elapsed())
                }
                AbortReason::Conflict { .. } | AbortReason::Timeout => None,
            };
            match pause {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(TransactionError::Aborted(reason)),
            }
        }
    }
}

impl Transaction {
    /// The object's value as the transaction sees it: its own write (or `None` after its own
    /// removal), else what it read of the object first, else what the object's master holds
    /// now (`None`: absent), which the transaction then remembers with its version. A read of
    /// an object another transaction holds locked waits (its master answers RETRY) within the
    /// client's operation timeout.
    pub async fn read(&self, table_id: TableId, key: &[u8]) -> Result<Option<Bytes>> {
        check_key(key)?;
        let object: ObjectKey = (table_id, Bytes::copy_from_slice(key));
        if let Seen::Known(value) = self.buffer().seen(&object)? {
            return Ok(value);
        }
        let request = Request::Read { table_id, key: object.1.clone(), rules: RejectRules::NONE };
        let answer = self.client.inner.object_call(table_id, &object.1, request).await?;
        let (value, version) = match read_result(answer) {
            Ok(read) => (Some(read.value), read.version),
            Err(error) if error.status == Status::ObjectDoesntExist => (None, Version::NONEXISTENT),
            Err(error) => return Err(error),
        };
        self.buffer().record_read(object, value, version)
    }

    /// [`Transaction::read`] of many objects at once: those the transaction has not seen yet
    /// are read from their masters in parallel (one multi-read per master), in one round
    /// trip rather than one per object. One value (`None`: absent) per object, in order.
    pub async fn read_many(&self, objects: &[(TableId, &[u8])]) -> Result<Vec<Option<Bytes>>> {
        let objects: Vec<ObjectKey> = objects
            .iter()
            .map(|&(table_id, key)| {
                check_key(key)?;
                Ok((table_id, Bytes::copy_from_slice(key)))
            })
            .collect::<Result<_>>()?;
        // Each object not seen yet, once (the same object twice is read once).
        let mut unseen: Vec<ObjectKey> = Vec::new();
        let mut listed: HashSet<&ObjectKey> = HashSet::new();
        for object in &objects {
            if let Seen::Unknown = self.buffer().seen(object)? {
                if listed.insert(object) {
                    unseen.push(object.clone());
                }
            }
        }
        let read = commit::read_objects(&self.client.inner, &unseen).await?;
        for (object, (value, version)) in unseen.into_iter().zip(read) {
            self.buffer().record_read(object, value, version)?;
        }
        objects
            .iter()
            .map(|object| match self.buffer().seen(object)? {
                Seen::Known(value) => Ok(value),
                Seen::Unknown => unreachable!("every object was read or written above"),
            })
            .collect()
    }

    /// Buffers a write of `value` to the object (sent at commit). Refused, before anything is
    /// sent, when the transaction would exceed
    /// [`TRANSACTION_OBJECTS_MAX`](stratus_types::limits::TRANSACTION_OBJECTS_MAX) objects or
    /// [`TRANSACTION_BYTES_MAX`](stratus_types::limits::TRANSACTION_BYTES_MAX) bytes.
    pub fn write(&self, table_id: TableId, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        let object = (table_id, Bytes::copy_from_slice(key));
        self.buffer().write(object, Bytes::copy_from_slice(value))
    }

    /// Buffers the removal of the object (sent at commit); limits as for
    /// [`Transaction::write`].
    pub fn remove(&self, table_id: TableId, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.buffer().remove((table_id, Bytes::copy_from_slice(key)))
    }

    /// Adds `delta` to an 8-byte little-endian integer object as the transaction sees it (an
    /// absent object counts as 0; see [`Transaction::read`]) and buffers the sum as a write;
    /// returns the sum. INVALID_OBJECT for an object of another length, or a sum that
    /// overflows.
    pub async fn increment(&self, table_id: TableId, key: &[u8], delta: i64) -> Result<i64> {
        let current = self.read(table_id, key).await?;
        let sum = buffer::incremented(current.as_deref(), delta)?;
        self.write(table_id, key, &sum.to_le_bytes())?;
        Ok(sum)
    }

    /// Records that the transaction saw the object at `version` (`Version::NONEXISTENT`:
    /// absent) without reading it now, as if it had read it then: its commit checks that the
    /// object is still at that version (locking it there if the transaction also writes or
    /// removes it, which keeps `version` as the version read) and aborts with
    /// [`AbortReason::Conflict`] on it otherwise. A later [`Transaction::read`] of the object
    /// fetches its value; if the master has another version by then, the transaction can
    /// only abort, and its commit does so at once, sending nothing. For the RESP gateway's
    /// WATCH, whose versions were read before the transaction began. Limits as for
    /// [`Transaction::write`].
    pub fn expect_version(&self, table_id: TableId, key: &[u8], version: Version) -> Result<()> {
        check_key(key)?;
        self.buffer().expect_version((table_id, Bytes::copy_from_slice(key)), version)
    }

    /// Commits the transaction (see [`Transaction`]). Returns its outcome
    /// when it is known: [`TxOutcome::Committed`] once every op's final vote is PREPARED
    /// (even if a master could not be told so in time: it is committed, a warning is logged,
    /// and the decision is delivered in the background), or [`TxOutcome::Aborted`].
    ///
    /// An error with status TIMEOUT means the outcome is unknown (the message says: some
    /// vote could neither be learnt nor made final in time); the participants settle it, and
    /// it committed only if every op was prepared. Any other error means
    /// the transaction did not commit and never will: an object could not be read or
    /// prepared for a reason retrying cannot cure (a table that does not exist, a value the
    /// master refuses), or the transaction was committed already through another handle.
    pub async fn commit(self) -> Result<TxOutcome> {
        let (plan, stale) = {
            let mut buffer = self.buffer();
            let stale = buffer.stale();
            (buffer.take()?, stale)
        };
        if let Some((table, key)) = stale {
            // A version it expected is gone already (see `expect_version`).
            return Ok(TxOutcome::Aborted(AbortReason::Conflict { table, key }));
        }
        commit::commit(&self.client.inner, plan).await
    }

    fn buffer(&self) -> MutexGuard<'_, TxBuffer> {
        self.buffer.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}
