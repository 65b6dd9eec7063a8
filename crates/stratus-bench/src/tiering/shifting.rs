//! The shifting row: `--threads` readers read the auto table without pause, `--hot-read-percent`
//! of their reads going to a hot set of `--hot-key-percent` of the keys (uniformly), the rest
//! to the keys outside it (uniformly, as YCSB's hotspot generator does). Every
//! `--shift-seconds` the hot set moves to the next keys. The auto server's metrics are read
//! every second: the DRAM hit ratio of each second's reads, and for each hot set the time
//! until a second's hit ratio is back at 0.9 (or that it was not, within the shift).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::systems::{AutoFigures, LoadedServer};
use super::{line, Sizes, TieringArguments, HIT_RATIO_GOAL};
use crate::report::{print_json, Field};
use crate::ycsb::generators::{key_name, Random, RECORD_LOG_BYTES};
use crate::ycsb::measure::Outcome;

/// How often the hit ratio is sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Seeds the readers' random streams.
const SEED: u64 = 0x7368_6966;

/// The hot set: its first key number and how many keys follow it (wrapping past the last).
struct HotSet {
    first: AtomicU64,
    keys: u64,
    /// A read's chance of going to the hot set.
    share: f64,
    records: u64,
}

impl HotSet {
    /// A key number to read: in the hot set with probability `share`, else outside it.
    fn choose(&self, random: &mut Random) -> u64 {
        let first = self.first.load(Ordering::Relaxed);
        let offset = if random.next_f64() < self.share || self.keys >= self.records {
            random.uniform(0, self.keys - 1)
        } else {
            self.keys + random.uniform(0, self.records - self.keys - 1)
        };
        (first + offset) % self.records
    }
}

impl HotSet {
    /// The hit ratio of an oracle that keeps the hot set and as many other keys as fit in
    /// `capacity` records (or part of the hot set, if it does not fit).
    fn ideal_hit_ratio(&self, capacity: u64) -> f64 {
        if capacity < self.keys {
            return self.share * capacity as f64 / self.keys as f64;
        }
        let others = (self.records - self.keys).max(1) as f64;
        self.share + (1.0 - self.share) * ((capacity - self.keys) as f64 / others).min(1.0)
    }
}

/// One second's sample.
struct Sample {
    reads: f64,
    hit_ratio: Option<f64>,
    promotions: f64,
    demotions: f64,
    segments_cleaned: f64,
    /// At the end of the second.
    dram_bytes: f64,
}

/// Runs the row.
pub(super) fn run(
    arguments: &TieringArguments,
    sizes: &Sizes,
    auto: &LoadedServer,
) -> Result<(), String> {
    let records = sizes.records;
    let hot_keys = ((records as f64 * arguments.hot_key_percent / 100.0) as u64).clamp(1, records);
    let hot = HotSet {
        first: AtomicU64::new(0),
        keys: hot_keys,
        share: arguments.hot_read_percent / 100.0,
        records,
    };
    let stop = AtomicBool::new(false);
    let not_found = AtomicU64::new(0);
    let metrics = auto.cluster.server_metrics();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..arguments.threads)
            .map(|thread| {
                let (hot, stop, not_found) = (&hot, &stop, &not_found);
                scope.spawn(move || -> Result<(), String> {
                    let mut database = auto.running.connect()?;
                    let mut random = Random::new(SEED ^ (u64::from(thread) << 32));
                    while !stop.load(Ordering::Relaxed) {
                        let key = key_name(hot.choose(&mut random));
                        if database.read(&key)? == Outcome::NotFound {
                            not_found.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let sampled = sample_shifts(arguments, &hot, metrics);
        stop.store(true, Ordering::Relaxed);
        let mut first_error = sampled.err();
        for reader in readers {
            let outcome = reader.join().unwrap_or_else(|_| Err("a reader panicked".into()));
            if let Err(error) = outcome {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    })?;
    let missing = not_found.load(Ordering::Relaxed);
    if missing > 0 {
        return Err(format!("shifting: {missing} reads found no object in the auto table"));
    }
    Ok(())
}

/// Moves the hot set `--shifts` times, sampling every second, and reports each hot set.
fn sample_shifts(
    arguments: &TieringArguments,
    hot: &HotSet,
    metrics: &[String],
) -> Result<(), String> {
    let mut previous = AutoFigures::scrape(metrics)?;
    let started = Instant::now();
    for shift in 0..arguments.shifts {
        let first = (u64::from(shift) * hot.keys) % hot.records;
        hot.first.store(first, Ordering::Relaxed);
        let at_shift = previous;
        let shift_start = started + SAMPLE_INTERVAL * (shift * arguments.shift_seconds as u32);
        let mut samples = Vec::new();
        for second in 1..=arguments.shift_seconds as u32 {
            let due = shift_start + SAMPLE_INTERVAL * second;
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let now = AutoFigures::scrape(metrics)?;
            let (reads, hit_ratio) = now.reads_since(&previous);
            samples.push(Sample {
                reads,
                hit_ratio,
                promotions: now.promotions - previous.promotions,
                demotions: now.demotions - previous.demotions,
                segments_cleaned: now.segments_cleaned - previous.segments_cleaned,
                dram_bytes: now.dram_bytes,
            });
            previous = now;
        }
        report_shift(arguments, hot, shift, &samples, (&at_shift, &previous));
    }
    Ok(())
}

/// One hot set's table line and JSON row.
fn report_shift(
    arguments: &TieringArguments,
    hot: &HotSet,
    shift: u32,
    samples: &[Sample],
    (before, after): (&AutoFigures, &AutoFigures),
) {
    let ideal = hot.ideal_hit_ratio((arguments.auto_dram_mib << 20) / RECORD_LOG_BYTES);
    let recovered = samples
        .iter()
        .position(|sample| sample.hit_ratio.is_some_and(|ratio| ratio >= HIT_RATIO_GOAL))
        .map(|index| (index + 1) as f64 * SAMPLE_INTERVAL.as_secs_f64());
    let ratios: Vec<f64> = samples.iter().filter_map(|sample| sample.hit_ratio).collect();
    let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let last = ratios.last().copied();
    let (reads, whole) = after.reads_since(before);
    let series: Vec<String> = samples
        .iter()
        .map(|sample| sample.hit_ratio.map_or("-".to_string(), |ratio| format!("{ratio:.2}")))
        .collect();
    let per_second = |value: fn(&Sample) -> f64| -> String {
        let values: Vec<String> =
            samples.iter().map(|sample| format!("{:.0}", value(sample))).collect();
        values.join(" ")
    };
    let config = if shift == 0 { "initial".to_string() } else { format!("move {shift}") };
    let recovered_text = recovered.map_or_else(
        || format!("not within {} s", arguments.shift_seconds),
        |seconds| format!("{seconds:.0} s"),
    );
    line(
        "shifting",
        &config,
        "seconds until a second's hit ratio ≥ 0.9 (oracle's)",
        &recovered_text,
        &format!("{ideal:.3}"),
        &format!("lowest {lowest:.2}, last {:.2}", last.unwrap_or(f64::NAN)),
        "",
    );
    print_json(&[
        ("bench", Field::Text("tiering".into())),
        ("row", Field::Text("shifting".into())),
        ("shift", Field::Number(f64::from(shift))),
        ("shift_seconds", Field::Number(arguments.shift_seconds as f64)),
        ("hot_first_key", Field::Number(hot.first.load(Ordering::Relaxed) as f64)),
        ("hot_keys", Field::Number(hot.keys as f64)),
        ("records", Field::Number(hot.records as f64)),
        ("hot_read_share", Field::Number(hot.share)),
        ("recovered", Field::Boolean(recovered.is_some())),
        ("seconds_to_hit_ratio_goal", Field::optional_number(recovered)),
        ("hit_ratio_goal", Field::Number(HIT_RATIO_GOAL)),
        ("hit_ratio_lowest", Field::optional_number(lowest.is_finite().then_some(lowest))),
        ("hit_ratio_last_second", Field::optional_number(last)),
        ("hit_ratio_whole_shift", Field::optional_number(whole)),
        ("ideal_hit_ratio", Field::Number(ideal)),
        ("reads", Field::Number(reads)),
        ("promotions", Field::Number(after.promotions - before.promotions)),
        ("promotions_refused", Field::Number(after.promotions_refused - before.promotions_refused)),
        ("demotions", Field::Number(after.demotions - before.demotions)),
        ("hit_ratio_per_second", Field::Text(series.join(" "))),
        ("reads_per_second", Field::Text(per_second(|sample| sample.reads))),
        ("promotions_per_second", Field::Text(per_second(|sample| sample.promotions))),
        ("demotions_per_second", Field::Text(per_second(|sample| sample.demotions))),
        ("segments_cleaned_per_second", Field::Text(per_second(|sample| sample.segments_cleaned))),
        ("dram_mib_per_second", Field::Text(per_second(|sample| sample.dram_bytes / 1048576.0))),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot_set(first: u64) -> HotSet {
        HotSet { first: AtomicU64::new(first), keys: 100, share: 0.9, records: 1_000 }
    }

    #[test]
    fn the_hot_set_gets_its_share_of_reads_and_the_rest_go_outside_it() {
        // A hot set that wraps past the last key: 950..999 and 0..49.
        let hot = hot_set(950);
        let in_hot = |keynum: u64| !(50..950).contains(&keynum);
        let mut random = Random::new(7);
        let draws = 100_000;
        let hot_reads = (0..draws).filter(|_| in_hot(hot.choose(&mut random))).count();
        let share = hot_reads as f64 / f64::from(draws);
        assert!((share - 0.9).abs() < 0.01, "{share}");
        assert!((0..draws).all(|_| hot.choose(&mut random) < 1_000));
    }

    #[test]
    fn the_oracle_keeps_the_hot_set_then_what_else_fits() {
        let hot = hot_set(0);
        assert_eq!(hot.ideal_hit_ratio(50), 0.45);
        assert_eq!(hot.ideal_hit_ratio(100), 0.9);
        assert!((hot.ideal_hit_ratio(550) - 0.95).abs() < 1e-12);
        assert_eq!(hot.ideal_hit_ratio(5_000), 1.0);
    }
}
