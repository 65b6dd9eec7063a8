//! What recording one request's metrics costs, against the one shared counter it replaces.
//!
//! `cargo run --release -p stratus-ops --example recording_cost [THREADS]`
//!
//! Each thread records in a tight loop; the table gives nanoseconds per operation and thread.
//! "shared counter" is one `AtomicU64` every thread adds to (what the master's request count
//! was); "histogram" is [`LatencyHistogram::record`] (one shard per thread); "two clock reads"
//! is the `Instant::now()` pair a latency measurement needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use stratus_ops::LatencyHistogram;

const ITERATIONS: u64 = 5_000_000;

fn per_operation(threads: usize, operation: impl Fn(u64) + Send + Sync + 'static) -> f64 {
    let operation = Arc::new(operation);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (operation, barrier) = (operation.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let started = Instant::now();
                for index in 0..ITERATIONS {
                    operation(index);
                }
                started.elapsed()
            })
        })
        .collect();
    let total: Duration = handles.into_iter().map(|handle| handle.join().expect("thread")).sum();
    total.as_nanos() as f64 / (threads as u64 * ITERATIONS) as f64
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |count| count.get()));
    println!("{:<22} {:>12} {:>12}", "operation", "1 thread", format!("{threads} threads"));
    let shared = Arc::new(AtomicU64::new(0));
    let histogram = Arc::new(LatencyHistogram::new());
    let measure_shared = |threads| {
        let shared = shared.clone();
        per_operation(threads, move |_| {
            shared.fetch_add(1, Ordering::Relaxed);
        })
    };
    let measure_histogram = |threads| {
        let histogram = histogram.clone();
        per_operation(threads, move |index| histogram.record_nanos(index & 0xf_ffff))
    };
    let measure_clock = |threads| {
        per_operation(threads, |_| {
            let started = tokio::time::Instant::now();
            std::hint::black_box(started.elapsed());
        })
    };
    println!(
        "{:<22} {:>9.1} ns {:>9.1} ns",
        "shared counter",
        measure_shared(1),
        measure_shared(threads)
    );
    println!(
        "{:<22} {:>9.1} ns {:>9.1} ns",
        "histogram",
        measure_histogram(1),
        measure_histogram(threads)
    );
    println!(
        "{:<22} {:>9.1} ns {:>9.1} ns",
        "two clock reads",
        measure_clock(1),
        measure_clock(threads)
    );
    std::hint::black_box((shared.load(Ordering::Relaxed), histogram.snapshot().count()));
}
