//! `stratus bench ycsb` end to end, scaled down: workload A on Stratus and, where redis-server is
//! installed, on Redis with three replicas and WAIT (the peer at equal durability); every row
//! says what its phase cost in CPU.

mod common;

use std::time::Duration;

use common::{installed, run_bench};

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_ycsb_runs_workload_a_on_stratus_and_on_redis_with_replicas() {
    let required = std::env::var_os("STRATUS_REQUIRE_PEERS").is_some();
    let with_redis = installed("redis-server");
    assert!(
        with_redis || !required,
        "STRATUS_REQUIRE_PEERS is set but redis-server is not installed"
    );
    if !with_redis {
        eprintln!("NOTICE: redis-server not found (scripts/install-peers); Stratus only");
    }
    let systems = if with_redis { "stratus,redis" } else { "stratus" };
    let arguments = [
        "bench",
        "ycsb",
        "--workload",
        "a",
        "--systems",
        systems,
        "--configs",
        "r0,wait-3",
        "--records",
        "500",
        "--operations",
        "5000",
        "--threads",
        "2",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let mut seen = std::collections::BTreeSet::new();
    for row in &rows {
        let number =
            |field: &str| row[field].as_f64().unwrap_or_else(|| panic!("{field}: {row:?}"));
        let text = |field: &str| row[field].as_str().unwrap_or_else(|| panic!("{field}: {row:?}"));
        assert_eq!(row["bench"], "ycsb");
        assert!(number("ops_per_sec") > 0.0, "{row:?}");
        assert!(number("driver_cpu_us_per_op") >= 0.0, "{row:?}");
        // CPU is counted in clock ticks (10 ms): the load of 500 records may round to 0, the
        // run phase of 5 000 operations (hundreds of ms of several processes' work) cannot.
        assert!(number("cpu_us_per_op") >= 0.0, "{row:?}");
        if text("phase") == "run" {
            assert!(number("cpu_us_per_op") > 0.0, "{row:?}");
        }
        match (text("system"), text("config")) {
            ("stratus", "r0") => assert!(number("cpu_processes") >= 2.0, "{row:?}"),
            ("redis", "wait-3") => {
                assert_eq!(number("cpu_processes"), 4.0, "primary and 3 replicas")
            }
            other => panic!("unexpected configuration {other:?}"),
        }
        seen.insert((
            text("system").to_string(),
            text("phase").to_string(),
            text("op").to_string(),
        ));
    }
    let mut expected = vec![
        ("stratus", "load", "INSERT"),
        ("stratus", "run", "READ"),
        ("stratus", "run", "UPDATE"),
    ];
    if with_redis {
        expected.extend([
            ("redis", "load", "INSERT"),
            ("redis", "run", "READ"),
            ("redis", "run", "UPDATE"),
        ]);
    }
    for (system, phase, op) in expected {
        let key = (system.to_string(), phase.to_string(), op.to_string());
        assert!(seen.contains(&key), "no row for {key:?}:\n{stdout}");
    }
}

#[test]
fn bench_ycsb_runs_the_tls_configurations_when_named() {
    common::require_installed("redis-server");
    let arguments = [
        "bench",
        "ycsb",
        "--workload",
        "c",
        "--systems",
        "stratus,redis",
        "--configs",
        "r0+tls,everysec+tls",
        "--records",
        "300",
        "--operations",
        "2000",
        "--threads",
        "2",
        "--stratus-servers",
        "1",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let mut seen = std::collections::BTreeSet::new();
    for row in &rows {
        let text = |field: &str| row[field].as_str().unwrap_or_default().to_string();
        assert!(row["ops_per_sec"].as_f64().is_some_and(|rate| rate > 0.0), "{row:?}");
        seen.insert((text("system"), text("config"), text("phase"), text("op")));
    }
    let expected: std::collections::BTreeSet<_> = [
        ("stratus", "r0+tls", "load", "INSERT"),
        ("stratus", "r0+tls", "run", "READ"),
        ("redis", "everysec+tls", "load", "INSERT"),
        ("redis", "everysec+tls", "run", "READ"),
    ]
    .iter()
    .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
    .collect();
    assert_eq!(seen, expected, "{stdout}");
}
