//! Request handling and the tasks that tell masters about their tablets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::Environment;
use stratus_meta::{MetaError, MetaOperation, MetaStore};
use stratus_rpc::{Backoff, ChannelPool, Handled, RpcConfig, Service, UserDirectory};
use stratus_types::limits::{
    SERVERS_MAX, SERVER_ADDRESS_BYTES_MAX, SERVER_SPAN_MAX, TABLES_MAX, TABLETS_PER_TABLE_MAX,
    TABLET_MAP_AWAIT_MILLIS_MAX, TABLE_NAME_BYTES_MAX,
};
use stratus_types::{HashRange, LeaseId, SegmentId, ServerId, TableId, TabletState, Tier};
use stratus_wire::{
    decode_request, encode_error_response, encode_response, FrameHeader, Request, Response,
    ResponseBody, ServerEntry, ServerStatus, ServiceMask, Status, TableEntry, TabletEntry,
};
use tokio::sync::Mutex;

use crate::client_leases::{ClientLeases, LeaseIdPermutation, LeaseRefusal, CLIENT_LEASE_TERM};
use crate::metrics::CoordinatorCounters;
use crate::records::{
    put_counter, put_log_head, put_server, put_table, table_key, CoordinatorState, LogHead,
    TableRecord, TabletRecord, TabletSplit, NEXT_CLIENT_LEASE_KEY, NEXT_SERVER_ID_KEY,
    NEXT_TABLE_ID_KEY,
};
use crate::recovery::{
    FailureDetectorConfig, RecoveryPools, Suspects, Unrecoverable, LEASE_DURATION, LEASE_MARGIN,
};

/// How long a CREATE_TABLE or DROP_TABLE waits for its masters' first acknowledgement before
/// answering; delivery continues in the background after that.
const FIRST_DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// How long the coordinator keeps re-sending a tablet assignment to an unresponsive master.
const DELIVERY_PERSISTENCE: Duration = Duration::from_secs(120);

/// How long the coordinator waits for a master to transfer a tablet (TRANSFER_TABLET): every
/// object is copied to the target and made durable there, at some tens of MB/s at least even
/// on a small machine, so this covers tablets of several GB; a transfer that takes longer is
/// abandoned and the tablet stays where it was.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);

/// Tries at telling a failed transfer's target to drop its copy: the copy only costs memory
/// until the range next arrives there, so a target unreachable for a few seconds is left
/// with it rather than holding the migration lock longer.
const ABANDON_ATTEMPTS_MAX: usize = 5;

/// The partial copy a failed transfer may have left on its target.
struct AbandonedCopy {
    target: ServerId,
    address: String,
    range: HashRange,
    transfer_epoch: u64,
}

/// How long one TRANSFER_TABLET request waits for its answer before the coordinator asks
/// again (on a fresh connection). The source answers a repeated request with IN_PROGRESS while
/// the transfer runs and with its outcome once it ended, so an answer lost on a connection
/// that broke or stalled costs seconds, not [`TRANSFER_TIMEOUT`], of the tablet being
/// served by no one.
const TRANSFER_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// How long a restarted coordinator waits for a server it remembers to answer a ping.
const START_VERIFICATION_PATIENCE: Duration = Duration::from_secs(3);

/// How often an AWAIT_TABLET_MAP looks at its map again without being woken: a backstop, since
/// every change that ends a wait wakes it (a recovery committed or found impossible, a table
/// dropped). Each look locks the state and builds the map, so it is rare: a client polling
/// GET_TABLET_MAP did so up to ten times a second.
const TABLET_MAP_AWAIT_RECHECK: Duration = Duration::from_millis(500);

/// The coordinator service.
#[derive(Clone, Debug)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    meta: Arc<dyn MetaStore>,
    pub(crate) state: Mutex<CoordinatorState>,
    pub(crate) pool: ChannelPool,
    pub(crate) environment: Environment,
    placement_cursor: AtomicU64,
    /// Crashed masters whose recovery is running (at most one recovery per crashed master).
    pub(crate) recoveries: Mutex<BTreeSet<ServerId>>,
    pub(crate) recovery_pools: RecoveryPools,
    /// Who may hold a lease, and when each last got one. Its own short lock, never held across
    /// I/O: renewals must not wait behind metadata fsyncs under the state lock, or a slow
    /// disk would let every master's lease run out.
    pub(crate) leases: std::sync::Mutex<LeaseTable>,
    /// Masters' newest reported log heads. Its own lock, held across the persist of a new
    /// head, so a recovery that reads a head waits for a report in flight.
    pub(crate) log_heads: Mutex<BTreeMap<ServerId, LogHead>>,
    /// When this coordinator started: a lease granted by an earlier incarnation ends at most
    /// [`LEASE_DURATION`] after this.
    pub(crate) started_at: tokio::time::Instant,
    /// Pings each suspect missed in a row (the failure detector's count).
    pub(crate) ping_misses: std::sync::Mutex<BTreeMap<ServerId, u32>>,
    /// The failure detector's settings, once it runs (hints are ignored before).
    pub(crate) detector: std::sync::OnceLock<FailureDetectorConfig>,
    /// Suspects being checked, and recently checked (rate-limits hints).
    pub(crate) suspects: std::sync::Mutex<Suspects>,
    /// Crashed masters whose recovery is impossible (no complete log), until it finishes.
    /// Not persisted: a restarted coordinator finds the same again, and an operator who had
    /// accepted a loss accepts it again.
    pub(crate) unrecoverable: std::sync::Mutex<BTreeMap<ServerId, Unrecoverable>>,
    /// Since when no backup has held anything of a crashed master's reported log: once that
    /// lasted `LOG_MISSING_PATIENCE`, its recovery is impossible.
    pub(crate) log_missing_since: std::sync::Mutex<BTreeMap<ServerId, tokio::time::Instant>>,
    /// What it has done since it started, for its metrics.
    pub(crate) counters: CoordinatorCounters,
    /// Whether this coordinator may act now (None: it is the only one, it always may).
    authority: Option<Arc<dyn Authority>>,
    /// Held by a migration from start to end, and by a split: one at a time, so a tablet
    /// being moved is never cut, and a failed migration's hand-back (TAKE to the source) is
    /// delivered before another migration can start.
    migration: Mutex<()>,
    /// Connections for TRANSFER_TABLET, whose answer takes as long as the copy.
    transfer_pool: ChannelPool,
    /// Clients' leases (exactly-once). Its own short lock, never held across I/O.
    pub(crate) client_leases: std::sync::Mutex<ClientLeases>,
    /// The named users as this coordinator's own RPC layer checks them and its servers'
    /// long polls receive them; replaced after every change of users or tables.
    pub(crate) users: Arc<UserDirectory>,
    /// The servers' GET_USER_DIRECTORY long polls in flight, by the version they name.
    pub(crate) directory_polls: crate::users::DirectoryPolls,
    /// Woken whenever a recovery hands tablets over or is found impossible, and when a table
    /// is dropped: AWAIT_TABLET_MAP requests look at their map again.
    pub(crate) recoveries_settled: tokio::sync::Notify,
}

/// Whether a coordinator is the cluster's active coordinator right now.
///
/// One coordinator alone always is. Of several (with etcd), only the one holding the
/// leadership is, and only while it certainly still holds it: it grants master leases only
/// then, so that a deposed coordinator cannot keep a master serving that its successor declared
/// crashed (its metadata writes are fenced by the store itself).
pub trait Authority: Send + Sync + std::fmt::Debug {
    /// True while no other coordinator can be active.
    fn is_active(&self) -> bool;
}

/// Which servers may hold a lease, and when each was last granted one.
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    /// Servers that are up. A server leaves before its crash is persisted, so no lease is
    /// granted from the moment a declaration begins.
    pub(crate) members: BTreeSet<ServerId>,
    /// When each server's last lease was granted (when its request arrived).
    pub(crate) granted: BTreeMap<ServerId, tokio::time::Instant>,
    /// Until when an earlier coordinator may still have granted leases, when later than this
    /// one's start (see [`Coordinator::predecessor_may_grant_until`]).
    pub(crate) predecessor_grants_until: Option<tokio::time::Instant>,
}

/// A failed request: status and message for the error response.
type Failure = (Status, String);

impl Coordinator {
    /// Loads the coordinator's state from `meta`.
    pub fn open(
        meta: Arc<dyn MetaStore>,
        environment: Environment,
    ) -> Result<Coordinator, MetaError> {
        Coordinator::open_with_authority(meta, environment, None)
    }

    /// [`Coordinator::open`] for one of several coordinators: it grants master leases only
    /// while `authority` says it is the active one.
    pub fn open_with_authority(
        meta: Arc<dyn MetaStore>,
        environment: Environment,
        authority: Option<Arc<dyn Authority>>,
    ) -> Result<Coordinator, MetaError> {
        let mut state = CoordinatorState::load(&*meta)?;
        let members = state.servers_in(ServerStatus::Up).map(|server| server.server_id).collect();
        let log_heads = std::mem::take(&mut state.log_heads);
        let client_leases =
            ClientLeases::starting(state.client_lease_ids_reserved, tokio::time::Instant::now());
        tracing::info!(
            servers = state.servers.len(),
            tables = state.tables.len(),
            "coordinator state loaded"
        );
        let rpc = RpcConfig { request_timeout: Duration::from_secs(1), ..RpcConfig::default() };
        let pool = ChannelPool::new(environment.network.clone(), rpc);
        let transfer_rpc =
            RpcConfig { request_timeout: TRANSFER_ANSWER_WAIT, ..RpcConfig::default() };
        let transfer_pool = ChannelPool::new(environment.network.clone(), transfer_rpc);
        let inner = Inner {
            meta,
            state: Mutex::new(state),
            pool,
            recovery_pools: RecoveryPools::new(environment.network.clone()),
            environment,
            placement_cursor: AtomicU64::new(0),
            recoveries: Mutex::new(BTreeSet::new()),
            leases: std::sync::Mutex::new(LeaseTable {
                members,
                granted: BTreeMap::new(),
                predecessor_grants_until: None,
            }),
            log_heads: Mutex::new(log_heads),
            started_at: tokio::time::Instant::now(),
            ping_misses: std::sync::Mutex::new(BTreeMap::new()),
            detector: std::sync::OnceLock::new(),
            suspects: std::sync::Mutex::new(Suspects::default()),
            unrecoverable: std::sync::Mutex::new(BTreeMap::new()),
            log_missing_since: std::sync::Mutex::new(BTreeMap::new()),
            counters: CoordinatorCounters::default(),
            authority,
            migration: Mutex::new(()),
            transfer_pool,
            client_leases: std::sync::Mutex::new(client_leases),
            users: Arc::new(UserDirectory::new()),
            directory_polls: crate::users::DirectoryPolls::default(),
            recoveries_settled: tokio::sync::Notify::new(),
        };
        inner.publish_users(&inner.state.try_lock().expect("nobody else holds it yet"));
        Ok(Coordinator { inner: Arc::new(inner) })
    }

    /// Re-sends every tablet assignment to its master. Called once after start: a coordinator
    /// that crashed between persisting a table and informing its masters completes the job.
    /// Every assignment goes out at one new epoch: an earlier incarnation may have left a
    /// migration half done (the source transferring, at an epoch this one does not know),
    /// and the assignments in the map must win over it.
    pub async fn redeliver_assignments(&self) {
        let (epoch, assignments) = {
            let mut state = self.inner.state.lock().await;
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            if let Err((status, message)) = self.inner.persist(vec![persist_epoch]).await {
                tracing::warn!(%status, %message, "assignments not re-sent: no new epoch");
                return;
            }
            let assignments: Vec<(TableId, TabletRecord)> = state
                .tables
                .values()
                .flat_map(|table| {
                    table.tablets.iter().map(|tablet| (table.table_id, tablet.clone()))
                })
                .collect();
            (epoch, assignments)
        };
        for (table_id, tablet) in assignments {
            let inner = self.inner.clone();
            tokio::spawn(async move { deliver(inner, table_id, tablet, true, epoch).await });
        }
    }

    /// After a restart: pings every server the store lists as up, marks those that do not
    /// answer within [`START_VERIFICATION_PATIENCE`] as crashed (they went away while the
    /// coordinator was down, for example when a local cluster is restarted), then re-sends
    /// every tablet assignment. Full failure detection arrives with crash recovery.
    pub async fn verify_servers_and_redeliver(&self) {
        let servers: Vec<ServerEntry> =
            self.inner.state.lock().await.servers_in(ServerStatus::Up).cloned().collect();
        let mut checks = tokio::task::JoinSet::new();
        for server in servers {
            let inner = self.inner.clone();
            checks.spawn(async move {
                let alive = inner.answers_ping(&server.address).await;
                (server, alive)
            });
        }
        let mut gone = Vec::new();
        while let Some(joined) = checks.join_next().await {
            if let Ok((server, false)) = joined {
                gone.push(ServerEntry { status: ServerStatus::Crashed, ..server });
            }
        }
        if !gone.is_empty() {
            let mut state = self.inner.state.lock().await;
            let batch = gone.iter().map(put_server).collect();
            if self.inner.persist(batch).await.is_ok() {
                let counter = &self.inner.counters.servers_declared_crashed;
                CoordinatorCounters::count(counter, gone.len() as u64);
                for server in gone {
                    self.inner.leases().members.remove(&server.server_id);
                    tracing::warn!(server_id = %server.server_id, address = %server.address, "server did not answer after coordinator start; marked crashed");
                    state.servers.insert(server.server_id, server);
                }
            }
        }
        self.redeliver_assignments().await;
        // Tablets of servers that crashed (now or before the restart) are recovered.
        self.inner.resume_recoveries().await;
    }

    /// Runs the failure detector until the coordinator stops: servers that miss pings are
    /// declared crashed and their tablets recovered.
    pub async fn run_failure_detector(&self, config: FailureDetectorConfig) {
        self.inner.clone().run_failure_detector(config).await
    }

    /// Crashed masters whose recovery is impossible (no complete log), with the reason and
    /// whether an operator accepted the loss (tests and status).
    pub fn unrecoverable_masters(&self) -> Vec<(ServerId, String, bool)> {
        self.inner
            .unrecoverable()
            .iter()
            .map(|(id, entry)| (*id, entry.reason.clone(), entry.loss_accepted))
            .collect()
    }

    /// An earlier coordinator may believe it is active, and grant master leases, for up to
    /// `window` from now (a standby that took over from a holder it judged gone: were the
    /// judgement wrong, the holder would go on until its own leadership lease ran out). No
    /// server is declared crashed for missed pings until a lease granted by then has ended;
    /// serving is not delayed.
    pub fn predecessor_may_grant_until(&self, window: Duration) {
        let until = tokio::time::Instant::now() + window;
        let mut leases = self.inner.leases();
        leases.predecessor_grants_until =
            Some(leases.predecessor_grants_until.map_or(until, |earlier| earlier.max(until)));
    }

    /// Declares `server_id` crashed now and starts recovering its tablets (tests and tools).
    pub async fn declare_crashed(&self, server_id: ServerId) {
        self.inner.declare_crashed(server_id, "requested", false).await;
    }

    /// Hands out client lease ids through `permutation` (a process with a cluster secret does,
    /// before it serves): unguessable ids keep a client from naming another's lease.
    pub fn hide_lease_ids(&self, permutation: LeaseIdPermutation) {
        self.inner.client_leases().hide_ids(permutation);
    }

    /// The named users, as the coordinator's RPC layer must check them
    /// (`Membership::serve_users`).
    pub fn user_directory(&self) -> Arc<UserDirectory> {
        self.inner.users.clone()
    }

    /// A snapshot of the state (for tests and status).
    pub async fn state(&self) -> CoordinatorState {
        self.inner.state.lock().await.clone()
    }
}

impl Service for Coordinator {
    fn handle(&self, header: &FrameHeader, body: Bytes, _out: &mut BytesMut) -> Handled {
        let inner = self.inner.clone();
        let request_id = header.request_id;
        let opcode_code = header.opcode_code;
        Handled::Later(Box::pin(async move {
            let mut out = BytesMut::new();
            match decode_request(opcode_code, body) {
                Ok(request) => match inner.execute(request).await {
                    Ok(response) => encode_response(&mut out, request_id, Status::Ok, &response),
                    Err((status, message)) => {
                        encode_error_response(&mut out, request_id, opcode_code, status, &message)
                    }
                },
                Err(error) => encode_error_response(
                    &mut out,
                    request_id,
                    opcode_code,
                    error.status(),
                    &error.to_string(),
                ),
            }
            out
        }))
    }
}

impl Inner {
    /// True unless this coordinator is one of several and not certainly the active one.
    pub(crate) fn is_active(&self) -> bool {
        self.authority.as_ref().is_none_or(|authority| authority.is_active())
    }

    async fn execute(self: &Arc<Self>, request: Request) -> Result<Response, Failure> {
        if !self.is_active() {
            // A deposed coordinator (paused, then resumed) answers nothing from its memory,
            // which its successor may have overtaken: the caller retries, elsewhere.
            return Err((Status::Retry, "this coordinator is not the active one".to_string()));
        }
        match request {
            Request::Ping => Ok(Response::Ping),
            Request::EnlistServer { address, services, previous_server_id, failure_domain } => {
                self.enlist(address, services, previous_server_id, failure_domain).await
            }
            Request::ServerStopping { server_id } => self.server_stopping(server_id).await,
            Request::GetServerList => {
                let state = self.state.lock().await;
                Ok(Response::GetServerList { servers: state.servers.values().cloned().collect() })
            }
            Request::CreateTable { name, server_span, tier } => {
                self.create_table(name, server_span, tier).await
            }
            Request::DropTable { name } => self.drop_table(name).await,
            Request::SplitTablet { name, split_hash } => self.split_tablet(name, split_hash).await,
            Request::MigrateTablet { name, start_hash, target } => {
                self.migrate_tablet(name, start_hash, target).await
            }
            Request::GetTableId { name } => {
                let state = self.state.lock().await;
                match state.tables.get(&name) {
                    Some(table) => Ok(Response::GetTableId { table_id: table.table_id }),
                    None => Err((Status::TableDoesntExist, format!("no table named {name:?}"))),
                }
            }
            Request::ListTables => {
                let state = self.state.lock().await;
                let tables = state
                    .tables
                    .iter()
                    .map(|(name, table)| TableEntry {
                        name: name.clone(),
                        table_id: table.table_id,
                        tablet_count: u32::try_from(table.tablets.len()).unwrap_or(u32::MAX),
                        tier: table.tier,
                    })
                    .collect();
                Ok(Response::ListTables { tables })
            }
            Request::GetTabletMap { table_id } => self.tablet_map(table_id).await,
            Request::AwaitTabletMap { table_id, wait_millis, stale_owner } => {
                self.await_tablet_map(table_id, wait_millis, stale_owner).await
            }
            Request::RenewLease { server_id } => self.renew_lease(server_id).await,
            Request::SetLogHead { server_id, segment_id, epoch } => {
                self.set_log_head(server_id, LogHead { segment_id, epoch }).await
            }
            Request::HintServerCrashed { server_id } => self.hint_server_crashed(server_id).await,
            Request::RecoveryAcceptLoss { server_id } => self.accept_loss(server_id).await,
            Request::ClientLease { lease } => self.client_lease(lease).await,
            Request::CheckClientLeases { leases } => Ok(self.check_client_leases(&leases)),
            Request::SetUser { user } => self.set_user(user).await,
            Request::DeleteUser { name } => self.delete_user(name).await,
            Request::ListUsers => self.list_users().await,
            Request::GetUserDirectory { known_version } => self.user_directory(known_version).await,
            other => Err((
                Status::UnimplementedRequest,
                format!("{:?} is served by masters, not the coordinator", other.opcode()),
            )),
        }
    }

    /// Makes `batch` durable; the caller updates memory only after this succeeds, so memory
    /// never runs ahead of what a restarted coordinator would load.
    pub(crate) async fn persist(&self, batch: Vec<MetaOperation>) -> Result<(), Failure> {
        let meta = self.meta.clone();
        let outcome = stratus_env::run_blocking(move || meta.apply(&batch)).await;
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(
                error @ (MetaError::Unavailable { .. }
                | MetaError::Fenced { .. }
                | MetaError::Poisoned { .. }),
            )) => {
                // Nothing was applied, or this coordinator is stopping and its successor will
                // know: the caller's retry settles it.
                tracing::error!(%error, "metadata store refused a write");
                Err((Status::Retry, format!("metadata store: {error}")))
            }
            Ok(Err(error)) => {
                tracing::error!(%error, "metadata store refused a write");
                Err((Status::InternalError, format!("metadata store: {error}")))
            }
            Err(error) => {
                Err((Status::InternalError, format!("metadata store task failed: {error}")))
            }
        }
    }

    async fn answers_ping(&self, address: &str) -> bool {
        let deadline = tokio::time::Instant::now() + START_VERIFICATION_PATIENCE;
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
        loop {
            if let Ok((Status::Ok, _)) = self.pool.call(address, &Request::Ping).await {
                return true;
            }
            self.pool.forget(address);
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(backoff.next_delay(&*self.environment.entropy)).await;
        }
    }

    /// ENLIST_SERVER: gives the server its id (a restart keeps its index, see
    /// [`CoordinatorState::id_for_enlistment`]) and takes any earlier incarnation still listed
    /// as up for crashed: it restarted faster than pings could tell.
    pub(crate) async fn enlist(
        self: &Arc<Self>,
        address: String,
        services: ServiceMask,
        previous_server_id: ServerId,
        failure_domain: String,
    ) -> Result<Response, Failure> {
        if address.is_empty() || address.len() > SERVER_ADDRESS_BYTES_MAX {
            return Err((
                Status::InvalidParameter,
                "server address must be 1..=256 bytes".to_string(),
            ));
        }
        if let Some(problem) = stratus_types::limits::failure_domain_problem(&failure_domain) {
            return Err((Status::InvalidParameter, problem));
        }
        let mut state = self.state.lock().await;
        if state.servers.len() >= SERVERS_MAX {
            return Err((
                Status::InvalidParameter,
                format!("cluster is at its limit of {SERVERS_MAX} servers"),
            ));
        }
        let (server_id, restarted) = state.id_for_enlistment(previous_server_id);
        let entry = ServerEntry {
            server_id,
            address: address.clone(),
            services,
            status: ServerStatus::Up,
            failure_domain: failure_domain.clone(),
        };
        let mut batch = vec![put_server(&entry)];
        if !restarted {
            let next_index = u64::from(server_id.index()) + 1;
            batch.push(put_counter(NEXT_SERVER_ID_KEY, next_index));
        }
        // An earlier incarnation still listed as up (at this index, or at this address for a
        // server that keeps no identity) is that server restarted: the old one is gone.
        let replaced: Vec<ServerEntry> = state
            .servers
            .values()
            .filter(|old| old.status == ServerStatus::Up)
            .filter(|old| {
                old.address == address || (restarted && old.server_id.index() == server_id.index())
            })
            .map(|old| ServerEntry { status: ServerStatus::Crashed, ..old.clone() })
            .collect();
        batch.extend(replaced.iter().map(put_server));
        self.persist(batch).await?;
        if !restarted {
            state.next_server_index = u64::from(server_id.index()) + 1;
        }
        {
            let mut leases = self.leases();
            for old in &replaced {
                leases.members.remove(&old.server_id);
            }
            leases.members.insert(server_id);
        }
        for old in &replaced {
            tracing::warn!(old = %old.server_id, new = %server_id, %address, "server restarted before it was found gone; recovering the old one's tablets");
            state.servers.insert(old.server_id, old.clone());
        }
        state.servers.insert(server_id, entry);
        drop(state);
        CoordinatorCounters::count(&self.counters.enlistments, 1);
        CoordinatorCounters::count(&self.counters.servers_declared_crashed, replaced.len() as u64);
        if restarted {
            tracing::info!(%server_id, %address, previous = %previous_server_id, "server enlisted again after a restart");
        } else {
            if previous_server_id.is_valid() {
                tracing::warn!(%server_id, %address, previous = %previous_server_id, "a server enlisted with an id this cluster never issued (another cluster's data directory?); it gets a new index");
            }
            tracing::info!(%server_id, %address, %failure_domain, "server enlisted");
        }
        for old in replaced {
            self.start_recovery(old.server_id).await;
        }
        Ok(Response::EnlistServer { server_id })
    }

    /// SERVER_STOPPING: the server stops in order. It is recorded as stopped (no further
    /// lease) and its tablets are recovered as a crashed server's are; the recovery still
    /// waits out any lease it holds, as every recovery does.
    async fn server_stopping(self: &Arc<Self>, server_id: ServerId) -> Result<Response, Failure> {
        {
            let mut state = self.state.lock().await;
            let Some(server) = state.servers.get(&server_id).cloned() else {
                return Err((Status::InvalidParameter, format!("no server {server_id}")));
            };
            if server.status != ServerStatus::Up {
                // A repeated notice, or the server was declared crashed first.
                return Ok(Response::ServerStopping);
            }
            let stopped = ServerEntry { status: ServerStatus::Stopped, ..server };
            self.leases().members.remove(&server_id);
            if let Err(failure) = self.persist(vec![put_server(&stopped)]).await {
                self.leases().members.insert(server_id);
                return Err(failure);
            }
            tracing::info!(%server_id, address = %stopped.address, "server stopped in order; recovering its tablets from its replicas");
            CoordinatorCounters::count(&self.counters.servers_stopped_in_order, 1);
            state.servers.insert(server_id, stopped);
        }
        self.start_recovery(server_id).await;
        Ok(Response::ServerStopping)
    }

    /// CREATE_TABLE: a new table of `server_span` tablets on masters dealt round-robin, whose
    /// objects live in `tier`. A repeat (a retry after a lost answer) gets the existing id;
    /// one that names another tier is refused: answering it with the id would let the caller
    /// believe its objects live where it asked.
    async fn create_table(
        self: &Arc<Self>,
        name: String,
        server_span: u32,
        tier: Tier,
    ) -> Result<Response, Failure> {
        if name.is_empty() || name.len() > TABLE_NAME_BYTES_MAX {
            return Err((Status::InvalidParameter, "table name must be 1..=256 bytes".to_string()));
        }
        if server_span == 0 || server_span > SERVER_SPAN_MAX {
            return Err((
                Status::InvalidParameter,
                format!("server span must be 1..={SERVER_SPAN_MAX}"),
            ));
        }
        let (table_id, record, epoch) = {
            let mut state = self.state.lock().await;
            if let Some(existing) = state.tables.get(&name) {
                if existing.tier != tier {
                    return Err((
                        Status::InvalidParameter,
                        format!(
                            "table {name:?} exists with tier {}, not {tier} (a table's tier \
                             never changes)",
                            existing.tier
                        ),
                    ));
                }
                return Ok(Response::CreateTable { table_id: existing.table_id });
            }
            if state.tables.len() >= TABLES_MAX {
                return Err((
                    Status::InvalidParameter,
                    format!("cluster is at its limit of {TABLES_MAX} tables"),
                ));
            }
            let masters: Vec<ServerId> = state
                .servers
                .values()
                .filter(|server| server.status == ServerStatus::Up && server.services.has_master())
                .map(|server| server.server_id)
                .collect();
            if masters.is_empty() {
                return Err((Status::NoTableSpace, "no master is up".to_string()));
            }
            let table_id = TableId(state.next_table_id);
            let first = self.placement_cursor.fetch_add(u64::from(server_span), Ordering::Relaxed);
            let tablets = HashRange::split_evenly(server_span)
                .into_iter()
                .enumerate()
                .map(|(index, range)| {
                    let slot = (first as usize).wrapping_add(index) % masters.len();
                    TabletRecord { range, owner: masters[slot], creation_segment: SegmentId(0) }
                })
                .collect();
            let record = TableRecord { table_id, tier, tablets };
            self.check_directory_with_table(&state, &name, &record)?;
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            self.persist(vec![
                put_counter(NEXT_TABLE_ID_KEY, table_id.0 + 1),
                put_table(&name, &record),
                persist_epoch,
            ])
            .await?;
            state.next_table_id = table_id.0 + 1;
            state.tables.insert(name.clone(), record.clone());
            self.publish_users(&state);
            (table_id, record, epoch)
        };
        tracing::info!(%table_id, %name, server_span, %tier, "table created");
        self.deliver_all(table_id, &record, true, epoch).await;
        Ok(Response::CreateTable { table_id })
    }

    async fn drop_table(self: &Arc<Self>, name: String) -> Result<Response, Failure> {
        let (record, epoch) = {
            let mut state = self.state.lock().await;
            let Some(record) = state.tables.get(&name).cloned() else {
                return Err((Status::TableDoesntExist, format!("no table named {name:?}")));
            };
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            self.persist(vec![MetaOperation::Delete { key: table_key(&name) }, persist_epoch])
                .await?;
            state.tables.remove(&name);
            self.publish_users(&state);
            (record, epoch)
        };
        // A client waiting for one of its tablets to recover learns that the table is gone.
        self.recoveries_settled.notify_waiters();
        tracing::info!(table_id = %record.table_id, %name, "table dropped");
        self.deliver_all(record.table_id, &record, false, epoch).await;
        Ok(Response::DropTable)
    }

    /// SPLIT_TABLET: cuts the tablet of table `name` holding `split_hash` into `[start,
    /// split_hash − 1]` and `[split_hash, end]` on the same master. The new map is persisted in
    /// one batch before anything acts on it; then the master is told to serve both halves (it
    /// serves every hash of them already: a split moves no object). A client with the old map
    /// keeps working, and its enumeration of the old range is refused with UNKNOWN_TABLET
    /// once the master has cut its range, which makes it refresh.
    async fn split_tablet(
        self: &Arc<Self>,
        name: String,
        split_hash: u64,
    ) -> Result<Response, Failure> {
        if name.is_empty() || name.len() > TABLE_NAME_BYTES_MAX {
            return Err((Status::InvalidParameter, "table name must be 1..=256 bytes".to_string()));
        }
        let _no_migration = self.migration.lock().await;
        let (table_id, tier, halves, epoch) = {
            let mut state = self.state.lock().await;
            let Some(table) = state.tables.get(&name) else {
                return Err((Status::TableDoesntExist, format!("no table named {name:?}")));
            };
            let (index, low, high) = match table.split_at(split_hash) {
                TabletSplit::AlreadyBoundary => return Ok(Response::SplitTablet),
                TabletSplit::Uncovered => {
                    return Err((
                        Status::InternalError,
                        format!("no tablet of {name:?} holds hash {split_hash:#x}"),
                    ))
                }
                TabletSplit::Split { index, low, high } => (index, low, high),
            };
            if table.tablets.len() >= TABLETS_PER_TABLE_MAX {
                return Err((
                    Status::InvalidParameter,
                    format!("table {name:?} is at its limit of {TABLETS_PER_TABLE_MAX} tablets"),
                ));
            }
            let owner_up = state
                .servers
                .get(&low.owner)
                .is_some_and(|server| server.status == ServerStatus::Up);
            if !owner_up {
                // Its recovery cuts the tablet by the ranges it snapshotted; splitting under it
                // would leave recovered parts matching no tablet.
                return Err((
                    Status::Retry,
                    format!("the tablet holding {split_hash:#x} is being recovered"),
                ));
            }
            let mut updated = table.clone();
            updated.apply_split(index, low.clone(), high.clone());
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            self.persist(vec![put_table(&name, &updated), persist_epoch]).await?;
            let (table_id, tier) = (updated.table_id, updated.tier);
            state.tables.insert(name.clone(), updated);
            (table_id, tier, [low, high], epoch)
        };
        tracing::info!(%table_id, %name, split_hash, "tablet split");
        let record = TableRecord { table_id, tier, tablets: halves.to_vec() };
        self.deliver_all(table_id, &record, true, epoch).await;
        Ok(Response::SplitTablet)
    }

    /// MIGRATE_TABLET: moves the tablet of table `name` starting at `start_hash` to `target`
    /// (wire-protocol.md). The source copies it (TRANSFER_TABLET); only then is the new owner,
    /// with the tablet's creation segment in the target's log, persisted in one batch, and the
    /// target told to serve it and the source to drop it. On any failure the source is told to
    /// serve it again (TAKE, which also ends a transfer still running there).
    async fn migrate_tablet(
        self: &Arc<Self>,
        name: String,
        start_hash: u64,
        target: ServerId,
    ) -> Result<Response, Failure> {
        if name.is_empty() || name.len() > TABLE_NAME_BYTES_MAX {
            return Err((Status::InvalidParameter, "table name must be 1..=256 bytes".to_string()));
        }
        let _one_at_a_time = self.migration.lock().await;
        let (table_id, tablet, source_address, target_address, transfer_epoch) = {
            let mut state = self.state.lock().await;
            let Some(table) = state.tables.get(&name) else {
                return Err((Status::TableDoesntExist, format!("no table named {name:?}")));
            };
            let Some(tablet) = table.tablets.iter().find(|tablet| tablet.range.start == start_hash)
            else {
                return Err((
                    Status::InvalidParameter,
                    format!("no tablet of {name:?} starts at {start_hash:#x} (split there first)"),
                ));
            };
            if tablet.owner == target {
                return Ok(Response::MigrateTablet);
            }
            let is_up = |server_id: ServerId| {
                state.servers.get(&server_id).filter(|server| server.status == ServerStatus::Up)
            };
            let Some(target_server) = is_up(target).filter(|server| server.services.has_master())
            else {
                return Err((
                    Status::InvalidParameter,
                    format!("server {target} is not a master that is up"),
                ));
            };
            let Some(source_server) = is_up(tablet.owner) else {
                return Err((Status::Retry, "the tablet's master is being recovered".to_string()));
            };
            let chosen = (
                table.table_id,
                tablet.clone(),
                source_server.address.clone(),
                target_server.address.clone(),
            );
            // The transfer's own epoch: the source then ignores every older assignment of the
            // range (a TAKE re-sent from before, which would make it serve the tablet beside
            // the target), and the target every older batch.
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            self.persist(vec![persist_epoch]).await?;
            (chosen.0, chosen.1, chosen.2, chosen.3, epoch)
        };
        tracing::info!(%table_id, %name, start_hash, source = %tablet.owner, %target, transfer_epoch, "migrating a tablet");
        let copy = AbandonedCopy {
            target,
            address: target_address.clone(),
            range: tablet.range,
            transfer_epoch,
        };
        let request = Request::TransferTablet {
            master_id: tablet.owner,
            table_id,
            range: tablet.range,
            assignment_epoch: transfer_epoch,
            target,
            target_address,
        };
        let (creation_segment, objects_sent) = match self
            .transfer(tablet.owner, &source_address, &request)
            .await
        {
            Ok(outcome) => outcome,
            Err((status, message)) => {
                let failure = (status, message);
                return Err(self.abandon_migration(table_id, tablet, failure, Some(copy)).await);
            }
        };
        let moved = TabletRecord { range: tablet.range, owner: target, creation_segment };
        let commit_epoch = {
            let mut state = self.state.lock().await;
            let both_up = [tablet.owner, target].iter().all(|server_id| {
                state.servers.get(server_id).is_some_and(|server| server.status == ServerStatus::Up)
            });
            let unchanged = state.tables.get(&name).filter(|table| table.table_id == table_id);
            let index =
                unchanged.and_then(|table| table.tablets.iter().position(|other| *other == tablet));
            let (Some(table), Some(index), true) = (unchanged, index, both_up) else {
                drop(state);
                let message = "the source or the target failed during the transfer".to_string();
                let failure = (Status::Retry, message);
                return Err(self.abandon_migration(table_id, tablet, failure, Some(copy)).await);
            };
            let mut updated = table.clone();
            updated.tablets[index] = moved.clone();
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            let batch = vec![put_table(&name, &updated), persist_epoch];
            if let Err(failure) = self.persist(batch).await {
                drop(state);
                // The target's copy is left alone: whether the new owner was recorded is not
                // known here (the coordinator that loads the store next knows).
                return Err(self.abandon_migration(table_id, tablet, failure, None).await);
            }
            state.tables.insert(name.clone(), updated);
            epoch
        };
        tracing::info!(%table_id, %name, start_hash, %target, objects_sent, %creation_segment, "tablet migrated");
        // The target serves the tablet, and the source frees its copy. Both are waited for
        // (bounded) under the migration lock: a DROP still on its way when the tablet is
        // migrated back to the source would drop it there.
        tokio::join!(
            deliver(self.clone(), table_id, moved, true, commit_epoch),
            deliver(self.clone(), table_id, tablet, false, commit_epoch)
        );
        Ok(Response::MigrateTablet)
    }

    /// Sends TRANSFER_TABLET to `source` until it answers with the outcome: a lost answer or
    /// IN_PROGRESS (the transfer is running) is followed by the same request again, which the
    /// source answers with the outcome once the transfer ended. Gives up after
    /// [`TRANSFER_TIMEOUT`], when the source is no longer up, or when this coordinator is no
    /// longer the active one.
    async fn transfer(
        self: &Arc<Self>,
        source: ServerId,
        address: &str,
        request: &Request,
    ) -> Result<(SegmentId, u64), Failure> {
        let deadline = tokio::time::Instant::now() + TRANSFER_TIMEOUT;
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        loop {
            let last = match self.transfer_pool.call(address, request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::TransferTablet {
                        creation_segment,
                        objects_sent,
                    }),
                )) => return Ok((creation_segment, objects_sent)),
                Ok((Status::InProgress, _)) => "the transfer is still running".to_string(),
                Ok((status, body)) => {
                    let message = format!("the source refused the transfer: {status} {body:?}");
                    let status = if status == Status::Ok { Status::InternalError } else { status };
                    return Err((status, message));
                }
                Err(error) => {
                    self.transfer_pool.forget(address);
                    format!("transfer from {address}: {error}")
                }
            };
            let source_up = {
                let state = self.state.lock().await;
                state.servers.get(&source).is_some_and(|server| server.status == ServerStatus::Up)
            };
            if !source_up || !self.is_active() || tokio::time::Instant::now() >= deadline {
                return Err((Status::Retry, last));
            }
            tokio::time::sleep(backoff.next_delay(&*self.environment.entropy)).await;
        }
    }

    /// After a failed transfer: tells the source to serve `tablet` again (and to end a
    /// transfer still running), waiting until it acknowledged, was declared crashed (then its
    /// recovery serves the tablet), or gave up after [`DELIVERY_PERSISTENCE`]; then tells the
    /// target to drop the partial `copy` (when given). Returns the failure to report.
    async fn abandon_migration(
        self: &Arc<Self>,
        table_id: TableId,
        tablet: TabletRecord,
        (status, message): Failure,
        copy: Option<AbandonedCopy>,
    ) -> Failure {
        tracing::warn!(%table_id, source = %tablet.owner, %status, %message, "migration failed; the source keeps the tablet");
        // At a new epoch, above the transfer's: the source has seen that one.
        let epoch = {
            let mut state = self.state.lock().await;
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            if let Err((_, reason)) = self.persist(vec![persist_epoch]).await {
                // This coordinator cannot persist (it lost the leadership, or its store
                // failed): the coordinator that starts or takes over next re-sends every
                // assignment at a new epoch, the source's included. Until then a tablet the
                // source already handed off is served by no one.
                tracing::warn!(%table_id, %reason, "the hand-back waits for the next coordinator");
                return (status, message);
            }
            epoch
        };
        deliver(self.clone(), table_id, tablet, true, epoch).await;
        if let Some(copy) = copy {
            // After the source's TAKE: its transfer has ended, so no batch of it starts after
            // this (one still on its way is refused by the target once the copy is abandoned).
            self.drop_abandoned_copy(table_id, copy).await;
        }
        (status, message)
    }

    /// Tells the target of a failed transfer to drop what the transfer copied there
    /// (ABANDON_MIGRATION), so that its memory is not held until the range next arrives there.
    /// Best effort, a few tries: a target that is down lost the copy with its memory, and one
    /// that cannot be reached keeps it, as before (it is dropped when the range next arrives
    /// there). The target itself decides whether the copy is still the transfer's to drop.
    async fn drop_abandoned_copy(self: &Arc<Self>, table_id: TableId, copy: AbandonedCopy) {
        let request = Request::AbandonMigration {
            master_id: copy.target,
            table_id,
            range: copy.range,
            assignment_epoch: copy.transfer_epoch,
        };
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        for _ in 0..ABANDON_ATTEMPTS_MAX {
            let target_up = {
                let state = self.state.lock().await;
                let server = state.servers.get(&copy.target);
                server.is_some_and(|server| server.status == ServerStatus::Up)
            };
            if !target_up || !self.is_active() {
                return;
            }
            match self.pool.call(&copy.address, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::AbandonMigration { objects_dropped }),
                )) => {
                    tracing::info!(%table_id, target = %copy.target, objects_dropped, "the target dropped the copy of a failed transfer");
                    return;
                }
                Ok((status, _)) => {
                    tracing::warn!(%status, target = %copy.target, "the target refused to drop a failed transfer's copy");
                    return;
                }
                Err(error) => {
                    self.pool.forget(&copy.address);
                    tracing::debug!(%error, target = %copy.target, "ABANDON_MIGRATION not delivered yet");
                }
            }
            tokio::time::sleep(backoff.next_delay(&*self.environment.entropy)).await;
        }
        tracing::warn!(%table_id, target = %copy.target, "a failed transfer's copy stays on its target until the range returns there");
    }

    /// Tells every owner of `record`'s tablets to take (or drop) them; waits a bounded time
    /// for the first round, then leaves the stragglers to background retries.
    async fn deliver_all(
        self: &Arc<Self>,
        table_id: TableId,
        record: &TableRecord,
        take: bool,
        epoch: u64,
    ) {
        let mut deliveries = tokio::task::JoinSet::new();
        for tablet in record.tablets.clone() {
            deliveries.spawn(deliver(self.clone(), table_id, tablet, take, epoch));
        }
        let _ = tokio::time::timeout(FIRST_DELIVERY_WAIT, async {
            while deliveries.join_next().await.is_some() {}
        })
        .await;
        deliveries.detach_all();
    }

    fn client_leases(&self) -> std::sync::MutexGuard<'_, ClientLeases> {
        self.client_leases.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// CLIENT_LEASE: a new lease (`lease` 0), or a renewal. A new lease's id is granted only
    /// below a durably reserved mark (raised a block at a time), so it is unique across
    /// restarts and failovers; an expired lease is refused with EXPIRED_LEASE.
    async fn client_lease(&self, lease: LeaseId) -> Result<Response, Failure> {
        let term_ms = u32::try_from(CLIENT_LEASE_TERM.as_millis()).unwrap_or(u32::MAX);
        if lease.0 != 0 {
            let renewed = self.client_leases().renew(lease, tokio::time::Instant::now());
            return match renewed {
                Ok(()) => Ok(Response::ClientLease { lease, term_ms }),
                Err(_) => Err((Status::ExpiredLease, format!("client lease {lease} expired"))),
            };
        }
        // Bounded: each turn either grants or durably raises the mark past the next id.
        for _ in 0..4 {
            let opened = self.client_leases().open(tokio::time::Instant::now());
            match opened {
                Ok(lease) => {
                    CoordinatorCounters::count(&self.counters.client_leases_opened, 1);
                    return Ok(Response::ClientLease { lease, term_ms });
                }
                Err(LeaseRefusal::NeedsReservation(mark)) => {
                    self.persist(vec![put_counter(NEXT_CLIENT_LEASE_KEY, mark)]).await?;
                    self.client_leases().reserved(mark);
                }
                Err(LeaseRefusal::TooMany) => {
                    return Err((Status::Retry, "too many client leases are live".to_string()))
                }
                Err(LeaseRefusal::Expired) => unreachable!("opening a lease never finds one"),
            }
        }
        Err((Status::Retry, "client lease ids could not be reserved".to_string()))
    }

    /// CHECK_CLIENT_LEASES: how long each lease stays valid at least.
    fn check_client_leases(&self, leases: &[LeaseId]) -> Response {
        let now = tokio::time::Instant::now();
        let table = self.client_leases();
        let remaining_ms = leases
            .iter()
            .map(|lease| {
                u32::try_from(table.remaining(*lease, now).as_millis()).unwrap_or(u32::MAX)
            })
            .collect();
        Response::CheckClientLeases { remaining_ms }
    }

    /// Client leases live now (for metrics).
    pub(crate) fn client_leases_live(&self) -> usize {
        self.client_leases().live(tokio::time::Instant::now())
    }

    /// The lease table.
    pub(crate) fn leases(&self) -> std::sync::MutexGuard<'_, LeaseTable> {
        self.leases.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// RENEW_LEASE: a server that is up gets [`LEASE_DURATION`] more; any other (declared
    /// crashed, removed, or unknown) is told it crashed: it then stops serving and exits. The
    /// grant and the membership check happen under the lease table's lock, which a crash
    /// declaration takes to remove the member, so no lease is granted after one begins.
    async fn renew_lease(&self, server_id: ServerId) -> Result<Response, Failure> {
        // Checked again here, next to the grant (execute checked before any await).
        if !self.is_active() {
            CoordinatorCounters::count(&self.counters.lease_renewals_refused, 1);
            return Err((Status::Retry, "this coordinator is not the active one".to_string()));
        }
        let threshold = self.detector.get().map_or(0, |config| config.misses_to_declare);
        let missed = self.ping_misses().get(&server_id).copied().unwrap_or(0);
        if threshold > 0 && missed >= threshold {
            // It asks but does not answer pings (a one-way partition): let its lease run out,
            // so it stops serving and can be declared crashed and recovered.
            CoordinatorCounters::count(&self.counters.lease_renewals_refused, 1);
            return Err((
                Status::Retry,
                format!("server {server_id} does not answer the coordinator's pings"),
            ));
        }
        let mut leases = self.leases();
        if !leases.members.contains(&server_id) {
            CoordinatorCounters::count(&self.counters.lease_renewals_refused, 1);
            return Err((Status::ServerCrashed, format!("server {server_id} is not up")));
        }
        leases.granted.insert(server_id, tokio::time::Instant::now());
        CoordinatorCounters::count(&self.counters.lease_renewals_granted, 1);
        let lease_ms = u32::try_from(LEASE_DURATION.as_millis()).unwrap_or(u32::MAX);
        Ok(Response::RenewLease { lease_ms })
    }

    /// SET_LOG_HEAD: records a master's newer log head durably before it acknowledges writes
    /// there. Refused to a server declared crashed (the heads recovery relies on are final).
    async fn set_log_head(&self, server_id: ServerId, head: LogHead) -> Result<Response, Failure> {
        let mut log_heads = self.log_heads.lock().await;
        if !self.leases().members.contains(&server_id) {
            return Err((Status::ServerCrashed, format!("server {server_id} is not up")));
        }
        if log_heads.get(&server_id).is_some_and(|recorded| *recorded >= head) {
            return Ok(Response::SetLogHead);
        }
        self.persist(vec![put_log_head(server_id, head)]).await?;
        log_heads.insert(server_id, head);
        Ok(Response::SetLogHead)
    }

    /// True once no lease of `server_id` can still be running: the last one granted (or any an
    /// earlier coordinator granted) has ended, with a margin for clock rates.
    pub(crate) fn lease_expired(&self, server_id: ServerId) -> bool {
        let leases = self.leases();
        self.lease_expired_in(&leases, server_id)
    }

    /// [`Inner::lease_expired`] with the lease table already locked.
    pub(crate) fn lease_expired_in(&self, leases: &LeaseTable, server_id: ServerId) -> bool {
        let floor = leases
            .predecessor_grants_until
            .map_or(self.started_at, |until| until.max(self.started_at));
        let last = leases.granted.get(&server_id).copied().unwrap_or(floor).max(floor);
        tokio::time::Instant::now() > last + LEASE_DURATION + LEASE_MARGIN
    }

    /// AWAIT_TABLET_MAP: the tablet map once no tablet in it is recovering or owned by
    /// `stale_owner` (a master the client could not reach: it waits out the crash's detection
    /// here rather than polling), or when `wait_millis` (at most
    /// [`TABLET_MAP_AWAIT_MILLIS_MAX`]) have passed. Looks again when a recovery settles
    /// ([`Inner::recoveries_settled`]) and every [`TABLET_MAP_AWAIT_RECHECK`] besides.
    pub(crate) async fn await_tablet_map(
        &self,
        table_id: TableId,
        wait_millis: u32,
        stale_owner: ServerId,
    ) -> Result<Response, Failure> {
        let wait = Duration::from_millis(u64::from(wait_millis.min(TABLET_MAP_AWAIT_MILLIS_MAX)));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the map is read, so a recovery that settles in between wakes it.
            let settled = self.recoveries_settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let tablets = match self.tablet_map(table_id).await? {
                Response::GetTabletMap { tablets } => tablets,
                other => unreachable!("tablet_map answers a map, not {other:?}"),
            };
            let waiting = tablets.iter().any(|tablet| {
                tablet.state == TabletState::Recovering
                    || (stale_owner.0 != 0 && tablet.owner == stale_owner)
            });
            let now = tokio::time::Instant::now();
            if !waiting || now >= deadline || !self.is_active() {
                return Ok(Response::AwaitTabletMap { tablets });
            }
            let recheck = (now + TABLET_MAP_AWAIT_RECHECK).min(deadline);
            tokio::select! {
                () = settled => {}
                () = tokio::time::sleep_until(recheck) => {}
            }
        }
    }

    pub(crate) async fn tablet_map(&self, table_id: TableId) -> Result<Response, Failure> {
        let state = self.state.lock().await;
        // Owners whose recovery is impossible and whose loss no operator accepted yet.
        let unavailable: BTreeSet<ServerId> = self
            .unrecoverable()
            .iter()
            .filter(|(_, unrecoverable)| !unrecoverable.loss_accepted)
            .map(|(server_id, _)| *server_id)
            .collect();
        let mut tablets = Vec::new();
        let mut found = false;
        for table in state.tables.values() {
            if table_id.0 != 0 && table.table_id != table_id {
                continue;
            }
            found = true;
            for tablet in &table.tablets {
                let owner = state.servers.get(&tablet.owner);
                let serving = owner.is_some_and(|server| server.status == ServerStatus::Up);
                tablets.push(TabletEntry {
                    table_id: table.table_id,
                    range: tablet.range,
                    owner: tablet.owner,
                    owner_address: owner.map(|server| server.address.clone()).unwrap_or_default(),
                    state: if serving {
                        TabletState::Normal
                    } else if unavailable.contains(&tablet.owner) {
                        TabletState::Unavailable
                    } else {
                        TabletState::Recovering
                    },
                });
            }
        }
        if table_id.0 != 0 && !found {
            return Err((Status::TableDoesntExist, format!("no table with id {table_id}")));
        }
        tablets.sort_by_key(|tablet| (tablet.table_id, tablet.range.start));
        Ok(Response::GetTabletMap { tablets })
    }
}

/// Sends one TAKE (or DROP) TABLET_OWNERSHIP at assignment epoch `epoch` until the master
/// acknowledges, the assignment is obsolete, or [`DELIVERY_PERSISTENCE`] has passed. A TAKE
/// carries the table's tier as the table record holds it when the message is made (every kind
/// of assignment — creation, split, migration, hand-back, recovery, re-sending after a
/// restart — comes through here, so none can go without it).
pub(crate) async fn deliver(
    inner: Arc<Inner>,
    table_id: TableId,
    tablet: TabletRecord,
    take: bool,
    epoch: u64,
) {
    let deadline = tokio::time::Instant::now() + DELIVERY_PERSISTENCE;
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(2));
    loop {
        if !inner.is_active() {
            return;
        }
        let (address, assigned_in) = {
            let state = inner.state.lock().await;
            let assigned_in = state
                .tables
                .values()
                .find(|table| table.table_id == table_id && table.tablets.contains(&tablet));
            let still_assigned = assigned_in.is_some();
            // A DROP is obsolete once the master owns part of the range again (the tablet was
            // migrated back): dropping would lose it there.
            let owns_again = !take
                && state.tables.values().any(|table| {
                    table.table_id == table_id
                        && table.tablets.iter().any(|other| {
                            other.owner == tablet.owner
                                && other.range.intersection(&tablet.range).is_some()
                        })
                });
            match state.servers.get(&tablet.owner) {
                Some(server)
                    if server.status == ServerStatus::Up
                        && (still_assigned || !take)
                        && !owns_again =>
                {
                    (server.address.clone(), assigned_in.map(|table| table.tier))
                }
                _ => return,
            }
        };
        let (master_id, range, assignment_epoch) = (tablet.owner, tablet.range, epoch);
        let request = if take {
            let tier = assigned_in.expect("a TAKE is sent only while its tablet is assigned");
            Request::TakeTabletOwnership { master_id, table_id, range, assignment_epoch, tier }
        } else {
            Request::DropTabletOwnership { master_id, table_id, range, assignment_epoch }
        };
        match inner.pool.call(&address, &request).await {
            Ok((Status::Ok, _)) => return,
            Ok((status, _)) => {
                tracing::warn!(%status, %address, "master refused a tablet assignment")
            }
            Err(error) => {
                inner.pool.forget(&address);
                tracing::debug!(%error, %address, "tablet assignment not delivered yet");
            }
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(%address, %table_id, "giving up delivering a tablet assignment");
            return;
        }
        tokio::time::sleep(backoff.next_delay(&*inner.environment.entropy)).await;
    }
}
