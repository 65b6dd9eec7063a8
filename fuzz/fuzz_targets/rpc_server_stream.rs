//! A server connection fed an arbitrary byte stream: the handshake, then whatever frames the
//! bytes hold. `serve_connection` must neither panic nor hang, and everything it writes back
//! must be a well-formed handshake followed by well-formed response frames, or (to a
//! membership preamble, which this server without a cluster secret refuses) one refusal.
//!
//! The service decodes each request body and answers with an error frame (immediately, or
//! deferred for every other request, to exercise both paths).

#![no_main]

#[path = "common/server_stream.rs"]
mod server_stream;

use std::cell::RefCell;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stratus_rpc::{Admission, Handled, Service};
use stratus_wire::membership::{MemberAnswer, MEMBER_ANSWER_BYTES, MEMBER_MAGIC};
use stratus_wire::{decode_request, encode_error_response, FrameHeader, Status};

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
    let output = RUNTIME.with(|runtime| {
        let exchange =
            server_stream::exchange(data.to_vec(), Arc::new(AnswerEverything), Admission::Open);
        runtime.borrow().block_on(exchange)
    });
    check_output(&output);
});

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
    server_stream::check_hello_and_frames(output);
}
