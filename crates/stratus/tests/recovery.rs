//! Master crash recovery with real processes: a master is killed with SIGKILL under write load;
//! the coordinator detects the crash, the other masters replay its tablets from the replicas on
//! the backups, and every acknowledged write is readable afterwards — while the writers, which
//! never stopped, keep going once their tablets are served again.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{Client, ClientConfig, TableId};
use stratus_env::TcpNetwork;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::{RejectRules, TabletState, Version};
use stratus_wire::{Request, Response, ResponseBody, ServerStatus, Status};

/// Per key: the newest acknowledged (version, writer sequence).
type Acknowledged = Arc<Mutex<HashMap<Vec<u8>, (Version, u32)>>>;

/// A value that names its key and the writer's sequence number, padded to a size that varies.
fn value_for(key: &[u8], sequence: u32) -> Vec<u8> {
    let mut value = format!("{} {sequence} ", String::from_utf8_lossy(key)).into_bytes();
    value.resize(64 + (sequence as usize * 131) % 3_000, b'.');
    value
}

/// The sequence number a value was written with.
fn sequence_of(key: &[u8], value: &[u8]) -> u32 {
    let text = String::from_utf8_lossy(value);
    let mut words = text.split(' ');
    assert_eq!(words.next().map(str::as_bytes), Some(key), "value of another key: {text:.40}");
    words.next().and_then(|word| word.parse().ok()).expect("a sequence number")
}

/// Writers that overwrite their own keys until `stop`; each records what was acknowledged.
fn start_writers(
    client: &Client,
    table: TableId,
    writers: u32,
    acknowledged: &Acknowledged,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinSet<u32> {
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let client = client.clone();
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut failures = 0;
            let mut sequence = 0u32;
            while !stop.load(Ordering::SeqCst) && sequence < 100_000 {
                let key = format!("w{writer}-k{}", sequence % 40).into_bytes();
                match client.write(table, &key, &value_for(&key, sequence)).await {
                    Ok(version) => {
                        acknowledged.lock().unwrap().insert(key, (version, sequence));
                    }
                    // Outcome unknown (the operation timed out): not counted as acknowledged.
                    Err(_) => failures += 1,
                }
                sequence += 1;
            }
            failures
        });
    }
    tasks
}

/// How far the writers got: the sum of the sequence numbers acknowledged per key (grows with
/// every acknowledged write, unlike the number of keys).
fn progress(acknowledged: &Acknowledged) -> u64 {
    acknowledged.lock().unwrap().values().map(|(_, sequence)| u64::from(*sequence)).sum()
}

async fn wait_for_acknowledged(acknowledged: &Acknowledged, count: usize, patience: Duration) {
    let deadline = tokio::time::Instant::now() + patience;
    while acknowledged.lock().unwrap().len() < count {
        assert!(tokio::time::Instant::now() < deadline, "writers made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every acknowledged write is readable: the version read is at least the acknowledged one, and
/// the value is the one acknowledged or a later write of the same writer.
async fn check_acknowledged(client: &Client, table: TableId, acknowledged: &Acknowledged) {
    let expected = acknowledged.lock().unwrap().clone();
    assert!(!expected.is_empty());
    for (key, (version, sequence)) in expected {
        let (value, found) = client
            .read(table, &key)
            .await
            .unwrap_or_else(|error| panic!("acknowledged {key:?} unreadable: {error}"));
        assert!(found >= version, "{key:?}: read {found:?} < acknowledged {version:?}");
        let found_sequence = sequence_of(&key, &value);
        assert!(found_sequence >= sequence, "{key:?}: sequence {found_sequence} < {sequence}");
        if found == version {
            assert_eq!(found_sequence, sequence, "{key:?}: same version, another value");
        }
    }
}

/// A client whose operations wait through detection and recovery (a 60 s deadline).
fn patient_client(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = Duration::from_secs(60);
    Client::new(config)
}

/// Sends `signal` to the server listening at `address`.
fn signal_server<'a>(
    cluster: &'a mut TestCluster,
    address: &str,
    signal: i32,
) -> &'a mut common::Process {
    let process = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(address))
        .unwrap_or_else(|| panic!("no server at {address}"));
    process.signal(signal);
    process
}

/// Waits until every tablet of `table` is served, by none of the masters at `gone`, and checks
/// that the tablets still cover the hash space without overlap.
async fn wait_until_served_without(
    client: &Client,
    table: TableId,
    gone: &[String],
    patience: Duration,
) {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let served = map.iter().all(|tablet| {
            !gone.contains(&tablet.owner_address) && tablet.state == TabletState::Normal
        });
        if served {
            assert_eq!(map[0].range.start, 0);
            assert_eq!(map[map.len() - 1].range.end, u64::MAX);
            for pair in map.windows(2) {
                assert_eq!(pair[0].range.end + 1, pair[1].range.start, "{map:?}");
            }
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that the writers go on (500 more writes' worth of progress), stops them, and checks
/// that none gave up: with a 60 s operation timeout no write should fail during recovery.
async fn writers_continue_then_stop(
    acknowledged: &Acknowledged,
    stop: &AtomicBool,
    mut writers: tokio::task::JoinSet<u32>,
) {
    let before = progress(acknowledged);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while progress(acknowledged) < before + 500 {
        assert!(tokio::time::Instant::now() < deadline, "writes stalled after recovery");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut failures = 0;
    while let Some(joined) = writers.join_next().await {
        failures += joined.unwrap();
    }
    assert_eq!(failures, 0, "writes failed during recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_is_recovered_and_no_acknowledged_write_is_lost() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("recovered", 4).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let victim_address = map[0].owner_address.clone();
    let victim_id = map[0].owner;

    let acknowledged: Acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&client, table, 6, &acknowledged, &stop);
    wait_for_acknowledged(&acknowledged, 240, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let victim = signal_server(&mut cluster, &victim_address, libc::SIGKILL);
    assert!(victim.wait_exit(Duration::from_secs(10)).is_some());
    let acknowledged_at_kill = acknowledged.lock().unwrap().len();

    // The crashed tablets come back on other masters, and the writers go on, including to
    // the recovered tablets.
    let gone = [victim_address.clone()];
    wait_until_served_without(&client, table, &gone, Duration::from_secs(60)).await;
    writers_continue_then_stop(&acknowledged, &stop, writers).await;
    assert!(acknowledged.lock().unwrap().len() >= acknowledged_at_kill);
    check_acknowledged(&client, table, &acknowledged).await;

    // Recovered, the victim is removed, and the backups free its replicas.
    let servers = client.server_list().await.unwrap();
    let victim = servers.iter().find(|server| server.server_id == victim_id).unwrap();
    assert_eq!(victim.status, ServerStatus::Removed);
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for server in servers.iter().filter(|server| server.status == ServerStatus::Up) {
        loop {
            let request = Request::BackupListReplicas { master_id: victim_id };
            match pool.call(&server.address, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::BackupListReplicas { replicas }),
                )) if replicas.is_empty() => break,
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} still holds replicas of the removed master: {other:?}",
                    server.address
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_cluster_killed_and_restarted_keeps_every_acknowledged_write() {
    // fsync durability: a backup acknowledges a replica write once it is on its disk. With
    // buffered durability (the default) a write is acknowledged in the backups' RAM, which
    // survives any one server's crash but not every backup dying at once.
    stop_every_process_and_restart(&["--durability", "fsync"], libc::SIGKILL).await;
}

/// A cluster stopped with SIGTERM, in the default buffered mode: each backup writes its open
/// replicas to disk before it exits, so the restarted cluster recovers every head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_cluster_stopped_and_restarted_keeps_every_acknowledged_write() {
    stop_every_process_and_restart(&[], libc::SIGTERM).await;
}

/// Loads a 3-server cluster (servers started with `server_arguments`), sends `signal` to every
/// process at once, starts them all again on the same directories, and checks that every
/// acknowledged write is there once the old masters' tablets are recovered onto the new ones.
async fn stop_every_process_and_restart(server_arguments: &[&str], signal: i32) {
    let mut cluster = TestCluster::start_with(3, 1, server_arguments);
    let client = cluster.client();
    let table = client.create_table("cold", 3).await.unwrap();
    let acknowledged: Acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = start_writers(&client, table, 3, &acknowledged, &stop);
    wait_for_acknowledged(&acknowledged, 120, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every process at once.
    for server in &mut cluster.servers {
        server.signal(signal);
    }
    cluster.coordinator.signal(signal);
    for server in &mut cluster.servers {
        assert!(server.wait_exit(Duration::from_secs(30)).is_some());
    }
    assert!(cluster.coordinator.wait_exit(Duration::from_secs(30)).is_some());
    stop.store(true, Ordering::SeqCst);
    writers.abort_all();
    while writers.join_next().await.is_some() {}

    // Restart on the same directories: the backups find their replicas on disk, the servers
    // enlist with new ids, the coordinator recovers the old masters' tablets onto them.
    cluster.restart_all();
    let client = cluster.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let map = client.tablet_map(table).await.unwrap();
        if map.iter().all(|tablet| tablet.state == TabletState::Normal) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_acknowledged(&client, table, &acknowledged).await;
}

/// SIGSTOP a master until it is declared crashed and its tablet recovered elsewhere, then
/// SIGCONT: requests that were waiting in its sockets meanwhile get no stale read and no
/// acknowledged write, and the process exits on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_master_declared_crashed_serves_nothing_stale_and_exits() {
    // Four servers: with one paused, each of the others still has two backups besides itself.
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = cluster.client();
    let table = client.create_table("zombie", 1).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let zombie_address = map[0].owner_address.clone();
    let old_version = client.write(table, b"key", b"old value").await.unwrap();

    // A connection to the master, opened while it runs (the handshake needs it awake).
    let pool = ChannelPool::new(
        Arc::new(TcpNetwork),
        RpcConfig { request_timeout: Duration::from_secs(30), ..RpcConfig::default() },
    );
    assert!(matches!(pool.call(&zombie_address, &Request::Ping).await, Ok((Status::Ok, _))));

    signal_server(&mut cluster, &zombie_address, libc::SIGSTOP);
    // Recovered elsewhere, then overwritten there.
    let gone = [zombie_address.clone()];
    wait_until_served_without(&client, table, &gone, Duration::from_secs(60)).await;
    let (value, version) = client.read(table, b"key").await.unwrap();
    assert_eq!((&value[..], version), (&b"old value"[..], old_version));
    let new_version = client.write(table, b"key", b"new value").await.unwrap();
    assert!(new_version > old_version);

    // Requests to the paused master wait in its socket until it resumes.
    let pool = Arc::new(pool);
    let read = {
        let pool = pool.clone();
        let address = zombie_address.clone();
        tokio::spawn(async move {
            let request = Request::Read {
                table_id: table,
                key: Bytes::from_static(b"key"),
                rules: RejectRules::NONE,
            };
            pool.call(&address, &request).await
        })
    };
    let write = {
        let pool = pool.clone();
        let address = zombie_address.clone();
        tokio::spawn(async move {
            let request = Request::Write {
                table_id: table,
                key: Bytes::from_static(b"key"),
                value: Bytes::from_static(b"zombie value"),
                rules: RejectRules::NONE,
                expiry: stratus_client::Expiry::Never,
                rpc: None,
            };
            pool.call(&address, &request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let zombie = signal_server(&mut cluster, &zombie_address, libc::SIGCONT);
    let read = read.await.unwrap();
    let write = write.await.unwrap();
    assert!(!matches!(read, Ok((Status::Ok, _))), "the zombie served a stale read: {read:?}");
    assert!(!matches!(write, Ok((Status::Ok, _))), "the zombie acknowledged a write: {write:?}");
    let status = zombie.wait_exit(Duration::from_secs(30)).expect("the zombie exits");
    assert!(!status.success(), "the zombie exits with an error: {status:?}");

    // The cluster's value is the one written after recovery.
    let (value, version) = client.read(table, b"key").await.unwrap();
    assert_eq!((&value[..], version), (&b"new value"[..], new_version));
}

/// Two masters SIGKILLed at the same moment under write load: both are recovered (each may be
/// chosen as a recovery master of the other until it is declared crashed too), and no
/// acknowledged write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_masters_killed_together_are_both_recovered() {
    let mut cluster = TestCluster::start_with_replicas(5, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("double", 5).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let mut victims: Vec<String> = map.iter().map(|tablet| tablet.owner_address.clone()).collect();
    victims.sort();
    victims.dedup();
    victims.truncate(2);
    assert_eq!(victims.len(), 2);

    let acknowledged: Acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&client, table, 6, &acknowledged, &stop);
    wait_for_acknowledged(&acknowledged, 240, Duration::from_secs(60)).await;
    for victim in &victims {
        signal_server(&mut cluster, victim, libc::SIGKILL);
    }
    wait_until_served_without(&client, table, &victims, Duration::from_secs(90)).await;
    writers_continue_then_stop(&acknowledged, &stop, writers).await;
    check_acknowledged(&client, table, &acknowledged).await;
}

/// A master is killed, and as soon as its crash is declared (its tablets show as recovering)
/// a second master — likely one of its recovery masters — is killed too. Whatever the second
/// kill interrupts, both masters' tablets end up served and no acknowledged write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_during_a_recovery_is_recovered_too() {
    let mut cluster = TestCluster::start_with_replicas(5, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("cascade", 5).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let first = map[0].owner_address.clone();
    let second = map
        .iter()
        .map(|tablet| tablet.owner_address.clone())
        .find(|address| *address != first)
        .unwrap();

    let acknowledged: Acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&client, table, 6, &acknowledged, &stop);
    wait_for_acknowledged(&acknowledged, 240, Duration::from_secs(60)).await;
    signal_server(&mut cluster, &first, libc::SIGKILL);
    // The crash is declared once a tablet shows as recovering, or the server list no longer
    // shows the server up: on a loaded machine a small recovery can start and finish between
    // two looks at the tablet map (CI once saw no RECOVERING state in 60 s), and the second
    // kill then lands just after the recovery rather than during it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let map = client.tablet_map(table).await.unwrap();
        if map.iter().any(|tablet| tablet.state == TabletState::Recovering) {
            break;
        }
        let servers = client.server_list().await.unwrap();
        let first_down = servers
            .iter()
            .any(|server| server.address == first && server.status != ServerStatus::Up);
        if first_down {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the crash was never declared");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal_server(&mut cluster, &second, libc::SIGKILL);
    let gone = [first, second];
    wait_until_served_without(&client, table, &gone, Duration::from_secs(120)).await;
    writers_continue_then_stop(&acknowledged, &stop, writers).await;
    check_acknowledged(&client, table, &acknowledged).await;
}
