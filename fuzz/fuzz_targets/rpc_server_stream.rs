//! A server connection fed an arbitrary byte stream: the handshake, then whatever frames the
//! bytes hold. `serve_connection` must neither panic nor hang, and everything it writes back
//! must be a well-formed handshake followed by well-formed response frames, or (to a
//! membership preamble, which this server without a cluster secret refuses) one refusal.
//!
//! The service decodes each request body and answers with an error frame (immediately, or
//! deferred for every other request, to exercise both paths).

#![no_main]

use std::cell::RefCell;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stratus_env::Connection;
use stratus_rpc::server::serve_connection;
use stratus_rpc::{Handled, Service};
use stratus_wire::membership::{MemberAnswer, MEMBER_ANSWER_BYTES, MEMBER_MAGIC};
use stratus_wire::{
    decode_frame_header, decode_request, encode_error_response, frame_length, FrameHeader,
    FrameKind, Hello, Status, HELLO_BYTES,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Enough for every response to a 4 KiB input (libFuzzer's default maximum input size), so
/// the server never waits on a full pipe while this target is still writing.
const PIPE_BYTES: usize = 4 << 20;

struct AnswerEverything;

impl Service for AnswerEverything {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        let status = match decode_request(header.opcode_code, body) {
            Ok(_) => Status::InternalError,
            Err(error) => error.status(),
        };
        let (request_id, opcode_code) = (header.request_id, header.opcode_code);
        if request_id % 2 == 0 {
            encode_error_response(out, request_id, opcode_code, status, "fuzz");
            return Handled::Done;
        }
        Handled::Later(Box::pin(async move {
            let mut out = BytesMut::new();
            encode_error_response(&mut out, request_id, opcode_code, status, "deferred");
            out
        }))
    }
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
    );
}

fuzz_target!(|data: &[u8]| {
    let output = RUNTIME.with(|runtime| runtime.borrow().block_on(exchange(data.to_vec())));
    check_output(&output);
});

/// Sends `input` to a fresh server connection, closes the sending side, and returns every byte
/// the server wrote until it closed the connection.
async fn exchange(input: Vec<u8>) -> Vec<u8> {
    let (client, server) = tokio::io::duplex(PIPE_BYTES);
    let (server_reader, server_writer) = tokio::io::split(server);
    let connection = Connection {
        reader: Box::new(server_reader),
        writer: Box::new(server_writer),
        peer_address: "fuzz".to_string(),
    };
    let server = tokio::spawn(serve_connection(connection, Arc::new(AnswerEverything)));
    let (mut client_reader, mut client_writer) = tokio::io::split(client);
    let reader = tokio::spawn(async move {
        let mut output = Vec::new();
        let _ = client_reader.read_to_end(&mut output).await;
        output
    });
    // The server may close early (a bad handshake or frame), so a failed write is expected.
    let _ = client_writer.write_all(&input).await;
    let _ = client_writer.shutdown().await;
    server.await.expect("serve_connection panicked");
    drop(client_writer);
    reader.await.expect("reader task")
}

fn check_output(output: &[u8]) {
    if output.is_empty() {
        return;
    }
    if output.starts_with(&MEMBER_MAGIC) {
        // A membership preamble sent to this server, which has no cluster secret: it refuses
        // with one whole answer and says nothing more.
        let answer: &[u8; MEMBER_ANSWER_BYTES] =
            output.try_into().expect("exactly one preamble answer, and nothing after it");
        let answer = MemberAnswer::decode(answer).expect("the server's answer decodes");
        assert_eq!(answer.status, Status::AuthenticationFailed);
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
