//! `stratus bench latency`: write and read latency of small objects, one request at a time,
//! on Stratus with 0, 1 and 3 replicas (buffered and fsync) and on Redis at equal durability,
//! with what each operation cost in CPU across every process of the system.
//!
//! The read of the same run is Stratus's own reference: RAMCloud's goal is a replicated write
//! within a small multiple of a read (13.5 µs / 4.7 µs over Infiniband). The peers are Redis
//! configurations that keep a write as Stratus does (docs/benchmarks.md): `wait-R`, a primary
//! with R replicas where every SET is followed by `WAIT R 0` in the same round trip, beside a
//! `buffered` write on R backups; `everysec`, `always` and `none` on one server.
//!
//! Both systems are driven by the same loop on one thread, over a blocking connection each:
//! Stratus's `BlockingClient` (which sends straight to the master over a blocking socket) and a
//! RESP connection. Each configuration runs `--operations` writes, then as many reads, over a
//! small key set, after a warm-up; at the default 100 000 the p99.9 rests on 100 samples.
//!
//! Stratus's writes are measured with exactly-once on (every write carries its client's
//! identity and appends a completion record, docs/design/exactly-once.md) and off, from two
//! clients whose measured writes alternate in blocks on the same cluster, so the two rows see
//! the same cleaner and the same machine; a ratio row gives what exactly-once adds.
//!
//! Stratus's writes overwrite a small key set, so its log holds little live data and the
//! cleaner runs all the time once the log is full: the measured writes are the cleaner's
//! steady state. To get there in seconds the log is small (`--log-mib`, default 48, six
//! segments) and the warm-up fills it with pipelined overwrites until the master's statistics
//! show a cleaning pass; the rows report the passes during the measured writes.

use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use stratus_client::{BlockingClient, Client, ClientConfig, RejectRules, TableId, WriteItem};

use crate::cluster::{start_local_cluster, UpCluster};
use crate::cpu::{process_tree, CpuCost, PhaseCpu};
use crate::peers::{start_redis_with, RedisDurability};
use crate::report::{latency_histogram, print_json, Field, Percentiles};
use crate::resp_client::RespConnection;
use crate::tls::BenchTls;

/// `stratus bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArguments {
    /// Replica counts to measure on Stratus, comma-separated.
    #[arg(long, default_value = "0,1,3", value_delimiter = ',')]
    pub replicas: Vec<u32>,
    /// Stratus durability modes to measure, comma-separated (buffered, fsync).
    #[arg(long, default_value = "buffered,fsync", value_delimiter = ',')]
    pub durability: Vec<String>,
    /// Redis configurations to measure beside it, comma-separated: none, everysec, always,
    /// wait-R (a primary with R replicas, every write followed by WAIT R 0). Empty: none.
    #[arg(long, default_value = "none,everysec,always,wait-1,wait-3", value_delimiter = ',')]
    pub redis: Vec<String>,
    /// Storage servers in the Stratus cluster (at least replicas + 1).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Measured operations of each kind per configuration.
    #[arg(long, default_value_t = 100_000)]
    pub operations: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Keys written and read (each write overwrites one of them).
    #[arg(long, default_value_t = 1_000)]
    pub keys: u64,
    /// Log memory of each Stratus server in MiB (six 8 MiB segments at least); small, so the
    /// cleaner runs within seconds of overwrites.
    #[arg(long, default_value_t = 48)]
    pub log_mib: u64,
    /// Stratus writes with exactly-once on, off, or both (comma-separated): with both, the
    /// two clients' writes alternate in blocks and a ratio row compares them.
    #[arg(long, default_value = "on,off", value_delimiter = ',')]
    pub exactly_once: Vec<String>,
    /// TLS: `off`, `on`, or `off,on` for both in one run. On: every Stratus process with
    /// --tls-cert-file (its client trusting the CA), Redis with --tls-port only (and TLS to its
    /// replicas); one local CA and ECDSA P-256 certificate for both. Rows with TLS have
    /// `+tls` after their configuration's name, and a summary gives on/off ratios.
    #[arg(long, default_value = "off", value_delimiter = ',')]
    pub tls: Vec<String>,
}

/// Blocks each exactly-once mode's measured writes are cut into, alternating with the other
/// mode's: a drift of the machine over the run (the cleaner, another process) falls on both.
const EXACTLY_ONCE_ROUNDS: u64 = 10;

/// Operations of each kind before the measured ones (connections, caches and tablet maps warm).
const WARMUP_OPERATIONS: u64 = 300;
/// Objects per MULTI_WRITE while the warm-up fills the log.
const FILL_BATCH_OBJECTS: u64 = 250;
/// MULTI_WRITEs in flight while the warm-up fills the log.
const FILL_REQUESTS_IN_FLIGHT: usize = 8;
/// Log bytes an overwrite of a small object takes besides its value (key, object and entry
/// headers, the tombstone of the old version), for sizing the fill.
const OVERWRITE_OVERHEAD_BYTES: u64 = 80;
/// The fill gives up once it wrote this many logs' worth without a cleaning pass.
const FILL_LOGS_MAX: u64 = 4;

/// Runs the benchmark.
pub fn run(arguments: LatencyArguments) -> Result<(), String> {
    let redis_configs: Vec<RedisDurability> = arguments
        .redis
        .iter()
        .map(|name| name.trim())
        .filter(|name| !name.is_empty())
        .map(|name| {
            RedisDurability::parse(name).ok_or_else(|| {
                format!("unknown Redis configuration {name:?} (none, everysec, always, wait-R)")
            })
        })
        .collect::<Result<_, _>>()?;
    let mut stratus_configs = Vec::new();
    for durability in &arguments.durability {
        if durability != "buffered" && durability != "fsync" {
            return Err(format!("unknown durability mode {durability:?} (buffered or fsync)"));
        }
        for &replicas in &arguments.replicas {
            // Nothing is written to disk without replicas: an fsync row would repeat buffered.
            if replicas == 0 && durability == "fsync" {
                continue;
            }
            if replicas >= arguments.servers {
                return Err(format!("{replicas} replicas need at least {} servers", replicas + 1));
            }
            stratus_configs.push((replicas, durability.clone()));
        }
    }
    let mut exactly_once_modes = Vec::new();
    for mode in &arguments.exactly_once {
        match mode.trim() {
            "on" => exactly_once_modes.push(true),
            "off" => exactly_once_modes.push(false),
            other => return Err(format!("--exactly-once takes on and off, not {other:?}")),
        }
    }
    if exactly_once_modes.is_empty() {
        exactly_once_modes.push(true);
    }
    let mut tls_modes = Vec::new();
    for mode in &arguments.tls {
        match mode.trim() {
            "off" => tls_modes.push(false),
            "on" => tls_modes.push(true),
            other => return Err(format!("--tls takes off and on, not {other:?}")),
        }
    }
    if tls_modes.is_empty() {
        tls_modes.push(false);
    }
    let bench_tls = match tls_modes.contains(&true) {
        true => Some(BenchTls::create()?),
        false => None,
    };
    print_header();
    let mut rows = Vec::new();
    for (replicas, durability) in &stratus_configs {
        for &with_tls in &tls_modes {
            let tls = if with_tls { bench_tls.as_ref() } else { None };
            rows.extend(measure_stratus(
                &arguments,
                *replicas,
                durability,
                &exactly_once_modes,
                tls,
            )?);
        }
    }
    for durability in redis_configs {
        for &with_tls in &tls_modes {
            let tls = if with_tls { bench_tls.as_ref() } else { None };
            rows.extend(measure_redis(&arguments, durability, tls)?);
        }
    }
    print_goal_ratios(&rows);
    print_tls_ratios(&rows);
    Ok(())
}

/// One system under the driver: a write and a read of one key, one at a time.
trait KeyValue {
    fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), String>;
    fn read(&mut self, key: &[u8]) -> Result<(), String>;
}

struct StratusKeyValue {
    client: BlockingClient,
    table: TableId,
}

impl KeyValue for StratusKeyValue {
    fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.client
            .write(self.table, key, value, RejectRules::NONE)
            .map(|_| ())
            .map_err(|error| format!("write: {error}"))
    }

    fn read(&mut self, key: &[u8]) -> Result<(), String> {
        self.client
            .read(self.table, key, RejectRules::NONE)
            .map(|_| ())
            .map_err(|error| format!("read: {error}"))
    }
}

/// `SET` (with `WAIT R 0` in the same round trip for `wait-R`) and `GET`.
struct RedisKeyValue {
    connection: RespConnection,
    wait_replicas: Option<u32>,
}

impl KeyValue for RedisKeyValue {
    fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let command: [&[u8]; 3] = [b"SET", key, value];
        match self.wait_replicas {
            Some(replicas) => self.connection.call_then_wait(&command, replicas)?,
            None => self.connection.call(&command)?,
        };
        Ok(())
    }

    fn read(&mut self, key: &[u8]) -> Result<(), String> {
        self.connection.call(&[b"GET", key])?;
        Ok(())
    }
}

/// What identifies a configuration's rows.
#[derive(Clone, Debug)]
struct Configuration {
    system: &'static str,
    /// `rN-buffered`, `rN-fsync`, or the Redis configuration's name.
    config: String,
    replicas: u32,
    durability: String,
}

/// One measured phase: all writes or all reads of a configuration.
#[derive(Clone, Debug)]
struct Row {
    configuration: Configuration,
    operation: &'static str,
    operations: u64,
    value_bytes: usize,
    percentiles: Percentiles,
    ops_per_sec: f64,
    cpu: CpuCost,
    /// Stratus writes: cleaning passes (segments cleaned and compactions) on the master during
    /// the measured writes.
    cleaner_passes: Option<u64>,
    /// Stratus writes: whether the client was exactly-once.
    exactly_once: Option<bool>,
}

/// The name of a configuration's rows: `name`, or `name+tls`.
fn config_name(name: String, tls: Option<&BenchTls>) -> String {
    match tls {
        Some(_) => format!("{name}{TLS_SUFFIX}"),
        None => name,
    }
}

/// What a configuration's name ends with when it runs over TLS.
const TLS_SUFFIX: &str = "+tls";

fn measure_stratus(
    arguments: &LatencyArguments,
    replicas: u32,
    durability: &str,
    exactly_once_modes: &[bool],
    tls: Option<&BenchTls>,
) -> Result<Vec<Row>, String> {
    let configuration = Configuration {
        system: "stratus",
        config: config_name(format!("r{replicas}-{durability}"), tls),
        replicas,
        durability: durability.to_string(),
    };
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let (replicas_text, log_mib) = (replicas.to_string(), arguments.log_mib.to_string());
    let mut flags =
        ["--log-mib", &log_mib, "--replicas", &replicas_text, "--durability", durability]
            .map(str::to_string)
            .to_vec();
    flags.extend(tls.map(BenchTls::stratus_flags).unwrap_or_default());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = start_local_cluster(directory.path(), arguments.servers, &flags, None)?;
    let client_tls = tls.map(|tls| tls.client().clone());
    let config_of = |cluster: &UpCluster| {
        let mut config = ClientConfig::new(cluster.coordinator.clone());
        config.tls = client_tls.clone();
        config
    };
    let processes = process_tree(cluster.process.id())?;
    let admin = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let admin_client = {
        let _entered = admin.enter();
        Client::new(config_of(&cluster))
    };
    let (table, master) = admin.block_on(create_table(&admin_client))?;
    let value = vec![0x5a_u8; arguments.value_bytes];
    let passes_before =
        admin.block_on(fill_until_cleaning(&admin_client, table, &master, arguments))?;
    let mut stores = Vec::new();
    for &exactly_once in exactly_once_modes {
        let mut config = config_of(&cluster);
        config.exactly_once = exactly_once;
        let client = BlockingClient::new(config).map_err(|error| format!("client: {error}"))?;
        stores.push((exactly_once, StratusKeyValue { client, table }));
    }
    let mut writes =
        measure_writes_alternating(&mut stores, &configuration, &value, arguments, &processes)?;
    let passes_after = admin.block_on(cleaner_passes(&admin_client, &master))?;
    for write in &mut writes {
        write.cleaner_passes = Some(passes_after - passes_before);
        report(write);
    }
    let (_, store) = &mut stores[0];
    let read = measure_phase(store, &configuration, "read", &value, arguments, &processes)?;
    report(&read);
    writes.push(read);
    Ok(writes)
}

/// The measured writes of each exactly-once mode's client, in [`EXACTLY_ONCE_ROUNDS`] blocks
/// that alternate between them, each mode first in every other round (after each client's
/// warm-up): one row per mode.
fn measure_writes_alternating(
    stores: &mut [(bool, StratusKeyValue)],
    configuration: &Configuration,
    value: &[u8],
    arguments: &LatencyArguments,
    processes: &[u32],
) -> Result<Vec<Row>, String> {
    let keys = arguments.keys.max(1);
    for (_, store) in stores.iter_mut() {
        for index in 0..WARMUP_OPERATIONS {
            store.write(&key_of(index % keys), value)?;
        }
    }
    let rounds = EXACTLY_ONCE_ROUNDS.min(arguments.operations.max(1));
    let block = arguments.operations.div_ceil(rounds);
    let mut histograms: Vec<_> = stores.iter().map(|_| latency_histogram()).collect();
    let mut elapsed = vec![std::time::Duration::ZERO; stores.len()];
    let mut cpu: Vec<Option<CpuCost>> = vec![None; stores.len()];
    let mut done = vec![0u64; stores.len()];
    for round in 0..rounds {
        // Each mode goes first in every other round: neither always follows the other.
        let mut order: Vec<usize> = (0..stores.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for slot in order {
            let (_, store) = &mut stores[slot];
            let count = block.min(arguments.operations - done[slot]);
            let phase = PhaseCpu::start(processes.to_vec())?;
            let started = Instant::now();
            for offset in 0..count {
                let index = WARMUP_OPERATIONS + round * block + offset;
                let begin = Instant::now();
                store.write(&key_of(index % keys), value)?;
                histograms[slot].saturating_record((begin.elapsed().as_nanos() as u64).max(1));
            }
            elapsed[slot] += started.elapsed();
            let cost = phase.finish()?;
            cpu[slot] = Some(match cpu[slot] {
                None => cost,
                Some(total) => CpuCost {
                    system: total.system + cost.system,
                    driver: total.driver + cost.driver,
                    system_processes: cost.system_processes,
                },
            });
            done[slot] += count;
        }
    }
    let mut rows = Vec::new();
    for (slot, (exactly_once, _)) in stores.iter().enumerate() {
        rows.push(Row {
            configuration: configuration.clone(),
            operation: "write",
            operations: done[slot],
            value_bytes: value.len(),
            percentiles: Percentiles::of(&histograms[slot]),
            ops_per_sec: done[slot] as f64 / elapsed[slot].as_secs_f64().max(1e-9),
            cpu: cpu[slot].expect("at least one round ran"),
            cleaner_passes: None,
            exactly_once: Some(*exactly_once),
        });
    }
    Ok(rows)
}

fn measure_redis(
    arguments: &LatencyArguments,
    durability: RedisDurability,
    tls: Option<&BenchTls>,
) -> Result<Vec<Row>, String> {
    let configuration = Configuration {
        system: "redis",
        config: config_name(durability.name(), tls),
        replicas: durability.wait_replicas().unwrap_or(0),
        durability: durability.name(),
    };
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let deployment = start_redis_with(directory.path(), durability, tls)?;
    let mut store = RedisKeyValue {
        connection: deployment.connect()?,
        wait_replicas: durability.wait_replicas(),
    };
    let value = vec![0x5a_u8; arguments.value_bytes];
    let processes = deployment.process_ids();
    let mut rows = Vec::new();
    for operation in ["write", "read"] {
        let row =
            measure_phase(&mut store, &configuration, operation, &value, arguments, &processes)?;
        report(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// Creates the table (one tablet) and returns it with its master's address.
async fn create_table(client: &Client) -> Result<(TableId, String), String> {
    let table = client
        .create_table("bench-latency", 1)
        .await
        .map_err(|error| format!("creating the table: {error}"))?;
    let tablets = client.tablet_map(table).await.map_err(|error| format!("tablet map: {error}"))?;
    let master = tablets.first().ok_or("the table has no tablet")?.owner_address.clone();
    Ok((table, master))
}

/// Cleaning passes the master made so far: segments cleaned and compactions.
async fn cleaner_passes(client: &Client, master: &str) -> Result<u64, String> {
    let statistics = client
        .server_statistics(master)
        .await
        .map_err(|error| format!("master statistics: {error}"))?;
    Ok(statistics.segments_cleaned + statistics.compactions)
}

/// Overwrites the key set with pipelined MULTI_WRITEs until the master has cleaned at least
/// once (bounded: at most [`FILL_LOGS_MAX`] logs' worth); returns its cleaning passes then.
async fn fill_until_cleaning(
    client: &Client,
    table: TableId,
    master: &str,
    arguments: &LatencyArguments,
) -> Result<u64, String> {
    let passes_at_start = cleaner_passes(client, master).await?;
    let overwrite_bytes = arguments.value_bytes as u64 + OVERWRITE_OVERHEAD_BYTES;
    let objects_max = FILL_LOGS_MAX * (arguments.log_mib << 20) / overwrite_bytes;
    let value = Bytes::from(vec![0xa5_u8; arguments.value_bytes]);
    let batch = FILL_BATCH_OBJECTS.min(arguments.keys.max(1));
    let mut written = 0u64;
    while written < objects_max {
        let mut requests = tokio::task::JoinSet::new();
        for _ in 0..FILL_REQUESTS_IN_FLIGHT {
            let items: Vec<WriteItem> = (written..written + batch)
                .map(|index| WriteItem {
                    table_id: table,
                    key: Bytes::from(key_of(index % arguments.keys.max(1))),
                    value: value.clone(),
                    rules: RejectRules::NONE,
                    expiry: stratus_types::Expiry::Never,
                    rpc: None,
                })
                .collect();
            written += batch;
            let client = client.clone();
            requests.spawn(async move { client.multi_write(&items).await });
        }
        while let Some(outcomes) = requests.join_next().await {
            for outcome in outcomes.map_err(|error| error.to_string())? {
                outcome.map_err(|error| format!("filling the log: {error}"))?;
            }
        }
        let passes = cleaner_passes(client, master).await?;
        if passes > passes_at_start {
            return Ok(passes);
        }
    }
    Err(format!(
        "the cleaner did not run after {written} overwrites ({FILL_LOGS_MAX} logs of {} MiB): \
         the measured writes would not be its steady state",
        arguments.log_mib
    ))
}

fn key_of(index: u64) -> Vec<u8> {
    format!("key-{index}").into_bytes()
}

/// Runs [`WARMUP_OPERATIONS`] then `--operations` of `operation` (one at a time, keys in
/// turn), timing each, with the CPU of `processes` and of this process over the measured ones.
fn measure_phase(
    store: &mut dyn KeyValue,
    configuration: &Configuration,
    operation: &'static str,
    value: &[u8],
    arguments: &LatencyArguments,
    processes: &[u32],
) -> Result<Row, String> {
    let keys = arguments.keys.max(1);
    let mut once = |index: u64| {
        let key = key_of(index % keys);
        if operation == "write" {
            store.write(&key, value)
        } else {
            store.read(&key)
        }
    };
    for index in 0..WARMUP_OPERATIONS {
        once(index)?;
    }
    let mut histogram = latency_histogram();
    let cpu = PhaseCpu::start(processes.to_vec())?;
    let started = Instant::now();
    for index in WARMUP_OPERATIONS..WARMUP_OPERATIONS + arguments.operations {
        let begin = Instant::now();
        once(index)?;
        histogram.saturating_record((begin.elapsed().as_nanos() as u64).max(1));
    }
    let elapsed = started.elapsed();
    Ok(Row {
        configuration: configuration.clone(),
        operation,
        operations: arguments.operations,
        value_bytes: value.len(),
        percentiles: Percentiles::of(&histogram),
        ops_per_sec: arguments.operations as f64 / elapsed.as_secs_f64().max(1e-9),
        cpu: cpu.finish()?,
        cleaner_passes: None,
        exactly_once: None,
    })
}

fn print_header() {
    println!(
        "{:<8} {:<12} {:<6} {:<4} {:>9} {:>9} {:>9} {:>11} {:>10} {:>10} {:>8}",
        "system",
        "config",
        "op",
        "eo",
        "p50_us",
        "p99_us",
        "p999_us",
        "ops_per_sec",
        "cpu_us/op",
        "drv_us/op",
        "cleaner"
    );
}

fn report(row: &Row) {
    let Row { configuration, operation, operations, percentiles, ops_per_sec, cpu, .. } = row;
    let cleaner = row.cleaner_passes.map_or("-".to_string(), |passes| passes.to_string());
    let exactly_once = match row.exactly_once {
        Some(true) => "on",
        Some(false) => "off",
        None => "-",
    };
    println!(
        "{:<8} {:<12} {operation:<6} {exactly_once:<4} {:>9.1} {:>9.1} {:>9.1} \
         {ops_per_sec:>11.0} {:>10.1} {:>10.1} {cleaner:>8}",
        configuration.system,
        configuration.config,
        percentiles.p50_us,
        percentiles.p99_us,
        percentiles.p999_us,
        cpu.system_us_per_op(*operations),
        cpu.driver_us_per_op(*operations),
    );
    let mut fields = vec![
        ("bench", Field::Text("latency".into())),
        ("system", Field::Text(configuration.system.into())),
        ("config", Field::Text(configuration.config.clone())),
        ("op", Field::Text((*operation).into())),
        ("replicas", Field::Number(f64::from(configuration.replicas))),
        ("durability", Field::Text(configuration.durability.clone())),
        ("value_bytes", Field::Number(row.value_bytes as f64)),
        ("operations", Field::Number(*operations as f64)),
        ("p50_us", Field::Number(percentiles.p50_us)),
        ("p99_us", Field::Number(percentiles.p99_us)),
        ("p999_us", Field::Number(percentiles.p999_us)),
        ("ops_per_sec", Field::Number(*ops_per_sec)),
        ("cleaner_passes", Field::optional_number(row.cleaner_passes.map(|passes| passes as f64))),
    ];
    if let Some(exactly_once) = row.exactly_once {
        fields.push(("exactly_once", Field::Text(if exactly_once { "on" } else { "off" }.into())));
    }
    fields.extend(cpu.fields(*operations));
    print_json(&fields);
}

/// The goals for each replica count measured on both sides, as ratios of this run:
/// a buffered write's p50 over Redis `wait-R`'s and over its own read's, and its CPU per write
/// (all Stratus processes) over Redis `wait-R`'s (all Redis processes).
fn print_goal_ratios(rows: &[Row]) {
    print_exactly_once_ratios(rows);
    // A write row with exactly-once on (what clients run) if there is one.
    let find = |config: &str, operation: &str| {
        let matching =
            |row: &&Row| row.configuration.config == config && row.operation == operation;
        rows.iter()
            .filter(matching)
            .find(|row| row.exactly_once != Some(false))
            .or_else(|| rows.iter().find(matching))
    };
    for row in rows.iter().filter(|row| row.configuration.system == "stratus") {
        let replicas = row.configuration.replicas;
        if row.operation != "write" || row.configuration.durability != "buffered" || replicas == 0 {
            continue;
        }
        if find(&row.configuration.config, "write").is_some_and(|chosen| !std::ptr::eq(chosen, row))
        {
            continue;
        }
        let (Some(read), Some(redis)) =
            (find(&row.configuration.config, "read"), find(&format!("wait-{replicas}"), "write"))
        else {
            continue;
        };
        let p50_over_redis = row.percentiles.p50_us / redis.percentiles.p50_us;
        let p50_over_read = row.percentiles.p50_us / read.percentiles.p50_us;
        let cpu_over_redis =
            row.cpu.system_us_per_op(row.operations) / redis.cpu.system_us_per_op(redis.operations);
        println!(
            "r{replicas}-buffered write vs redis wait-{replicas}: p50 ratio {p50_over_redis:.2} \
             (goal <= 0.8), write/read p50 {p50_over_read:.2} (goal <= 2.0), CPU per write \
             ratio {cpu_over_redis:.2} (goal <= 0.7)"
        );
        print_json(&[
            ("bench", Field::Text("latency".into())),
            ("system", Field::Text("ratio".into())),
            ("replicas", Field::Number(f64::from(replicas))),
            ("write_p50_over_redis_wait", Field::Number(p50_over_redis)),
            ("write_p50_over_read_p50", Field::Number(p50_over_read)),
            ("write_cpu_over_redis_wait", Field::Number(cpu_over_redis)),
        ]);
    }
}

/// For each Stratus configuration measured both ways: what exactly-once adds to a write's p50
/// and p99 and takes from its throughput, in this run (the goal: at most 5 % each).
fn print_exactly_once_ratios(rows: &[Row]) {
    let stratus_writes =
        rows.iter().filter(|row| row.configuration.system == "stratus" && row.operation == "write");
    for on in stratus_writes.clone().filter(|row| row.exactly_once == Some(true)) {
        let Some(off) = stratus_writes.clone().find(|row| {
            row.exactly_once == Some(false) && row.configuration.config == on.configuration.config
        }) else {
            continue;
        };
        let p50_added = on.percentiles.p50_us / off.percentiles.p50_us - 1.0;
        let p99_added = on.percentiles.p99_us / off.percentiles.p99_us - 1.0;
        let throughput_lost = 1.0 - on.ops_per_sec / off.ops_per_sec;
        let cpu_added = on.cpu.system_us_per_op(on.operations)
            / off.cpu.system_us_per_op(off.operations).max(1e-9)
            - 1.0;
        println!(
            "{} write, exactly-once on vs off: p50 {:+.1} %, p99 {:+.1} %, throughput {:+.1} %, \
             CPU per write {:+.1} % (goals: p50 and throughput within 5 %)",
            on.configuration.config,
            p50_added * 100.0,
            p99_added * 100.0,
            -throughput_lost * 100.0,
            cpu_added * 100.0,
        );
        print_json(&[
            ("bench", Field::Text("latency".into())),
            ("system", Field::Text("exactly-once-ratio".into())),
            ("config", Field::Text(on.configuration.config.clone())),
            ("write_p50_added_fraction", Field::Number(p50_added)),
            ("write_p99_added_fraction", Field::Number(p99_added)),
            ("write_throughput_lost_fraction", Field::Number(throughput_lost)),
            ("write_cpu_added_fraction", Field::Number(cpu_added)),
        ]);
    }
}

/// For each configuration measured with TLS and without, in this run: what TLS does to its
/// read and write p50 and throughput (the goal: Stratus's cost no larger than Redis's,
/// and at most 10 % of throughput).
fn print_tls_ratios(rows: &[Row]) {
    let chosen = |row: &&Row| row.exactly_once != Some(false);
    for with_tls in rows.iter().filter(chosen) {
        let Some(base) = with_tls.configuration.config.strip_suffix(TLS_SUFFIX) else { continue };
        let Some(without) = rows.iter().filter(chosen).find(|row| {
            row.configuration.system == with_tls.configuration.system
                && row.configuration.config == base
                && row.operation == with_tls.operation
        }) else {
            continue;
        };
        let p50_ratio = with_tls.percentiles.p50_us / without.percentiles.p50_us;
        let throughput_ratio = with_tls.ops_per_sec / without.ops_per_sec;
        // CPU is counted in clock ticks (10 ms): a short phase may count none, and then there is
        // no ratio to give.
        let (cpu_with, cpu_without) = (
            with_tls.cpu.system_us_per_op(with_tls.operations),
            without.cpu.system_us_per_op(without.operations),
        );
        let cpu_ratio = (cpu_with > 0.0 && cpu_without > 0.0).then(|| cpu_with / cpu_without);
        let cpu_text = cpu_ratio.map_or("-".to_string(), |ratio| format!("{ratio:.3}"));
        println!(
            "{} {base} {}: TLS on/off p50 {p50_ratio:.3}, throughput {throughput_ratio:.3}, \
             CPU per op {cpu_text} (goal: throughput >= 0.9, and Stratus's ratios no worse \
             than Redis's)",
            with_tls.configuration.system, with_tls.operation,
        );
        print_json(&[
            ("bench", Field::Text("latency".into())),
            ("system", Field::Text("tls-ratio".into())),
            ("of", Field::Text(with_tls.configuration.system.into())),
            ("config", Field::Text(base.into())),
            ("op", Field::Text(with_tls.operation.into())),
            ("p50_on_over_off", Field::Number(p50_ratio)),
            ("throughput_on_over_off", Field::Number(throughput_ratio)),
            ("cpu_on_over_off", Field::optional_number(cpu_ratio)),
        ]);
    }
}
