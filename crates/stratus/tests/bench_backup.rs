//! `stratus bench backup` end to end, scaled down: every object size is logged by one backup
//! through the RPC path and reported beside the raw disk.

mod common;

use std::time::Duration;

use common::run_bench;

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_backup_logs_every_size_and_reports_it_beside_the_disk() {
    let arguments = [
        "bench",
        "backup",
        "--total-bytes",
        "33554432",
        "--segment-mib",
        "1",
        "--object-bytes",
        "100,1000",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    assert_eq!(rows.len(), 2, "one row per object size:\n{stdout}");
    for (row, size) in rows.iter().zip([100.0, 1000.0]) {
        let number =
            |field: &str| row[field].as_f64().unwrap_or_else(|| panic!("{field}: {row:?}"));
        assert_eq!(row["bench"], "backup");
        assert_eq!(number("object_size"), size);
        assert!(number("objects_per_sec") > 0.0, "{row:?}");
        assert!(number("raw_disk_mb_per_sec") > 0.0, "{row:?}");
        // All 32 MiB were logged: objects per second times the object and entry bytes is the
        // megabytes per second, give or take the segment headers.
        let logged = number("objects_per_sec") * size / 1e6;
        assert!(logged <= number("mb_per_sec") && logged > number("mb_per_sec") * 0.5, "{row:?}");
        let ratio = number("mb_per_sec") / number("raw_disk_mb_per_sec");
        assert!((ratio - number("ratio")).abs() < 0.01, "{row:?}");
    }
}
