//! `stratus bench rpc` end to end, scaled down: reads through Stratus and a raw TCP echo, each
//! row with its CPU per operation on the server side and in the driver.

mod common;

use std::time::Duration;

use common::run_bench;

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_rpc_reports_latency_and_cpu_beside_a_tcp_echo() {
    let arguments = ["bench", "rpc", "--operations", "4000", "--clients", "1,4"];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let measured: Vec<_> = rows.iter().filter(|row| row["system"] != "ratio").collect();
    assert_eq!(measured.len(), 4, "stratus and tcp-echo for 1 and 4 clients:\n{stdout}");
    let mut server_cpu = std::collections::BTreeMap::new();
    for row in measured {
        let number =
            |field: &str| row[field].as_f64().unwrap_or_else(|| panic!("{field}: {row:?}"));
        assert_eq!(row["bench"], "rpc");
        assert!(number("p50_us") > 0.0 && number("ops_per_sec") > 0.0, "{row:?}");
        assert!(number("cpu_us_per_op") >= 0.0 && number("driver_cpu_us_per_op") >= 0.0);
        assert!(number("cpu_processes") >= 1.0, "{row:?}");
        *server_cpu.entry(row["system"].as_str().unwrap().to_string()).or_insert(0.0) +=
            number("cpu_us_per_op");
    }
    // The cluster (coordinator and server) serving 4 500 reads per row cannot round to zero.
    assert!(server_cpu["stratus"] > 0.0, "{stdout}");
    assert!(rows.iter().any(|row| row["system"] == "ratio"), "{stdout}");
}
