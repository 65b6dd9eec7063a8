//! The peer systems the benchmarks start (Redis, memcached): found on PATH, never installed,
//! each on a free loopback port with its log in the benchmark's directory.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stratus_resp::Value;

use crate::cluster::{free_loopback_address, ChildProcess};
use crate::redis_reference::find_executable;
use crate::resp_client::RespConnection;

/// How long one socket read or write may block: every wait of a driver is bounded.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);

/// A loopback connection with Nagle off and bounded reads and writes.
pub(crate) fn connect(address: &str) -> Result<TcpStream, String> {
    let stream =
        TcpStream::connect(address).map_err(|error| format!("connecting to {address}: {error}"))?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_nodelay(true).map_err(|error| error.to_string())?;
    Ok(stream)
}

/// How long a peer may take to start answering (a replica: to finish its first sync).
const START_PATIENCE: Duration = Duration::from_secs(60);

/// How a Redis deployment keeps an acknowledged write (docs/benchmarks.md, "What each
/// configuration survives").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisDurability {
    /// Memory only: no append-only file, no snapshots.
    None,
    /// `appendonly yes`, `appendfsync everysec`: the file is fsynced once a second.
    Everysec,
    /// `appendonly yes`, `appendfsync always`: fsynced before the reply.
    Always,
    /// A primary and `replicas` replicas on loopback, each with `appendfsync everysec`; every
    /// write is followed by `WAIT replicas 0` in the same round trip, so it is acknowledged
    /// once every replica holds it (in memory): the peer of a Stratus `buffered` write on R
    /// backups.
    Wait {
        /// Replicas every write waits for.
        replicas: u32,
    },
}

impl RedisDurability {
    /// From a configuration name: `none`, `everysec`, `always` or `wait-R` (R ≥ 1).
    pub fn parse(name: &str) -> Option<RedisDurability> {
        match name {
            "none" => Some(RedisDurability::None),
            "everysec" => Some(RedisDurability::Everysec),
            "always" => Some(RedisDurability::Always),
            _ => {
                let replicas = name.strip_prefix("wait-")?.parse().ok()?;
                (replicas > 0).then_some(RedisDurability::Wait { replicas })
            }
        }
    }

    /// The configuration's name.
    pub fn name(self) -> String {
        match self {
            RedisDurability::None => "none".to_string(),
            RedisDurability::Everysec => "everysec".to_string(),
            RedisDurability::Always => "always".to_string(),
            RedisDurability::Wait { replicas } => format!("wait-{replicas}"),
        }
    }

    /// Replicas each write waits for, if any.
    pub fn wait_replicas(self) -> Option<u32> {
        match self {
            RedisDurability::Wait { replicas } => Some(replicas),
            _ => None,
        }
    }

    /// The persistence arguments of each of its servers.
    fn persistence_arguments(self) -> [&'static str; 4] {
        match self {
            RedisDurability::None => ["--appendonly", "no", "--appendfsync", "everysec"],
            RedisDurability::Always => ["--appendonly", "yes", "--appendfsync", "always"],
            RedisDurability::Everysec | RedisDurability::Wait { .. } => {
                ["--appendonly", "yes", "--appendfsync", "everysec"]
            }
        }
    }
}

/// A Redis deployment a benchmark started: one server, or a primary and its replicas; every
/// process is stopped when it is dropped.
pub struct RedisDeployment {
    /// The address clients use (the primary's).
    pub address: String,
    /// How it keeps writes.
    pub durability: RedisDurability,
    /// The primary first, then the replicas.
    processes: Vec<ChildProcess>,
    /// What a client trusts, if the deployment speaks TLS.
    tls: Option<stratus_tls::ClientTls>,
}

impl RedisDeployment {
    /// A connection to the primary (over TLS if the deployment speaks it).
    pub fn connect(&self) -> Result<RespConnection, String> {
        RespConnection::open_with(&self.address, self.tls.as_ref())
    }

    /// The process ids of every server of the deployment.
    pub fn process_ids(&self) -> Vec<u32> {
        self.processes.iter().map(ChildProcess::id).collect()
    }
}

/// Starts Redis in `directory` as `durability` says: a server on a free loopback port with
/// `--save ""` (no snapshots) and the append-only file as configured; for `wait-R`, R
/// replicas more (`--replicaof` the primary, each in a directory of its own), and returns only
/// once every replica is connected and in sync and a write has been acknowledged by all of
/// them.
pub fn start_redis(
    directory: &Path,
    durability: RedisDurability,
) -> Result<RedisDeployment, String> {
    start_redis_with(directory, durability, None)
}

/// [`start_redis`], speaking only TLS (every server, and between primary and replicas) with
/// `tls`'s certificate if given.
pub fn start_redis_with(
    directory: &Path,
    durability: RedisDurability,
    tls: Option<&crate::tls::BenchTls>,
) -> Result<RedisDeployment, String> {
    let (primary, address) =
        start_redis_server(&directory.join("primary"), durability, None, tls, &[])?;
    let client_tls = tls.map(|tls| tls.client().clone());
    let mut deployment =
        RedisDeployment { address, durability, processes: vec![primary], tls: client_tls };
    if let Some(replicas) = durability.wait_replicas() {
        let port = deployment.address.rsplit(':').next().unwrap_or_default().to_string();
        for index in 1..=replicas {
            let replica_directory = directory.join(format!("replica-{index}"));
            let (replica, _) =
                start_redis_server(&replica_directory, durability, Some(&port), tls, &[])?;
            deployment.processes.push(replica);
        }
        wait_until_replicas_in_sync(&deployment, replicas)?;
    }
    Ok(deployment)
}

/// Starts one Redis server in `directory`, without persistence, that holds at most
/// `maxmemory_bytes` (its `used_memory`) and past it evicts the keys used least recently
/// (`maxmemory-policy allkeys-lru`): Redis as a cache of a fixed DRAM budget.
pub fn start_redis_evicting(
    directory: &Path,
    maxmemory_bytes: u64,
) -> Result<RedisDeployment, String> {
    let durability = RedisDurability::None;
    let maxmemory = maxmemory_bytes.to_string();
    let eviction = ["--maxmemory", &maxmemory, "--maxmemory-policy", "allkeys-lru"];
    let (server, address) = start_redis_server(directory, durability, None, None, &eviction)?;
    Ok(RedisDeployment { address, durability, processes: vec![server], tls: None })
}

/// One redis-server in `directory` (created), a replica of the primary on loopback port
/// `primary_port` if given, with `extra` arguments last; returns it and its address once it
/// answers PING.
fn start_redis_server(
    directory: &Path,
    durability: RedisDurability,
    primary_port: Option<&str>,
    tls: Option<&crate::tls::BenchTls>,
    extra: &[&str],
) -> Result<(ChildProcess, String), String> {
    std::fs::create_dir_all(directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?;
    let (mut command, address, port) = peer_command("redis-server", directory)?;
    match tls {
        None => command.args(["--port", &port]),
        Some(tls) => command.args(tls.redis_arguments(&port)),
    };
    command
        .args(["--bind", "127.0.0.1", "--daemonize", "no", "--save", ""])
        .args(durability.persistence_arguments())
        .arg("--dir")
        .arg(directory);
    if let Some(primary_port) = primary_port {
        command.args(["--replicaof", "127.0.0.1", primary_port]);
    }
    command.args(extra);
    let server = ChildProcess::spawn(&mut command, "redis-server")?;
    match tls {
        None => wait_until_answering(&address, b"*1\r\n$4\r\nPING\r\n", "+PONG")?,
        Some(tls) => wait_until_pong_over_tls(&address, tls.client())?,
    }
    Ok((server, address))
}

/// Polls until the TLS server at `address` answers PING with PONG (bounded by
/// [`START_PATIENCE`]).
fn wait_until_pong_over_tls(address: &str, tls: &stratus_tls::ClientTls) -> Result<(), String> {
    let deadline = Instant::now() + START_PATIENCE;
    let mut last = String::from("no connection");
    while Instant::now() < deadline {
        match RespConnection::open_with(address, Some(tls)).map(|mut c| c.call(&[b"PING"])) {
            Ok(Ok(Value::SimpleString(pong))) if pong == "PONG" => return Ok(()),
            Ok(Ok(other)) => last = format!("{other:?}"),
            Ok(Err(error)) => last = error.to_string(),
            Err(error) => last = error,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{address} did not answer PONG over TLS within {} s (last: {last})",
        START_PATIENCE.as_secs()
    ))
}

/// Polls the primary's `INFO replication` until `replicas` replicas are connected and online
/// (their first sync done), then checks with a write that `WAIT replicas 0` returns; bounded by
/// [`START_PATIENCE`].
fn wait_until_replicas_in_sync(primary: &RedisDeployment, replicas: u32) -> Result<(), String> {
    let deadline = Instant::now() + START_PATIENCE;
    let mut connection = primary.connect()?;
    loop {
        let info = match connection.call(&[b"INFO", b"replication"])? {
            Value::BulkString(text) => String::from_utf8_lossy(&text).into_owned(),
            other => return Err(format!("INFO replication answered {other:?}")),
        };
        if replicas_online(&info) >= replicas {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{replicas} Redis replicas were not online within {} s: {info}",
                START_PATIENCE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    connection.call_then_wait(&[b"SET", b"stratus-bench-replicas-ready", b"1"], replicas)?;
    Ok(())
}

/// Replicas an `INFO replication` text lists as online (`slaveN:...,state=online,...`).
fn replicas_online(info: &str) -> u32 {
    let online = info
        .lines()
        .filter(|line| line.starts_with("slave") && line.contains(":ip="))
        .filter(|line| line.contains("state=online"))
        .count();
    u32::try_from(online).unwrap_or(u32::MAX)
}

/// Starts memcached with its defaults (4 worker threads) except: loopback only on a free
/// port, no UDP, and `megabytes` of item memory (`-m`); returns it and its address once it
/// answers.
pub(crate) fn start_memcached(
    directory: &Path,
    megabytes: u64,
) -> Result<(ChildProcess, String), String> {
    let (mut command, address, port) = peer_command("memcached", directory)?;
    let megabytes = megabytes.to_string();
    command.args(["-p", &port, "-l", "127.0.0.1", "-U", "0", "-m", &megabytes]);
    if running_as_root() {
        // memcached refuses to run as root unless told which user to be.
        command.args(["-u", "root"]);
    }
    let server = ChildProcess::spawn(&mut command, "memcached")?;
    wait_until_answering(&address, b"version\r\n", "VERSION")?;
    Ok((server, address))
}

/// The command of peer `executable` (found on PATH; the Debian package of the same name when
/// missing) on a free loopback port, its input closed and its output and errors appended to
/// `directory/<executable>.log`; with its address and port, for the caller's arguments.
pub(crate) fn peer_command(
    executable: &str,
    directory: &Path,
) -> Result<(Command, String, String), String> {
    let path = find_peer(executable, executable)?;
    let address = free_loopback_address()?;
    let port = address.rsplit(':').next().unwrap_or_default().to_string();
    let log = peer_log(directory, &format!("{executable}.log"))?;
    let mut command = Command::new(path);
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|error| error.to_string())?)
        .stderr(log);
    Ok((command, address, port))
}

pub(crate) fn find_peer(executable: &str, package: &str) -> Result<std::path::PathBuf, String> {
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    find_executable(executable, &search_path).ok_or_else(|| {
        format!("{executable} not found on PATH: install the Debian package {package} (apt-get install {package})")
    })
}

fn peer_log(directory: &Path, name: &str) -> Result<std::fs::File, String> {
    let path = directory.join(name);
    std::fs::File::create(&path).map_err(|error| format!("{}: {error}", path.display()))
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Polls until the server at `address` answers `request` with a line starting with `expected`;
/// at most [`START_PATIENCE`].
pub(crate) fn wait_until_answering(
    address: &str,
    request: &[u8],
    expected: &str,
) -> Result<(), String> {
    let deadline = Instant::now() + START_PATIENCE;
    let mut last = String::from("no connection");
    while Instant::now() < deadline {
        if let Ok(mut stream) = connect(address) {
            let mut line = String::new();
            if stream.write_all(request).is_ok() {
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut line).is_ok() && line.starts_with(expected) {
                    return Ok(());
                }
                last = line.trim_end().to_string();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{address} did not answer {expected} within {} s (last: {last})",
        START_PATIENCE.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_configurations_are_named_and_parsed() {
        for name in ["none", "everysec", "always", "wait-1", "wait-3"] {
            assert_eq!(RedisDurability::parse(name).unwrap().name(), name);
        }
        assert_eq!(
            RedisDurability::parse("wait-3").unwrap().wait_replicas(),
            Some(3),
            "wait-3 waits for 3 replicas"
        );
        assert_eq!(RedisDurability::parse("everysec").unwrap().wait_replicas(), None);
        for bad in ["wait-0", "wait-", "wait-x", "sometimes", ""] {
            assert_eq!(RedisDurability::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_online_replicas_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=1,state=online,offset=42,lag=0\r\n\
            slave1:ip=127.0.0.1,port=2,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=3,state=online,offset=42,lag=1\r\n\
            master_failover_state:no-failover\r\n";
        assert_eq!(replicas_online(info), 2);
        assert_eq!(replicas_online("role:master\r\nconnected_slaves:0\r\n"), 0);
    }
}
