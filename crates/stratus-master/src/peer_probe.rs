//! Failure detection, the storage server's side (RAMCloud's `FailureDetector`;
//! docs/design/recovery.md, "Failure detection").
//!
//! Every storage server pings one random other server every probe interval. A ping that is not
//! answered in time is reported to the coordinator (HINT_SERVER_CRASHED), which checks the
//! suspect with its own pings before it declares anything: a hint is never a verdict. Spreading
//! the pings over the servers keeps the coordinator's load independent of the cluster's size,
//! and every server is still pinged about once per interval on average.
//!
//! The server list comes from [`ServerList`], the cache the replica manager also chooses its
//! backups from: one copy per server, fetched from the coordinator at most once per
//! [`SERVER_LIST_REFRESH_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use stratus_env::{Environment, Network};
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::ServerId;
use stratus_wire::{Request, Response, ResponseBody, ServerEntry, ServerStatus, Status};

/// How long the server list from the coordinator is trusted before it is fetched again. A
/// server that joined meanwhile is pinged (and chosen as a backup) at most this much later.
pub const SERVER_LIST_REFRESH_INTERVAL: Duration = Duration::from_secs(2);

/// How long fetching the server list may take.
const SERVER_LIST_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a hint to the coordinator may take; a lost hint is repeated by the next ping that
/// misses (or caught by the coordinator's own sweep).
const HINT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How a storage server pings its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerProbeConfig {
    /// Time between two pings (each of one random peer). RAMCloud's `PROBE_INTERVAL`.
    pub probe_interval: Duration,
    /// How long a ping may take before the peer is reported to the coordinator.
    pub probe_timeout: Duration,
}

impl Default for PeerProbeConfig {
    /// RAMCloud pings every 100 ms; its 50 ms timeout suits a dedicated data-centre network,
    /// while here servers share cores with each other and a report costs the coordinator a
    /// check of three pings: 250 ms keeps false reports rare and still detects within about a
    /// second (docs/design/recovery.md).
    fn default() -> PeerProbeConfig {
        PeerProbeConfig {
            probe_interval: Duration::from_millis(100),
            probe_timeout: Duration::from_millis(250),
        }
    }
}

/// The coordinator's server list as this server last fetched it. Shared by the replica manager
/// (choosing backups) and the peer pinger; concurrent askers wait for one fetch.
#[derive(Debug)]
pub struct ServerList {
    coordinator: String,
    pool: ChannelPool,
    cached: tokio::sync::Mutex<CachedServers>,
    /// Lists fetched so far: a reader that remembers it can tell a new list from one it has
    /// already looked at without taking the lock.
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct CachedServers {
    servers: Vec<ServerEntry>,
    fetched_at: Option<tokio::time::Instant>,
}

impl ServerList {
    /// An empty cache of the list `coordinator` holds.
    pub fn new(coordinator: String, network: Arc<dyn Network>) -> Arc<ServerList> {
        let rpc =
            RpcConfig { request_timeout: SERVER_LIST_REQUEST_TIMEOUT, ..RpcConfig::default() };
        Arc::new(ServerList {
            coordinator,
            pool: ChannelPool::new(network, rpc),
            cached: tokio::sync::Mutex::new(CachedServers::default()),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// How many lists have been fetched (0: none yet).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The list as last fetched, with its generation, without fetching and without waiting:
    /// `None` while a fetch holds the cache (the caller looks again later) or before the
    /// first fetch.
    pub fn try_cached(&self) -> Option<(u64, Vec<ServerEntry>)> {
        let cached = self.cached.try_lock().ok()?;
        cached.fetched_at?;
        Some((self.generation(), cached.servers.clone()))
    }

    /// Makes the next [`ServerList::servers`] fetch the list again (servers were found gone).
    pub async fn mark_stale(&self) {
        self.cached.lock().await.fetched_at = None;
    }

    /// Every server the coordinator lists, fetched again if the copy is older than
    /// [`SERVER_LIST_REFRESH_INTERVAL`].
    pub async fn servers(&self) -> Result<Vec<ServerEntry>, String> {
        let mut cached = self.cached.lock().await;
        let fresh = cached
            .fetched_at
            .is_some_and(|fetched| fetched.elapsed() < SERVER_LIST_REFRESH_INTERVAL);
        if fresh {
            return Ok(cached.servers.clone());
        }
        match self.pool.call_coordinator(&self.coordinator, &Request::GetServerList).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::GetServerList { servers }))) => {
                cached.servers = servers;
                cached.fetched_at = Some(tokio::time::Instant::now());
                self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                Ok(cached.servers.clone())
            }
            Ok((status, _)) => Err(format!("coordinator answered the server list with {status}")),
            Err(error) => Err(format!("cannot reach the coordinator for the server list: {error}")),
        }
    }
}

/// The servers `server_id` may ping: every other server that is up.
fn peers(servers: &[ServerEntry], server_id: ServerId) -> Vec<&ServerEntry> {
    servers
        .iter()
        .filter(|entry| entry.status == ServerStatus::Up && entry.server_id != server_id)
        .collect()
}

/// Pings a random peer of `server_id` every [`PeerProbeConfig::probe_interval`], forever (until
/// the task is dropped), and reports each that does not answer within
/// [`PeerProbeConfig::probe_timeout`] to `coordinator`. One ping or hint is in flight at a time.
pub async fn probe_peers(
    server_id: ServerId,
    coordinator: String,
    config: PeerProbeConfig,
    server_list: Arc<ServerList>,
    environment: Environment,
) {
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    loop {
        tokio::time::sleep(config.probe_interval).await;
        let servers = match server_list.servers().await {
            Ok(servers) => servers,
            Err(reason) => {
                tracing::debug!(%reason, "no server list to choose a peer to ping from");
                continue;
            }
        };
        let candidates = peers(&servers, server_id);
        if candidates.is_empty() {
            continue;
        }
        let peer = candidates[environment.entropy.below(candidates.len() as u64) as usize];
        let ping = pool.call(&peer.address, &Request::Ping);
        if let Ok(Ok((Status::Ok, _))) = tokio::time::timeout(config.probe_timeout, ping).await {
            continue;
        }
        pool.forget(&peer.address);
        tracing::info!(
            peer = %peer.server_id, address = %peer.address,
            "a peer did not answer a ping in time; telling the coordinator"
        );
        let hint = Request::HintServerCrashed { server_id: peer.server_id };
        match tokio::time::timeout(HINT_REQUEST_TIMEOUT, pool.call_coordinator(&coordinator, &hint))
            .await
        {
            Ok(Ok((Status::Ok, _))) => {}
            Ok(Ok((status, body))) => {
                tracing::debug!(%status, ?body, "the coordinator refused a crash hint")
            }
            Ok(Err(_)) | Err(_) => tracing::debug!("a crash hint did not reach the coordinator"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_wire::ServiceMask;

    fn entry(id: u64, status: ServerStatus) -> ServerEntry {
        ServerEntry {
            server_id: ServerId(id),
            address: format!("server-{id}:1"),
            services: ServiceMask(ServiceMask::MASTER),
            status,
            failure_domain: String::new(),
        }
    }

    #[test]
    fn peers_are_the_other_servers_that_are_up() {
        let servers = vec![
            entry(1, ServerStatus::Up),
            entry(2, ServerStatus::Crashed),
            entry(3, ServerStatus::Up),
            entry(4, ServerStatus::Removed),
            entry(5, ServerStatus::Up),
        ];
        let chosen: Vec<u64> =
            peers(&servers, ServerId(3)).iter().map(|entry| entry.server_id.0).collect();
        assert_eq!(chosen, vec![1, 5]);
        assert!(peers(&servers[..1], ServerId(1)).is_empty(), "a lone server pings nobody");
    }
}
