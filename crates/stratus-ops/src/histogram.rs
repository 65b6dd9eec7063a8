//! Counters and latency histograms cheap enough for every request.
//!
//! Recording must not slow the request path down: no allocation, no lock, and no cache line
//! that every core writes. Each counter and histogram is therefore split into shards, one
//! cache-line-aligned block per shard; a thread always records into the same shard (chosen
//! once per thread, round-robin), so with no more threads than shards no two threads write the
//! same line. Recording is one or two relaxed atomic adds on the thread's own line. Reading
//! (a scrape) sums the shards: the figures are exact once recording stops, and each counter is
//! monotonic while it goes on.
//!
//! Histograms have fixed buckets ([`LATENCY_BUCKET_BOUNDS_NANOS`]), as Prometheus needs: a
//! bucket is found by a binary search over 20 bounds, and the total count is the sum of the
//! buckets, so a snapshot's `+Inf` bucket always equals its count.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Upper bounds of the latency buckets, in nanoseconds: 5 µs to 10 s, in 1-2.5-5 steps. A
/// request served from memory takes microseconds; one that waits for backups (fsync), for
/// recovery, or behind a stalled peer takes milliseconds to seconds. Slower ones land in the
/// `+Inf` bucket.
pub const LATENCY_BUCKET_BOUNDS_NANOS: [u64; 20] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The same bounds in seconds, as the `le` labels of the exposition format write them.
pub const LATENCY_BUCKET_BOUNDS_SECONDS: [&str; 20] = [
    "0.000005", "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10",
];

/// Buckets of a latency histogram: one per bound, plus the overflow (`+Inf`) bucket.
pub const LATENCY_BUCKETS: usize = LATENCY_BUCKET_BOUNDS_NANOS.len() + 1;

/// Most shards per counter or histogram. More threads than shards share shards (still
/// correct, only contended).
const SHARDS_MAX: usize = 64;

/// Shards per counter and histogram in this process: the machine's parallelism rounded up to
/// a power of two (so a shard is picked with a mask), at most [`SHARDS_MAX`].
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let parallelism = std::thread::available_parallelism().map_or(8, |count| count.get());
        parallelism.next_power_of_two().min(SHARDS_MAX)
    })
}

/// This thread's shard number (before masking): assigned round-robin on first use.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|shard| {
        let mut index = shard.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Ordering::Relaxed);
            shard.set(index);
        }
        index
    })
}

/// Aligned to 128 bytes: two cache lines, because adjacent-line prefetchers pair them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

/// A monotonic counter with one cache line per shard.
#[derive(Debug)]
pub struct ShardedCounter {
    shards: Box<[PaddedCounter]>,
}

impl Default for ShardedCounter {
    fn default() -> ShardedCounter {
        ShardedCounter::new()
    }
}

impl ShardedCounter {
    /// A counter at zero.
    pub fn new() -> ShardedCounter {
        ShardedCounter { shards: (0..shard_count()).map(|_| PaddedCounter::default()).collect() }
    }

    /// Adds `amount`: one relaxed atomic add on this thread's shard.
    #[inline]
    pub fn add(&self, amount: u64) {
        let shard = &self.shards[thread_shard() & (self.shards.len() - 1)];
        shard.0.fetch_add(amount, Ordering::Relaxed);
    }

    /// The total.
    pub fn get(&self) -> u64 {
        self.shards.iter().map(|shard| shard.0.load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
    }
}

#[derive(Debug)]
#[repr(align(128))]
struct HistogramShard {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_nanos: AtomicU64,
}

impl Default for HistogramShard {
    fn default() -> HistogramShard {
        HistogramShard {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

/// A latency histogram with the fixed buckets [`LATENCY_BUCKET_BOUNDS_NANOS`].
#[derive(Debug)]
pub struct LatencyHistogram {
    shards: Box<[HistogramShard]>,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram (the only allocation: its shards, here).
    pub fn new() -> LatencyHistogram {
        LatencyHistogram { shards: (0..shard_count()).map(|_| HistogramShard::default()).collect() }
    }

    /// Records one observation: two relaxed atomic adds on this thread's shard.
    #[inline]
    pub fn record(&self, elapsed: Duration) {
        self.record_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records one observation of `nanos` nanoseconds.
    #[inline]
    pub fn record_nanos(&self, nanos: u64) {
        let bucket = bucket_of(nanos);
        let shard = &self.shards[thread_shard() & (self.shards.len() - 1)];
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The observations so far.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut snapshot = HistogramSnapshot::default();
        for shard in self.shards.iter() {
            for (total, bucket) in snapshot.buckets.iter_mut().zip(&shard.buckets) {
                *total = total.wrapping_add(bucket.load(Ordering::Relaxed));
            }
            snapshot.sum_nanos =
                snapshot.sum_nanos.wrapping_add(shard.sum_nanos.load(Ordering::Relaxed));
        }
        snapshot
    }
}

/// The bucket an observation of `nanos` falls in: the first whose bound is at least `nanos`
/// (Prometheus buckets count observations less than or equal to their bound), or the overflow.
#[inline]
pub fn bucket_of(nanos: u64) -> usize {
    LATENCY_BUCKET_BOUNDS_NANOS.partition_point(|&bound| bound < nanos)
}

/// A histogram's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations per bucket (not cumulative); the last is the overflow (`+Inf`) bucket.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Sum of all observations, in nanoseconds.
    pub sum_nanos: u64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.buckets.iter().fold(0, |total, &bucket| total.wrapping_add(bucket))
    }

    /// Sum of all observations, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }

    /// Adds `other`'s observations to these.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (total, bucket) in self.buckets.iter_mut().zip(&other.buckets) {
            *total = total.wrapping_add(*bucket);
        }
        self.sum_nanos = self.sum_nanos.wrapping_add(other.sum_nanos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_bounds_match_nanosecond_bounds() {
        for (nanos, seconds) in
            LATENCY_BUCKET_BOUNDS_NANOS.iter().zip(LATENCY_BUCKET_BOUNDS_SECONDS)
        {
            let parsed: f64 = seconds.parse().expect("a number");
            assert_eq!((parsed * 1e9).round() as u64, *nanos, "{seconds}");
            // The label is the shortest decimal form, as Rust prints the float.
            assert_eq!(format!("{}", *nanos as f64 / 1e9), seconds);
        }
        assert!(LATENCY_BUCKET_BOUNDS_NANOS.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_is_not_below_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(5_000), 0, "a bound is inclusive (le)");
        assert_eq!(bucket_of(5_001), 1);
        assert_eq!(bucket_of(999_999), 7);
        assert_eq!(bucket_of(1_000_000), 7);
        assert_eq!(bucket_of(10_000_000_000), 19);
        assert_eq!(bucket_of(10_000_000_001), 20, "past the last bound: the overflow bucket");
        assert_eq!(bucket_of(u64::MAX), 20);
    }

    #[test]
    fn a_histogram_counts_and_sums_what_every_thread_records() {
        let histogram = std::sync::Arc::new(LatencyHistogram::new());
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let histogram = histogram.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        histogram.record(Duration::from_micros(3 + thread * 100));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("recording thread");
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count(), 8_000);
        let expected_sum: u64 = (0..8).map(|thread| 1_000 * (3 + thread * 100) * 1_000).sum();
        assert_eq!(snapshot.sum_nanos, expected_sum);
        // 3 µs ≤ 5 µs; 103 and 203 µs ≤ 250 µs; 303 and 403 µs ≤ 500 µs; 503..703 µs ≤ 1 ms.
        let mut expected = [0u64; LATENCY_BUCKETS];
        expected[0] = 1_000;
        expected[5] = 2_000;
        expected[6] = 2_000;
        expected[7] = 3_000;
        assert_eq!(snapshot.buckets, expected);
    }

    #[test]
    fn a_counter_sums_every_thread() {
        let counter = std::sync::Arc::new(ShardedCounter::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || (0..10_000).for_each(|_| counter.add(2)))
            })
            .collect();
        threads.into_iter().for_each(|thread| thread.join().expect("counting thread"));
        assert_eq!(counter.get(), 80_000);
    }

    #[test]
    fn shards_are_a_power_of_two_and_cache_line_aligned() {
        assert!(shard_count().is_power_of_two());
        assert!(shard_count() <= SHARDS_MAX);
        assert_eq!(std::mem::align_of::<HistogramShard>(), 128);
        assert_eq!(std::mem::align_of::<PaddedCounter>(), 128);
        assert_eq!(std::mem::size_of::<PaddedCounter>(), 128);
    }
}
