//! The async client.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use stratus_env::Environment;
use stratus_rpc::{
    Backoff, ChannelPool, ClientNetwork, ClusterKey, RpcConfig, RpcError, SecretError, UserPassword,
};
use stratus_tls::{ClientTls, TlsNetwork};
use stratus_types::limits::{KEY_BYTES_MAX, TABLET_MAP_AWAIT_MILLIS_MAX};
use stratus_types::{
    key_hash, Expiry, KeyHash, RejectRules, RpcIdentity, ServerId, TableId, TabletState, Tier,
    Version,
};
use stratus_wire::{
    BackupServiceStatistics, IncrementItem, KeyItem, RemoveItem, Request, Response, ResponseBody,
    ServerEntry, ServerStatistics, Status, TableEntry, TabletEntry, WriteItem,
};
use tokio::time::Instant;

use crate::enumeration::Enumeration;
use crate::error::{Error, Result};
use crate::exactly_once::{LeaseAgent, RpcTicket};
use crate::multi::MultiItems;

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
    /// Whether every mutation (write, remove, increment, set-expiry, each item of the
    /// multi-operations) carries an exactly-once identity under a client lease (RIFL,
    /// docs/design/exactly-once.md): then a mutation sent again after an attempt whose outcome
    /// is unknown is applied at most once, and its retry gets the first attempt's answer.
    /// On by default; off, the client sends no identity and takes no lease.
    pub exactly_once: bool,
    /// Only for a client with `exactly_once` off: whether a mutation is sent again after an
    /// attempt whose outcome is unknown (a timeout, a connection broken after sending, RETRY
    /// from a master whose replication did not confirm in time). Such a retry may apply it
    /// twice; `false` returns the ambiguous error to the caller instead.
    pub retry_ambiguous_mutations: bool,
    /// For a cluster that requires the client password (`--client-password-file` on its
    /// servers): the password's key ([`ClientConfig::with_password`]). Every connection then
    /// proves it before its first request, and checks that the server knows it too.
    pub client_password_key: Option<ClusterKey>,
    /// For a cluster with named users: the user this client acts as, and its password
    /// ([`ClientConfig::with_user`]). Every connection proves it (instead of the client
    /// password, if both are set), and the cluster allows what the user's grants allow.
    pub user: Option<Arc<UserPassword>>,
    /// For a cluster whose servers speak TLS (`--tls-cert-file` on its servers): the CA the
    /// client trusts, and its own certificate if the servers ask for one. Every connection
    /// then runs a TLS handshake first (and proves the password, if any, inside it).
    pub tls: Option<ClientTls>,
}

impl ClientConfig {
    /// Defaults for a cluster whose coordinator is at `coordinator_address`.
    pub fn new(coordinator_address: impl Into<String>) -> ClientConfig {
        ClientConfig {
            coordinator_address: coordinator_address.into(),
            rpc: RpcConfig::default(),
            operation_timeout: Duration::from_secs(10),
            exactly_once: true,
            retry_ambiguous_mutations: true,
            client_password_key: None,
            user: None,
            tls: None,
        }
    }

    /// These settings, acting as the named user `name` with `password` (see
    /// [`ClientConfig::user`]); fails for an invalid name or a password under 8 bytes.
    pub fn with_user(
        mut self,
        name: &str,
        password: &[u8],
    ) -> std::result::Result<ClientConfig, String> {
        self.user = Some(Arc::new(UserPassword::new(name, password)?));
        Ok(self)
    }

    /// True if every connection proves credentials (a password or a user) in a preamble.
    pub fn proves_credentials(&self) -> bool {
        self.client_password_key.is_some() || self.user.is_some()
    }

    /// These settings, proving `password` on every connection (see
    /// [`ClientConfig::client_password_key`]); fails for a password under 16 bytes.
    pub fn with_password(
        mut self,
        password: &[u8],
    ) -> std::result::Result<ClientConfig, SecretError> {
        self.client_password_key = Some(ClusterKey::from_client_password(password)?);
        Ok(self)
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
    /// The client's lease and rpc ids (exactly-once mutations).
    lease_agent: LeaseAgent,
    /// This, for background work (lease renewals) that must not keep the client alive.
    me: Weak<Inner>,
    /// Decisions of committed transactions still on their way in the background, at most
    /// [`TX_BACKGROUND_DECISIONS_MAX`](stratus_types::limits::TX_BACKGROUND_DECISIONS_MAX).
    pub(crate) background_decisions: Arc<tokio::sync::Semaphore>,
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
pub(crate) fn operation_deadline(timeout: Duration) -> Instant {
    stratus_rpc::deadline_in(timeout)
}

/// The time an operation ending at `deadline` has left; `None` once the deadline has passed
/// (an attempt that finds no time left sends nothing).
pub(crate) fn time_left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now())).filter(|left| !left.is_zero())
}

/// What an operation reports when its deadline passed before any attempt of `what` failed
/// in a way of its own.
pub(crate) fn out_of_time(what: &str) -> Error {
    Error::new(Status::Timeout, format!("{what}: the operation's time ran out"))
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

/// True for a transport failure that retrying cannot cure: the peer broke the protocol, speaks
/// another version of it, or refused this client's password (retrying until the deadline would
/// only hide the cause).
fn is_permanent(error: &RpcError) -> bool {
    matches!(
        error,
        RpcError::Protocol(_)
            | RpcError::VersionMismatch { .. }
            | RpcError::AuthenticationFailed(_)
    )
}

/// True for a status that no retry can cure: what the client asked for does not exist, or its
/// credentials do not allow it.
fn is_final_locating(status: Status) -> bool {
    matches!(
        status,
        Status::TableDoesntExist | Status::PermissionDenied | Status::AuthenticationFailed
    )
}

/// True for a single-object request that changes the object.
pub(crate) fn is_mutation(request: &Request) -> bool {
    matches!(
        request,
        Request::Write { .. }
            | Request::Remove { .. }
            | Request::Increment { .. }
            | Request::SetExpiry { .. }
    )
}

/// True for a mutation without an exactly-once identity: sending it again may apply it
/// twice.
fn is_unprotected_mutation(request: &Request) -> bool {
    match request {
        Request::Write { rpc, .. }
        | Request::Remove { rpc, .. }
        | Request::Increment { rpc, .. }
        | Request::SetExpiry { rpc, .. } => rpc.is_none(),
        _ => false,
    }
}

/// Gives a single-object mutation its exactly-once identity.
fn set_identity(request: &mut Request, identity: RpcIdentity) {
    match request {
        Request::Write { rpc, .. }
        | Request::Remove { rpc, .. }
        | Request::Increment { rpc, .. }
        | Request::SetExpiry { rpc, .. } => *rpc = Some(identity),
        _ => {}
    }
}

/// True when an attempt that failed with `error` may have reached a master and been applied
/// there (anything but a map found stale, or a connection never made).
pub(crate) fn may_have_run(error: &Error) -> bool {
    !matches!(error.status, Status::UnknownTablet | Status::WrongServer | Status::CouldntConnect)
}

/// What a mutation reports when its lease expired after an attempt that may have been
/// applied: retrying under a new lease could apply it twice, so its outcome is unknown.
pub(crate) fn lease_lost_error() -> Error {
    Error::new(
        Status::Timeout,
        "the client's lease expired before the mutation's outcome was known: it may or may not \
         have been applied",
    )
}

/// A single-object request on its way: the request, the exactly-once ticket of a mutation
/// (every attempt carries its identity), and whether an attempt may have been applied.
#[derive(Debug)]
pub(crate) struct ObjectCall {
    pub(crate) request: Request,
    pub(crate) ticket: Option<RpcTicket>,
    pub(crate) may_have_run: bool,
}

impl ObjectCall {
    /// A request that carries no identity (a read, or a mutation of a client without
    /// exactly-once).
    pub(crate) fn plain(request: Request) -> ObjectCall {
        ObjectCall { request, ticket: None, may_have_run: false }
    }

    /// A mutation under `ticket`.
    pub(crate) fn with_ticket(mut request: Request, ticket: RpcTicket) -> ObjectCall {
        set_identity(&mut request, ticket.identity());
        ObjectCall { request, ticket: Some(ticket), may_have_run: false }
    }

    /// Brings the identity up to date (what the client acknowledged grows) before an attempt.
    pub(crate) fn refresh_identity(&mut self) {
        if let Some(ticket) = &self.ticket {
            set_identity(&mut self.request, ticket.identity());
        }
    }

    /// Whether the answer says the ticket's lease expired.
    pub(crate) fn lease_expired(&self, outcome: &Result<(Status, ResponseBody)>) -> bool {
        self.ticket.is_some()
            && matches!(outcome, Ok((status, _)) if *status == Status::ExpiredLease)
    }
}

pub(crate) fn unexpected(response: &ResponseBody) -> Error {
    Error::new(Status::InternalError, format!("unexpected response {response:?}"))
}

/// Turns a status and body into an error, for every status but OK.
pub(crate) fn failure(status: Status, body: ResponseBody) -> Error {
    match body {
        ResponseBody::Error { message } => Error::new(status, message),
        ResponseBody::Operation(Response::Read { version, .. })
        | ResponseBody::Operation(Response::Write { version })
        | ResponseBody::Operation(Response::SetExpiry { version })
        | ResponseBody::Operation(Response::Remove { version })
        | ResponseBody::Operation(Response::Increment { version, .. }) => {
            Error::with_version(status, version)
        }
        ResponseBody::Operation(_) => Error::new(status, ""),
    }
}

/// An object as a read found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRead {
    /// Its value.
    pub value: Bytes,
    /// Its version.
    pub version: Version,
    /// How long until it expires, by its master's clock when it answered (rounded up to the
    /// millisecond); `None` if it does not expire.
    pub expires_in: Option<Duration>,
}

/// A READ's answer as its caller sees it.
pub(crate) fn read_result(outcome: (Status, ResponseBody)) -> Result<ObjectRead> {
    match outcome {
        (
            Status::Ok,
            ResponseBody::Operation(Response::Read { version, value, expires_in_millis }),
        ) => {
            let expires_in =
                (expires_in_millis > 0).then(|| Duration::from_millis(expires_in_millis));
            Ok(ObjectRead { value, version, expires_in })
        }
        (status, body) => Err(failure(status, body)),
    }
}

/// A SET_EXPIRY's answer as its caller sees it.
pub(crate) fn set_expiry_result(outcome: (Status, ResponseBody)) -> Result<Version> {
    match outcome {
        (Status::Ok, ResponseBody::Operation(Response::SetExpiry { version })) => Ok(version),
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
    /// As [`Attempt::Retry`], and no connection to the master could be made (refused, or the
    /// handshake failed): its process is likely gone, and a caller routing one key at a time
    /// waits at the coordinator until the tablet has another owner ([`Inner::await_recovery`]).
    Unreachable(Error),
}

/// What the outcome of one attempt allows, as [`Inner::judge_status`] and
/// [`Inner::judge_transport`] decide it for every object request: single-object (async and
/// blocking), each item of a multi-operation, each step of an enumeration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// The outcome is the caller's answer: a success, an error retrying cannot cure, or a
    /// mutation's ambiguous error that the configuration says not to resend.
    Final,
    /// Sending the request again (after the map is fetched afresh) may succeed.
    Retry,
}

/// Where the next attempt of an object request goes, as [`Inner::route`] decides it.
pub(crate) enum Route {
    /// To the master serving the key's tablet.
    Send(TabletEntry),
    /// Nowhere yet (no map could be fetched, or the tablet still recovers): try again after a
    /// pause; the error is what to report if the deadline passes first.
    Wait(Error),
    /// Nowhere yet: the map shows the tablet recovering. A caller routing one key at a time
    /// waits for the recovery at the coordinator ([`Inner::await_recovery`]); one routing many
    /// items treats it as [`Route::Wait`].
    Recovering(Error),
    /// Nowhere: the table does not exist, or the tablet's data is lost.
    Fail(Error),
}

/// How much shorter than the RPC timeout an AWAIT_TABLET_MAP's wait is, so that the
/// coordinator's answer "still recovering" arrives before the call would time out.
const TABLET_MAP_AWAIT_MARGIN: Duration = Duration::from_millis(250);

/// Tables whose map said a tablet is unavailable, within one operation. A cached map may be
/// old (the loss accepted since), so the first such answer drops the map and waits; the
/// second, from a fresh map, is believed.
#[derive(Debug, Default)]
pub(crate) struct UnavailableTables(BTreeSet<TableId>);

impl Client {
    /// A client of the cluster described by `config`, on the real network.
    pub fn new(config: ClientConfig) -> Client {
        Client::with_environment(config, Environment::system())
    }

    /// A client using `environment` (the simulator passes its own). With TLS, every
    /// connection it opens runs a handshake first; with a client password, every connection
    /// proves it (inside TLS, if any) (nonces from the environment's secure
    /// source: they must be unpredictable).
    pub fn with_environment(config: ClientConfig, mut environment: Environment) -> Client {
        if let Some(tls) = &config.tls {
            let network = TlsNetwork::new(environment.network, None, Some(tls.clone()));
            environment.network = Arc::new(network);
        }
        let nonces = environment.secure_entropy.clone();
        if let Some(user) = &config.user {
            let network = ClientNetwork::for_user(environment.network, user.clone(), nonces);
            environment.network = Arc::new(network);
        } else if let Some(key) = &config.client_password_key {
            let network = ClientNetwork::new(environment.network, key.clone(), nonces);
            environment.network = Arc::new(network);
        }
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

    /// The settings this client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    fn with_pool(config: ClientConfig, pool: ChannelPool, environment: Environment) -> Client {
        let inner = Arc::new_cyclic(|me| Inner {
            config,
            pool,
            environment,
            tablet_maps: RwLock::new(HashMap::new()),
            lease_agent: LeaseAgent::default(),
            me: me.clone(),
            background_decisions: Arc::new(tokio::sync::Semaphore::new(
                stratus_types::limits::TX_BACKGROUND_DECISIONS_MAX,
            )),
        });
        Client { inner }
    }

    /// Creates a table spread over `server_span` masters, its objects in memory; returns its
    /// id (the existing id if the name is taken by a memory table).
    pub async fn create_table(&self, name: &str, server_span: u32) -> Result<TableId> {
        self.create_table_with_tier(name, server_span, Tier::Memory).await
    }

    /// Creates a table spread over `server_span` masters whose objects live in `tier` (fixed
    /// for the table's life); returns its id. A table of that name that exists is answered
    /// with its id if it has the same tier, and refused with INVALID_PARAMETER if it has
    /// another.
    pub async fn create_table_with_tier(
        &self,
        name: &str,
        server_span: u32,
        tier: Tier,
    ) -> Result<TableId> {
        let request = Request::CreateTable { name: name.to_string(), server_span, tier };
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
        let deadline = operation_deadline(self.inner.config.operation_timeout);
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
        match self.inner.server_call(address, &Request::GetServerStatistics).await? {
            (Status::Ok, ResponseBody::Operation(Response::GetServerStatistics { statistics })) => {
                Ok(statistics)
            }
            (status, body) => Err(failure(status, body)),
        }
    }

    /// The durability mode and counters of the backup at `address` (for `stratus status`).
    pub async fn backup_statistics(&self, address: &str) -> Result<BackupServiceStatistics> {
        match self.inner.server_call(address, &Request::BackupGetStatistics).await? {
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
        let object = self.read_object(table_id, key, rules).await?;
        Ok((object.value, object.version))
    }

    /// Reads an object subject to reject rules: its value, version and time to live.
    pub async fn read_object(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<ObjectRead> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::Read { table_id, key: key.clone(), rules };
        read_result(self.inner.object_call(table_id, &key, request).await?)
    }

    /// Writes an object; returns its new version.
    pub async fn write(&self, table_id: TableId, key: &[u8], value: &[u8]) -> Result<Version> {
        self.write_with(table_id, key, Bytes::copy_from_slice(value), RejectRules::NONE).await
    }

    /// Writes an object subject to reject rules; returns its new version. The object does not
    /// expire (an expiry the key had is cleared, as Redis's SET clears one).
    pub async fn write_with(
        &self,
        table_id: TableId,
        key: &[u8],
        value: Bytes,
        rules: RejectRules,
    ) -> Result<Version> {
        self.write_expiring(table_id, key, value, rules, Expiry::Never).await
    }

    /// Writes an object subject to reject rules that expires as `expiry` says (relative
    /// expiries count from when its master applies the write, by that master's clock); returns
    /// its new version.
    pub async fn write_expiring(
        &self,
        table_id: TableId,
        key: &[u8],
        value: Bytes,
        rules: RejectRules,
        expiry: Expiry,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request =
            Request::Write { table_id, key: key.clone(), value, rules, expiry, rpc: None };
        write_result(self.inner.object_call(table_id, &key, request).await?)
    }

    /// Sets when an existing object expires (`Expiry::Never`: never), keeping its value;
    /// returns its new version. OBJECT_DOESNT_EXIST for a missing or expired object.
    pub async fn set_expiry(
        &self,
        table_id: TableId,
        key: &[u8],
        expiry: Expiry,
        rules: RejectRules,
    ) -> Result<Version> {
        let key = Bytes::copy_from_slice(key);
        let request = Request::SetExpiry { table_id, key: key.clone(), expiry, rules, rpc: None };
        set_expiry_result(self.inner.object_call(table_id, &key, request).await?)
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
        let request = Request::Remove { table_id, key: key.clone(), rules, rpc: None };
        remove_result(self.inner.object_call(table_id, &key, request).await?)
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
        let request = Request::Increment { table_id, key: key.clone(), delta, rules, rpc: None };
        increment_result(self.inner.object_call(table_id, &key, request).await?)
    }

    /// Reads many objects, from every master involved in parallel; one result per item.
    pub async fn multi_read(&self, items: &[KeyItem]) -> Vec<Result<(Bytes, Version)>> {
        let outcomes = self.inner.clone().multi(MultiItems::Read(items.to_vec())).await;
        outcomes
            .into_iter()
            .map(|outcome| outcome.map(|(value, version, _)| (value, version)))
            .collect()
    }

    /// Writes many objects; one result (new version) per item.
    pub async fn multi_write(&self, items: &[WriteItem]) -> Vec<Result<Version>> {
        let outcomes = self.inner.clone().multi(MultiItems::Write(items.to_vec())).await;
        outcomes.into_iter().map(|outcome| outcome.map(|(_, version, _)| version)).collect()
    }

    /// Removes many objects; one result (removed version) per item.
    pub async fn multi_remove(&self, items: &[KeyItem]) -> Vec<Result<Version>> {
        let items = items
            .iter()
            .map(|item| RemoveItem {
                table_id: item.table_id,
                key: item.key.clone(),
                rules: item.rules,
                rpc: None,
            })
            .collect();
        let outcomes = self.inner.clone().multi(MultiItems::Remove(items)).await;
        outcomes.into_iter().map(|outcome| outcome.map(|(_, version, _)| version)).collect()
    }

    /// Increments many objects; one result (new value, version) per item.
    pub async fn multi_increment(&self, items: &[IncrementItem]) -> Vec<Result<(i64, Version)>> {
        let outcomes = self.inner.clone().multi(MultiItems::Increment(items.to_vec())).await;
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

impl Inner {
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub(crate) fn me(&self) -> &Weak<Inner> {
        &self.me
    }

    pub(crate) fn lease_agent(&self) -> &LeaseAgent {
        &self.lease_agent
    }

    /// `request` ready for its first attempt: a mutation of an exactly-once client gets a
    /// ticket (a lease is opened first if the client holds none, within `deadline`).
    pub(crate) async fn prepare(&self, request: Request, deadline: Instant) -> Result<ObjectCall> {
        if !(self.config.exactly_once && is_mutation(&request)) {
            return Ok(ObjectCall::plain(request));
        }
        let ticket = self.lease_agent.ticket(self, deadline).await?;
        Ok(ObjectCall::with_ticket(request, ticket))
    }

    /// After a master said `call`'s lease expired: a new ticket under a new lease if no
    /// attempt may have been applied (none of it survives anywhere), else the mutation's
    /// outcome is unknown.
    pub(crate) async fn retake_ticket(
        &self,
        call: &mut ObjectCall,
        deadline: Instant,
    ) -> Result<()> {
        if call.may_have_run {
            return Err(lease_lost_error());
        }
        if let Some(ticket) = call.ticket.take() {
            self.lease_agent.lost(ticket.lease());
        }
        let ticket = self.lease_agent.ticket(self, deadline).await?;
        *call = ObjectCall::with_ticket(call.request.clone(), ticket);
        Ok(())
    }

    pub(crate) fn entropy(&self) -> &dyn stratus_env::Entropy {
        &*self.environment.entropy
    }

    pub(crate) fn pool(&self) -> &ChannelPool {
        &self.pool
    }

    /// Sleeps the backoff's next delay, ending at `deadline` at the latest.
    pub(crate) async fn pause(&self, backoff: &mut Backoff, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(backoff.next_delay(self.entropy()).min(left)).await;
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
        let mut last = None;
        loop {
            let Some(left) = time_left(deadline) else {
                let error = last.unwrap_or_else(|| out_of_time(&format!("coordinator {address}")));
                return (Err(error), ambiguous);
            };
            let failed = match self.pool.call_coordinator_within(address, request, left).await {
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
            last = Some(failed);
            self.pause(&mut backoff, deadline).await;
        }
    }

    /// Sends `request` (not an object request: statistics) to the server at `address`, within
    /// the operation's deadline. A failure on the connection the pool kept (a server that
    /// restarted at the same address broke it) goes again once on a fresh connection; a
    /// server that cannot be reached or does not answer is reported at once, as callers
    /// gathering many servers' figures want it.
    pub(crate) async fn server_call(
        &self,
        address: &str,
        request: &Request,
    ) -> Result<(Status, ResponseBody)> {
        let deadline = operation_deadline(self.config.operation_timeout);
        let mut fresh_connection_tried = false;
        loop {
            let Some(left) = time_left(deadline) else {
                return Err(out_of_time(&format!("server {address}")));
            };
            let error = match self.pool.call_within(address, request, left).await {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            self.pool.forget(address);
            let cached_connection_broke =
                matches!(error, RpcError::ConnectionLost(_) | RpcError::NotSent(_));
            if !cached_connection_broke || fresh_connection_tried {
                return Err(Error::new(error.status(), format!("server {address}: {error}")));
            }
            fresh_connection_tried = true;
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
                self.cache_map(table_id, tablets)
            }
        };
        self.tablet_in(table_id, &map, hash)
    }

    /// Keeps `tablets` as `table_id`'s map.
    fn cache_map(&self, table_id: TableId, tablets: Vec<TabletEntry>) -> Arc<Vec<TabletEntry>> {
        let map = Arc::new(tablets);
        self.tablet_maps
            .write()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(table_id, map.clone());
        map
    }

    /// The tablet of `map` (`table_id`'s) holding `hash`; a map without one is dropped.
    fn tablet_in(
        &self,
        table_id: TableId,
        map: &[TabletEntry],
        hash: KeyHash,
    ) -> Result<TabletEntry> {
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
    /// `address`: the caller's answer, or an error after which the request may go again, as
    /// [`Inner::judge_status`] and [`Inner::judge_transport`] decide (for the async path and
    /// the blocking one alike).
    pub(crate) fn judge_attempt(
        &self,
        table_id: TableId,
        address: &str,
        request: &Request,
        result: std::result::Result<(Status, ResponseBody), RpcError>,
    ) -> Attempt {
        let mutation = is_unprotected_mutation(request);
        match result {
            Ok((status, body)) => match self.judge_status(table_id, status, mutation) {
                Judgement::Final => Attempt::Finished(Ok((status, body))),
                Judgement::Retry => Attempt::Retry(failure(status, body)),
            },
            Err(error) => {
                let judgement = self.judge_transport(table_id, address, &error, mutation);
                let unreachable = matches!(error, RpcError::Connect(_));
                let error = Error::new(error.status(), format!("master {address}: {error}"));
                match judgement {
                    Judgement::Final => Attempt::Finished(Err(error)),
                    Judgement::Retry if unreachable => Attempt::Unreachable(error),
                    Judgement::Retry => Attempt::Retry(error),
                }
            }
        }
    }

    /// The retry policy for a status a master answered to an object request (a whole request,
    /// or one item of a multi-operation) on `table_id`; `mutation` if it changes objects
    /// without an exactly-once identity. A stale map is dropped (the next attempt fetches it
    /// afresh). RETRY (no lease, a tablet at the end of its transfer, replication not
    /// confirmed in time) goes again, but for such a mutation only if
    /// `retry_ambiguous_mutations`: it may have taken effect.
    pub(crate) fn judge_status(
        &self,
        table_id: TableId,
        status: Status,
        mutation: bool,
    ) -> Judgement {
        if is_stale_map(status) {
            self.forget_table(table_id);
            return Judgement::Retry;
        }
        if status == Status::Retry && (!mutation || self.config.retry_ambiguous_mutations) {
            return Judgement::Retry;
        }
        Judgement::Final
    }

    /// The retry policy for a request on `table_id` to the master at `address` that got no
    /// answer. The connection and the table's map are dropped: the master may be gone, and
    /// the next attempt asks the coordinator who serves the tablet now. A broken protocol is
    /// final; so is a mutation that may have run (anything but a connection not made), unless
    /// `retry_ambiguous_mutations`.
    pub(crate) fn judge_transport(
        &self,
        table_id: TableId,
        address: &str,
        error: &RpcError,
        mutation: bool,
    ) -> Judgement {
        self.pool.forget(address);
        self.forget_table(table_id);
        let may_have_run = !matches!(error, RpcError::Connect(_) | RpcError::NotSent(_));
        if is_permanent(error)
            || (may_have_run && mutation && !self.config.retry_ambiguous_mutations)
        {
            return Judgement::Final;
        }
        Judgement::Retry
    }

    /// Where the next attempt of a request for `hash` of `table_id` goes, from the cached map
    /// or a fresh one. A map that shows a tablet recovering or unavailable is dropped, so the
    /// next attempt asks again.
    pub(crate) async fn route(
        &self,
        table_id: TableId,
        hash: KeyHash,
        deadline: Instant,
        unavailable: &mut UnavailableTables,
    ) -> Route {
        let tablet = match self.locate(table_id, hash, deadline).await {
            Ok(tablet) => tablet,
            Err(error) if is_final_locating(error.status) => return Route::Fail(error),
            Err(error) => return Route::Wait(error),
        };
        match tablet.state {
            TabletState::Normal => Route::Send(tablet),
            TabletState::Recovering => {
                self.forget_table(table_id);
                Route::Recovering(recovering_error(&tablet))
            }
            // Waiting cannot help: only an operator (or a backup that returns) can. But a
            // cached map may be old: believed once a fresh one says so too.
            TabletState::Unavailable => {
                self.forget_table(table_id);
                if unavailable.0.insert(table_id) {
                    Route::Wait(unavailable_error(&tablet))
                } else {
                    Route::Fail(unavailable_error(&tablet))
                }
            }
        }
    }

    /// Where a request for `hash` of `table_id`, whose tablet the map showed recovering (or
    /// whose master `stale_owner` could not be connected to), goes once the coordinator has
    /// handed it over: asked with AWAIT_TABLET_MAP, which the coordinator answers as soon as no
    /// tablet of the table recovers or is `stale_owner`'s, rather than by polling the map
    /// (while the crash is detected, then while it is recovered). One attempt, waiting less than the RPC timeout (so the answer "still
    /// recovering" arrives before the call would time out) and less than the time left: a
    /// tablet still recovering then, or no answer, is [`Route::Wait`] (the caller backs off and
    /// looks again within its deadline); a fresh map showing the tablet unavailable, or no
    /// table, is final. For callers that route one key at a time (single-object operations,
    /// enumeration): a multi-object operation must not hold its other masters' items back
    /// while one tablet recovers, and treats [`Route::Recovering`] as [`Route::Wait`].
    pub(crate) async fn await_recovery(
        &self,
        table_id: TableId,
        hash: KeyHash,
        deadline: Instant,
        recovering: Error,
        stale_owner: Option<ServerId>,
    ) -> Route {
        let Some(left) = time_left(deadline) else { return Route::Wait(recovering) };
        let rpc_timeout = self.config.rpc.request_timeout;
        let wait = left
            .min(rpc_timeout.saturating_sub(TABLET_MAP_AWAIT_MARGIN))
            .min(Duration::from_millis(u64::from(TABLET_MAP_AWAIT_MILLIS_MAX)));
        if wait.is_zero() {
            return Route::Wait(recovering);
        }
        let wait_millis = u32::try_from(wait.as_millis()).unwrap_or(TABLET_MAP_AWAIT_MILLIS_MAX);
        let stale_owner = stale_owner.unwrap_or(ServerId(0));
        let request = Request::AwaitTabletMap { table_id, wait_millis, stale_owner };
        let address = &self.config.coordinator_address;
        let tablets = match self.pool.call_coordinator_within(address, &request, left).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::AwaitTabletMap { tablets }))) => {
                tablets
            }
            Ok((status, body)) if is_final_locating(status) => {
                return Route::Fail(failure(status, body))
            }
            // RETRY (a standby, or a coordinator between two states), a transport failure:
            // the caller's backoff, then the usual path.
            _ => return Route::Wait(recovering),
        };
        let map = self.cache_map(table_id, tablets);
        match self.tablet_in(table_id, &map, hash) {
            Ok(tablet) if tablet.state == TabletState::Normal => Route::Send(tablet),
            Ok(tablet) if tablet.state == TabletState::Unavailable => {
                self.forget_table(table_id);
                Route::Fail(unavailable_error(&tablet))
            }
            Ok(_) => {
                self.forget_table(table_id);
                Route::Wait(recovering)
            }
            Err(error) => Route::Wait(error),
        }
    }

    /// Sends a single-object request to the key's master, refreshing the map and retrying as
    /// needed (a mutation exactly once, see [`Inner::prepare`]). Returns the first
    /// non-retryable status with its body.
    pub(crate) async fn object_call(
        &self,
        table_id: TableId,
        key: &Bytes,
        request: Request,
    ) -> Result<(Status, ResponseBody)> {
        check_key(key)?;
        let deadline = operation_deadline(self.config.operation_timeout);
        let mut call = self.prepare(request, deadline).await?;
        self.object_call_until(table_id, key, &mut call, deadline, None).await
    }

    /// [`Inner::object_call`] with the operation's deadline given. `failed`: the error of an
    /// attempt the caller already made (the blocking client's direct one, judged retryable by
    /// [`Inner::judge_attempt`]); the loop then backs off before its first attempt, as it does
    /// after each of its own, and reports that error if the deadline has passed already.
    pub(crate) async fn object_call_until(
        &self,
        table_id: TableId,
        key: &Bytes,
        call: &mut ObjectCall,
        deadline: Instant,
        failed: Option<Error>,
    ) -> Result<(Status, ResponseBody)> {
        let hash = key_hash(table_id, key);
        let mut backoff = Backoff::for_client();
        let mut unavailable = UnavailableTables::default();
        if failed.is_some() {
            self.pause(&mut backoff, deadline).await;
        }
        let mut last = failed;
        // The master of the key's tablet that could not be connected to, if the last attempt
        // found it so: the next one waits at the coordinator for the tablet to move.
        let mut unreachable: Option<ServerId> = None;
        loop {
            // Out of time: the last attempt's failure says why (without one, an attempt still
            // goes to report what stands in the way, sending nothing).
            if time_left(deadline).is_none() {
                if let Some(error) = last {
                    return Err(error);
                }
            }
            let routed = match (unreachable.take(), last.clone()) {
                (Some(owner), Some(error)) => {
                    self.await_recovery(table_id, hash, deadline, error, Some(owner)).await
                }
                _ => match self.route(table_id, hash, deadline, &mut unavailable).await {
                    Route::Recovering(error) => {
                        self.await_recovery(table_id, hash, deadline, error, None).await
                    }
                    routed => routed,
                },
            };
            let error = match routed {
                Route::Fail(error) => return Err(error),
                Route::Wait(error) | Route::Recovering(error) => error,
                Route::Send(tablet) => {
                    let address = &tablet.owner_address;
                    let Some(left) = time_left(deadline) else {
                        return Err(out_of_time(&format!("master {address}")));
                    };
                    if call.ticket.is_some() {
                        // A mutation that retries for long keeps its lease alive.
                        self.lease_agent.renew_if_due(&self.me);
                        call.refresh_identity();
                    }
                    match self.send_once(table_id, address, &call.request, left).await {
                        Attempt::Finished(outcome) if call.lease_expired(&outcome) => {
                            self.retake_ticket(call, deadline).await?;
                            continue;
                        }
                        Attempt::Finished(outcome) => return outcome,
                        Attempt::Retry(error) => {
                            call.may_have_run |= may_have_run(&error);
                            error
                        }
                        Attempt::Unreachable(error) => {
                            unreachable = Some(tablet.owner);
                            error
                        }
                    }
                }
            };
            last = Some(error);
            self.pause(&mut backoff, deadline).await;
        }
    }

    /// Sends an object `request` once to the master at `address`, within `left` (the time
    /// its operation has left), and judges the outcome.
    pub(crate) async fn send_once(
        &self,
        table_id: TableId,
        address: &str,
        request: &Request,
        left: Duration,
    ) -> Attempt {
        let sent = self.pool.call_within(address, request, left).await;
        self.judge_attempt(table_id, address, request, sent)
    }
}
