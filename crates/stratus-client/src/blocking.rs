//! A synchronous client for code without an async runtime.
//!
//! Single-object operations (read, write, remove, increment) whose tablet is in the cached map
//! go straight to the master over a [`BlockingChannel`]: the calling thread sends and then
//! waits in `recv`, with no runtime between it and the socket. Everything else, and every
//! single-object attempt that must be retried (a stale map, a tablet being recovered, a master
//! that cannot be reached), runs on the async [`Client`] inside, on a small runtime of its own;
//! both paths judge an attempt's outcome with the same rules (`Inner::judge_attempt`), so the
//! blocking client retries exactly what the async one would. A mutation takes its
//! exactly-once ticket from the same lease agent as the async client's (its lease is renewed
//! on the runtime's worker thread, between calls too).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use stratus_rpc::{deadline_after, BlockingChannel};
use stratus_types::{key_hash, Expiry, RejectRules, TableId, Tier, Version};
use stratus_wire::{
    EnumeratedObject, IncrementItem, KeyItem, Request, ResponseBody, ServerEntry, Status,
    TableEntry, WriteItem,
};

use crate::client::{
    check_key, increment_result, is_mutation, may_have_run, read_result, remove_result,
    set_expiry_result, write_result, Attempt, Client, ClientConfig, ObjectCall, ObjectRead,
};
use crate::error::{Error, Result};

/// Masters a blocking client keeps an idle direct connection to, at most: a cluster's masters
/// with room to spare; past it a call opens a connection of its own and closes it after.
const IDLE_MASTERS_MAX: usize = 1_024;

/// A blocking client. Safe to share between threads: each call takes a connection to its
/// master out of the client for the time of the call, so concurrent calls never wait for each
/// other (a thread that finds no idle connection opens its own, and the client keeps one per
/// master afterwards).
#[derive(Debug)]
pub struct BlockingClient {
    runtime: tokio::runtime::Runtime,
    client: Client,
    /// Idle direct connections, one per master address at most.
    channels: Mutex<HashMap<String, BlockingChannel>>,
}

impl BlockingClient {
    /// A blocking client of the cluster described by `config`.
    pub fn new(config: ClientConfig) -> Result<BlockingClient> {
        // One worker thread: the client's lease renewals run there while no call is in
        // progress (a current-thread runtime runs tasks only inside `block_on`).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stratus-client")
            .enable_all()
            .build()
            .map_err(|error| Error::new(stratus_wire::Status::InternalError, error.to_string()))?;
        let client = {
            let _guard = runtime.enter();
            Client::new(config)
        };
        Ok(BlockingClient { runtime, client, channels: Mutex::new(HashMap::new()) })
    }

    /// The async client inside.
    pub fn async_client(&self) -> &Client {
        &self.client
    }

    /// Runs `future` to its end on the client's runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// See [`Client::create_table`].
    pub fn create_table(&self, name: &str, server_span: u32) -> Result<TableId> {
        self.runtime.block_on(self.client.create_table(name, server_span))
    }

    /// See [`Client::create_table_with_tier`].
    pub fn create_table_with_tier(
        &self,
        name: &str,
        server_span: u32,
        tier: Tier,
    ) -> Result<TableId> {
        self.runtime.block_on(self.client.create_table_with_tier(name, server_span, tier))
    }

    /// See [`Client::drop_table`].
    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.runtime.block_on(self.client.drop_table(name))
    }

    /// See [`Client::get_table_id`].
    pub fn get_table_id(&self, name: &str) -> Result<TableId> {
        self.runtime.block_on(self.client.get_table_id(name))
    }

    /// See [`Client::list_tables`].
    pub fn list_tables(&self) -> Result<Vec<TableEntry>> {
        self.runtime.block_on(self.client.list_tables())
    }

    /// See [`Client::server_list`].
    pub fn server_list(&self) -> Result<Vec<ServerEntry>> {
        self.runtime.block_on(self.client.server_list())
    }

    /// See [`Client::read_with`].
    pub fn read(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<(Bytes, Version)> {
        let object = self.read_object(table_id, key, rules)?;
        Ok((object.value, object.version))
    }

    /// See [`Client::read_object`].
    pub fn read_object(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<ObjectRead> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Read { table_id, key: key.clone(), rules };
        read_result(self.object_call(table_id, &key, request)?)
    }

    /// See [`Client::write_with`].
    pub fn write(
        &self,
        table_id: TableId,
        key: &[u8],
        value: &[u8],
        rules: RejectRules,
    ) -> Result<Version> {
        self.write_expiring(table_id, key, value, rules, Expiry::Never)
    }

    /// See [`Client::write_expiring`].
    pub fn write_expiring(
        &self,
        table_id: TableId,
        key: &[u8],
        value: &[u8],
        rules: RejectRules,
        expiry: Expiry,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let value = Bytes::copy_from_slice(value);
        let request =
            Request::Write { table_id, key: key.clone(), value, rules, expiry, rpc: None };
        write_result(self.object_call(table_id, &key, request)?)
    }

    /// See [`Client::set_expiry`].
    pub fn set_expiry(
        &self,
        table_id: TableId,
        key: &[u8],
        expiry: Expiry,
        rules: RejectRules,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::SetExpiry { table_id, key: key.clone(), expiry, rules, rpc: None };
        set_expiry_result(self.object_call(table_id, &key, request)?)
    }

    /// See [`Client::remove_with`].
    pub fn remove(&self, table_id: TableId, key: &[u8], rules: RejectRules) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Remove { table_id, key: key.clone(), rules, rpc: None };
        remove_result(self.object_call(table_id, &key, request)?)
    }

    /// See [`Client::increment_with`].
    pub fn increment(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version)> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Increment { table_id, key: key.clone(), delta, rules, rpc: None };
        increment_result(self.object_call(table_id, &key, request)?)
    }

    /// One single-object request: first straight to the master if the cached map names it,
    /// then, when that attempt did not settle the request, the async client's retry loop (after
    /// a backoff), all within one operation timeout.
    fn object_call(
        &self,
        table_id: TableId,
        key: &Bytes,
        request: Request,
    ) -> Result<(Status, ResponseBody)> {
        check_key(key)?;
        let inner = &self.client.inner;
        let deadline = deadline_after(inner.config().operation_timeout);
        let mut call = self.prepare(request, deadline)?;
        let mut lease_expired = false;
        let failed = match self.direct_attempt(table_id, key, &call.request, deadline) {
            Some(Attempt::Finished(outcome)) if call.lease_expired(&outcome) => {
                lease_expired = true;
                None
            }
            Some(Attempt::Finished(outcome)) => return outcome,
            Some(Attempt::Retry(error) | Attempt::Unreachable(error)) => {
                call.may_have_run |= may_have_run(&error);
                Some(error)
            }
            None => None,
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        self.runtime.block_on(async {
            if lease_expired {
                inner.retake_ticket(&mut call, deadline).await?;
            }
            inner.object_call_until(table_id, key, &mut call, deadline, failed).await
        })
    }

    /// `request` ready for its first attempt (see `Inner::prepare`): a mutation's ticket comes
    /// without leaving this thread while the client holds a usable lease.
    fn prepare(&self, request: Request, deadline: Instant) -> Result<ObjectCall> {
        let inner = &self.client.inner;
        if !(inner.config().exactly_once && is_mutation(&request)) {
            return Ok(ObjectCall::plain(request));
        }
        // Inside the runtime: a renewal that falls due starts on its worker.
        let _runtime = self.runtime.enter();
        if let Some(ticket) = inner.lease_agent().ticket_now(inner.me()) {
            return Ok(ObjectCall::with_ticket(request, ticket));
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        self.runtime.block_on(inner.prepare(request, deadline))
    }

    /// Sends `request` once over a direct connection to the master the cached map names, and
    /// judges the outcome; `None` when the cache names no master.
    fn direct_attempt(
        &self,
        table_id: TableId,
        key: &Bytes,
        request: &Request,
        deadline: Instant,
    ) -> Option<Attempt> {
        let config = self.client.config();
        if config.proves_credentials() {
            // The direct path's blocking socket does not speak the credentials preamble: with
            // a client password every attempt goes through the async client, which does.
            return None;
        }
        let inner = &self.client.inner;
        let tablet = inner.cached_served_tablet(table_id, key_hash(table_id, key))?;
        let address = tablet.owner_address;
        let rpc = &inner.config().rpc;
        let idle = self.lock_channels().remove(&address);
        let left = deadline.saturating_duration_since(Instant::now());
        let connected = match idle {
            Some(channel) if channel.is_open() => Ok(channel),
            // A connection the server closed while it was idle (it restarted, say) would lose
            // the request: close it and connect afresh, so nothing is sent that cannot arrive.
            closed => {
                drop(closed);
                BlockingChannel::connect_with_tls(&address, rpc, left, config.tls.as_ref())
            }
        };
        let (sent, reusable) = match connected {
            Ok(mut channel) => {
                let timeout =
                    rpc.request_timeout.min(deadline.saturating_duration_since(Instant::now()));
                let outcome = channel.call(request, timeout);
                // After an error the connection's state is unknown: it closes.
                let reusable = outcome.is_ok().then_some(channel);
                (outcome, reusable)
            }
            Err(error) => (Err(error), None),
        };
        let attempt = inner.judge_attempt(table_id, &address, request, sent);
        if let Some(channel) = reusable {
            let mut channels = self.lock_channels();
            // At most one idle connection per master (a concurrent call's extra one closes),
            // and connections to at most IDLE_MASTERS_MAX masters: masters that left the
            // cluster would otherwise keep theirs open for the client's lifetime.
            if channels.len() < IDLE_MASTERS_MAX || channels.contains_key(&address) {
                channels.entry(address).or_insert(channel);
            }
        }
        Some(attempt)
    }

    fn lock_channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, BlockingChannel>> {
        self.channels.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// See [`Client::multi_read`].
    pub fn multi_read(&self, items: &[KeyItem]) -> Vec<Result<(Bytes, Version)>> {
        self.runtime.block_on(self.client.multi_read(items))
    }

    /// See [`Client::multi_write`].
    pub fn multi_write(&self, items: &[WriteItem]) -> Vec<Result<Version>> {
        self.runtime.block_on(self.client.multi_write(items))
    }

    /// See [`Client::multi_remove`].
    pub fn multi_remove(&self, items: &[KeyItem]) -> Vec<Result<Version>> {
        self.runtime.block_on(self.client.multi_remove(items))
    }

    /// See [`Client::multi_increment`].
    pub fn multi_increment(&self, items: &[IncrementItem]) -> Vec<Result<(i64, Version)>> {
        self.runtime.block_on(self.client.multi_increment(items))
    }

    /// Every object of a table (see [`Client::enumerate`]).
    pub fn enumerate_all(&self, table_id: TableId) -> Result<Vec<EnumeratedObject>> {
        self.runtime.block_on(self.client.enumerate(table_id).collect_all())
    }
}
