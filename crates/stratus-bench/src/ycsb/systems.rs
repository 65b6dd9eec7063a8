//! The systems and configurations the benchmark measures, each started fresh.

use std::path::Path;
use std::sync::Arc;

use stratus_client::{BlockingClient, ClientConfig, TableId};

use super::bindings::{Database, MemcachedDatabase, RedisDatabase, StratusDatabase};
use super::YcsbArguments;
use crate::cluster::{start_local_cluster, ChildProcess};
use crate::cpu::{process_tree, CpuError};
use crate::peers::{start_memcached, start_redis_with, RedisDeployment, RedisDurability};
use crate::tls::BenchTls;

/// A running system configuration: its processes (stopped on drop) and how to connect.
pub enum Running {
    /// A `stratus up` cluster and the table the records go to.
    Stratus {
        /// `stratus up`, which runs the coordinator and servers as its children (shared when
        /// several tables of one cluster are measured, as `bench flash` does).
        cluster: Arc<ChildProcess>,
        /// The coordinator's address.
        coordinator: String,
        /// `usertable`.
        table: TableId,
        /// Whether the clients are exactly-once (the default; `-eo-off` configurations not).
        exactly_once: bool,
        /// What the clients trust, for a `+tls` configuration.
        tls: Option<stratus_tls::ClientTls>,
    },
    /// Redis, one server or a primary with replicas.
    Redis(RedisDeployment),
    /// memcached.
    Memcached {
        /// The server.
        server: ChildProcess,
        /// Its address.
        address: String,
    },
}

impl Running {
    /// A new connection for one driver thread.
    pub fn connect(&self) -> Result<Box<dyn Database>, String> {
        match self {
            Running::Stratus { coordinator, table, exactly_once, tls, .. } => {
                let mut config = ClientConfig::new(coordinator.clone());
                config.exactly_once = *exactly_once;
                config.tls = tls.clone();
                let client = BlockingClient::new(config)
                    .map_err(|error| format!("stratus client: {error:?}"))?;
                Ok(Box::new(StratusDatabase { client, table: *table }))
            }
            Running::Redis(deployment) => Ok(Box::new(RedisDatabase::over(
                deployment.connect()?,
                deployment.durability.wait_replicas(),
            ))),
            Running::Memcached { address, .. } => Ok(Box::new(MemcachedDatabase::open(address)?)),
        }
    }

    /// Every process of the system, for its CPU time: for Stratus `stratus up` and all its
    /// descendants (coordinator, servers), for Redis every server, for memcached its one.
    pub fn process_ids(&self) -> Result<Vec<u32>, CpuError> {
        match self {
            Running::Stratus { cluster, .. } => process_tree(cluster.id()),
            Running::Redis(deployment) => Ok(deployment.process_ids()),
            Running::Memcached { server, .. } => Ok(vec![server.id()]),
        }
    }
}

/// A configuration to measure.
#[derive(Clone, Debug)]
pub struct Configuration {
    /// stratus, redis or memcached.
    pub system: &'static str,
    /// The configuration's name (docs/ycsb.md, "Configurations").
    pub name: &'static str,
}

impl Configuration {
    /// True for a `+tls` configuration: the same as the one without the suffix, over TLS.
    pub fn tls(&self) -> bool {
        self.name.ends_with(TLS_SUFFIX)
    }

    /// The name without `+tls`.
    fn base_name(&self) -> &'static str {
        self.name.strip_suffix(TLS_SUFFIX).unwrap_or(self.name)
    }
}

/// What a configuration's name ends with when it runs over TLS.
const TLS_SUFFIX: &str = "+tls";

/// The documented configurations of each system. Those over TLS (`+tls`) run only when named
/// in --configs.
pub fn configurations(system: &str) -> Result<Vec<Configuration>, String> {
    let names: &[&'static str] = match system {
        "stratus" => {
            &["r0", "r3-buffered", "r3-buffered-eo-off", "r3-fsync", "r0+tls", "r3-buffered+tls"]
        }
        "redis" => &["everysec", "always", "wait-3", "everysec+tls", "wait-3+tls"],
        "memcached" => &["default"],
        other => return Err(format!("unknown system {other:?} (stratus, redis, memcached)")),
    };
    let system = match system {
        "stratus" => "stratus",
        "redis" => "redis",
        _ => "memcached",
    };
    Ok(names.iter().map(|name| Configuration { system, name }).collect())
}

/// Starts `configuration` in `directory` (over TLS with `tls`'s certificate, for a `+tls`
/// configuration).
pub fn start(
    configuration: &Configuration,
    arguments: &YcsbArguments,
    directory: &Path,
    tls: Option<&BenchTls>,
) -> Result<Running, String> {
    match configuration.system {
        "stratus" => start_stratus(configuration.base_name(), arguments, directory, tls),
        "redis" => {
            let name = configuration.base_name();
            let durability = RedisDurability::parse(name)
                .ok_or_else(|| format!("unknown Redis configuration {name}"))?;
            Ok(Running::Redis(start_redis_with(directory, durability, tls)?))
        }
        _ => {
            // Enough memory that no record is evicted (the default 64 MB would evict above
            // ~50,000 records).
            let megabytes = (arguments.records * 4 / 1_000).max(64);
            let (server, address) = start_memcached(directory, megabytes)?;
            Ok(Running::Memcached { server, address })
        }
    }
}

fn start_stratus(
    name: &str,
    arguments: &YcsbArguments,
    directory: &Path,
    tls: Option<&BenchTls>,
) -> Result<Running, String> {
    // `-eo-off`: the same cluster, its clients without exactly-once (no lease, no identity,
    // no completion record): what exactly-once costs.
    let exactly_once = !name.ends_with("-eo-off");
    let (replicas, durability) = match name.trim_end_matches("-eo-off") {
        "r0" => ("0", "buffered"),
        "r3-buffered" => ("3", "buffered"),
        _ => ("3", "fsync"),
    };
    if replicas == "3" && arguments.stratus_servers < 4 {
        return Err("Stratus with 3 replicas needs --stratus-servers 4 or more".into());
    }
    let log_mib = arguments.stratus_log_mib.to_string();
    let mut flags = ["--log-mib", &log_mib, "--replicas", replicas, "--durability", durability]
        .map(str::to_string)
        .to_vec();
    flags.extend(tls.map(BenchTls::stratus_flags).unwrap_or_default());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = start_local_cluster(directory, arguments.stratus_servers, &flags, None)?;
    let coordinator = cluster.coordinator.clone();
    let tls = tls.map(|tls| tls.client().clone());
    let mut config = ClientConfig::new(coordinator.clone());
    config.tls = tls.clone();
    let client =
        BlockingClient::new(config).map_err(|error| format!("stratus client: {error:?}"))?;
    let table = client
        .create_table("usertable", arguments.stratus_servers)
        .map_err(|error| format!("creating usertable: {error:?}"))?;
    Ok(Running::Stratus {
        cluster: Arc::new(cluster.process),
        coordinator,
        table,
        exactly_once,
        tls,
    })
}
