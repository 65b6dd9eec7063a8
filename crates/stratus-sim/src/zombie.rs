//! A zombie client (docs/design/exactly-once.md, "Lease checks on masters"): it applies one
//! increment under its client lease, falls silent for longer than a lease term, and comes back
//! with a new increment and with its old one again. Both must be refused with EXPIRED_LEASE:
//! its results may have been forgotten, so applying either would break exactly-once. The
//! counter must hold its one increment.
//!
//! It speaks to the servers with raw requests (a `ChannelPool`), as a client library that has
//! been paused would: it renews nothing and sends exactly the identities it chooses.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stratus_client::Client;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::limits::CLIENT_LEASE_TERM_MILLIS;
use stratus_types::{key_hash, LeaseId, RejectRules, RpcId, RpcIdentity, TableId};
use stratus_wire::{Request, Response, ResponseBody, Status};

use crate::nodes::{HostResult, COORDINATOR_ADDRESS};
use crate::{client_config, network, table_id, SimulationOptions, Workload};

/// How long one step of the zombie keeps trying (a crash or a recovery in its way).
const STEP_PATIENCE: Duration = Duration::from_secs(60);

/// How long it stays silent after the faults: more than a lease term, counted from the last
/// coordinator restart too (a restarted coordinator honours earlier leases for one term).
const SILENCE: Duration = Duration::from_millis(CLIENT_LEASE_TERM_MILLIS + 15_000);

/// The zombie's key (nothing else touches it).
const KEY: &[u8] = b"zombie-counter";

pub(crate) async fn run(
    seed: u64,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> HostResult {
    let environment = network::client_environment(seed, "zombie", 0);
    let client = Client::with_environment(client_config(), environment.clone());
    let table = table_id(&client, options.servers as u32, crate::workload_tier(&options))
        .await
        .ok_or("no table")?;
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    let lease = open_lease(&pool).await?;
    let first = RpcIdentity { lease, rpc: RpcId(1), acknowledged: RpcId(0) };
    let applied = match increment(&client, &pool, table, first).await? {
        (Status::Ok, Some(value)) => value,
        (status, _) => return Err(format!("zombie: its first increment ended {status}").into()),
    };
    while !workload.faults_over.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(SILENCE).await;
    let second = RpcIdentity { lease, rpc: RpcId(2), acknowledged: RpcId(1) };
    for (what, identity) in [("a new increment", second), ("its old increment", first)] {
        let (status, _) = increment(&client, &pool, table, identity).await?;
        if status != Status::ExpiredLease {
            return Err(format!(
                "zombie: {what} under lease {lease}, silent for longer than a term, ended \
                 {status} instead of EXPIRED_LEASE"
            )
            .into());
        }
    }
    let (value, _) = client.read(table, KEY).await.map_err(|error| format!("zombie: {error}"))?;
    let value = i64::from_le_bytes(value[..].try_into().map_err(|_| "zombie: not a counter")?);
    if value != applied {
        return Err(format!("zombie: the counter holds {value}, not its one increment").into());
    }
    workload.zombie_checked.store(true, Ordering::Release);
    Ok(())
}

/// Opens a client lease at the coordinator (which may be down for a while).
async fn open_lease(pool: &ChannelPool) -> Result<LeaseId, String> {
    let deadline = tokio::time::Instant::now() + STEP_PATIENCE;
    let request = Request::ClientLease { lease: LeaseId(0) };
    while tokio::time::Instant::now() < deadline {
        if let Ok((Status::Ok, ResponseBody::Operation(Response::ClientLease { lease, .. }))) =
            pool.call_coordinator(COORDINATOR_ADDRESS, &request).await
        {
            return Ok(lease);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("zombie: no client lease".to_string())
}

/// Increments the zombie's counter by 1 under `identity`, sent to whichever master serves it
/// until an answer other than "try again" comes: the final status, and the value on success.
async fn increment(
    client: &Client,
    pool: &ChannelPool,
    table: TableId,
    identity: RpcIdentity,
) -> Result<(Status, Option<i64>), String> {
    let hash = key_hash(table, KEY);
    let request = Request::Increment {
        table_id: table,
        key: Bytes::from_static(KEY),
        delta: 1,
        rules: RejectRules::NONE,
        rpc: Some(identity),
    };
    let deadline = tokio::time::Instant::now() + STEP_PATIENCE;
    while tokio::time::Instant::now() < deadline {
        let owner = match client.tablet_map(table).await {
            Ok(tablets) => tablets.into_iter().find(|tablet| tablet.range.contains(hash)),
            Err(_) => None,
        };
        let Some(owner) = owner.filter(|tablet| !tablet.owner_address.is_empty()) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        match pool.call(&owner.owner_address, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::Increment { value, .. }))) => {
                return Ok((Status::Ok, Some(value)))
            }
            Ok((Status::Retry | Status::UnknownTablet | Status::WrongServer, _)) => {}
            Ok((status, _)) => return Ok((status, None)),
            Err(_) => pool.forget(&owner.owner_address),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("zombie: increment {identity:?} got no final answer"))
}
