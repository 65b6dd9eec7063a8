//! `stratus bench tiering`: automatic tiering (docs/design/flash-tier.md, "Automatic
//! tiering") on a data set five times a server's DRAM budget for auto tables, against the
//! same data in DRAM in the same run:
//!
//! 1. `ycsb`: YCSB B and C (ScrambledZipfian, θ = 0.99; the `bench ycsb` driver) on an auto
//!    table beside a memory table on a server whose log holds it all; the two servers'
//!    phases interleaved and repeated. Throughput, latency, CPU per operation, the DRAM hit
//!    ratio of the measured phases, and the throughput ratio auto / memory with its spread.
//! 2. `shifting`: a hot set (a tenth of the keys, most of the reads) that moves to other keys
//!    every `--shift-seconds`; the hit ratio every second, and how long after each move it is
//!    back above 0.9.
//! 3. `redis-lru`: Redis with `maxmemory` at the same DRAM budget, `allkeys-lru`, loaded with
//!    the same records: the share of keys it evicted; and every key read back from the auto
//!    table.
//!
//! One JSON object per result line and a table (`auto` is the auto table's figure, `reference`
//! the memory table's or Redis's).

mod redis_lru;
mod shifting;
mod systems;
mod ycsb_rows;

use clap::Args;

use crate::ycsb::generators::RECORD_LOG_BYTES;

/// The rows, in the order they run.
const ROWS: [&str; 3] = ["ycsb", "shifting", "redis-lru"];
/// The DRAM hit ratio the issue asks of the auto tier.
const HIT_RATIO_GOAL: f64 = 0.9;

/// `stratus bench tiering`.
#[derive(Debug, Args)]
pub struct TieringArguments {
    /// Rows to measure, comma-separated: ycsb, shifting, redis-lru.
    #[arg(long, default_value = "ycsb,shifting,redis-lru", value_delimiter = ',')]
    pub rows: Vec<String>,
    /// DRAM budget of the auto server's auto tables, in MiB (its --auto-dram-mib), and
    /// Redis's maxmemory in the redis-lru row.
    #[arg(long, default_value_t = 16)]
    pub auto_dram_mib: u64,
    /// The data set, in multiples of the DRAM budget (records of 1.1 KB in the log).
    #[arg(long, default_value_t = 5)]
    pub data_multiple: u64,
    /// Log memory of the auto server, in MiB (0: four times the DRAM budget; it also holds an
    /// entry of about 60 bytes per object on flash).
    #[arg(long, default_value_t = 0)]
    pub auto_log_mib: u64,
    /// Log memory of the memory server, in MiB (0: twice the data set).
    #[arg(long, default_value_t = 0)]
    pub memory_log_mib: u64,
    /// Segment size of both servers, in MiB (the unit the auto tier demotes).
    #[arg(long, default_value_t = 1)]
    pub segment_mib: u64,
    /// Flash budget of both servers, in GiB.
    #[arg(long, default_value_t = 1)]
    pub flash_gib: u64,
    /// Driver threads (each with a connection of its own) of every row.
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Operations of each measured YCSB phase (one workload, one server, one repeat).
    #[arg(long, default_value_t = 50_000)]
    pub operations: u64,
    /// Operations of the warm-up (workload C on each server, after the load, not measured).
    #[arg(long, default_value_t = 100_000)]
    pub warmup_operations: u64,
    /// Repeats of the YCSB phases (each repeat runs B and C on both servers).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Seconds between two moves of the hot set in the shifting row.
    #[arg(long, default_value_t = 30)]
    pub shift_seconds: u64,
    /// Hot sets of the shifting row (the first on the state the earlier rows left, then one
    /// per move).
    #[arg(long, default_value_t = 4)]
    pub shifts: u32,
    /// The hot set of the shifting row, in percent of the keys.
    #[arg(long, default_value_t = 10.0)]
    pub hot_key_percent: f64,
    /// The hot set's share of the shifting row's reads, in percent (the others go to the
    /// keys outside it, uniformly).
    #[arg(long, default_value_t = 95.0)]
    pub hot_read_percent: f64,
}

/// The sizes every row shares.
pub(super) struct Sizes {
    /// Records of the data set (`--data-multiple` × the budget, at 1.1 KB a record).
    records: u64,
    auto_log_mib: u64,
    memory_log_mib: u64,
}

impl Sizes {
    fn of(arguments: &TieringArguments) -> Sizes {
        let data_mib = arguments.data_multiple * arguments.auto_dram_mib;
        let records = ((data_mib << 20) / RECORD_LOG_BYTES).max(1);
        let auto_log_mib = match arguments.auto_log_mib {
            0 => 4 * arguments.auto_dram_mib,
            mib => mib,
        };
        let memory_log_mib = match arguments.memory_log_mib {
            0 => 2 * data_mib,
            mib => mib,
        };
        Sizes { records, auto_log_mib, memory_log_mib }
    }
}

/// Runs the benchmark.
pub fn run(arguments: TieringArguments) -> Result<(), String> {
    for row in &arguments.rows {
        if !ROWS.contains(&row.trim()) {
            return Err(format!("unknown row {row:?} (ycsb, shifting, redis-lru)"));
        }
    }
    let wants = |row: &str| arguments.rows.iter().any(|named| named.trim() == row);
    if arguments.auto_dram_mib == 0 || arguments.data_multiple == 0 || arguments.threads == 0 {
        return Err("--auto-dram-mib, --data-multiple and --threads must be positive".into());
    }
    if arguments.operations == 0 || arguments.repeats == 0 {
        return Err("--operations and --repeats must be positive".into());
    }
    if arguments.shift_seconds == 0 || arguments.shifts == 0 {
        return Err("--shift-seconds and --shifts must be positive".into());
    }
    let a_percentage = |value: f64| value > 0.0 && value < 100.0;
    if !a_percentage(arguments.hot_key_percent) || !a_percentage(arguments.hot_read_percent) {
        return Err("--hot-key-percent and --hot-read-percent must be above 0 and below 100".into());
    }
    let sizes = Sizes::of(&arguments);
    if arguments.auto_dram_mib >= sizes.auto_log_mib {
        return Err("--auto-log-mib must be more than --auto-dram-mib".into());
    }
    print_header();
    let auto = systems::start_auto(&arguments, &sizes)?;
    if wants("ycsb") {
        let memory = systems::start_memory(&arguments, &sizes)?;
        ycsb_rows::run(&arguments, &sizes, &auto, &memory)?;
    }
    if wants("shifting") {
        shifting::run(&arguments, &sizes, &auto)?;
    }
    if wants("redis-lru") {
        redis_lru::run(&arguments, &sizes, &auto)?;
    }
    Ok(())
}

/// Prints the table's header.
fn print_header() {
    println!(
        "{:<9} {:<10} {:<44} {:>12} {:>12} {:>22} {:>7}",
        "row", "config", "measure", "auto", "reference", "ratio", "goal"
    );
}

/// One line of the table; texts, so that a row can show a spread or a word.
fn line(
    row: &str,
    config: &str,
    measure: &str,
    auto: &str,
    reference: &str,
    ratio: &str,
    goal: &str,
) {
    println!(
        "{row:<9} {config:<10} {measure:<44} {auto:>12} {reference:>12} {ratio:>22} {goal:>7}"
    );
}
