//! Tablet management on a cluster of real processes: splitting and migrating tablets while
//! clients write, through the client library and the `stratus table split` / `migrate`
//! commands, and across a restart of the coordinator. Afterwards every acknowledged write must
//! be readable with its latest value, and enumeration must return each key exactly once. A
//! tablet that moved away and back must not bring back an object removed while it was away
//! when its master crashes.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{stratus_binary, TestCluster};
use stratus_client::{Client, ClientConfig, Status, TableId};
use stratus_types::ServerId;

/// Keys each writer owns (a key is written by one writer only, so its latest acknowledged
/// value is known exactly).
const KEYS_PER_WRITER: u64 = 200;
const WRITERS: u64 = 3;
/// A bound on every writer's work, whatever the speed of the machine.
const WRITES_PER_WRITER_MAX: u64 = 50_000;

/// Runs `stratus` with `arguments` against `coordinator`; (success, stdout, stderr).
fn stratus(coordinator: &str, arguments: &[&str]) -> (bool, String, String) {
    let output = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_COORDINATOR", coordinator)
        .stdin(Stdio::null())
        .output()
        .expect("run stratus");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Writers that overwrite their own keys in rounds until stopped, remembering the value of
/// each key's last acknowledged write.
struct WriteLoad {
    stop: Arc<AtomicBool>,
    /// Writes acknowledged so far, over all writers.
    acknowledged: Arc<AtomicU64>,
    writers: Vec<tokio::task::JoinHandle<BTreeMap<String, String>>>,
}

impl WriteLoad {
    fn start(client: &Client, table: TableId) -> WriteLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(AtomicU64::new(0));
        let writers = (0..WRITERS)
            .map(|writer| {
                let client = client.clone();
                let stop = stop.clone();
                let acknowledged = acknowledged.clone();
                tokio::spawn(async move {
                    let mut latest = BTreeMap::new();
                    let mut round = 0u64;
                    while !stop.load(Ordering::Relaxed) && round < WRITES_PER_WRITER_MAX {
                        let key = format!("writer-{writer}-key-{}", round % KEYS_PER_WRITER);
                        let value = format!("value-{round}");
                        // The client retries RETRY and refreshes its map on UNKNOWN_TABLET;
                        // any error left is a failure of the operation under test.
                        client
                            .write(table, key.as_bytes(), value.as_bytes())
                            .await
                            .unwrap_or_else(|error| panic!("write of {key}: {error:?}"));
                        latest.insert(key, value);
                        acknowledged.fetch_add(1, Ordering::Relaxed);
                        round += 1;
                    }
                    latest
                })
            })
            .collect();
        WriteLoad { stop, acknowledged, writers }
    }

    /// Waits (bounded) until `more` further writes were acknowledged: the load really runs
    /// across the change under test.
    async fn wait_for_writes(&self, more: u64) {
        let target = self.acknowledged.load(Ordering::Relaxed) + more;
        for _ in 0..2_000 {
            if self.acknowledged.load(Ordering::Relaxed) >= target {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the write load made no progress");
    }

    async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut latest = BTreeMap::new();
        for writer in self.writers {
            latest.extend(writer.await.expect("writer task"));
        }
        latest
    }
}

/// Every acknowledged write is readable with its latest value, and an enumeration returns
/// each key exactly once and nothing else.
async fn check_every_write(client: &Client, table: TableId, latest: &BTreeMap<String, String>) {
    assert_eq!(latest.len() as u64, WRITERS * KEYS_PER_WRITER);
    for (key, value) in latest {
        let (read, _version) = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(&read[..], value.as_bytes(), "{key} must hold its last acknowledged value");
    }
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut enumeration = client.enumerate(table).with_batch_bytes(4_000);
    while let Some(batch) = enumeration.next_batch().await.unwrap() {
        for object in batch {
            let key = String::from_utf8(object.key.to_vec()).unwrap();
            assert_eq!(
                latest.get(&key).map(String::as_bytes),
                Some(&object.value[..]),
                "enumerated {key} with a value that is not its latest"
            );
            *seen.entry(object.key.to_vec()).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), latest.len(), "enumeration must return every key");
    for (key, count) in seen {
        assert_eq!(count, 1, "{} enumerated {count} times", String::from_utf8_lossy(&key));
    }
}

/// The table's tablets as (start, end, owner id).
async fn tablets_of(client: &Client, table: TableId) -> Vec<(u64, u64, u64)> {
    client
        .tablet_map(table)
        .await
        .unwrap()
        .iter()
        .map(|tablet| (tablet.range.start, tablet.range.end, tablet.owner.0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splitting_tablets_under_writes_keeps_every_acknowledged_write() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let table = client.create_table("split", 1).await.unwrap();
    let [(0, u64::MAX, owner)] = tablets_of(&client, table).await[..] else {
        panic!("a table of span 1 has one tablet");
    };
    // Clients that fetched the map before the splits keep using the one-tablet map until a
    // master refuses a request.
    let stale_client = cluster.client();
    stale_client.read(table, b"absent").await.expect_err("nothing written yet");
    let load = WriteLoad::start(&client, table);
    load.wait_for_writes(300).await;

    let coordinator = cluster.coordinator_address.clone();
    let (success, stdout, stderr) = tokio::task::spawn_blocking(move || {
        stratus(&coordinator, &["table", "split", "split", "0x8000000000000000"])
    })
    .await
    .unwrap();
    assert!(success, "stratus table split failed: {stderr}");
    assert!(stdout.contains("split split at 0x8000000000000000"), "{stdout}");
    load.wait_for_writes(300).await;

    client.split_tablet("split", 1 << 62).await.unwrap();
    load.wait_for_writes(300).await;
    // Splitting at a boundary changes nothing; a decimal hash is accepted.
    let coordinator = cluster.coordinator_address.clone();
    let (success, _, stderr) = tokio::task::spawn_blocking(move || {
        stratus(&coordinator, &["table", "split", "split", "4611686018427387904"])
    })
    .await
    .unwrap();
    assert!(success, "splitting at a boundary is a no-op success: {stderr}");
    client.split_tablet("split", 0).await.unwrap();

    // Bad input gets a clear error.
    let error = client.split_tablet("no-such-table", 5).await.unwrap_err();
    assert_eq!(error.status, Status::TableDoesntExist);
    let coordinator = cluster.coordinator_address.clone();
    let (success, _, stderr) = tokio::task::spawn_blocking(move || {
        stratus(&coordinator, &["table", "split", "split", "0x1ffffffffffffffff"])
    })
    .await
    .unwrap();
    assert!(!success && stderr.contains("not a key hash"), "{stderr}");

    let latest = load.finish().await;
    let expected_tablets = vec![
        (0, (1 << 62) - 1, owner),
        (1 << 62, (1 << 63) - 1, owner),
        (1 << 63, u64::MAX, owner),
    ];
    assert_eq!(tablets_of(&client, table).await, expected_tablets);
    check_every_write(&client, table, &latest).await;
    // The client with the old map reads through it (UNKNOWN_TABLET never comes: the same
    // master owns every hash), and its enumeration of the old whole range is refused by the
    // master and redone with the new map.
    check_every_write(&stale_client, table, &latest).await;

    // `stratus status` shows the three tablets and their owner.
    let coordinator = cluster.coordinator_address.clone();
    let (success, stdout, stderr) =
        tokio::task::spawn_blocking(move || stratus(&coordinator, &["status"])).await.unwrap();
    assert!(success, "{stderr}");
    for start in ["0x0000000000000000", "0x4000000000000000", "0x8000000000000000"] {
        let tablet = stdout.lines().find(|line| line.contains(start));
        let tablet =
            tablet.unwrap_or_else(|| panic!("status lacks the tablet at {start}: {stdout}"));
        let columns: Vec<&str> = tablet.split_whitespace().collect();
        // TABLE, ID, TIER, TABLET START, TABLET END, SERVER, STATE.
        assert_eq!(columns[5], owner.to_string(), "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_and_a_migration_survive_a_coordinator_restart() {
    let mut cluster = TestCluster::start(2);
    let client = cluster.client();
    let table = client.create_table("durable-split", 1).await.unwrap();
    for index in 0..200 {
        client.write(table, format!("key-{index}").as_bytes(), b"v").await.unwrap();
    }
    client.split_tablet("durable-split", 1 << 63).await.unwrap();
    let home = client.tablet_map(table).await.unwrap()[0].owner;
    let other = *master_ids(&client).await.iter().find(|&&id| id != home).unwrap();
    client.migrate_tablet("durable-split", 1 << 63, other).await.unwrap();
    let before = tablets_of(&client, table).await;
    assert_eq!(before, vec![(0, (1 << 63) - 1, home.0), (1 << 63, u64::MAX, other.0)]);
    // Killed without warning: only what it persisted is back, and it re-sends every
    // assignment, at an epoch above every one it handed out before.
    cluster.restart_coordinator_after_sigkill();
    let client = cluster.client();
    assert_eq!(tablets_of(&client, table).await, before);
    for index in 0..200 {
        let key = format!("key-{index}");
        let (value, _) = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(&value[..], b"v");
        client.write(table, key.as_bytes(), b"w").await.unwrap();
    }
    // The masters take assignments from the restarted coordinator: its epochs continue
    // where the last incarnation's stopped (a transfer at an epoch they had already seen
    // would be refused as stale).
    client.migrate_tablet("durable-split", 1 << 63, home).await.unwrap();
    assert_eq!(tablets_of(&client, table).await[1], (1 << 63, u64::MAX, home.0));
    let objects = client.enumerate(table).collect_all().await.unwrap();
    assert_eq!(objects.len(), 200);
    assert!(objects.iter().all(|object| &object.value[..] == b"w"));
}

/// The ids of the masters that are up, ascending.
async fn master_ids(client: &Client) -> Vec<ServerId> {
    let mut ids: Vec<ServerId> = client
        .server_list()
        .await
        .unwrap()
        .iter()
        .filter(|server| {
            server.status == stratus_wire::ServerStatus::Up && server.services.has_master()
        })
        .map(|server| server.server_id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_tablets_under_writes_keeps_every_acknowledged_write() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let table = client.create_table("migrate", 1).await.unwrap();
    let [(0, u64::MAX, first_owner)] = tablets_of(&client, table).await[..] else {
        panic!("a table of span 1 has one tablet");
    };
    let others: Vec<u64> = master_ids(&client)
        .await
        .into_iter()
        .map(|id| id.0)
        .filter(|&id| id != first_owner)
        .collect();
    let [second, third] = others[..] else { panic!("three masters: {others:?}") };
    let stale_client = cluster.client();
    stale_client.read(table, b"absent").await.expect_err("nothing written yet");
    let load = WriteLoad::start(&client, table);
    load.wait_for_writes(300).await;

    client.split_tablet("migrate", 1 << 63).await.unwrap();
    let coordinator = cluster.coordinator_address.clone();
    let arguments = ["table", "migrate", "migrate", "0x8000000000000000", &second.to_string()]
        .map(str::to_string);
    let (success, stdout, stderr) = tokio::task::spawn_blocking(move || {
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        stratus(&coordinator, &arguments)
    })
    .await
    .unwrap();
    assert!(success, "stratus table migrate failed: {stderr}");
    assert!(stdout.contains("migrated migrate tablet 0x8000000000000000"), "{stdout}");
    load.wait_for_writes(300).await;
    client.migrate_tablet("migrate", 0, ServerId(third)).await.unwrap();
    load.wait_for_writes(300).await;
    // Back to the master it came from (A → B → A).
    client.migrate_tablet("migrate", 1 << 63, ServerId(first_owner)).await.unwrap();
    load.wait_for_writes(300).await;
    // To where it is already: nothing to do.
    client.migrate_tablet("migrate", 1 << 63, ServerId(first_owner)).await.unwrap();

    // Bad input gets a clear error, and changes nothing.
    let error = client.migrate_tablet("no-such-table", 0, ServerId(second)).await.unwrap_err();
    assert_eq!(error.status, Status::TableDoesntExist);
    let error = client.migrate_tablet("migrate", 5, ServerId(second)).await.unwrap_err();
    assert_eq!(error.status, Status::InvalidParameter, "no tablet starts at 5: {error:?}");
    let error = client.migrate_tablet("migrate", 0, ServerId(999)).await.unwrap_err();
    assert_eq!(error.status, Status::InvalidParameter, "no server 999: {error:?}");

    let latest = load.finish().await;
    assert_eq!(
        tablets_of(&client, table).await,
        vec![(0, (1 << 63) - 1, third), (1 << 63, u64::MAX, first_owner)]
    );
    check_every_write(&client, table, &latest).await;
    // A client whose map predates every move is refused by the old masters (UNKNOWN_TABLET)
    // and finds the new ones.
    check_every_write(&stale_client, table, &latest).await;
    // The master that gave a tablet away holds none of its objects any more: the second
    // master had the upper half and gave it back.
    let second_address = client
        .server_list()
        .await
        .unwrap()
        .into_iter()
        .find(|server| server.server_id.0 == second)
        .unwrap()
        .address;
    let statistics = client.server_statistics(&second_address).await.unwrap();
    assert_eq!((statistics.tablets_owned, statistics.objects_live), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_that_moved_away_and_back_recovers_without_stale_objects() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    // Waits through failure detection and recovery.
    config.operation_timeout = Duration::from_secs(60);
    let client = Client::new(config);
    let table = client.create_table("away-and-back", 1).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let (home, home_address) = (map[0].owner, map[0].owner_address.clone());
    let away = *master_ids(&client).await.iter().find(|&&id| id != home).unwrap();

    client.write(table, b"removed-while-away", b"old").await.unwrap();
    client.write(table, b"overwritten-while-away", b"old").await.unwrap();
    client.write(table, b"untouched", b"kept").await.unwrap();
    client.migrate_tablet("away-and-back", 0, away).await.unwrap();
    client.remove(table, b"removed-while-away").await.unwrap();
    client.write(table, b"overwritten-while-away", b"new").await.unwrap();
    client.migrate_tablet("away-and-back", 0, home).await.unwrap();
    assert_eq!(client.tablet_map(table).await.unwrap()[0].owner, home);
    let absent = client.read(table, b"removed-while-away").await.unwrap_err();
    assert_eq!(absent.status, Status::ObjectDoesntExist);

    // The home master's log still holds the old objects from before the tablet left, and
    // not the tombstone (that is in the other master's log). Its recovery must ignore them.
    let home_process = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(home_address.as_str()))
        .expect("the home master's process");
    home_process.kill();
    let version_after = client.write(table, b"written-after-recovery", b"x").await.unwrap();
    assert!(version_after.0 > 0);
    let map = client.tablet_map(table).await.unwrap();
    assert_ne!(map[0].owner, home, "recovered onto another master");
    let absent = client.read(table, b"removed-while-away").await.unwrap_err();
    assert_eq!(absent.status, Status::ObjectDoesntExist, "a removed object came back");
    let (value, _) = client.read(table, b"overwritten-while-away").await.unwrap();
    assert_eq!(&value[..], b"new");
    let (value, _) = client.read(table, b"untouched").await.unwrap();
    assert_eq!(&value[..], b"kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_to_a_dead_master_fails_and_the_tablet_stays_writable() {
    let mut cluster = TestCluster::start_with_replicas(3, 1);
    let client = cluster.client();
    let table = client.create_table("stays", 1).await.unwrap();
    let home = client.tablet_map(table).await.unwrap()[0].owner;
    let target = *master_ids(&client).await.iter().find(|&&id| id != home).unwrap();
    let target_address = client
        .server_list()
        .await
        .unwrap()
        .into_iter()
        .find(|server| server.server_id == target)
        .unwrap()
        .address;
    for index in 0..100 {
        client.write(table, format!("key-{index}").as_bytes(), b"before").await.unwrap();
    }
    cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(target_address.as_str()))
        .expect("the target's process")
        .kill();
    // The transfer fails (the target refuses connections) and is retried until the target is
    // declared crashed, which the coordinator then reports as a bad target.
    let error = client.migrate_tablet("stays", 0, target).await.unwrap_err();
    assert!(
        matches!(error.status, Status::InvalidParameter | Status::Retry),
        "the migration must fail: {error:?}"
    );
    assert_eq!(client.tablet_map(table).await.unwrap()[0].owner, home);
    // The source serves the tablet again, writes included, with every object.
    for index in 0..100 {
        let key = format!("key-{index}");
        let (value, _) = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(&value[..], b"before");
        client.write(table, key.as_bytes(), b"after").await.unwrap();
    }
    let objects = client.enumerate(table).collect_all().await.unwrap();
    assert_eq!(objects.len(), 100);
    assert!(objects.iter().all(|object| &object.value[..] == b"after"));
}

/// A migration that fails part-way (the target runs out of memory) changes nothing a client
/// sees: the source still serves the tablet, the target its own table, every object readable;
/// and the target holds nothing of what it received (the coordinator tells it to drop the
/// copy, with the target's cleaner busy, which once crashed the target: an object dropped from
/// the index was counted dead after its segment had been cleaned). The failure is
/// NO_TABLE_SPACE, at once: a RETRY made the client copy the tablet again and again into the
/// same full log for its whole timeout, and left an attempt running when it gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_changes_nothing_clients_see() {
    let cluster = TestCluster::start_with_replicas(2, 0);
    let client = cluster.client();
    let big = client.create_table("big", 1).await.unwrap();
    let filler = client.create_table("filler", 1).await.unwrap();
    let [(_, _, source)] = tablets_of(&client, big).await[..] else { panic!("one tablet") };
    let target = master_ids(&client).await.into_iter().find(|id| id.0 != source).unwrap();
    client.migrate_tablet("filler", 0, target).await.unwrap();
    // About 20 MB on each master (32 MiB logs): the target cannot take the other 20.
    let value = vec![7u8; 10_000];
    for index in 0..2_000u32 {
        let key = format!("key-{index}");
        client.write(big, key.as_bytes(), &value).await.unwrap();
        client.write(filler, key.as_bytes(), &value).await.unwrap();
    }
    let error = client.migrate_tablet("big", 0, target).await.unwrap_err();
    assert_eq!(error.status, Status::NoTableSpace, "{error:?}");
    assert_eq!(tablets_of(&client, big).await, vec![(0, u64::MAX, source)]);
    assert_eq!(tablets_of(&client, filler).await, vec![(0, u64::MAX, target.0)]);
    let servers = client.server_list().await.unwrap();
    let target_address = &servers.iter().find(|server| server.server_id == target).unwrap().address;
    let statistics = client.server_statistics(target_address).await.unwrap();
    assert_eq!(statistics.objects_live, 2_000, "the target holds its own table's objects only");
    for index in (0..2_000u32).step_by(37) {
        let key = format!("key-{index}");
        assert_eq!(client.read(big, key.as_bytes()).await.unwrap().0, value);
        assert_eq!(client.read(filler, key.as_bytes()).await.unwrap().0, value);
    }
}
