//! Objects written before the faults into the tablets of chosen servers, so that their
//! recoveries have data to partition: the recovery plan's balance (bytes and objects per
//! recovery master) is measured on them. Each object is written once, by the loader, and read
//! back by the verifier after the faults, both recorded in the history, so the history check
//! covers them: a preloaded object a recovery lost fails the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use stratus_client::{Client, Expiry, KeyItem, RejectRules, TableId, WriteItem};
use stratus_history::{Outcome, Recorder, RecordingClient};
use stratus_types::{key_hash, HashRange};
use stratus_wire::ServerStatus;

use crate::nodes::{server_host, HostResult};

/// What to preload (`SimulationOptions::preload`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preload {
    /// The servers (by index) whose tablets of the simulation's table are filled.
    pub servers: Vec<usize>,
    /// Objects written into each one's tablets.
    pub objects_per_server: u32,
    /// Bytes of each value.
    pub value_bytes: usize,
    /// Tables the loader creates besides the simulation's, each spread over every server (at
    /// most `SERVER_SPAN_MAX`), before it writes anything; they stay empty. They give the
    /// coordinator a cluster's worth of tablets to keep, map and recover: 1 000 servers with 9
    /// extra tables hold 10 000 tablets, and a crashed master 10 to recover (`tests/costs.rs`).
    pub extra_tables: u32,
}

/// Items in one multi-write or multi-read of the loader and the verifier.
const ITEMS_PER_REQUEST: usize = 64;

/// How the preload went.
#[derive(Debug, Default)]
pub struct PreloadState {
    /// The keys written, every one acknowledged (filled by the loader).
    keys: Mutex<Vec<Bytes>>,
    /// Writes acknowledged.
    acknowledged: AtomicU64,
    /// When the loader finished (simulated milliseconds), once it has.
    finished_at_ms: AtomicU64,
    done: AtomicBool,
}

impl PreloadState {
    /// Whether the loader has finished.
    pub fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Writes acknowledged, and when the loader finished.
    pub fn outcome(&self) -> (u64, Duration) {
        (
            self.acknowledged.load(Ordering::Acquire),
            Duration::from_millis(self.finished_at_ms.load(Ordering::Acquire)),
        )
    }
}

/// The keys (`preload-<n>`, by increasing n) whose hashes fall in `ranges[i]`, the tablets of
/// target server `i`: `per_server` for each target.
fn keys_for(table: TableId, ranges: &[Vec<HashRange>], per_server: usize) -> Vec<Vec<Bytes>> {
    let mut keys: Vec<Vec<Bytes>> = vec![Vec::new(); ranges.len()];
    let mut missing: usize = ranges.iter().filter(|owned| !owned.is_empty()).count() * per_server;
    let mut candidate = 0u64;
    while missing > 0 {
        let key = format!("preload-{candidate}");
        candidate += 1;
        let hash = key_hash(table, key.as_bytes());
        for (index, owned) in ranges.iter().enumerate() {
            if keys[index].len() < per_server && owned.iter().any(|range| range.contains(hash)) {
                keys[index].push(Bytes::from(key));
                missing -= 1;
                break;
            }
        }
    }
    keys
}

/// The loader: once every target server serves its tablets, writes `objects_per_server`
/// objects into each one's tablets (the servers in parallel, `ITEMS_PER_REQUEST` objects per
/// multi-write), each write recorded as client `client_id`.
pub async fn run_loader(
    client: Client,
    recorder: Arc<Recorder>,
    client_id: u32,
    table: TableId,
    preload: Preload,
    state: Arc<PreloadState>,
) -> HostResult {
    let servers = client.server_list().await.map_err(|error| format!("server list: {error}"))?;
    let tablets = client.tablet_map(table).await.map_err(|error| format!("tablets: {error}"))?;
    let ranges: Vec<Vec<HashRange>> = preload
        .servers
        .iter()
        .map(|&index| {
            let address_prefix = format!("{}:", server_host(index));
            let owner = servers.iter().find(|server| {
                server.status == ServerStatus::Up && server.address.starts_with(&address_prefix)
            });
            tablets
                .iter()
                .filter(|tablet| owner.is_some_and(|owner| owner.server_id == tablet.owner))
                .map(|tablet| tablet.range)
                .collect()
        })
        .collect();
    let keys = keys_for(table, &ranges, preload.objects_per_server as usize);
    let client = Arc::new(RecordingClient::new(client, recorder, client_id));
    let mut loads = tokio::task::JoinSet::new();
    for keys in keys {
        let (client, state) = (client.clone(), state.clone());
        let value_bytes = preload.value_bytes;
        loads.spawn(async move {
            for batch in keys.chunks(ITEMS_PER_REQUEST) {
                let items: Vec<WriteItem> = batch
                    .iter()
                    .map(|key| {
                        // Unique per key (it holds the key), so the history tells writes apart.
                        let mut value = key.to_vec();
                        value.resize(value_bytes.max(key.len()), b'.');
                        WriteItem {
                            table_id: table,
                            key: key.clone(),
                            value: Bytes::from(value),
                            rules: RejectRules::NONE,
                            expiry: Expiry::Never,
                            rpc: None,
                        }
                    })
                    .collect();
                for (key, result) in batch.iter().zip(client.multi_write(&items).await) {
                    if result.is_ok() {
                        state.acknowledged.fetch_add(1, Ordering::AcqRel);
                        state
                            .keys
                            .lock()
                            .unwrap_or_else(|poison| poison.into_inner())
                            .push(key.clone());
                    }
                }
            }
        });
    }
    while loads.join_next().await.is_some() {}
    let now = turmoil::sim_elapsed().unwrap_or_default();
    state.finished_at_ms.store(now.as_millis() as u64, Ordering::Release);
    state.done.store(true, Ordering::Release);
    Ok(())
}

/// The verifier's part: every preloaded key read back after the faults, `ITEMS_PER_REQUEST`
/// per multi-read (recorded, so the history check sees what each read returned). A read
/// without a known outcome is a liveness failure.
pub async fn verify(
    client: &RecordingClient,
    table: TableId,
    state: &PreloadState,
) -> Result<(), String> {
    let mut keys = state.keys.lock().unwrap_or_else(|poison| poison.into_inner()).clone();
    keys.sort();
    for batch in keys.chunks(ITEMS_PER_REQUEST) {
        let items: Vec<KeyItem> = batch
            .iter()
            .map(|key| KeyItem { table_id: table, key: key.clone(), rules: RejectRules::NONE })
            .collect();
        for (key, result) in batch.iter().zip(client.multi_read(&items).await) {
            if let Err(error) = result {
                if !Outcome::is_refusal(error.status) {
                    return Err(format!(
                        "liveness: the final read of preloaded key {} failed after the faults \
                         stopped: {error}",
                        key.escape_ascii()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Waits until the coordinator lists `servers` servers up (or 60 s have passed).
pub async fn every_server_enlisted(client: &Client, servers: usize) {
    for _ in 0..1_200 {
        if let Ok(list) = client.server_list().await {
            if list.iter().filter(|server| server.status == ServerStatus::Up).count() >= servers {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
