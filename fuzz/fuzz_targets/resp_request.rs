//! The RESP front end's parsers on arbitrary bytes: the incremental request parser (fed in two
//! pieces split where the first byte says, with small limits so they are reached), the
//! general value parser, and the decoder of stored hashes (the bytes after the hash marker).
//! None may panic; every command parsed must survive encode then parse unchanged, every value
//! parsed must re-encode to bytes that parse to the same encoding, and every hash decoded must
//! re-encode to the very bytes it came from.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stratus_resp::hash::{Hash, HASH_MARKER};
use stratus_resp::{parse_value, Parsed, Protocol, RequestLimits, RequestParser, Value};

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else { return };
    let limits = RequestLimits {
        argument_bytes_max: 64,
        arguments_max: 16,
        command_bytes_max: 256,
        inline_bytes_max: 128,
        refused_command_bytes_max: 1024,
    };
    let commands = parse_requests(data, usize::from(split).min(data.len()), limits);
    for command in commands {
        let encoded =
            Value::Array(command.iter().cloned().map(Value::BulkString).collect()).to_bytes(Protocol::Resp2);
        let again = parse_requests(&encoded, encoded.len(), RequestLimits::default());
        assert_eq!(again, vec![command], "a parsed command does not survive encode then parse");
    }
    if let Ok(Some((value, used))) = parse_value(data) {
        assert!(used <= data.len());
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let encoded = value.to_bytes(protocol);
            let (reparsed, reused) = parse_value(&encoded)
                .expect("an encoded value parses")
                .expect("an encoded value is complete");
            assert_eq!(reused, encoded.len());
            if protocol == Protocol::Resp3 {
                assert_eq!(reparsed.to_bytes(protocol), encoded, "RESP3 re-encoding differs");
            }
        }
    }
    let stored = Bytes::from([&HASH_MARKER[..], data].concat());
    if let Ok(hash) = Hash::decode(&stored) {
        assert_eq!(hash.encode(), stored, "a decoded hash does not re-encode to its bytes");
    }
});

/// The commands parsed from `data` fed in two pieces, until the end or a protocol error;
/// refused commands are left out (their bytes are gone, so nothing can be re-encoded).
fn parse_requests(data: &[u8], split: usize, limits: RequestLimits) -> Vec<Vec<Bytes>> {
    let mut parser = RequestParser::new(limits);
    let mut buffer = BytesMut::new();
    let mut commands = Vec::new();
    for piece in [&data[..split], &data[split..]] {
        buffer.extend_from_slice(piece);
        loop {
            match parser.next_command(&mut buffer) {
                Ok(Some(Parsed::Command(command))) => commands.push(command),
                Ok(Some(Parsed::Refused(_))) => {}
                Ok(None) => break,
                Err(_) => return commands,
            }
        }
    }
    commands
}
