//! `stratus bench tx`: what a multi-object transaction costs.
//!
//! Two parts, each beside its reference in the same run:
//!
//! - **commit latency** (`commit`): the commit of a transaction that read and wrote 1, 2 or 5
//!   objects on 1, 2 or 5 masters, beside a single exactly-once write of one object on the same
//!   cluster (RAMCloud's comparison: 5 objects on 5 masters in 27 µs against a 13.5 µs
//!   replicated write, 2 ×; the goal here is at most 2.5 ×). Shapes and the single write take
//!   turns in blocks, so the machine's drift falls on all of them.
//! - **transactional YCSB** (`ycsb`), as T2 ran it: each transaction reads several zipfian keys
//!   and rewrites each with the update fraction's probability (50/50, 95/5, 100/0), from 1..N
//!   threads for a fixed time; beside Redis running the same transactions with WATCH / GET /
//!   MULTI / SET / EXEC on one primary with R replicas and `WAIT R 0` after EXEC (the same
//!   durability as a Stratus write on R backups). An aborted transaction is counted and not
//!   retried, in both systems, so the abort rate is the fraction of attempts that aborted.
//!
//! Every row carries `bench`, `part`, `system`, `shape`, `participants`, `objects`,
//! `threads`, `transactions`, `committed_per_sec`, `abort_rate`, `p50_us`, `p99_us`,
//! `p999_us` and the CPU of every process of the system per committed transaction.

mod commit_latency;
mod ycsb;

use clap::Args;

use crate::cpu::CpuCost;
use crate::report::{print_json, Field, Percentiles};

/// `stratus bench tx`.
#[derive(Debug, Args)]
pub struct TxArguments {
    /// Parts to run, comma-separated: commit, ycsb.
    #[arg(long, default_value = "commit,ycsb", value_delimiter = ',')]
    pub parts: Vec<String>,
    /// Storage servers of the Stratus cluster (at least 5 for the 5-master shape, and more
    /// than the replicas).
    #[arg(long, default_value_t = 5)]
    pub servers: u32,
    /// Backups of every Stratus write; the Redis peer gets as many replicas (`WAIT R 0`).
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Stratus durability: buffered (acknowledged once in R backups' memory) or fsync.
    #[arg(long, default_value = "buffered")]
    pub durability: String,
    /// Commit part: measured commits of each shape (and single writes).
    #[arg(long, default_value_t = 5_000)]
    pub transactions: u64,
    /// YCSB part: percentages of reads, comma-separated (50 = 50/50, 95 = 95/5, 100 = read
    /// only).
    #[arg(long, default_value = "50,95,100", value_delimiter = ',')]
    pub read_percents: Vec<u32>,
    /// YCSB part: client threads, comma-separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// YCSB part: seconds each system runs each mix at each thread count.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// YCSB part: records in the table.
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// YCSB part: keys read (and perhaps written) by each transaction.
    #[arg(long, default_value_t = 4)]
    pub keys_per_transaction: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// YCSB part: run Redis beside Stratus (needs redis-server); off: Stratus only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub redis: bool,
}

/// Runs the benchmark.
pub fn run(arguments: TxArguments) -> Result<(), String> {
    if arguments.durability != "buffered" && arguments.durability != "fsync" {
        return Err(format!("unknown durability {:?} (buffered or fsync)", arguments.durability));
    }
    if arguments.replicas >= arguments.servers {
        return Err(format!(
            "{} replicas need at least {} servers",
            arguments.replicas,
            arguments.replicas + 1
        ));
    }
    for part in &arguments.parts {
        match part.trim() {
            "commit" | "ycsb" => {}
            other => return Err(format!("unknown part {other:?} (commit, ycsb)")),
        }
    }
    print_header();
    let wants = |name: &str| arguments.parts.iter().any(|part| part.trim() == name);
    if wants("commit") {
        let rows = commit_latency::run(&arguments)?;
        commit_latency::print_goal(&rows);
    }
    if wants("ycsb") {
        let rows = ycsb::run(&arguments)?;
        ycsb::print_ratios(&rows);
    }
    Ok(())
}

/// One measured cell of either part.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    part: &'static str,
    system: &'static str,
    /// `write` (the single write), `tx-OoM` (O objects on M masters) or `ycsb-RR/UU`.
    shape: String,
    participants: usize,
    objects: usize,
    threads: usize,
    /// Attempts: committed and aborted.
    transactions: u64,
    committed: u64,
    aborted: u64,
    seconds: f64,
    /// Latency of what the part measures (the commit; a whole YCSB transaction).
    percentiles: Percentiles,
    cpu: CpuCost,
}

impl Row {
    fn committed_per_sec(&self) -> f64 {
        self.committed as f64 / self.seconds.max(1e-9)
    }

    fn abort_rate(&self) -> f64 {
        self.aborted as f64 / self.transactions.max(1) as f64
    }
}

fn print_header() {
    println!(
        "{:<7} {:<8} {:<12} {:>5} {:>5} {:>4} {:>9} {:>12} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "part",
        "system",
        "shape",
        "mstrs",
        "objs",
        "thr",
        "attempts",
        "committed/s",
        "aborts",
        "p50_us",
        "p99_us",
        "p99.9_us",
        "cpu_us/tx"
    );
}

/// Prints `row` as a table line and a JSON line.
fn report(row: &Row) {
    println!(
        "{:<7} {:<8} {:<12} {:>5} {:>5} {:>4} {:>9} {:>12.0} {:>6.2}% {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        row.part,
        row.system,
        row.shape,
        row.participants,
        row.objects,
        row.threads,
        row.transactions,
        row.committed_per_sec(),
        row.abort_rate() * 100.0,
        row.percentiles.p50_us,
        row.percentiles.p99_us,
        row.percentiles.p999_us,
        row.cpu.system_us_per_op(row.committed),
    );
    let mut fields = vec![
        ("bench", Field::Text("tx".into())),
        ("part", Field::Text(row.part.into())),
        ("system", Field::Text(row.system.into())),
        ("shape", Field::Text(row.shape.clone())),
        ("participants", Field::Number(row.participants as f64)),
        ("objects", Field::Number(row.objects as f64)),
        ("threads", Field::Number(row.threads as f64)),
        ("transactions", Field::Number(row.transactions as f64)),
        ("committed_per_sec", Field::Number(row.committed_per_sec())),
        ("abort_rate", Field::Number(row.abort_rate())),
        ("p50_us", Field::Number(row.percentiles.p50_us)),
        ("p99_us", Field::Number(row.percentiles.p99_us)),
        ("p999_us", Field::Number(row.percentiles.p999_us)),
    ];
    fields.extend(row.cpu.fields(row.committed));
    print_json(&fields);
}

/// Sums two phases' CPU of the same processes.
fn add_cpu(total: Option<CpuCost>, cost: CpuCost) -> CpuCost {
    match total {
        None => cost,
        Some(total) => CpuCost {
            system: total.system + cost.system,
            driver: total.driver + cost.driver,
            system_processes: cost.system_processes,
        },
    }
}
