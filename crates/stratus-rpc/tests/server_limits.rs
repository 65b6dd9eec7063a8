//! What one server's connections may hold together: how many are open (past the limit a new
//! one is closed at once, and counted), and how many bytes of responses they leave unwritten
//! when their peers send requests and never read the answers.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{Network, TcpNetwork};
use stratus_rpc::{serve_within, Handled, ServerLimits, Service};
use stratus_types::{RejectRules, TableId, Version};
use stratus_wire::{
    decode_request, encode_request, encode_response, FrameHeader, Hello, Request, Response, Status,
    HELLO_BYTES, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The value every READ returns.
const VALUE_BYTES: usize = 256 << 10;

/// Answers PING, and READ with a value of [`VALUE_BYTES`].
struct Answering;

impl Service for Answering {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        let response = match decode_request(header.opcode_code, body) {
            Ok(Request::Read { .. }) => Response::Read {
                version: Version(1),
                value: Bytes::from(vec![7; VALUE_BYTES]),
                expires_in_millis: 0,
            },
            _ => Response::Ping,
        };
        encode_response(out, header.request_id, Status::Ok, &response);
        Handled::Done
    }
}

async fn start(limits: Arc<ServerLimits>) -> String {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    tokio::spawn(serve_within(listener, Arc::new(Answering), limits));
    address
}

/// A connection that completed the handshake, or the error that ended it.
async fn connect(address: &str) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(address).await?;
    stream.write_all(&Hello { version: PROTOCOL_VERSION, status: Status::Ok }.encode()).await?;
    let mut welcome = [0u8; HELLO_BYTES];
    stream.read_exact(&mut welcome).await?;
    Ok(stream)
}

/// Polls `condition` every millisecond, for at most ten seconds.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what} did not happen within ten seconds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_at_once_and_counted() {
    let limits = ServerLimits::new(2, 1 << 20, 2 << 20);
    let address = start(limits.clone()).await;
    let first = connect(&address).await.expect("room for a first connection");
    let _second = connect(&address).await.expect("room for a second connection");
    eventually("two connections open", || limits.connections_open() == 2).await;
    // The third is closed before its handshake is answered.
    assert!(connect(&address).await.is_err(), "a third connection was served");
    assert_eq!(limits.connections_refused(), 1);
    // A connection that ends makes room.
    drop(first);
    eventually("the first connection closed", || limits.connections_open() == 1).await;
    let _third = connect(&address).await.expect("room once the first closed");
    assert_eq!(limits.connections_refused(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_never_read_hold_a_bounded_total_of_unwritten_responses() {
    const CONNECTIONS: usize = 8;
    const READS_PER_CONNECTION: u64 = 400;
    let output_bytes_max = 2 << 20;
    let limits = ServerLimits::new(CONNECTIONS, 1 << 20, output_bytes_max);
    let address = start(limits.clone()).await;
    // Each peer sends 100 MiB worth of reads at once and never reads an answer.
    let mut peers = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut stream = connect(&address).await.expect("connect");
        let mut requests = BytesMut::new();
        for request_id in 0..READS_PER_CONNECTION {
            let key = Bytes::from_static(b"key");
            let read = Request::Read { table_id: TableId(1), key, rules: RejectRules::NONE };
            encode_request(&mut requests, request_id, &read);
        }
        stream.write_all(&requests).await.expect("send the requests");
        peers.push(stream);
    }
    // At most one response more per connection than the server's total: a connection goes
    // on only while it has nothing unwritten or the server is under its total.
    let response_bytes_max = VALUE_BYTES + 64;
    let bound = output_bytes_max + CONNECTIONS * response_bytes_max;
    let mut reached_the_total = false;
    for _ in 0..20_000 {
        let unwritten = limits.output_bytes();
        assert!(unwritten <= bound, "{unwritten} bytes unwritten, over {bound}");
        if unwritten >= output_bytes_max {
            reached_the_total = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(reached_the_total, "the peers never filled the server's output: nothing was tested");
    // Then it stays bounded while the server has every request it could want to answer.
    for _ in 0..500 {
        let unwritten = limits.output_bytes();
        assert!(unwritten <= bound, "{unwritten} bytes unwritten, over {bound}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A peer that reads is still answered (it has nothing unwritten).
    let mut reader = connect(&address).await;
    assert!(reader.is_err(), "the connection limit (8) is taken by the peers");
    drop(peers.pop());
    eventually("a peer's connection closed", || limits.connections_open() < CONNECTIONS).await;
    reader = connect(&address).await;
    let mut reader = reader.expect("room once a peer left");
    let mut ping = BytesMut::new();
    encode_request(&mut ping, 1, &Request::Ping);
    reader.write_all(&ping).await.expect("send a ping");
    let mut answer = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut answer)).await;
    assert!(matches!(read, Ok(Ok(bytes)) if bytes > 0), "no answer to a peer that reads");
    // Every connection's unwritten responses leave the account when it ends.
    drop(peers);
    drop(reader);
    eventually("the unwritten responses were released", || limits.output_bytes() == 0).await;
}
