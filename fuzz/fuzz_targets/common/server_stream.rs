//! What the targets that feed a server connection share: one exchange over an in-memory pipe,
//! and the check of what a server may write after its handshake.

use std::sync::Arc;

use stratus_env::Connection;
use stratus_rpc::server::serve_connection_admitting;
use stratus_rpc::{Admission, Service};
use stratus_wire::{decode_frame_header, frame_length, FrameKind, Hello, HELLO_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Enough for every response to a 4 KiB input (libFuzzer's default maximum input size), so
/// the server never waits on a full pipe while the target is still writing.
const PIPE_BYTES: usize = 4 << 20;

/// Sends `input` to a fresh connection of a server that asks what `admission` says, closes the
/// sending side, and returns every byte the server wrote until it closed the connection.
pub async fn exchange(input: Vec<u8>, service: Arc<dyn Service>, admission: Admission) -> Vec<u8> {
    let (client, server) = tokio::io::duplex(PIPE_BYTES);
    let (server_reader, server_writer) = tokio::io::split(server);
    let connection = Connection {
        reader: Box::new(server_reader),
        writer: Box::new(server_writer),
        peer_address: "fuzz".to_string(),
    };
    let server =
        tokio::spawn(
            async move { serve_connection_admitting(connection, service, &admission).await },
        );
    let (mut client_reader, mut client_writer) = tokio::io::split(client);
    let reader = tokio::spawn(async move {
        let mut output = Vec::new();
        let _ = client_reader.read_to_end(&mut output).await;
        output
    });
    // The server may close early (a bad handshake or frame), so a failed write is expected.
    let _ = client_writer.write_all(&input).await;
    let _ = client_writer.shutdown().await;
    server.await.expect("the server connection panicked");
    drop(client_writer);
    reader.await.expect("reader task")
}

/// Checks what a server wrote from its hello on: a whole hello, then whole response frames.
pub fn check_hello_and_frames(output: &[u8]) {
    if output.is_empty() {
        return;
    }
    let hello: &[u8; HELLO_BYTES] =
        output.get(..HELLO_BYTES).and_then(|bytes| bytes.try_into().ok()).expect("whole hello");
    Hello::decode(hello).expect("the server's hello decodes");
    let mut rest = &output[HELLO_BYTES..];
    while !rest.is_empty() {
        let length = frame_length(rest).expect("valid length").expect("a whole length field");
        let frame = rest.get(..length).expect("the server writes whole frames");
        let header = decode_frame_header(frame).expect("the server's frame header decodes");
        assert_eq!(header.kind, FrameKind::Response);
        rest = &rest[length..];
    }
}
