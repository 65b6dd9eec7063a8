//! The commit part of `stratus bench tx`: commit latency by shape, beside a single write.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stratus_client::{BlockingClient, Client, ClientConfig, RejectRules, TableId, TxOutcome};
use stratus_types::key_hash;

use super::{add_cpu, report, Row, TxArguments};
use crate::cluster::{start_local_cluster, UpCluster};
use crate::cpu::{process_tree, CpuCost, PhaseCpu};
use crate::report::{latency_histogram, Percentiles};

/// The transaction shapes measured: (objects, masters). RAMCloud's figure has 1..5 objects on
/// as many masters; 2 and 5 objects on one master show what a participant costs per object.
const SHAPES: [(usize, usize); 5] = [(1, 1), (2, 1), (2, 2), (5, 1), (5, 5)];
/// Blocks each shape's measured commits are cut into, taking turns with the other shapes.
const ROUNDS: u64 = 10;
/// Transactions of each shape (and single writes) before the measured ones.
const WARMUP_TRANSACTIONS: u64 = 200;
/// Keys of each master a shape cycles through (distinct keys within one transaction).
const KEYS_PER_MASTER: usize = 64;
/// Keys tried while looking for `KEYS_PER_MASTER` keys of every master.
const KEY_SEARCH_MAX: u64 = 1 << 20;

/// One thing measured: a shape's commit or the single write.
#[derive(Clone, Copy, Debug)]
enum Measured {
    SingleWrite,
    Commit { objects: usize, masters: usize },
}

impl Measured {
    fn shape(self) -> String {
        match self {
            Measured::SingleWrite => "write".to_string(),
            Measured::Commit { objects, masters } => format!("tx-{objects}o{masters}m"),
        }
    }
}

/// Runs the part on a cluster of its own; returns its rows (already reported).
pub(super) fn run(arguments: &TxArguments) -> Result<Vec<Row>, String> {
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let replicas = arguments.replicas.to_string();
    let cluster = start_local_cluster(
        directory.path(),
        arguments.servers,
        &["--replicas", &replicas, "--durability", &arguments.durability],
        None,
    )?;
    let processes = process_tree(cluster.process.id())?;
    let admin = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let (table, keys_by_master) = admin.block_on(keys_on_each_master(&cluster, arguments))?;
    let mut measured = vec![Measured::SingleWrite];
    for (objects, masters) in SHAPES {
        if masters > keys_by_master.len() {
            eprintln!(
                "NOTICE: shape {objects} objects on {masters} masters skipped: the table spans \
                 {} masters",
                keys_by_master.len()
            );
            continue;
        }
        measured.push(Measured::Commit { objects, masters });
    }
    let client = BlockingClient::new(ClientConfig::new(cluster.coordinator.clone()))
        .map_err(|error| format!("client: {error}"))?;
    let bench = Bench { client: &client, table, keys_by_master: &keys_by_master };
    let value = vec![0x5a_u8; arguments.value_bytes];
    let mut counter = 0u64;
    for &what in &measured {
        for _ in 0..WARMUP_TRANSACTIONS {
            bench.once(what, counter, &value)?;
            counter += 1;
        }
    }
    let rounds = ROUNDS.min(arguments.transactions.max(1));
    let block = arguments.transactions.div_ceil(rounds);
    let mut cells: Vec<Cell> = measured.iter().map(|_| Cell::new()).collect();
    for round in 0..rounds {
        // Each shape's block comes at another place in every round.
        let rotation = round as usize % measured.len();
        for step in 0..measured.len() {
            let slot = (step + rotation) % measured.len();
            let count = block.min(arguments.transactions - cells[slot].attempts);
            let phase = PhaseCpu::start(processes.clone())?;
            let started = Instant::now();
            for _ in 0..count {
                let (latency, committed) = bench.once(measured[slot], counter, &value)?;
                counter += 1;
                cells[slot].record(latency, committed);
            }
            cells[slot].elapsed += started.elapsed();
            cells[slot].cpu = Some(add_cpu(cells[slot].cpu, phase.finish()?));
        }
    }
    let mut rows = Vec::new();
    for (what, cell) in measured.iter().zip(cells) {
        let (objects, participants) = match *what {
            Measured::SingleWrite => (1, 1),
            Measured::Commit { objects, masters } => (objects, masters),
        };
        let row = Row {
            part: "commit",
            system: "stratus",
            shape: what.shape(),
            participants,
            objects,
            threads: 1,
            transactions: cell.attempts,
            committed: cell.committed,
            aborted: cell.attempts - cell.committed,
            seconds: cell.elapsed.as_secs_f64(),
            percentiles: Percentiles::of(&cell.histogram),
            cpu: cell.cpu.expect("every shape ran at least one block"),
        };
        report(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// One shape's measurements so far.
struct Cell {
    histogram: hdrhistogram::Histogram<u64>,
    attempts: u64,
    committed: u64,
    elapsed: Duration,
    cpu: Option<CpuCost>,
}

impl Cell {
    fn new() -> Cell {
        Cell {
            histogram: latency_histogram(),
            attempts: 0,
            committed: 0,
            elapsed: Duration::ZERO,
            cpu: None,
        }
    }

    fn record(&mut self, latency: Duration, committed: bool) {
        self.histogram.saturating_record((latency.as_nanos() as u64).max(1));
        self.attempts += 1;
        self.committed += u64::from(committed);
    }
}

struct Bench<'a> {
    client: &'a BlockingClient,
    table: TableId,
    keys_by_master: &'a [Vec<Vec<u8>>],
}

impl Bench<'_> {
    /// One single write, or one transaction that reads then writes `objects` keys spread over
    /// `masters` masters; the time of the write or of the commit alone (the reads before it
    /// are not counted, as in RAMCloud's measurement), and whether it committed.
    fn once(&self, what: Measured, counter: u64, value: &[u8]) -> Result<(Duration, bool), String> {
        match what {
            Measured::SingleWrite => {
                let key = &self.keys_by_master[0][counter as usize % KEYS_PER_MASTER];
                let started = Instant::now();
                self.client
                    .write(self.table, key, value, RejectRules::NONE)
                    .map_err(|error| format!("write: {error}"))?;
                Ok((started.elapsed(), true))
            }
            Measured::Commit { objects, masters } => {
                let transaction = self.client.transaction();
                for object in 0..objects {
                    let keys = &self.keys_by_master[object % masters];
                    let key = &keys[(counter as usize * objects + object / masters) % keys.len()];
                    transaction
                        .read(self.table, key)
                        .map_err(|error| format!("transaction read: {error}"))?;
                    transaction
                        .write(self.table, key, value)
                        .map_err(|error| format!("transaction write: {error}"))?;
                }
                let started = Instant::now();
                let outcome = transaction.commit().map_err(|error| format!("commit: {error}"))?;
                let latency = started.elapsed();
                Ok((latency, matches!(outcome, TxOutcome::Committed)))
            }
        }
    }
}

/// Creates the table over every server and finds [`KEYS_PER_MASTER`] keys on each master
/// (masters in address order), all written once so that every transaction reads something.
async fn keys_on_each_master(
    cluster: &UpCluster,
    arguments: &TxArguments,
) -> Result<(TableId, Vec<Vec<Vec<u8>>>), String> {
    let client = Client::new(ClientConfig::new(cluster.coordinator.clone()));
    let table = client
        .create_table("bench-tx-commit", arguments.servers)
        .await
        .map_err(|error| format!("creating the table: {error}"))?;
    let tablets = client.tablet_map(table).await.map_err(|error| format!("tablet map: {error}"))?;
    let mut keys: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for tablet in &tablets {
        keys.entry(tablet.owner_address.clone()).or_default();
    }
    let mut index = 0u64;
    while keys.values().any(|list| list.len() < KEYS_PER_MASTER) {
        if index >= KEY_SEARCH_MAX {
            return Err("no keys found for every master".to_string());
        }
        let key = format!("tx-{index}").into_bytes();
        index += 1;
        let hash = key_hash(table, &key);
        let Some(tablet) = tablets.iter().find(|tablet| tablet.range.contains(hash)) else {
            continue;
        };
        let list = keys.get_mut(&tablet.owner_address).expect("every owner has a list");
        if list.len() < KEYS_PER_MASTER {
            list.push(key);
        }
    }
    let value = vec![0u8; arguments.value_bytes];
    for key in keys.values().flatten() {
        client
            .write(table, key, &value)
            .await
            .map_err(|error| format!("writing the keys: {error}"))?;
    }
    Ok((table, keys.into_values().collect()))
}

/// The goal row: the 5-on-5 commit's p50 over the single write's.
pub(super) fn print_goal(rows: &[Row]) {
    let p50 =
        |shape: &str| rows.iter().find(|row| row.shape == shape).map(|row| row.percentiles.p50_us);
    let (Some(write), Some(five)) = (p50("write"), p50("tx-5o5m")) else {
        println!("goal: 5 objects on 5 masters not measured (the table spans fewer masters)");
        return;
    };
    let ratio = five / write.max(1e-9);
    println!(
        "goal: commit of 5 objects on 5 masters p50 {five:.1} µs = {ratio:.2} × a single write's \
         {write:.1} µs (goal ≤ 2.5 ×): {}",
        if ratio <= 2.5 { "met" } else { "missed" }
    );
    crate::report::print_json(&[
        ("bench", crate::report::Field::Text("tx".into())),
        ("part", crate::report::Field::Text("commit-goal".into())),
        ("tx_5o5m_p50_us", crate::report::Field::Number(five)),
        ("write_p50_us", crate::report::Field::Number(write)),
        ("ratio", crate::report::Field::Number(ratio)),
        ("goal_ratio_max", crate::report::Field::Number(2.5)),
    ]);
}
