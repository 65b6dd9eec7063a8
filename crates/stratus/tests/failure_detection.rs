//! Failure detection by peers and impossible recoveries, with real processes.
//!
//! A paused (SIGSTOP) server is found by its peers' pings and reported to the coordinator, which
//! checks it and declares it crashed; its tablet is recovered elsewhere. The coordinator's own
//! sweep is pushed out of the test's reach, so only the peers' hints can have started it.
//!
//! A master that ran without replicas (R = 0) is killed: its tablet cannot be recovered, so it
//! is reported unavailable (clients fail at once, `stratus status` says so) until an operator
//! runs `stratus recovery accept-loss`, after which it is served again, empty.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{stratus_binary, TestCluster};
use stratus_client::{Client, TableId};
use stratus_types::{key_hash, ServerId, TabletState};
use stratus_wire::{ServerStatus, Status};

/// How long a test waits for the cluster to reach a state before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// The coordinator's backstop sweep, an hour apart: never within a test.
const BACKSTOP_OUT_OF_REACH: [&str; 2] = ["--backstop-interval-ms", "3600000"];

/// Waits (bounded) until the coordinator lists `server_id` with `status`.
async fn wait_for_server_status(client: &Client, server_id: ServerId, status: ServerStatus) {
    wait_for_server_status_in(client, server_id, &[status]).await
}

/// Waits (bounded) until the coordinator lists `server_id` with one of `statuses`.
async fn wait_for_server_status_in(
    client: &Client,
    server_id: ServerId,
    statuses: &[ServerStatus],
) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let servers = client.server_list().await.expect("server list");
        let now = servers.iter().find(|server| server.server_id == server_id).map(|s| s.status);
        if now.is_some_and(|now| statuses.contains(&now)) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "server {server_id} is {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until every tablet of `table` is in `state`.
async fn wait_for_tablets(client: &Client, table: TableId, state: TabletState) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.expect("tablet map");
        if map.iter().all(|tablet| tablet.state == state) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "tablets not {state:?}: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server id listening at `address`.
async fn server_id_at(client: &Client, address: &str) -> ServerId {
    let servers = client.server_list().await.expect("server list");
    servers.iter().find(|server| server.address == address).expect("a server there").server_id
}

/// Runs the `stratus` client command `arguments` against `coordinator`; returns whether it
/// succeeded and its stdout and stderr.
fn stratus_command(coordinator: &str, arguments: &[&str]) -> (bool, String) {
    let output = Command::new(stratus_binary())
        .args(["--coordinator", coordinator, "--timeout-ms", "10000"])
        .args(arguments)
        .output()
        .expect("run stratus");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_server_is_reported_by_its_peers_and_declared_crashed() {
    let cluster = TestCluster::start_with_coordinator(3, 1, &[], &BACKSTOP_OUT_OF_REACH);
    let client = cluster.client();
    let table = client.create_table("paused", 1).await.unwrap();
    let version = client.write(table, b"key", b"value").await.unwrap();
    let victim_address = client.tablet_map(table).await.unwrap()[0].owner_address.clone();
    let victim = server_id_at(&client, &victim_address).await;

    let process = cluster
        .servers
        .iter()
        .find(|process| process.address.as_deref() == Some(victim_address.as_str()))
        .expect("the victim's process");
    process.signal(libc::SIGSTOP);

    // Only a peer's hint can start the check that declares it (the sweep is an hour away). A
    // quick recovery may have removed it already by the time we look.
    let declared = [ServerStatus::Crashed, ServerStatus::Removed];
    wait_for_server_status_in(&client, victim, &declared).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        if map.iter().all(|t| t.state == TabletState::Normal && t.owner != victim) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (value, read_version) = client.read(table, b"key").await.unwrap();
    assert_eq!((&value[..], read_version), (&b"value"[..], version));
    // The other servers, which answered every ping, are still up.
    for server in client.server_list().await.unwrap() {
        if server.server_id != victim {
            assert_eq!(server.status, ServerStatus::Up, "{server:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreplicated_master_s_tablets_wait_for_an_operator_to_accept_the_loss() {
    let mut cluster = TestCluster::start_with_replicas(2, 0);
    let client = cluster.client();
    let table = client.create_table("memory-only", 2).await.unwrap();
    let keys: Vec<Vec<u8>> = (0..40).map(|index| format!("key-{index}").into_bytes()).collect();
    for key in &keys {
        client.write(table, key, key).await.unwrap();
    }
    let map = client.tablet_map(table).await.unwrap();
    assert_eq!(map.len(), 2);
    let victim_address = map[0].owner_address.clone();
    let victim = server_id_at(&client, &victim_address).await;
    let victim_owns = |key: &[u8]| {
        let hash = key_hash(table, key);
        map.iter().any(|tablet| tablet.owner == victim && tablet.range.contains(hash))
    };
    let (lost, kept): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) =
        keys.iter().partition(|key| victim_owns(key));
    assert!(!lost.is_empty() && !kept.is_empty(), "the keys fall on both masters");

    // Nothing to accept while the master is up.
    let (accepted, text) = stratus_command(
        &cluster.coordinator_address,
        &["recovery", "accept-loss", &victim.to_string()],
    );
    assert!(!accepted, "a loss was accepted for a live master: {text}");

    let process = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(victim_address.as_str()))
        .expect("the victim's process");
    process.kill();

    // Declared crashed, and its tablet is unavailable rather than handed over empty.
    wait_for_server_status(&client, victim, ServerStatus::Crashed).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let states: Vec<TabletState> =
            map.iter().filter(|t| t.owner == victim).map(|t| t.state).collect();
        if states == [TabletState::Unavailable] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not found impossible: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Clients are told at once, with a clear status; the other master's keys are served.
    let error = client.read(table, lost[0]).await.expect_err("the lost tablet is not served");
    assert_eq!(error.status, Status::ServiceNotAvailable, "{error:?}");
    assert!(error.to_string().contains("accept-loss"), "{error}");
    for key in &kept {
        assert_eq!(&client.read(table, key).await.unwrap().0[..], &key[..]);
    }
    let (listed, status) = stratus_command(&cluster.coordinator_address, &["status"]);
    assert!(listed, "{status}");
    assert!(status.contains("RECOVERY IMPOSSIBLE"), "{status}");

    // The operator accepts the loss: the tablet is served again, empty.
    let (accepted, text) = stratus_command(
        &cluster.coordinator_address,
        &["recovery", "accept-loss", &victim.to_string()],
    );
    assert!(accepted, "{text}");
    wait_for_tablets(&client, table, TabletState::Normal).await;
    wait_for_server_status(&client, victim, ServerStatus::Removed).await;
    for key in &lost {
        let error = client.read(table, key).await.expect_err("lost with its master");
        assert_eq!(error.status, Status::ObjectDoesntExist, "{error:?}");
    }
    for key in &kept {
        assert_eq!(&client.read(table, key).await.unwrap().0[..], &key[..]);
    }
    client.write(table, lost[0], b"new").await.unwrap();
    assert_eq!(&client.read(table, lost[0]).await.unwrap().0[..], b"new");
}

/// The resident memory of process `pid`, in bytes (its VmRSS line in /proc).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("a VmRSS line");
    let kibibytes: u64 =
        line.split_whitespace().nth(1).expect("a figure").parse().expect("a number");
    kibibytes * 1024
}

/// A server that prefaults its log does so before it enlists: a server that enlisted and then
/// spent seconds touching its memory answered no ping meanwhile, and could be declared crashed
/// before it served anything (it was, in a benchmark). When the coordinator first lists the
/// server, its whole log is already resident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_prefaults_its_memory_before_it_enlists() {
    const LOG_MIB: u64 = 256;
    let cluster = TestCluster::start_with_coordinator(0, 0, &[], &[]);
    let log_mib = LOG_MIB.to_string();
    let arguments: Vec<String> = [
        "--coordinator",
        &cluster.coordinator_address,
        "server",
        "--listen",
        "127.0.0.1:0",
        "--replicas",
        "0",
        "--log-mib",
        &log_mib,
        "--prefault-memory",
    ]
    .iter()
    .map(|argument| argument.to_string())
    .collect();
    let mut server = common::Process::start(&arguments);
    let pid = server.child.id();
    let client = cluster.client();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    // Polled often: the check is of the first moment the server is listed.
    while client.server_list().await.expect("server list").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the server never enlisted");
        assert!(server.child.try_wait().expect("wait").is_none(), "the server exited");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let resident = resident_bytes(pid);
    assert!(resident >= LOG_MIB << 20, "enlisted with {resident} bytes resident");
    let line = server.wait_for_line("listening on", PATIENCE);
    let address = line.split_whitespace().last().expect("an address").to_string();
    let server_id = server_id_at(&client, &address).await;
    wait_for_server_status(&client, server_id, ServerStatus::Up).await;
    let table = client.create_table("prefaulted", 1).await.expect("create");
    client.write(table, b"key", b"value").await.expect("write");
    assert_eq!(&client.read(table, b"key").await.expect("read").0[..], b"value");
}
