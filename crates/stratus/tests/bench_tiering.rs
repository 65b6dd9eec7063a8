//! `stratus bench tiering` end to end, scaled down (a 2 MiB DRAM budget, a data set five times
//! it, short phases): every row is printed, the auto tier really demoted, the auto table kept
//! every key while Redis with the same budget evicted some; no duration or throughput is
//! asserted.

mod common;

use std::time::Duration;

use common::{assert_positive, number, require_installed, run_bench, BenchRow};

/// The most the scaled-down benchmark may take (it takes well under a minute).
const BENCH_PATIENCE: Duration = Duration::from_secs(110);

const REPEATS: usize = 2;
const SHIFTS: usize = 2;

fn a_ratio(row: &BenchRow, field: &str) {
    let value = number(row, field);
    assert!((0.0..=1.0).contains(&value), "{field} = {value}: {row:?}");
}

#[test]
fn bench_tiering_prints_every_row_and_the_auto_table_keeps_every_key() {
    require_installed("redis-server");
    let arguments = [
        "bench",
        "tiering",
        "--auto-dram-mib",
        "2",
        "--data-multiple",
        "5",
        "--threads",
        "2",
        "--operations",
        "1500",
        "--warmup-operations",
        "1500",
        "--repeats",
        "2",
        "--shift-seconds",
        "3",
        "--shifts",
        "2",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    assert!(rows.iter().all(|row| row["bench"] == "tiering"), "{stdout}");
    let of = |row: &str, kind: Option<&str>| -> Vec<&BenchRow> {
        rows.iter()
            .filter(|line| line["row"] == row)
            .filter(|line| kind.is_none_or(|kind| line["kind"] == kind))
            .collect()
    };

    let phases = of("ycsb", Some("phase"));
    assert_eq!(phases.len(), 2 * 2 * REPEATS, "B and C, auto and memory, each repeat:\n{stdout}");
    for row in &phases {
        assert_positive(row, &["ops_per_sec", "p50_us", "p99_us", "p999_us", "cpu_us_per_op"]);
        assert!(number(row, "p50_us") <= number(row, "p99_us"), "{row:?}");
        assert!(number(row, "p99_us") <= number(row, "p999_us"), "{row:?}");
        match row["system"].as_str() {
            Some("auto") => a_ratio(row, "dram_hit_ratio"),
            Some("memory") => assert!(row["dram_hit_ratio"].is_null(), "{row:?}"),
            other => panic!("system {other:?}: {row:?}"),
        }
    }
    let summaries = of("ycsb", Some("summary"));
    let workloads: Vec<_> = summaries.iter().map(|row| row["workload"].as_str().unwrap()).collect();
    assert_eq!(workloads, ["b", "c"], "{stdout}");
    for row in &summaries {
        assert_positive(row, &["auto_ops_per_sec", "memory_ops_per_sec", "throughput_ratio"]);
        assert_positive(row, &["auto_cpu_us_per_op", "memory_cpu_us_per_op"]);
        for field in
            ["dram_hit_ratio", "dram_hit_ratio_min", "dram_hit_ratio_max", "ideal_hit_ratio"]
        {
            a_ratio(row, field);
        }
        let ratio = number(row, "throughput_ratio");
        assert!(number(row, "throughput_ratio_min") <= ratio, "{row:?}");
        assert!(ratio <= number(row, "throughput_ratio_max"), "{row:?}");
        assert_eq!(number(row, "throughput_ratio_goal"), 0.7);
        assert_eq!(number(row, "dram_hit_ratio_goal"), 0.9);
        assert_eq!(number(row, "repeats"), REPEATS as f64);
    }

    let shifts = of("shifting", None);
    let numbers: Vec<f64> = shifts.iter().map(|row| number(row, "shift")).collect();
    assert_eq!(numbers, (0..SHIFTS).map(|shift| shift as f64).collect::<Vec<_>>(), "{stdout}");
    for row in &shifts {
        assert_positive(row, &["reads", "hot_keys"]);
        a_ratio(row, "hit_ratio_whole_shift");
        a_ratio(row, "hit_ratio_lowest");
        // Either the hit ratio came back within the shift, or the row says it did not.
        let recovered = row["recovered"].as_bool().unwrap();
        assert_eq!(recovered, !row["seconds_to_hit_ratio_goal"].is_null(), "{row:?}");
        a_ratio(row, "ideal_hit_ratio");
        for series in ["hit_ratio_per_second", "reads_per_second", "promotions_per_second"] {
            let seconds = row[series].as_str().unwrap().split(' ').count();
            assert_eq!(seconds, 3, "{series}: a sample a second: {row:?}");
        }
    }
    // The hot set moved to other keys.
    assert_ne!(shifts[0]["hot_first_key"], shifts[1]["hot_first_key"], "{stdout}");

    let lru = of("redis-lru", None);
    let systems: Vec<_> = lru.iter().map(|row| row["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["redis", "stratus"], "{stdout}");
    let records = number(lru[0], "records");
    assert!(records > 0.0);
    // Five times its maxmemory: Redis evicted keys; the auto table kept every one.
    let redis_kept = number(lru[0], "keys_kept");
    assert!(redis_kept < records, "Redis kept {redis_kept} of {records}: {:?}", lru[0]);
    assert!(number(lru[0], "evicted_keys") > 0.0, "{:?}", lru[0]);
    assert_eq!(number(lru[1], "keys_kept"), records, "{:?}", lru[1]);
    assert_eq!(number(lru[1], "lost_fraction"), 0.0);
    // The auto tier was exercised: segments were demoted, objects live on flash.
    assert_positive(lru[1], &["demotions_total", "flash_objects"]);
    assert_eq!(number(lru[1], "dram_objects") + number(lru[1], "flash_objects"), records);
}
