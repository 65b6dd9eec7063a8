//! `stratus bench cleaner-latency`: what the cleaner costs a client's write latency.
//!
//! One writer overwrites small objects back to back in the storage engine (in-process: the
//! engine's own latency, without a network whose noise on a small machine would hide it), with
//! the live data at a high utilization of the log and the cleaner working on its own thread —
//! against the same workload in a log so large that the cleaner never has work (it runs, and
//! finds none). FAST'14 §6 measured the same thing through RAMCloud's RPC stack.
//!
//! Both logs are prefaulted (every page touched at creation): otherwise the large log's writes
//! would land on never-touched pages and pay a page fault each, a cost the busy log, which
//! reuses its memory, does not have. A write refused with LogFull (the cleaner is behind) is
//! retried after 100 µs and its latency includes the wait, as a client retrying RETRY would
//! see.
//!
//! With `--writes-per-second`, write i is due at start + i / rate, and its latency is counted
//! from that moment, not from when the writer got to it (YCSB's intended start, as
//! `bench ycsb --target` does): after a stall the writer issues the writes it owes back to
//! back, and each one's latency includes the time it waited to be issued. Counting from the
//! actual start, or dropping the missed slots, would hide the stall behind the one write that
//! took it (coordinated omission). The service time from the actual start is reported beside
//! it (`service_*`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use stratus_store::{ObjectError, ObjectStore, StoreConfig};
use stratus_types::{key_hash, RejectRules, ServerId, TableId};

use crate::report::{latency_histogram, print_json, Field};
use crate::utilization::spawn_cleaner;
use stratus_env::SplitMix64;

/// `stratus bench cleaner-latency`.
#[derive(Debug, Args)]
pub struct CleanerLatencyArguments {
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub object_bytes: usize,
    /// Live data as a percentage of the log, with the cleaner on.
    #[arg(long, default_value_t = 90)]
    pub utilization: u32,
    /// Cleaning levels to measure: 1 (combined cleaning only, the memory-only mode) and/or 2
    /// (compaction first, what a replicated server runs).
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub levels: Vec<u32>,
    /// Log size in MiB with the cleaner on.
    #[arg(long, default_value_t = 64)]
    pub log_mib: u64,
    /// Segment size in MiB.
    #[arg(long, default_value_t = 1)]
    pub segment_mib: u32,
    /// Seglet size in KiB.
    #[arg(long, default_value_t = 16)]
    pub seglet_kib: u32,
    /// Measured writes per configuration (after a warm-up of one log's worth).
    #[arg(long, default_value_t = 2_000_000)]
    pub writes: u64,
    /// Writes per second the writer issues (0: back to back, as fast as the engine takes
    /// them). A client over a network issues far fewer than the in-process writer; pacing
    /// measures the cleaner's interference at such a rate instead of at the engine's limit.
    #[arg(long, default_value_t = 0)]
    pub writes_per_second: u64,
}

/// Key, object header and entry header of one object, beyond its value (for sizing).
const ENTRY_OVERHEAD_BYTES: u64 = 40;

/// Segments of slack in the cleaner-off log beyond everything the run writes.
const IDLE_LOG_SLACK_SEGMENTS: u64 = 8;

/// Latencies of one configuration.
struct Measured {
    /// From each write's intended start (its slot on the schedule; back to back, its start).
    histogram: Histogram<u64>,
    /// From each write's actual start.
    service: Histogram<u64>,
    /// Writes per second achieved.
    writes_per_second: f64,
    segments_cleaned: u64,
    compactions: u64,
}

/// Runs the benchmark.
pub fn run(arguments: CleanerLatencyArguments) -> Result<(), String> {
    if arguments.utilization == 0 || arguments.utilization >= 100 {
        return Err(format!("--utilization {} must be in 1..=99", arguments.utilization));
    }
    println!(
        "{:>7} {:>6} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>12}",
        "cleaner",
        "levels",
        "utilization",
        "p50_us",
        "p90_us",
        "p99_us",
        "p999_us",
        "p9999_us",
        "max_us",
        "segs_cleaned"
    );
    for &levels in &arguments.levels {
        if levels != 1 && levels != 2 {
            return Err(format!("levels must be 1 or 2, not {levels}"));
        }
        let busy = measure(&arguments, levels, true)?;
        let idle = measure(&arguments, levels, false)?;
        if idle.segments_cleaned + idle.compactions > 0 {
            return Err(format!(
                "the cleaner-off log was cleaned ({} segments, {} compactions): make it larger",
                idle.segments_cleaned, idle.compactions
            ));
        }
        if busy.segments_cleaned + busy.compactions == 0 {
            return Err("the cleaner never ran at this utilization: raise --writes".to_string());
        }
        for (name, measured) in [("on", &busy), ("off", &idle)] {
            report(&arguments, levels, name, measured, &idle);
        }
    }
    Ok(())
}

fn record(histogram: &mut Histogram<u64>, latency: Duration) {
    let nanoseconds = latency.as_nanos().min(u128::from(u64::MAX)) as u64;
    histogram.saturating_record(nanoseconds.max(1));
}

fn quantile_us(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

fn report(
    arguments: &CleanerLatencyArguments,
    levels: u32,
    cleaner: &str,
    measured: &Measured,
    idle: &Measured,
) {
    let histogram = &measured.histogram;
    let utilization = if cleaner == "on" { f64::from(arguments.utilization) } else { 0.0 };
    let [p50, p90, p99, p999, p9999] =
        [0.5, 0.9, 0.99, 0.999, 0.9999].map(|quantile| quantile_us(histogram, quantile));
    let max = histogram.max() as f64 / 1_000.0;
    println!(
        "{cleaner:>7} {levels:>6} {utilization:>11.0} {p50:>9.3} {p90:>9.3} {p99:>9.3} {p999:>9.3} {p9999:>10.3} {max:>9.1} {:>12}",
        measured.segments_cleaned
    );
    let ratio =
        |quantile: f64| quantile_us(histogram, quantile) / quantile_us(&idle.histogram, quantile);
    let service = |quantile: f64| Field::Number(quantile_us(&measured.service, quantile));
    print_json(&[
        ("bench", Field::Text("cleaner_latency".into())),
        ("cleaner", Field::Text(cleaner.into())),
        ("levels", Field::Number(f64::from(levels))),
        ("utilization", Field::Number(utilization)),
        ("object_size", Field::Number(arguments.object_bytes as f64)),
        ("writes", Field::Number(histogram.len() as f64)),
        ("writes_per_second_target", Field::Number(arguments.writes_per_second as f64)),
        ("writes_per_second", Field::Number(measured.writes_per_second)),
        (
            "latency_from",
            Field::Text(
                if arguments.writes_per_second > 0 { "intended_start" } else { "start" }.into(),
            ),
        ),
        ("p50_us", Field::Number(p50)),
        ("p90_us", Field::Number(p90)),
        ("p99_us", Field::Number(p99)),
        ("p999_us", Field::Number(p999)),
        ("p9999_us", Field::Number(p9999)),
        ("max_us", Field::Number(max)),
        ("segments_cleaned", Field::Number(measured.segments_cleaned as f64)),
        ("compactions", Field::Number(measured.compactions as f64)),
        ("service_p50_us", service(0.5)),
        ("service_p99_us", service(0.99)),
        ("service_p999_us", service(0.999)),
        ("service_p9999_us", service(0.9999)),
        ("service_max_us", Field::Number(measured.service.max() as f64 / 1_000.0)),
        ("p50_vs_cleaner_off", Field::Number(ratio(0.5))),
        ("p999_vs_cleaner_off", Field::Number(ratio(0.999))),
    ]);
}

/// One configuration: `cleaner_busy` sizes the log for the utilization; otherwise for
/// everything the run writes, so the cleaner never has work.
fn measure(
    arguments: &CleanerLatencyArguments,
    levels: u32,
    cleaner_busy: bool,
) -> Result<Measured, String> {
    let busy_log_bytes = arguments.log_mib << 20;
    let segment_bytes = u64::from(arguments.segment_mib) << 20;
    let entry_bytes = arguments.object_bytes as u64 + ENTRY_OVERHEAD_BYTES;
    let objects = (busy_log_bytes * u64::from(arguments.utilization) / 100 / entry_bytes).max(1);
    let warm_up_writes = busy_log_bytes / entry_bytes;
    let log_bytes = if cleaner_busy {
        busy_log_bytes
    } else {
        let written = (objects + warm_up_writes + arguments.writes) * entry_bytes;
        // Every write here is an overwrite: its tombstone takes log space too.
        let with_tombstones = written + (warm_up_writes + arguments.writes) * ENTRY_OVERHEAD_BYTES;
        (with_tombstones + IDLE_LOG_SLACK_SEGMENTS * segment_bytes).div_ceil(segment_bytes)
            * segment_bytes
            * 2
    };
    let mut config = StoreConfig::with_log_bytes(log_bytes);
    config.segment_bytes = arguments.segment_mib << 20;
    config.seglet_bytes = arguments.seglet_kib << 10;
    config.value_bytes_max = (config.segment_bytes / 8).max(arguments.object_bytes as u32);
    config.cleaner.replicas = if levels == 2 { 3 } else { 0 };
    // Both logs the same hash table, sized for the busy one: only the log differs.
    config.hash_table_bytes = StoreConfig::with_log_bytes(busy_log_bytes).hash_table_bytes;
    config.prefault_memory = true;
    config.validate().map_err(|error| error.to_string())?;
    let store = Arc::new(ObjectStore::new(config, ServerId(1)).map_err(|error| error.to_string())?);

    let stop = Arc::new(AtomicBool::new(false));
    let cleaner = spawn_cleaner(store.clone(), stop.clone());
    let table = TableId(1);
    let value = vec![0x5a_u8; arguments.object_bytes];
    let write = |index: u64| -> Result<(), String> {
        let key = format!("object-{index:012}");
        let hash = key_hash(table, key.as_bytes());
        // Bounded: 10 s of waiting for the cleaner per write at most.
        for _attempt in 0..100_000 {
            match store.write(
                table,
                key.as_bytes(),
                hash,
                &value,
                &RejectRules::NONE,
                stratus_store::Expiry::Never,
                stratus_store::WallTime::from_seconds(0),
            ) {
                Ok(_) => return Ok(()),
                Err(ObjectError::LogFull) => std::thread::sleep(Duration::from_micros(100)),
                Err(error) => return Err(format!("write: {error:?}")),
            }
        }
        Err(format!("the log stayed full for 10 s: {:?}", store.statistics()))
    };
    let outcome = (|| {
        for index in 0..objects {
            write(index)?;
        }
        let mut random = SplitMix64::new(0xc1ea_4e57 ^ u64::from(levels));
        for _ in 0..warm_up_writes {
            write(random.below(objects))?;
        }
        let before = store.statistics().cleaner;
        let (histogram, service, writes_per_second) =
            timed_writes(arguments, || write(random.below(objects)))?;
        let after = store.statistics().cleaner;
        Ok::<_, String>(Measured {
            histogram,
            service,
            writes_per_second,
            segments_cleaned: after.segments_cleaned - before.segments_cleaned,
            compactions: after.compactions - before.compactions,
        })
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = cleaner.join();
    outcome
}

/// `--writes` calls of `write`, back to back or on the schedule of `--writes-per-second`;
/// returns the latencies from each write's intended start and from its actual start, and the
/// rate achieved.
fn timed_writes(
    arguments: &CleanerLatencyArguments,
    mut write: impl FnMut() -> Result<(), String>,
) -> Result<(Histogram<u64>, Histogram<u64>, f64), String> {
    let mut from_intended = latency_histogram();
    let mut service = latency_histogram();
    let interval_nanos = match arguments.writes_per_second {
        0 => None,
        rate => Some(1_000_000_000 / rate.max(1)),
    };
    let schedule_start = Instant::now();
    for slot in 0..arguments.writes {
        let intended = match interval_nanos {
            Some(interval) => {
                let due = schedule_start + Duration::from_nanos(interval.saturating_mul(slot));
                // Spin rather than sleep: sleeps are far coarser than the interval. A write
                // already due (after a stall) goes at once.
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
                due
            }
            None => Instant::now(),
        };
        let started = Instant::now();
        write()?;
        let ended = Instant::now();
        record(&mut from_intended, ended - intended);
        record(&mut service, ended - started);
    }
    let elapsed = schedule_start.elapsed().as_secs_f64().max(1e-9);
    Ok((from_intended, service, arguments.writes as f64 / elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        arguments: CleanerLatencyArguments,
    }

    /// Paced writes with one stall: every write is counted (no slot is dropped), and the
    /// writes due during the stall count the time they waited behind it. Only lower bounds
    /// that the stall's sleep guarantees are checked, never a measured speed.
    #[test]
    fn a_stall_delays_the_writes_due_behind_it() {
        let arguments = Command::try_parse_from([
            "cleaner-latency",
            "--writes",
            "20",
            "--writes-per-second",
            "1000",
        ])
        .unwrap()
        .arguments;
        let stall = Duration::from_millis(10);
        let mut calls = 0;
        let (from_intended, service, _) = timed_writes(&arguments, || {
            calls += 1;
            if calls == 5 {
                std::thread::sleep(stall);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!((from_intended.len(), service.len()), (20, 20));
        // Write 5 (due at 4 ms) ends after 14 ms; writes 6 to 9 were due at 5 to 8 ms and
        // started after it: at least 6 ms late each (5 ms leaves room for the histogram's
        // rounding).
        let late = Duration::from_millis(5).as_nanos() as u64;
        assert!(from_intended.count_between(late, u64::MAX) >= 5);
        // Counted from their actual starts, the stall shows in one write (the one that took
        // it), which is what the bench used to report.
        assert!(service.count_between(stall.as_nanos() as u64, u64::MAX) >= 1);
    }
}
