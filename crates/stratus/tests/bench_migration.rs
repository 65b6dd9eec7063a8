//! `stratus bench migration` end to end, scaled down: the tablet is loaded, moved while a
//! client writes, the client finds it at its new master, and the report is consistent.

mod common;

use std::time::Duration;

use common::run_bench;

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_migration_moves_a_tablet_under_writes_and_reports_it() {
    let data_mib: u64 = 8;
    let arguments = ["bench", "migration", "--data-mib", "8", "--servers", "2", "--replicas", "1"];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let [row] = &rows[..] else { panic!("one row:\n{stdout}") };
    let number =
        |field: &str| row[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {row:?}"));
    assert_eq!(row["bench"], "migration");
    assert_eq!(number("objects"), (data_mib * 1_048_576 / 1_000) as f64);
    assert!(number("migration_ms") > 0.0, "{row:?}");
    assert!(number("writes_per_sec_before") > 0.0, "the reference was measured: {row:?}");
    // Each write during the migration returned (the client found the tablet's new master),
    // and the longest is at least the 99th percentile.
    if number("writes_during_migration") > 0.0 {
        assert!(number("longest_write_ms") * 1_000.0 >= number("write_p99_us") * 0.99, "{row:?}");
    }
}
