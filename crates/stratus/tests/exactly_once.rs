//! Exactly-once mutations (RIFL, docs/design/exactly-once.md) with real processes: a mutation
//! sent again with its identity — as a client whose answer was lost sends it — is answered
//! with its first result and applied once, at its master, at the master its tablet moved to,
//! at the master that recovered it after a SIGKILL, and after the coordinator restarted; once
//! acknowledged it is refused as stale.
//!
//! The requests are raw (a `ChannelPool`), so the test chooses every identity; the client
//! library's own retries are covered by its tests and by the simulation's counters.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{Client, ClientConfig, TableId};
use stratus_env::Environment;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::{key_hash, LeaseId, RejectRules, RpcId, RpcIdentity, ServerId, TabletState};
use stratus_wire::{Request, Response, ResponseBody, Status};

/// How long the test waits for a recovery, a migration or an answer.
const PATIENCE: Duration = Duration::from_secs(90);

const KEY: &[u8] = b"counter";

fn patient_client(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = PATIENCE;
    Client::new(config)
}

/// A raw client: its own lease, renewed in the background, and identities of its choosing.
struct RawClient {
    pool: ChannelPool,
    lease: LeaseId,
}

impl RawClient {
    async fn open(coordinator: &str) -> RawClient {
        let pool = ChannelPool::new(Environment::system().network, RpcConfig::default());
        let lease = renew(&pool, coordinator, LeaseId(0)).await;
        let coordinator = coordinator.to_string();
        tokio::spawn(async move {
            let pool = ChannelPool::new(Environment::system().network, RpcConfig::default());
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                renew(&pool, &coordinator, lease).await;
            }
        });
        RawClient { pool, lease }
    }

    fn identity(&self, rpc: u64, acknowledged: u64) -> RpcIdentity {
        RpcIdentity { lease: self.lease, rpc: RpcId(rpc), acknowledged: RpcId(acknowledged) }
    }

    /// INCREMENT of the counter by 1 under `identity`, sent to whichever master serves it
    /// until a final answer: the status, and the value on success.
    async fn increment(
        &self,
        client: &Client,
        table: TableId,
        identity: RpcIdentity,
    ) -> (Status, i64) {
        let request = Request::Increment {
            table_id: table,
            key: Bytes::from_static(KEY),
            delta: 1,
            rules: RejectRules::NONE,
            rpc: Some(identity),
        };
        let hash = key_hash(table, KEY);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            assert!(tokio::time::Instant::now() < deadline, "{identity:?}: no final answer");
            let map = client.tablet_map(table).await.unwrap();
            let tablet = map.into_iter().find(|tablet| tablet.range.contains(hash)).unwrap();
            if tablet.state != TabletState::Normal {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            match self.pool.call(&tablet.owner_address, &request).await {
                Ok((Status::Ok, ResponseBody::Operation(Response::Increment { value, .. }))) => {
                    return (Status::Ok, value)
                }
                // The master is checking the lease, or the map moved on.
                Ok((Status::Retry | Status::UnknownTablet | Status::WrongServer, _)) => {}
                Ok((status, _)) => return (status, 0),
                Err(_) => self.pool.forget(&tablet.owner_address),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Opens (lease 0) or renews a client lease, waiting for a coordinator that is restarting.
async fn renew(pool: &ChannelPool, coordinator: &str, lease: LeaseId) -> LeaseId {
    let request = Request::ClientLease { lease };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match pool.call_coordinator(coordinator, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::ClientLease { lease, .. }))) => {
                return lease
            }
            Ok((Status::ExpiredLease, _)) => panic!("lease {lease} expired while renewed"),
            _ => pool.forget(coordinator),
        }
        assert!(tokio::time::Instant::now() < deadline, "no coordinator to renew lease {lease}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn counter(client: &Client, table: TableId) -> i64 {
    let (value, _) = client.read(table, KEY).await.unwrap();
    i64::from_le_bytes(value[..].try_into().unwrap())
}

async fn owner(client: &Client, table: TableId) -> (ServerId, String) {
    let tablet = client.tablet_map(table).await.unwrap().remove(0);
    (tablet.owner, tablet.owner_address)
}

/// Waits until the table's tablet is served by a master other than `gone`.
async fn wait_until_served_without(client: &Client, table: TableId, gone: ServerId) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let tablet = client.tablet_map(table).await.unwrap().remove(0);
        if tablet.owner != gone && tablet.state == TabletState::Normal {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {tablet:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mutation_sent_again_is_applied_once_wherever_its_tablet_goes() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("exactly-once", 1).await.unwrap();
    let raw = RawClient::open(&cluster.coordinator_address).await;

    // At its master: the same rpc twice is one increment, answered the same.
    assert_eq!(raw.increment(&client, table, raw.identity(1, 0)).await, (Status::Ok, 1));
    assert_eq!(raw.increment(&client, table, raw.identity(1, 0)).await, (Status::Ok, 1));
    assert_eq!(raw.increment(&client, table, raw.identity(2, 0)).await, (Status::Ok, 2));
    assert_eq!(counter(&client, table).await, 2);

    // At the master the tablet migrated to.
    let (first_owner, _) = owner(&client, table).await;
    let servers = client.server_list().await.unwrap();
    let target = servers.iter().find(|server| server.server_id != first_owner).unwrap();
    client.migrate_tablet("exactly-once", 0, target.server_id).await.unwrap();
    assert_eq!(owner(&client, table).await.0, target.server_id);
    assert_eq!(raw.increment(&client, table, raw.identity(2, 0)).await, (Status::Ok, 2));
    assert_eq!(raw.increment(&client, table, raw.identity(1, 0)).await, (Status::Ok, 1));
    assert_eq!(counter(&client, table).await, 2);

    // At the master that recovered it from the replicas of the one killed with SIGKILL.
    let (victim_id, victim_address) = owner(&client, table).await;
    let victim = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(victim_address.as_str()))
        .expect("the owner's process");
    victim.kill();
    wait_until_served_without(&client, table, victim_id).await;
    assert_eq!(raw.increment(&client, table, raw.identity(2, 0)).await, (Status::Ok, 2));
    assert_eq!(counter(&client, table).await, 2);

    // After the coordinator restarted: the lease it granted before is still honoured (it is
    // renewed within the term), and so are its results.
    cluster.restart_coordinator_after_sigkill();
    assert_eq!(raw.increment(&client, table, raw.identity(1, 0)).await, (Status::Ok, 1));
    assert_eq!(raw.increment(&client, table, raw.identity(3, 2)).await, (Status::Ok, 3));

    // RPC 3 acknowledged 1 and 2: a delayed copy of either is refused, and applies nothing.
    assert_eq!(raw.increment(&client, table, raw.identity(1, 0)).await.0, Status::StaleRpc);
    assert_eq!(raw.increment(&client, table, raw.identity(2, 0)).await.0, Status::StaleRpc);
    assert_eq!(counter(&client, table).await, 3);
}

/// The client library: increments whose answers are lost to a master killed under them end
/// with the counter at the acknowledged increments plus at most those whose outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_increments_through_a_master_crash_count_exactly() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("counted", 1).await.unwrap();
    let (victim_id, victim_address) = owner(&client, table).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut acknowledged, mut unknown) = (0i64, 0i64);
                let mut values = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    match client.increment(table, KEY, 1).await {
                        Ok((value, _)) => {
                            acknowledged += 1;
                            values.push(value);
                        }
                        Err(_) => unknown += 1,
                    }
                }
                (acknowledged, unknown, values)
            })
        })
        .collect();
    // Increments run before, during and after the crash and its recovery.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(victim_address.as_str()))
        .expect("the owner's process");
    victim.kill();
    wait_until_served_without(&client, table, victim_id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let (mut acknowledged, mut unknown, mut values) = (0, 0, Vec::new());
    for worker in workers {
        let (done, lost, seen) = worker.await.unwrap();
        acknowledged += done;
        unknown += lost;
        values.extend(seen);
    }
    let final_value = counter(&client, table).await;
    assert!(
        acknowledged <= final_value && final_value <= acknowledged + unknown,
        "{acknowledged} acknowledged, {unknown} unknown, counter at {final_value}"
    );
    values.sort_unstable();
    let distinct = values.len();
    values.dedup();
    assert_eq!(values.len(), distinct, "two increments answered the same value");
}
