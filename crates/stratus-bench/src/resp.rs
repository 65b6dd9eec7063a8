//! `stratus bench resp`: `redis-benchmark`, Redis's own load generator, unchanged, against
//! Stratus's RESP front ends and against Redis, in the same run, reported as ratios.
//!
//! Stratus runs as a local cluster (`stratus up --resp-port 0`) in each configuration, and
//! every test goes to one of three places:
//! - `owner`: the RESP port of the server whose master owns the benchmark's key
//!   (`redis-benchmark` without `-r` uses the one key `key:__rand_int__`), served in that
//!   server's own process;
//! - `forwarded`: the RESP port of another server, which forwards to the owner (one hop more);
//! - `gateway`: a `stratus resp` process, which forwards every key (one hop more).
//!
//! Redis runs without persistence (`none`, the reference of memory-only Stratus, `r0`) and with
//! `appendonly yes`, `appendfsync everysec` (`everysec`, the reference of replicated Stratus:
//! neither loses a write when its process dies, though Redis may lose the last second and
//! Stratus nothing acknowledged). Each round runs every target once, in turn, so the drift of a
//! shared machine affects all of them alike.
//!
//! Each test (`get`, `set`) is its own redis-benchmark run, so each row has its own CPU
//! figures: the system's (Redis's one process; the Stratus cluster's processes and the
//! gateway) and the driver's (redis-benchmark, a child of this process, counted when it is
//! reaped).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use stratus_client::{Client, ClientConfig};
use stratus_resp::Value;

use crate::cluster::{
    free_loopback_address, start_local_cluster, start_stratus, ChildProcess, UpCluster,
};
use crate::cpu::{process_tree, CpuCost, PhaseCpu};
use crate::peers::{find_peer, start_redis, RedisDeployment, RedisDurability};
use crate::report::{print_json, Field};
use crate::resp_client::RespConnection;

/// `stratus bench resp`.
#[derive(Debug, Args)]
pub struct RespArguments {
    /// Requests per test and target (redis-benchmark -n).
    #[arg(long, default_value_t = 100_000)]
    pub requests: u64,
    /// Parallel connections (redis-benchmark -c; its default is 50).
    #[arg(long, default_value_t = 50)]
    pub clients: u32,
    /// Commands to run (redis-benchmark -t). The owner and forwarded placements are defined by
    /// the one key `get` and `set` use (`key:__rand_int__`); other tests name other keys.
    #[arg(long, default_value = "get,set")]
    pub tests: String,
    /// Storage servers of each Stratus cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Stratus configurations: `r0` (memory only), `rN-buffered` or `rN-fsync` (N replicas,
    /// acknowledged from the backups' memory or after their fsync).
    #[arg(long, default_value = "r0,r1-buffered")]
    pub configs: String,
    /// Rounds; each runs every target once.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
}

/// The key every request of `redis-benchmark` names when it is not given `-r`.
const BENCHMARK_KEY: &[u8] = b"key:__rand_int__";
/// The table of database 0 (the RESP front end's default prefix).
const DATABASE_TABLE: &str = "redis-db-0";
const START_PATIENCE: Duration = Duration::from_secs(60);
/// How long one redis-benchmark run may take, per 1 000 requests (a floor of a minute).
const RUN_PATIENCE_PER_THOUSAND: Duration = Duration::from_millis(500);

/// One place redis-benchmark sends its commands to.
struct Target {
    system: &'static str,
    config: String,
    placement: &'static str,
    address: String,
    /// The Redis configuration this target is compared with.
    reference: &'static str,
    /// Every process of the system behind the address (for its CPU time).
    processes: Vec<u32>,
}

/// One line of redis-benchmark's `--csv` output.
#[derive(Clone, Debug, PartialEq)]
struct CsvResult {
    test: String,
    requests_per_second: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// A Stratus configuration parsed from its name.
struct StratusConfig {
    name: String,
    replicas: u32,
    durability: &'static str,
}

fn parse_config(name: &str) -> Result<StratusConfig, String> {
    let invalid = || format!("unknown configuration {name:?} (r0, rN-buffered or rN-fsync)");
    if name == "r0" {
        return Ok(StratusConfig { name: name.to_string(), replicas: 0, durability: "buffered" });
    }
    let (replicas, durability) =
        name.strip_prefix('r').and_then(|rest| rest.split_once('-')).ok_or_else(invalid)?;
    let replicas: u32 = replicas.parse().map_err(|_| invalid())?;
    let durability = match durability {
        "buffered" => "buffered",
        "fsync" => "fsync",
        _ => return Err(invalid()),
    };
    if replicas == 0 {
        return Err(invalid());
    }
    Ok(StratusConfig { name: name.to_string(), replicas, durability })
}

/// Runs the benchmark.
pub fn run(arguments: RespArguments) -> Result<(), String> {
    let benchmark = find_peer("redis-benchmark", "redis-tools")?;
    let configs: Vec<StratusConfig> = arguments
        .configs
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(parse_config)
        .collect::<Result<_, _>>()?;
    for config in &configs {
        if config.replicas >= arguments.servers {
            return Err(format!(
                "{}: {} replicas need more than {} servers",
                config.name, config.replicas, arguments.servers
            ));
        }
    }
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let mut redis_deployments: Vec<RedisDeployment> = Vec::new();
    let mut processes: Vec<ChildProcess> = Vec::new();
    let mut targets = Vec::new();
    for (name, durability) in
        [("none", RedisDurability::None), ("everysec", RedisDurability::Everysec)]
    {
        let deployment = start_redis(
            &directory.path().join(format!("redis-{}", durability.name())),
            durability,
        )?;
        targets.push(Target {
            system: "redis",
            config: name.to_string(),
            placement: "-",
            address: deployment.address.clone(),
            reference: name,
            processes: deployment.process_ids(),
        });
        redis_deployments.push(deployment);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    for config in &configs {
        let reference = if config.replicas == 0 { "none" } else { "everysec" };
        let running =
            start_cluster(config, &arguments, &directory.path().join(&config.name), &runtime)?;
        let mut cluster_processes = process_tree(running.cluster.id())?;
        cluster_processes.push(running.gateway.id());
        processes.push(running.cluster);
        processes.push(running.gateway);
        for (placement, address) in running.placements {
            targets.push(Target {
                system: "stratus",
                config: config.name.clone(),
                placement,
                address,
                reference,
                processes: cluster_processes.clone(),
            });
        }
    }
    println!(
        "# redis-benchmark -t {} -n {} -c {} --csv, {} round(s); Stratus: {} servers",
        arguments.tests, arguments.requests, arguments.clients, arguments.rounds, arguments.servers
    );
    println!(
        "{:<7} {:<12} {:<10} {:<5} {:>5} {:>10} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9}",
        "system",
        "config",
        "placement",
        "test",
        "round",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "ratio",
        "cpu us/op",
        "drv us/op"
    );
    let tests: Vec<&str> =
        arguments.tests.split(',').map(str::trim).filter(|test| !test.is_empty()).collect();
    for round in 1..=arguments.rounds {
        let mut results: Vec<(usize, Vec<Measured>)> = Vec::new();
        for (index, target) in targets.iter().enumerate() {
            let mut rows = Vec::new();
            for test in &tests {
                let output = directory.path().join(format!("round-{round}-{index}-{test}.csv"));
                rows.push(run_benchmark(&benchmark, target, test, &arguments, &output)?);
            }
            results.push((index, rows));
        }
        for (index, rows) in &results {
            let target = &targets[*index];
            for row in rows {
                let reference = results
                    .iter()
                    .find(|(other, _)| {
                        targets[*other].system == "redis"
                            && targets[*other].config == target.reference
                    })
                    .and_then(|(_, rows)| rows.iter().find(|other| other.csv.test == row.csv.test))
                    .map(|other| row.csv.requests_per_second / other.csv.requests_per_second);
                report(target, round, row, reference, &arguments);
            }
        }
    }
    drop(processes);
    drop(redis_deployments);
    Ok(())
}

/// One test's result against one target: redis-benchmark's figures and the CPU it cost.
struct Measured {
    csv: CsvResult,
    cpu: CpuCost,
}

fn report(
    target: &Target,
    round: u32,
    measured: &Measured,
    ratio: Option<f64>,
    arguments: &RespArguments,
) {
    let row = &measured.csv;
    println!(
        "{:<7} {:<12} {:<10} {:<5} {:>5} {:>10.0} {:>8.3} {:>8.3} {:>8.3} {:>7} {:>9.1} {:>9.1}",
        target.system,
        target.config,
        target.placement,
        row.test,
        round,
        row.requests_per_second,
        row.p50_ms,
        row.p99_ms,
        row.max_ms,
        ratio.map_or("-".to_string(), |ratio| format!("{ratio:.2}")),
        measured.cpu.system_us_per_op(arguments.requests),
        measured.cpu.driver_us_per_op(arguments.requests),
    );
    let mut fields = vec![
        ("bench", Field::Text("resp".into())),
        ("system", Field::Text(target.system.into())),
        ("config", Field::Text(target.config.clone())),
        ("placement", Field::Text(target.placement.into())),
        ("test", Field::Text(row.test.clone())),
        ("round", Field::Number(f64::from(round))),
        ("clients", Field::Number(f64::from(arguments.clients))),
        ("requests", Field::Number(arguments.requests as f64)),
        ("ops_per_sec", Field::Number(row.requests_per_second)),
        ("p50_us", Field::Number(row.p50_ms * 1_000.0)),
        ("p95_us", Field::Number(row.p95_ms * 1_000.0)),
        ("p99_us", Field::Number(row.p99_ms * 1_000.0)),
        ("max_us", Field::Number(row.max_ms * 1_000.0)),
        ("reference", Field::Text(format!("redis {}", target.reference))),
        ("ratio_to_reference", Field::optional_number(ratio)),
    ];
    fields.extend(measured.cpu.fields(arguments.requests));
    print_json(&fields);
}

/// A Stratus cluster and its gateway, running, with the address of each placement.
struct RunningCluster {
    cluster: ChildProcess,
    gateway: ChildProcess,
    placements: Vec<(&'static str, String)>,
}

/// Starts a cluster in `config` with a RESP port on every server, and a gateway.
fn start_cluster(
    config: &StratusConfig,
    arguments: &RespArguments,
    directory: &Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<RunningCluster, String> {
    let servers = arguments.servers.to_string();
    let replicas = config.replicas.to_string();
    let UpCluster { process: cluster, coordinator, lines } = start_local_cluster(
        directory,
        arguments.servers,
        &["--replicas", &replicas, "--durability", config.durability, "--resp-port", "0"],
        None,
    )?;
    // "redis: server-i ADDRESS"
    let resp_addresses: Vec<String> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("redis: "))
        .filter_map(|rest| rest.split_whitespace().nth(1))
        .filter(|address| address.parse::<std::net::SocketAddr>().is_ok())
        .map(str::to_string)
        .collect();
    if resp_addresses.len() != arguments.servers as usize {
        return Err(format!(
            "stratus up printed {} RESP addresses: {lines:?}",
            resp_addresses.len()
        ));
    }
    let gateway_address = free_loopback_address()?;
    let (gateway, _) = start_stratus(
        &[
            "--coordinator",
            &coordinator,
            "resp",
            "--listen",
            &gateway_address,
            "--table-span",
            &servers,
        ],
        "listening on",
        START_PATIENCE,
    )?;
    // The first command creates database 0's table; then find the key's master.
    RespConnection::open(&resp_addresses[0])?
        .call(&[b"SET", BENCHMARK_KEY, b"x"])
        .map_err(|error| format!("SET through {}: {error}", resp_addresses[0]))?;
    let owner = runtime.block_on(async {
        let client = Client::new(ClientConfig::new(coordinator.clone()));
        let table =
            client.get_table_id(DATABASE_TABLE).await.map_err(|error| format!("{error:?}"))?;
        let map = client.tablet_map(table).await.map_err(|error| format!("{error:?}"))?;
        let hash = stratus_types::key_hash(table, BENCHMARK_KEY);
        map.iter()
            .find(|tablet| tablet.range.contains(hash))
            .map(|tablet| tablet.owner_address.clone())
            .ok_or_else(|| "no tablet holds the benchmark key".to_string())
    })?;
    let mut owner_port = None;
    let mut other_port = None;
    for address in &resp_addresses {
        let info = match RespConnection::open(address)?.call(&[b"INFO", b"stratus"])? {
            Value::BulkString(text) => String::from_utf8_lossy(&text).into_owned(),
            other => return Err(format!("{address}: INFO answered {other:?}")),
        };
        let local = info
            .lines()
            .find_map(|line| line.strip_prefix("stratus_local_master:"))
            .map(str::trim)
            .ok_or_else(|| format!("{address}: INFO names no local master: {info}"))?;
        if local == owner {
            owner_port.get_or_insert_with(|| address.clone());
        } else {
            other_port.get_or_insert_with(|| address.clone());
        }
    }
    let owner_port =
        owner_port.ok_or_else(|| format!("no RESP port is in the process of {owner}"))?;
    let mut placements = vec![("owner", owner_port)];
    if let Some(other_port) = other_port {
        placements.push(("forwarded", other_port));
    }
    placements.push(("gateway", gateway_address));
    Ok(RunningCluster { cluster, gateway, placements })
}

/// Runs redis-benchmark's `test` against `target` (bounded in time), parses its CSV, and
/// measures the CPU of the target's system and of redis-benchmark over the run.
fn run_benchmark(
    benchmark: &Path,
    target: &Target,
    test: &str,
    arguments: &RespArguments,
    output: &Path,
) -> Result<Measured, String> {
    let (host, port) = target.address.rsplit_once(':').ok_or("address without a port")?;
    let file = std::fs::File::create(output).map_err(|error| error.to_string())?;
    let mut command = Command::new(benchmark);
    command
        .args(["-h", host, "-p", port, "-t", test, "--csv"])
        .args(["-n", &arguments.requests.to_string(), "-c", &arguments.clients.to_string()])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null());
    let cpu = PhaseCpu::start(target.processes.clone())?;
    let mut process = ChildProcess::spawn(&mut command, "redis-benchmark")?;
    let thousands = (arguments.requests / 1_000).max(1);
    let patience = (RUN_PATIENCE_PER_THOUSAND * u32::try_from(thousands).unwrap_or(u32::MAX))
        .max(Duration::from_secs(60));
    let status = process.wait_for_exit(patience)?;
    let cpu = cpu.finish()?;
    let text = std::fs::read_to_string(output).map_err(|error| error.to_string())?;
    match parse_csv(&text).into_iter().next() {
        Some(csv) if status.success() => Ok(Measured { csv, cpu }),
        _ => Err(format!(
            "redis-benchmark -t {test} against {} {} {} ({}) failed: {status}; output: {text}",
            target.system, target.config, target.placement, target.address
        )),
    }
}

/// The rows of redis-benchmark's `--csv` output (Redis 7: test, rps, avg, min, p50, p95, p99,
/// max; latencies in milliseconds); the header and anything unparsable are skipped.
fn parse_csv(text: &str) -> Vec<CsvResult> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> =
                line.split(',').map(|field| field.trim().trim_matches('"')).collect();
            if fields.len() < 8 {
                return None;
            }
            let number = |index: usize| fields[index].parse::<f64>().ok();
            Some(CsvResult {
                test: fields[0].to_string(),
                requests_per_second: number(1)?,
                p50_ms: number(4)?,
                p95_ms: number(5)?,
                p99_ms: number(6)?,
                max_ms: number(7)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmark_csv_is_parsed() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"130718.95\",\"0.204\",\"0.064\",\"0.199\",\"0.279\",\"0.415\",\"1.015\"\n\
                    \"GET\",\"132450.34\",\"0.216\",\"0.056\",\"0.207\",\"0.311\",\"0.399\",\"0.839\"\n";
        let rows = parse_csv(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0],
            CsvResult {
                test: "SET".into(),
                requests_per_second: 130718.95,
                p50_ms: 0.199,
                p95_ms: 0.279,
                p99_ms: 0.415,
                max_ms: 1.015,
            }
        );
        assert_eq!(rows[1].test, "GET");
    }

    #[test]
    fn configurations_are_parsed_and_checked() {
        assert_eq!(parse_config("r0").unwrap().replicas, 0);
        let config = parse_config("r3-fsync").unwrap();
        assert_eq!((config.replicas, config.durability), (3, "fsync"));
        assert!(parse_config("r0-fsync").is_err());
        assert!(parse_config("r2-sometimes").is_err());
        assert!(parse_config("three").is_err());
    }
}
