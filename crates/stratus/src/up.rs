//! `stratus up`: a whole local cluster in the foreground.
//!
//! The coordinator (or, with `--coordinators N`, N coordinators and the etcd that holds their
//! metadata) and every storage server are child processes of this one (the same binary in its
//! other roles; etcd's own binary), on loopback, with their logs under `DIR/logs`. The command
//! prints a line containing `ready` once every server has enlisted, and on SIGINT or SIGTERM
//! stops every child (SIGTERM, then SIGKILL after a grace period) before exiting. Given a
//! coordinator address with port 0 (one coordinator only), the coordinator picks a free port,
//! and the ready line names the address it listens on.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use stratus_client::{Client, ClientConfig};
use stratus_meta_etcd::local::LocalEtcd;
use stratus_wire::ServerStatus;

/// `stratus up`.
#[derive(Debug, Args)]
pub struct UpArguments {
    /// Directory for all of the cluster's data and logs.
    #[arg(long, default_value = "stratus-data")]
    pub dir: PathBuf,
    /// Coordinators to run. With more than one, the cluster's metadata lives in an etcd that
    /// `up` starts (the `etcd` binary; Debian: etcd-server) and every coordinator but the
    /// first stands by: when the active one dies, a standby takes over within seconds and the
    /// cluster carries on. They listen on the coordinator address's port, then the ports after
    /// it. A directory keeps the kind it was created with (one coordinator, or etcd).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=COORDINATORS_MAX as i64))]
    pub coordinators: u32,
    /// Number of storage servers. Four by default: with two replicas per segment the cluster
    /// then stays writable and recovers a crashed master (each survivor still has two backups
    /// besides itself).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Log memory per server, in MiB. The log keeps about three segments in reserve for the
    /// cleaner and for removes, so small logs fill early; 256 MiB of 8 MiB segments admits
    /// writes up to about 90 % of the log. The region is reserved, not touched, until used.
    #[arg(long, default_value_t = 256)]
    pub log_mib: u64,
    /// Segment size per server, in MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u32,
    /// Copies of every segment on other servers (default: 3, or servers − 2 if fewer, so that
    /// after one crash every master still finds R backups besides itself; 0 runs memory-only).
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Placement of replicas: random or copyset.
    #[arg(long, default_value = "random", value_parser = ["random", "copyset"])]
    pub placement: String,
    /// Spread the servers over this many failure domains, as if in racks: server i gets
    /// `--failure-domain rack-(i mod N)`, and placement keeps a segment's copies in distinct
    /// racks (docs/design/replication.md, "Failure domains"). 0: no domains.
    #[arg(long, default_value_t = 0)]
    pub racks: u32,
    /// Every server touches every page of its log memory at start (see `stratus server
    /// --prefault-memory`): it holds all of its memory from the first moment, and no write or
    /// recovery pays a page's first-use fault.
    #[arg(long)]
    pub prefault_memory: bool,
    /// Each server keeps its log's resident memory near live bytes / this percentage, cleaning
    /// ahead of need and giving free memory back (see `stratus server --memory-target-percent`);
    /// 0 lets each log fill its region before cleaning and keep what it touched.
    #[arg(long, default_value_t = stratus_store::MEMORY_TARGET_PERCENT_DEFAULT,
          value_parser = clap::value_parser!(u32).range(0..=99))]
    pub memory_target_percent: u32,
    /// Seglet size per server, in KiB.
    #[arg(long, default_value_t = 64)]
    pub seglet_kib: u32,
    /// Cleaning levels per server (1 or 2; default: 2 with replicas, 1 without).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub cleaner_levels: Option<u32>,
    /// When backups acknowledge replica writes: buffered (in their RAM) or fsync (on disk).
    #[arg(long, default_value = "buffered", value_parser = ["buffered", "fsync"])]
    pub durability: String,
    /// RAM buffers of each server's backup, one segment each.
    #[arg(long, default_value_t = stratus_backup::BackupConfig::BUFFER_COUNT_DEFAULT)]
    pub backup_buffers: usize,
    /// Storage frames of each server's backup, one segment each.
    #[arg(long, default_value_t = stratus_backup::BackupConfig::FRAME_COUNT_DEFAULT)]
    pub backup_frames: u32,
    /// First port of the metrics endpoints, on 127.0.0.1: the coordinator's (with the status
    /// page) on this port, server i's on this port + 1 + i, and standby coordinator j's (with
    /// `--coordinators`) on this port + servers + j, served once it is active. Without it,
    /// each process takes a free port; the first coordinator's and the servers' are printed
    /// once the cluster is ready (a standby that takes over prints its own in its log).
    #[arg(long, conflicts_with = "no_metrics")]
    pub metrics_port: Option<u16>,
    /// Serve no metrics and no status page.
    #[arg(long)]
    pub no_metrics: bool,
    /// Milliseconds between two pings each server sends a random peer (failure detection; see
    /// `stratus server --probe-interval-ms`). 0 pings no peer.
    #[arg(long, default_value_t = stratus_master::PeerProbeConfig::default().probe_interval.as_millis() as u64)]
    pub probe_interval_ms: u64,
    /// The coordinator's pings a suspect server must miss in a row to be declared crashed
    /// (see `stratus coordinator --probe-misses`). 0 turns failure detection off.
    #[arg(long, default_value_t = 3)]
    pub probe_misses: u32,
    /// First port of the servers' RESP (Redis protocol) front ends, on 127.0.0.1: server i
    /// speaks RESP on this port + i (0: each takes a free port), and the tables they create
    /// span every server. The addresses are printed once the cluster is ready. Without it, no
    /// server speaks RESP.
    #[arg(long)]
    pub resp_port: Option<u16>,
    /// Threads serving requests in each server. Default: the machine's CPUs divided among the
    /// servers (at least one each), since all of them share this machine.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// The cluster secret every coordinator and server proves to the others (see `stratus
    /// server --cluster-secret-file`). A file that does not exist is created with 32 random
    /// bytes, hex-encoded, readable by its owner only. Without it the cluster runs in insecure
    /// mode, fine on loopback.
    #[arg(long, env = "STRATUS_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// The client password every coordinator and server asks clients for (see `stratus server
    /// --client-password-file`; needs --cluster-secret-file). A file that does not exist is
    /// created with 32 random bytes, hex-encoded, readable by its owner only. Clients give it
    /// with --password-file (or STRATUS_PASSWORD_FILE), Redis clients with AUTH.
    #[arg(long, env = "STRATUS_CLIENT_PASSWORD_FILE", requires = "cluster_secret_file")]
    pub client_password_file: Option<PathBuf>,
    /// Secure mode: TLS on every listener with certificates from a local CA written to
    /// DIR/tls (kept across runs), a cluster secret and a client password (DIR/secrets unless
    /// --cluster-secret-file and --client-password-file name others). Prints how to connect
    /// with the CLI, redis-cli and redis-py. Given --tls-cert-file (with --tls-key-file and
    /// --tls-ca-file), those certificates are used instead of the local CA's.
    #[arg(long)]
    pub secure: bool,
}

/// Writes 32 random bytes, hex-encoded, to a new file at `path`, readable by its owner only. The
/// bytes go to a temporary file first, synced, then linked into place (a link never replaces an
/// existing file), so a crash leaves either no secret file or a whole one: never an empty one
/// that every later start would refuse.
fn create_secret_file(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use stratus_env::Entropy;
    let entropy = stratus_env::OsEntropy;
    let secret: String = (0..4).map(|_| format!("{:016x}", entropy.next_u64())).collect();
    let mut temporary_name = path.as_os_str().to_owned();
    temporary_name.push(format!(".new-{}", std::process::id()));
    let temporary = PathBuf::from(temporary_name);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(format!("{secret}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::hard_link(&temporary, path)
    })();
    let _ = std::fs::remove_file(&temporary);
    written
}

/// The secret file at `path` (given with `flag`), created with a fresh random secret if it
/// does not exist; returns its absolute path (the children run elsewhere) and its contents.
fn ensure_secret_file(path: &Path, flag: &str) -> Result<(PathBuf, Vec<u8>), String> {
    let shown = path.display();
    if !path.exists() {
        create_secret_file(path).map_err(|error| format!("{flag} {shown}: {error}"))?;
        println!("{flag}: created {shown}");
    }
    let contents = stratus_rpc::membership::read_secret_file(path)
        .map_err(|error| format!("{flag}: {error}"))?;
    if contents.len() < stratus_rpc::membership::CLUSTER_SECRET_BYTES_MIN {
        return Err(format!(
            "{flag} {shown}: fewer than {} bytes",
            stratus_rpc::membership::CLUSTER_SECRET_BYTES_MIN
        ));
    }
    let absolute =
        std::fs::canonicalize(path).map_err(|error| format!("{flag} {shown}: {error}"))?;
    Ok((absolute, contents))
}

/// The line a role prints once its metrics endpoint serves, before its URL (see
/// `roles/metrics.rs`).
const METRICS_LINE: &str = "metrics served at ";

/// How long `up` looks in a child's log for its metrics address once the cluster is ready.
const METRICS_ADDRESS_PATIENCE: Duration = Duration::from_secs(10);

/// The `--metrics-listen` address of the process at `offset` from `--metrics-port`, if metrics
/// are on.
fn metrics_address(arguments: &UpArguments, offset: u32) -> Option<String> {
    if arguments.no_metrics {
        return None;
    }
    let port = match arguments.metrics_port {
        Some(base) => u32::from(base) + offset,
        None => 0,
    };
    Some(format!("127.0.0.1:{port}"))
}

/// The base of the metrics URL a child printed to its log ("http://127.0.0.1:9000", or
/// https with TLS; `None` if it has not printed it yet).
fn printed_metrics_address(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|line| line.starts_with(METRICS_LINE))?;
    let url = &line[METRICS_LINE.len()..];
    url.strip_suffix("/metrics").map(str::to_string)
}

/// The part of the line a server prints once its RESP front end listens, before the address
/// (see `roles.rs`).
const RESP_LINE: &str = "speaks RESP on ";

/// The port of the RESP address a server printed to its log, if it has.
fn printed_resp_port(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|line| line.contains(RESP_LINE))?;
    let address = line.split(RESP_LINE).nth(1)?.trim();
    address.rsplit_once(':').map(|(_, port)| port.to_string())
}

/// Prints where every server speaks RESP, as the servers printed it (their ports may have
/// been chosen by the system).
fn print_resp_addresses(servers: u32, logs: &Path) {
    let deadline = Instant::now() + METRICS_ADDRESS_PATIENCE;
    for index in 0..servers {
        let log = logs.join(format!("server-{index}.log"));
        let address = loop {
            let printed = std::fs::read_to_string(&log).ok().and_then(|text| {
                let line = text.lines().find(|line| line.contains(RESP_LINE))?;
                line.split(RESP_LINE).nth(1).map(|address| address.trim().to_string())
            });
            match printed {
                Some(address) => break Some(address),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => break None,
            }
        };
        match address {
            Some(address) => println!("redis: server-{index} {address}"),
            None => println!("redis: server-{index}: address not found in {}", log.display()),
        }
    }
}

/// Prints where the status page and every process's metrics are, as the children printed it.
fn print_metrics_addresses(names: &[String], logs: &Path) {
    let deadline = Instant::now() + METRICS_ADDRESS_PATIENCE;
    let mut found = Vec::new();
    for name in names {
        let log = logs.join(format!("{name}.log"));
        let address = loop {
            match printed_metrics_address(&log) {
                Some(address) => break Some(address),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => break None,
            }
        };
        found.push((name, address));
    }
    for (name, address) in found {
        match address {
            Some(base) if name == "coordinator" => {
                println!("status page: {base}/");
                println!("metrics: {name} {base}/metrics");
            }
            Some(base) => println!("metrics: {name} {base}/metrics"),
            None => println!("metrics: {name}: address not found in {}", logs.display()),
        }
    }
}

/// Coordinators `up` runs at most: one is active, the others only wait for the leadership,
/// so a few cover any failure one machine can show.
const COORDINATORS_MAX: u32 = 5;

/// The addresses of `count` coordinators: `first`, then the ports after its port.
fn coordinator_addresses(first: &str, count: u32) -> Result<Vec<String>, String> {
    if first.contains(',') {
        return Err(format!(
            "`up` starts its coordinators itself: give one address (--coordinator), not {first:?}"
        ));
    }
    if count == 1 {
        return Ok(vec![first.to_string()]);
    }
    let (host, port) = first
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("coordinator address {first:?} is not host:port"))?;
    if port == 0 {
        // One coordinator may take a free port (it prints which); standbys' ports follow the
        // first's, so they need it fixed.
        return Err("--coordinators needs a fixed coordinator port, not 0".to_string());
    }
    if u32::from(port) + count - 1 > u32::from(u16::MAX) {
        return Err(format!("--coordinators {count} from port {port} leaves the port range"));
    }
    Ok((0..count).map(|index| format!("{host}:{}", u32::from(port) + index)).collect())
}

/// Where the coordinator keeps the cluster's metadata under `DIR`: the embedded store's
/// directory, or etcd's data directory.
fn metadata_directories(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("coordinator"), dir.join("etcd"))
}

/// Refuses to start a directory's cluster with the other kind of metadata store than it was
/// created with: the new store would be empty, and the servers' backups would hold replicas
/// of masters it never heard of.
fn check_metadata_kind(dir: &Path, on_etcd: bool) -> Result<(), String> {
    let (embedded, etcd) = metadata_directories(dir);
    let holds_files = |path: &Path| {
        std::fs::read_dir(path).map(|mut entries| entries.next().is_some()).unwrap_or(false)
    };
    if on_etcd && holds_files(&embedded) {
        return Err(format!(
            "{} holds a cluster with one coordinator (metadata in {}); start it without \
             --coordinators, or use another --dir",
            dir.display(),
            embedded.display()
        ));
    }
    if !on_etcd && holds_files(&etcd) {
        return Err(format!(
            "{} holds a cluster whose metadata is in etcd ({}); start it with --coordinators \
             2 or more, or use another --dir",
            dir.display(),
            etcd.display()
        ));
    }
    Ok(())
}

/// Starts the etcd that holds the metadata of a cluster with standby coordinators, its data
/// under `DIR/etcd` and its log in `logs`. The kernel kills it when this thread (`up`'s main
/// thread, which lives as long as `up`) ends, so an `up` killed with SIGKILL leaves no etcd
/// holding the directory, as its other children stop by themselves.
fn start_etcd(dir: &Path, logs: &Path) -> Result<LocalEtcd, String> {
    let (_, data) = metadata_directories(dir);
    let parent = std::process::id();
    let log = logs.join("etcd.log");
    keep_as_previous(&log, &logs.join("etcd.previous.log"))?;
    LocalEtcd::start_with(&data, &log, |command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec and calls only prctl(2)
        // and getppid(2), which are async-signal-safe; it allocates nothing (its errors are
        // bare OS codes) and takes no lock.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the death signal was armed.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    })
}

/// How long the cluster may take to come up before `up` gives up.
const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// How long children get to exit after SIGTERM before they are killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One child process of `up`.
struct ChildProcess {
    name: String,
    child: Child,
    /// A coordinator with standbys: its exit is reported, and ends the cluster only when no
    /// coordinator is left.
    has_standbys: bool,
    /// Its exit status, once it exited (then it is reaped: its pid may belong to another
    /// process, and no signal may be sent to it).
    exit_status: Option<std::process::ExitStatus>,
}

struct Children {
    processes: Vec<ChildProcess>,
}

impl Children {
    fn spawn(&mut self, name: &str, arguments: &[String], logs: &Path) -> Result<(), String> {
        self.spawn_process(name, arguments, logs, false)
    }

    fn spawn_process(
        &mut self,
        name: &str,
        arguments: &[String],
        logs: &Path,
        has_standbys: bool,
    ) -> Result<(), String> {
        let log_path = logs.join(format!("{name}.log"));
        keep_as_previous(&log_path, &logs.join(format!("{name}.previous.log")))?;
        let log = std::fs::File::create(&log_path)
            .map_err(|error| format!("{}: {error}", log_path.display()))?;
        let error_log = log.try_clone().map_err(|error| error.to_string())?;
        let executable = std::env::current_exe().map_err(|error| error.to_string())?;
        let child = Command::new(executable)
            .args(arguments)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(error_log)
            .spawn()
            .map_err(|error| format!("starting {name}: {error}"))?;
        self.processes.push(ChildProcess {
            name: name.to_string(),
            child,
            has_standbys,
            exit_status: None,
        });
        Ok(())
    }

    /// Why the cluster cannot go on, if a child's exit means that: any child's, except that
    /// once the cluster is up (`standbys_may_take_over`) a coordinator with standbys may exit
    /// while another coordinator is left (reported here, once). During startup every exit is
    /// a failure to start.
    fn exited(&mut self, standbys_may_take_over: bool) -> Option<String> {
        let mut fatal = None;
        let mut coordinator_exits = Vec::new();
        for process in &mut self.processes {
            if process.exit_status.is_some() {
                continue;
            }
            let Ok(Some(status)) = process.child.try_wait() else { continue };
            process.exit_status = Some(status);
            let exit = format!("{} exited ({status})", process.name);
            if process.has_standbys && standbys_may_take_over {
                coordinator_exits.push(exit);
            } else {
                fatal.get_or_insert(exit);
            }
        }
        let coordinators_left = self
            .processes
            .iter()
            .filter(|process| process.has_standbys && process.exit_status.is_none())
            .count();
        for exit in coordinator_exits {
            if coordinators_left == 0 {
                fatal.get_or_insert(format!("{exit}: it was the last coordinator"));
            } else {
                println!(
                    "stratus up: {exit}; {coordinators_left} coordinator(s) left, of which one \
                     takes over if it was the active one"
                );
            }
        }
        fatal
    }

    /// Each child's name and process id, as one line.
    fn process_ids(&self) -> String {
        let ids: Vec<String> = self
            .processes
            .iter()
            .map(|process| format!("{}={}", process.name, process.child.id()))
            .collect();
        ids.join(" ")
    }

    /// Stops the servers, then the coordinators: each server tells a coordinator that is
    /// still there that it stops in order (so the next start reads as a restart, not as a
    /// crash of every server), and writes its backup's open replicas to disk.
    fn stop(&mut self) {
        let is_coordinator = |process: &ChildProcess| process.name.starts_with("coordinator");
        self.stop_where(|process| !is_coordinator(process));
        self.stop_where(is_coordinator);
        // Every child is reaped now; forget their pids so no signal can reach a recycled one.
        self.processes.clear();
    }

    /// SIGTERM to the children `chosen` picks, then waits for them (SIGKILL after the grace).
    fn stop_where(&mut self, chosen: impl Fn(&ChildProcess) -> bool) {
        for process in self.processes.iter_mut().filter(|process| chosen(process)) {
            // Not a child already reaped: its pid may have been reused.
            if process.exit_status.is_some() || matches!(process.child.try_wait(), Ok(Some(_))) {
                continue;
            }
            if let Ok(pid) = i32::try_from(process.child.id()) {
                // An error means the child is already gone, which is what we want.
                let _ = send_signal(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        for process in self.processes.iter_mut().filter(|process| chosen(process)) {
            let ChildProcess { name, child, exit_status, .. } = process;
            if exit_status.is_some() {
                continue;
            }
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        *exit_status = Some(status);
                        break;
                    }
                    Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        eprintln!("stratus up: {name} did not stop in time; killing it");
                        let _ = child.kill();
                        *exit_status = child.wait().ok();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// Moves the log of the previous run, if there is one, to `previous` (replacing the one before
/// it): each run's log starts empty, and the last run's stays readable after a restart.
fn keep_as_previous(log: &Path, previous: &Path) -> Result<(), String> {
    match std::fs::rename(log, previous) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("{} -> {}: {error}", log.display(), previous.display())),
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The failure domain `stratus up --racks` gives server `index`: racks dealt round-robin, so
/// that they differ by at most one server.
fn rack_of(index: u32, racks: u32) -> Option<String> {
    (racks > 0).then(|| format!("rack-{}", index % racks))
}

#[allow(unsafe_code)]
fn send_signal(pid: i32, signal: i32) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a child we spawned.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Runs the cluster until SIGINT/SIGTERM or until a child dies.
pub fn run(
    arguments: UpArguments,
    coordinator: &str,
    tls: &crate::roles::TlsArguments,
) -> Result<(), String> {
    if arguments.servers == 0 {
        return Err("--servers must be at least 1".to_string());
    }
    let servers = arguments.servers as usize;
    let replicas =
        arguments.replicas.unwrap_or(if servers >= 3 { 3.min(servers - 2) } else { servers - 1 });
    if replicas >= arguments.servers as usize {
        return Err(format!(
            "{replicas} replicas need at least {} servers (a master never backs itself up)",
            replicas + 1
        ));
    }
    if arguments.racks > arguments.servers {
        return Err(format!(
            "--racks {} is more racks than --servers {}",
            arguments.racks, arguments.servers
        ));
    }
    if arguments.racks > 0 && (arguments.racks as usize) < replicas + 1 {
        // Allowed (placement falls back to sharing racks, and says so), but the user asked
        // for racks to survive one: say what they get.
        eprintln!(
            "note: {} racks for {replicas} replicas: a segment's copies cannot all be outside \
             its master's rack and each other's, so losing one rack may lose data (at least {} \
             racks are needed)",
            arguments.racks,
            replicas + 1
        );
    }
    let logs = arguments.dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|error| format!("{}: {error}", logs.display()))?;
    let security = cluster_security(&arguments, tls)?;
    let membership = &security.flags;
    // `up`'s own client proves the client password, and speaks TLS, too.
    let credentials = UpClientCredentials {
        client_key: match &security.client_password {
            Some(password) => Some(
                stratus_rpc::ClusterKey::from_client_password(password)
                    .map_err(|error| format!("--client-password-file: {error}"))?,
            ),
            None => None,
        },
        tls: security.client_tls.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    if let Some(base) = arguments.resp_port {
        if u32::from(base) + arguments.servers > u32::from(u16::MAX) + 1 {
            return Err(format!("--resp-port {base} leaves no port for every server"));
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let worker_threads = arguments
        .worker_threads
        .unwrap_or_else(|| (cpus / arguments.servers.max(1) as usize).max(1))
        .max(1);
    let mut coordinators = coordinator_addresses(coordinator, arguments.coordinators)?;
    let on_etcd = coordinators.len() > 1;
    check_metadata_kind(&arguments.dir, on_etcd)?;
    if let Some(base) = arguments.metrics_port {
        let last = u32::from(base) + arguments.servers + arguments.coordinators - 1;
        if last > u32::from(u16::MAX) {
            return Err(format!("--metrics-port {base} leaves no port for every process"));
        }
    }
    let mut etcd = if on_etcd { Some(start_etcd(&arguments.dir, &logs)?) } else { None };
    let mut children = Children { processes: Vec::new() };
    let started = Instant::now();
    let mut client = None;
    let mut known_before = std::collections::BTreeSet::new();
    for index in 0..coordinators.len() {
        let address = coordinators[index].clone();
        let name = coordinator_name(index);
        let mut coordinator_arguments = vec![
            "coordinator".to_string(),
            "--listen".to_string(),
            address.clone(),
            "--exit-with-parent".to_string(),
            "--probe-misses".to_string(),
            arguments.probe_misses.to_string(),
        ];
        coordinator_arguments.extend(membership.iter().cloned());
        match &etcd {
            Some(etcd) => {
                coordinator_arguments.extend(["--etcd".to_string(), etcd.client_url().to_string()])
            }
            None => {
                let (directory, _) = metadata_directories(&arguments.dir);
                coordinator_arguments.extend(["--dir".to_string(), directory.display().to_string()])
            }
        }
        // The first coordinator's metrics on the first port, as without standbys; the
        // standbys' after the servers'.
        let offset = if index == 0 { 0 } else { arguments.servers + index as u32 };
        if let Some(address) = metrics_address(&arguments, offset) {
            coordinator_arguments.extend(["--metrics-listen".to_string(), address]);
        }
        children.spawn_process(&name, &coordinator_arguments, &logs, on_etcd)?;
        if index == 0 {
            // The first is active before any standby starts, so which one serves is known.
            let log = logs.join("coordinator.log");
            if address.ends_with(":0") {
                // A single coordinator given port 0 (see `coordinator_addresses`) picks a free
                // one itself: what the servers and clients are told is what it printed.
                let marker = COORDINATOR_LISTENING_LINE;
                coordinators[0] = wait_for_printed(&mut children, &mut etcd, &log, marker)?;
            }
            let (first_client, servers_before) = wait_for_coordinator(
                &runtime,
                (&coordinators[0], &credentials),
                &mut children,
                &mut etcd,
                &log,
            )?;
            client = Some(first_client);
            known_before = servers_before;
        } else {
            // A standby checks that it can listen on its address before it says so (`roles.rs`).
            let log = logs.join(format!("{name}.log"));
            wait_for_printed(&mut children, &mut etcd, &log, STANDBY_LINE)?;
        }
    }
    let coordinator_list = coordinators.join(",");
    let client = if on_etcd {
        let mut config = ClientConfig::new(coordinator_list.clone());
        config.operation_timeout = Duration::from_secs(2);
        credentials.apply(&mut config);
        let _guard = runtime.enter();
        Client::new(config)
    } else {
        client.expect("one coordinator was started")
    };
    let coordinator = coordinator_list.as_str();
    for index in 0..arguments.servers {
        let mut extra = Vec::new();
        if let Some(levels) = arguments.cleaner_levels {
            extra.extend(["--cleaner-levels".to_string(), levels.to_string()]);
        }
        if let Some(address) = metrics_address(&arguments, 1 + index) {
            extra.extend(["--metrics-listen".to_string(), address]);
        }
        extra.extend(["--worker-threads".to_string(), worker_threads.to_string()]);
        if let Some(rack) = rack_of(index, arguments.racks) {
            extra.extend(["--failure-domain".to_string(), rack]);
        }
        extra.extend(membership.iter().cloned());
        if arguments.prefault_memory {
            extra.push("--prefault-memory".to_string());
        }
        extra.extend([
            "--memory-target-percent".to_string(),
            arguments.memory_target_percent.to_string(),
        ]);
        if let Some(base) = arguments.resp_port {
            let port = if base == 0 { 0 } else { u32::from(base) + index };
            extra.extend([
                "--resp-listen".to_string(),
                format!("127.0.0.1:{port}"),
                "--resp-table-span".to_string(),
                arguments.servers.to_string(),
            ]);
        }
        children.spawn(
            &format!("server-{index}"),
            &[
                "--coordinator".to_string(),
                coordinator.to_string(),
                "server".to_string(),
                "--exit-with-parent".to_string(),
                "--listen".to_string(),
                "127.0.0.1:0".to_string(),
                "--log-mib".to_string(),
                arguments.log_mib.to_string(),
                "--segment-mib".to_string(),
                arguments.segment_mib.to_string(),
                "--replicas".to_string(),
                replicas.to_string(),
                "--placement".to_string(),
                arguments.placement.clone(),
                "--seglet-kib".to_string(),
                arguments.seglet_kib.to_string(),
                "--backup-dir".to_string(),
                arguments.dir.join(format!("server-{index}")).join("backup").display().to_string(),
                // Beside the backup's file, in the server's own directory of the cluster's.
                "--flash-dir".to_string(),
                arguments.dir.join(format!("server-{index}")).join("flash").display().to_string(),
                "--durability".to_string(),
                arguments.durability.clone(),
                "--backup-buffers".to_string(),
                arguments.backup_buffers.to_string(),
                "--backup-frames".to_string(),
                arguments.backup_frames.to_string(),
                "--probe-interval-ms".to_string(),
                arguments.probe_interval_ms.to_string(),
            ]
            .into_iter()
            .chain(extra)
            .collect::<Vec<_>>(),
            &logs,
        )?;
    }
    loop {
        if let Some(reason) = children.exited(true).or_else(|| etcd_exited(&mut etcd)) {
            return Err(format!("{reason} during startup; logs in {}", logs.display()));
        }
        let enlisted = runtime
            .block_on(client.server_list())
            .map(|servers| {
                servers
                    .iter()
                    .filter(|server| {
                        !known_before.contains(&server.server_id)
                            && server.status == ServerStatus::Up
                    })
                    .count()
            })
            .unwrap_or(0);
        if enlisted >= arguments.servers as usize {
            break;
        }
        if started.elapsed() > STARTUP_PATIENCE {
            return Err(format!(
                "only {enlisted} of {} servers enlisted in time; logs in {}",
                arguments.servers,
                logs.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Before the ready line: whoever waits for it may stop the cluster right after.
    if !arguments.no_metrics {
        // A standby serves its metrics only once it is active.
        let names: Vec<String> = std::iter::once(coordinator_name(0))
            .chain((0..arguments.servers).map(|index| format!("server-{index}")))
            .collect();
        print_metrics_addresses(&names, &logs);
    }
    if arguments.resp_port.is_some() {
        print_resp_addresses(arguments.servers, &logs);
    }
    if let Some(etcd) = &etcd {
        println!(
            "coordinators: {} active, {} standing by; metadata in etcd at {} (pid {})",
            coordinators[0],
            coordinators[1..].join(","),
            etcd.client_url(),
            etcd.process_id()
        );
    }
    if let Some(how) = &security.how_to_connect {
        print_how_to_connect(
            how,
            coordinator,
            arguments.servers,
            arguments.resp_port.is_some(),
            &logs,
        );
    }
    println!("processes: {}", children.process_ids());
    let kind = if on_etcd { "coordinators" } else { "coordinator" };
    println!(
        "stratus cluster ready: {kind} {coordinator}, {} servers, {replicas} replicas, \
         data and logs in {}",
        arguments.servers,
        arguments.dir.display()
    );
    let outcome = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).map_err(|error| error.to_string())?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(|error| error.to_string())?;
        let mut poll = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = terminate.recv() => return Ok(()),
                _ = interrupt.recv() => return Ok(()),
                _ = poll.tick() => {
                    if let Some(reason) = children.exited(true).or_else(|| etcd_exited(&mut etcd)) {
                        return Err(format!("{reason}; stopping the cluster (logs in {})", logs.display()));
                    }
                }
            }
        }
    });
    println!("stratus up: stopping");
    children.stop();
    // After the coordinators, which would otherwise lose their store first.
    drop(etcd);
    outcome
}

/// What `up`'s own client proves and speaks.
struct UpClientCredentials {
    client_key: Option<stratus_rpc::ClusterKey>,
    tls: Option<stratus_tls::ClientTls>,
}

impl UpClientCredentials {
    fn apply(&self, config: &mut ClientConfig) {
        config.client_password_key = self.client_key.clone();
        config.tls = self.tls.clone();
    }
}

/// How the cluster is secured: the flags every coordinator and server is started with, the
/// client password and TLS of `up`'s own client, and the files a secure cluster's clients need.
struct UpSecurity {
    flags: Vec<String>,
    client_password: Option<Vec<u8>>,
    client_tls: Option<stratus_tls::ClientTls>,
    how_to_connect: Option<HowToConnect>,
}

/// The files a client of a secure cluster gives.
struct HowToConnect {
    ca: PathBuf,
    password: PathBuf,
}

/// The cluster's security from `up`'s flags: `--secure` (a local CA, a secret and a password
/// under DIR unless named), or any of --cluster-secret-file, --client-password-file and the
/// TLS flags alone. Says in a line or two which mode the cluster runs in.
fn cluster_security(
    arguments: &UpArguments,
    tls: &crate::roles::TlsArguments,
) -> Result<UpSecurity, String> {
    // With --secure, a file not named by its flag lives in DIR/secrets.
    let secrets = arguments.dir.join("secrets");
    let in_secrets = |name: &str| arguments.secure.then(|| secrets.join(name));
    let secret_path =
        arguments.cluster_secret_file.clone().or_else(|| in_secrets("cluster-secret"));
    let password_path =
        arguments.client_password_file.clone().or_else(|| in_secrets("client-password"));
    if arguments.secure {
        std::fs::create_dir_all(&secrets)
            .map_err(|error| format!("{}: {error}", secrets.display()))?;
    }
    let mut flags = Vec::new();
    let mut client_password = None;
    match &secret_path {
        Some(path) => {
            let (path, _) = ensure_secret_file(path, "--cluster-secret-file")?;
            println!(
                "secure membership: coordinators and servers prove the secret in {}",
                path.display()
            );
            flags.extend(["--cluster-secret-file".to_string(), path.display().to_string()]);
            if let Some(password_path) = &password_path {
                let flag = "--client-password-file";
                let (password_path, password) = ensure_secret_file(password_path, flag)?;
                println!(
                    "client password in {0}: stratus --password-file {0} ..., \
                     redis-cli -a \"$(cat {0})\" ...",
                    password_path.display()
                );
                flags.extend([flag.to_string(), password_path.display().to_string()]);
                client_password = Some(password);
            }
        }
        None => println!(
            "insecure mode: no --cluster-secret-file, so any process that reaches these \
             loopback ports can act as a server of this cluster"
        ),
    }
    let tls = cluster_tls(arguments, tls)?;
    // Checked here, so a wrong file stops `up` before any process starts.
    tls.process("cluster")?;
    let client_tls = tls.client()?;
    flags.extend(tls.flags_for_children());
    let how_to_connect = match (&tls.tls_ca_file, &password_path, arguments.secure) {
        (Some(ca), Some(password), true) => {
            Some(HowToConnect { ca: ca.clone(), password: password.clone() })
        }
        _ => None,
    };
    Ok(UpSecurity { flags, client_password, client_tls, how_to_connect })
}

/// The TLS files of the cluster: with --secure and no certificate given, the local CA's in
/// DIR/tls (written the first time); otherwise what the flags name.
fn cluster_tls(
    arguments: &UpArguments,
    tls: &crate::roles::TlsArguments,
) -> Result<crate::roles::TlsArguments, String> {
    let mut tls = tls.clone();
    if arguments.secure && tls.tls_cert_file.is_none() {
        let directory = arguments.dir.join("tls");
        let (files, created) = stratus_tls::local_authority::ensure(&directory, &[])
            .map_err(|error| format!("local CA: {error}"))?;
        let verb = if created { "wrote" } else { "using" };
        println!(
            "TLS on every port: {verb} a local CA and certificates in {}",
            directory.display()
        );
        tls.tls_ca_file = Some(files.ca_certificate);
        tls.tls_cert_file = Some(files.node_certificate);
        tls.tls_key_file = Some(files.node_key);
    }
    Ok(tls)
}

/// Prints, once the cluster is ready, how the CLI, redis-cli and redis-py connect to it.
fn print_how_to_connect(
    how: &HowToConnect,
    coordinator: &str,
    servers: u32,
    resp: bool,
    logs: &Path,
) {
    let (ca, password) = (how.ca.display(), how.password.display());
    println!("connect with TLS and the client password:");
    println!("  stratus --coordinator {coordinator} --tls-ca-file {ca} --password-file {password} status");
    println!(
        "  users: stratus --coordinator {coordinator} --tls-ca-file {ca} --password-file {password} \
         user set NAME --generate-password --grant 'TABLE-PATTERN=rw'"
    );
    if !resp {
        return;
    }
    let port = (0..servers)
        .find_map(|index| printed_resp_port(&logs.join(format!("server-{index}.log"))))
        .unwrap_or_else(|| "PORT".to_string());
    println!("  redis-cli --tls --cacert {ca} -p {port} -a \"$(cat {password})\" PING");
    println!(
        "  python: redis.Redis(port={port}, ssl=True, ssl_ca_certs=\"{ca}\", \
         password=open(\"{password}\").read().strip())"
    );
}

/// The name (and log file stem) of coordinator `index`.
fn coordinator_name(index: usize) -> String {
    if index == 0 {
        "coordinator".to_string()
    } else {
        format!("coordinator-{index}")
    }
}

/// Why the cluster's etcd is gone, if it is.
fn etcd_exited(etcd: &mut Option<LocalEtcd>) -> Option<String> {
    let status = etcd.as_mut()?.exited()?;
    Some(format!("etcd exited ({status})"))
}

/// Waits until the coordinator at `address` answers; returns a client of it and the ids of the
/// servers it already knew (of an earlier run of the same directory).
fn wait_for_coordinator(
    runtime: &tokio::runtime::Runtime,
    (address, credentials): (&str, &UpClientCredentials),
    children: &mut Children,
    etcd: &mut Option<LocalEtcd>,
    log: &Path,
) -> Result<(Client, std::collections::BTreeSet<stratus_types::ServerId>), String> {
    let mut config = ClientConfig::new(address);
    config.operation_timeout = Duration::from_secs(2);
    credentials.apply(&mut config);
    let client = {
        let _guard = runtime.enter();
        Client::new(config)
    };
    let started = Instant::now();
    loop {
        if let Some(reason) = children.exited(false).or_else(|| etcd_exited(etcd)) {
            return Err(format!("{reason}; see {}", log.display()));
        }
        match runtime.block_on(client.server_list()) {
            Ok(servers) => {
                let known = servers.iter().map(|server| server.server_id).collect();
                return Ok((client, known));
            }
            Err(_) if started.elapsed() < STARTUP_PATIENCE => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(error) => return Err(format!("coordinator did not come up: {error}")),
        }
    }
}

/// The part of the line a coordinator prints once it listens, before its address (`roles.rs`).
const COORDINATOR_LISTENING_LINE: &str = "coordinator listening on ";

/// Waits (at most the startup patience) until the child logging to `log` printed a line
/// containing `marker`; returns what follows the marker on that line, trimmed. Fails at once
/// when a child or etcd exits.
fn wait_for_printed(
    children: &mut Children,
    etcd: &mut Option<LocalEtcd>,
    log: &Path,
    marker: &str,
) -> Result<String, String> {
    let started = Instant::now();
    loop {
        if let Some(reason) = children.exited(false).or_else(|| etcd_exited(etcd)) {
            return Err(format!("{reason}; see {}", log.display()));
        }
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let printed = text.lines().find_map(|line| line.split(marker).nth(1));
        if let Some(rest) = printed {
            return Ok(rest.trim().to_string());
        }
        if started.elapsed() > STARTUP_PATIENCE {
            return Err(format!("no {marker:?} in time; see {}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The line a coordinator on etcd prints once it campaigns for the leadership (`roles.rs`).
const STANDBY_LINE: &str = "standing by for the leadership";
