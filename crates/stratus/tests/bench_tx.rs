//! `stratus bench tx` end to end, scaled down: every commit shape is measured beside the
//! single write with nothing aborted, the goal row compares 5 objects on 5 masters with the
//! write, and transactional YCSB commits on Stratus (and on Redis with a replica and WAIT
//! where redis-server is installed) for each mix, every row complete.

mod common;

use std::time::Duration;

use common::{installed, number, run_bench, BenchRow};

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_tx_measures_every_commit_shape_and_transactional_ycsb() {
    let required = std::env::var_os("STRATUS_REQUIRE_PEERS").is_some();
    let with_redis = installed("redis-server");
    assert!(with_redis || !required, "STRATUS_REQUIRE_PEERS is set but redis-server is missing");
    let redis = if with_redis { "true" } else { "false" };
    let arguments = [
        "bench",
        "tx",
        "--servers",
        "5",
        "--replicas",
        "1",
        "--transactions",
        "40",
        "--threads",
        "2",
        "--seconds",
        "1",
        "--read-percents",
        "50,100",
        "--records",
        "200",
        "--redis",
        redis,
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let commit: Vec<&BenchRow> = rows.iter().filter(|row| row["part"] == "commit").collect();
    let shapes: Vec<&str> = commit.iter().map(|row| row["shape"].as_str().unwrap()).collect();
    assert_eq!(
        shapes,
        ["write", "tx-1o1m", "tx-2o1m", "tx-2o2m", "tx-5o1m", "tx-5o5m"],
        "{stdout}"
    );
    for row in &commit {
        assert_eq!(number(row, "transactions"), 40.0, "{row:?}");
        // One transaction at a time over keys nobody else touches: nothing may abort.
        assert_eq!(number(row, "abort_rate"), 0.0, "{row:?}");
        assert!(number(row, "p50_us") > 0.0 && number(row, "p99_us") >= number(row, "p50_us"));
        // Present; CPU is read in clock ticks (10 ms), which 40 commits may not reach.
        assert!(number(row, "cpu_us_per_op") >= 0.0, "{row:?}");
    }
    let five_on_five = commit.iter().find(|row| row["shape"] == "tx-5o5m").unwrap();
    assert_eq!((number(five_on_five, "participants"), number(five_on_five, "objects")), (5.0, 5.0));
    let goal = rows.iter().find(|row| row["part"] == "commit-goal").expect("a goal row");
    assert!(number(goal, "ratio") > 0.0, "{goal:?}");

    let mut systems = vec!["stratus"];
    if with_redis {
        systems.push("redis");
    }
    for system in systems {
        for shape in ["ycsb-50/50", "ycsb-100/0"] {
            let row = rows
                .iter()
                .find(|row| {
                    row["part"] == "ycsb" && row["system"] == system && row["shape"] == shape
                })
                .unwrap_or_else(|| panic!("no {system} {shape} row:\n{stdout}"));
            assert_eq!(number(row, "threads"), 2.0);
            assert!(number(row, "committed_per_sec") > 0.0, "{row:?}");
            let abort_rate = number(row, "abort_rate");
            assert!((0.0..1.0).contains(&abort_rate), "{row:?}");
            if shape == "ycsb-100/0" && system == "stratus" {
                // Read-only transactions validate and never conflict with each other.
                assert_eq!(abort_rate, 0.0, "{row:?}");
            }
        }
    }
    let ratios = rows.iter().filter(|row| row["part"] == "ycsb-ratio").count();
    assert_eq!(ratios, if with_redis { 2 } else { 0 }, "{stdout}");
}
