//! The simulated world behind stratus-env's narrow interfaces: turmoil's TCP for the network,
//! the simulated wall clock, and seeded randomness.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use stratus_env::{
    BoxFuture, Connection, Environment, Listener, Network, SeededEntropy, WallClock,
};
use stratus_rpc::membership::REFUSED_PROOF_DELAY;
use stratus_rpc::{Admission, ClientNetwork, ClusterKey, MemberNetwork, Membership};

/// Connections through turmoil's simulated TCP: byte streams between simulated hosts whose
/// segments turmoil delays, holds (a stalled link) or drops (a partition: the stream stalls for
/// good, as a TCP connection whose retransmissions never arrive), deterministically from the
/// simulation's seed. Only usable inside a simulation step.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimulatedNetwork;

fn connection(stream: turmoil::net::TcpStream) -> Connection {
    let peer_address = stream.peer_addr().map(|address| address.to_string()).unwrap_or_default();
    let (reader, writer) = stream.into_split();
    Connection { reader: Box::new(reader), writer: Box::new(writer), peer_address }
}

impl Network for SimulatedNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(address).await?;
            Ok(connection(stream))
        })
    }

    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(address).await?;
            Ok(Box::new(SimulatedListener { listener }) as Box<dyn Listener>)
        })
    }
}

struct SimulatedListener {
    listener: turmoil::net::TcpListener,
}

impl std::fmt::Debug for SimulatedListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedListener").field("address", &self.local_address()).finish()
    }
}

impl Listener for SimulatedListener {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>> {
        Box::pin(async move {
            let (stream, _) = self.listener.accept().await?;
            Ok(connection(stream))
        })
    }

    fn local_address(&self) -> String {
        self.listener.local_addr().map(|address| address.to_string()).unwrap_or_default()
    }
}

/// The simulation's wall clock: a fixed epoch plus simulated time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimulatedWallClock;

/// 2026-01-01T00:00:00Z: object timestamps in a simulation start here.
const SIMULATION_EPOCH_SECONDS: u64 = 1_767_225_600;

impl WallClock for SimulatedWallClock {
    fn now_millis(&self) -> u64 {
        let elapsed = turmoil::sim_elapsed().unwrap_or(Duration::ZERO);
        let elapsed_millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        (SIMULATION_EPOCH_SECONDS * 1_000).saturating_add(elapsed_millis)
    }
}

/// The environment of one incarnation of one simulated node: its randomness depends on the
/// simulation's seed, the node and the incarnation, so a restarted node does not replay its
/// previous life's choices, and the whole run is still a function of the seed.
pub fn node_environment(seed: u64, node: &str, incarnation: u64) -> Environment {
    let mut mixed = seed ^ incarnation.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for byte in node.bytes() {
        mixed = (mixed ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    Environment {
        network: Arc::new(SimulatedNetwork),
        wall_clock: Arc::new(SimulatedWallClock),
        entropy: Arc::new(SeededEntropy::new(mixed)),
        // Its own stream: nonces drawn do not shift the node's other random choices.
        secure_entropy: Arc::new(SeededEntropy::new(mixed ^ 0x5EC0_5EC0_5EC0_5EC0)),
    }
}

/// The cluster secret and the client password of every simulated cluster: the coordinator and
/// the servers run in secure mode with a client password, as a production cluster with
/// `--cluster-secret-file` and `--client-password-file` does; the clients prove the password,
/// and nothing else holds the secret.
const SIMULATED_CLUSTER_SECRET: &[u8] = b"the simulated cluster's secret";
const SIMULATED_CLIENT_PASSWORD: &[u8] = b"the simulated cluster's client password";

/// The cluster key and the client key, derived once per process: the derivations are
/// deliberately slow, and nodes start often.
fn keys() -> &'static (ClusterKey, ClusterKey) {
    static KEYS: std::sync::OnceLock<(ClusterKey, ClusterKey)> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let cluster = ClusterKey::from_secret(SIMULATED_CLUSTER_SECRET).expect("long enough");
        let client =
            ClusterKey::from_client_password(SIMULATED_CLIENT_PASSWORD).expect("long enough");
        (cluster, client)
    })
}

/// [`node_environment`] for a coordinator or server: every connection it opens proves the
/// cluster secret, and what its listener must ask of connections (the secret from members, the
/// client password from clients).
pub fn member_environment(seed: u64, node: &str, incarnation: u64) -> (Environment, Admission) {
    let mut environment = node_environment(seed, node, incarnation);
    let (cluster_key, client_key) = keys().clone();
    let membership = Membership::with_options(
        cluster_key,
        Some(client_key),
        environment.secure_entropy.clone(),
        REFUSED_PROOF_DELAY,
    );
    environment.network = Arc::new(MemberNetwork::new(environment.network, membership.clone()));
    (environment, Admission::Members(membership))
}

/// [`node_environment`] for a client: every connection it opens (the client library's and
/// any raw pool's) proves the client password.
pub fn client_environment(seed: u64, node: &str, incarnation: u64) -> Environment {
    let mut environment = node_environment(seed, node, incarnation);
    let client_key = keys().1.clone();
    let nonces = environment.secure_entropy.clone();
    environment.network = Arc::new(ClientNetwork::new(environment.network, client_key, nonces));
    environment
}
