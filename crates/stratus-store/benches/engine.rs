//! Micro-benchmarks of the storage engine, each against plain memcpy bandwidth measured in the
//! same run (issue 3): hash lookups, log appends, compaction and combined cleaning, in MB/s.
//!
//! Run: `cargo bench -p stratus-store --bench engine` (well under two minutes on two cores).
//! `cargo test -p stratus-store --benches` runs every benchmark once, as a test.
//!
//! The `memcpy` group is the physical reference: what copying the same bytes costs on this
//! machine, measured between the same runs of the engine so that a busy or throttled machine
//! shows in both. Three sizes bracket what the engine moves: 100-byte copies (one object, the
//! size hash lookups and appends handle), a 1 MiB copy (one segment, inside the L2 cache) and a
//! 64 MiB copy (the whole log, larger than the L3 cache, so memory bandwidth).
//!
//! Every throughput is in bytes of data moved, decimal MB/s (criterion's `BytesDecimal`):
//! - `hash_lookup`: value bytes read by `ObjectStore::read` of random existing objects;
//! - `log_append`: bytes of the log entries `ObjectStore::write` appends (the object, and for
//!   an overwrite its tombstone); segment headers and digests are not counted;
//! - `compaction`, `combined_cleaning`: bytes of live entries the cleaner moved, from its own
//!   counters, out of a replicated store (two-level cleaning) whose oldest segments are half
//!   dead. One iteration is one `compact_now` call (one segment) or one `clean_combined_now`
//!   pass (as many segments as its budget allows). Criterion needs the bytes of an iteration
//!   before it runs, but not every unit moves the same amount (the last segment of the fill
//!   differs): they are set from a calibration run, and each measured time is scaled by the
//!   bytes declared over the bytes actually moved, so the MB/s criterion prints are exactly
//!   bytes moved over time taken (and its "time" is the time to move the calibrated bytes).
//!
//! Building stores (filling the log, making segments half dead) is never timed. After the
//! criterion output, a summary gives every benchmark's MB/s (total bytes over total time of all
//! its timed iterations, warm-up included, so it may differ slightly from criterion's
//! estimates) and its ratio to each memcpy size.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, SamplingMode, Throughput};
use stratus_env::SplitMix64;
use stratus_store::{
    CleanOutcome, CleanerConfig, Expiry, ObjectStore, StoreConfig, StoreStatistics, WallTime,
};
use stratus_types::{key_hash, RejectRules, ServerId, TableId};

const TABLE: TableId = TableId(1);
const NOW_SECONDS: u32 = 1_700_000_000;
/// Object size of every engine benchmark (RAMCloud's standard small object).
const VALUE_BYTES: usize = 100;
/// Larger than the 32 MiB L3 cache of the machine this was written on, so the log is read
/// from memory; small enough to fill in a fraction of a second.
const LOG_BYTES: u64 = 64 << 20;
/// Small segments and seglets: many segments to clean in a small log, and compaction can free
/// memory in 16 KiB steps (the sizes `stratus bench utilization` uses).
const SEGMENT_BYTES: u32 = 1 << 20;
const SEGLET_BYTES: u32 = 16 << 10;
/// Live objects fill this share of the log for lookups and overwrites ("half full").
const LOOKUP_FILL_PERCENT: u64 = 50;
/// Live objects of the cleaning benchmarks before half of them are overwritten: the old
/// segments end half dead, and the log (old segments, new objects and tombstones) stays below
/// about 70 % allocated, leaving the combined cleaner room for its survivors.
const CLEANING_FILL_PERCENT: u64 = 40;
/// Appends stop at this share of the log allocated and the store is rebuilt (untimed), so a
/// write never meets the reserves and fails with `LogFull`.
const APPEND_ALLOCATED_PERCENT_MAX: u64 = 80;
/// The write loops check the fill level every this many writes (statistics take locks).
const WRITES_BETWEEN_CHECKS: u64 = 1024;

/// Measurement time of the cleaning groups: one combined pass, with the store it needs built,
/// takes about 0.1 s, and criterion wants at least ten samples.
const CLEANING_MEASUREMENT_TIME: Duration = Duration::from_secs(2);

/// memcpy sizes (see the header comment).
const OBJECT_COPY_BYTES: usize = VALUE_BYTES;
const SEGMENT_COPY_BYTES: usize = SEGMENT_BYTES as usize;
const LOG_COPY_BYTES: usize = LOG_BYTES as usize;
/// Source walked by the 100-byte copies: one segment, so they hit the cache like a log read of
/// a recently used object does.
const OBJECT_COPY_SOURCE_BYTES: usize = SEGMENT_COPY_BYTES;

/// Every benchmark's timed bytes and time, for the summary.
static LEDGER: Mutex<Vec<LedgerLine>> = Mutex::new(Vec::new());

#[derive(Debug, Clone)]
struct LedgerLine {
    benchmark: String,
    bytes: u64,
    elapsed: Duration,
}

/// Adds timed work of `benchmark` to the ledger.
fn record(benchmark: &str, bytes: u64, elapsed: Duration) {
    let mut ledger = LEDGER.lock().expect("ledger poisoned");
    match ledger.iter_mut().find(|line| line.benchmark == benchmark) {
        Some(line) => {
            line.bytes += bytes;
            line.elapsed += elapsed;
        }
        None => ledger.push(LedgerLine { benchmark: benchmark.to_string(), bytes, elapsed }),
    }
}

/// The 8-byte key of object `index`.
fn key_of(index: u64) -> [u8; 8] {
    index.to_le_bytes()
}

/// The value of object `index` (its bytes do not matter, only its size).
fn value_of(index: u64) -> [u8; VALUE_BYTES] {
    [index as u8; VALUE_BYTES]
}

fn write(store: &ObjectStore, index: u64) {
    let key = key_of(index);
    store
        .write(
            TABLE,
            &key,
            key_hash(TABLE, &key),
            &value_of(index),
            &RejectRules::NONE,
            Expiry::Never,
            WallTime::from_seconds(NOW_SECONDS),
        )
        .expect("write failed: the benchmark filled the log too far");
}

/// A store of [`LOG_BYTES`]; `replicas` > 0 gives two-level cleaning (compaction, then
/// combined cleaning), as on a replicated server. Memory is touched now (prefault), so page
/// faults are not timed.
fn new_store(replicas: u32) -> ObjectStore {
    let config = StoreConfig {
        segment_bytes: SEGMENT_BYTES,
        seglet_bytes: SEGLET_BYTES,
        value_bytes_max: SEGMENT_BYTES / 8,
        cleaner: CleanerConfig { replicas, ..CleanerConfig::default() },
        prefault_memory: true,
        flash_image_bytes: 0,
        ..StoreConfig::with_log_bytes(LOG_BYTES)
    };
    ObjectStore::new(config, ServerId(1)).expect("benchmark store configuration")
}

/// Writes objects 0, 1, 2, ... until live objects take `percent` of the log; returns how many.
fn fill(store: &ObjectStore, percent: u64) -> u64 {
    let target_bytes = LOG_BYTES * percent / 100;
    let mut count = 0;
    while store.statistics().log_bytes_live_objects < target_bytes {
        for _ in 0..WRITES_BETWEEN_CHECKS {
            write(store, count);
            count += 1;
        }
    }
    count
}

fn allocated_percent(statistics: &StoreStatistics) -> u64 {
    statistics.log_bytes_allocated * 100 / statistics.log_bytes_total
}

/// Times `iterations` runs of `copy`, for the memcpy group.
fn time_copies(iterations: u64, mut copy: impl FnMut(u64)) -> Duration {
    let start = Instant::now();
    for iteration in 0..iterations {
        copy(iteration);
    }
    start.elapsed()
}

fn bench_memcpy(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("memcpy");
    // Written once so every page is mapped before timing.
    let source: Vec<u8> = (0..LOG_COPY_BYTES).map(|index| index as u8).collect();
    let mut destination = vec![0u8; LOG_COPY_BYTES];

    let name = "memcpy/object_100B";
    group.throughput(Throughput::BytesDecimal(OBJECT_COPY_BYTES as u64));
    group.bench_function("object_100B", |bencher| {
        let mut object = [0u8; OBJECT_COPY_BYTES];
        let copies_per_pass = (OBJECT_COPY_SOURCE_BYTES / OBJECT_COPY_BYTES) as u64;
        bencher.iter_custom(|iterations| {
            let elapsed = time_copies(iterations, |iteration| {
                let offset = (iteration % copies_per_pass) as usize * OBJECT_COPY_BYTES;
                let from = black_box(&source[offset..offset + OBJECT_COPY_BYTES]);
                object.copy_from_slice(from);
                black_box(&mut object);
            });
            record(name, iterations * OBJECT_COPY_BYTES as u64, elapsed);
            elapsed
        });
    });

    for (name, function, bytes) in [
        ("memcpy/segment_1MiB", "segment_1MiB", SEGMENT_COPY_BYTES),
        ("memcpy/log_64MiB", "log_64MiB", LOG_COPY_BYTES),
    ] {
        group.throughput(Throughput::BytesDecimal(bytes as u64));
        group.bench_function(function, |bencher| {
            bencher.iter_custom(|iterations| {
                let elapsed = time_copies(iterations, |_| {
                    destination[..bytes].copy_from_slice(black_box(&source[..bytes]));
                    black_box(&mut destination);
                });
                record(name, iterations * bytes as u64, elapsed);
                elapsed
            });
        });
    }
    group.finish();
}

fn bench_hash_lookup(criterion: &mut Criterion) {
    let store = new_store(0);
    let object_count = fill(&store, LOOKUP_FILL_PERCENT);
    let mut group = criterion.benchmark_group("hash_lookup");
    group.throughput(Throughput::BytesDecimal(VALUE_BYTES as u64));
    group.bench_function("read_100B_random", |bencher| {
        let mut random = SplitMix64::new(1);
        let mut value = Vec::with_capacity(VALUE_BYTES);
        bencher.iter_custom(|iterations| {
            let start = Instant::now();
            for _ in 0..iterations {
                // The key hash is part of the lookup: a server computes it from the request.
                let key = key_of(random.below(object_count));
                value.clear();
                store
                    .read(
                        TABLE,
                        &key,
                        key_hash(TABLE, &key),
                        &RejectRules::NONE,
                        WallTime::from_seconds(0),
                        &mut value,
                    )
                    .expect("an existing object");
                black_box(&value);
            }
            let elapsed = start.elapsed();
            record("hash_lookup/read_100B_random", iterations * VALUE_BYTES as u64, elapsed);
            elapsed
        });
    });
    group.finish();
}

/// Entry bytes one write appends: (new object, overwrite = object + tombstone), from the
/// store's own counters over a calibration run as large as the benchmark's stores (versions
/// and segment ids, which the entries encode in as few bytes as they need, are as large).
fn calibrate_append_bytes() -> (u64, u64) {
    let store = new_store(0);
    let object_count = fill(&store, LOOKUP_FILL_PERCENT);
    let after_new = store.statistics();
    // A quarter of the objects: overwriting more would fill the log.
    let overwritten: Vec<u64> = (0..object_count).step_by(4).collect();
    for &index in &overwritten {
        write(&store, index);
    }
    let after_overwrite = store.statistics();
    let object_bytes = after_new.log_bytes_live_objects / object_count;
    // Overwrites leave the live object bytes as they were and add one tombstone each.
    let tombstone_bytes = (after_overwrite.log_bytes_tombstones - after_new.log_bytes_tombstones)
        / overwritten.len() as u64;
    (object_bytes, object_bytes + tombstone_bytes)
}

/// A store taking writes, and when to replace it.
#[derive(Debug)]
struct AppendFixture {
    store: ObjectStore,
    /// Objects in the store before the benchmark's writes (0 for new-object writes).
    object_count: u64,
    /// The next new object's index.
    next_index: u64,
}

fn bench_log_append(criterion: &mut Criterion) {
    let (new_object_bytes, overwrite_bytes) = calibrate_append_bytes();
    let mut group = criterion.benchmark_group("log_append");
    for (function, bytes_per_write, prefill_percent) in [
        ("new_100B", new_object_bytes, 0),
        ("overwrite_100B_random", overwrite_bytes, LOOKUP_FILL_PERCENT),
    ] {
        let name = format!("log_append/{function}");
        let build = || {
            let store = new_store(0);
            let object_count = fill(&store, prefill_percent);
            AppendFixture { store, object_count, next_index: object_count }
        };
        let mut fixture = build();
        let mut random = SplitMix64::new(2);
        group.throughput(Throughput::BytesDecimal(bytes_per_write));
        group.bench_function(function, |bencher| {
            bencher.iter_custom(|iterations| {
                let mut elapsed = Duration::ZERO;
                let mut remaining = iterations;
                while remaining > 0 {
                    if allocated_percent(&fixture.store.statistics())
                        >= APPEND_ALLOCATED_PERCENT_MAX
                    {
                        fixture = build();
                    }
                    let batch = remaining.min(WRITES_BETWEEN_CHECKS);
                    let start = Instant::now();
                    for _ in 0..batch {
                        let index = if fixture.object_count == 0 {
                            fixture.next_index += 1;
                            fixture.next_index
                        } else {
                            random.below(fixture.object_count)
                        };
                        write(&fixture.store, index);
                    }
                    elapsed += start.elapsed();
                    remaining -= batch;
                }
                record(&name, iterations * bytes_per_write, elapsed);
                elapsed
            });
        });
    }
    group.finish();
}

/// A unit of cleaning: one compaction or one combined pass.
#[derive(Debug, Clone, Copy)]
enum CleaningUnit {
    Compaction,
    CombinedPass,
}

impl CleaningUnit {
    /// Units run on one half-dead store before it is rebuilt. Compaction takes one segment a
    /// call, all equally dead, until none is worth compacting. The first combined pass takes
    /// as many half-dead segments as its budget allows (ten segments of live data); later
    /// passes clean what is left, then the denser segments of the overwrites, whose
    /// tombstones died with the first pass: a different workload, so only the first counts.
    fn units_per_store(self) -> u64 {
        match self {
            CleaningUnit::Compaction => u64::MAX,
            CleaningUnit::CombinedPass => 1,
        }
    }

    /// Runs one unit; the bytes it moved, or `None` when the store has nothing left to clean.
    fn run(self, store: &ObjectStore) -> Option<(u64, Duration)> {
        let before = store.cleaner_statistics();
        let start = Instant::now();
        let outcome = match self {
            CleaningUnit::Compaction => store.compact_now(WallTime::from_seconds(NOW_SECONDS)),
            CleaningUnit::CombinedPass => {
                store.clean_combined_now(WallTime::from_seconds(NOW_SECONDS))
            }
        };
        let elapsed = start.elapsed();
        let after = store.cleaner_statistics();
        let bytes = match (self, outcome) {
            (CleaningUnit::Compaction, CleanOutcome::Compacted { .. }) => {
                after.bytes_compacted - before.bytes_compacted
            }
            (CleaningUnit::CombinedPass, CleanOutcome::Combined { .. }) => {
                (after.object_bytes_relocated + after.tombstone_bytes_relocated)
                    - (before.object_bytes_relocated + before.tombstone_bytes_relocated)
            }
            _ => return None,
        };
        Some((bytes, elapsed))
    }
}

/// A replicated store (two-level cleaning) whose oldest segments are half dead: objects fill
/// [`CLEANING_FILL_PERCENT`] of the log, then every second one is overwritten.
fn half_dead_store() -> ObjectStore {
    let store = new_store(3);
    let object_count = fill(&store, CLEANING_FILL_PERCENT);
    for index in (0..object_count).step_by(2) {
        write(&store, index);
    }
    store
}

/// A half-dead store and how many more units it may serve.
#[derive(Debug)]
struct CleaningFixture {
    store: ObjectStore,
    units_left: u64,
}

impl CleaningFixture {
    fn new(unit: CleaningUnit) -> CleaningFixture {
        CleaningFixture { store: half_dead_store(), units_left: unit.units_per_store() }
    }

    /// Runs one unit: the bytes it moved and the time it took, or `None` when the store is
    /// used up.
    fn run(&mut self, unit: CleaningUnit) -> Option<(u64, Duration)> {
        if self.units_left == 0 {
            return None;
        }
        self.units_left -= 1;
        unit.run(&self.store)
    }
}

/// Mean bytes one unit moves over a whole half-dead store.
fn calibrate_cleaning_bytes(unit: CleaningUnit) -> u64 {
    let mut fixture = CleaningFixture::new(unit);
    let mut bytes = 0;
    let mut units = 0;
    while let Some((moved, _)) = fixture.run(unit) {
        bytes += moved;
        units += 1;
    }
    assert!(units > 0, "{unit:?}: the half-dead store had nothing to clean");
    bytes / units
}

fn bench_cleaning(criterion: &mut Criterion, group_name: &str, unit: CleaningUnit) {
    let declared_bytes = calibrate_cleaning_bytes(unit);
    let name = format!("{group_name}/half_dead_segments");
    let mut fixture = CleaningFixture::new(unit);
    let mut group = criterion.benchmark_group(group_name);
    // Each iteration is expensive and its setup more so: the same few iterations per sample,
    // and time for ten samples of one combined pass, each on a store built for it.
    group.sampling_mode(SamplingMode::Flat);
    group.measurement_time(CLEANING_MEASUREMENT_TIME);
    group.throughput(Throughput::BytesDecimal(declared_bytes));
    group.bench_function("half_dead_segments", |bencher| {
        bencher.iter_custom(|iterations| {
            let mut moved_bytes = 0;
            let mut elapsed = Duration::ZERO;
            let mut done = 0;
            let mut fresh_fixture = false;
            while done < iterations {
                match fixture.run(unit) {
                    Some((bytes, unit_elapsed)) => {
                        moved_bytes += bytes;
                        elapsed += unit_elapsed;
                        done += 1;
                        fresh_fixture = false;
                    }
                    // A fresh store with nothing to clean would be rebuilt forever.
                    None if fresh_fixture => panic!("{unit:?}: a fresh store had nothing to clean"),
                    // Used up: a fresh half-dead store (untimed).
                    None => {
                        fixture = CleaningFixture::new(unit);
                        fresh_fixture = true;
                    }
                }
            }
            record(&name, moved_bytes, elapsed);
            // Scaled so that declared bytes over the returned time is moved bytes over the
            // time taken (see the header comment).
            if moved_bytes == 0 {
                return elapsed;
            }
            elapsed.mul_f64((declared_bytes * iterations) as f64 / moved_bytes as f64)
        });
    });
    group.finish();
}

fn bench_compaction(criterion: &mut Criterion) {
    bench_cleaning(criterion, "compaction", CleaningUnit::Compaction);
}

fn bench_combined_cleaning(criterion: &mut Criterion) {
    bench_cleaning(criterion, "combined_cleaning", CleaningUnit::CombinedPass);
}

/// Short runs: the whole suite must finish well under two minutes on two cores.
fn short_runs() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .nresamples(10_000)
}

criterion_group! {
    name = engine;
    config = short_runs();
    targets = bench_memcpy, bench_hash_lookup, bench_log_append, bench_compaction,
        bench_combined_cleaning
}

fn megabytes_per_second(line: &LedgerLine) -> f64 {
    line.bytes as f64 / line.elapsed.as_secs_f64().max(f64::MIN_POSITIVE) / 1e6
}

/// Every benchmark's MB/s and its ratio to each memcpy size, from the ledger.
fn print_summary() {
    let ledger = LEDGER.lock().expect("ledger poisoned").clone();
    if ledger.is_empty() {
        return;
    }
    let references: Vec<&LedgerLine> =
        ledger.iter().filter(|line| line.benchmark.starts_with("memcpy/")).collect();
    println!();
    println!("Summary: MB/s over all timed iterations (warm-up included); ratio to each memcpy");
    let mut header = format!("{:<40} {:>12}", "benchmark", "MB/s");
    for reference in &references {
        header.push_str(&format!(" {:>22}", format!("/ {}", reference.benchmark)));
    }
    println!("{header}");
    for line in &ledger {
        let mut row = format!("{:<40} {:>12.1}", line.benchmark, megabytes_per_second(line));
        for reference in &references {
            let ratio = megabytes_per_second(line) / megabytes_per_second(reference);
            row.push_str(&format!(" {ratio:>22.4}"));
        }
        println!("{row}");
    }
}

fn main() {
    engine();
    Criterion::default().configure_from_args().final_summary();
    // `cargo bench` passes `--bench`; without it criterion runs each benchmark once as a test
    // (`cargo test --benches`), and one iteration says nothing about bandwidth.
    if std::env::args().any(|argument| argument == "--bench") {
        print_summary();
    }
}
