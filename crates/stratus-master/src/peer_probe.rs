//! Failure detection, the storage server's side (RAMCloud's `FailureDetector`;
//! docs/design/recovery.md, "Failure detection").
//!
//! Every storage server pings one random other server every probe interval. A ping that is not
//! answered in time is reported to the coordinator (HINT_SERVER_CRASHED), which checks the
//! suspect with its own pings before it declares anything: a hint is never a verdict. Spreading
//! the pings over the servers keeps the coordinator's load independent of the cluster's size,
//! and every server is still pinged about once per interval on average.
//!
//! In a cluster of more than [`PROBE_SET_SIZE`] + 1 servers, a server pings the members of
//! its *probe set*: [`PROBE_SET_SIZE`] peers drawn at random, one of them replaced by another
//! random peer every [`PROBE_SET_ROTATION_PROBES`] pings. Each server is then in about
//! [`PROBE_SET_SIZE`] sets and still pinged about once per interval, but a server keeps
//! connections to at most [`PROBE_SET_SIZE`] peers for its pings, where pinging any peer at
//! random left it, within minutes, with a connection to every other server (N² in the
//! cluster: most of a 1 000-server simulation's memory, simulation.md, "Memory"). RAMCloud pings
//! over datagrams and holds no connection at all. Smaller clusters ping every peer at random as
//! before.
//!
//! The server list comes from [`ServerList`], the cache the replica manager also chooses its
//! backups from: one copy per server, fetched from the coordinator at most once per
//! [`SERVER_LIST_REFRESH_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use stratus_env::{Entropy, Environment, Network};
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

/// Peers a server pings (and keeps connections to for its pings) in a large cluster. With
/// every server drawing 16, a server is in no set at all with probability about e⁻¹⁶ (the
/// coordinator's own sweep still pings it), and in about 16 on average.
pub const PROBE_SET_SIZE: usize = 16;

/// Pings between two replacements of one probe set member (a random one): a member stays
/// about 16 × 16 = 256 pings on average (26 s at the default interval), so who watches whom
/// keeps changing while connections open at one per 1.6 s.
pub const PROBE_SET_ROTATION_PROBES: u32 = 16;

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
    let mut probe_set = ProbeSet::default();
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
        let entropy = environment.entropy.as_ref();
        let choice = probe_set.choose(&candidates, entropy);
        for left in &choice.left {
            // Its connection goes with it: a server keeps few open for its pings.
            pool.forget(&left.address);
        }
        let peer = candidates[choice.peer];
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

/// The peers a server pings in a cluster of more than [`PROBE_SET_SIZE`] + 1 servers (see the
/// module's comment); empty in a smaller one, where every peer is drawn at random.
#[derive(Debug, Default)]
struct ProbeSet {
    /// Ids and addresses of the members (the address: to drop a leaving member's connection).
    members: Vec<ServerEntry>,
    /// Pings since a member was last replaced.
    probes_since_rotation: u32,
    /// The last choice drew among every peer (a small cluster): any of them may hold a
    /// connection, which the first choice with a set drops unless it chose that peer.
    drew_among_all: bool,
}

/// Whom to ping next: a candidate by index, and the members that left the set since the last
/// choice (their connections are to be dropped).
#[derive(Debug, PartialEq, Eq)]
struct Choice {
    peer: usize,
    left: Vec<ServerEntry>,
}

impl ProbeSet {
    /// The next peer to ping among `candidates` (not empty). Members no longer among them
    /// (crashed, removed, moved) leave, one member is replaced every
    /// [`PROBE_SET_ROTATION_PROBES`] pings, the set is filled up to [`PROBE_SET_SIZE`] with
    /// random others, and a random member is chosen.
    fn choose(&mut self, candidates: &[&ServerEntry], entropy: &dyn Entropy) -> Choice {
        if candidates.len() <= PROBE_SET_SIZE {
            // Every peer fits: draw among all of them, as a small cluster always did.
            let left = std::mem::take(&mut self.members);
            self.drew_among_all = true;
            return Choice { peer: entropy.below(candidates.len() as u64) as usize, left };
        }
        let is_candidate = |member: &ServerEntry| {
            candidates
                .iter()
                .any(|c| c.server_id == member.server_id && c.address == member.address)
        };
        let (kept, mut left): (Vec<ServerEntry>, Vec<ServerEntry>) =
            std::mem::take(&mut self.members).into_iter().partition(is_candidate);
        self.members = kept;
        self.probes_since_rotation += 1;
        if self.probes_since_rotation >= PROBE_SET_ROTATION_PROBES
            && self.members.len() == PROBE_SET_SIZE
        {
            self.probes_since_rotation = 0;
            let replaced = entropy.below(self.members.len() as u64) as usize;
            left.push(self.members.swap_remove(replaced));
        }
        let is_member = |members: &[ServerEntry], candidate: &ServerEntry| {
            members.iter().any(|member| member.server_id == candidate.server_id)
        };
        while self.members.len() < PROBE_SET_SIZE {
            // Candidates outnumber the set, so a draw soon finds a non-member; bounded anyway,
            // then the first non-member in order (only when almost every candidate is one).
            let drawn = (0..64)
                .map(|_| candidates[entropy.below(candidates.len() as u64) as usize])
                .find(|drawn| !is_member(&self.members, drawn));
            let added = drawn
                .or_else(|| candidates.iter().copied().find(|c| !is_member(&self.members, c)))
                .expect("more candidates than members");
            self.members.push(added.clone());
        }
        if std::mem::take(&mut self.drew_among_all) {
            // The cluster grew past the set's size: the connections of the small cluster's
            // pings go, but those to the set's members.
            let others = candidates.iter().filter(|c| !is_member(&self.members, c));
            left.extend(others.map(|c| (*c).clone()));
        }
        let member = &self.members[entropy.below(self.members.len() as u64) as usize];
        let peer = candidates
            .iter()
            .position(|candidate| candidate.server_id == member.server_id)
            .expect("every member is a candidate");
        Choice { peer, left }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_env::SeededEntropy;
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

    fn cluster(size: u64) -> Vec<ServerEntry> {
        (1..=size).map(|id| entry(id, ServerStatus::Up)).collect()
    }

    #[test]
    fn a_small_cluster_pings_every_peer_at_random_and_keeps_no_set() {
        let servers = cluster(PROBE_SET_SIZE as u64 + 1);
        let candidates = peers(&servers, ServerId(1));
        let entropy = SeededEntropy::new(7);
        let mut set = ProbeSet::default();
        let mut pinged = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let choice = set.choose(&candidates, &entropy);
            assert!(choice.left.is_empty(), "nothing to leave in a small cluster");
            pinged.insert(candidates[choice.peer].server_id);
        }
        assert_eq!(pinged.len(), candidates.len(), "every peer is pinged");
        assert!(set.members.is_empty());
    }

    #[test]
    fn a_cluster_that_grows_past_the_set_drops_the_connections_it_no_longer_pings() {
        let servers = cluster(1_000);
        let candidates = peers(&servers, ServerId(1));
        let entropy = SeededEntropy::new(3);
        let mut set = ProbeSet::default();
        let small = &candidates[..PROBE_SET_SIZE];
        set.choose(small, &entropy);
        let choice = set.choose(&candidates, &entropy);
        let mut left: Vec<ServerId> = choice.left.iter().map(|m| m.server_id).collect();
        let mut kept: Vec<ServerId> = set.members.iter().map(|m| m.server_id).collect();
        // Every peer but the set's members leaves (its connection, if any, is dropped), once.
        assert_eq!(kept.len(), PROBE_SET_SIZE);
        left.append(&mut kept);
        left.sort_unstable();
        let every: Vec<ServerId> = candidates.iter().map(|c| c.server_id).collect();
        assert_eq!(left, every);
        // And only on that first choice with a set.
        assert!(set.choose(&candidates, &entropy).left.len() <= 1, "at most a rotation");
    }

    #[test]
    fn a_large_cluster_pings_a_bounded_rotating_set_and_drops_those_that_leave() {
        let servers = cluster(1_000);
        let candidates = peers(&servers, ServerId(1));
        let entropy = SeededEntropy::new(11);
        let mut set = ProbeSet::default();
        let mut connected = std::collections::BTreeSet::new();
        let mut pinged = std::collections::BTreeSet::new();
        let mut connected_max = 0;
        for _ in 0..10 * PROBE_SET_ROTATION_PROBES {
            let choice = set.choose(&candidates, &entropy);
            for left in &choice.left {
                connected.remove(&left.server_id);
            }
            connected.insert(candidates[choice.peer].server_id);
            pinged.insert(candidates[choice.peer].server_id);
            connected_max = connected_max.max(connected.len());
            assert_eq!(set.members.len(), PROBE_SET_SIZE);
            let mut ids: Vec<_> = set.members.iter().map(|member| member.server_id).collect();
            ids.dedup();
            assert_eq!(ids.len(), PROBE_SET_SIZE, "no member twice");
        }
        assert!(connected_max <= PROBE_SET_SIZE, "{connected_max} connections");
        assert!(pinged.len() > PROBE_SET_SIZE, "the set rotates: {} peers pinged", pinged.len());
        // Members that crash (a rack of three) leave at the next choice, and their
        // connections with them.
        let crashed: Vec<ServerId> = set.members[..3].iter().map(|m| m.server_id).collect();
        let survivors: Vec<&ServerEntry> =
            candidates.iter().copied().filter(|c| !crashed.contains(&c.server_id)).collect();
        let choice = set.choose(&survivors, &entropy);
        let mut left: Vec<ServerId> = choice.left.iter().map(|m| m.server_id).collect();
        left.retain(|id| crashed.contains(id));
        assert_eq!(left, crashed, "every crashed member leaves");
        assert!(set.members.iter().all(|member| !crashed.contains(&member.server_id)));
        assert_eq!(set.members.len(), PROBE_SET_SIZE);
        // A cluster that shrinks to the set's size leaves the set: every member goes.
        let few = &candidates[..PROBE_SET_SIZE];
        let choice = set.choose(few, &entropy);
        assert_eq!(choice.left.len(), PROBE_SET_SIZE);
        assert!(set.members.is_empty());
    }
}
