//! A local cluster stopped in order (SIGTERM to `stratus up`) and started again on the same
//! directory reads as a restart: every server keeps its index (the README's `stratus table
//! migrate … 2` still names a server), the data is all there, INFO counts no removed server as
//! unreachable, and neither run logs a warning or an error.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{stratus_binary, Process};

/// How long a recovery after the restart may take before the test gives up.
const RECOVERY_PATIENCE: Duration = Duration::from_secs(60);

/// `stratus ARGUMENTS` against `coordinator`: (success, stdout, stderr).
fn stratus(coordinator: &str, arguments: &[&str]) -> (bool, String, String) {
    let output = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_COORDINATOR", coordinator)
        .stdin(Stdio::null())
        .output()
        .expect("run stratus");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// `stratus up` on `data` with three servers, logging at info; returns it, the coordinator's
/// address and server 0's RESP address.
fn start_up(data: &Path) -> (Process, String, String) {
    let arguments = [
        "--coordinator",
        "127.0.0.1:0",
        "up",
        "--dir",
        &data.display().to_string(),
        "--servers",
        "3",
        "--log-mib",
        "16",
        "--segment-mib",
        "1",
        "--resp-port",
        "0",
    ]
    .map(String::from);
    let up = Process::start_logging(&arguments, "info");
    let resp = up.wait_for_line("redis: server-0 ", Duration::from_secs(60));
    let resp = resp.split_whitespace().last().expect("an address").to_string();
    let ready = up.wait_for_line("ready", Duration::from_secs(60));
    let coordinator = ready.split("coordinator ").nth(1).and_then(|rest| rest.split(',').next());
    (up, coordinator.expect("the coordinator in the ready line").to_string(), resp)
}

fn stop_up(mut up: Process) {
    up.signal(libc::SIGTERM);
    let exit = up.wait_exit(Duration::from_secs(60)).expect("stratus up stops on SIGTERM");
    assert!(exit.success(), "{exit:?}");
}

/// `stratus status --json`, parsed.
fn status(coordinator: &str) -> serde_json::Value {
    let (success, stdout, stderr) = stratus(coordinator, &["status", "--json"]);
    assert!(success, "{stderr}");
    serde_json::from_str(&stdout).expect("status --json prints JSON")
}

/// Waits until every tablet is served again (bounded); returns the last status.
fn wait_for_every_tablet(coordinator: &str) -> serde_json::Value {
    let deadline = Instant::now() + RECOVERY_PATIENCE;
    loop {
        let status = status(coordinator);
        let tablets: Vec<&serde_json::Value> = status["tables"]
            .as_array()
            .expect("tables")
            .iter()
            .flat_map(|table| table["tablets"].as_array().expect("tablets"))
            .collect();
        if !tablets.is_empty() && tablets.iter().all(|tablet| tablet["state"] == "normal") {
            return status;
        }
        assert!(Instant::now() < deadline, "tablets not served again in time: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One RESP command on a new connection; the reply's first line and, for a bulk string, its
/// body.
fn resp_call(address: &str, arguments: &[&str]) -> String {
    let mut stream = TcpStream::connect(address).expect("connect to the RESP port");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut request = format!("*{}\r\n", arguments.len());
    for argument in arguments {
        request.push_str(&format!("${}\r\n{argument}\r\n", argument.len()));
    }
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    if let Some(length) = line.strip_prefix('$').and_then(|n| n.trim().parse::<usize>().ok()) {
        let mut body = vec![0; length + 2];
        std::io::Read::read_exact(&mut reader, &mut body).unwrap();
        return String::from_utf8_lossy(&body[..length]).into_owned();
    }
    line
}

/// Every WARN or ERROR line of the logs of both runs.
fn warnings_and_errors(logs: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(logs).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        found.extend(
            text.lines()
                .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
                .map(|line| format!("{name}: {line}")),
        );
    }
    found
}

#[test]
fn a_cluster_stopped_in_order_restarts_calmly_and_keeps_its_server_indexes() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let (up, coordinator, _) = start_up(&data);
    assert!(stratus(&coordinator, &["table", "create", "users", "--span", "2"]).0);
    for index in 0..20 {
        let key = format!("key-{index}");
        assert!(stratus(&coordinator, &["put", "users", &key, &format!("value-{index}")]).0);
    }
    assert!(stratus(&coordinator, &["incr", "users", "visits", "5"]).0);
    stop_up(up);

    let (up, coordinator, resp) = start_up(&data);
    let status = wait_for_every_tablet(&coordinator);
    let mut serving: Vec<String> = status["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .filter(|server| server["status"] == "up")
        .map(|server| {
            let id = server["server_id"].as_u64().expect("an id");
            stratus_types::ServerId(id).to_string()
        })
        .collect();
    serving.sort();
    assert_eq!(serving, ["1.1", "2.1", "3.1"], "each server is back at its index: {status}");
    for index in 0..20 {
        let (found, value, stderr) =
            stratus(&coordinator, &["get", "users", &format!("key-{index}")]);
        assert!(found, "key-{index} after the restart: {stderr}");
        assert_eq!(value, format!("value-{index}\n"));
    }
    assert_eq!(stratus(&coordinator, &["get", "users", "visits", "--int"]).1, "5\n");
    // The README's example names a server by its index, whatever its generation.
    let (migrated, said, stderr) =
        stratus(&coordinator, &["table", "migrate", "users", "0x0", "2"]);
    assert!(migrated, "{stderr}");
    assert_eq!(said, "migrated users tablet 0x0000000000000000 to server 2.1\n");
    // The servers of the first run are no unreachable masters.
    let info = resp_call(&resp, &["INFO", "stratus"]);
    assert!(info.contains("stratus_servers:3\r\n"), "{info}");
    assert!(info.contains("stratus_masters_unreachable:0\r\n"), "{info}");
    stop_up(up);
    // Each run has a log of its own: the first run's is kept beside the second's.
    let logs = data.join("logs");
    let first = std::fs::read_to_string(logs.join("coordinator.previous.log")).unwrap();
    let second = std::fs::read_to_string(logs.join("coordinator.log")).unwrap();
    assert!(first.contains("created an empty metadata log"), "{first}");
    assert!(!second.contains("created an empty metadata log"), "{second}");
    let noisy = warnings_and_errors(&logs);
    assert!(
        noisy.is_empty(),
        "a stop and a restart in order log no warning:\n{}",
        noisy.join("\n")
    );
}
