//! What the driver measures (a histogram per operation type, service time and time from the
//! intended start) and how it is reported: YCSB's text lines and one JSON object per row.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::generators::Operation;
use crate::cpu::CpuCost;
use crate::report::{latency_histogram, print_json, Field, Percentiles};

/// What an operation returned (YCSB's `Return=...` lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Done.
    Ok,
    /// The record was missing.
    NotFound,
}

impl Outcome {
    /// YCSB's name of the return code.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::NotFound => "NOT_FOUND",
        }
    }
}

/// The latencies of one operation type.
#[derive(Debug)]
pub struct OperationHistograms {
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
pub struct Measurements {
    operations: BTreeMap<Operation, OperationHistograms>,
}

impl Measurements {
    /// Records one operation: its service time, its time from the intended start, and what it
    /// returned.
    pub fn record(
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

    /// Percentiles of the service time of every operation, whatever its type.
    pub fn overall(&self) -> Percentiles {
        let mut all = latency_histogram();
        for histograms in self.operations.values() {
            let _ = all.add(&histograms.service);
        }
        Percentiles::of(&all)
    }

    /// Adds another thread's measurements.
    pub fn merge(&mut self, other: Measurements) {
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

/// What a phase measured.
pub struct PhaseResult {
    /// From the first thread's start to the last thread's end.
    pub runtime: Duration,
    /// Operations of the phase.
    pub operations: u64,
    /// Latencies per operation type.
    pub measurements: Measurements,
    /// CPU of the system under test and of the driver over the phase.
    pub cpu: CpuCost,
}

/// Identifies the rows of one configuration.
pub struct RunLabel<'a> {
    /// load or run.
    pub phase: &'a str,
    /// a..f.
    pub workload: char,
    /// stratus, redis, memcached.
    pub system: &'a str,
    /// The configuration's name.
    pub config: &'a str,
    /// Driver threads.
    pub threads: u32,
    /// Records loaded.
    pub records: u64,
    /// The run phase's target throughput, if any.
    pub target: Option<f64>,
}

/// Prints a phase: YCSB's text report, then one JSON row per operation type.
pub fn report_phase(label: &RunLabel<'_>, result: &PhaseResult) {
    let with_intended = label.target.is_some() && label.phase == "run";
    let operations = &result.measurements.operations;
    let summaries: Vec<Summary> = operations
        .iter()
        .map(|(operation, histograms)| {
            Summary::of(operation.name().into(), &histograms.service, &histograms.outcomes)
        })
        .collect();
    let intended: Vec<Summary> = operations
        .iter()
        .map(|(operation, histograms)| {
            let name = format!("Intended-{}", operation.name());
            Summary::of(name, &histograms.intended, &histograms.outcomes)
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
    println!(
        "# cpu per operation: system {:.1} us ({} processes), driver {:.1} us",
        result.cpu.system_us_per_op(result.operations),
        result.cpu.system_processes,
        result.cpu.driver_us_per_op(result.operations),
    );
    for (summary, intended) in summaries.iter().zip(&intended) {
        print_json(&json_row(label, result, summary, with_intended.then_some(intended)));
    }
}

/// One operation type's JSON row; the CPU fields are the whole phase's, per operation of it.
fn json_row(
    label: &RunLabel<'_>,
    result: &PhaseResult,
    summary: &Summary,
    intended: Option<&Summary>,
) -> Vec<(&'static str, Field)> {
    let ops_per_sec = result.operations as f64 / result.runtime.as_secs_f64().max(1e-9);
    let intended_field =
        |value: fn(&Summary) -> u64| Field::optional_number(intended.map(|i| value(i) as f64));
    let not_found =
        summary.returns.iter().find(|(code, _)| code == "NOT_FOUND").map_or(0, |(_, count)| *count);
    let mut row = vec![
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
        ("intended_p50_us", intended_field(|summary| summary.p50_us)),
        ("intended_p99_us", intended_field(|summary| summary.p99_us)),
        ("intended_p999_us", intended_field(|summary| summary.p999_us)),
    ];
    row.extend(result.cpu.fields(result.operations));
    row
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
