//! `stratus bench ycsb`: YCSB's core workloads A–F, driven by one driver against Stratus,
//! Redis and memcached, each started here with a documented configuration.
//!
//! The generators reproduce YCSB's `CoreWorkload` (brianfrankcooper/YCSB): keys are
//! `"user" + fnvhash64(keynum)` (insertorder=hashed), requests follow the
//! `ScrambledZipfianGenerator` (θ = 0.99 over 10^10 ranks, precomputed ζ = 26.46902820178302,
//! folded onto the key space with FNV-64) or, for workload D, the `SkewedLatestGenerator` over
//! an acknowledged insert counter. Records are 10 fields of 100 printable bytes; a read reads
//! all fields, an update writes one uniformly chosen field. See docs/ycsb.md for the mapping of
//! records and operations onto each system.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use stratus_client::{BlockingClient, ClientConfig, RejectRules, TableId};
use stratus_env::SplitMix64;
use stratus_wire::Status;

use crate::cluster::{free_loopback_address, start_local_cluster, ChildProcess};
use crate::redis_reference::{encode_command, find_executable};
use crate::report::{latency_histogram, print_json, Field};

/// `stratus bench ycsb`.
#[derive(Debug, Args)]
pub struct YcsbArguments {
    /// The core workload: a, b, c, d, e or f.
    #[arg(long, default_value = "a", value_parser = ["a", "b", "c", "d", "e", "f"])]
    pub workload: String,
    /// Systems to measure, comma-separated: stratus, redis, memcached.
    #[arg(long, default_value = "stratus,redis,memcached", value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Only these configurations (comma-separated; default all): stratus r0, r3-buffered,
    /// r3-fsync; redis everysec, always; memcached default.
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Records loaded before the run (YCSB recordcount).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Operations of the run phase (YCSB operationcount).
    #[arg(long, default_value_t = 50_000)]
    pub operations: u64,
    /// Client threads, each with its own connection (YCSB -threads).
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Target throughput of the run phase in operations per second (YCSB -target); also
    /// reports the coordinated-omission-corrected latency from each operation's intended
    /// start time.
    #[arg(long)]
    pub target: Option<f64>,
    /// Storage servers of the Stratus cluster (R = 3 needs at least 4).
    #[arg(long, default_value_t = 4)]
    pub stratus_servers: u32,
}

// ---------------------------------------------------------------------------------------------
// Generators (YCSB's, bit for bit where YCSB is deterministic).
// ---------------------------------------------------------------------------------------------

const FNV_OFFSET_BASIS_64: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
const FNV_PRIME_64: i64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of `value` (shifted
/// arithmetically, as Java's `>>`), then `Math.abs` (which leaves `i64::MIN` negative).
pub fn fnv_hash64(mut value: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = value & 0xff;
        value >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    hash.wrapping_abs()
}

/// YCSB's `buildKeyName` with insertorder=hashed and zeropadding=1.
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnv_hash64(keynum as i64))
}

/// Java's `String.hashCode` (the score of a key in the Redis binding's `_indices` set).
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16()
        .fold(0_i32, |hash, unit| hash.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// SplitMix64: a small, fast, seedable generator (YCSB uses ThreadLocalRandom), with YCSB's
/// draws on top.
#[derive(Clone, Debug)]
pub struct Random(SplitMix64);

impl Random {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Random {
        Random(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1_u64 << 53) as f64)
    }

    /// Uniform in [low, high] (inclusive).
    pub fn uniform(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }
}

/// YCSB's zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`: the ranks drawn before folding onto the key space.
const SCRAMBLED_ITEM_COUNT: i64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: ζ(10^10, 0.99), precomputed by YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// ζ(n, θ) = Σ_{i=1..n} 1 / i^θ, continued from `sum` = ζ(start, θ).
pub fn zeta_from(start: i64, n: i64, theta: f64, sum: f64) -> f64 {
    (start..n).fold(sum, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
/// databases"): item `base + 0` is the most popular.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: i64,
    base: i64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: i64,
}

impl Zipfian {
    /// Over [min, max] with constant `theta`, given ζ(max − min + 1, θ).
    pub fn with_zetan(min: i64, max: i64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta_from(0, 2, theta, 0.0);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    /// Over [min, max] with θ = 0.99 (computes ζ, O(max − min)).
    pub fn new(min: i64, max: i64) -> Zipfian {
        let zetan = zeta_from(0, max - min + 1, ZIPFIAN_CONSTANT, 0.0);
        Zipfian::with_zetan(min, max, ZIPFIAN_CONSTANT, zetan)
    }

    /// `nextLong(itemcount)`: a draw over `item_count` items; a larger count than before
    /// extends ζ incrementally (YCSB does not allow the count to decrease).
    pub fn next_long(&mut self, item_count: i64, random: &mut Random) -> i64 {
        if item_count > self.count_for_zeta {
            self.zetan = zeta_from(self.count_for_zeta, item_count, self.theta, self.zetan);
            self.count_for_zeta = item_count;
            // YCSB recomputes eta with the original item count.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let u = random.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5_f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }

    /// `nextValue()`: a draw over the generator's own item count.
    pub fn next_value(&mut self, random: &mut Random) -> i64 {
        self.next_long(self.count_for_zeta, random)
    }
}

/// YCSB's `ScrambledZipfianGenerator` over [min, max]: zipfian ranks over 10^10 items, hashed
/// onto the range so that popular keys are scattered.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: i64,
    item_count: i64,
    ranks: Zipfian,
}

impl ScrambledZipfian {
    /// Over [min, max].
    pub fn new(min: i64, max: i64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            item_count: max - min + 1,
            ranks: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// The next key number.
    pub fn next_value(&mut self, random: &mut Random) -> i64 {
        let rank = self.ranks.next_value(random);
        self.min + fnv_hash64(rank) % self.item_count
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: hands out insert key numbers; `last_value` is the
/// highest number below which every insert was acknowledged.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: AtomicU64,
    state: Mutex<(u64, BTreeSet<u64>)>,
}

impl AcknowledgedCounter {
    /// Starting at `start` (the first key number handed out).
    pub fn new(start: u64) -> AcknowledgedCounter {
        AcknowledgedCounter {
            next: AtomicU64::new(start),
            state: Mutex::new((start.wrapping_sub(1), BTreeSet::new())),
        }
    }

    /// The next key number to insert.
    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `value`'s insert as acknowledged.
    pub fn acknowledge(&self, value: u64) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (limit, pending) = &mut *state;
        pending.insert(value);
        while pending.remove(&limit.wrapping_add(1)) {
            *limit = limit.wrapping_add(1);
        }
    }

    /// The highest key number readable so far.
    pub fn last_value(&self) -> u64 {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).0
    }
}

/// YCSB's `SkewedLatestGenerator`: `last − zipfian(last)`, favouring recent inserts.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// For a counter whose last value is now `last`.
    pub fn new(last: u64) -> SkewedLatest {
        SkewedLatest { zipfian: Zipfian::new(0, last as i64 - 1) }
    }

    /// The next key number, given the counter's last value now.
    pub fn next_value(&mut self, last: u64, random: &mut Random) -> u64 {
        let last = last as i64;
        (last - self.zipfian.next_long(last, random)).max(0) as u64
    }
}

/// A core workload's operation mix.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// a..f.
    pub name: char,
    read: f64,
    update: f64,
    insert: f64,
    scan: f64,
    read_modify_write: f64,
    /// requestdistribution=latest (otherwise zipfian).
    latest: bool,
}

impl Workload {
    /// The shipped `workloads/workload[a-f]` files.
    pub fn core(name: char) -> Option<Workload> {
        let (read, update, insert, scan, read_modify_write, latest) = match name {
            'a' => (0.5, 0.5, 0.0, 0.0, 0.0, false),
            'b' => (0.95, 0.05, 0.0, 0.0, 0.0, false),
            'c' => (1.0, 0.0, 0.0, 0.0, 0.0, false),
            'd' => (0.95, 0.0, 0.05, 0.0, 0.0, true),
            'e' => (0.0, 0.0, 0.05, 0.95, 0.0, false),
            'f' => (0.5, 0.0, 0.0, 0.0, 0.5, false),
            _ => return None,
        };
        Some(Workload { name, read, update, insert, scan, read_modify_write, latest })
    }

    /// Chooses an operation like YCSB's `DiscreteGenerator`.
    fn choose(&self, random: &mut Random) -> Operation {
        let choices = [
            (self.read, Operation::Read),
            (self.update, Operation::Update),
            (self.insert, Operation::Insert),
            (self.scan, Operation::Scan),
            (self.read_modify_write, Operation::ReadModifyWrite),
        ];
        let total: f64 = choices.iter().map(|(weight, _)| weight).sum();
        let mut value = random.next_f64() * total;
        for (weight, operation) in choices {
            if value < weight {
                return operation;
            }
            value -= weight;
        }
        Operation::Read
    }
}

/// Fields per record and bytes per field (YCSB defaults).
pub const FIELD_COUNT: usize = 10;
/// Bytes per field.
pub const FIELD_LENGTH: usize = 100;
/// YCSB's `maxscanlength` in workload E.
const MAX_SCAN_LENGTH: u64 = 100;

/// Random printable bytes, as YCSB's `RandomByteIterator` produces.
fn random_field(random: &mut Random) -> Vec<u8> {
    (0..FIELD_LENGTH).map(|_| b' ' + (random.next_u64() % 95) as u8).collect()
}

// ---------------------------------------------------------------------------------------------
// Measurements and their rendering.
// ---------------------------------------------------------------------------------------------

/// The operation types YCSB reports, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Read all fields.
    Read,
    /// Write one field.
    Update,
    /// Write a whole new record.
    Insert,
    /// Read up to 100 records in key order from a start key.
    Scan,
    /// Read all fields, then write one.
    ReadModifyWrite,
}

impl Operation {
    /// YCSB's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "READ",
            Operation::Update => "UPDATE",
            Operation::Insert => "INSERT",
            Operation::Scan => "SCAN",
            Operation::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

/// What an operation returned (YCSB's `Return=...` lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Done.
    Ok,
    /// The record was missing.
    NotFound,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::NotFound => "NOT_FOUND",
        }
    }
}

/// The latencies of one operation type.
#[derive(Debug)]
struct OperationHistograms {
    service: Histogram<u64>,
    intended: Histogram<u64>,
    outcomes: BTreeMap<Outcome, u64>,
}

impl OperationHistograms {
    fn new() -> OperationHistograms {
        OperationHistograms {
            service: latency_histogram(),
            intended: latency_histogram(),
            outcomes: BTreeMap::new(),
        }
    }
}

/// All latencies of a phase (or of one thread of it).
#[derive(Debug, Default)]
struct Measurements {
    operations: BTreeMap<Operation, OperationHistograms>,
}

impl Measurements {
    fn record(
        &mut self,
        operation: Operation,
        service: Duration,
        intended: Duration,
        outcome: Outcome,
    ) {
        let entry = self.operations.entry(operation).or_insert_with(OperationHistograms::new);
        entry.service.saturating_record((service.as_nanos() as u64).max(1));
        entry.intended.saturating_record((intended.as_nanos() as u64).max(1));
        *entry.outcomes.entry(outcome).or_default() += 1;
    }

    fn merge(&mut self, other: Measurements) {
        for (operation, histograms) in other.operations {
            let entry = self.operations.entry(operation).or_insert_with(OperationHistograms::new);
            let _ = entry.service.add(&histograms.service);
            let _ = entry.intended.add(&histograms.intended);
            for (outcome, count) in histograms.outcomes {
                *entry.outcomes.entry(outcome).or_default() += count;
            }
        }
    }
}

/// One operation type's figures, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// YCSB's name ("READ", "Intended-READ", ...).
    pub name: String,
    /// Operations measured.
    pub operations: u64,
    /// Mean latency.
    pub average_us: f64,
    /// Smallest latency.
    pub min_us: u64,
    /// Largest latency.
    pub max_us: u64,
    /// Percentiles: 50, 95, 99, 99.9.
    pub p50_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Return codes and their counts.
    pub returns: Vec<(String, u64)>,
}

impl Summary {
    fn of(name: String, histogram: &Histogram<u64>, outcomes: &BTreeMap<Outcome, u64>) -> Summary {
        // Rounded: the histogram reports the edges of its buckets (3 significant digits).
        let micros = |nanoseconds: u64| (nanoseconds + 500) / 1_000;
        Summary {
            name,
            operations: histogram.len(),
            average_us: histogram.mean() / 1_000.0,
            min_us: micros(histogram.min()),
            max_us: micros(histogram.max()),
            p50_us: micros(histogram.value_at_quantile(0.50)),
            p95_us: micros(histogram.value_at_quantile(0.95)),
            p99_us: micros(histogram.value_at_quantile(0.99)),
            p999_us: micros(histogram.value_at_quantile(0.999)),
            returns: outcomes
                .iter()
                .map(|(outcome, count)| (outcome.name().to_string(), *count))
                .collect(),
        }
    }
}

/// The YCSB text report: `[OVERALL]` lines, then each operation type's.
pub fn render_report(runtime: Duration, operations: u64, summaries: &[Summary]) -> String {
    let mut text = String::new();
    let milliseconds = runtime.as_millis();
    let throughput = operations as f64 / runtime.as_secs_f64().max(1e-9);
    let _ = writeln!(text, "[OVERALL], RunTime(ms), {milliseconds}");
    let _ = writeln!(text, "[OVERALL], Throughput(ops/sec), {throughput:.3}");
    for summary in summaries {
        let name = &summary.name;
        let _ = writeln!(text, "[{name}], Operations, {}", summary.operations);
        let _ = writeln!(text, "[{name}], AverageLatency(us), {:.3}", summary.average_us);
        let _ = writeln!(text, "[{name}], MinLatency(us), {}", summary.min_us);
        let _ = writeln!(text, "[{name}], MaxLatency(us), {}", summary.max_us);
        let _ = writeln!(text, "[{name}], 50thPercentileLatency(us), {}", summary.p50_us);
        let _ = writeln!(text, "[{name}], 95thPercentileLatency(us), {}", summary.p95_us);
        let _ = writeln!(text, "[{name}], 99thPercentileLatency(us), {}", summary.p99_us);
        let _ = writeln!(text, "[{name}], 99.9thPercentileLatency(us), {}", summary.p999_us);
        for (code, count) in &summary.returns {
            let _ = writeln!(text, "[{name}], Return={code}, {count}");
        }
    }
    text
}

/// What a phase measured, with the names of the run.
struct PhaseResult {
    runtime: Duration,
    operations: u64,
    measurements: Measurements,
}

/// Identifies the rows of one configuration.
struct RunLabel<'a> {
    phase: &'a str,
    workload: char,
    system: &'a str,
    config: &'a str,
    threads: u32,
    records: u64,
    target: Option<f64>,
}

fn report_phase(label: &RunLabel<'_>, result: &PhaseResult) {
    let with_intended = label.target.is_some() && label.phase == "run";
    let mut summaries = Vec::new();
    for (operation, histograms) in &result.measurements.operations {
        summaries.push(Summary::of(
            operation.name().into(),
            &histograms.service,
            &histograms.outcomes,
        ));
    }
    let intended: Vec<Summary> = result
        .measurements
        .operations
        .iter()
        .map(|(operation, histograms)| {
            Summary::of(
                format!("Intended-{}", operation.name()),
                &histograms.intended,
                &histograms.outcomes,
            )
        })
        .collect();
    let mut printed = summaries.clone();
    if with_intended {
        printed.extend(intended.iter().cloned());
    }
    println!(
        "# ycsb {} workload={} system={} config={} threads={} records={}{}",
        label.phase,
        label.workload,
        label.system,
        label.config,
        label.threads,
        label.records,
        label.target.map(|target| format!(" target={target}")).unwrap_or_default()
    );
    print!("{}", render_report(result.runtime, result.operations, &printed));
    let ops_per_sec = result.operations as f64 / result.runtime.as_secs_f64().max(1e-9);
    for (summary, intended) in summaries.iter().zip(&intended) {
        let intended_field = |value: u64| {
            if with_intended {
                Field::Number(value as f64)
            } else {
                Field::Null
            }
        };
        let not_found = summary
            .returns
            .iter()
            .find(|(code, _)| code == "NOT_FOUND")
            .map_or(0, |(_, count)| *count);
        print_json(&[
            ("bench", Field::Text("ycsb".into())),
            ("phase", Field::Text(label.phase.into())),
            ("workload", Field::Text(label.workload.to_string())),
            ("system", Field::Text(label.system.into())),
            ("config", Field::Text(label.config.into())),
            ("threads", Field::Number(f64::from(label.threads))),
            ("records", Field::Number(label.records as f64)),
            ("operations", Field::Number(result.operations as f64)),
            ("target_ops_per_sec", Field::optional_number(label.target)),
            ("runtime_ms", Field::Number(result.runtime.as_millis() as f64)),
            ("ops_per_sec", Field::Number(ops_per_sec)),
            ("op", Field::Text(summary.name.clone())),
            ("op_count", Field::Number(summary.operations as f64)),
            ("not_found", Field::Number(not_found as f64)),
            ("avg_us", Field::Number(summary.average_us)),
            ("p50_us", Field::Number(summary.p50_us as f64)),
            ("p95_us", Field::Number(summary.p95_us as f64)),
            ("p99_us", Field::Number(summary.p99_us as f64)),
            ("p999_us", Field::Number(summary.p999_us as f64)),
            ("max_us", Field::Number(summary.max_us as f64)),
            ("intended_p50_us", intended_field(intended.p50_us)),
            ("intended_p99_us", intended_field(intended.p99_us)),
            ("intended_p999_us", intended_field(intended.p999_us)),
        ]);
    }
}

// ---------------------------------------------------------------------------------------------
// The systems.
// ---------------------------------------------------------------------------------------------

/// One client connection of a system (each driver thread owns one).
trait Database {
    /// Writes a whole new record.
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String>;
    /// Reads all fields of a record.
    fn read(&mut self, key: &str) -> Result<Outcome, String>;
    /// Writes field `field` of a record.
    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String>;
    /// Reads up to `count` records in key order from `start_key`.
    fn scan(&mut self, start_key: &str, count: u64) -> Result<Outcome, String>;
}

/// How long one socket read or write may block: every wait of the driver is bounded.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of one conditional read-modify-write under contention before it fails.
const CONDITIONAL_WRITE_ATTEMPTS: u32 = 1_000;

fn connect(address: &str) -> Result<TcpStream, String> {
    let stream =
        TcpStream::connect(address).map_err(|error| format!("connecting to {address}: {error}"))?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_nodelay(true).map_err(|error| error.to_string())?;
    Ok(stream)
}

/// A record as one object: the 10 fields of 100 bytes concatenated (field i at i × 100).
fn record_bytes(fields: &[Vec<u8>]) -> Vec<u8> {
    fields.concat()
}

/// Stratus: one object per record in table `usertable`; an update reads the record and writes
/// it back with field i replaced, conditional on the version read (retried on a race).
struct StratusDatabase {
    client: BlockingClient,
    table: TableId,
}

impl Database for StratusDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        self.client
            .write(self.table, key.as_bytes(), &record_bytes(fields), RejectRules::NONE)
            .map_err(|error| format!("stratus write: {error:?}"))?;
        Ok(Outcome::Ok)
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        match self.client.read(self.table, key.as_bytes(), RejectRules::NONE) {
            Ok(_) => Ok(Outcome::Ok),
            Err(error) if error.status == Status::ObjectDoesntExist => Ok(Outcome::NotFound),
            Err(error) => Err(format!("stratus read: {error:?}")),
        }
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        for _ in 0..CONDITIONAL_WRITE_ATTEMPTS {
            let (current, version) =
                match self.client.read(self.table, key.as_bytes(), RejectRules::NONE) {
                    Ok(found) => found,
                    Err(error) if error.status == Status::ObjectDoesntExist => {
                        return Ok(Outcome::NotFound)
                    }
                    Err(error) => return Err(format!("stratus read: {error:?}")),
                };
            let mut record = current.to_vec();
            let range = field * FIELD_LENGTH..(field + 1) * FIELD_LENGTH;
            if record.len() < range.end {
                return Err(format!("stratus record {key} has {} bytes", record.len()));
            }
            record[range].copy_from_slice(value);
            match self.client.write(
                self.table,
                key.as_bytes(),
                &record,
                RejectRules::version_equals(version),
            ) {
                Ok(_) => return Ok(Outcome::Ok),
                Err(error) if error.status == Status::WrongVersion => continue,
                Err(error) if error.status == Status::ObjectDoesntExist => {
                    return Ok(Outcome::NotFound)
                }
                Err(error) => return Err(format!("stratus write: {error:?}")),
            }
        }
        Err(format!(
            "stratus update of {key}: {CONDITIONAL_WRITE_ATTEMPTS} conditional writes lost races"
        ))
    }

    fn scan(&mut self, _start_key: &str, _count: u64) -> Result<Outcome, String> {
        Err(STRATUS_NO_SCAN.into())
    }
}

const STRATUS_NO_SCAN: &str = "Stratus has no ordered scan: a table is enumerated in \
    bit-reversed key-hash order from its beginning, with no way to start at a key, and the \
    client has no ordered index; workload E (scans in key order from a start key) is skipped";
const MEMCACHED_NO_SCAN: &str = "memcached has no ordering and no enumeration in its protocol \
    (YCSB's memcached binding returns NOT_IMPLEMENTED for scan); workload E is skipped";

/// A RESP2 reply.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:...`
    Integer(i64),
    /// `$...` (None: null bulk).
    Bulk(Option<Vec<u8>>),
    /// `*...` (None: null array).
    Array(Option<Vec<Reply>>),
}

/// Reads one RESP2 reply.
pub fn read_reply(reader: &mut impl BufRead) -> Result<Reply, String> {
    let mut line = String::new();
    let bytes = reader.read_line(&mut line).map_err(|error| format!("reading a reply: {error}"))?;
    if bytes == 0 {
        return Err("the server closed the connection".into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    let number = || rest.parse::<i64>().map_err(|_| format!("malformed reply line {line:?}"));
    match kind {
        "+" => Ok(Reply::Simple(rest.into())),
        "-" => Ok(Reply::Error(rest.into())),
        ":" => Ok(Reply::Integer(number()?)),
        "$" => {
            let length = number()?;
            if length < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut data = vec![0; length as usize + 2];
            reader
                .read_exact(&mut data)
                .map_err(|error| format!("reading a bulk reply: {error}"))?;
            data.truncate(length as usize);
            Ok(Reply::Bulk(Some(data)))
        }
        "*" => {
            let length = number()?;
            if length < 0 {
                return Ok(Reply::Array(None));
            }
            let items = (0..length).map(|_| read_reply(reader)).collect::<Result<Vec<_>, _>>()?;
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(format!("malformed reply line {line:?}")),
    }
}

/// Redis with YCSB's redis binding's mapping: a record is a hash (fields field0..field9);
/// insert = HSET of all fields + `ZADD _indices <String.hashCode(key)> key`; read = HGETALL;
/// update = HSET of one field; scan = `ZRANGEBYSCORE _indices <hash(start)> +inf LIMIT 0 n`
/// then HGETALL of each key.
struct RedisDatabase {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

const REDIS_INDEX_KEY: &[u8] = b"_indices";

impl RedisDatabase {
    fn open(address: &str) -> Result<RedisDatabase, String> {
        let stream = connect(address)?;
        let reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
        Ok(RedisDatabase { reader, writer: stream })
    }

    fn call(&mut self, arguments: &[&[u8]]) -> Result<Reply, String> {
        self.writer
            .write_all(&encode_command(arguments))
            .map_err(|error| format!("sending to redis: {error}"))?;
        match read_reply(&mut self.reader)? {
            Reply::Error(message) => Err(format!("redis: {message}")),
            reply => Ok(reply),
        }
    }

    fn hgetall(&mut self, key: &[u8]) -> Result<Outcome, String> {
        match self.call(&[b"HGETALL", key])? {
            Reply::Array(Some(items)) if items.is_empty() => Ok(Outcome::NotFound),
            Reply::Array(Some(items)) if items.len() == 2 * FIELD_COUNT => Ok(Outcome::Ok),
            reply => Err(format!("unexpected HGETALL reply {reply:?}")),
        }
    }
}

impl Database for RedisDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        let names: Vec<String> = (0..fields.len()).map(|index| format!("field{index}")).collect();
        let mut arguments: Vec<&[u8]> = vec![b"HSET", key.as_bytes()];
        for (name, value) in names.iter().zip(fields) {
            arguments.push(name.as_bytes());
            arguments.push(value);
        }
        self.call(&arguments)?;
        let score = java_string_hash(key).to_string();
        self.call(&[b"ZADD", REDIS_INDEX_KEY, score.as_bytes(), key.as_bytes()])?;
        Ok(Outcome::Ok)
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        self.hgetall(key.as_bytes())
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        let name = format!("field{field}");
        self.call(&[b"HSET", key.as_bytes(), name.as_bytes(), value])?;
        Ok(Outcome::Ok)
    }

    fn scan(&mut self, start_key: &str, count: u64) -> Result<Outcome, String> {
        let score = java_string_hash(start_key).to_string();
        let count = count.to_string();
        let keys = match self.call(&[
            b"ZRANGEBYSCORE",
            REDIS_INDEX_KEY,
            score.as_bytes(),
            b"+inf",
            b"LIMIT",
            b"0",
            count.as_bytes(),
        ])? {
            Reply::Array(Some(items)) => items,
            reply => return Err(format!("unexpected ZRANGEBYSCORE reply {reply:?}")),
        };
        for key in keys {
            let Reply::Bulk(Some(key)) = key else {
                return Err("unexpected ZRANGEBYSCORE item".into());
            };
            self.hgetall(&key)?;
        }
        Ok(Outcome::Ok)
    }
}

/// memcached with one object per record (key `usertable-<key>` as YCSB's binding qualifies
/// it), the 10 fields concatenated; insert = `add`; read = `get`; update = `gets` + `cas` of
/// the whole record with one field replaced (YCSB's binding instead `replace`s the record with
/// only the updated field, losing the other nine: we keep the record whole).
struct MemcachedDatabase {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl MemcachedDatabase {
    fn open(address: &str) -> Result<MemcachedDatabase, String> {
        let stream = connect(address)?;
        let reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
        Ok(MemcachedDatabase { reader, writer: stream })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        let bytes = self
            .reader
            .read_line(&mut line)
            .map_err(|error| format!("reading from memcached: {error}"))?;
        if bytes == 0 {
            return Err("memcached closed the connection".into());
        }
        Ok(line.trim_end().to_string())
    }

    /// `get`/`gets` of one key: the value and its CAS unique (0 for `get`), if present.
    fn fetch(&mut self, command: &str, key: &str) -> Result<Option<(Vec<u8>, u64)>, String> {
        self.writer
            .write_all(format!("{command} usertable-{key}\r\n").as_bytes())
            .map_err(|error| format!("sending to memcached: {error}"))?;
        let header = self.line()?;
        if header == "END" {
            return Ok(None);
        }
        let parts: Vec<&str> = header.split(' ').collect();
        if parts.first() != Some(&"VALUE") || parts.len() < 4 {
            return Err(format!("unexpected memcached reply {header:?}"));
        }
        let length: usize = parts[3].parse().map_err(|_| format!("bad length in {header:?}"))?;
        let unique: u64 = parts.get(4).and_then(|text| text.parse().ok()).unwrap_or(0);
        let mut data = vec![0; length + 2];
        self.reader
            .read_exact(&mut data)
            .map_err(|error| format!("reading from memcached: {error}"))?;
        data.truncate(length);
        let end = self.line()?;
        if end != "END" {
            return Err(format!("unexpected memcached reply {end:?}"));
        }
        Ok(Some((data, unique)))
    }

    /// A storage command; returns the reply line.
    fn store(
        &mut self,
        command: &str,
        key: &str,
        data: &[u8],
        unique: Option<u64>,
    ) -> Result<String, String> {
        let mut request = format!("{command} usertable-{key} 0 0 {}", data.len());
        if let Some(unique) = unique {
            let _ = write!(request, " {unique}");
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(data);
        bytes.extend_from_slice(b"\r\n");
        self.writer.write_all(&bytes).map_err(|error| format!("sending to memcached: {error}"))?;
        self.line()
    }
}

impl Database for MemcachedDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        match self.store("add", key, &record_bytes(fields), None)?.as_str() {
            "STORED" => Ok(Outcome::Ok),
            reply => Err(format!("memcached add of {key}: {reply}")),
        }
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        Ok(if self.fetch("get", key)?.is_some() { Outcome::Ok } else { Outcome::NotFound })
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        for _ in 0..CONDITIONAL_WRITE_ATTEMPTS {
            let Some((mut record, unique)) = self.fetch("gets", key)? else {
                return Ok(Outcome::NotFound);
            };
            let range = field * FIELD_LENGTH..(field + 1) * FIELD_LENGTH;
            if record.len() < range.end {
                return Err(format!("memcached record {key} has {} bytes", record.len()));
            }
            record[range].copy_from_slice(value);
            match self.store("cas", key, &record, Some(unique))?.as_str() {
                "STORED" => return Ok(Outcome::Ok),
                "EXISTS" => continue,
                "NOT_FOUND" => return Ok(Outcome::NotFound),
                reply => return Err(format!("memcached cas of {key}: {reply}")),
            }
        }
        Err(format!(
            "memcached update of {key}: {CONDITIONAL_WRITE_ATTEMPTS} cas attempts lost races"
        ))
    }

    fn scan(&mut self, _start_key: &str, _count: u64) -> Result<Outcome, String> {
        Err(MEMCACHED_NO_SCAN.into())
    }
}

/// A running system configuration: its processes (stopped on drop) and how to connect.
enum Running {
    Stratus { _cluster: ChildProcess, coordinator: String, table: TableId },
    Redis { _server: ChildProcess, address: String },
    Memcached { _server: ChildProcess, address: String },
}

impl Running {
    fn connect(&self) -> Result<Box<dyn Database>, String> {
        match self {
            Running::Stratus { coordinator, table, .. } => {
                let client = BlockingClient::new(ClientConfig::new(coordinator.clone()))
                    .map_err(|error| format!("stratus client: {error:?}"))?;
                Ok(Box::new(StratusDatabase { client, table: *table }))
            }
            Running::Redis { address, .. } => Ok(Box::new(RedisDatabase::open(address)?)),
            Running::Memcached { address, .. } => Ok(Box::new(MemcachedDatabase::open(address)?)),
        }
    }
}

/// A configuration to measure.
#[derive(Clone, Debug)]
struct Configuration {
    system: &'static str,
    name: &'static str,
}

/// The documented configurations of each system.
fn configurations(system: &str) -> Result<Vec<Configuration>, String> {
    let names: &[&'static str] = match system {
        "stratus" => &["r0", "r3-buffered", "r3-fsync"],
        "redis" => &["everysec", "always"],
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

const START_PATIENCE: Duration = Duration::from_secs(60);

fn start(
    configuration: &Configuration,
    arguments: &YcsbArguments,
    directory: &Path,
) -> Result<Running, String> {
    match configuration.system {
        "stratus" => {
            let (replicas, durability) = match configuration.name {
                "r0" => ("0", "buffered"),
                "r3-buffered" => ("3", "buffered"),
                _ => ("3", "fsync"),
            };
            if replicas == "3" && arguments.stratus_servers < 4 {
                return Err("Stratus with 3 replicas needs --stratus-servers 4 or more".into());
            }
            let cluster = start_local_cluster(
                directory,
                arguments.stratus_servers,
                &["--log-mib", "256", "--replicas", replicas, "--durability", durability],
                None,
            )?;
            let coordinator = cluster.coordinator.clone();
            let client = BlockingClient::new(ClientConfig::new(coordinator.clone()))
                .map_err(|error| format!("stratus client: {error:?}"))?;
            let table = client
                .create_table("usertable", arguments.stratus_servers)
                .map_err(|error| format!("creating usertable: {error:?}"))?;
            Ok(Running::Stratus { _cluster: cluster.process, coordinator, table })
        }
        "redis" => {
            let (mut command, address, port) = peer_command("redis-server", directory)?;
            command
                .args(["--port", &port, "--bind", "127.0.0.1", "--daemonize", "no", "--save", ""])
                .args(["--appendonly", "yes", "--appendfsync", configuration.name])
                .arg("--dir")
                .arg(directory);
            let server = ChildProcess::spawn(&mut command, "redis-server")?;
            wait_until_answering(&address, b"*1\r\n$4\r\nPING\r\n", "+PONG")?;
            Ok(Running::Redis { _server: server, address })
        }
        _ => {
            // Enough memory that no record is evicted (the default 64 MB would evict above
            // ~50,000 records).
            let megabytes = (arguments.records * 4 / 1_000).max(64);
            let (server, address) = start_memcached(directory, megabytes)?;
            Ok(Running::Memcached { _server: server, address })
        }
    }
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

// ---------------------------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------------------------

/// Seeds of the driver threads (fixed: runs are repeatable in their choices).
const SEED: u64 = 0x5943_5342;

/// The load phase: `records` inserts of key numbers 0.. by `threads` threads.
fn load(running: &Running, arguments: &YcsbArguments) -> Result<PhaseResult, String> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let measurements = in_threads(arguments.threads, |thread| {
        let mut database = running.connect()?;
        let mut random = Random::new(SEED ^ (u64::from(thread) << 32) ^ 0x10ad);
        let mut measurements = Measurements::default();
        loop {
            let keynum = next.fetch_add(1, Ordering::Relaxed);
            if keynum >= arguments.records {
                return Ok(measurements);
            }
            let fields: Vec<Vec<u8>> =
                (0..FIELD_COUNT).map(|_| random_field(&mut random)).collect();
            let key = key_name(keynum);
            let begin = Instant::now();
            let outcome = database.insert(&key, &fields)?;
            let elapsed = begin.elapsed();
            measurements.record(Operation::Insert, elapsed, elapsed, outcome);
        }
    })?;
    Ok(PhaseResult { runtime: started.elapsed(), operations: arguments.records, measurements })
}

/// The run phase: `operations` transactions of `workload` by `threads` threads.
fn run_phase(
    running: &Running,
    arguments: &YcsbArguments,
    workload: Workload,
) -> Result<PhaseResult, String> {
    let records = arguments.records;
    let insert_proportion = workload.insert;
    // CoreWorkload: the zipfian key space includes the inserts expected during the run
    // (operationcount × insertproportion × 2); keys not inserted yet are drawn again.
    let expected_new_keys = (arguments.operations as f64 * insert_proportion * 2.0) as i64;
    let counter = Arc::new(AcknowledgedCounter::new(records));
    let threads = u64::from(arguments.threads);
    let tick = arguments.target.map(|target| Duration::from_secs_f64(threads as f64 / target));
    let started = Instant::now();
    let measurements = in_threads(arguments.threads, |thread| {
        let thread = u64::from(thread);
        let mut database = running.connect()?;
        let mut random = Random::new(SEED ^ (thread << 32));
        let mut zipfian = ScrambledZipfian::new(0, records as i64 + expected_new_keys);
        let mut latest = SkewedLatest::new(counter.last_value());
        let mut measurements = Measurements::default();
        let count =
            arguments.operations / threads + u64::from(thread < arguments.operations % threads);
        let thread_start = Instant::now();
        for index in 0..count {
            // With a target, each thread runs on its own schedule (YCSB's per-thread
            // throttle); latency from the intended start corrects coordinated omission.
            let intended = match tick {
                Some(tick) => {
                    let intended = thread_start + tick.mul_f64(index as f64);
                    let now = Instant::now();
                    if intended > now {
                        std::thread::sleep(intended - now);
                    }
                    intended
                }
                None => Instant::now(),
            };
            let mut next_key = |random: &mut Random| loop {
                let last = counter.last_value();
                let keynum = if workload.latest {
                    latest.next_value(last, random)
                } else {
                    zipfian.next_value(random) as u64
                };
                if keynum <= last {
                    return keynum;
                }
            };
            match workload.choose(&mut random) {
                Operation::Read => {
                    let key = key_name(next_key(&mut random));
                    let begin = Instant::now();
                    let outcome = database.read(&key)?;
                    let end = Instant::now();
                    measurements.record(Operation::Read, end - begin, end - intended, outcome);
                }
                Operation::Update => {
                    let key = key_name(next_key(&mut random));
                    let field = random.uniform(0, FIELD_COUNT as u64 - 1) as usize;
                    let value = random_field(&mut random);
                    let begin = Instant::now();
                    let outcome = database.update(&key, field, &value)?;
                    let end = Instant::now();
                    measurements.record(Operation::Update, end - begin, end - intended, outcome);
                }
                Operation::Insert => {
                    let keynum = counter.next_value();
                    let key = key_name(keynum);
                    let fields: Vec<Vec<u8>> =
                        (0..FIELD_COUNT).map(|_| random_field(&mut random)).collect();
                    let begin = Instant::now();
                    let outcome = database.insert(&key, &fields)?;
                    let end = Instant::now();
                    counter.acknowledge(keynum);
                    measurements.record(Operation::Insert, end - begin, end - intended, outcome);
                }
                Operation::Scan => {
                    let key = key_name(next_key(&mut random));
                    let length = random.uniform(1, MAX_SCAN_LENGTH);
                    let begin = Instant::now();
                    let outcome = database.scan(&key, length)?;
                    let end = Instant::now();
                    measurements.record(Operation::Scan, end - begin, end - intended, outcome);
                }
                Operation::ReadModifyWrite => {
                    let key = key_name(next_key(&mut random));
                    let field = random.uniform(0, FIELD_COUNT as u64 - 1) as usize;
                    let value = random_field(&mut random);
                    let begin = Instant::now();
                    let read = database.read(&key)?;
                    let read_end = Instant::now();
                    measurements.record(
                        Operation::Read,
                        read_end - begin,
                        read_end - intended,
                        read,
                    );
                    let update = database.update(&key, field, &value)?;
                    let end = Instant::now();
                    measurements.record(Operation::Update, end - read_end, end - intended, update);
                    let outcome = if read == Outcome::Ok && update == Outcome::Ok {
                        Outcome::Ok
                    } else {
                        Outcome::NotFound
                    };
                    measurements.record(
                        Operation::ReadModifyWrite,
                        end - begin,
                        end - intended,
                        outcome,
                    );
                }
            }
        }
        Ok(measurements)
    })?;
    Ok(PhaseResult { runtime: started.elapsed(), operations: arguments.operations, measurements })
}

/// Runs `body(thread)` on `threads` scoped threads and merges their measurements.
fn in_threads(
    threads: u32,
    body: impl Fn(u32) -> Result<Measurements, String> + Sync,
) -> Result<Measurements, String> {
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..threads.max(1)).map(|thread| scope.spawn(move || body(thread))).collect();
        let mut merged = Measurements::default();
        let mut first_error = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(measurements)) => merged.merge(measurements),
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(_) => {
                    first_error.get_or_insert("a driver thread panicked".into());
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(merged),
        }
    })
}

/// Runs the benchmark.
pub fn run(arguments: YcsbArguments) -> Result<(), String> {
    let name = arguments.workload.chars().next().unwrap_or('a');
    let workload = Workload::core(name).ok_or_else(|| format!("unknown workload {name:?}"))?;
    if arguments.records == 0 || arguments.threads == 0 {
        return Err("--records and --threads must be at least 1".into());
    }
    if let Some(target) = arguments.target {
        if !(target > 0.0 && target.is_finite()) {
            return Err("--target must be a positive number of operations per second".into());
        }
    }
    let mut selected = Vec::new();
    for system in &arguments.systems {
        for configuration in configurations(system.trim())? {
            if arguments.configs.is_empty()
                || arguments.configs.iter().any(|name| name == configuration.name)
            {
                selected.push(configuration);
            }
        }
    }
    if selected.is_empty() {
        return Err("no configuration selected (see --systems and --configs)".into());
    }
    for configuration in &selected {
        if workload.scan > 0.0 && configuration.system != "redis" {
            let why =
                if configuration.system == "stratus" { STRATUS_NO_SCAN } else { MEMCACHED_NO_SCAN };
            println!(
                "# ycsb skipped workload=e system={} config={}: {why}",
                configuration.system, configuration.name
            );
            print_json(&[
                ("bench", Field::Text("ycsb".into())),
                ("workload", Field::Text(workload.name.to_string())),
                ("system", Field::Text(configuration.system.into())),
                ("config", Field::Text(configuration.name.into())),
                ("skipped", Field::Text(why.into())),
            ]);
            continue;
        }
        let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
        let running = start(configuration, &arguments, directory.path())
            .map_err(|error| format!("{} {}: {error}", configuration.system, configuration.name))?;
        let mut label = RunLabel {
            phase: "load",
            workload: workload.name,
            system: configuration.system,
            config: configuration.name,
            threads: arguments.threads,
            records: arguments.records,
            target: arguments.target,
        };
        let loaded = load(&running, &arguments).map_err(|error| {
            format!("{} {} load: {error}", configuration.system, configuration.name)
        })?;
        report_phase(&label, &loaded);
        let ran = run_phase(&running, &arguments, workload).map_err(|error| {
            format!("{} {} run: {error}", configuration.system, configuration.name)
        })?;
        label.phase = "run";
        report_phase(&label, &ran);
        drop(running);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_hash_matches_ycsb() {
        // Values of YCSB's Utils.fnvhash64 (Java), computed independently.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv_hash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv_hash64(2), 1_820_151_046_732_198_393);
        assert_eq!(fnv_hash64(1_000), 5_952_875_239_596_136_740);
        assert_eq!(fnv_hash64(-1), 8_289_690_350_564_177_859);
        // The key YCSB's documentation shows for the first record.
        assert_eq!(key_name(0), "user6284781860667377211");
    }

    #[test]
    fn java_string_hash_matches_java() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // Overflows wrap like Java's int.
        assert_eq!(java_string_hash("user6284781860667377211"), {
            let mut hash = 0_i32;
            for byte in "user6284781860667377211".bytes() {
                hash = hash.wrapping_mul(31).wrapping_add(i32::from(byte));
            }
            hash
        });
    }

    #[test]
    fn zipfian_most_popular_item_has_the_predicted_frequency() {
        // Plain zipfian over N items: P(item 0) = 1 / ζ(N, θ).
        let items = 1_000;
        let mut zipfian = Zipfian::new(0, items - 1);
        let mut random = Random::new(7);
        let draws = 200_000;
        let mut counts = vec![0_u64; items as usize];
        for _ in 0..draws {
            let value = zipfian.next_value(&mut random);
            assert!((0..items).contains(&value), "{value}");
            counts[value as usize] += 1;
        }
        let expected = 1.0 / zeta_from(0, items, ZIPFIAN_CONSTANT, 0.0);
        let observed = counts[0] as f64 / draws as f64;
        // Five binomial standard deviations.
        let tolerance = 5.0 * (expected * (1.0 - expected) / draws as f64).sqrt();
        assert!((observed - expected).abs() < tolerance, "{observed} vs {expected}");
        // Rank 1 next: P = 0.5^θ / ζ.
        let expected_second = 0.5_f64.powf(ZIPFIAN_CONSTANT) * expected;
        let observed_second = counts[1] as f64 / draws as f64;
        let tolerance_second =
            5.0 * (expected_second * (1.0 - expected_second) / draws as f64).sqrt();
        assert!((observed_second - expected_second).abs() < tolerance_second);
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn scrambled_zipfian_scatters_the_hot_key_and_stays_in_range() {
        let (min, max) = (100_i64, 10_099_i64);
        let mut generator = ScrambledZipfian::new(min, max);
        let mut random = Random::new(11);
        let draws = 200_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..draws {
            let value = generator.next_value(&mut random);
            assert!((min..=max).contains(&value), "{value}");
            *counts.entry(value).or_insert(0_u64) += 1;
        }
        // Rank 0 has probability 1 / ζ(10^10) and lands on min + fnv(0) % count; other ranks
        // add about 1 / count of the rest on average.
        let hot = min + fnv_hash64(0) % (max - min + 1);
        let (&most_popular, _) = counts.iter().max_by_key(|(_, count)| **count).unwrap();
        assert_eq!(most_popular, hot);
        let expected = 1.0 / SCRAMBLED_ZETAN;
        let observed = counts[&hot] as f64 / draws as f64;
        let tolerance = 5.0 * (expected / draws as f64).sqrt() + 2.0 / (max - min + 1) as f64;
        assert!((observed - expected).abs() < tolerance, "{observed} vs {expected}");
    }

    #[test]
    fn latest_favours_recent_inserts() {
        let counter = AcknowledgedCounter::new(1_000);
        assert_eq!(counter.last_value(), 999);
        let mut latest = SkewedLatest::new(counter.last_value());
        let mut random = Random::new(3);
        let draws = 100_000;
        let mut newest = 0;
        let mut recent = 0;
        for _ in 0..draws {
            let value = latest.next_value(counter.last_value(), &mut random);
            assert!(value <= 999);
            newest += u64::from(value == 999);
            recent += u64::from(value >= 900);
        }
        let expected = 1.0 / zeta_from(0, 999, ZIPFIAN_CONSTANT, 0.0);
        let observed = newest as f64 / draws as f64;
        assert!((observed - expected).abs() < 5.0 * (expected / draws as f64).sqrt(), "{observed}");
        // The newest tenth of the keys gets most of the requests.
        assert!(recent as f64 / draws as f64 > 0.5, "{recent}");

        // Inserts acknowledged out of order move the limit only when contiguous.
        let first = counter.next_value();
        let second = counter.next_value();
        counter.acknowledge(second);
        assert_eq!(counter.last_value(), 999);
        counter.acknowledge(first);
        assert_eq!(counter.last_value(), 1_001);
        let mut at_newest = 0;
        for _ in 0..10_000 {
            at_newest += u64::from(latest.next_value(counter.last_value(), &mut random) == 1_001);
        }
        assert!(at_newest > 10_000 / 20, "{at_newest}");
    }

    #[test]
    fn operation_mix_follows_the_workload() {
        let workload = Workload::core('b').unwrap();
        let mut random = Random::new(5);
        let updates =
            (0..100_000).filter(|_| workload.choose(&mut random) == Operation::Update).count();
        assert!((4_500..5_500).contains(&updates), "{updates}");
        let workload = Workload::core('c').unwrap();
        assert!((0..1_000).all(|_| workload.choose(&mut random) == Operation::Read));
    }

    #[test]
    fn report_renders_like_ycsb() {
        let summaries = [
            Summary {
                name: "READ".into(),
                operations: 3,
                average_us: 20.0,
                min_us: 10,
                max_us: 30,
                p50_us: 20,
                p95_us: 30,
                p99_us: 30,
                p999_us: 30,
                returns: vec![("OK".into(), 2), ("NOT_FOUND".into(), 1)],
            },
            Summary {
                name: "Intended-UPDATE".into(),
                operations: 1,
                average_us: 1_234.5,
                min_us: 1_234,
                max_us: 1_234,
                p50_us: 1_234,
                p95_us: 1_234,
                p99_us: 1_234,
                p999_us: 1_234,
                returns: vec![("OK".into(), 1)],
            },
        ];
        let expected = "\
[OVERALL], RunTime(ms), 1500
[OVERALL], Throughput(ops/sec), 2.667
[READ], Operations, 3
[READ], AverageLatency(us), 20.000
[READ], MinLatency(us), 10
[READ], MaxLatency(us), 30
[READ], 50thPercentileLatency(us), 20
[READ], 95thPercentileLatency(us), 30
[READ], 99thPercentileLatency(us), 30
[READ], 99.9thPercentileLatency(us), 30
[READ], Return=OK, 2
[READ], Return=NOT_FOUND, 1
[Intended-UPDATE], Operations, 1
[Intended-UPDATE], AverageLatency(us), 1234.500
[Intended-UPDATE], MinLatency(us), 1234
[Intended-UPDATE], MaxLatency(us), 1234
[Intended-UPDATE], 50thPercentileLatency(us), 1234
[Intended-UPDATE], 95thPercentileLatency(us), 1234
[Intended-UPDATE], 99thPercentileLatency(us), 1234
[Intended-UPDATE], 99.9thPercentileLatency(us), 1234
[Intended-UPDATE], Return=OK, 1
";
        assert_eq!(render_report(Duration::from_millis(1_500), 4, &summaries), expected);
    }

    #[test]
    fn summaries_come_from_the_histograms() {
        let mut measurements = Measurements::default();
        for micros in [100_u64, 200, 300, 400] {
            let service = Duration::from_micros(micros);
            measurements.record(Operation::Read, service, service * 3, Outcome::Ok);
        }
        let histograms = &measurements.operations[&Operation::Read];
        let summary = Summary::of("READ".into(), &histograms.service, &histograms.outcomes);
        assert_eq!(summary.operations, 4);
        assert_eq!((summary.min_us, summary.p50_us, summary.max_us), (100, 200, 400));
        assert_eq!(summary.returns, vec![("OK".to_string(), 4)]);
        let intended =
            Summary::of("Intended-READ".into(), &histograms.intended, &histograms.outcomes);
        assert_eq!((intended.min_us, intended.max_us), (300, 1_200));
    }

    #[test]
    fn resp_replies_parse() {
        let mut input: &[u8] = b"*2\r\n$3\r\nfoo\r\n$-1\r\n:7\r\n+OK\r\n-ERR no\r\n*0\r\n";
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Array(Some(vec![Reply::Bulk(Some(b"foo".to_vec())), Reply::Bulk(None)]))
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Integer(7));
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Array(Some(vec![])));
        assert!(read_reply(&mut input).is_err());
    }
}
