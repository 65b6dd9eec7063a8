//! `stratus bench latency` end to end, scaled down: writes and reads are measured with and
//! without a replica, after the warm-up made the cleaner run, beside Redis with one replica and
//! WAIT where redis-server is installed; Stratus's writes with exactly-once on and off, with a
//! row comparing them; every row is complete, CPU included.

mod common;

use std::time::Duration;

use common::{installed, number, run_bench, BenchRow};

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_latency_measures_writes_and_reads_for_each_replica_count() {
    let required = std::env::var_os("STRATUS_REQUIRE_PEERS").is_some();
    let with_redis = installed("redis-server");
    assert!(with_redis || !required, "STRATUS_REQUIRE_PEERS is set but redis-server is missing");
    let redis = if with_redis { "wait-1" } else { "" };
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
        "1000",
        "--redis",
        redis,
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let of_system = |system: &str| -> Vec<&BenchRow> {
        rows.iter().filter(|row| row["system"] == system).collect()
    };
    let measured: Vec<&BenchRow> =
        rows.iter().filter(|row| row["system"] == "stratus" || row["system"] == "redis").collect();
    let ratios = of_system("ratio");
    let mut expected = vec![
        ("stratus", "r0-buffered", "write", 0.0, "on"),
        ("stratus", "r0-buffered", "write", 0.0, "off"),
        ("stratus", "r0-buffered", "read", 0.0, ""),
        ("stratus", "r1-buffered", "write", 1.0, "on"),
        ("stratus", "r1-buffered", "write", 1.0, "off"),
        ("stratus", "r1-buffered", "read", 1.0, ""),
    ];
    if with_redis {
        expected
            .extend([("redis", "wait-1", "write", 1.0, ""), ("redis", "wait-1", "read", 1.0, "")]);
    }
    assert_eq!(
        measured.len(),
        expected.len(),
        "two write rows (exactly-once on, off) and a read row per Stratus configuration, a \
         write and a read row per Redis one:\n{stdout}"
    );
    for (row, (system, config, op, replicas, exactly_once)) in measured.iter().zip(expected) {
        assert_eq!(row["bench"], "latency");
        assert_eq!((row["system"].as_str(), row["config"].as_str()), (Some(system), Some(config)));
        assert_eq!(row["op"], op);
        if exactly_once.is_empty() {
            assert!(row.get("exactly_once").is_none(), "{row:?}");
        } else {
            assert_eq!(row["exactly_once"], exactly_once, "{row:?}");
        }
        assert_eq!(number(row, "replicas"), replicas);
        assert_eq!(number(row, "operations"), 1000.0);
        assert!(number(row, "p50_us") > 0.0 && number(row, "p50_us") <= number(row, "p99_us"));
        assert!(number(row, "p99_us") <= number(row, "p999_us"), "{row:?}");
        assert!(number(row, "ops_per_sec") > 0.0, "{row:?}");
        assert!(number(row, "driver_cpu_us_per_op") >= 0.0, "{row:?}");
        match (system, op) {
            // The warm-up ran until the master cleaned; the measured writes are counted.
            ("stratus", "write") => assert!(number(row, "cleaner_passes") >= 0.0, "{row:?}"),
            _ => assert!(row["cleaner_passes"].is_null(), "{row:?}"),
        }
        // A cluster of three processes (up, coordinator inside it, two servers) and Redis's two
        // processes doing 1 000 replicated writes accumulate clock ticks; reads may round to 0.
        if op == "write" && replicas == 1.0 {
            assert!(number(row, "cpu_us_per_op") > 0.0, "{row:?}");
        }
        let processes = number(row, "cpu_processes");
        assert!(if system == "redis" { processes == 2.0 } else { processes >= 3.0 }, "{row:?}");
    }
    // What exactly-once adds, per Stratus configuration.
    let exactly_once = of_system("exactly-once-ratio");
    assert_eq!(exactly_once.len(), 2, "{stdout}");
    for (row, config) in exactly_once.iter().zip(["r0-buffered", "r1-buffered"]) {
        assert_eq!(row["config"], config);
        for field in ["write_p50_added_fraction", "write_throughput_lost_fraction"] {
            assert!(number(row, field).is_finite() && number(row, field) > -1.0, "{row:?}");
        }
    }
    if with_redis {
        assert_eq!(ratios.len(), 1, "one goal row, for R = 1:\n{stdout}");
        assert_eq!(number(ratios[0], "replicas"), 1.0);
        for field in
            ["write_p50_over_redis_wait", "write_p50_over_read_p50", "write_cpu_over_redis_wait"]
        {
            assert!(number(ratios[0], field) > 0.0, "{field}: {:?}", ratios[0]);
        }
    } else {
        assert!(ratios.is_empty(), "{stdout}");
    }
}

#[test]
fn bench_latency_measures_each_configuration_with_and_without_tls() {
    common::require_installed("redis-server");
    let arguments = [
        "bench",
        "latency",
        "--replicas",
        "1",
        "--durability",
        "buffered",
        "--servers",
        "2",
        "--operations",
        "500",
        "--exactly-once",
        "on",
        "--redis",
        "wait-1",
        "--tls",
        "off,on",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let measured: Vec<(String, String, String)> = rows
        .iter()
        .filter(|row| row["system"] == "stratus" || row["system"] == "redis")
        .map(|row| {
            let text = |field: &str| row[field].as_str().unwrap_or_default().to_string();
            (text("system"), text("config"), text("op"))
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("stratus", "r1-buffered", "write"),
        ("stratus", "r1-buffered", "read"),
        ("stratus", "r1-buffered+tls", "write"),
        ("stratus", "r1-buffered+tls", "read"),
        ("redis", "wait-1", "write"),
        ("redis", "wait-1", "read"),
        ("redis", "wait-1+tls", "write"),
        ("redis", "wait-1+tls", "read"),
    ]
    .map(|(system, config, op)| (system.to_string(), config.to_string(), op.to_string()))
    .to_vec();
    assert_eq!(measured, expected, "{stdout}");
    // One on/off ratio per system and operation, each a positive number; the CPU ratio is
    // null when a phase this short counted no CPU clock tick on one side.
    let ratios: Vec<&BenchRow> = rows.iter().filter(|row| row["system"] == "tls-ratio").collect();
    assert_eq!(ratios.len(), 4, "{stdout}");
    for ratio in ratios {
        for field in ["p50_on_over_off", "throughput_on_over_off"] {
            assert!(number(ratio, field) > 0.0, "{ratio:?}");
        }
        let cpu = &ratio["cpu_on_over_off"];
        assert!(cpu.is_null() || cpu.as_f64().is_some_and(|value| value > 0.0), "{ratio:?}");
    }
}
