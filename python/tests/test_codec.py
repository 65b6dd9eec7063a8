"""The codec against the wire specification's test vectors, and against malformed input."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import pytest
from wire_vectors import VECTORS, hex_bytes, vector_bytes

from stratus_client import codec
from stratus_client.codec import ErrorBody, MultiItemResult, Opcode
from stratus_client.errors import InvalidKey, ProtocolError, RequestTooLarge
from stratus_client.model import (
    FULL_HASH_RANGE,
    EnumeratedObject,
    EnumerationCursor,
    Expiry,
    HashRange,
    KeyItem,
    RejectRules,
    ServerEntry,
    ServerStatus,
    TableEntry,
    TabletEntry,
    TabletState,
    WriteItem,
)
from stratus_client.status import Status

SPECIFICATION = Path(__file__).resolve().parents[2] / "docs" / "design" / "wire-protocol.md"


def split_response(frame: bytes):
    header = codec.decode_response_header(frame)
    return header, frame[codec.RESPONSE_HEADER_BYTES :]


# ---------------------------------------------------------------------------------------------
# The copies are the specification's.


@pytest.mark.skipif(not SPECIFICATION.exists(), reason="runs inside the Stratus repository only")
def test_copied_vectors_equal_the_specification():
    text = SPECIFICATION.read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- vector: ([a-z0-9-]+) -->\s*```hex\n(.*?)```", text, re.S))
    assert sorted(found) == sorted(VECTORS)
    for name, block in found.items():
        assert hex_bytes(block) == vector_bytes(name), name


# ---------------------------------------------------------------------------------------------
# Handshake.


def test_client_handshake_vector():
    assert codec.encode_hello() == vector_bytes("hello")
    assert codec.decode_hello(vector_bytes("hello")) == (2, Status.OK)


def test_version_mismatch_handshake_vector():
    assert codec.decode_hello(vector_bytes("hello-version-mismatch")) == (
        2,
        Status.PROTOCOL_VERSION_MISMATCH,
    )


@pytest.mark.parametrize(
    "hello, problem",
    [
        (b"HTTP/1.1", "magic"),
        (b"STRA\x01\x00\xff\x00", "unknown status"),
        (b"STRA\x01\x00", "6 bytes"),
    ],
)
def test_malformed_handshakes_are_refused(hello, problem):
    with pytest.raises(ProtocolError, match=problem):
        codec.decode_hello(hello)


# ---------------------------------------------------------------------------------------------
# Requests this client sends, byte for byte.


def test_ping_request_vector():
    assert codec.encode_request(Opcode.PING, 1) == vector_bytes("ping-request")


def test_read_request_vector():
    body = codec.read_body(1, b"hello", RejectRules.only_if_version(5))
    assert codec.encode_request(Opcode.READ, 2, body) == vector_bytes("read-request")


def test_write_request_vector():
    body = codec.write_body(1, b"k", b"v1", RejectRules.only_if_missing(), Expiry.after(60))
    assert codec.encode_request(Opcode.WRITE, 4, body) == vector_bytes("write-request")


def test_multi_write_request_vector():
    items = [
        WriteItem(1, b"a", b"x"),
        WriteItem(
            2, b"b", b"yz", RejectRules(given_version=3, version_ne_given=True), Expiry.KEEP
        ),
    ]
    frame = codec.encode_request(Opcode.MULTI_WRITE, 6, codec.multi_body(items))
    assert frame == vector_bytes("multi-write-request")


def test_enumerate_request_vector():
    body = codec.enumerate_body(1, FULL_HASH_RANGE, EnumerationCursor(1 << 63, b"k"), 65536)
    assert codec.encode_request(Opcode.ENUMERATE, 7, body) == vector_bytes("enumerate-request")


def test_create_table_request_vector():
    body = codec.create_table_body("users", 4)
    assert codec.encode_request(Opcode.CREATE_TABLE, 8, body) == vector_bytes(
        "create-table-request"
    )


def test_requests_of_other_roles_share_the_envelope():
    """The client never sends backup or recovery requests, but their frames are requests like
    any other: the header this client writes must frame their bodies identically."""
    names = [name for name in VECTORS if name.endswith("-request")]
    assert len(names) >= 10
    for name in names:
        frame = vector_bytes(name)
        length, kind, flags, opcode_code, request_id = struct.unpack_from("<IBBHQ", frame)
        assert (length + 4, kind, flags) == (len(frame), 1, 0), name
        body = frame[codec.REQUEST_HEADER_BYTES :]
        assert codec.encode_request(Opcode(opcode_code), request_id, body) == frame, name


def test_other_request_encodings():
    assert codec.table_name_body("users") == b"\x05\x00users"
    assert codec.table_id_body(7) == struct.pack("<Q", 7)
    remove = codec.read_body(3, b"key", None)
    assert remove == struct.pack("<QH", 3, 3) + b"key" + struct.pack("<QB", 0, 0)
    increment = codec.increment_body(3, b"n", -5, RejectRules.only_if_exists())
    assert increment == struct.pack("<QH", 3, 1) + b"n" + struct.pack("<qQB", -5, 0, 1)
    multi_read = codec.multi_body([KeyItem(1, b"a"), KeyItem(2, b"bc", RejectRules(exists=True))])
    assert multi_read == (
        struct.pack("<I", 2)
        + struct.pack("<QH", 1, 1)
        + b"a"
        + struct.pack("<QB", 0, 0)
        + struct.pack("<QH", 2, 2)
        + b"bc"
        + struct.pack("<QB", 0, 2)
    )
    start = codec.enumerate_body(5, HashRange(1, 2), EnumerationCursor(), 10)
    assert start == struct.pack("<QQQQBI", 5, 1, 2, 0, 0, 10)


def test_requests_over_the_frame_limit_are_refused_before_sending():
    with pytest.raises(RequestTooLarge):
        codec.encode_request(Opcode.WRITE, 1, bytes(codec.FRAME_BYTES_MAX))


def test_over_long_keys_are_refused_not_sent_empty():
    with pytest.raises(InvalidKey):
        codec.read_body(1, bytes(codec.KEY_BYTES_MAX + 1), None)
    assert len(codec.read_body(1, bytes(codec.KEY_BYTES_MAX), None)) == 8 + 2 + 65535 + 9


# ---------------------------------------------------------------------------------------------
# Responses this client decodes.


def test_ping_response_vector():
    header, body = split_response(vector_bytes("ping-response"))
    assert (header.opcode_code, header.request_id, header.status) == (1, 1, Status.OK)
    assert codec.decode_response_body(Opcode.PING, header.status, body) is None


def test_read_response_vector():
    header, body = split_response(vector_bytes("read-response-ok"))
    assert (header.opcode_code, header.request_id, header.status) == (30, 2, Status.OK)
    assert codec.decode_response_body(Opcode.READ, header.status, body) == (5, b"world", 1500)


def test_read_of_missing_object_vector_carries_the_operation_body():
    header, body = split_response(vector_bytes("read-response-object-doesnt-exist"))
    assert (header.request_id, header.status) == (3, Status.OBJECT_DOESNT_EXIST)
    assert codec.decode_response_body(Opcode.READ, header.status, body) == (0, b"", 0)


def test_increment_response_vector():
    header, body = split_response(vector_bytes("increment-response"))
    assert (header.opcode_code, header.request_id, header.status) == (33, 5, Status.OK)
    assert codec.decode_response_body(Opcode.INCREMENT, header.status, body) == (9, -2)


def test_get_tablet_map_response_vector():
    header, body = split_response(vector_bytes("get-tablet-map-response"))
    assert (header.opcode_code, header.request_id, header.status) == (16, 9, Status.OK)
    tablets = codec.decode_response_body(Opcode.GET_TABLET_MAP, header.status, body)
    assert tablets == [
        TabletEntry(1, HashRange(0, (1 << 63) - 1), 1, "10.0.0.1:11100", TabletState.NORMAL),
        TabletEntry(
            1, HashRange(1 << 63, (1 << 64) - 1), 2, "10.0.0.2:11100", TabletState.RECOVERING
        ),
    ]
    assert tablets[1].recovering and not tablets[0].recovering


def test_error_response_vector():
    header, body = split_response(vector_bytes("error-response-unknown-tablet"))
    assert (header.opcode_code, header.request_id) == (30, 10)
    assert header.status is Status.UNKNOWN_TABLET
    decoded = codec.decode_response_body(Opcode.READ, header.status, body)
    assert decoded == ErrorBody("tablet not owned")


def test_error_bodies_decode_for_any_opcode():
    header, body = split_response(vector_bytes("backup-write-response-open-rejected"))
    assert header.status is Status.BACKUP_OPEN_REJECTED
    decoded = codec.decode_response_body(Opcode.BACKUP_WRITE, header.status, body)
    assert decoded == ErrorBody("no replica buffer free")


def test_responses_of_other_roles_have_valid_headers():
    names = [name for name in VECTORS if "-response" in name]
    assert len(names) >= 10
    for name in names:
        frame = vector_bytes(name)
        header = codec.decode_response_header(frame)
        assert header.total_bytes == len(frame) == codec.frame_total_bytes(frame[:4]), name


def response_frame(opcode: int, request_id: int, status: int, body: bytes) -> bytes:
    return struct.pack("<IBBHQH", 14 + len(body), 2, 0, opcode, request_id, status) + body


def test_other_response_bodies():
    decode = codec.decode_response_body
    assert decode(Opcode.CREATE_TABLE, Status.OK, struct.pack("<Q", 4)) == 4
    assert decode(Opcode.GET_TABLE_ID, Status.OK, struct.pack("<Q", 9)) == 9
    assert decode(Opcode.DROP_TABLE, Status.OK, b"") is None
    assert decode(Opcode.WRITE, Status.WRONG_VERSION, struct.pack("<Q", 12)) == 12
    assert decode(Opcode.REMOVE, Status.OK, struct.pack("<Q", 0)) == 0
    tables = struct.pack("<I", 1) + b"\x01\x00t" + struct.pack("<QI", 3, 2)
    assert decode(Opcode.LIST_TABLES, Status.OK, tables) == [TableEntry("t", 3, 2)]
    servers = struct.pack("<IQH", 1, 2, 3) + b"a:1" + struct.pack("<IB", 0b11, 1)
    assert decode(Opcode.GET_SERVER_LIST, Status.OK, servers) == [
        ServerEntry(2, "a:1", 0b11, ServerStatus.CRASHED)
    ]
    multi_read = (
        struct.pack("<I", 2) + struct.pack("<HQI", 0, 7, 2) + b"ok" + struct.pack("<HQI", 3, 0, 0)
    )
    assert decode(Opcode.MULTI_READ, Status.OK, multi_read) == [
        MultiItemResult(Status.OK, 7, value=b"ok"),
        MultiItemResult(Status.OBJECT_DOESNT_EXIST, 0),
    ]
    multi_increment = struct.pack("<IHQq", 1, 19, 4, 0)
    assert decode(Opcode.MULTI_INCREMENT, Status.OK, multi_increment) == [
        MultiItemResult(Status.INVALID_OBJECT, 4)
    ]
    multi_remove = struct.pack("<IHQHQ", 2, 0, 5, 5, 6)
    assert decode(Opcode.MULTI_REMOVE, Status.OK, multi_remove) == [
        MultiItemResult(Status.OK, 5),
        MultiItemResult(Status.WRONG_VERSION, 6),
    ]
    enumerate_last = struct.pack("<I", 1) + b"\x01\x00k" + struct.pack("<I", 1) + b"v"
    enumerate_last += struct.pack("<QBQB", 3, 1, 1_700_000_000_000, 0)
    response = decode(Opcode.ENUMERATE, Status.OK, enumerate_last)
    assert response.objects == [EnumeratedObject(b"k", b"v", 3)]
    assert response.next_cursor is None
    enumerate_more = struct.pack("<IBQBH", 0, 1, 99, 1, 1) + b"z"
    response = decode(Opcode.ENUMERATE, Status.OK, enumerate_more)
    assert response == ([], EnumerationCursor(99, b"z"))


# ---------------------------------------------------------------------------------------------
# Garbage is refused with ProtocolError, never a crash or a wrong value.


@pytest.mark.parametrize(
    "length_field, problem",
    [
        (struct.pack("<I", codec.FRAME_BYTES_MAX - 3), "exceeds the maximum"),
        (struct.pack("<I", 0xFFFFFFFF), "exceeds the maximum"),
        (struct.pack("<I", 13), "shorter than a response header"),
        (struct.pack("<I", 0), "shorter than a response header"),
    ],
)
def test_frame_lengths_out_of_bounds_are_refused_before_reading(length_field, problem):
    with pytest.raises(ProtocolError, match=problem):
        codec.frame_total_bytes(length_field)


def test_largest_frame_is_accepted():
    assert codec.frame_total_bytes(struct.pack("<I", codec.FRAME_BYTES_MAX - 4)) == (
        codec.FRAME_BYTES_MAX
    )


@pytest.mark.parametrize(
    "frame, problem",
    [
        (vector_bytes("ping-request") + b"\x00\x00", "length field says"),
        (struct.pack("<IBBHQH", 14, 1, 0, 1, 1, 0), "request frame"),
        (struct.pack("<IBBHQH", 14, 3, 0, 1, 1, 0), "unknown frame kind 3"),
        (struct.pack("<IBBHQH", 14, 2, 1, 1, 1, 0), "non-zero frame flags"),
        (struct.pack("<IBBHQH", 14, 2, 0, 1, 1, 29), "unknown status code 29"),
        (struct.pack("<IBBHQH", 15, 2, 0, 1, 1, 0), "length field says"),
        (b"\x0e\x00\x00\x00\x02\x00", "shorter than a response header"),
    ],
)
def test_malformed_response_headers_are_refused(frame, problem):
    with pytest.raises(ProtocolError, match=problem):
        codec.decode_response_header(frame)


@pytest.mark.parametrize(
    "opcode, status, body, problem",
    [
        (Opcode.READ, Status.OK, struct.pack("<QI", 1, 10) + b"short", "truncated"),
        (Opcode.WRITE, Status.OK, struct.pack("<Q", 1) + b"x", "1 trailing bytes"),
        (Opcode.PING, Status.OK, b"\x00", "trailing"),
        (Opcode.READ, Status.INTERNAL_ERROR, struct.pack("<H", 1025) + bytes(1025), "exceeds 1024"),
        (Opcode.READ, Status.RETRY, b"\x02\x00\xff\xfe", "not UTF-8"),
        (Opcode.MULTI_WRITE, Status.OK, struct.pack("<I", 4097), "exceeds the maximum"),
        (Opcode.MULTI_WRITE, Status.OK, struct.pack("<I", 4000) + bytes(20), "cannot fit"),
        (Opcode.MULTI_WRITE, Status.OK, struct.pack("<IHQ", 1, 99, 1), "unknown status code 99"),
        (Opcode.GET_TABLET_MAP, Status.OK, struct.pack("<I", 0xFFFFFFFF), "exceeds the maximum"),
        (
            Opcode.GET_TABLET_MAP,
            Status.OK,
            struct.pack("<IQQQQH", 1, 1, 5, 4, 1, 0) + b"\x00",
            "hash range start",
        ),
        (
            Opcode.GET_TABLET_MAP,
            Status.OK,
            struct.pack("<IQQQQH", 1, 1, 0, 4, 1, 0) + b"\x07",
            "unknown tablet state 7",
        ),
        (
            Opcode.GET_SERVER_LIST,
            Status.OK,
            struct.pack("<IQH", 1, 2, 0) + struct.pack("<IB", 0b1000, 0),
            "service mask",
        ),
        (
            Opcode.GET_SERVER_LIST,
            Status.OK,
            struct.pack("<IQH", 1, 2, 0) + struct.pack("<IB", 1, 4),
            "unknown server status 4",
        ),
        (Opcode.ENUMERATE, Status.OK, struct.pack("<IB", 0, 2), "next-cursor option tag 2"),
        (Opcode.ENUMERATE, Status.OK, struct.pack("<IBQB", 0, 1, 0, 5), "cursor after-key flag"),
        (
            Opcode.LIST_TABLES,
            Status.OK,
            struct.pack("<IH", 1, 300) + bytes(300 + 12),
            "exceeds 256",
        ),
    ],
)
def test_malformed_bodies_are_refused(opcode, status, body, problem):
    with pytest.raises(ProtocolError, match=problem):
        codec.decode_response_body(opcode, status, body)


def test_mutated_frames_never_escape_as_anything_but_protocol_errors():
    """Truncations, extensions and random byte flips of every response vector this client
    decodes: the decoder either returns a value or raises ProtocolError, nothing else."""
    decodable = {
        "ping-response": Opcode.PING,
        "read-response-ok": Opcode.READ,
        "read-response-object-doesnt-exist": Opcode.READ,
        "increment-response": Opcode.INCREMENT,
        "get-tablet-map-response": Opcode.GET_TABLET_MAP,
        "error-response-unknown-tablet": Opcode.READ,
    }
    generator = random.Random(20240607)
    outcomes = {"decoded": 0, "refused": 0}
    for name, opcode in decodable.items():
        original = vector_bytes(name)
        candidates = [original[:cut] for cut in range(len(original))]
        candidates += [original + bytes([extra]) for extra in (0, 1, 255)]
        for _ in range(300):
            mutated = bytearray(original)
            for _ in range(generator.randint(1, 4)):
                mutated[generator.randrange(len(mutated))] = generator.randrange(256)
            candidates.append(bytes(mutated))
        for frame in candidates:
            try:
                header = codec.decode_response_header(frame)
                codec.decode_response_body(
                    opcode, header.status, frame[codec.RESPONSE_HEADER_BYTES :]
                )
                outcomes["decoded"] += 1
            except ProtocolError:
                outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and outcomes["decoded"] > 0
