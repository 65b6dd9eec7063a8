//! What a named user's per-request grant check costs: sequential reads of one key by the
//! default user (the client password) and by a named user with a read grant, interleaved in
//! rounds against a running secure cluster, with the median latency of each round.
//!
//! ```sh
//! cargo run --release -p stratus-client --example user_overhead -- \
//!     COORDINATOR CA-FILE CLIENT-PASSWORD-FILE USER USER-PASSWORD-FILE TABLE [ROUNDS] [READS]
//! ```
//! The table must exist, and the user must be allowed to read it.

use std::time::{Duration, Instant};

use stratus_client::{Client, ClientConfig};
use stratus_tls::{ClientTls, ClientTlsFiles};

fn read_file(path: &str) -> Vec<u8> {
    std::fs::read(path).expect("readable file").trim_ascii().to_vec()
}

async fn round(client: &Client, table: stratus_client::TableId, reads: usize) -> Duration {
    let mut latencies = Vec::with_capacity(reads);
    for _ in 0..reads {
        let start = Instant::now();
        client.read(table, b"overhead-key").await.expect("read");
        latencies.push(start.elapsed());
    }
    latencies.sort();
    latencies[reads / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let [_, coordinator, ca, client_password, user, user_password, table, rest @ ..] =
        arguments.as_slice()
    else {
        panic!("usage: COORDINATOR CA CLIENT-PASSWORD-FILE USER USER-PASSWORD-FILE TABLE [ROUNDS] [READS]");
    };
    let rounds: usize = rest.first().map_or(5, |text| text.parse().expect("rounds"));
    let reads: usize = rest.get(1).map_or(5_000, |text| text.parse().expect("reads"));
    let files = ClientTlsFiles { ca: ca.into(), certificate_and_key: None };
    let tls = ClientTls::load(&files).expect("CA");
    let base = || {
        let mut config = ClientConfig::new(coordinator.clone());
        config.tls = Some(tls.clone());
        config
    };
    let default = Client::new(base().with_password(&read_file(client_password)).expect("password"));
    let named = Client::new(base().with_user(user, &read_file(user_password)).expect("user"));
    let table_id = default.get_table_id(table).await.expect("table");
    default.write(table_id, b"overhead-key", &[7u8; 100]).await.expect("write");
    // Warm both: connections, keys derived, tablet maps cached.
    round(&default, table_id, 200).await;
    round(&named, table_id, 200).await;
    for index in 0..rounds {
        let default_p50 = round(&default, table_id, reads).await;
        let named_p50 = round(&named, table_id, reads).await;
        println!(
            "{{\"round\":{index},\"reads\":{reads},\"default_p50_us\":{:.1},\"user_p50_us\":{:.1},\"ratio\":{:.3}}}",
            default_p50.as_secs_f64() * 1e6,
            named_p50.as_secs_f64() * 1e6,
            named_p50.as_secs_f64() / default_p50.as_secs_f64()
        );
    }
}
