//! The transactional YCSB part of `stratus bench tx`: T2's read-modify-write transactions over
//! zipfian keys, on Stratus and on Redis (WATCH/MULTI/EXEC with replicas and WAIT).

use std::time::{Duration, Instant};

use bytes::Bytes;
use stratus_client::{
    AbortReason, BlockingClient, Client, ClientConfig, RejectRules, TableId, TxOutcome, WriteItem,
};
use stratus_resp::Value;

use super::{report, Row, TxArguments};
use crate::cluster::start_local_cluster;
use crate::cpu::{process_tree, PhaseCpu};
use crate::peers::{start_redis, RedisDurability};
use crate::report::{latency_histogram, print_json, Field, Percentiles};
use crate::resp_client::RespConnection;
use crate::ycsb::generators::{Random, ScrambledZipfian};

/// Records per MULTI_WRITE (and per MSET) while loading.
const LOAD_BATCH_RECORDS: u64 = 500;
/// Draws a transaction makes to find its distinct keys before it settles for fewer.
const KEY_DRAWS_MAX: usize = 64;
/// Seed of the first thread's generator (thread i adds i): runs draw the same keys.
const SEED: u64 = 0x7478_5943_5342;

/// One system's transactions, one at a time on one connection.
trait TxStore: Send {
    /// Reads every key of `keys` and writes `value` to those whose `updates` flag is set, as
    /// one transaction; true if it committed, false if it aborted on a conflict.
    fn transaction(
        &mut self,
        keys: &[Vec<u8>],
        updates: &[bool],
        value: &[u8],
    ) -> Result<bool, String>;
}

struct StratusStore {
    client: BlockingClient,
    table: TableId,
}

impl TxStore for StratusStore {
    fn transaction(
        &mut self,
        keys: &[Vec<u8>],
        updates: &[bool],
        value: &[u8],
    ) -> Result<bool, String> {
        let transaction = self.client.transaction();
        // Every key in one round trip (one multi-read per master), as Redis's GETs go out in
        // one pipelined write.
        let objects: Vec<(TableId, &[u8])> =
            keys.iter().map(|key| (self.table, key.as_slice())).collect();
        transaction.read_many(&objects).map_err(|error| format!("read: {error}"))?;
        for (key, &update) in keys.iter().zip(updates) {
            if update {
                transaction
                    .write(self.table, key, value)
                    .map_err(|error| format!("write: {error}"))?;
            }
        }
        match transaction.commit().map_err(|error| format!("commit: {error}"))? {
            TxOutcome::Committed => Ok(true),
            TxOutcome::Aborted(AbortReason::Conflict { .. }) => Ok(false),
            TxOutcome::Aborted(AbortReason::Timeout) => {
                Err("a transaction timed out (the machine is overloaded)".to_string())
            }
        }
    }
}

/// WATCH and GET the keys (one round trip), then MULTI, the SETs, EXEC and, when anything was
/// written, `WAIT R 0` (one round trip): EXEC answers null when a watched key changed.
struct RedisStore {
    connection: RespConnection,
    wait_replicas: Option<u32>,
}

impl TxStore for RedisStore {
    fn transaction(
        &mut self,
        keys: &[Vec<u8>],
        updates: &[bool],
        value: &[u8],
    ) -> Result<bool, String> {
        let mut watch: Vec<&[u8]> = vec![b"WATCH"];
        watch.extend(keys.iter().map(Vec::as_slice));
        let mut reads = vec![watch];
        reads.extend(keys.iter().map(|key| vec![b"GET".as_slice(), key]));
        for reply in self.connection.call_pipelined(&reads)? {
            if let Value::Error(message) = reply {
                return Err(format!("redis: {message}"));
            }
        }
        let replicas_text = self.wait_replicas.map(|replicas| replicas.to_string());
        let mut commit: Vec<Vec<&[u8]>> = vec![vec![b"MULTI"]];
        for (key, &update) in keys.iter().zip(updates) {
            if update {
                commit.push(vec![b"SET", key, value]);
            }
        }
        let exec_index = commit.len();
        commit.push(vec![b"EXEC"]);
        let writes = updates.iter().any(|&update| update);
        if let (true, Some(replicas)) = (writes, &replicas_text) {
            commit.push(vec![b"WAIT", replicas.as_bytes(), b"0"]);
        }
        let replies = self.connection.call_pipelined(&commit)?;
        if let Some(Value::Error(message)) =
            replies.iter().find(|reply| matches!(reply, Value::Error(_)))
        {
            return Err(format!("redis: {message}"));
        }
        let exec = &replies[exec_index];
        if let (true, Some(replicas)) = (writes, self.wait_replicas) {
            match replies.last() {
                Some(Value::Integer(acknowledged)) if *acknowledged >= i64::from(replicas) => {}
                other => return Err(format!("WAIT {replicas} 0 answered {other:?}")),
            }
        }
        match exec {
            Value::Array(_) => Ok(true),
            Value::Null | Value::NullArray => Ok(false),
            other => Err(format!("EXEC answered {other:?}")),
        }
    }
}

/// Runs the part: Stratus and (unless told not to) Redis, each mix at each thread count, the
/// systems' order alternating from cell to cell.
pub(super) fn run(arguments: &TxArguments) -> Result<Vec<Row>, String> {
    for &percent in &arguments.read_percents {
        if percent > 100 {
            return Err(format!("read percentage {percent} is over 100"));
        }
    }
    if arguments.keys_per_transaction == 0
        || arguments.records < arguments.keys_per_transaction as u64
    {
        return Err(
            "each transaction needs at least one key, and the table at least as many".into()
        );
    }
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let replicas = arguments.replicas.to_string();
    let cluster = start_local_cluster(
        &directory.path().join("stratus"),
        arguments.servers,
        &["--replicas", &replicas, "--durability", &arguments.durability],
        None,
    )?;
    let stratus_processes = process_tree(cluster.process.id())?;
    let admin = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let table = admin.block_on(load_stratus(&cluster.coordinator, arguments))?;
    let redis = if arguments.redis {
        let durability = RedisDurability::parse(&format!("wait-{}", arguments.replicas))
            .ok_or("no Redis configuration for these replicas")?;
        let deployment = start_redis(&directory.path().join("redis"), durability)?;
        load_redis(&deployment.address, arguments)?;
        Some(deployment)
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut cell = 0usize;
    for &read_percent in &arguments.read_percents {
        for &threads in &arguments.threads {
            let threads = threads.max(1);
            let mut systems: Vec<&str> = vec!["stratus"];
            if redis.is_some() {
                systems.push("redis");
            }
            if cell % 2 == 1 {
                systems.reverse();
            }
            cell += 1;
            for system in systems {
                let (stores, processes) = match (system, &redis) {
                    ("redis", Some(deployment)) => {
                        let mut stores: Vec<Box<dyn TxStore>> = Vec::new();
                        for _ in 0..threads {
                            stores.push(Box::new(RedisStore {
                                connection: RespConnection::open(&deployment.address)?,
                                wait_replicas: deployment.durability.wait_replicas(),
                            }));
                        }
                        (stores, deployment.process_ids())
                    }
                    _ => {
                        let mut stores: Vec<Box<dyn TxStore>> = Vec::new();
                        for _ in 0..threads {
                            let config = ClientConfig::new(cluster.coordinator.clone());
                            let client = BlockingClient::new(config)
                                .map_err(|error| format!("client: {error}"))?;
                            stores.push(Box::new(StratusStore { client, table }));
                        }
                        (stores, stratus_processes.clone())
                    }
                };
                let system_name = if system == "redis" { "redis" } else { "stratus" };
                let row = drive(system_name, stores, &processes, read_percent, arguments)?;
                report(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Runs `stores` (one thread each) for the configured seconds; one row.
fn drive(
    system: &'static str,
    stores: Vec<Box<dyn TxStore>>,
    processes: &[u32],
    read_percent: u32,
    arguments: &TxArguments,
) -> Result<Row, String> {
    let threads = stores.len();
    let duration = Duration::from_secs(arguments.seconds.max(1));
    let phase = PhaseCpu::start(processes.to_vec())?;
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(thread, mut store)| {
            let records = arguments.records;
            let keys_wanted = arguments.keys_per_transaction;
            let value = vec![0xa5_u8; arguments.value_bytes];
            std::thread::spawn(move || -> Result<Tally, String> {
                let mut random = Random::new(SEED + thread as u64);
                let mut zipfian = ScrambledZipfian::new(0, records as i64 - 1);
                let mut tally = Tally::new();
                while Instant::now() < deadline {
                    let (keys, updates) =
                        draw(&mut random, &mut zipfian, keys_wanted, read_percent);
                    let begun = Instant::now();
                    let committed = store.transaction(&keys, &updates, &value)?;
                    tally.histogram.saturating_record((begun.elapsed().as_nanos() as u64).max(1));
                    tally.attempts += 1;
                    tally.committed += u64::from(committed);
                }
                Ok(tally)
            })
        })
        .collect();
    let mut total = Tally::new();
    let mut failure = None;
    for worker in workers {
        match worker.join() {
            Ok(Ok(tally)) => total.add(&tally)?,
            Ok(Err(error)) => failure = Some(error),
            Err(_) => failure = Some("a driver thread panicked".to_string()),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = phase.finish()?;
    if let Some(error) = failure {
        return Err(format!("{system} transactions: {error}"));
    }
    Ok(Row {
        part: "ycsb",
        system,
        shape: format!("ycsb-{read_percent}/{}", 100 - read_percent),
        participants: 0,
        objects: arguments.keys_per_transaction,
        threads,
        transactions: total.attempts,
        committed: total.committed,
        aborted: total.attempts - total.committed,
        seconds,
        percentiles: Percentiles::of(&total.histogram),
        cpu,
    })
}

/// One thread's counts.
struct Tally {
    histogram: hdrhistogram::Histogram<u64>,
    attempts: u64,
    committed: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally { histogram: latency_histogram(), attempts: 0, committed: 0 }
    }

    fn add(&mut self, other: &Tally) -> Result<(), String> {
        self.histogram.add(&other.histogram).map_err(|error| error.to_string())?;
        self.attempts += other.attempts;
        self.committed += other.committed;
        Ok(())
    }
}

/// A transaction's distinct zipfian keys and, for each, whether it is rewritten.
fn draw(
    random: &mut Random,
    zipfian: &mut ScrambledZipfian,
    keys_wanted: usize,
    read_percent: u32,
) -> (Vec<Vec<u8>>, Vec<bool>) {
    let mut numbers: Vec<i64> = Vec::with_capacity(keys_wanted);
    for _ in 0..KEY_DRAWS_MAX {
        if numbers.len() == keys_wanted {
            break;
        }
        let number = zipfian.next_value(random);
        if !numbers.contains(&number) {
            numbers.push(number);
        }
    }
    let keys = numbers.iter().map(|&number| record_key(number as u64)).collect();
    let updates =
        numbers.iter().map(|_| random.uniform(0, 99) >= u64::from(read_percent)).collect();
    (keys, updates)
}

fn record_key(number: u64) -> Vec<u8> {
    format!("user{number}").into_bytes()
}

/// Creates the table over every server and writes every record.
async fn load_stratus(coordinator: &str, arguments: &TxArguments) -> Result<TableId, String> {
    let client = Client::new(ClientConfig::new(coordinator.to_string()));
    let table = client
        .create_table("bench-tx-ycsb", arguments.servers)
        .await
        .map_err(|error| format!("creating the table: {error}"))?;
    let value = Bytes::from(vec![0u8; arguments.value_bytes]);
    let mut start = 0;
    while start < arguments.records {
        let end = (start + LOAD_BATCH_RECORDS).min(arguments.records);
        let items: Vec<WriteItem> = (start..end)
            .map(|number| WriteItem {
                table_id: table,
                key: Bytes::from(record_key(number)),
                value: value.clone(),
                rules: RejectRules::NONE,
                expiry: stratus_types::Expiry::Never,
                rpc: None,
            })
            .collect();
        for outcome in client.multi_write(&items).await {
            outcome.map_err(|error| format!("loading the records: {error}"))?;
        }
        start = end;
    }
    Ok(table)
}

/// Writes every record with MSETs.
fn load_redis(address: &str, arguments: &TxArguments) -> Result<(), String> {
    let mut connection = RespConnection::open(address)?;
    let value = vec![0u8; arguments.value_bytes];
    let mut start = 0;
    while start < arguments.records {
        let end = (start + LOAD_BATCH_RECORDS).min(arguments.records);
        let keys: Vec<Vec<u8>> = (start..end).map(record_key).collect();
        let mut command: Vec<&[u8]> = vec![b"MSET"];
        for key in &keys {
            command.push(key);
            command.push(&value);
        }
        connection.call(&command)?;
        start = end;
    }
    Ok(())
}

/// Stratus's committed transactions per second over Redis's, and the abort rates, per cell.
pub(super) fn print_ratios(rows: &[Row]) {
    for stratus in rows.iter().filter(|row| row.system == "stratus") {
        let Some(redis) = rows.iter().find(|row| {
            row.system == "redis" && row.shape == stratus.shape && row.threads == stratus.threads
        }) else {
            continue;
        };
        let ratio = stratus.committed_per_sec() / redis.committed_per_sec().max(1e-9);
        println!(
            "ratio {} threads {}: Stratus commits {:.2} × Redis's transactions per second \
             (goal ≥ 1.0), aborts {:.2} % against {:.2} %",
            stratus.shape,
            stratus.threads,
            ratio,
            stratus.abort_rate() * 100.0,
            redis.abort_rate() * 100.0
        );
        print_json(&[
            ("bench", Field::Text("tx".into())),
            ("part", Field::Text("ycsb-ratio".into())),
            ("shape", Field::Text(stratus.shape.clone())),
            ("threads", Field::Number(stratus.threads as f64)),
            ("committed_per_sec_ratio", Field::Number(ratio)),
            ("stratus_abort_rate", Field::Number(stratus.abort_rate())),
            ("redis_abort_rate", Field::Number(redis.abort_rate())),
        ]);
    }
}
