"""The codec against the wire specification's test vectors, and against malformed input."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import pytest
from wire_vectors import VECTORS, hex_bytes, vector_bytes

from stratus_client import codec
from stratus_client.codec import (
    ClientLeaseGrant,
    ErrorBody,
    MultiItemResult,
    Opcode,
    RpcIdentity,
    TxDecision,
    TxOp,
    TxOpKind,
    TxOpName,
    TxVote,
    TxVoteResult,
)
from stratus_client.errors import InvalidKey, ProtocolError, RequestTooLarge
from stratus_client.key_hash import key_hash
from stratus_client.model import (
    FULL_HASH_RANGE,
    EnumeratedObject,
    EnumerationCursor,
    Expiry,
    HashRange,
    IncrementItem,
    KeyItem,
    RejectRules,
    ServerEntry,
    ServerStatus,
    TableEntry,
    TabletEntry,
    TabletState,
    Tier,
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
    assert codec.PROTOCOL_VERSION == 6
    assert codec.decode_hello(vector_bytes("hello")) == (6, Status.OK)


def test_version_mismatch_handshake_vector():
    assert codec.decode_hello(vector_bytes("hello-version-mismatch")) == (
        6,
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
    body = codec.write_body(
        1, b"k", b"v1", RejectRules.only_if_missing(), Expiry.after(60), RpcIdentity(7, 12, 10)
    )
    assert codec.encode_request(Opcode.WRITE, 4, body) == vector_bytes("write-request")


def test_mutations_end_with_their_rpc_identity():
    identity = RpcIdentity(7, 12, 10)
    encoded = b"\x01" + struct.pack("<QQQ", 7, 12, 10)
    rules = RejectRules(given_version=3, version_ne_given=True)
    for make in (
        lambda rpc: codec.write_body(1, b"k", b"v", rules, Expiry.KEEP, rpc),
        lambda rpc: codec.set_expiry_body(1, b"k", Expiry.after(5), rules, rpc),
        lambda rpc: codec.remove_body(1, b"k", rules, rpc),
        lambda rpc: codec.increment_body(1, b"k", -1, rules, rpc),
    ):
        without = make(None)
        assert without.endswith(b"\x00")
        assert make(identity) == without[:-1] + encoded
    # REMOVE is READ's body and the identity.
    assert codec.remove_body(1, b"k", rules) == codec.read_body(1, b"k", rules) + b"\x00"


@pytest.mark.parametrize(
    "identity",
    [RpcIdentity(0, 1, 0), RpcIdentity(1, 0, 0), RpcIdentity(1, 5, 5), RpcIdentity(1, 5, 9)],
)
def test_identities_a_master_would_refuse_are_not_encoded(identity):
    with pytest.raises(ValueError, match="rpc identity"):
        codec.write_body(1, b"k", b"v", None, None, identity)


def test_multi_mutation_items_each_carry_an_identity():
    identities = [RpcIdentity(3, 4, 2), None]
    remove = codec.multi_body(Opcode.MULTI_REMOVE, [KeyItem(1, b"a"), KeyItem(2, b"b")], identities)
    assert remove == (
        struct.pack("<I", 2)
        + struct.pack("<QH", 1, 1)
        + b"a"
        + struct.pack("<QB", 0, 0)
        + b"\x01"
        + struct.pack("<QQQ", 3, 4, 2)
        + struct.pack("<QH", 2, 1)
        + b"b"
        + struct.pack("<QB", 0, 0)
        + b"\x00"
    )
    increment = codec.multi_body(Opcode.MULTI_INCREMENT, [IncrementItem(1, b"n", -2)], [None])
    assert increment == struct.pack("<IQH", 1, 1, 1) + b"n" + struct.pack("<qQBB", -2, 0, 0, 0)
    # Without identities every mutation item has the "none" tag; reads have no field at all.
    assert codec.multi_body(Opcode.MULTI_REMOVE, [KeyItem(1, b"a")]) == (
        codec.multi_body(Opcode.MULTI_READ, [KeyItem(1, b"a")]) + b"\x00"
    )
    with pytest.raises(ValueError):
        codec.multi_body(Opcode.MULTI_READ, [KeyItem(1, b"a")], [None])
    with pytest.raises(ValueError):
        codec.multi_body(Opcode.MULTI_WRITE, [WriteItem(1, b"a", b"")], [])
    with pytest.raises(TypeError):
        codec.multi_body(Opcode.MULTI_WRITE, [KeyItem(1, b"a")])
    with pytest.raises(ValueError):
        codec.multi_body(Opcode.READ, [KeyItem(1, b"a")])


def test_client_lease_vectors():
    assert codec.encode_request(
        Opcode.CLIENT_LEASE, 21, codec.client_lease_body(0)
    ) == vector_bytes("client-lease-request")
    header, body = split_response(vector_bytes("client-lease-response"))
    assert (header.opcode_code, header.request_id, header.status) == (24, 21, Status.OK)
    grant = codec.decode_response_body(Opcode.CLIENT_LEASE, header.status, body)
    assert grant == ClientLeaseGrant(lease=7, term_ms=30_000)


def test_check_client_leases_vectors():
    assert codec.encode_request(
        Opcode.CHECK_CLIENT_LEASES, 22, codec.check_client_leases_body([7, 9])
    ) == vector_bytes("check-client-leases-request")
    header, body = split_response(vector_bytes("check-client-leases-response"))
    assert (header.opcode_code, header.request_id, header.status) == (25, 22, Status.OK)
    assert codec.decode_response_body(Opcode.CHECK_CLIENT_LEASES, header.status, body) == [
        25_000,
        0,
    ]


def test_multi_write_request_vector():
    items = [
        WriteItem(1, b"a", b"x"),
        WriteItem(
            2, b"b", b"yz", RejectRules(given_version=3, version_ne_given=True), Expiry.KEEP
        ),
    ]
    frame = codec.encode_request(Opcode.MULTI_WRITE, 6, codec.multi_body(Opcode.MULTI_WRITE, items))
    assert frame == vector_bytes("multi-write-request")


def test_enumerate_request_vector():
    body = codec.enumerate_body(1, FULL_HASH_RANGE, EnumerationCursor(1 << 63, b"k"), 65536)
    assert codec.encode_request(Opcode.ENUMERATE, 7, body) == vector_bytes("enumerate-request")


def test_create_table_request_vector():
    body = codec.create_table_body("users", 4, Tier.FLASH)
    assert codec.encode_request(Opcode.CREATE_TABLE, 8, body) == vector_bytes(
        "create-table-request"
    )


def test_list_tables_response_vector():
    header, body = split_response(vector_bytes("list-tables-response"))
    assert (header.opcode_code, header.request_id, header.status) == (15, 27, Status.OK)
    assert codec.decode_response_body(Opcode.LIST_TABLES, Status.OK, body) == [
        TableEntry("users", 1, 2, Tier.MEMORY),
        TableEntry("events", 2, 1, Tier.FLASH),
    ]


def test_tiers_are_named_as_the_command_line_names_them_and_nothing_else_is_taken():
    assert [str(tier) for tier in Tier] == ["memory", "flash", "auto"]
    assert Tier.parse("flash") is Tier.FLASH and Tier.parse("MEMORY") is Tier.MEMORY
    assert Tier.parse("auto") is Tier.AUTO and int(Tier.AUTO) == 2
    assert Tier.parse(Tier.FLASH) is Tier.FLASH
    for wrong in ("disk", "", 1, None):
        with pytest.raises(ValueError, match="is not one of 'memory', 'flash', 'auto'"):
            Tier.parse(wrong)
    assert codec.create_table_body("t", 1)[-1] == Tier.MEMORY, "memory unless asked"


# The transaction of the specification's vectors: lease 7, acknowledged up to 10, first op rpc
# 12: a write of "x" to key "a" of table 1 read at version 3, a read of key "b" found absent,
# and (on another master) key "c", rpc 14.
TX_OPS = [TxOp(1, b"a", 12, TxOpKind.WRITE, 3, b"x"), TxOp(1, b"b", 13, TxOpKind.READ, 0)]
TX_NAMES = [TxOpName(1, key_hash(1, key), rpc) for key, rpc in ((b"a", 12), (b"b", 13), (b"c", 14))]


def test_tx_prepare_request_vector():
    assert TX_NAMES[0].key_hash == 0xD2F6D0996F37A720
    body = codec.tx_prepare_body(7, 10, 12, False, TX_OPS, TX_NAMES)
    assert codec.encode_request(Opcode.TX_PREPARE, 23, body) == vector_bytes("tx-prepare-request")


def test_tx_decision_request_vector():
    body = codec.tx_decision_body(7, 10, 12, TxDecision.COMMIT, TX_NAMES[:2])
    assert codec.encode_request(Opcode.TX_DECISION, 24, body) == vector_bytes("tx-decision-request")


def test_tx_request_abort_request_vector():
    body = codec.tx_request_abort_body(7, 12, TX_NAMES[:2])
    assert codec.encode_request(Opcode.TX_REQUEST_ABORT, 25, body) == vector_bytes(
        "tx-request-abort-request"
    )


def test_a_validation_carries_reads_and_no_participants():
    reads = [TxOp(2, b"k", 5, TxOpKind.READ, 9)]
    body = codec.tx_prepare_body(3, 4, 5, True, reads, [])
    assert body == (
        struct.pack("<QQQBI", 3, 4, 5, 1, 1)
        + struct.pack("<QH", 2, 1)
        + b"k"
        + struct.pack("<QBQI", 5, 1, 9, 0)
        + struct.pack("<I", 0)
    )
    remove = codec.tx_prepare_body(
        3, 0, 1, False, [TxOp(2, b"k", 1, TxOpKind.REMOVE, 4)], [TxOpName(2, 99, 1)]
    )
    assert remove.endswith(struct.pack("<QBQI", 1, 3, 4, 0) + struct.pack("<IQQQ", 1, 2, 99, 1))
    # A participant finishing a transaction acknowledges nothing.
    abort = codec.tx_decision_body(7, 0, 12, TxDecision.ABORT, [TxOpName(1, 2, 12)])
    assert abort == struct.pack("<QQQBIQQQ", 7, 0, 12, 2, 1, 1, 2, 12)


@pytest.mark.parametrize(
    "make",
    [
        # Identities a master would refuse as malformed.
        lambda: codec.tx_prepare_body(0, 0, 1, False, TX_OPS, TX_NAMES),
        lambda: codec.tx_prepare_body(7, 12, 12, False, TX_OPS, TX_NAMES),
        lambda: codec.tx_prepare_body(7, 0, 0, False, TX_OPS, TX_NAMES),
        lambda: codec.tx_prepare_body(7, 12, 13, False, TX_OPS, TX_NAMES),
        lambda: codec.tx_decision_body(7, 12, 12, TxDecision.COMMIT, TX_NAMES),
        lambda: codec.tx_decision_body(7, 12, 13, TxDecision.COMMIT, TX_NAMES),
        lambda: codec.tx_request_abort_body(0, 12, TX_NAMES),
        lambda: codec.tx_request_abort_body(7, 0, TX_NAMES),
        lambda: codec.tx_request_abort_body(7, 12, [TxOpName(1, 2, 0)]),
        # Participants exactly when not only validating; only reads when validating.
        lambda: codec.tx_prepare_body(7, 10, 12, False, TX_OPS, []),
        lambda: codec.tx_prepare_body(7, 10, 12, True, TX_OPS[1:], TX_NAMES),
        lambda: codec.tx_prepare_body(7, 10, 12, True, TX_OPS, []),
        # A value on a read or a remove.
        lambda: codec.tx_prepare_body(
            7, 10, 12, False, [TxOp(1, b"b", 13, TxOpKind.READ, 0, b"v")], TX_NAMES
        ),
        lambda: codec.tx_prepare_body(
            7, 10, 12, False, [TxOp(1, b"b", 13, TxOpKind.REMOVE, 0, b"v")], TX_NAMES
        ),
        lambda: codec.tx_prepare_body(7, 10, 12, False, [TX_OPS[0]] * 4097, TX_NAMES),
        lambda: codec.tx_decision_body(7, 10, 12, TxDecision.ABORT, TX_NAMES * 1366),
        lambda: codec.tx_prepare_body(7, 10, 12, False, [TxOp(1, b"b", 13, 4, 0)], TX_NAMES),
    ],
)
def test_transaction_requests_a_master_would_refuse_are_not_encoded(make):
    with pytest.raises(ValueError):
        make()


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
    remove = codec.remove_body(3, b"key", None)
    assert remove == struct.pack("<QH", 3, 3) + b"key" + struct.pack("<QBB", 0, 0, 0)
    increment = codec.increment_body(3, b"n", -5, RejectRules.only_if_exists())
    assert increment == struct.pack("<QH", 3, 1) + b"n" + struct.pack("<qQBB", -5, 0, 1, 0)
    multi_read = codec.multi_body(
        Opcode.MULTI_READ, [KeyItem(1, b"a"), KeyItem(2, b"bc", RejectRules(exists=True))]
    )
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


def test_tx_prepare_response_vector():
    header, body = split_response(vector_bytes("tx-prepare-response"))
    assert (header.opcode_code, header.request_id, header.status) == (60, 23, Status.OK)
    assert codec.decode_response_body(Opcode.TX_PREPARE, header.status, body) == [
        TxVoteResult(Status.OK, TxVote.PREPARED, 3),
        TxVoteResult(Status.RETRY, TxVote.ABORT, 0),
    ]


def test_tx_decision_response_vector():
    header, body = split_response(vector_bytes("tx-decision-response"))
    assert (header.opcode_code, header.request_id, header.status) == (61, 24, Status.OK)
    assert codec.decode_response_body(Opcode.TX_DECISION, header.status, body) == [
        Status.OK,
        Status.UNKNOWN_TABLET,
    ]


def test_tx_request_abort_response_vector():
    header, body = split_response(vector_bytes("tx-request-abort-response"))
    assert (header.opcode_code, header.request_id, header.status) == (62, 25, Status.OK)
    assert codec.decode_response_body(Opcode.TX_REQUEST_ABORT, header.status, body) == [
        TxVoteResult(Status.OK, TxVote.PREPARED, 3),
        TxVoteResult(Status.OK, TxVote.ABORT, 0),
    ]


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
    tables = struct.pack("<I", 1) + b"\x01\x00t" + struct.pack("<QIB", 3, 2, 1)
    assert decode(Opcode.LIST_TABLES, Status.OK, tables) == [TableEntry("t", 3, 2, Tier.FLASH)]
    servers = struct.pack("<IQH", 1, 2, 3) + b"a:1" + struct.pack("<IB", 0b11, 1) + b"\x02\x00r7"
    assert decode(Opcode.GET_SERVER_LIST, Status.OK, servers) == [
        ServerEntry(2, "a:1", 0b11, ServerStatus.CRASHED, "r7")
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
        (struct.pack("<IBBHQH", 14, 2, 0, 1, 1, 33), "unknown status code 33"),
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
            struct.pack("<IQH", 1, 2, 0) + struct.pack("<IBH", 0b1000, 0, 0),
            "service mask",
        ),
        (
            Opcode.GET_SERVER_LIST,
            Status.OK,
            struct.pack("<IQH", 1, 2, 0) + struct.pack("<IBH", 1, 4, 0),
            "unknown server status 4",
        ),
        (Opcode.ENUMERATE, Status.OK, struct.pack("<IB", 0, 2), "next-cursor option tag 2"),
        (Opcode.CLIENT_LEASE, Status.OK, struct.pack("<Q", 7), "truncated"),
        (Opcode.CLIENT_LEASE, Status.OK, struct.pack("<QIB", 7, 1, 0), "1 trailing bytes"),
        (Opcode.CHECK_CLIENT_LEASES, Status.OK, struct.pack("<I", 1025), "exceeds the maximum"),
        (Opcode.CHECK_CLIENT_LEASES, Status.OK, struct.pack("<II", 2, 1), "cannot fit"),
        (Opcode.ENUMERATE, Status.OK, struct.pack("<IBQB", 0, 1, 0, 5), "cursor after-key flag"),
        (
            Opcode.TX_PREPARE,
            Status.OK,
            struct.pack("<IHBQ", 1, 0, 3, 0),
            "unknown transaction vote",
        ),
        (
            Opcode.TX_PREPARE,
            Status.OK,
            struct.pack("<IHBQ", 1, 0, 0, 0),
            "unknown transaction vote",
        ),
        (Opcode.TX_REQUEST_ABORT, Status.OK, struct.pack("<I", 4097), "exceeds the maximum"),
        (Opcode.TX_REQUEST_ABORT, Status.OK, struct.pack("<I", 2) + bytes(11), "cannot fit"),
        (Opcode.TX_PREPARE, Status.OK, struct.pack("<IHBQB", 1, 0, 1, 0, 0), "trailing"),
        (Opcode.TX_DECISION, Status.OK, struct.pack("<IH", 1, 77), "unknown status code 77"),
        (Opcode.TX_DECISION, Status.OK, struct.pack("<IH", 2, 0), "cannot fit"),
        (
            Opcode.LIST_TABLES,
            Status.OK,
            struct.pack("<IH", 1, 300) + bytes(300 + 13),
            "exceeds 256",
        ),
        (
            Opcode.LIST_TABLES,
            Status.OK,
            struct.pack("<I", 1) + b"\x01\x00t" + struct.pack("<QIB", 3, 2, 3),
            "unknown storage tier code 3",
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
        "list-tables-response": Opcode.LIST_TABLES,
        "error-response-unknown-tablet": Opcode.READ,
        "client-lease-response": Opcode.CLIENT_LEASE,
        "check-client-leases-response": Opcode.CHECK_CLIENT_LEASES,
        "tx-prepare-response": Opcode.TX_PREPARE,
        "tx-decision-response": Opcode.TX_DECISION,
        "tx-request-abort-response": Opcode.TX_REQUEST_ABORT,
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
