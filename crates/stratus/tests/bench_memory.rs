//! `stratus bench memory` end to end, scaled down: every system completes two of the FAST'14
//! workloads (W3: small objects replaced by slightly larger ones; W8: small objects replaced
//! by large ones), its peak memory is measured, and Stratus's log holds the live data in less
//! memory than Redis on both and than the best general-purpose allocator on W8 — what
//! log-structured memory is for.
//!
//! Redis and memcached are measured too: a missing one fails the test (scripts/test installs
//! them). So is a real `stratus server` with its default flags (the memory target).

mod common;

use std::time::Duration;

use common::{require_installed, run_bench, BenchRow};

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(600);

#[test]
fn every_system_completes_and_the_log_needs_less_memory_than_malloc() {
    let systems =
        ["stratus", "stratus-server", "glibc", "jemalloc", "mimalloc", "redis", "memcached"];
    for executable in ["redis-server", "memcached"] {
        require_installed(executable);
    }
    let live_mib: u64 = 32;
    let arguments = [
        "bench",
        "memory",
        "--workload",
        "W3,W8",
        "--live-mib",
        &live_mib.to_string(),
        "--allocation-multiple",
        "2",
        "--segment-kib",
        "256",
        "--seglet-kib",
        "4",
        "--systems",
        &systems.join(","),
    ]
    .map(String::from);
    // Bounded: a worker that hung would otherwise hold the test forever (it takes well under
    // a minute in a debug build on two cores).
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let rows: Vec<BenchRow> = rows.into_iter().filter(|row| row["bench"] == "memory").collect();
    assert_eq!(rows.len(), 2 * systems.len(), "one row per workload and system:\n{stdout}");
    let number = |row: &BenchRow, field: &str| {
        row[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {row:?}"))
    };
    for workload in ["W3", "W8"] {
        let of = |system: &str| {
            rows.iter()
                .find(|row| row["workload"] == workload && row["system"] == system)
                .unwrap_or_else(|| panic!("no row for {system} on {workload}:\n{stdout}"))
        };
        for system in &systems {
            let row = of(system);
            assert_eq!(row["completed"], "true", "{row:?}");
            // The live data reached its cap, and no process holds it in less than its size.
            let live = number(row, "live_bytes");
            assert!(live > (live_mib << 20) as f64 * 0.95 && live <= (live_mib << 20) as f64);
            assert!(number(row, "ratio") > 1.0, "{row:?}");
        }
        let stratus = of("stratus");
        let utilization = number(stratus, "log_utilization_min");
        assert!(utilization > 0.5 && utilization <= 1.0, "{stratus:?}");
        // W8 (small objects replaced by large ones) is where every allocator fragments: there
        // the log must beat the best of them (0.71 of it when this test was written). On W3, at
        // this small scale, glibc comes within a few percent of the log (the worker's fixed
        // floor of about 8 MB is a quarter of the live data here), too close to assert.
        if workload == "W8" {
            let best_malloc = ["glibc", "jemalloc", "mimalloc"]
                .iter()
                .map(|system| number(of(system), "ratio"))
                .fold(f64::INFINITY, f64::min);
            assert!(
                number(stratus, "ratio") < best_malloc,
                "on {workload} the log needs more memory than malloc:\n{stdout}"
            );
        }
        // Redis fragments on both (about 0.57 of its memory when this test was written).
        if systems.contains(&"redis") {
            assert!(
                number(stratus, "ratio") < 0.8 * number(of("redis"), "ratio"),
                "on {workload} the log saves too little against Redis:\n{stdout}"
            );
        }
        // A real server with its default flags holds the data too, within a few times its
        // size (its fixed costs, about 12 MB idle and a segment of headroom, are large against
        // 32 MiB); its ratios against Redis at full size are in docs/benchmarks.md.
        let server = of("stratus-server");
        assert!(number(server, "ratio") < 4.0, "{server:?}");
        assert!(server["ratio_vs_redis"].as_f64().is_some(), "{server:?}");
        if systems.contains(&"memcached") {
            let kept = number(of("memcached"), "live_fraction_kept");
            assert!(kept > 0.0 && kept <= 1.0, "{kept}");
        }
    }
}
