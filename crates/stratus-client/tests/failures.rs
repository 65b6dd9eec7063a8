//! How the client fails: at once when retrying cannot help, never after a second timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stratus_client::{Client, ClientConfig, Status, TableId};
use stratus_wire::{Hello, HELLO_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A peer that completes the handshake, then answers the first request with bytes that are
/// no frame at all. Counts the connections it accepted.
async fn garbage_speaker() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut hello = [0u8; HELLO_BYTES];
                if stream.read_exact(&mut hello).await.is_err() {
                    return;
                }
                let answer = Hello { version: 1, status: Status::Ok }.encode();
                let _ = stream.write_all(&answer).await;
                let mut request = [0u8; 64];
                let _ = stream.read(&mut request).await;
                // A length of 12 bytes, then a frame kind that does not exist.
                let _ =
                    stream.write_all(&[12, 0, 0, 0, 0xEE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    (address, connections)
}

#[tokio::test]
async fn a_peer_that_breaks_the_protocol_is_not_retried() {
    let (address, connections) = garbage_speaker().await;
    let mut config = ClientConfig::new(address);
    // Long: retrying until the deadline would open many connections in that time.
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    let error = client.create_table("t", 1).await.expect_err("garbage is not an answer");
    assert_eq!(error.status, Status::InternalError, "{error}");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "the request was retried: {error}");
}

#[tokio::test]
async fn table_id_zero_names_no_table() {
    // Nothing listens there: an answer at all means the client did not try the network.
    let mut config = ClientConfig::new("127.0.0.1:9");
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    let error = client.read(TableId(0), b"key").await.expect_err("no table 0");
    assert_eq!(error.status, Status::TableDoesntExist, "{error}");
}
