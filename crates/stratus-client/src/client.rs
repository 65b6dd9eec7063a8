//! The async client.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use stratus_env::Environment;
use stratus_rpc::{Backoff, ChannelPool, RpcConfig, RpcError};
use stratus_types::limits::{KEY_BYTES_MAX, MULTI_OP_ITEMS_MAX};
use stratus_types::{key_hash, KeyHash, RejectRules, TableId, TabletState, Version};
use stratus_wire::{
    BackupServiceStatistics, IncrementItem, KeyItem, Request, Response, ResponseBody, ServerEntry,
    ServerStatistics, Status, TableEntry, TabletEntry, WriteItem,
};
use tokio::time::Instant;

use crate::enumeration::Enumeration;
use crate::error::{Error, Result};

/// Settings of a client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The coordinator's address, "host:port", or several separated by commas when the
    /// cluster runs standby coordinators (the client finds the active one).
    pub coordinator_address: String,
    /// RPC settings (per-request timeout, connections per server).
    pub rpc: RpcConfig,
    /// How long one operation may take, retries included, before it fails with TIMEOUT (or the
    /// last error seen).
    pub operation_timeout: Duration,
    /// Whether a write, remove or increment is sent again after an attempt whose outcome is
    /// unknown (the request timed out, the connection broke after it was sent, or the master
    /// answered RETRY because replication did not confirm in time). The attempt may have taken
    /// effect, so a retry may apply it twice: a second version of a blind write, a second
    /// delta of an increment, or a conditional write reported refused by its own first
    /// attempt's effect. Until exactly-once RPCs exist, `true` (the default) trades that for
    /// availability; `false` returns the ambiguous error to the caller instead, so every
    /// operation takes effect at most once (the deterministic simulation checks histories
    /// this way).
    pub retry_ambiguous_mutations: bool,
}

impl ClientConfig {
    /// Defaults for a cluster whose coordinator is at `coordinator_address`.
    pub fn new(coordinator_address: impl Into<String>) -> ClientConfig {
        ClientConfig {
            coordinator_address: coordinator_address.into(),
            rpc: RpcConfig::default(),
            operation_timeout: Duration::from_secs(10),
            retry_ambiguous_mutations: true,
        }
    }
}

/// A connection to a Stratus cluster. Cheap to clone; clones share connections and caches.
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    config: ClientConfig,
    pool: ChannelPool,
    environment: Environment,
    tablet_maps: RwLock<HashMap<TableId, Arc<Vec<TabletEntry>>>>,
}

/// The error for a tablet whose master crashed and is still being recovered: retryable, and
/// what an operation reports when its deadline passes before recovery ends.
pub(crate) fn recovering_error(tablet: &TabletEntry) -> Error {
    Error::new(
        Status::Retry,
        format!(
            "tablet [{:#x}, {:#x}] of table {} is recovering (its master {} crashed); it was \
             not served again before the operation's deadline",
            tablet.range.start, tablet.range.end, tablet.table_id, tablet.owner
        ),
    )
}

/// The error for a tablet the coordinator cannot recover: its crashed master's log is lost.
pub(crate) fn unavailable_error(tablet: &TabletEntry) -> Error {
    Error::new(
        Status::ServiceNotAvailable,
        format!(
            "tablet [{:#x}, {:#x}] of table {} is unavailable: its master {} crashed and no \
             complete copy of its log exists; an operator may hand it over empty with \
             `stratus recovery accept-loss {}`",
            tablet.range.start, tablet.range.end, tablet.table_id, tablet.owner, tablet.owner
        ),
    )
}

/// The deadline of an operation that starts now, on tokio's clock (not `std`'s, as
/// `stratus_rpc::deadline_after` is: the deterministic simulation runs the async client on a
/// paused, virtual clock). A timeout too long to add is as good as none.
fn operation_deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or(now + Duration::from_secs(1 << 32))
}

/// Statuses after which the same request may succeed if sent again after refreshing the tablet
/// map.
fn is_stale_map(status: Status) -> bool {
    matches!(status, Status::UnknownTablet | Status::WrongServer)
}

pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        let message = format!("a key is 1 to {KEY_BYTES_MAX} bytes, this one is {}", key.len());
        return Err(Error::new(Status::InvalidKey, message));
    }
    Ok(())
}

/// True for a transport failure that retrying cannot cure: the peer broke the protocol or
/// speaks another version of it (retrying until the deadline would only hide the cause).
fn is_permanent(error: &RpcError) -> bool {
    matches!(error, RpcError::Protocol(_) | RpcError::VersionMismatch { .. })
}

/// True for a single-object request that changes the object.
fn is_mutation(request: &Request) -> bool {
    matches!(request, Request::Write { .. } | Request::Remove { .. } | Request::Increment { .. })
}

fn unexpected(response: &ResponseBody) -> Error {
    Error::new(Status::InternalError, format!("unexpected response {response:?}"))
}

/// Turns a status and body into an error, for every status but OK.
fn failure(status: Status, body: ResponseBody) -> Error {
    match body {
        ResponseBody::Error { message } => Error::new(status, message),
        ResponseBody::Operation(Response::Read { version, .. })
        | ResponseBody::Operation(Response::Write { version })
        | ResponseBody::Operation(Response::Remove { version })
        | ResponseBody::Operation(Response::Increment { version, .. }) => {
            Error::with_version(status, version)
        }
        ResponseBody::Operation(_) => Error::new(status, ""),
    }
}

/// A READ's answer as its caller sees it.
pub(crate) fn read_result(outcome: (Status, ResponseBody)) -> Result<(Bytes, Version)> {
    match outcome {
        (Status::Ok, ResponseBody::Operation(Response::Read { version, value })) => {
            Ok((value, version))
        }
        (status, body) => Err(failure(status, body)),
    }
}

/// A WRITE's answer as its caller sees it.
pub(crate) fn write_result(outcome: (Status, ResponseBody)) -> Result<Version> {
    match outcome {
        (Status::Ok, ResponseBody::Operation(Response::Write { version })) => Ok(version),
        (status, body) => Err(failure(status, body)),
    }
}

/// A REMOVE's answer as its caller sees it.
pub(crate) fn remove_result(outcome: (Status, ResponseBody)) -> Result<Version> {
    match outcome {
        (Status::Ok, ResponseBody::Operation(Response::Remove { version })) => Ok(version),
        (status, body) => Err(failure(status, body)),
    }
}

/// An INCREMENT's answer as its caller sees it.
pub(crate) fn increment_result(outcome: (Status, ResponseBody)) -> Result<(i64, Version)> {
    match outcome {
        (Status::Ok, ResponseBody::Operation(Response::Increment { version, value })) => {
            Ok((value, version))
        }
        (status, body) => Err(failure(status, body)),
    }
}

/// What one attempt of a single-object request decided.
pub(crate) enum Attempt {
    /// The caller's answer: the master's status and body, or an error retrying cannot cure.
    Finished(Result<(Status, ResponseBody)>),
    /// Sending the request again (after the map is fetched afresh) may succeed; the error is
    /// what to report if the deadline passes first.
    Retry(Error),
}

impl Client {
    /// A client of the cluster described by `config`, on the real network.
    pub fn new(config: ClientConfig) -> Client {
        Client::with_environment(config, Environment::system())
    }

    /// A client using `environment` (the simulator passes its own).
    pub fn with_environment(config: ClientConfig, environment: Environment) -> Client {
        let pool = ChannelPool::new(environment.network.clone(), config.rpc.clone());
        Client::with_pool(config, pool, environment)
    }

    /// A client inside a storage server's process (its RESP front end): requests for tablets
    /// that server owns — whose owner address is `address` — run its `service` handler
    /// directly instead of crossing a socket; every other request goes over the network.
    pub fn with_in_process_server(
        config: ClientConfig,
        environment: Environment,
        address: impl Into<String>,
        service: Arc<dyn stratus_rpc::Service>,
    ) -> Client {
        let pool = ChannelPool::new(environment.network.clone(), config.rpc.clone())
            .with_in_process_server(address, service);
        Client::with_pool(config, pool, environment)
    }

    fn with_pool(config: ClientConfig, pool: ChannelPool, environment: Environment) -> Client {
        let inner = Inner { config, pool, environment, tablet_maps: RwLock::new(HashMap::new()) };
        Client { inner: Arc::new(inner) }
    }

    /// Creates a table spread over `server_span` masters; returns its id (the existing id if
    /// the name is taken).
    pub async fn create_table(&self, name: &str, server_span: u32) -> Result<TableId> {
        let request = Request::CreateTable { name: name.to_string(), server_span };
        match self.inner.coordinator_call(&request).await? {
            Response::CreateTable { table_id } => Ok(table_id),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Drops a table and all its objects. TABLE_DOESNT_EXIST if there is no such table, unless
    /// an earlier attempt of this call may have dropped it (its answer lost): then the table
    /// is gone, as asked, and the drop succeeds.
    pub async fn drop_table(&self, name: &str) -> Result<()> {
        let request = Request::DropTable { name: name.to_string() };
        let deadline = Instant::now() + self.inner.config.operation_timeout;
        match self.inner.coordinator_call_noting_ambiguity(&request, deadline).await {
            (Ok(_), _) => {}
            (Err(error), true) if error.status == Status::TableDoesntExist => {}
            (Err(error), _) => return Err(error),
        }
        self.inner.tablet_maps.write().unwrap_or_else(|poison| poison.into_inner()).clear();
        Ok(())
    }

    /// Accepts that the data of crashed master `server_id` is lost (its recovery was found
    /// impossible): the coordinator hands its tablets over empty. An operator's decision.
    pub async fn recovery_accept_loss(&self, server_id: stratus_types::ServerId) -> Result<()> {
        self.inner.coordinator_call(&Request::RecoveryAcceptLoss { server_id }).await?;
        self.inner.tablet_maps.write().unwrap_or_else(|poison| poison.into_inner()).clear();
        Ok(())
    }

    /// Splits the tablet of table `name` that holds `split_hash` into two at that hash (the
    /// second half starts there); both stay on the same master. A hash that already starts a
    /// tablet changes nothing. This client's cached map of the table is dropped; other
    /// clients find out when a master answers UNKNOWN_TABLET.
    pub async fn split_tablet(&self, name: &str, split_hash: u64) -> Result<()> {
        let request = Request::SplitTablet { name: name.to_string(), split_hash };
        self.inner.coordinator_call(&request).await?;
        self.inner.tablet_maps.write().unwrap_or_else(|poison| poison.into_inner()).clear();
        Ok(())
    }

    /// Moves the tablet of table `name` that starts at `start_hash` to the master `target`,
    /// while clients keep using it (its writes go on while it is copied, and are refused with
    /// RETRY, which clients retry, while the keys they changed meanwhile are sent again). Returns once the new owner is durable in the tablet
    /// map. This client's cached maps are dropped; other clients find out when the old master
    /// answers UNKNOWN_TABLET.
    pub async fn migrate_tablet(
        &self,
        name: &str,
        start_hash: u64,
        target: stratus_types::ServerId,
    ) -> Result<()> {
        let request = Request::MigrateTablet { name: name.to_string(), start_hash, target };
        self.inner.coordinator_call(&request).await?;
        self.inner.tablet_maps.write().unwrap_or_else(|poison| poison.into_inner()).clear();
        Ok(())
    }

    /// The id of the table named `name`.
    pub async fn get_table_id(&self, name: &str) -> Result<TableId> {
        match self.inner.coordinator_call(&Request::GetTableId { name: name.to_string() }).await? {
            Response::GetTableId { table_id } => Ok(table_id),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Every table.
    pub async fn list_tables(&self) -> Result<Vec<TableEntry>> {
        match self.inner.coordinator_call(&Request::ListTables).await? {
            Response::ListTables { tables } => Ok(tables),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Every server of the cluster.
    pub async fn server_list(&self) -> Result<Vec<ServerEntry>> {
        match self.inner.coordinator_call(&Request::GetServerList).await? {
            Response::GetServerList { servers } => Ok(servers),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// The tablets of `table_id`, or of every table with `TableId(0)`.
    pub async fn tablet_map(&self, table_id: TableId) -> Result<Vec<TabletEntry>> {
        match self.inner.coordinator_call(&Request::GetTabletMap { table_id }).await? {
            Response::GetTabletMap { tablets } => Ok(tablets),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Statistics of the master at `address`.
    pub async fn server_statistics(&self, address: &str) -> Result<ServerStatistics> {
        let (status, body) = self
            .inner
            .pool
            .call(address, &Request::GetServerStatistics)
            .await
            .map_err(|error| Error::new(error.status(), error.to_string()))?;
        match (status, body) {
            (Status::Ok, ResponseBody::Operation(Response::GetServerStatistics { statistics })) => {
                Ok(statistics)
            }
            (status, body) => Err(failure(status, body)),
        }
    }

    /// The durability mode and counters of the backup at `address` (for `stratus status`).
    pub async fn backup_statistics(&self, address: &str) -> Result<BackupServiceStatistics> {
        let (status, body) = self
            .inner
            .pool
            .call(address, &Request::BackupGetStatistics)
            .await
            .map_err(|error| Error::new(error.status(), error.to_string()))?;
        match (status, body) {
            (Status::Ok, ResponseBody::Operation(Response::BackupGetStatistics { statistics })) => {
                Ok(statistics)
            }
            (status, body) => Err(failure(status, body)),
        }
    }

    /// Reads an object: its value and version.
    pub async fn read(&self, table_id: TableId, key: &[u8]) -> Result<(Bytes, Version)> {
        self.read_with(table_id, key, RejectRules::NONE).await
    }

    /// Reads an object, subject to reject rules.
    pub async fn read_with(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<(Bytes, Version)> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Read { table_id, key: key.clone(), rules };
        read_result(self.inner.object_call(table_id, &key, &request).await?)
    }

    /// Writes an object; returns its new version.
    pub async fn write(&self, table_id: TableId, key: &[u8], value: &[u8]) -> Result<Version> {
        self.write_with(table_id, key, Bytes::copy_from_slice(value), RejectRules::NONE).await
    }

    /// Writes an object subject to reject rules; returns its new version.
    pub async fn write_with(
        &self,
        table_id: TableId,
        key: &[u8],
        value: Bytes,
        rules: RejectRules,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Write { table_id, key: key.clone(), value, rules };
        write_result(self.inner.object_call(table_id, &key, &request).await?)
    }

    /// Removes an object; returns the removed version (0 if there was none).
    pub async fn remove(&self, table_id: TableId, key: &[u8]) -> Result<Version> {
        self.remove_with(table_id, key, RejectRules::NONE).await
    }

    /// Removes an object subject to reject rules.
    pub async fn remove_with(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Remove { table_id, key: key.clone(), rules };
        remove_result(self.inner.object_call(table_id, &key, &request).await?)
    }

    /// Adds `delta` to an 8-byte little-endian integer object (a missing object counts as 0);
    /// returns the new value and version.
    pub async fn increment(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
    ) -> Result<(i64, Version)> {
        self.increment_with(table_id, key, delta, RejectRules::NONE).await
    }

    /// Increments subject to reject rules.
    pub async fn increment_with(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version)> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Increment { table_id, key: key.clone(), delta, rules };
        increment_result(self.inner.object_call(table_id, &key, &request).await?)
    }

    /// Reads many objects, from every master involved in parallel; one result per item.
    pub async fn multi_read(&self, items: &[KeyItem]) -> Vec<Result<(Bytes, Version)>> {
        let outcomes =
            self.inner.clone().multi(items.iter().cloned().map(MultiItem::Read).collect()).await;
        outcomes
            .into_iter()
            .map(|outcome| outcome.map(|(value, version, _)| (value, version)))
            .collect()
    }

    /// Writes many objects; one result (new version) per item.
    pub async fn multi_write(&self, items: &[WriteItem]) -> Vec<Result<Version>> {
        let outcomes =
            self.inner.clone().multi(items.iter().cloned().map(MultiItem::Write).collect()).await;
        outcomes.into_iter().map(|outcome| outcome.map(|(_, version, _)| version)).collect()
    }

    /// Removes many objects; one result (removed version) per item.
    pub async fn multi_remove(&self, items: &[KeyItem]) -> Vec<Result<Version>> {
        let outcomes =
            self.inner.clone().multi(items.iter().cloned().map(MultiItem::Remove).collect()).await;
        outcomes.into_iter().map(|outcome| outcome.map(|(_, version, _)| version)).collect()
    }

    /// Increments many objects; one result (new value, version) per item.
    pub async fn multi_increment(&self, items: &[IncrementItem]) -> Vec<Result<(i64, Version)>> {
        let outcomes = self
            .inner
            .clone()
            .multi(items.iter().cloned().map(MultiItem::Increment).collect())
            .await;
        outcomes
            .into_iter()
            .map(|outcome| outcome.map(|(_, version, value)| (value, version)))
            .collect()
    }

    /// Starts enumerating every object of a table. Objects present for the whole enumeration
    /// are returned exactly once, even if tablets move meanwhile.
    pub fn enumerate(&self, table_id: TableId) -> Enumeration {
        Enumeration::new(self.clone(), table_id)
    }
}

/// One item of a multi-operation, tagged with its kind.
#[derive(Clone, Debug)]
enum MultiItem {
    Read(KeyItem),
    Write(WriteItem),
    Remove(KeyItem),
    Increment(IncrementItem),
}

/// Value, version and integer of a finished item (unused parts are empty or zero).
type ItemOutcome = Result<(Bytes, Version, i64)>;

impl MultiItem {
    fn table_and_key(&self) -> (TableId, &Bytes) {
        match self {
            MultiItem::Read(item) | MultiItem::Remove(item) => (item.table_id, &item.key),
            MultiItem::Write(item) => (item.table_id, &item.key),
            MultiItem::Increment(item) => (item.table_id, &item.key),
        }
    }

    /// The request carrying `items`, all of this item's kind.
    fn request(items: Vec<MultiItem>) -> Request {
        match items.first() {
            Some(MultiItem::Write(_)) => Request::MultiWrite {
                items: items
                    .into_iter()
                    .filter_map(
                        |item| if let MultiItem::Write(item) = item { Some(item) } else { None },
                    )
                    .collect(),
            },
            Some(MultiItem::Remove(_)) => Request::MultiRemove {
                items: items
                    .into_iter()
                    .filter_map(
                        |item| if let MultiItem::Remove(item) = item { Some(item) } else { None },
                    )
                    .collect(),
            },
            Some(MultiItem::Increment(_)) => Request::MultiIncrement {
                items: items
                    .into_iter()
                    .filter_map(|item| {
                        if let MultiItem::Increment(item) = item {
                            Some(item)
                        } else {
                            None
                        }
                    })
                    .collect(),
            },
            _ => Request::MultiRead {
                items: items
                    .into_iter()
                    .filter_map(
                        |item| if let MultiItem::Read(item) = item { Some(item) } else { None },
                    )
                    .collect(),
            },
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

impl Inner {
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub(crate) fn entropy(&self) -> &dyn stratus_env::Entropy {
        &*self.environment.entropy
    }

    /// Sends a request to the coordinator, retrying connection failures and RETRY until the
    /// operation deadline.
    pub(crate) async fn coordinator_call(&self, request: &Request) -> Result<Response> {
        let deadline = operation_deadline(self.config.operation_timeout);
        self.coordinator_call_until(request, deadline).await
    }

    /// [`Inner::coordinator_call`] within an operation's own deadline (a tablet-map fetch on
    /// the way to a master must not get a second, fresh timeout).
    pub(crate) async fn coordinator_call_until(
        &self,
        request: &Request,
        deadline: Instant,
    ) -> Result<Response> {
        self.coordinator_call_noting_ambiguity(request, deadline).await.0
    }

    /// [`Inner::coordinator_call_until`], also telling whether an attempt before the last one
    /// may have taken effect without its answer arriving (a timeout, a lost connection, or
    /// RETRY from a coordinator that may have done part of the work): then an answer that the
    /// work is already done may be that attempt's doing.
    pub(crate) async fn coordinator_call_noting_ambiguity(
        &self,
        request: &Request,
        deadline: Instant,
    ) -> (Result<Response>, bool) {
        let mut backoff = Backoff::for_client();
        let address = &self.config.coordinator_address;
        let mut ambiguous = false;
        loop {
            let last = match self.pool.call_coordinator(address, request).await {
                Ok((Status::Ok, ResponseBody::Operation(response))) => {
                    return (Ok(response), ambiguous)
                }
                Ok((Status::Retry, body)) => {
                    ambiguous = true;
                    failure(Status::Retry, body)
                }
                Ok((status, body)) => return (Err(failure(status, body)), ambiguous),
                Err(error) => {
                    let error_status = error.status();
                    let failed =
                        Error::new(error_status, format!("coordinator {address}: {error}"));
                    if is_permanent(&error) {
                        return (Err(failed), ambiguous);
                    }
                    // A connection that could not be made carried nothing.
                    ambiguous |= matches!(error, RpcError::Timeout | RpcError::ConnectionLost(_));
                    failed
                }
            };
            if Instant::now() >= deadline {
                return (Err(last), ambiguous);
            }
            tokio::time::sleep(backoff.next_delay(self.entropy())).await;
        }
    }

    pub(crate) fn forget_table(&self, table_id: TableId) {
        self.tablet_maps.write().unwrap_or_else(|poison| poison.into_inner()).remove(&table_id);
    }

    /// The tablet holding `hash`, from the cache or a fresh map.
    pub(crate) async fn locate(
        &self,
        table_id: TableId,
        hash: KeyHash,
        deadline: Instant,
    ) -> Result<TabletEntry> {
        if table_id.0 == 0 {
            // GET_TABLET_MAP reads table 0 as "every table": its map would mix tables.
            return Err(Error::new(Status::TableDoesntExist, "table id 0 names no table"));
        }
        let cached = self
            .tablet_maps
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(&table_id)
            .cloned();
        let map = match cached {
            Some(map) => map,
            None => {
                let tablets = match self
                    .coordinator_call_until(&Request::GetTabletMap { table_id }, deadline)
                    .await?
                {
                    Response::GetTabletMap { tablets } => tablets,
                    other => return Err(unexpected(&ResponseBody::Operation(other))),
                };
                let map = Arc::new(tablets);
                self.tablet_maps
                    .write()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .insert(table_id, map.clone());
                map
            }
        };
        let index = map.partition_point(|tablet| tablet.range.end < hash.0);
        match map.get(index) {
            Some(tablet) if tablet.range.contains(hash) => Ok(tablet.clone()),
            _ => {
                self.forget_table(table_id);
                Err(Error::new(
                    Status::UnknownTablet,
                    format!("no tablet of table {table_id} holds hash {:#x}", hash.0),
                ))
            }
        }
    }

    /// The served tablet holding `hash` if the cached map has one, without any I/O: where a
    /// caller may send a single-object request at once (anything else takes
    /// [`Inner::object_call`]'s path, which fetches maps and waits out recoveries).
    pub(crate) fn cached_served_tablet(
        &self,
        table_id: TableId,
        hash: KeyHash,
    ) -> Option<TabletEntry> {
        let maps = self.tablet_maps.read().unwrap_or_else(|poison| poison.into_inner());
        let map = maps.get(&table_id)?;
        let index = map.partition_point(|tablet| tablet.range.end < hash.0);
        map.get(index)
            .filter(|tablet| tablet.range.contains(hash) && tablet.state == TabletState::Normal)
            .cloned()
    }

    /// Judges the result of sending a single-object `request` once to the master at
    /// `address`: the caller's answer, or an error after which the request may go again. Forgets
    /// the cached map (and the pool's connection) where the result shows them stale. The one
    /// place that decides what may be retried, for the async path and the blocking one alike:
    /// a mutation whose outcome is unknown goes again only if `retry_ambiguous_mutations`.
    pub(crate) fn judge_attempt(
        &self,
        table_id: TableId,
        address: &str,
        request: &Request,
        result: std::result::Result<(Status, ResponseBody), RpcError>,
    ) -> Attempt {
        match result {
            Ok((status, body)) if is_stale_map(status) => {
                self.forget_table(table_id);
                Attempt::Retry(failure(status, body))
            }
            Ok((Status::Retry, body)) => {
                let error = failure(Status::Retry, body);
                if !self.config.retry_ambiguous_mutations && is_mutation(request) {
                    return Attempt::Finished(Err(error));
                }
                Attempt::Retry(error)
            }
            Ok(outcome) => Attempt::Finished(Ok(outcome)),
            Err(error) => {
                self.pool.forget(address);
                self.forget_table(table_id);
                let may_have_run = !matches!(error, RpcError::Connect(_));
                let permanent = is_permanent(&error);
                let error = Error::new(error.status(), format!("master {address}: {error}"));
                if permanent
                    || (may_have_run
                        && !self.config.retry_ambiguous_mutations
                        && is_mutation(request))
                {
                    return Attempt::Finished(Err(error));
                }
                Attempt::Retry(error)
            }
        }
    }

    /// Sends a single-object request to the key's master, refreshing the map and retrying as
    /// needed. Returns the first non-retryable status with its body.
    pub(crate) async fn object_call(
        &self,
        table_id: TableId,
        key: &Bytes,
        request: &Request,
    ) -> Result<(Status, ResponseBody)> {
        check_key(key)?;
        let deadline = operation_deadline(self.config.operation_timeout);
        self.object_call_until(table_id, key, request, deadline, None).await
    }

    /// [`Inner::object_call`] with the operation's deadline given. `failed`: the error of an
    /// attempt the caller already made (the blocking client's direct one, judged retryable by
    /// [`Inner::judge_attempt`]); the loop then backs off before its first attempt, as it does
    /// after each of its own, and reports that error if the deadline has passed already.
    pub(crate) async fn object_call_until(
        &self,
        table_id: TableId,
        key: &Bytes,
        request: &Request,
        deadline: Instant,
        failed: Option<Error>,
    ) -> Result<(Status, ResponseBody)> {
        let hash = key_hash(table_id, key);
        let mut backoff = Backoff::for_client();
        // Backoffs end at the deadline at the latest; an attempt that finds no time left
        // fails without sending anything.
        let pause = |backoff: &mut Backoff| {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.next_delay(self.entropy()).min(left))
        };
        if let Some(last) = failed {
            if Instant::now() >= deadline {
                return Err(last);
            }
            pause(&mut backoff).await;
        }
        // Whether the map was fetched afresh after it said the tablet is unavailable.
        let mut unavailable_confirmed = false;
        loop {
            let last = match self.locate(table_id, hash, deadline).await {
                Err(error) if error.status == Status::TableDoesntExist => return Err(error),
                Err(error) => error,
                Ok(tablet) if tablet.state == TabletState::Unavailable => {
                    // Waiting cannot help: only an operator (or a backup that returns) can.
                    // But a cached map may be old (the loss accepted since): ask once more.
                    self.forget_table(table_id);
                    if unavailable_confirmed {
                        return Err(unavailable_error(&tablet));
                    }
                    unavailable_confirmed = true;
                    continue;
                }
                Ok(tablet) if tablet.state == TabletState::Recovering => {
                    self.forget_table(table_id);
                    recovering_error(&tablet)
                }
                Ok(tablet) => {
                    let address = &tablet.owner_address;
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let message = format!("master {address}: the operation's time ran out");
                        return Err(Error::new(Status::Timeout, message));
                    }
                    let sent = self.pool.call_within(address, request, left).await;
                    match self.judge_attempt(table_id, address, request, sent) {
                        Attempt::Finished(outcome) => return outcome,
                        Attempt::Retry(error) => error,
                    }
                }
            };
            if Instant::now() >= deadline {
                return Err(last);
            }
            pause(&mut backoff).await;
        }
    }

    /// Runs a multi-operation: groups pending items by master, sends one request per master
    /// (all in parallel), keeps items whose status says "retry elsewhere" pending, and repeats
    /// with backoff until every item has an outcome or the deadline passes.
    async fn multi(self: Arc<Self>, items: Vec<MultiItem>) -> Vec<ItemOutcome> {
        let mut outcomes: Vec<Option<ItemOutcome>> = vec![None; items.len()];
        let mut pending: Vec<usize> = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            match check_key(item.table_and_key().1) {
                Ok(()) => pending.push(index),
                Err(error) => outcomes[index] = Some(Err(error)),
            }
        }
        let deadline = operation_deadline(self.config.operation_timeout);
        let mut backoff = Backoff::for_client();
        let mut last_error = Error::new(Status::Timeout, "multi-operation did not finish in time");
        // Tables whose map was fetched afresh after it said a tablet is unavailable.
        let mut unavailable_confirmed: BTreeSet<TableId> = BTreeSet::new();
        while !pending.is_empty() {
            let mut unavailable_seen: BTreeSet<TableId> = BTreeSet::new();
            let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &index in &pending {
                let (table_id, key) = items[index].table_and_key();
                match self.locate(table_id, key_hash(table_id, key), deadline).await {
                    Ok(tablet) if tablet.state == TabletState::Normal => {
                        groups.entry(tablet.owner_address).or_default().push(index)
                    }
                    // A cached map may be old (the loss accepted since): the item fails only
                    // once a fresh map says so too.
                    Ok(tablet) if tablet.state == TabletState::Unavailable => {
                        if unavailable_confirmed.contains(&tablet.table_id) {
                            outcomes[index] = Some(Err(unavailable_error(&tablet)));
                        } else {
                            self.forget_table(tablet.table_id);
                            unavailable_seen.insert(tablet.table_id);
                            last_error = unavailable_error(&tablet);
                        }
                    }
                    Ok(tablet) => last_error = recovering_error(&tablet),
                    Err(error) if error.status == Status::TableDoesntExist => {
                        outcomes[index] = Some(Err(error))
                    }
                    Err(error) => last_error = error,
                }
            }
            let mut calls = tokio::task::JoinSet::new();
            for (address, indices) in groups {
                for chunk in indices.chunks(MULTI_OP_ITEMS_MAX) {
                    let request = MultiItem::request(
                        chunk.iter().map(|&index| items[index].clone()).collect(),
                    );
                    let inner = self.clone();
                    let address = address.clone();
                    let chunk = chunk.to_vec();
                    calls.spawn(async move {
                        let result = inner.pool.call(&address, &request).await;
                        (address, chunk, result)
                    });
                }
            }
            while let Some(joined) = calls.join_next().await {
                let Ok((address, chunk, result)) = joined else { continue };
                match result {
                    Ok((Status::Ok, ResponseBody::Operation(response))) => {
                        match item_results(response) {
                            Some(results) if results.len() == chunk.len() => {
                                for (&index, (status, outcome)) in chunk.iter().zip(results) {
                                    if is_stale_map(status) {
                                        let (table_id, _) = items[index].table_and_key();
                                        self.forget_table(table_id);
                                    } else if status != Status::Retry {
                                        outcomes[index] = Some(outcome);
                                    }
                                }
                            }
                            _ => {
                                last_error = Error::new(
                                    Status::InternalError,
                                    "malformed multi-operation response",
                                )
                            }
                        }
                    }
                    Ok((status, body)) if status == Status::Retry || is_stale_map(status) => {
                        if is_stale_map(status) {
                            for &index in &chunk {
                                self.forget_table(items[index].table_and_key().0);
                            }
                        }
                        last_error = failure(status, body);
                    }
                    // The master refused the whole request (it cannot have run): every item of
                    // it fails with that status, at once.
                    Ok((status, body)) => {
                        let refused = failure(status, body);
                        for &index in &chunk {
                            outcomes[index] = Some(Err(refused.clone()));
                        }
                    }
                    Err(error) => {
                        self.pool.forget(&address);
                        let failed =
                            Error::new(error.status(), format!("master {address}: {error}"));
                        if is_permanent(&error) {
                            for &index in &chunk {
                                outcomes[index] = Some(Err(failed.clone()));
                            }
                        }
                        last_error = failed;
                    }
                }
            }
            pending.retain(|&index| outcomes[index].is_none());
            // Their maps were forgotten: the next round fetches them afresh.
            unavailable_confirmed.append(&mut unavailable_seen);
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(backoff.next_delay(self.entropy())).await;
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Err(last_error.clone())))
            .collect()
    }

    pub(crate) async fn enumerate_call(
        &self,
        address: &str,
        request: &Request,
    ) -> std::result::Result<(Status, ResponseBody), Error> {
        self.pool.call(address, request).await.map_err(|error| {
            self.pool.forget(address);
            Error::new(error.status(), format!("master {address}: {error}"))
        })
    }
}
