//! The production roles: coordinator and storage server.

mod identity;
mod metrics;
mod status_page;
mod tls;

pub(crate) use tls::ProcessTls;
pub use tls::TlsArguments;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use stratus_backup::{
    collect_garbage, BackupConfig, BackupRouter, BackupService, Durability, MemoryStorage,
};
use stratus_client::{Client, ClientConfig};
use stratus_coordinator::{Authority, Coordinator, FailureDetectorConfig, StandbyGate};
use stratus_env::Environment;
use stratus_master::{
    keep_lease, probe_peers, DeviceImages, FlashSettings, Lease, Master, MasterConfig,
    PeerProbeConfig, Placement, RecoveryReader, ReplicaManager, ReplicationConfig, ServerList,
    FLASH_BYTES_MAX_DEFAULT, REPLICATION_TIMEOUT_DEFAULT,
};
use stratus_meta::FileMetaStore;
use stratus_meta_etcd::{EtcdClient, EtcdMetaStore, Leadership, LeadershipConfig};
use stratus_rpc::membership::{read_secret_file, REFUSED_PROOF_DELAY};
use stratus_rpc::{
    serve_admitting, Admission, Backoff, ChannelPool, ClusterKey, MemberNetwork, Membership,
    RpcConfig, UserDirectory,
};
use stratus_store::StoreConfig;
use stratus_tls::TlsNetwork;
use stratus_types::limits::SEGMENT_BYTES_MAX;
use stratus_wire::{Request, Response, ResponseBody, ServiceMask, Status};

/// `stratus coordinator`.
#[derive(Debug, Args)]
pub struct CoordinatorArguments {
    /// Address to listen on.
    #[arg(long, default_value = crate::cli::DEFAULT_COORDINATOR)]
    pub listen: String,
    /// Directory of the coordinator's durable state (the embedded metadata store). Not used
    /// with --etcd.
    #[arg(long, required_unless_present = "etcd")]
    pub dir: Option<PathBuf>,
    /// Keep the metadata in etcd instead, at these client URLs (comma-separated), and run as
    /// one of several coordinators: the one holding the leadership in etcd is active and
    /// listens, the others stand by and take over within seconds when it dies.
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The etcd key prefix of this cluster (several clusters can share one etcd).
    #[arg(long, default_value = stratus_meta_etcd::DEFAULT_NAMESPACE)]
    pub etcd_namespace: String,
    /// Seconds of the leadership lease: about how long a standby waits after the active
    /// coordinator died (etcd raises values below its minimum: 2 s with its default election
    /// timeout, 1 s for the etcd `stratus up` starts). The active one gives the leadership up
    /// if no renewal (every quarter of it) succeeds for 0.9 of it.
    #[arg(long, default_value_t = 2)]
    pub etcd_lease_seconds: u64,
    /// Stop when the process that started this one dies (used by `stratus up`).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
    /// Milliseconds between two sweeps in which the coordinator pings every server itself: the
    /// backstop behind the servers' pings of each other (`stratus server --probe-interval-ms`).
    #[arg(long, default_value_t = 1000)]
    pub backstop_interval_ms: u64,
    /// Milliseconds one of the coordinator's pings may take before it counts as missed.
    #[arg(long, default_value_t = 250)]
    pub probe_timeout_ms: u64,
    /// The coordinator's pings a suspect server (reported by a peer, or silent in a sweep) must
    /// miss in a row to be declared crashed (its tablets are then recovered on the other
    /// masters). 0 turns failure detection off.
    #[arg(long, default_value_t = 3)]
    pub probe_misses: u32,
    /// Serve Prometheus metrics (GET /metrics) and the status page (GET /) on this address.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// File holding a token (at least 16 bytes) that every metrics and status-page request
    /// must carry: `Authorization: Bearer TOKEN`, or as the password a browser asks for. A
    /// process with a cluster secret serves metrics on a non-loopback address only with one.
    #[arg(long, env = "STRATUS_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub membership: MembershipArguments,
}

/// How a coordinator or server proves it belongs to its cluster (docs/design/security.md).
#[derive(Debug, Args)]
pub struct MembershipArguments {
    /// File holding the cluster secret (at least 16 bytes; `stratus up --cluster-secret-file`
    /// writes one). Every coordinator and server of the cluster must be given the same: they
    /// prove it to each other on every connection, and serve the server-to-server operations
    /// (replication, recovery, tablet ownership, fencing) only to processes that proved it.
    /// Without it the process runs in insecure mode: anything that reaches its port can act
    /// as a server.
    #[arg(long, env = "STRATUS_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// File holding the client password (at least 16 bytes; needs --cluster-secret-file, and
    /// the same file on every coordinator and server). Clients must then prove it before any
    /// operation but PING (the CLI: --password-file), and a RESP front end asks for it with
    /// AUTH, as Redis's `requirepass` does. Without it any client that reaches a port may read
    /// and write.
    #[arg(long, env = "STRATUS_CLIENT_PASSWORD_FILE", requires = "cluster_secret_file")]
    pub client_password_file: Option<PathBuf>,
}

/// How a coordinator or server is secured: its environment (with TLS, every connection it
/// opens or accepts speaks it; with a cluster secret, every connection it opens proves it),
/// what its listener asks of connections, the client password its RESP front end asks for,
/// and its TLS (for its metrics listener and the status page's client).
struct Security {
    environment: Environment,
    admission: Admission,
    client_password: Option<Vec<u8>>,
    tls: Option<ProcessTls>,
}

impl Security {
    /// Starts watching the TLS files (on the running runtime): a renewed certificate, or a
    /// CA file that now trusts a new CA, is used by new connections, accepted and opened.
    fn watch_certificates(&self) {
        if let Some(tls) = &self.tls {
            tokio::spawn(tls.server.clone().watch());
            tokio::spawn(tls.client.clone().watch());
        }
    }
}

/// The process's [`Security`] from its flags. Says in one line which mode it runs in.
fn security_from_flags(
    arguments: &MembershipArguments,
    tls_arguments: &TlsArguments,
    role: &str,
    listen: &str,
) -> Result<Security, String> {
    let mut environment = Environment::system();
    let tls = tls_arguments.process(role)?;
    environment.network = with_tls(environment.network, tls.as_ref(), role, listen);
    let Some(path) = &arguments.cluster_secret_file else {
        if arguments.client_password_file.is_some() {
            // Without the secret anyone could act as a server and bypass the password.
            return Err("--client-password-file needs --cluster-secret-file".to_string());
        }
        if is_loopback(listen) {
            tracing::info!("{role} in insecure mode (no --cluster-secret-file), on loopback");
        } else {
            tracing::warn!(
                "{role} in insecure mode: no --cluster-secret-file, so any process that reaches \
                 {listen} can act as a server of this cluster"
            );
        }
        return Ok(Security {
            environment,
            admission: Admission::Open,
            client_password: None,
            tls,
        });
    };
    let key =
        ClusterKey::read_file(path).map_err(|error| format!("--cluster-secret-file: {error}"))?;
    let client_password = match &arguments.client_password_file {
        Some(path) => Some(
            read_secret_file(path).map_err(|error| format!("--client-password-file: {error}"))?,
        ),
        None => None,
    };
    let client_key = match &client_password {
        Some(password) => Some(
            ClusterKey::from_client_password(password)
                .map_err(|error| format!("--client-password-file: {error}"))?,
        ),
        None => None,
    };
    let membership = Membership::with_options(
        key,
        client_key,
        environment.secure_entropy.clone(),
        REFUSED_PROOF_DELAY,
    );
    environment.network = Arc::new(MemberNetwork::new(environment.network, membership.clone()));
    match client_password {
        Some(_) => tracing::info!(
            "{role} admits only cluster members to server-to-server operations, and only \
             clients with the password to the others"
        ),
        None => tracing::info!(
            "{role} admits only cluster members to server-to-server operations (clients need \
             no password)"
        ),
    }
    Ok(Security { environment, admission: Admission::Members(membership), client_password, tls })
}

/// What a RESP front end makes a named user's client with: `config` (the coordinator, the
/// timeouts, the TLS client settings) acting as the user, on the plain system network (never
/// the process's, which proves the cluster secret).
pub(crate) fn user_clients(config: ClientConfig) -> stratus_resp::UserClients {
    stratus_resp::UserClients(Arc::new(move |user| {
        let mut config = config.clone();
        config.user = Some(user);
        Client::with_environment(config, Environment::system())
    }))
}

/// `network` speaking TLS on every listener and to every peer with `tls`, if the process has a
/// certificate; says in one line whether it does.
fn with_tls(
    network: Arc<dyn stratus_env::Network>,
    tls: Option<&ProcessTls>,
    role: &str,
    listen: &str,
) -> Arc<dyn stratus_env::Network> {
    let Some(tls) = tls else {
        if is_loopback(listen) {
            tracing::info!("{role} without TLS (no --tls-cert-file), on loopback");
        } else {
            tracing::warn!(
                "{role} without TLS: no --tls-cert-file, so what it sends and receives on \
                 {listen} can be read and changed by anyone on the network path"
            );
        }
        return network;
    };
    tracing::info!(
        certificate = %tls.server.files().certificate.display(),
        "{role} speaks TLS on every listener and to its peers"
    );
    Arc::new(TlsNetwork::new(network, Some(tls.server.clone()), Some(tls.client.clone())))
}

/// With a cluster secret, makes `coordinator` hand out client lease ids that nobody without
/// the secret can guess (every coordinator of the cluster derives the same permutation), so a
/// client cannot name another client's lease (docs/design/security.md, "Users").
fn hide_lease_ids(coordinator: &Coordinator, membership: Option<&Membership>) {
    if let Some(membership) = membership {
        let key = membership.subkey(b"stratus client lease ids v1");
        coordinator.hide_lease_ids(stratus_coordinator::LeaseIdPermutation::new(key));
    }
}

/// How long a starting server waits for its first user directory before it serves anyway.
const USER_DIRECTORY_FIRST_WAIT: Duration = Duration::from_secs(5);

/// Makes a process that requires the client password authenticate named users too, against
/// `directory`, and check each of their requests against their grants (docs/design/security.md,
/// "Users"). Named users exist only where clients must authenticate: with anonymous clients
/// admitted to everything, a user's grants would restrict nobody. True if it does.
fn serve_named_users(admission: &Admission, directory: Arc<UserDirectory>) -> bool {
    match admission.membership() {
        Some(membership) if membership.requires_client_password() => {
            membership.serve_users(directory);
            true
        }
        _ => false,
    }
}

/// True if `address` ("host:port") is on the loopback interface.
fn is_loopback(address: &str) -> bool {
    ["127.", "localhost:", "[::1]:"].iter().any(|host| address.starts_with(host))
}

/// The token metrics requests must carry, if any. A process with a cluster secret refuses to
/// serve metrics (and the status page) beyond loopback without one: they describe the whole
/// cluster, and the status page's data names every server.
fn metrics_token(
    metrics_listen: Option<&str>,
    token_file: Option<&std::path::Path>,
    secure: bool,
) -> Result<Option<String>, String> {
    let Some(path) = token_file else {
        return match metrics_listen {
            Some(listen) if secure && !is_loopback(listen) => Err(format!(
                "--metrics-listen {listen} is not a loopback address: a process with a cluster \
                 secret serves metrics beyond loopback only with --metrics-token-file"
            )),
            _ => Ok(None),
        };
    };
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("--metrics-token-file {}: {error}", path.display()))?;
    let token = text.trim();
    if token.len() < stratus_rpc::membership::CLUSTER_SECRET_BYTES_MIN
        || token.bytes().any(|byte| !byte.is_ascii_graphic())
    {
        return Err(format!(
            "--metrics-token-file {}: the token must be at least {} printable ASCII characters",
            path.display(),
            stratus_rpc::membership::CLUSTER_SECRET_BYTES_MIN
        ));
    }
    Ok(Some(token.to_string()))
}

/// `stratus server`.
#[derive(Debug, Args)]
pub struct ServerArguments {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address to announce to the coordinator (default: the bound address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Memory for the log, in MiB.
    #[arg(long, default_value_t = 256)]
    pub log_mib: u64,
    /// Segment size, in MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u32,
    /// Largest value accepted, in bytes (at most segment / 8).
    #[arg(long)]
    pub value_bytes_max: Option<u32>,
    /// How long to keep trying to enlist with the coordinator, in seconds.
    #[arg(long, default_value_t = 60)]
    pub enlist_timeout_seconds: u64,
    /// Copies of every log segment on other servers' backups before a write is acknowledged;
    /// 0 runs memory-only (nothing survives this process).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// How backups are chosen for a segment: random (scattered, fastest recovery) or copyset
    /// (fixed groups, far fewer losses under correlated failures).
    #[arg(long, default_value = "random", value_parser = ["random", "copyset"])]
    pub placement: String,
    /// This server's failure domain, e.g. its rack (at most 64 bytes of printable ASCII, no
    /// spaces): masters put a segment's replicas in distinct failure domains, none their own,
    /// when the cluster has enough of them, so a whole rack can fail without losing data.
    /// Empty: none (every server counts as its own domain).
    #[arg(long, env = "STRATUS_FAILURE_DOMAIN", default_value = "")]
    pub failure_domain: String,
    /// Milliseconds a backup may take to acknowledge a replica write (plus 1 ms per 64 KiB it
    /// carries) before it counts as lost: its replicas go to other backups, so a paused or
    /// dead backup holds up this server's writes about this long.
    #[arg(long, default_value_t = REPLICATION_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub replication_timeout_ms: u64,
    /// Open the backup's storage file with O_DIRECT (replica writes bypass the page cache, so
    /// they do not evict the master's memory; needs a file system that supports it).
    #[arg(long)]
    pub backup_direct_io: bool,
    /// Touch every page of the log memory at start. The server then holds all of its memory
    /// from the first moment (it fails at start, not under load, when the machine lacks it),
    /// and no write or recovery pays the page fault of a page's first use (the kernel zeroes
    /// each page then; it was about a tenth of a recovery's CPU, measured). Starting takes
    /// longer by the time to zero the memory once.
    #[arg(long)]
    pub prefault_memory: bool,
    /// Memory that tracks the data: keep the log's resident memory near its live bytes / this
    /// percentage (plus one segment), cleaning ahead of need and giving free memory back to the
    /// system; `--log-mib` stays the hard limit. 0 turns it off: the log fills its region
    /// before cleaning and keeps every page it touched (as with --prefault-memory, which
    /// implies 0). Higher keeps less memory and costs more cleaning.
    #[arg(long, default_value_t = stratus_store::MEMORY_TARGET_PERCENT_DEFAULT,
          value_parser = clap::value_parser!(u32).range(0..=99))]
    pub memory_target_percent: u32,
    /// Seglet size in KiB: the unit compaction frees memory in. Must divide the segment size.
    #[arg(long, default_value_t = 64)]
    pub seglet_kib: u32,
    /// Cleaning levels: 2 (default with replicas) compacts in memory first and runs combined
    /// cleaning only when needed; 1 runs combined cleaning alone (what memory-only servers do,
    /// and the baseline for measuring what two levels save in backup bandwidth).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub cleaner_levels: Option<u32>,
    /// Stop when the process that started this one dies (used by `stratus up`).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
    /// Directory of this server's backup storage file. Without it the backup keeps replicas
    /// in this process's memory only (buffered durability only).
    #[arg(long)]
    pub backup_dir: Option<PathBuf>,
    /// Run no backup service: this server stores no replicas of other masters' segments.
    #[arg(long)]
    pub no_backup: bool,
    /// Directory of this server's flash log, where the objects of tables created with
    /// `--tier flash` live (default: `flash` inside --backup-dir, the server's data
    /// directory; without either, this server has no flash tier).
    #[arg(long, env = "STRATUS_FLASH_DIR")]
    pub flash_dir: Option<PathBuf>,
    /// Disk budget of the flash log, in GiB; 0 turns the flash tier off.
    #[arg(long, env = "STRATUS_FLASH_GIB", default_value_t = FLASH_BYTES_MAX_DEFAULT >> 30)]
    pub flash_gib: u64,
    /// DRAM for the objects of tables created with `--tier auto`, in MiB (at most --log-mib;
    /// default: half the log): past it the cleaner moves those read or written least recently
    /// to flash (docs/design/flash-tier.md, "Automatic tiering").
    #[arg(long, env = "STRATUS_AUTO_DRAM_MIB")]
    pub auto_dram_mib: Option<u64>,
    /// MiB per second that reads of auto tables may promote from flash back into DRAM (each
    /// promoted byte is appended and replicated like a write); 0 turns promotion off.
    #[arg(
        long,
        env = "STRATUS_PROMOTION_MIB_PER_SECOND",
        default_value_t = stratus_store::PROMOTION_BYTES_PER_SECOND_MAX_DEFAULT >> 20
    )]
    pub promotion_mib_per_second: u64,
    /// Which reads of an auto object on flash may promote it: `second-read` (a second read
    /// while the first is remembered; an object read once in a long while stays on flash) or
    /// `first-read` (every read).
    #[arg(
        long,
        env = "STRATUS_PROMOTION_ADMISSION",
        default_value = "second-read",
        value_parser = crate::cli::parse_promotion_admission
    )]
    pub promotion_admission: stratus_store::PromotionAdmission,
    /// When the backup acknowledges a replica write: buffered (in its RAM) or fsync (on disk).
    #[arg(long, default_value = "buffered", value_parser = ["buffered", "fsync"])]
    pub durability: String,
    /// RAM buffers of the backup, one segment each: the most replicas open on it at once.
    #[arg(long, default_value_t = BackupConfig::BUFFER_COUNT_DEFAULT)]
    pub backup_buffers: usize,
    /// Storage frames of the backup, one segment each: the most replicas it stores.
    #[arg(long, default_value_t = BackupConfig::FRAME_COUNT_DEFAULT)]
    pub backup_frames: u32,
    /// Serve Prometheus metrics (GET /metrics) on this address.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// File holding a token every metrics request must carry (see `stratus coordinator
    /// --metrics-token-file`).
    #[arg(long, env = "STRATUS_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// Milliseconds between two pings of a random other server (failure detection: one that
    /// does not answer is reported to the coordinator, which checks it). 0 pings no peer.
    #[arg(long, default_value_t = PeerProbeConfig::default().probe_interval.as_millis() as u64)]
    pub probe_interval_ms: u64,
    /// Milliseconds a ping of a peer may take before the peer is reported.
    #[arg(long, default_value_t = PeerProbeConfig::default().probe_timeout.as_millis() as u64)]
    pub probe_timeout_ms: u64,
    /// Also speak RESP (the Redis protocol) to Redis clients on this address. Keys whose
    /// tablets this server owns are served in this process; other keys are forwarded to their
    /// masters (the `stratus resp` gateway's rules: SELECT n is table `redis-db-n`). With
    /// --client-password-file, clients AUTH with it or as a named user (ACL commands manage
    /// users; docs/design/resp-acl.md).
    #[arg(long)]
    pub resp_listen: Option<String>,
    /// Server span of the tables the RESP front end creates on first use.
    #[arg(long, default_value_t = 1)]
    pub resp_table_span: u32,
    /// Threads serving requests (default: one per CPU). Several servers sharing one machine's
    /// CPUs (`stratus up`) should split them: more threads than CPUs only add thread switches.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    #[command(flatten)]
    pub membership: MembershipArguments,
}

/// Opens the server's backup service (off the async runtime: a restart scans the disk).
async fn open_backup(
    arguments: &ServerArguments,
    segment_bytes: u32,
) -> Result<Option<Arc<BackupService>>, String> {
    if arguments.no_backup {
        return Ok(None);
    }
    let mut config = BackupConfig::new(segment_bytes);
    config.durability = arguments.durability.parse::<Durability>()?;
    config.buffer_count = arguments.backup_buffers;
    config.frame_count = arguments.backup_frames;
    config.direct_io = arguments.backup_direct_io;
    config.validate().map_err(|error| format!("invalid backup configuration: {error}"))?;
    let Some(directory) = arguments.backup_dir.clone() else {
        if config.durability == Durability::Fsync {
            return Err("--durability fsync needs a disk: give --backup-dir".to_string());
        }
        tracing::warn!("no --backup-dir: this backup keeps replicas in memory only");
        let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
        let (backup, _) = BackupService::open(config, storage)?;
        return Ok(Some(Arc::new(backup)));
    };
    let (backup, report) = tokio::task::spawn_blocking(move || {
        BackupService::open_directory(config, &directory)
            .map_err(|error| format!("backup storage in {}: {error}", directory.display()))
    })
    .await
    .map_err(|error| format!("opening the backup: {error}"))??;
    tracing::info!(
        durability = %config.durability, replicas_found = report.replicas_found,
        discarded = report.discarded.len(), "backup serving"
    );
    Ok(Some(Arc::new(backup)))
}

/// The async runtime of a role: `worker_threads` threads (default: one per CPU).
fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime, String> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads {
        builder.worker_threads(threads.max(1));
    }
    builder.enable_all().build().map_err(|error| error.to_string())
}

/// How long a stopping server waits for its backup's open replicas to reach the disk.
const STOP_FLUSH_PATIENCE: Duration = Duration::from_secs(10);

/// How long a RESP command may take, retries included (`stratus resp`'s default).
const RESP_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a server checks whether the coordinator declared it crashed (then it exits).
const DECLARED_CRASHED_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// How often a role started with `--exit-with-parent` checks that its parent still lives.
const PARENT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Waits for SIGINT or SIGTERM, or, with `exit_with_parent`, for the process that started this
/// one to die (this process is then re-parented): `stratus up` killed with SIGKILL must not
/// leave its servers running.
async fn termination(exit_with_parent: bool) {
    use tokio::signal::unix::{signal, SignalKind};
    let parent = std::os::unix::process::parent_id();
    let orphaned = async move {
        if !exit_with_parent {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(PARENT_CHECK_INTERVAL).await;
            if std::os::unix::process::parent_id() != parent {
                tracing::warn!("the parent process is gone; stopping");
                return;
            }
        }
    };
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(_) => return orphaned.await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        _ = orphaned => {}
    }
}

/// Runs the coordinator until SIGINT/SIGTERM.
pub fn run_coordinator(arguments: CoordinatorArguments, tls: &TlsArguments) -> Result<(), String> {
    if !arguments.etcd.is_empty() {
        return run_coordinator_on_etcd(arguments, tls);
    }
    let directory = arguments.dir.clone().ok_or("give --dir or --etcd")?;
    std::fs::create_dir_all(&directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?;
    let (store, report) =
        FileMetaStore::open(&directory).map_err(|error| format!("metadata store: {error}"))?;
    if report.torn_tail_bytes_discarded > 0 {
        tracing::warn!(
            bytes = report.torn_tail_bytes_discarded,
            "discarded a torn, unacknowledged tail of the metadata log"
        );
    }
    let security =
        security_from_flags(&arguments.membership, tls, "coordinator", &arguments.listen)?;
    let coordinator = Coordinator::open(Arc::new(store), security.environment.clone())
        .map_err(|error| error.to_string())?;
    hide_lease_ids(&coordinator, security.admission.membership().as_deref());
    serve_coordinator(arguments, coordinator, security, std::future::pending())
}

/// How often an active coordinator on etcd checks that it still holds the leadership.
const LEADERSHIP_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The leadership as the coordinator sees it.
#[derive(Debug)]
struct EtcdAuthority(Arc<Leadership>);

impl Authority for EtcdAuthority {
    fn is_active(&self) -> bool {
        self.0.holds()
    }
}

/// Runs one of several coordinators sharing metadata in etcd: listens from its start (a
/// standby answers RETRY to everything), stands by until it holds the leadership, then serves
/// until it stops or loses it (then it exits: its successor may already have changed the
/// metadata, so nothing it remembers can be trusted).
fn run_coordinator_on_etcd(
    arguments: CoordinatorArguments,
    tls: &TlsArguments,
) -> Result<(), String> {
    let client = Arc::new(
        EtcdClient::new(&arguments.etcd, ETCD_REQUEST_TIMEOUT)
            .map_err(|error| format!("--etcd: {error}"))?,
    );
    let namespace = arguments.etcd_namespace.clone();
    if !namespace.starts_with('/') || !namespace.ends_with('/') {
        return Err(format!("--etcd-namespace {namespace:?} must start and end with '/'"));
    }
    let lease_ttl = Duration::from_secs(arguments.etcd_lease_seconds.max(1));
    // The takeover delay guards against an etcd that ends a lease early, which only a stale
    // leader of a multi-member etcd could do (etcd-io/etcd#15247): with one member there is
    // no stale leader, and a standby acts as soon as it holds the leadership.
    let takeover_delay = match client.member_count() {
        Ok(1) => Duration::ZERO,
        _ => lease_ttl,
    };
    let config = LeadershipConfig {
        lease_ttl,
        takeover_delay,
        standby_poll_interval: STANDBY_POLL_INTERVAL,
    };
    let security =
        security_from_flags(&arguments.membership, tls, "coordinator", &arguments.listen)?;
    runtime(None)?.block_on(async move {
        security.watch_certificates();
        let Security { environment, admission, client_password, tls } = security;
        // Listening from the start, for the whole life of the process, is what lets a standby
        // read a refused connection on the active one's address as that process being gone.
        let listener = environment
            .network
            .bind(&arguments.listen)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", arguments.listen))?;
        let address = listener.local_address();
        let gate = Arc::new(StandbyGate::new());
        let access = metrics::MetricsAccess::new(admission.membership(), client_password, tls);
        let membership = admission.membership();
        let serving = tokio::spawn(serve_admitting(listener, gate.clone(), admission));
        println!(
            "coordinator on {address} standing by for the leadership in etcd ({})",
            client.endpoints().join(",")
        );
        let leadership = Arc::new(
            campaign(client.clone(), &namespace, &address, config, arguments.exit_with_parent)
                .await?,
        );
        let store =
            Arc::new(EtcdMetaStore::new(client, &namespace, Some(leadership.identity().to_vec())));
        let authority: Arc<dyn Authority> = Arc::new(EtcdAuthority(leadership.clone()));
        let coordinator = {
            let store = store.clone();
            let environment = environment.clone();
            tokio::task::spawn_blocking(move || {
                Coordinator::open_with_authority(store, environment, Some(authority))
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| format!("loading the metadata from etcd: {error}"))?
        };
        if let Some(grace) = leadership.predecessor_grace() {
            // A holder was deposed for refusing connections; were they wrong (a firewall that
            // rejects), it could grant master leases until its own leadership lease would
            // have ended.
            coordinator.predecessor_may_grant_until(grace);
        }
        hide_lease_ids(&coordinator, membership.as_deref());
        if let Some(membership) = membership.filter(|m| m.requires_client_password()) {
            membership.serve_users(coordinator.user_directory());
        }
        gate.activate(coordinator.clone());
        let lost = exit_once_leadership_lost(leadership.clone(), store);
        let outcome =
            serve_active_coordinator(&arguments, coordinator, &address, (serving, access), lost)
                .await;
        if outcome.is_ok() {
            // A clean stop: hand over at once rather than after the lease's TTL. Tasks of
            // this runtime still hold the coordinator (and so the leadership): resigning loses
            // it first, so they grant nothing more.
            tokio::task::block_in_place(|| leadership.resign());
        }
        outcome
    })
}

/// Stands by (on a blocking thread: etcd's client blocks) until this coordinator, listening on
/// `address`, holds the leadership; a holder whose address refuses connections is deposed
/// (`coordinator_gone`). With `exit_with_parent`, gives up once the parent is gone.
async fn campaign(
    client: Arc<EtcdClient>,
    namespace: &str,
    address: &str,
    config: LeadershipConfig,
    exit_with_parent: bool,
) -> Result<Leadership, String> {
    // Unique per incarnation: a restarted coordinator must not pass its predecessor's fence.
    // The address comes first: standbys probe it.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let identity = format!("{address} pid {} start {nonce}", std::process::id());
    let (namespace, address) = (namespace.to_string(), address.to_string());
    let parent = std::os::unix::process::parent_id();
    tokio::task::spawn_blocking(move || {
        let orphaned = move || exit_with_parent && std::os::unix::process::parent_id() != parent;
        let gone = |holder: &[u8]| coordinator_gone(holder, &address);
        Leadership::campaign_probing(client, &namespace, &identity, config, &orphaned, &gone)
    })
    .await
    .map_err(|error| error.to_string())?
}

/// Ends the process once the leadership is lost or the metadata store failed. At once, not
/// through an orderly shutdown: a successor may already be changing the cluster, and nothing
/// this one still has in flight may go on (every request is already refused; this ends the
/// background work too).
async fn exit_once_leadership_lost(leadership: Arc<Leadership>, store: Arc<EtcdMetaStore>) {
    loop {
        tokio::time::sleep(LEADERSHIP_CHECK_INTERVAL).await;
        let reason = if !leadership.holds() {
            leadership.lost().unwrap_or_else(|| "leadership lost".to_string())
        } else if let Some(reason) = store.poisoned() {
            format!("the metadata store failed: {reason}")
        } else {
            continue;
        };
        eprintln!("stratus: coordinator stopping: {reason}");
        tracing::error!(%reason, "coordinator stopping");
        std::process::exit(1);
    }
}

/// How often a standby coordinator tries to take the leadership, and so probes the active
/// one's address: a killed active coordinator is replaced about this long after it died.
const STANDBY_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long a standby's probe of the active coordinator's address may take to connect.
const HOLDER_PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Time between a standby's two probes, both of which must be refused.
const HOLDER_PROBE_GAP: Duration = Duration::from_millis(50);

/// True when the process that holds the leadership, named by `holder` (its identity: its
/// listening address first), is certainly gone: its address refuses connections twice. A
/// coordinator listens from its start until it exits, so a refusal means no process is there;
/// a slow, paused or unreachable holder times out instead and is waited out with its TTL. An
/// address that does not name one machine (unspecified, this standby's own) proves nothing.
fn coordinator_gone(holder: &[u8], own_address: &str) -> bool {
    let text = String::from_utf8_lossy(holder);
    let Some(address) = text.split_whitespace().next() else { return false };
    if address == own_address {
        return false;
    }
    let Ok(address) = address.parse::<std::net::SocketAddr>() else { return false };
    if address.ip().is_unspecified() || address.port() == 0 {
        return false;
    }
    let refused = || {
        matches!(
            std::net::TcpStream::connect_timeout(&address, HOLDER_PROBE_TIMEOUT),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused
        )
    };
    if !refused() {
        return false;
    }
    std::thread::sleep(HOLDER_PROBE_GAP);
    refused()
}

/// How long one request to etcd may take.
const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `coordinator` until SIGINT/SIGTERM, or until `stopped` finishes (it ends the process
/// itself when the coordinator must stop).
fn serve_coordinator(
    arguments: CoordinatorArguments,
    coordinator: Coordinator,
    security: Security,
    stopped: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    runtime(None)?.block_on(async move {
        security.watch_certificates();
        let Security { environment, admission, client_password, tls } = security;
        let listener = environment
            .network
            .bind(&arguments.listen)
            .await
            .map_err(|error| format!("listen on {}: {error}", arguments.listen))?;
        let address = listener.local_address();
        let coordinator_service = Arc::new(coordinator.clone());
        serve_named_users(&admission, coordinator.user_directory());
        let access = metrics::MetricsAccess::new(admission.membership(), client_password, tls);
        let serving = tokio::spawn(serve_admitting(listener, coordinator_service, admission));
        let serving = (serving, access);
        serve_active_coordinator(&arguments, coordinator, &address, serving, stopped).await
    })
}

/// Runs the active coordinator's background work (metrics, redelivery, failure detector) while
/// `serving` answers on `address`, until SIGINT/SIGTERM, `serving` fails, or `stopped`.
async fn serve_active_coordinator(
    arguments: &CoordinatorArguments,
    coordinator: Coordinator,
    address: &str,
    (serving, mut access): (tokio::task::JoinHandle<std::io::Result<()>>, metrics::MetricsAccess),
    stopped: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let token = metrics_token(
        arguments.metrics_listen.as_deref(),
        arguments.metrics_token_file.as_deref(),
        access.membership.is_some(),
    )?;
    let metrics_listener = metrics::bind(arguments.metrics_listen.as_deref()).await?;
    tracing::info!(%address, "coordinator listening");
    println!("coordinator listening on {address}");
    if let Some(metrics_listener) = metrics_listener {
        access.token = token;
        metrics::serve_coordinator(metrics_listener, coordinator.clone(), address, access);
    }
    let background = coordinator.clone();
    tokio::spawn(async move { background.verify_servers_and_redeliver().await });
    if arguments.probe_misses > 0 {
        let detector = coordinator.clone();
        let config = FailureDetectorConfig {
            backstop_interval: Duration::from_millis(arguments.backstop_interval_ms.max(1)),
            probe_timeout: Duration::from_millis(arguments.probe_timeout_ms.max(1)),
            misses_to_declare: arguments.probe_misses,
        };
        tokio::spawn(async move { detector.run_failure_detector(config).await });
    }
    tokio::select! {
        result = serving => match result {
            Ok(served) => served.map_err(|error| error.to_string()),
            Err(error) => Err(format!("the coordinator's listener stopped: {error}")),
        },
        _ = termination(arguments.exit_with_parent) => {
            tracing::info!("coordinator stopping");
            Ok(())
        }
        () = stopped => Ok(()),
    }
}

/// Runs a storage server until SIGINT/SIGTERM.
pub fn run_server(
    arguments: ServerArguments,
    tls: &TlsArguments,
    coordinator: &str,
) -> Result<(), String> {
    if let Some(problem) = stratus_types::limits::failure_domain_problem(&arguments.failure_domain)
    {
        return Err(format!("--failure-domain {:?}: {problem}", arguments.failure_domain));
    }
    let mut store = StoreConfig::with_log_bytes(arguments.log_mib << 20);
    if let Some(auto_dram_mib) = arguments.auto_dram_mib {
        if auto_dram_mib > arguments.log_mib {
            return Err(format!(
                "--auto-dram-mib {auto_dram_mib} is more than the log (--log-mib {})",
                arguments.log_mib
            ));
        }
        store.auto_dram_bytes_max = auto_dram_mib << 20;
    }
    store.promotion_bytes_per_second_max =
        arguments.promotion_mib_per_second.checked_mul(1 << 20).ok_or_else(|| {
            format!(
                "--promotion-mib-per-second {} is too large",
                arguments.promotion_mib_per_second
            )
        })?;
    store.promotion_admission = arguments.promotion_admission;
    store.segment_bytes = arguments.segment_mib << 20;
    store.seglet_bytes = arguments.seglet_kib << 10;
    store.prefault_memory = arguments.prefault_memory;
    store.cleaner.memory_target_percent = (arguments.memory_target_percent > 0
        && !arguments.prefault_memory)
        .then_some(arguments.memory_target_percent);
    // Without an explicit limit, values may be as large as the segment size allows (an eighth
    // of a segment, the cleaner's packing rule), up to the default.
    store.value_bytes_max = match arguments.value_bytes_max {
        Some(value_bytes_max) => value_bytes_max,
        None => store.value_bytes_max.min(store.segment_bytes / 8),
    };
    // With replicas the cleaner compacts in memory first (two-level cleaning); memory-only
    // servers clean with the combined cleaner alone.
    store.cleaner.replicas = match arguments.cleaner_levels {
        Some(1) => 0,
        _ => u32::try_from(arguments.replicas).unwrap_or(u32::MAX),
    };
    let flash = FlashSettings::from_flags(
        arguments.flash_dir.as_deref(),
        arguments.flash_gib,
        arguments.backup_dir.as_deref(),
    )
    .map_err(|error| error.to_string())?;
    // The segment images of flash tables (docs/design/flash-tier.md); images an earlier
    // process left are deleted (this log starts empty).
    let flash_images = match &flash {
        Some(flash) => {
            store.flash_image_bytes = flash.bytes_max;
            let (images, mode) =
                DeviceImages::open(&flash.dir, u64::from(store.segment_bytes), flash.bytes_max)
                    .map_err(|error| {
                        format!("flash directory {}: {error:?}", flash.dir.display())
                    })?;
            tracing::info!(dir = %flash.dir.display(), bytes_max = flash.bytes_max, ?mode, "flash tier");
            Some(Arc::new(images) as Arc<dyn stratus_store::FlashImages>)
        }
        None => {
            tracing::info!("no flash tier (no --flash-dir or --backup-dir, or --flash-gib 0)");
            None
        }
    };
    store.validate().map_err(|error| format!("invalid memory configuration: {error}"))?;
    let store_value_bytes_max = store.value_bytes_max;
    if arguments.replicas > 0 && store.segment_bytes as usize > SEGMENT_BYTES_MAX {
        return Err(format!(
            "segments of a replicated server are at most {} MiB (one segment per backup write)",
            SEGMENT_BYTES_MAX >> 20
        ));
    }
    let security = security_from_flags(&arguments.membership, tls, "server", &arguments.listen)?;
    let coordinator = coordinator.to_string();
    runtime(arguments.worker_threads)?.block_on(async move {
        security.watch_certificates();
        let Security { environment, admission, client_password, tls } = security;
        let listener = environment
            .network
            .bind(&arguments.listen)
            .await
            .map_err(|error| format!("listen on {}: {error}", arguments.listen))?;
        let metrics_token = metrics_token(
            arguments.metrics_listen.as_deref(),
            arguments.metrics_token_file.as_deref(),
            admission.membership().is_some(),
        )?;
        let metrics_listener = metrics::bind(arguments.metrics_listen.as_deref()).await?;
        let resp_listener = match &arguments.resp_listen {
            Some(resp_listen) => Some(
                environment
                    .network
                    .bind(resp_listen)
                    .await
                    .map_err(|error| format!("listen on {resp_listen}: {error}"))?,
            ),
            None => None,
        };
        let address = arguments.advertise.clone().unwrap_or_else(|| listener.local_address());
        let backup = open_backup(&arguments, store.segment_bytes).await?;
        let mut services = match backup {
            Some(_) => ServiceMask(ServiceMask::MASTER | ServiceMask::BACKUP),
            None => ServiceMask(ServiceMask::MASTER),
        };
        if arguments.replicas == 0 {
            // Its data dies with it: the coordinator must not hand its tablets over as if
            // nothing was lost (docs/design/recovery.md, "Impossible recoveries").
            services.0 |= ServiceMask::UNREPLICATED;
        }
        // The log's memory first: prefaulting it takes seconds for gigabytes, and a server that
        // enlisted and then did not answer the coordinator's pings meanwhile would be declared
        // crashed before it served anything.
        let log_config = store.log_config();
        let memory = tokio::task::spawn_blocking(move || log_config.allocate_memory())
            .await
            .map_err(|error| format!("allocating the log memory: {error}"))?;
        let deadline = Duration::from_secs(arguments.enlist_timeout_seconds);
        // A server restarted on its directory asks for its index again.
        let data_directory = arguments.backup_dir.as_deref();
        let previous = identity::previous_server_id(data_directory)?;
        let enlistment = Enlistment {
            address: &address,
            services,
            previous,
            failure_domain: &arguments.failure_domain,
        };
        let server_id = enlist(&environment, &coordinator, enlistment, deadline).await?;
        let users = Arc::new(UserDirectory::new());
        if serve_named_users(&admission, users.clone()) {
            let follow = users.clone().follow_coordinator(
                environment.network.clone(),
                environment.entropy.clone(),
                coordinator.clone(),
            );
            tokio::spawn(follow);
            // Start with the directory: the coordinator answers the first poll at once (its
            // version is never 0), and a user sent here by a fresh tablet map must not be
            // refused for a directory still on its way.
            let directory = users.changed_from(0, USER_DIRECTORY_FIRST_WAIT).await;
            if directory.version == 0 {
                tracing::warn!("no user directory from the coordinator yet; users wait for it");
            }
        }
        if let Some(directory) = data_directory {
            identity::remember_server_id(directory, server_id)?;
        }
        let wall_clock = environment.wall_clock.clone();
        // The flash tier's settings travel with the master; the images device it will be
        // opened on is attached by the flash tier's integration (until then flash tables'
        // objects stay in memory, as with no flash tier).
        let master_config =
            MasterConfig { flash, flash_images, ..MasterConfig::memory_only(store) };
        let mut master = Master::with_memory(server_id, master_config, wall_clock, memory)?;
        if arguments.replicas > 0 {
            let mut config = ReplicationConfig::new(arguments.replicas, coordinator.clone());
            if arguments.placement == "copyset" {
                config.placement = Placement::Copyset;
            }
            config.replication_timeout =
                Duration::from_millis(arguments.replication_timeout_ms.max(1));
            let replication = ReplicaManager::start(
                server_id,
                config,
                master.store_handle(),
                environment.clone(),
            );
            master.set_replication(replication);
        }
        master.set_recovery_reader(RecoveryReader::new(environment.network.clone()));
        if arguments.probe_interval_ms > 0 {
            // One server list per server: the replica manager's when there is one.
            let server_list = match master.replication() {
                Some(replication) => replication.server_list(),
                None => ServerList::new(coordinator.clone(), environment.network.clone()),
            };
            let config = PeerProbeConfig {
                probe_interval: Duration::from_millis(arguments.probe_interval_ms),
                probe_timeout: Duration::from_millis(arguments.probe_timeout_ms.max(1)),
            };
            tokio::spawn(probe_peers(
                server_id,
                coordinator.clone(),
                config,
                server_list,
                environment.clone(),
            ));
        }
        // Mutations are applied exactly once under client leases the coordinator vouches for.
        let sweep = master.check_client_leases(coordinator.clone(), environment.network.clone());
        tokio::spawn(sweep);
        // Transactions whose client died mid-commit are finished by their participants.
        tokio::spawn(stratus_master::finish_abandoned_transactions(
            master.store_handle(),
            coordinator.clone(),
            environment.clone(),
        ));
        // The master serves only while the coordinator renews its lease.
        let lease = Lease::new();
        master.set_lease(lease.clone());
        let lease_at_stop = lease.clone();
        tokio::spawn(keep_lease(
            lease.clone(),
            server_id,
            coordinator.clone(),
            environment.network.clone(),
        ));
        let replication = master.replication().cloned();
        let declared_crashed = async move {
            loop {
                tokio::time::sleep(DECLARED_CRASHED_CHECK_INTERVAL).await;
                if lease.is_crashed() || replication.as_ref().is_some_and(|r| r.is_fenced()) {
                    return;
                }
            }
        };
        // One combined cleaner, plus a compactor when there are replicas to save bandwidth on.
        let cleaner_threads = if arguments.replicas > 0 { 2 } else { 1 };
        master
            .start_cleaner(cleaner_threads)
            .map_err(|error| format!("starting the cleaner: {error}"))?;
        tracing::info!(
            %server_id, %address, log_mib = arguments.log_mib, replicas = arguments.replicas,
            "server serving"
        );
        println!("server {server_id} listening on {address}");
        let master = Arc::new(master);
        let master_for_metrics = master.clone();
        // One port serves both: the backup opcodes go to the backup, the rest to the master.
        let master: Arc<dyn stratus_rpc::Service> = master;
        let backup_at_stop = backup.clone();
        let backup_for_metrics = backup.clone();
        let service: Arc<dyn stratus_rpc::Service> = match backup {
            Some(backup) => {
                let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
                tokio::spawn(collect_garbage(backup.clone(), coordinator.clone(), pool));
                Arc::new(BackupRouter::new(backup, master))
            }
            None => master,
        };
        let mut resp_gateway = None;
        if let Some(resp_listener) = resp_listener {
            println!("server {server_id} speaks RESP on {}", resp_listener.local_address());
            let mut client_config = ClientConfig::new(coordinator.clone());
            client_config.operation_timeout = RESP_OPERATION_TIMEOUT;
            let client = Client::with_in_process_server(
                client_config,
                environment.clone(),
                address.clone(),
                service.clone(),
            );
            let gateway_config = stratus_resp::GatewayConfig {
                table_span: arguments.resp_table_span,
                limits: stratus_resp::RequestLimits {
                    argument_bytes_max: store_value_bytes_max as usize,
                    ..stratus_resp::RequestLimits::default()
                },
                local_master: Some(address.clone()),
                // Its own requests go out as a member's (this process's network); its RESP
                // clients give the client password with AUTH.
                password: client_password.clone().map(stratus_resp::RespPassword),
                // A named user's session goes out as that user, on a network without the
                // cluster secret, so the cluster applies the user's grants.
                user_clients: client_password.as_ref().map(|_| {
                    let mut user_config = ClientConfig::new(coordinator.clone());
                    user_config.operation_timeout = RESP_OPERATION_TIMEOUT;
                    user_config.tls = tls.as_ref().map(|tls| tls.client.clone());
                    user_clients(user_config)
                }),
                ..stratus_resp::GatewayConfig::default()
            };
            let gateway = Arc::new(stratus_resp::Gateway::new(client, gateway_config));
            resp_gateway = Some(gateway.clone());
            tokio::spawn(stratus_resp::serve(gateway, resp_listener));
        }
        if let Some(listener) = metrics_listener {
            let figures = metrics::ServerFigures {
                server_id,
                address: address.clone(),
                master: master_for_metrics,
                backup: backup_for_metrics,
                resp: resp_gateway,
            };
            let access = metrics::MetricsAccess::new(admission.membership(), None, tls.clone())
                .with_token(metrics_token);
            metrics::serve_server(listener, figures, access);
        }
        tokio::select! {
            result = serve_admitting(listener, service, admission) => {
                result.map_err(|error| error.to_string())
            }
            _ = termination(arguments.exit_with_parent) => {
                tracing::info!("server stopping");
                // Serve nothing more, then say so: the coordinator records an orderly stop
                // (not a crash found by missed pings) and recovers the tablets at once.
                lease_at_stop.surrender();
                announce_stopping(&environment, &coordinator, server_id).await;
                // Buffered replicas of open heads exist only in this process's memory: put
                // them on disk, so a cluster stopped and started again recovers them.
                if let Some(backup) = backup_at_stop {
                    let written = backup.flush_open_replicas(STOP_FLUSH_PATIENCE).await;
                    tracing::info!(written, "open replicas written to disk");
                }
                Ok(())
            }
            _ = declared_crashed => {
                // A zombie: its tablets are being recovered elsewhere. Serving on could only
                // hand out stale data.
                Err(format!("server {server_id} was declared crashed by the coordinator; exiting"))
            }
        }
    })
}

/// What a server tells the coordinator when it enlists.
struct Enlistment<'a> {
    address: &'a str,
    services: ServiceMask,
    /// The id it had before a restart (0: none).
    previous: stratus_types::ServerId,
    /// Its failure domain (`--failure-domain`; empty: none).
    failure_domain: &'a str,
}

/// Joins the cluster, retrying while the coordinator is not reachable yet.
async fn enlist(
    environment: &Environment,
    coordinator: &str,
    enlistment: Enlistment<'_>,
    patience: Duration,
) -> Result<stratus_types::ServerId, String> {
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    let request = Request::EnlistServer {
        address: enlistment.address.to_string(),
        services: enlistment.services,
        previous_server_id: enlistment.previous,
        failure_domain: enlistment.failure_domain.to_string(),
    };
    let deadline = stratus_rpc::deadline_in(patience);
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    loop {
        match pool.call_coordinator(coordinator, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::EnlistServer { server_id }))) => {
                return Ok(server_id)
            }
            Ok((status, body)) => {
                return Err(format!("coordinator refused enlistment: {status} {body:?}"))
            }
            Err(error) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("cannot reach the coordinator at {coordinator}: {error}"));
                }
            }
        }
        tokio::time::sleep(backoff.next_delay(&*environment.entropy)).await;
    }
}

/// How long a stopping server tries to tell the coordinator: past it, the coordinator finds
/// out from missed pings, as for a crash.
const STOPPING_NOTICE_PATIENCE: Duration = Duration::from_secs(2);

/// Tells the coordinator this server stops in order (SERVER_STOPPING), within
/// [`STOPPING_NOTICE_PATIENCE`].
async fn announce_stopping(
    environment: &Environment,
    coordinator: &str,
    server_id: stratus_types::ServerId,
) {
    let config = RpcConfig { request_timeout: STOPPING_NOTICE_PATIENCE, ..RpcConfig::default() };
    let pool = ChannelPool::new(environment.network.clone(), config);
    let request = Request::ServerStopping { server_id };
    let answer = tokio::time::timeout(
        STOPPING_NOTICE_PATIENCE,
        pool.call_coordinator(coordinator, &request),
    )
    .await;
    match answer {
        Ok(Ok((Status::Ok, _))) => {
            tracing::info!(%server_id, "the coordinator knows this server stops")
        }
        other => {
            tracing::warn!(%server_id, ?other, "could not tell the coordinator this server stops; it will find out from missed pings")
        }
    }
}
