//! `stratus bench latency` end to end, scaled down: writes and reads are measured with and
//! without a replica, and every row is complete.

mod common;

use std::time::Duration;

use common::run_bench;

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_latency_measures_writes_and_reads_for_each_replica_count() {
    let arguments = [
        "bench",
        "latency",
        "--replicas",
        "0,1",
        "--durability",
        "buffered",
        "--servers",
        "2",
        "--operations",
        "300",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    assert_eq!(rows.len(), 4, "a write and a read row per replica count:\n{stdout}");
    for (row, (op, replicas)) in
        rows.iter().zip([("write", 0.0), ("read", 0.0), ("write", 1.0), ("read", 1.0)])
    {
        let number =
            |field: &str| row[field].as_f64().unwrap_or_else(|| panic!("{field}: {row:?}"));
        assert_eq!(row["bench"], "latency");
        assert_eq!(row["op"], op);
        assert_eq!(number("replicas"), replicas);
        assert_eq!(row["durability"], "buffered");
        assert!(number("p50_us") > 0.0 && number("p50_us") <= number("p99_us"), "{row:?}");
        assert!(number("p99_us") <= number("p999_us"), "{row:?}");
        assert!(number("ops_per_sec") > 0.0, "{row:?}");
    }
}
