//! The YCSB row: workloads B and C on the auto server and on the memory server, after a
//! warm-up, interleaved (each repeat runs both workloads on both servers, the servers' order
//! alternating from one repeat to the next, with the same keys drawn on both), repeated.

use std::time::Duration;

use super::systems::{driver_arguments, AutoFigures, LoadedServer};
use super::{line, Sizes, TieringArguments, HIT_RATIO_GOAL};
use crate::report::{print_json, Field, Percentiles};
use crate::ycsb::driver::run_phase_seeded;
use crate::ycsb::generators::{Random, ScrambledZipfian, Workload, RECORD_LOG_BYTES};
use crate::ycsb::measure::{Measurements, PhaseResult};

/// The throughput ratio auto / memory the issue asks for.
const THROUGHPUT_RATIO_GOAL: f64 = 0.7;
/// The workloads measured.
const WORKLOADS: [char; 2] = ['b', 'c'];
/// Draws of the driver's key chooser that estimate the best hit ratio a DRAM budget allows.
const IDEAL_DRAWS: u64 = 4_000_000;
/// The seed of the warm-up; a measured phase's is this plus its repeat and workload, so no
/// two phases of one server draw the same keys, and both servers draw the same in a repeat.
const SEED: u64 = 0x7469_6572;

/// What the measured phases of one workload on one server added up to.
#[derive(Default)]
struct Totals {
    operations: u64,
    seconds: f64,
    cpu: Duration,
    driver_cpu: Duration,
    /// Every phase's latencies together.
    measurements: Measurements,
    /// Each repeat's throughput.
    ops_per_sec: Vec<f64>,
    /// Auto server only: reads and those from DRAM, and each repeat's hit ratio.
    reads: f64,
    reads_from_dram: f64,
    hit_ratios: Vec<f64>,
    promotions: f64,
    demotions: f64,
}

impl Totals {
    fn ops_per_sec(&self) -> f64 {
        self.operations as f64 / self.seconds.max(1e-9)
    }

    fn cpu_us_per_op(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.operations.max(1) as f64
    }

    fn driver_cpu_us_per_op(&self) -> f64 {
        self.driver_cpu.as_secs_f64() * 1e6 / self.operations.max(1) as f64
    }

    fn hit_ratio(&self) -> Option<f64> {
        (self.reads > 0.0).then(|| self.reads_from_dram / self.reads)
    }
}

/// Runs the row.
pub(super) fn run(
    arguments: &TieringArguments,
    sizes: &Sizes,
    auto: &LoadedServer,
    memory: &LoadedServer,
) -> Result<(), String> {
    let warmup = warm_up(arguments, sizes, [auto, memory])?;
    let measured = driver_arguments(arguments, sizes, arguments.operations);
    // [workload][0: auto, 1: memory]
    let mut totals: Vec<[Totals; 2]> = WORKLOADS.iter().map(|_| Default::default()).collect();
    for repeat in 0..arguments.repeats {
        for (index, &name) in WORKLOADS.iter().enumerate() {
            let workload = Workload::core(name).expect("a core workload");
            let seed = SEED + 1 + u64::from(repeat) * WORKLOADS.len() as u64 + index as u64;
            let order = if repeat % 2 == 0 { [0, 1] } else { [1, 0] };
            for system in order {
                let server = [auto, memory][system];
                let before = AutoFigures::scrape(auto.cluster.server_metrics())?;
                let result = run_phase_seeded(&server.running, &measured, workload, seed)
                    .map_err(|error| format!("workload {name} on {}: {error}", server.tier))?;
                let after = AutoFigures::scrape(auto.cluster.server_metrics())?;
                let totals = &mut totals[index][system];
                report_phase(sizes, name, repeat, server, &result, (&before, &after));
                add_phase(totals, result, (&before, &after), system == 0);
            }
        }
    }
    let capacity = (arguments.auto_dram_mib << 20) / RECORD_LOG_BYTES;
    let ideal = ideal_hit_ratio(sizes.records, capacity);
    for (index, [auto_totals, memory_totals]) in totals.iter().enumerate() {
        let workload = WORKLOADS[index];
        report_workload(arguments, sizes, workload, &warmup, ideal, auto_totals, memory_totals);
    }
    Ok(())
}

/// The hit ratio of an oracle that keeps in DRAM the `capacity` records read most (as many
/// as the budget holds): the share of [`IDEAL_DRAWS`] draws of the driver's key chooser
/// (ScrambledZipfian over the records, a key past the last drawn again, as the driver does)
/// that fall on the `capacity` keys drawn most. YCSB's zipfian draws its ranks from 10^10
/// items and folds them onto the keys, so about half of the reads spread evenly over all keys:
/// no cache of a fifth of the keys serves them. (An estimate: among nearly even keys the most
/// drawn are a little lucky, so it errs high, by about a hundredth.)
fn ideal_hit_ratio(records: u64, capacity: u64) -> f64 {
    let mut zipfian = ScrambledZipfian::new(0, records as i64);
    let mut random = Random::new(SEED ^ IDEAL_DRAWS);
    let mut counts = vec![0u32; records as usize];
    let mut drawn = 0;
    while drawn < IDEAL_DRAWS {
        let keynum = zipfian.next_value(&mut random) as u64;
        if keynum < records {
            counts[keynum as usize] += 1;
            drawn += 1;
        }
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let served: u64 = counts.iter().take(capacity as usize).map(|&count| u64::from(count)).sum();
    served as f64 / IDEAL_DRAWS as f64
}

/// How long each server's load and warm-up took (auto first).
struct Warmup {
    load_seconds: [f64; 2],
    seconds: [f64; 2],
}

/// Workload C on both servers, `--warmup-operations` each: the auto tier promotes what the
/// zipfian reads often before anything is measured.
fn warm_up(
    arguments: &TieringArguments,
    sizes: &Sizes,
    servers: [&LoadedServer; 2],
) -> Result<Warmup, String> {
    let workload = Workload::core('c').expect("workload C");
    let warmup = driver_arguments(arguments, sizes, arguments.warmup_operations.max(1));
    let mut seconds = [0.0; 2];
    for (index, server) in servers.iter().enumerate() {
        let result = run_phase_seeded(&server.running, &warmup, workload, SEED)
            .map_err(|error| format!("warm-up on {}: {error}", server.tier))?;
        seconds[index] = result.runtime.as_secs_f64();
        println!(
            "# tiering: {} warm-up, {} reads in {:.1} s",
            server.tier, arguments.warmup_operations, seconds[index]
        );
    }
    Ok(Warmup { load_seconds: servers.map(|server| server.load_seconds), seconds })
}

fn add_phase(
    totals: &mut Totals,
    result: PhaseResult,
    (before, after): (&AutoFigures, &AutoFigures),
    auto: bool,
) {
    let seconds = result.runtime.as_secs_f64();
    totals.operations += result.operations;
    totals.seconds += seconds;
    totals.cpu += result.cpu.system;
    totals.driver_cpu += result.cpu.driver;
    totals.ops_per_sec.push(result.operations as f64 / seconds.max(1e-9));
    totals.measurements.merge(result.measurements);
    if auto {
        let (reads, hit_ratio) = after.reads_since(before);
        totals.reads += reads;
        totals.reads_from_dram += after.reads_from_dram - before.reads_from_dram;
        totals.hit_ratios.extend(hit_ratio);
        totals.promotions += after.promotions - before.promotions;
        totals.demotions += after.demotions - before.demotions;
    }
}

/// One measured phase's JSON row.
fn report_phase(
    sizes: &Sizes,
    workload: char,
    repeat: u32,
    server: &LoadedServer,
    result: &PhaseResult,
    (before, after): (&AutoFigures, &AutoFigures),
) {
    let percentiles = result.measurements.overall();
    let ops_per_sec = result.operations as f64 / result.runtime.as_secs_f64().max(1e-9);
    let auto = server.tier == "auto";
    let (reads, hit_ratio) = after.reads_since(before);
    let auto_only = |value: f64| if auto { Field::Number(value) } else { Field::Null };
    let mut fields = vec![
        ("bench", Field::Text("tiering".into())),
        ("row", Field::Text("ycsb".into())),
        ("kind", Field::Text("phase".into())),
        ("workload", Field::Text(workload.to_string())),
        ("system", Field::Text(server.tier.into())),
        ("repeat", Field::Number(f64::from(repeat))),
        ("records", Field::Number(sizes.records as f64)),
        ("operations", Field::Number(result.operations as f64)),
        ("ops_per_sec", Field::Number(ops_per_sec)),
        ("p50_us", Field::Number(percentiles.p50_us)),
        ("p99_us", Field::Number(percentiles.p99_us)),
        ("p999_us", Field::Number(percentiles.p999_us)),
        ("dram_hit_ratio", if auto { Field::optional_number(hit_ratio) } else { Field::Null }),
        ("auto_reads", auto_only(reads)),
        ("promotions", auto_only(after.promotions - before.promotions)),
        ("demotions", auto_only(after.demotions - before.demotions)),
    ];
    fields.extend(result.cpu.fields(result.operations));
    print_json(&fields);
}

/// The lowest and highest of `values`.
fn spread(values: &[f64]) -> (f64, f64) {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (low, high)
}

/// A workload's summary: its table lines and JSON row.
fn report_workload(
    arguments: &TieringArguments,
    sizes: &Sizes,
    workload: char,
    warmup: &Warmup,
    ideal_hit_ratio: f64,
    auto: &Totals,
    memory: &Totals,
) {
    let summary = Summary::of(auto, memory, ideal_hit_ratio);
    let config = format!(
        "{}, {} × {}",
        workload.to_ascii_uppercase(),
        arguments.repeats,
        arguments.operations
    );
    summary.print_lines(&config);
    let mut fields = vec![
        ("bench", Field::Text("tiering".into())),
        ("row", Field::Text("ycsb".into())),
        ("kind", Field::Text("summary".into())),
        ("workload", Field::Text(workload.to_string())),
        ("records", Field::Number(sizes.records as f64)),
        ("auto_dram_mib", Field::Number(arguments.auto_dram_mib as f64)),
        ("data_multiple", Field::Number(arguments.data_multiple as f64)),
        ("auto_log_mib", Field::Number(sizes.auto_log_mib as f64)),
        ("memory_log_mib", Field::Number(sizes.memory_log_mib as f64)),
        ("threads", Field::Number(f64::from(arguments.threads))),
        ("repeats", Field::Number(f64::from(arguments.repeats))),
        ("operations", Field::Number(arguments.operations as f64)),
        ("warmup_operations", Field::Number(arguments.warmup_operations as f64)),
        ("auto_load_seconds", Field::Number(warmup.load_seconds[0])),
        ("memory_load_seconds", Field::Number(warmup.load_seconds[1])),
        ("auto_warmup_seconds", Field::Number(warmup.seconds[0])),
        ("memory_warmup_seconds", Field::Number(warmup.seconds[1])),
    ];
    fields.extend(summary.fields());
    print_json(&fields);
}

/// What the measured phases of one workload came to, auto beside memory.
struct Summary<'a> {
    auto: &'a Totals,
    memory: &'a Totals,
    /// The mean of each repeat's auto / memory throughput, and the lowest and highest.
    ratio: f64,
    ratio_spread: (f64, f64),
    hit_ratio: Option<f64>,
    hit_ratio_spread: (f64, f64),
    ideal_hit_ratio: f64,
    auto_latency: Percentiles,
    memory_latency: Percentiles,
}

impl<'a> Summary<'a> {
    fn of(auto: &'a Totals, memory: &'a Totals, ideal_hit_ratio: f64) -> Summary<'a> {
        // Each repeat's ratio is of two phases run one after the other on the same keys.
        let ratios: Vec<f64> =
            auto.ops_per_sec.iter().zip(&memory.ops_per_sec).map(|(a, m)| a / m).collect();
        Summary {
            auto,
            memory,
            ratio: ratios.iter().sum::<f64>() / ratios.len().max(1) as f64,
            ratio_spread: spread(&ratios),
            hit_ratio: auto.hit_ratio(),
            hit_ratio_spread: spread(&auto.hit_ratios),
            ideal_hit_ratio,
            auto_latency: auto.measurements.overall(),
            memory_latency: memory.measurements.overall(),
        }
    }

    /// The table's lines.
    fn print_lines(&self, config: &str) {
        let (ratio, (low, high)) = (self.ratio, self.ratio_spread);
        line(
            "ycsb",
            config,
            "ops/s auto vs memory (ratio: mean, min–max)",
            &format!("{:.0}", self.auto.ops_per_sec()),
            &format!("{:.0}", self.memory.ops_per_sec()),
            &format!("{ratio:.3} ({low:.3}–{high:.3})"),
            &format!("≥ {THROUGHPUT_RATIO_GOAL}"),
        );
        let (low, high) = self.hit_ratio_spread;
        line(
            "ycsb",
            config,
            "DRAM hit ratio vs an oracle's (auto: min–max)",
            &self.hit_ratio.map_or("-".to_string(), |ratio| format!("{ratio:.3}")),
            &format!("{:.3}", self.ideal_hit_ratio),
            &format!("({low:.3}–{high:.3})"),
            &format!("≥ {HIT_RATIO_GOAL}"),
        );
        let (auto, memory) = (&self.auto_latency, &self.memory_latency);
        let cpu = (self.auto.cpu_us_per_op(), self.memory.cpu_us_per_op());
        let side_by_side = [
            ("p50 µs", auto.p50_us, memory.p50_us),
            ("p99 µs", auto.p99_us, memory.p99_us),
            ("p99.9 µs", auto.p999_us, memory.p999_us),
            ("CPU µs per operation (servers' processes)", cpu.0, cpu.1),
        ];
        for (name, a, m) in side_by_side {
            let ratio = format!("{:.3}", a / m);
            line("ycsb", config, name, &format!("{a:.1}"), &format!("{m:.1}"), &ratio, "");
        }
    }

    /// The JSON row's measured fields.
    fn fields(&self) -> Vec<(&'static str, Field)> {
        let (auto, memory) = (self.auto, self.memory);
        vec![
            ("auto_ops_per_sec", Field::Number(auto.ops_per_sec())),
            ("memory_ops_per_sec", Field::Number(memory.ops_per_sec())),
            ("throughput_ratio", Field::Number(self.ratio)),
            ("throughput_ratio_min", Field::Number(self.ratio_spread.0)),
            ("throughput_ratio_max", Field::Number(self.ratio_spread.1)),
            ("throughput_ratio_goal", Field::Number(THROUGHPUT_RATIO_GOAL)),
            ("dram_hit_ratio", Field::optional_number(self.hit_ratio)),
            ("dram_hit_ratio_min", Field::Number(self.hit_ratio_spread.0)),
            ("dram_hit_ratio_max", Field::Number(self.hit_ratio_spread.1)),
            ("dram_hit_ratio_goal", Field::Number(HIT_RATIO_GOAL)),
            ("ideal_hit_ratio", Field::Number(self.ideal_hit_ratio)),
            ("auto_reads", Field::Number(auto.reads)),
            ("promotions", Field::Number(auto.promotions)),
            ("demotions", Field::Number(auto.demotions)),
            ("auto_p50_us", Field::Number(self.auto_latency.p50_us)),
            ("auto_p99_us", Field::Number(self.auto_latency.p99_us)),
            ("auto_p999_us", Field::Number(self.auto_latency.p999_us)),
            ("memory_p50_us", Field::Number(self.memory_latency.p50_us)),
            ("memory_p99_us", Field::Number(self.memory_latency.p99_us)),
            ("memory_p999_us", Field::Number(self.memory_latency.p999_us)),
            ("auto_cpu_us_per_op", Field::Number(auto.cpu_us_per_op())),
            ("memory_cpu_us_per_op", Field::Number(memory.cpu_us_per_op())),
            ("auto_driver_cpu_us_per_op", Field::Number(auto.driver_cpu_us_per_op())),
            ("memory_driver_cpu_us_per_op", Field::Number(memory.driver_cpu_us_per_op())),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_serves_every_read_with_every_key_and_more_with_more_keys() {
        assert_eq!(ideal_hit_ratio(1_000, 1_000), 1.0);
        assert_eq!(ideal_hit_ratio(1_000, 0), 0.0);
        let (fifth, half) = (ideal_hit_ratio(1_000, 200), ideal_hit_ratio(1_000, 500));
        // The zipfian's head makes the most-read fifth worth more than a fifth of the reads.
        assert!(0.2 < fifth && fifth < half && half < 1.0, "{fifth} {half}");
    }
}
