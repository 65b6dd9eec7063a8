//! `stratus workload` against a real cluster: a short mixed phase passes the checks (the bank's
//! transfers and audits among them), and `--availability-out` records every operation with its
//! master; the list-append transactions check out too.

mod common;

use std::process::{Command, Stdio};

use common::{stratus_binary, TestCluster};

#[test]
fn a_short_workload_is_linearizable_and_times_every_operation_with_its_master() {
    let cluster = TestCluster::start(2);
    let directory = tempfile::tempdir().unwrap();
    let availability = directory.path().join("availability.txt");
    let output = Command::new(stratus_binary())
        .args(["--coordinator", &cluster.coordinator_address, "workload"])
        .args(["--seconds", "2", "--servers", "2", "--clients", "2", "--rate", "200"])
        .args(["--settle-seconds", "30", "--startup-seconds", "30"])
        .args(["--bank-accounts", "8", "--bank-clients", "2"])
        .arg("--availability-out")
        .arg(&availability)
        .stdin(Stdio::null())
        .output()
        .expect("run stratus workload");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("verdict=linearizable"), "{stdout}");
    // The bank ran and kept its money: 8 accounts of 1 000.
    assert!(stdout.contains("bank_total=8000/8000"), "{stdout}");
    assert!(!stdout.contains("bank_transfers=0 "), "{stdout}");

    let masters: Vec<String> =
        cluster.servers.iter().map(|server| server.address.clone().unwrap()).collect();
    let text = std::fs::read_to_string(&availability).unwrap();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("# start_us end_us key_index owner"));
    let mut timed = 0;
    let mut last_start = 0u64;
    for line in lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 4, "{line}");
        let start: u64 = fields[0].parse().unwrap();
        let end: u64 = fields[1].parse().unwrap();
        assert!(start <= end && start >= last_start, "{line}");
        last_start = start;
        assert!(fields[2].parse::<u32>().unwrap() < 64, "{line}");
        // The first operations may start before the first sample of the owners.
        assert!(fields[3] == "-" || masters.iter().any(|master| master == fields[3]), "{line}");
        timed += 1;
    }
    assert!(timed > 100, "only {timed} operations timed");
    let attributed = text.lines().skip(1).filter(|line| !line.ends_with(" -")).count();
    assert!(attributed * 2 > timed, "{attributed} of {timed} operations have an owner");
}

#[test]
fn a_short_list_append_workload_commits_transactions_without_anomalies() {
    let cluster = TestCluster::start(2);
    let output = Command::new(stratus_binary())
        .args(["--coordinator", &cluster.coordinator_address, "workload"])
        .args(["--seconds", "3", "--servers", "2", "--clients", "1", "--rate", "50"])
        .args(["--settle-seconds", "30", "--startup-seconds", "30"])
        .args(["--list-append-keys", "8", "--list-append-clients", "2"])
        .stdin(Stdio::null())
        .output()
        .expect("run stratus workload");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("workload: list_append "))
        .unwrap_or_else(|| panic!("no list-append summary:\n{stdout}"));
    println!("{summary}");
    assert!(summary.starts_with("workload: list_append ok "), "{summary}");
    assert!(summary.ends_with(" anomalies=0"), "{summary}");
    let field = |name: &str| -> u64 {
        let prefix = format!("{name}=");
        let value = summary.split(' ').find_map(|field| field.strip_prefix(&prefix[..]));
        value.unwrap_or_else(|| panic!("no {name} in {summary}")).parse().unwrap()
    };
    assert!(field("committed") > 10, "{summary}");
    assert!(field("committed_appends") > 0, "{summary}");
    assert!(field("reads_checked") > 10, "{summary}");
}
