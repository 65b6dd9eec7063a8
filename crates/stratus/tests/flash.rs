//! Flash tables with real processes: a table larger than its masters' log memory is written,
//! moved to flash by the masters' cleaners, read back whole; then a master is killed with
//! SIGKILL and its part comes back on the others from the backups, every value intact. And a
//! flash tablet whose values are on flash is split and half of it migrated: the values are
//! read from the source's images, land on the target in its flash tier, and read back whole.

mod common;

use std::time::Duration;

use common::TestCluster;
use stratus_client::{Client, ClientConfig, TableId};
use stratus_types::{ServerId, TabletState, Tier};

/// Objects per master and their value size: 40 MB per master, 1.25 times its 32 MiB log.
const OBJECTS_PER_MASTER: u32 = 10_000;
const VALUE_BYTES: usize = 4_000;
const MASTERS: usize = 4;

fn key_of(index: u32) -> Vec<u8> {
    format!("cold-{index:08}").into_bytes()
}

/// A value that names its key, so a value read for another key is caught.
fn value_of(index: u32) -> Vec<u8> {
    let mut value = format!("value of {index} ").into_bytes();
    let fill = (index % 251) as u8;
    value.resize(VALUE_BYTES, fill);
    value
}

fn patient_client(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = Duration::from_secs(60);
    Client::new(config)
}

async fn write_all(client: &Client, table: TableId, count: u32) {
    let mut tasks = tokio::task::JoinSet::new();
    let writers = 8u32;
    for writer in 0..writers {
        let client = client.clone();
        tasks.spawn(async move {
            let mut index = writer;
            while index < count {
                client
                    .write(table, &key_of(index), &value_of(index))
                    .await
                    .unwrap_or_else(|error| panic!("write of object {index} failed: {error}"));
                index += writers;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

async fn read_all(client: &Client, table: TableId, count: u32) {
    let mut tasks = tokio::task::JoinSet::new();
    let readers = 8u32;
    for reader in 0..readers {
        let client = client.clone();
        tasks.spawn(async move {
            let mut index = reader;
            while index < count {
                let (value, _) = client
                    .read(table, &key_of(index))
                    .await
                    .unwrap_or_else(|error| panic!("object {index} unreadable: {error}"));
                assert!(value == value_of(index), "object {index} read back wrong");
                index += readers;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Segment images in server `index`'s flash directory (its default, under its data directory).
fn images_of(cluster: &TestCluster, index: usize) -> usize {
    let directory = cluster.directory.path().join(format!("backup-{index}")).join("flash");
    std::fs::read_dir(directory)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.file_name().to_string_lossy().ends_with(".segment"))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flash_table_larger_than_memory_is_served_and_survives_a_killed_master() {
    let mut cluster = TestCluster::start_with(MASTERS, 2, &["--flash-gib", "1"]);
    let client = patient_client(&cluster);
    let table = client.create_table_with_tier("cold", MASTERS as u32, Tier::Flash).await.unwrap();
    let count = OBJECTS_PER_MASTER * MASTERS as u32;
    write_all(&client, table, count).await;
    read_all(&client, table, count).await;
    for index in 0..MASTERS {
        assert!(images_of(&cluster, index) > 0, "server {index} moved nothing to flash");
    }

    let map = client.tablet_map(table).await.unwrap();
    let victim_address = map[0].owner_address.clone();
    let victim = cluster
        .servers
        .iter_mut()
        .find(|server| server.address.as_deref() == Some(victim_address.as_str()))
        .unwrap();
    victim.signal(libc::SIGKILL);
    assert!(victim.wait_exit(Duration::from_secs(10)).is_some());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let served = map.iter().all(|tablet| {
            tablet.owner_address != victim_address && tablet.state == TabletState::Normal
        });
        if served {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    read_all(&client, table, count).await;
}

/// Polls until server `index` holds a segment image (its cleaner demoted something).
async fn wait_for_images(cluster: &TestCluster, index: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while images_of(cluster, index) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "server {index} moved nothing to flash");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flash_tablet_on_flash_is_split_and_migrated_whole() {
    let cluster = TestCluster::start_with(2, 1, &["--flash-gib", "1"]);
    let client = patient_client(&cluster);
    let table = client.create_table_with_tier("moving", 1, Tier::Flash).await.unwrap();
    // 1.25 times the source's log memory: the values can only all be there if most are on
    // flash, so the migration reads them from images.
    let count = OBJECTS_PER_MASTER;
    write_all(&client, table, count).await;
    let tablet = client.tablet_map(table).await.unwrap().remove(0);
    let source = tablet.owner;
    let source_index = cluster
        .servers
        .iter()
        .position(|server| server.address.as_deref() == Some(tablet.owner_address.as_str()))
        .expect("the owner is a server of the cluster");
    wait_for_images(&cluster, source_index).await;

    client.split_tablet("moving", 1 << 63).await.unwrap();
    let target = client
        .server_list()
        .await
        .unwrap()
        .into_iter()
        .filter(|server| server.services.has_master())
        .map(|server| server.server_id)
        .find(|&id| id != source)
        .expect("a second master");
    client.migrate_tablet("moving", 1 << 63, target).await.unwrap();
    let owners: Vec<ServerId> =
        client.tablet_map(table).await.unwrap().iter().map(|tablet| tablet.owner).collect();
    assert_eq!(owners, vec![source, target]);
    read_all(&client, table, count).await;
    // Half of 1.25 logs does not fit the target's memory beside its own segments for long: it
    // is a flash tablet there too, so its cleaner moves it out.
    let target_index = 1 - source_index;
    wait_for_images(&cluster, target_index).await;
    read_all(&client, table, count).await;
}
