//! The command-line interface against a cluster started with `stratus up`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{stratus_binary, Process};

struct CommandOutput {
    success: bool,
    stdout: Vec<u8>,
    stderr: String,
}

fn stratus(coordinator: &str, arguments: &[&str], stdin: Option<&[u8]>) -> CommandOutput {
    let mut child = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_COORDINATOR", coordinator)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run stratus");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    CommandOutput {
        success: output.status.success(),
        stdout: output.stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The coordinator address in `stratus up`'s ready line ("… ready: coordinator ADDRESS, …").
fn coordinator_of(ready: &str) -> String {
    let rest = ready.split("coordinator ").nth(1).expect("the coordinator in the ready line");
    rest.split(',').next().expect("an address").to_string()
}

fn text(output: &CommandOutput) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn cli_against_a_local_cluster() {
    let directory = tempfile::tempdir().unwrap();
    // Port 0: the coordinator picks a free port itself, and the ready line names it.
    let coordinator = "127.0.0.1:0".to_string();
    let data = directory.path().join("data");
    // Logging at info: the children's log files are checked for plain text at the end.
    let mut up = Process::start_logging(
        &[
            "--coordinator".to_string(),
            coordinator.clone(),
            "up".to_string(),
            "--dir".to_string(),
            data.display().to_string(),
            "--servers".to_string(),
            "2".to_string(),
            "--log-mib".to_string(),
            "16".to_string(),
            "--segment-mib".to_string(),
            "1".to_string(),
            "--racks".to_string(),
            "2".to_string(),
        ],
        "info",
    );
    let coordinator = coordinator_of(&up.wait_for_line("ready", Duration::from_secs(60)));

    let created = stratus(&coordinator, &["table", "create", "users", "--span", "2"], None);
    assert!(created.success, "{}", created.stderr);
    assert_eq!(text(&created).trim(), "1");
    let put = stratus(&coordinator, &["put", "users", "alice", "hello world"], None);
    assert!(put.success, "{}", put.stderr);
    let get = stratus(&coordinator, &["get", "users", "alice"], None);
    assert!(get.success);
    assert_eq!(text(&get), "hello world\n");

    // Binary values through stdin and --raw.
    let binary: Vec<u8> = (0..=255u8).collect();
    assert!(stratus(&coordinator, &["put", "users", "blob"], Some(&binary)).success);
    let raw = stratus(&coordinator, &["get", "users", "blob", "--raw"], None);
    assert_eq!(raw.stdout, binary);

    let incremented = stratus(&coordinator, &["incr", "users", "visits", "5"], None);
    assert_eq!(text(&incremented).trim(), "5");
    let decremented = stratus(&coordinator, &["incr", "users", "visits", "-2"], None);
    assert_eq!(text(&decremented).trim(), "3");

    let scan = stratus(&coordinator, &["scan", "users"], None);
    assert!(scan.success);
    let lines = text(&scan);
    assert_eq!(lines.lines().count(), 3, "{lines}");
    assert!(lines.lines().any(|line| line == "alice\thello world"));

    assert!(stratus(&coordinator, &["del", "users", "alice"], None).success);
    let missing = stratus(&coordinator, &["get", "users", "alice"], None);
    assert!(!missing.success);
    assert!(missing.stderr.contains("object doesn't exist"), "{}", missing.stderr);
    let no_table = stratus(&coordinator, &["get", "nosuchtable", "k"], None);
    assert!(!no_table.success);
    assert!(no_table.stderr.contains("table doesn't exist"), "{}", no_table.stderr);

    let list = stratus(&coordinator, &["table", "list"], None);
    assert!(text(&list).starts_with("users\tid=1\ttablets=2\ttier=memory"));
    // The status is a table a person scans: a header, one line per server, short lines.
    let status = stratus(&coordinator, &["status"], None);
    assert!(status.success, "{}", status.stderr);
    let status_text = text(&status);
    assert!(status_text.starts_with("SERVER  ADDRESS "), "{status_text}");
    assert_eq!(status_text.lines().filter(|line| line.contains("  up  ")).count(), 2);
    assert!(status_text.lines().all(|line| line.len() <= 120), "{status_text}");
    assert_eq!(status_text.matches("users  1   memory  0x").count(), 2, "{status_text}");
    // And the same figures as JSON for scripts.
    let json = stratus(&coordinator, &["status", "--json"], None);
    assert!(json.success, "{}", json.stderr);
    let status: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let servers = status["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2, "{status}");
    assert!(servers.iter().all(|server| server["status"] == "up"), "{status}");
    // `--racks 2`: one server in each rack.
    let mut racks: Vec<&str> =
        servers.iter().map(|server| server["failure_domain"].as_str().unwrap()).collect();
    racks.sort_unstable();
    assert_eq!(racks, ["rack-0", "rack-1"], "{status}");
    let objects: u64 =
        servers.iter().map(|server| server["master"]["objects_live"].as_u64().unwrap()).sum();
    assert_eq!(objects, 2, "blob and visits: {status}");
    assert_eq!(status["tables"][0]["tablets"].as_array().unwrap().len(), 2, "{status}");
    assert_eq!(status["tables"][0]["tier"], "memory", "{status}");

    // Counters print as numbers when asked; other values are refused for it.
    let counter = stratus(&coordinator, &["get", "users", "visits", "--int"], None);
    assert_eq!((counter.success, text(&counter)), (true, "3\n".to_string()), "{}", counter.stderr);
    let not_counter = stratus(&coordinator, &["get", "users", "blob", "--int"], None);
    assert!(!not_counter.success);
    assert_eq!(
        not_counter.stderr,
        "stratus: the value is 256 bytes, not an integer of 8 (as `incr` keeps them)\n"
    );
    // Local files that cannot be used fail alike, naming the file, whichever way they go.
    let unwritable =
        stratus(&coordinator, &["get", "users", "blob", "--output", "/nonexistent/x"], None);
    assert!(!unwritable.success);
    assert!(
        unwritable.stderr.starts_with("stratus: cannot write /nonexistent/x: "),
        "{}",
        unwritable.stderr
    );
    let unreadable =
        stratus(&coordinator, &["put", "users", "k", "--file", "/nonexistent/x"], None);
    assert!(!unreadable.success);
    assert!(
        unreadable.stderr.starts_with("stratus: cannot read /nonexistent/x: "),
        "{}",
        unreadable.stderr
    );
    // Objects that expire: a time to live on put, shown by ttl, changed by expire.
    let session = stratus(&coordinator, &["put", "users", "session", "token", "--ttl", "1h"], None);
    assert!(session.success, "{}", session.stderr);
    let left = text(&stratus(&coordinator, &["ttl", "users", "session"], None));
    let seconds: f64 = left.trim().trim_end_matches('s').parse().expect("seconds left");
    assert!((3_500.0..=3_600.0).contains(&seconds), "{left}");
    assert!(stratus(&coordinator, &["expire", "users", "session", "--never"], None).success);
    assert_eq!(text(&stratus(&coordinator, &["ttl", "users", "session"], None)), "no expiry\n");
    assert!(stratus(&coordinator, &["expire", "users", "session", "200ms"], None).success);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stratus(&coordinator, &["get", "users", "session"], None).success {
        assert!(std::time::Instant::now() < deadline, "the session never expired");
        std::thread::sleep(Duration::from_millis(50));
    }
    let expired = stratus(&coordinator, &["ttl", "users", "session"], None);
    assert_eq!(expired.stderr, "stratus: object doesn't exist\n");
    stratus(&coordinator, &["del", "users", "session"], None);

    // A value over the servers' limit (an eighth of a 1 MiB segment here) names the limit.
    let big = directory.path().join("big");
    std::fs::write(&big, vec![b'x'; 200 << 10]).unwrap();
    let refused =
        stratus(&coordinator, &["put", "users", "big", "--file", big.to_str().unwrap()], None);
    assert!(!refused.success);
    assert_eq!(
        refused.stderr,
        "stratus: value too large: a value of 204800 bytes; this server takes values of at most \
         131072 bytes (--value-bytes-max)\n"
    );

    // A transaction from the shell: a transfer between two keys on (likely) two masters.
    let opening = b"set users from 100\nset users to 0\n";
    let opened = stratus(&coordinator, &["tx"], Some(opening));
    assert!(opened.success, "{}", opened.stderr);
    assert_eq!(text(&opened), "committed\n");
    let script = b"# move 30\nget users from\nset users from 70\nget users to\nset users to 30\n\
                   get users from\nincr users counter 5\n";
    let moved = stratus(&coordinator, &["tx"], Some(script));
    assert!(moved.success, "{}", moved.stderr);
    // Reads inside see the transaction's own writes.
    assert_eq!(text(&moved), "from\t100\nto\t0\nfrom\t70\ncounter\t5\ncommitted\n");
    assert_eq!(text(&stratus(&coordinator, &["get", "users", "to"], None)), "30\n");
    let bad = stratus(&coordinator, &["tx"], Some(b"get users\n"));
    assert!(!bad.success);
    assert!(bad.stderr.starts_with("stratus: line 1:"), "{}", bad.stderr);

    // Every failure is one line.
    let empty_key = stratus(&coordinator, &["get", "users", ""], None);
    assert!(!empty_key.success);
    assert_eq!(
        empty_key.stderr,
        "stratus: invalid key: a key is 1 to 65535 bytes, this one is 0\n"
    );

    assert!(stratus(&coordinator, &["table", "drop", "users"], None).success);
    assert!(text(&stratus(&coordinator, &["table", "list"], None)).is_empty());

    up.signal(libc::SIGTERM);
    let exit = up.wait_exit(Duration::from_secs(30)).expect("stratus up stops on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    let unreachable = stratus(&coordinator, &["--timeout-ms", "500", "table", "list"], None);
    assert!(!unreachable.success, "the cluster is gone after stratus up exits");
    // The children's logs are plain text, for reading with any tool.
    for name in ["coordinator", "server-0", "server-1"] {
        let log = std::fs::read_to_string(data.join("logs").join(format!("{name}.log"))).unwrap();
        assert!(name == "coordinator" || log.contains(" INFO "), "{name}.log: {log}");
        assert!(!log.contains('\u{1b}'), "{name}.log holds terminal escapes: {log}");
    }
    // `stratus up` gives every server a flash log in its own directory of the cluster's.
    for index in 0..2 {
        let log = std::fs::read_to_string(data.join("logs").join(format!("server-{index}.log")));
        let flash = data.join(format!("server-{index}")).join("flash");
        let line = format!("flash tier dir={} bytes_max=4294967296", flash.display());
        assert!(log.unwrap().contains(&line), "server-{index} has no {line:?}");
    }
}

/// `stratus up` killed with SIGKILL (no chance to stop its children) must not leave its
/// coordinator and servers running: they notice their parent is gone and stop.
#[test]
fn servers_of_a_killed_up_stop_by_themselves() {
    let directory = tempfile::tempdir().unwrap();
    // Port 0: the coordinator picks a free port itself, and the ready line names it.
    let coordinator = "127.0.0.1:0".to_string();
    let data = directory.path().join("data");
    let up = Process::start(&[
        "--coordinator".to_string(),
        coordinator.clone(),
        "up".to_string(),
        "--dir".to_string(),
        data.display().to_string(),
        "--servers".to_string(),
        "2".to_string(),
        "--log-mib".to_string(),
        "16".to_string(),
        "--segment-mib".to_string(),
        "1".to_string(),
    ]);
    let coordinator = coordinator_of(&up.wait_for_line("ready", Duration::from_secs(60)));
    let listed = stratus(&coordinator, &["status", "--json"], None);
    assert!(listed.success, "{}", listed.stderr);
    let status: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let servers: Vec<String> = status["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|server| server["address"].as_str().expect("an address").to_string())
        .collect();
    assert_eq!(servers.len(), 2, "{status}");
    up.signal(libc::SIGKILL);
    // Every port stops answering within a bounded time.
    for address in servers.iter().chain(std::iter::once(&coordinator)) {
        assert!(
            stops_answering(address),
            "{address} still accepts connections after its `up` was killed"
        );
    }
}

/// Whether `address` stops accepting connections within about 10 s.
fn stops_answering(address: &str) -> bool {
    for _ in 0..200 {
        if std::net::TcpStream::connect(address).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A loopback address whose port and the next were both free a moment ago (`up` puts its
/// second coordinator on the next port).
fn two_free_ports() -> String {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else { continue };
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    panic!("no two consecutive free ports on loopback");
}

/// `stratus up --coordinators 2`: the metadata lives in an etcd that `up` starts, the second
/// coordinator stands by, and when the active one is killed the standby takes over while `up`
/// and the cluster carry on. An `up` killed with SIGKILL leaves no etcd behind.
///
/// Needs the `etcd` binary (Debian: etcd-server); without it the test fails.
#[test]
fn up_with_a_standby_coordinator_survives_the_active_one_dying() {
    let etcd_binary = std::env::var("STRATUS_ETCD_BINARY").unwrap_or_else(|_| "etcd".to_string());
    common::require_installed(&etcd_binary);
    let directory = tempfile::tempdir().unwrap();
    let first = two_free_ports();
    let data = directory.path().join("data");
    let mut up = Process::start(&[
        "--coordinator".to_string(),
        first.clone(),
        "up".to_string(),
        "--dir".to_string(),
        data.display().to_string(),
        "--coordinators".to_string(),
        "2".to_string(),
        "--servers".to_string(),
        "3".to_string(),
        "--log-mib".to_string(),
        "16".to_string(),
        "--segment-mib".to_string(),
        "1".to_string(),
    ]);
    let patience = Duration::from_secs(60);
    let coordinators_line = up.wait_for_line("coordinators:", patience);
    let processes_line = up.wait_for_line("processes:", patience);
    let ready = up.wait_for_line("ready", patience);
    // "coordinators: A active, B standing by; metadata in etcd at http://HOST:PORT (pid N)"
    let standby = coordinators_line
        .split(" active, ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("the standby's address")
        .to_string();
    assert!(coordinators_line.starts_with(&format!("coordinators: {first} active")));
    let etcd_address = coordinators_line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("etcd's address")
        .to_string();
    let both = format!("{first},{standby}");
    assert!(ready.contains(&both), "{ready}");
    let active_pid: i32 = processes_line
        .split_whitespace()
        .find_map(|entry| entry.strip_prefix("coordinator="))
        .and_then(|pid| pid.parse().ok())
        .expect("the active coordinator's pid");

    let created = stratus(&both, &["table", "create", "users", "--span", "3"], None);
    assert!(created.success, "{}", created.stderr);
    assert!(stratus(&both, &["put", "users", "alice", "before"], None).success);

    common::send_signal(active_pid, libc::SIGKILL);
    up.wait_for_line("coordinator exited", patience);
    // The standby takes over once the lease runs out; the command waits for it.
    let created = stratus(&both, &["--timeout-ms", "60000", "table", "create", "later"], None);
    assert!(created.success, "{}", created.stderr);
    let get = stratus(&both, &["get", "users", "alice"], None);
    assert!(get.success, "{}", get.stderr);
    assert_eq!(text(&get), "before\n");
    assert!(stratus(&both, &["put", "users", "bob", "after"], None).success);
    assert!(up.wait_exit(Duration::from_millis(500)).is_none(), "up stopped with the coordinator");

    up.signal(libc::SIGKILL);
    assert!(stops_answering(&etcd_address), "etcd outlived its `up`");
    assert!(stops_answering(&standby), "the coordinator outlived its `up`");
}
