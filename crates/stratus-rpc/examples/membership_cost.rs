//! What cluster membership costs, over loopback TCP in one process: the time to open a
//! connection (TCP, hello, and with a secret the preamble: one more round trip and two
//! HMAC-SHA-256 each side) and a PING's round trip on a client connection to a server with and
//! without a secret (the per-request access check). The configurations are interleaved, round
//! after round, and each round's medians are printed, so the spread is visible.
//!
//! `cargo run --release -p stratus-rpc --example membership_cost [rounds]` (also prints what
//! deriving the cluster key costs, once per process start).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stratus_env::{Network, OsEntropy, TcpNetwork};
use stratus_rpc::{
    serve_admitting, Admission, Channel, ClusterKey, Handled, MemberNetwork, Membership, RpcConfig,
    Service,
};
use stratus_wire::{encode_response, FrameHeader, Request, Response, Status};

const CONNECTS_PER_ROUND: usize = 300;
const PINGS_PER_ROUND: usize = 3_000;

struct Pong;

impl Service for Pong {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        encode_response(out, header.request_id, Status::Ok, &Response::Ping);
        Handled::Done
    }
}

fn membership() -> Arc<Membership> {
    let key = ClusterKey::from_secret(b"the secret of the cost measurement").expect("key");
    Membership::new(key, Arc::new(OsEntropy))
}

async fn start(admission: Admission) -> String {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_address();
    tokio::spawn(serve_admitting(listener, Arc::new(Pong), admission));
    address
}

fn median_micros(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

async fn connect_median(network: &dyn Network, address: &str) -> f64 {
    let mut samples = Vec::with_capacity(CONNECTS_PER_ROUND);
    for _ in 0..CONNECTS_PER_ROUND {
        let started = Instant::now();
        let channel =
            Channel::connect(network, address, &RpcConfig::default()).await.expect("connect");
        samples.push(started.elapsed());
        drop(channel);
    }
    median_micros(samples)
}

async fn ping_median(address: &str) -> f64 {
    let channel =
        Channel::connect(&TcpNetwork, address, &RpcConfig::default()).await.expect("connect");
    let mut samples = Vec::with_capacity(PINGS_PER_ROUND);
    for _ in 0..PINGS_PER_ROUND {
        let started = Instant::now();
        let (status, _) = channel.call(&Request::Ping, Duration::from_secs(2)).await.expect("ping");
        assert_eq!(status, Status::Ok);
        samples.push(started.elapsed());
    }
    median_micros(samples)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|text| text.parse().ok()).unwrap_or(5);
    let started = Instant::now();
    let _ = ClusterKey::from_secret(b"a secret to time the key derivation with").expect("key");
    println!(
        "key derivation (Argon2id, once per process): {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let open = start(Admission::Open).await;
    let secure = start(Admission::Members(membership())).await;
    let member_network = MemberNetwork::new(Arc::new(TcpNetwork), membership());
    println!("round  connect_open_us  connect_member_us  ping_open_us  ping_client_on_secure_us");
    for round in 1..=rounds {
        let connect_open = connect_median(&TcpNetwork, &open).await;
        let connect_member = connect_median(&member_network, &secure).await;
        let ping_open = ping_median(&open).await;
        let ping_secure = ping_median(&secure).await;
        println!(
            "{round:>5}  {connect_open:>15.1}  {connect_member:>17.1}  {ping_open:>12.1}  {ping_secure:>24.1}"
        );
    }
}
