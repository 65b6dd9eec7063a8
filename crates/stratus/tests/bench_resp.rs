//! `stratus bench resp` end to end, scaled down: redis-benchmark runs against Redis and against
//! every placement of Stratus's RESP front end, and every row has its ratio to Redis.

mod common;

use std::time::Duration;

use common::{require_installed, run_bench, BenchRow};

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_resp_measures_every_placement_beside_redis() {
    for tool in ["redis-benchmark", "redis-server"] {
        require_installed(tool);
    }
    let arguments = [
        "bench",
        "resp",
        "--requests",
        "2000",
        "--clients",
        "8",
        "--rounds",
        "1",
        "--servers",
        "2",
        "--configs",
        "r0,r1-buffered",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let text = |row: &BenchRow, field: &str| {
        row[field].as_str().unwrap_or_else(|| panic!("{field} missing in {row:?}")).to_string()
    };
    let mut seen = std::collections::BTreeSet::new();
    let (mut redis_cpu_us_per_op, mut stratus_cpu_us_per_op) = (0.0, 0.0);
    for row in &rows {
        assert_eq!(row["bench"], "resp");
        assert!(row["ops_per_sec"].as_f64().unwrap() > 0.0, "{row:?}");
        assert!(row["ratio_to_reference"].as_f64().unwrap() > 0.0, "{row:?}");
        // CPU is counted in clock ticks (10 ms): one short redis-benchmark run may round to 0,
        // the runs of each system together cannot.
        let cpu = row["cpu_us_per_op"].as_f64().unwrap_or_else(|| panic!("{row:?}"));
        assert!(cpu >= 0.0 && row["driver_cpu_us_per_op"].as_f64().unwrap() >= 0.0, "{row:?}");
        match text(row, "system").as_str() {
            "stratus" => {
                assert!(row["cpu_processes"].as_f64().unwrap() >= 4.0, "{row:?}");
                stratus_cpu_us_per_op += cpu;
            }
            _ => {
                assert_eq!(row["cpu_processes"], 1, "{row:?}");
                redis_cpu_us_per_op += cpu;
            }
        }
        let reference = text(row, "reference");
        match text(row, "config").as_str() {
            "r0" => assert_eq!(reference, "redis none"),
            "r1-buffered" => assert_eq!(reference, "redis everysec"),
            _ => {}
        }
        seen.insert((
            text(row, "system"),
            text(row, "config"),
            text(row, "placement"),
            text(row, "test"),
        ));
    }
    for test in ["SET", "GET"] {
        for (system, config, placement) in [
            ("redis", "none", "-"),
            ("redis", "everysec", "-"),
            ("stratus", "r0", "owner"),
            ("stratus", "r0", "forwarded"),
            ("stratus", "r0", "gateway"),
            ("stratus", "r1-buffered", "owner"),
            ("stratus", "r1-buffered", "forwarded"),
            ("stratus", "r1-buffered", "gateway"),
        ] {
            let key =
                (system.to_string(), config.to_string(), placement.to_string(), test.to_string());
            assert!(seen.contains(&key), "no row for {key:?}:\n{stdout}");
        }
    }
    assert_eq!(rows.len(), 16, "{stdout}");
    assert!(redis_cpu_us_per_op > 0.0, "Redis's rows together show CPU:\n{stdout}");
    assert!(stratus_cpu_us_per_op > 0.0, "Stratus's rows together show CPU:\n{stdout}");
}
