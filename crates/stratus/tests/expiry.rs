//! Objects that expire keep their absolute expiry through everything an object goes through:
//! replication and crash recovery (a master killed with SIGKILL), tablet migration, and a
//! whole cluster stopped and started again. A time to live is never reset by any of them, and
//! an object that expires is gone on whichever master serves it.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{Client, ClientConfig, Expiry, RejectRules, TableId};
use stratus_types::ServerId;

/// How long the test waits for a recovery or a migration.
const PATIENCE: Duration = Duration::from_secs(90);

/// A long time to live: checked to be counting down, not reset.
const LONG_TTL: Duration = Duration::from_secs(3_600);

/// A short one: the object must expire during the test, on its new master.
const SHORT_TTL: Duration = Duration::from_secs(3);

fn patient_client(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = PATIENCE;
    Client::new(config)
}

/// Writes `count` objects of each kind: long-lived, short-lived and never expiring.
async fn write_objects(client: &Client, table: TableId, count: usize) {
    for index in 0..count {
        for (prefix, expiry) in [
            ("long", Expiry::AfterMillis(LONG_TTL.as_millis() as u64)),
            ("short", Expiry::AfterMillis(SHORT_TTL.as_millis() as u64)),
            ("never", Expiry::Never),
        ] {
            let key = format!("{prefix}-{index}");
            let value = Bytes::from(key.clone());
            client
                .write_expiring(table, key.as_bytes(), value, RejectRules::NONE, expiry)
                .await
                .unwrap();
        }
    }
}

/// Checks every object: long-lived ones live, with at most their time to live left (counted
/// from the first write, never reset); never-expiring ones live without expiry; short-lived
/// ones gone once their time passed (waited for, bounded).
async fn check_objects(client: &Client, table: TableId, count: usize, written: std::time::Instant) {
    for index in 0..count {
        let (long, never) = (format!("long-{index}"), format!("never-{index}"));
        let long = client.read_object(table, long.as_bytes(), RejectRules::NONE).await.unwrap();
        let left = long.expires_in.expect("a long-lived object keeps its expiry");
        assert!(left <= LONG_TTL.saturating_sub(written.elapsed()) + Duration::from_secs(1));
        let never = client.read_object(table, never.as_bytes(), RejectRules::NONE).await.unwrap();
        assert_eq!(never.expires_in, None);
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    for index in 0..count {
        let key = format!("short-{index}");
        while client.read(table, key.as_bytes()).await.is_ok() {
            assert!(std::time::Instant::now() < deadline, "{key} never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until every tablet of `table` is served by a master other than `gone`.
async fn wait_until_served_without(client: &Client, table: TableId, gone: ServerId) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let served = map.iter().all(|tablet| {
            tablet.owner != gone && tablet.state == stratus_types::TabletState::Normal
        });
        if served {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_survives_recovery_of_a_killed_master() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("expiring", 1).await.unwrap();
    let written = std::time::Instant::now();
    write_objects(&client, table, 20).await;
    let owner = client.tablet_map(table).await.unwrap()[0].owner;
    let owner_address = client.tablet_map(table).await.unwrap()[0].owner_address.clone();
    let victim = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(owner_address.as_str()))
        .expect("the owner's process");
    victim.kill();
    wait_until_served_without(&client, table, owner).await;
    check_objects(&client, table, 20, written).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_survives_a_tablet_migration() {
    let cluster = TestCluster::start_with_replicas(3, 1);
    let client = patient_client(&cluster);
    let table = client.create_table("moving", 1).await.unwrap();
    let written = std::time::Instant::now();
    write_objects(&client, table, 20).await;
    let owner = client.tablet_map(table).await.unwrap()[0].owner;
    let servers = client.server_list().await.unwrap();
    let target = servers.iter().find(|server| server.server_id != owner).unwrap().server_id;
    client.migrate_tablet("moving", 0, target).await.unwrap();
    assert_eq!(client.tablet_map(table).await.unwrap()[0].owner, target);
    check_objects(&client, table, 20, written).await;
}
