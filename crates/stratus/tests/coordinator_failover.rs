//! Coordinators on etcd: a standby takes over when the active one is paused or killed, the
//! deposed one exits when it wakes, and tables, data and writes carry on throughout.
//!
//! Needs the `etcd` binary (Debian: etcd-server); without it the test fails.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{free_address, server_arguments, Process};
use stratus_client::{Client, ClientConfig};
use stratus_meta_etcd::local::LocalEtcd;

/// How long a standby may take to become active (the lease TTL plus loading, with a wide
/// margin for a loaded machine; not a performance assertion).
const TAKEOVER_PATIENCE: Duration = Duration::from_secs(60);

fn start_coordinator(etcd_url: &str, address: &str) -> Process {
    start_coordinator_with_ttl(etcd_url, address, 2)
}

fn start_coordinator_with_ttl(etcd_url: &str, address: &str, lease_seconds: u64) -> Process {
    Process::start(&[
        "coordinator".to_string(),
        "--listen".to_string(),
        address.to_string(),
        "--etcd".to_string(),
        etcd_url.to_string(),
        "--etcd-lease-seconds".to_string(),
        lease_seconds.to_string(),
    ])
}

/// A fresh etcd in `directory`, and coordinators on `listen` with `lease_seconds` leadership
/// leases: the first active, the second standing by.
fn start_active_and_standby(
    directory: &tempfile::TempDir,
    listen: &[String; 2],
    lease_seconds: u64,
) -> (LocalEtcd, Process, Process) {
    common::require_installed("etcd");
    let etcd = LocalEtcd::start(&directory.path().join("etcd")).expect("etcd starts");
    let etcd_url = etcd.client_url().to_string();
    let first = start_coordinator_with_ttl(&etcd_url, &listen[0], lease_seconds);
    first.wait_for_line("listening on", TAKEOVER_PATIENCE);
    let second = start_coordinator_with_ttl(&etcd_url, &listen[1], lease_seconds);
    second.wait_for_line("standing by", Duration::from_secs(30));
    (etcd, first, second)
}

/// Writes `key-N` = N for N = 0, 1, … until stopped, recording every acknowledged write.
async fn write_until_stopped(
    client: Client,
    table: stratus_client::TableId,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<BTreeMap<String, String>>>,
) {
    let mut index = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("key-{}", index % 200);
        let value = format!("value-{index}");
        if client.write(table, key.as_bytes(), value.as_bytes()).await.is_ok() {
            acknowledged.lock().unwrap().insert(key, value);
        } else {
            // The outcome is unknown: the next acknowledged write of the key settles it.
            acknowledged.lock().unwrap().remove(&key);
        }
        index += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_coordinator_takes_over_and_a_deposed_one_exits() {
    let directory = tempfile::tempdir().unwrap();
    common::require_installed("etcd");
    let mut etcd = LocalEtcd::start(&directory.path().join("etcd")).expect("etcd starts");
    let etcd_url = etcd.client_url().to_string();
    let addresses = [free_address(), free_address(), free_address()];
    let coordinators = addresses.join(",");

    let mut first = start_coordinator(&etcd_url, &addresses[0]);
    first.wait_for_line("listening on", TAKEOVER_PATIENCE);
    let second = start_coordinator(&etcd_url, &addresses[1]);
    second.wait_for_line("standing by", Duration::from_secs(30));

    let servers: Vec<Process> = (0..3)
        .map(|index| {
            let backup = directory.path().join(format!("backup-{index}"));
            let server = Process::start(&server_arguments(&coordinators, 2, &backup));
            server.wait_for_line("listening on", Duration::from_secs(30));
            server
        })
        .collect();

    let mut config = ClientConfig::new(coordinators.clone());
    config.operation_timeout = Duration::from_secs(30);
    let client = Client::new(config);
    let mut tables = Vec::new();
    for index in 0..3 {
        let name = format!("table-{index}");
        let id = client.create_table(&name, 3).await.unwrap();
        client.write(id, b"name", name.as_bytes()).await.unwrap();
        tables.push((name, id));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(BTreeMap::new()));
    let writer = tokio::spawn(write_until_stopped(
        client.clone(),
        tables[0].1,
        stop.clone(),
        acknowledged.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The active coordinator stops (paused, as by a long GC or a VM freeze): the standby takes
    // over once its lease runs out.
    first.signal(libc::SIGSTOP);
    tokio::task::block_in_place(|| second.wait_for_line("listening on", TAKEOVER_PATIENCE));
    let created = client.create_table("during-second", 1).await.unwrap();
    assert_eq!(created.0, 4, "table ids continue under the new coordinator");

    // The deposed one wakes up: it finds its leadership gone and exits rather than serve.
    first.signal(libc::SIGCONT);
    let status = tokio::task::block_in_place(|| first.wait_exit(Duration::from_secs(30)))
        .expect("the deposed coordinator kept running");
    assert!(!status.success(), "the deposed coordinator exited as if all were well");

    // A new standby, then the active one is killed outright.
    let third = start_coordinator(&etcd_url, &addresses[2]);
    tokio::task::block_in_place(|| third.wait_for_line("standing by", Duration::from_secs(30)));
    second.signal(libc::SIGKILL);
    tokio::task::block_in_place(|| third.wait_for_line("listening on", TAKEOVER_PATIENCE));
    tokio::time::sleep(Duration::from_millis(300)).await;

    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(!acknowledged.is_empty(), "no write was acknowledged at all");

    // Everything acknowledged is there, every table is intact, and the cluster takes changes.
    for (key, value) in &acknowledged {
        let (read, _) = client.read(tables[0].1, key.as_bytes()).await.unwrap();
        assert_eq!(&read[..], value.as_bytes(), "acknowledged write of {key} lost");
    }
    for (name, id) in &tables {
        assert_eq!(client.get_table_id(name).await.unwrap(), *id);
        let (value, _) = client.read(*id, b"name").await.unwrap();
        assert_eq!(&value[..], name.as_bytes());
    }
    assert_eq!(client.get_table_id("during-second").await.unwrap(), created);
    assert_eq!(client.create_table("during-third", 1).await.unwrap().0, 5);
    let listed = client.list_tables().await.unwrap();
    assert_eq!(listed.len(), 5);
    drop(servers);
    drop(third);
    etcd.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_is_replaced_before_its_leadership_lease_would_end() {
    // The leadership's TTL is far longer than the patience below: a standby that waited for
    // the killed coordinator's lease to run out would not take over in time. It takes over
    // because the killed one's address refuses connections (every coordinator listens from
    // its start), which proves its process is gone.
    const LEASE_SECONDS: u64 = 300;
    const PATIENCE: Duration = Duration::from_secs(120);
    let directory = tempfile::tempdir().unwrap();
    let addresses = [free_address(), free_address()];
    let coordinators = addresses.join(",");
    let (mut etcd, mut first, second) =
        start_active_and_standby(&directory, &addresses, LEASE_SECONDS);
    let backup = directory.path().join("backup");
    let server = Process::start(&server_arguments(&coordinators, 0, &backup));
    server.wait_for_line("listening on", Duration::from_secs(30));

    let mut config = ClientConfig::new(coordinators.clone());
    config.operation_timeout = Duration::from_secs(30);
    let client = Client::new(config);
    let table = client.create_table("t", 1).await.unwrap();
    client.write(table, b"before", b"1").await.unwrap();

    first.kill();
    tokio::task::block_in_place(|| second.wait_for_line("listening on", PATIENCE));
    client.write(table, b"after", b"2").await.unwrap();
    assert_eq!(&client.read(table, b"before").await.unwrap().0[..], b"1");
    assert_eq!(client.create_table("u", 1).await.unwrap().0, table.0 + 1);
    drop(server);
    drop(second);
    etcd.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_stopped_cleanly_hands_over_at_once() {
    // Coordinators listening on the unspecified address: a standby cannot probe the active one
    // (its address names no machine), and the leadership's TTL is far longer than the patience
    // below, so only the stopped coordinator's resignation can hand over in time.
    const LEASE_SECONDS: u64 = 300;
    const PATIENCE: Duration = Duration::from_secs(120);
    let directory = tempfile::tempdir().unwrap();
    let addresses = [free_address(), free_address()];
    let unspecified = addresses.clone().map(|address| address.replace("127.0.0.1", "0.0.0.0"));
    let (mut etcd, mut first, second) =
        start_active_and_standby(&directory, &unspecified, LEASE_SECONDS);

    first.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| first.wait_exit(Duration::from_secs(30)))
        .expect("the stopped coordinator kept running");
    assert!(status.success(), "a clean stop exited with {status:?}");
    tokio::task::block_in_place(|| second.wait_for_line("listening on", PATIENCE));
    let mut config = ClientConfig::new(addresses.join(","));
    config.operation_timeout = Duration::from_secs(30);
    let client = Client::new(config);
    assert!(client.list_tables().await.unwrap().is_empty(), "the new coordinator answers");
    drop(second);
    etcd.kill();
}
