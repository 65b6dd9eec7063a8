//! Wire decoding of arbitrary bytes: the handshake, the frame envelope, and request and response
//! bodies. Every decoder must return an error value rather than panic, and whatever decodes must
//! survive encode then decode unchanged (decode ∘ encode is the identity on decoded values).

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stratus_wire::{
    body_offset, decode_frame_header, decode_request, decode_response, encode_error_response,
    encode_request, encode_response, frame_length, peek_request_identity, FrameHeader, FrameKind,
    Hello, Opcode, ResponseBody, HELLO_BYTES,
};

fuzz_target!(|data: &[u8]| {
    check_hello(data);
    check_frame(data);
    // Used on frames whose length is refused, so it sees arbitrary headers.
    let _ = peek_request_identity(data);
});

fn check_hello(data: &[u8]) {
    let Some(bytes) = data.get(..HELLO_BYTES) else { return };
    let bytes: &[u8; HELLO_BYTES] = bytes.try_into().expect("slice of HELLO_BYTES");
    if let Ok(hello) = Hello::decode(bytes) {
        // The handshake has a single encoding, so bytes round-trip exactly.
        assert_eq!(&hello.encode(), bytes, "hello re-encodes to different bytes");
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }
}

fn check_frame(data: &[u8]) {
    let announced = frame_length(data);
    let Ok(header) = decode_frame_header(data) else { return };
    // A header that decodes has a length field, so frame_length cannot be "need more bytes".
    assert!(!matches!(announced, Ok(None)), "header decoded but frame length unknown");
    let Ok(Some(total_bytes)) = announced else { return };
    let Some(frame) = data.get(..total_bytes) else { return };
    let Some(body) = frame.get(body_offset(header.kind)..) else { return };
    let body = Bytes::copy_from_slice(body);
    match header.kind {
        FrameKind::Request => check_request(&header, body),
        FrameKind::Response => check_response(&header, body),
    }
}

fn check_request(header: &FrameHeader, body: Bytes) {
    let Ok(request) = decode_request(header.opcode_code, body) else { return };
    let mut out = BytesMut::new();
    encode_request(&mut out, header.request_id, &request);
    let again = decode_frame_header(&out).expect("an encoded request header decodes");
    assert_eq!(again.kind, FrameKind::Request);
    assert_eq!(again.request_id, header.request_id);
    assert_eq!(again.opcode_code, header.opcode_code);
    let body = out.freeze().slice(body_offset(FrameKind::Request)..);
    let decoded = decode_request(again.opcode_code, body).expect("an encoded request decodes");
    assert_eq!(decoded, request, "request changed across encode and decode");
}

fn check_response(header: &FrameHeader, body: Bytes) {
    let Some(opcode) = Opcode::from_code(header.opcode_code) else { return };
    let Ok(decoded) = decode_response(opcode, header.status, body) else { return };
    let mut out = BytesMut::new();
    match &decoded {
        ResponseBody::Operation(response) => {
            // The opcode is taken from the variant; a body decoded for `opcode` must agree.
            assert_eq!(response.opcode(), opcode, "response variant of another opcode");
            encode_response(&mut out, header.request_id, header.status, response);
        }
        ResponseBody::Error { message } => encode_error_response(
            &mut out,
            header.request_id,
            header.opcode_code,
            header.status,
            message,
        ),
    }
    let again = decode_frame_header(&out).expect("an encoded response header decodes");
    assert_eq!(again.kind, FrameKind::Response);
    assert_eq!(again.request_id, header.request_id);
    if again.status != header.status {
        // encode_response replaces a frame over the size limit by INTERNAL_ERROR; a decoded
        // frame was within the limit, so its re-encoding must be too.
        panic!("status changed across encode: {:?} -> {:?}", header.status, again.status);
    }
    let body = out.freeze().slice(body_offset(FrameKind::Response)..);
    let redecoded = decode_response(opcode, again.status, body).expect("encoded response decodes");
    assert_eq!(redecoded, decoded, "response changed across encode and decode");
}
