//! Tablet management on a cluster of real processes: splitting tablets while clients write,
//! through the client library and the `stratus table split` command, and across a restart of
//! the coordinator. Afterwards every acknowledged write must be readable with its latest value,
//! and enumeration must return each key exactly once.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{stratus_binary, TestCluster};
use stratus_client::{Client, Status, TableId};

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
        let line = format!("tablet [{start}");
        assert!(stdout.contains(&line), "status lacks {line}: {stdout}");
    }
    assert!(stdout.contains(&format!("owner={owner} ")), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_survives_a_coordinator_restart() {
    let mut cluster = TestCluster::start(2);
    let client = cluster.client();
    let table = client.create_table("durable-split", 1).await.unwrap();
    for index in 0..200 {
        client.write(table, format!("key-{index}").as_bytes(), b"v").await.unwrap();
    }
    client.split_tablet("durable-split", 1 << 63).await.unwrap();
    let before = tablets_of(&client, table).await;
    assert_eq!(before.len(), 2);
    // Killed without warning: only what it persisted is back, and it re-sends every
    // assignment (TAKE of each half to the master that already serves them both).
    cluster.restart_coordinator_after_sigkill();
    let client = cluster.client();
    assert_eq!(tablets_of(&client, table).await, before);
    for index in 0..200 {
        let key = format!("key-{index}");
        let (value, _) = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(&value[..], b"v");
        client.write(table, key.as_bytes(), b"w").await.unwrap();
    }
    let objects = client.enumerate(table).collect_all().await.unwrap();
    assert_eq!(objects.len(), 200);
    assert!(objects.iter().all(|object| &object.value[..] == b"w"));
}
