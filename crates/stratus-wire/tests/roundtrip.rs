//! Every request and response, of every variant, survives encode → frame_length →
//! decode_frame_header → decode unchanged, and re-encodes to the same bytes.

mod common;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use stratus_wire::{
    body_offset, decode_frame_header, decode_request, decode_response, encode_error_response,
    encode_request, encode_response, frame_length, FrameKind, Opcode, ResponseBody,
};

/// Splits the first frame off `bytes`, checking the envelope agrees with the buffer.
fn whole_frame(bytes: &BytesMut) -> Bytes {
    let length = frame_length(bytes).expect("valid length").expect("complete length field");
    assert_eq!(length, bytes.len(), "one frame, exactly");
    Bytes::copy_from_slice(bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn requests_round_trip(request in common::request(), request_id in any::<u64>()) {
        let mut out = BytesMut::new();
        encode_request(&mut out, request_id, &request);
        let frame = whole_frame(&out);
        let header = decode_frame_header(&frame).unwrap();
        prop_assert_eq!(header.kind, FrameKind::Request);
        prop_assert_eq!(header.opcode_code, request.opcode().code());
        prop_assert_eq!(header.request_id, request_id);
        prop_assert_eq!(header.status, stratus_wire::Status::Ok);
        let body = frame.slice(body_offset(FrameKind::Request)..);
        let decoded = decode_request(header.opcode_code, body).unwrap();
        prop_assert_eq!(&decoded, &request);
        let mut again = BytesMut::new();
        encode_request(&mut again, request_id, &decoded);
        prop_assert_eq!(&again[..], &frame[..]);
    }

    #[test]
    fn responses_round_trip(
        response in common::response(),
        status in common::operation_status(),
        request_id in any::<u64>(),
    ) {
        let mut out = BytesMut::new();
        encode_response(&mut out, request_id, status, &response);
        let frame = whole_frame(&out);
        let header = decode_frame_header(&frame).unwrap();
        prop_assert_eq!(header.kind, FrameKind::Response);
        prop_assert_eq!(header.opcode_code, response.opcode().code());
        prop_assert_eq!(header.request_id, request_id);
        prop_assert_eq!(header.status, status);
        let opcode = Opcode::from_code(header.opcode_code).unwrap();
        let body = frame.slice(body_offset(FrameKind::Response)..);
        let decoded = decode_response(opcode, header.status, body).unwrap();
        prop_assert_eq!(&decoded, &ResponseBody::Operation(response.clone()));
        let mut again = BytesMut::new();
        encode_response(&mut again, request_id, status, &response);
        prop_assert_eq!(&again[..], &frame[..]);
    }

    #[test]
    fn error_responses_round_trip(
        opcode in proptest::sample::select(Opcode::ALL.to_vec()),
        status in common::error_status(),
        message in "\\PC{0,64}",
        request_id in any::<u64>(),
    ) {
        let mut out = BytesMut::new();
        encode_error_response(&mut out, request_id, opcode.code(), status, &message);
        let frame = whole_frame(&out);
        let header = decode_frame_header(&frame).unwrap();
        prop_assert_eq!(header.kind, FrameKind::Response);
        prop_assert_eq!(header.opcode_code, opcode.code());
        prop_assert_eq!(header.status, status);
        let body = frame.slice(body_offset(FrameKind::Response)..);
        let decoded = decode_response(opcode, status, body).unwrap();
        prop_assert_eq!(decoded, ResponseBody::Error { message });
    }
}

/// Several frames back to back (pipelining) split cleanly.
#[test]
fn pipelined_frames_split() {
    let mut out = BytesMut::new();
    for id in 0..10u64 {
        encode_request(&mut out, id, &stratus_wire::Request::Ping);
        encode_response(&mut out, id, stratus_wire::Status::Ok, &stratus_wire::Response::Ping);
    }
    let mut seen = 0;
    while let Some(length) = frame_length(&out).unwrap() {
        let frame = out.split_to(length);
        let header = decode_frame_header(&frame).unwrap();
        assert_eq!(header.request_id, seen / 2);
        seen += 1;
    }
    assert_eq!(seen, 20);
    assert!(out.is_empty());
}

/// Decoded keys and values point into the received body rather than being copies.
#[test]
fn keys_and_values_are_zero_copy() {
    let request = stratus_wire::Request::Write {
        table_id: stratus_types::TableId(1),
        key: Bytes::from_static(b"key"),
        value: Bytes::from_static(b"value"),
        rules: stratus_types::RejectRules::NONE,
        expiry: stratus_types::Expiry::Never,
    };
    let mut out = BytesMut::new();
    encode_request(&mut out, 1, &request);
    let frame = out.freeze();
    let body = frame.slice(body_offset(FrameKind::Request)..);
    let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    match decode_request(Opcode::Write.code(), body.clone()).unwrap() {
        stratus_wire::Request::Write { key, value, .. } => {
            assert!(range.contains(&(key.as_ptr() as usize)));
            assert!(range.contains(&(value.as_ptr() as usize)));
        }
        other => panic!("unexpected {other:?}"),
    }
}
