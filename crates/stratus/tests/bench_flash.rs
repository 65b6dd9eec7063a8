//! `stratus bench flash` end to end, scaled down (1 MiB segments, a few thousand objects): every
//! row but the cleaning one (whose flash budget is at least 1 GiB) is printed once, with its objects demoted, its raw reference measured in the same run,
//! and figures that make sense; no duration is asserted.

mod common;

use std::time::Duration;

use common::{assert_positive, number, run_bench, BenchRow};

/// The most the scaled-down benchmark may take (it takes well under a minute).
const BENCH_PATIENCE: Duration = Duration::from_secs(240);

#[test]
fn bench_flash_prints_every_row_against_its_reference() {
    let arguments = [
        "bench",
        "flash",
        // The cleaning row fills a flash budget of whole GiB (0.8 GiB of objects at least):
        // not a scaled-down run; every other row is here.
        "--rows",
        "write,read,dram,ycsb",
        "--objects",
        "3000",
        "--replicas",
        "0,3",
        "--log-mib",
        "16",
        "--segment-mib",
        "1",
        "--flash-gib",
        "1",
        "--reads",
        "400",
        "--depth",
        "4",
        "--dram-objects",
        "3000",
        "--ycsb-log-mib",
        "16",
        "--ycsb-flash-records",
        "2000",
        "--ycsb-memory-records",
        "300",
        "--ycsb-operations",
        "400",
        "--ycsb-threads",
        "2",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let of = |row: &str| -> Vec<&BenchRow> {
        rows.iter().filter(|line| line["bench"] == "flash" && line["row"] == row).collect()
    };
    assert_eq!(rows.len(), 2 + 2 + 2 + 3, "write ×2, read ×2, dram ×2, ycsb ×3:\n{stdout}");

    let writes = of("write");
    let configs: Vec<_> = writes.iter().map(|row| row["config"].as_str().unwrap()).collect();
    assert_eq!(configs, ["r0", "r3"], "{stdout}");
    for row in &writes {
        assert_positive(
            row,
            &["objects_per_sec", "mb_per_sec", "raw_write_mb_per_sec", "ratio_to_raw"],
        );
        assert_positive(row, &["image_bytes_written", "image_mb_per_sec", "on_flash_seconds"]);
        assert!(number(row, "objects_demoted") >= 3000.0, "{row:?}");
        assert!(number(row, "on_flash_seconds") >= number(row, "acknowledged_seconds"));
        // An image holds at least the values it carries.
        assert!(number(row, "image_bytes_per_data_byte") >= 1.0, "{row:?}");
        assert!(["direct", "buffered+fdatasync"].contains(&row["raw_io"].as_str().unwrap()));
        assert!(["direct", "buffered"].contains(&row["server_flash_io"].as_str().unwrap()));
        assert!(number(row, "cpu_us_per_op") > 0.0, "{row:?}");
    }
    assert_eq!(number(writes[1], "servers"), 4.0);

    let reads = of("read");
    let depths: Vec<f64> = reads.iter().map(|row| number(row, "depth")).collect();
    assert_eq!(depths, [1.0, 4.0], "{stdout}");
    for row in &reads {
        assert_positive(row, &["p50_us", "p99_us", "ops_per_sec", "raw_p50_us", "raw_p99_us"]);
        assert_positive(row, &["raw_ops_per_sec", "throughput_ratio_to_raw", "cpu_us_per_op"]);
        assert!(number(row, "p50_us") <= number(row, "p99_us"), "{row:?}");
        assert!(number(row, "raw_p50_us") <= number(row, "raw_p99_us"), "{row:?}");
        assert!(number(row, "demoted_fraction") >= 1.0, "{row:?}");
        assert_eq!(number(row, "reads"), 400.0);
    }
    assert_positive(reads[0], &["memory_read_p50_us"]);
    assert!(reads[1]["memory_read_p50_us"].is_null(), "{:?}", reads[1]);

    let dram = of("dram");
    let sizes: Vec<f64> = dram.iter().map(|row| number(row, "value_bytes")).collect();
    assert_eq!(sizes, [100.0, 1024.0], "{stdout}");
    for row in &dram {
        assert_positive(row, &["stub_bytes_per_object", "hash_table_bytes_per_object"]);
        // A FLASH_OBJECT keeps the key (16 bytes) and its prefix, and is smaller than the object.
        let stub = number(row, "stub_bytes_per_object");
        assert!(stub > 16.0 && stub < number(row, "value_bytes"), "{row:?}");
        assert_eq!(number(row, "goal_bytes_per_object"), 16.0);
        assert!(number(row, "objects_demoted") >= 3000.0, "{row:?}");
    }

    let ycsb = of("ycsb");
    let workloads: Vec<_> = ycsb.iter().map(|row| row["workload"].as_str().unwrap()).collect();
    assert_eq!(workloads, ["a", "b", "c"], "{stdout}");
    for row in &ycsb {
        assert_positive(row, &["flash_ops_per_sec", "memory_ops_per_sec", "throughput_ratio"]);
        assert_positive(
            row,
            &["per_dollar_ratio", "per_dollar_ratio_values_only", "cpu_us_per_op"],
        );
        let ratio = number(row, "throughput_ratio");
        assert!((number(row, "per_dollar_ratio_values_only") - 23.0 * ratio).abs() < 0.05);
        assert!(number(row, "per_dollar_ratio") <= number(row, "per_dollar_ratio_values_only"));
        assert_eq!(number(row, "flash_records"), 2000.0);
    }
}
