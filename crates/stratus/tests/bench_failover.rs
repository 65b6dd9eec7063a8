//! `stratus bench failover` end to end, scaled down: a master is killed and the server holding
//! the most open replicas is paused under a steady workload; every operation completes, and
//! each event reports the failed servers' keys and all others.

mod common;

use std::time::Duration;

use common::run_bench;

/// The most the scaled-down benchmark may take.
const BENCH_PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn bench_failover_reports_every_event_for_both_groups_of_keys() {
    let arguments = [
        "bench",
        "failover",
        "--servers",
        "4",
        "--replicas",
        "2",
        "--keys",
        "100",
        "--clients",
        "2",
        "--observe-seconds",
        "4",
        "--events",
        "kill-master,pause-backup",
    ];
    let (stdout, rows) = run_bench(&arguments, BENCH_PATIENCE);
    let row_of = |event: &str, group: &str| {
        rows.iter()
            .find(|row| row["event"] == event && row["keys_of"] == group)
            .unwrap_or_else(|| panic!("no row for {event} / {group}:\n{stdout}"))
    };
    for event in ["kill-master", "pause-backup-3s"] {
        let failed = row_of(event, "failed");
        let others = row_of(event, "others");
        let number = |row: &common::BenchRow, field: &str| {
            row[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {row:?}"))
        };
        // The keys are dealt over four masters (one table each), one of which failed; after
        // the first event, a recovered table may have joined another master's.
        assert_eq!(number(failed, "keys") + number(others, "keys"), 100.0, "{stdout}");
        assert!(number(failed, "keys") >= 25.0 && number(others, "keys") >= 25.0, "{stdout}");
        // Operations wait for a recovery rather than fail, on either group.
        for row in [failed, others] {
            assert_eq!(number(row, "errors"), 0.0, "{row:?}");
            assert!(number(row, "operations") > 0.0, "{row:?}");
            assert!(number(row, "longest_stall_ms") >= number(row, "p99_ms"), "{row:?}");
        }
        // The failed master's keys waited for its crash to be detected and its data recovered.
        assert!(number(failed, "served_again_ms") > 0.0, "{failed:?}");
        assert_eq!(others["stall_goal_ms"], 250, "{others:?}");
        assert!(others["goal_met"].is_boolean(), "{others:?}");
        if event == "kill-master" {
            // A killed master's keys are held to detection + 2 x the recovery's physical bound.
            let detection = number(failed, "detection_ms");
            let bound = number(failed, "physical_bound_ms");
            assert!(detection > 0.0 && bound >= 0.0, "{failed:?}");
            let goal = number(failed, "served_again_goal_ms");
            assert!((goal - (detection + 2.0 * bound)).abs() < 0.01, "{failed:?}");
            assert!(failed["goal_met"].is_boolean(), "{failed:?}");
        } else {
            assert!(failed["goal_met"].is_null(), "{failed:?}");
            assert!(failed["detection_ms"].is_null(), "{failed:?}");
        }
    }
}
