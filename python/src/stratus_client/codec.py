"""Bytes on the wire: the handshake, frames, and the bodies of the RPCs a client sends.

This module is a transcription of docs/design/wire-protocol.md, the protocol's specification;
the names of constants, fields and opcodes are the specification's. It does no I/O, so every
encoder and decoder can be checked against the specification's test vectors
(``tests/test_codec.py``).

Decoders never trust a length or a count they receive: each is compared with the bytes actually
present before anything is sliced, every body must be consumed exactly, and any violation raises
``ProtocolError`` naming what was wrong. A decoder is the only thing between the network and the
caller, so it must refuse garbage rather than crash or return nonsense.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from .errors import InvalidKey, ProtocolError, RequestTooLarge
from .model import (
    ACCESS_ADMIN,
    ACCESS_READ,
    ACCESS_WRITE,
    REJECT_FLAGS_KNOWN,
    Identity,
    IdentityKind,
    TableGrant,
    UserSummary,
    SERVICES_KNOWN,
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
from .status import Status

MAGIC = b"STRA"
PROTOCOL_VERSION = 6
HELLO_BYTES = 8
LENGTH_FIELD_BYTES = 4
REQUEST_HEADER_BYTES = 16
RESPONSE_HEADER_BYTES = 18
FRAME_BYTES_MAX = 16 * 1024 * 1024
FRAME_KIND_REQUEST = 1
FRAME_KIND_RESPONSE = 2

KEY_BYTES_MAX = 65_535
TABLE_NAME_BYTES_MAX = 256
# Named users (limits.rs).
USERS_MAX = 1_024
GRANTS_PER_USER_MAX = 32
TABLE_PATTERN_BYTES_MAX = TABLE_NAME_BYTES_MAX
USER_NAME_BYTES_MAX = 64
_ACCESS_ALL = ACCESS_READ | ACCESS_WRITE | ACCESS_ADMIN
SERVER_ADDRESS_BYTES_MAX = 256
FAILURE_DOMAIN_BYTES_MAX = 64
ERROR_MESSAGE_BYTES_MAX = 1_024
MULTI_OP_ITEMS_MAX = 4_096
CLIENT_LEASES_PER_CHECK_MAX = 1_024
SERVER_SPAN_MAX = 1_024
TABLES_MAX = 65_536
SERVERS_MAX = 16_384
TABLETS_MAX = TABLES_MAX * SERVER_SPAN_MAX
ENUMERATE_RESPONSE_BYTES_MAX = 4 * 1024 * 1024
# Transactions (docs/design/transactions.md): objects of one transaction at most (each takes an
# rpc id of the lease until decided), bytes of keys and buffered values at most, and the bytes of
# ops one TX_PREPARE (or a commit's multi-read) carries at most before it is split.
TRANSACTION_OBJECTS_MAX = 4_096
TRANSACTION_BYTES_MAX = 64 * 1024 * 1024
TRANSACTION_REQUEST_BYTES_MAX = 8 * 1024 * 1024
# An enumerated object takes at least 14 bytes (empty key and value), so no more fit a frame.
ENUMERATED_OBJECTS_MAX = FRAME_BYTES_MAX // (2 + 4 + 8)

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_REQUEST_HEADER = struct.Struct("<IBBHQ")
_RESPONSE_HEADER = struct.Struct("<IBBHQH")
_HELLO = struct.Struct("<4sHH")

_U64_MAX = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


class Opcode(enum.IntEnum):
    """Request types (wire-protocol.md, "Opcodes"); a ``u16`` on the wire."""

    PING = 1
    ENLIST_SERVER = 10
    GET_SERVER_LIST = 11
    CREATE_TABLE = 12
    DROP_TABLE = 13
    GET_TABLE_ID = 14
    LIST_TABLES = 15
    GET_TABLET_MAP = 16
    RENEW_LEASE = 17
    SET_LOG_HEAD = 18
    HINT_SERVER_CRASHED = 19
    RECOVERY_ACCEPT_LOSS = 20
    SPLIT_TABLET = 21
    MIGRATE_TABLET = 22
    SERVER_STOPPING = 23
    CLIENT_LEASE = 24
    CHECK_CLIENT_LEASES = 25
    SET_USER = 26
    DELETE_USER = 27
    LIST_USERS = 28
    WHO_AM_I = 29
    READ = 30
    WRITE = 31
    REMOVE = 32
    INCREMENT = 33
    MULTI_READ = 34
    MULTI_WRITE = 35
    MULTI_REMOVE = 36
    MULTI_INCREMENT = 37
    ENUMERATE = 38
    SET_EXPIRY = 39
    TAKE_TABLET_OWNERSHIP = 40
    DROP_TABLET_OWNERSHIP = 41
    GET_SERVER_STATISTICS = 42
    RECOVER_TABLETS = 43
    TRANSFER_TABLET = 44
    RECEIVE_MIGRATION_DATA = 45
    REPLICAS_NEEDED = 46
    ABANDON_MIGRATION = 47
    TX_PREPARE = 60
    TX_DECISION = 61
    TX_REQUEST_ABORT = 62
    BACKUP_WRITE = 50
    BACKUP_FREE = 51
    BACKUP_LIST_REPLICAS = 52
    BACKUP_READ_REPLICA = 53
    BACKUP_GET_STATISTICS = 54
    BACKUP_FENCE_MASTER = 55
    BACKUP_GET_RECOVERY_DATA = 56
    BACKUP_START_PARTITIONING = 57


class RpcIdentity(NamedTuple):
    """A mutation's exactly-once identity (wire-protocol.md, "rpc identity";
    docs/design/exactly-once.md): its client lease, its rpc id within the lease, and the
    highest rpc id of the lease at or below which the client has the result of every rpc.
    Every attempt of one mutation carries the same lease and rpc id."""

    lease: int
    rpc: int
    acknowledged: int


class TxOpKind(enum.IntEnum):
    """What a transaction does to one object (a TX_PREPARE op's kind); a ``u8`` on the wire."""

    READ = 1
    WRITE = 2
    REMOVE = 3


class TxVote(enum.IntEnum):
    """A participant's vote on one op (TX_PREPARE, TX_REQUEST_ABORT); a ``u8`` on the wire."""

    PREPARED = 1
    ABORT = 2


class TxDecision(enum.IntEnum):
    """A transaction's decision (TX_DECISION); a ``u8`` on the wire."""

    COMMIT = 1
    ABORT = 2


class TxOp(NamedTuple):
    """One op of a TX_PREPARE: the object, the op's rpc id under the transaction's lease, what
    it does, the version the transaction observed (0: absent), and a write's value (empty for
    the other kinds)."""

    table_id: int
    key: bytes
    rpc: int
    kind: TxOpKind
    version_read: int
    value: bytes = b""


class TxOpName(NamedTuple):
    """One op of a transaction named without its key (24 bytes on the wire): a participant of
    TX_PREPARE, and an op of TX_DECISION and TX_REQUEST_ABORT."""

    table_id: int
    key_hash: int
    rpc: int


class TxVoteResult(NamedTuple):
    """One op's answer to TX_PREPARE or TX_REQUEST_ABORT: status OK when ``vote`` is the op's
    vote; any other status means it was not voted on (its ``vote`` is then meaningless).
    ``version`` is for information (0 when unknown)."""

    status: Status
    vote: TxVote
    version: int


class ClientLeaseGrant(NamedTuple):
    """The coordinator's answer to CLIENT_LEASE: the lease opened or renewed, and how long
    it is valid from when the coordinator received the request."""

    lease: int
    term_ms: int


# ---------------------------------------------------------------------------------------------
# Handshake and frame envelopes.


def encode_hello(version: int = PROTOCOL_VERSION, status: Status = Status.OK) -> bytes:
    """The 8 handshake bytes: magic, protocol version, status."""
    return _HELLO.pack(MAGIC, version, int(status))


def decode_hello(hello: bytes) -> tuple[int, Status]:
    """The (version, status) of a handshake; refuses a wrong size, magic or status code."""
    if len(hello) != HELLO_BYTES:
        raise ProtocolError(f"handshake of {len(hello)} bytes instead of {HELLO_BYTES}")
    magic, version, status_code = _HELLO.unpack(hello)
    if magic != MAGIC:
        raise ProtocolError(f"handshake starts with {magic!r}, not the magic {MAGIC!r}")
    status = Status.from_code(status_code)
    if status is None:
        raise ProtocolError(f"handshake carries unknown status code {status_code}")
    return version, status


def encode_request(opcode: Opcode, request_id: int, body: bytes = b"") -> bytes:
    """A whole request frame. Refuses (``RequestTooLarge``) a frame over ``FRAME_BYTES_MAX``
    rather than send it: the server would answer REQUEST_TOO_LARGE and close the connection."""
    total = REQUEST_HEADER_BYTES + len(body)
    if total > FRAME_BYTES_MAX:
        raise RequestTooLarge(
            f"request frame of {total} bytes exceeds the maximum of {FRAME_BYTES_MAX} bytes"
        )
    if not 0 <= request_id <= _U64_MAX:
        raise ValueError(f"request id {request_id} is not a u64")
    header = _REQUEST_HEADER.pack(
        total - LENGTH_FIELD_BYTES, FRAME_KIND_REQUEST, 0, int(opcode), request_id
    )
    return header + body


def frame_total_bytes(length_field: bytes) -> int:
    """The size of a received frame, length field included, from its 4-byte length field.

    Refuses, before anything more is read, a frame over ``FRAME_BYTES_MAX`` (so a lying length
    cannot make the client buffer gigabytes) or one too short to hold a response header.
    """
    if len(length_field) != LENGTH_FIELD_BYTES:
        raise ProtocolError(f"frame length field of {len(length_field)} bytes")
    (after_length,) = _U32.unpack(length_field)
    total = after_length + LENGTH_FIELD_BYTES
    if total > FRAME_BYTES_MAX:
        raise ProtocolError(
            f"frame of {total} bytes exceeds the maximum of {FRAME_BYTES_MAX} bytes"
        )
    if total < RESPONSE_HEADER_BYTES:
        raise ProtocolError(f"frame of {total} bytes is shorter than a response header")
    return total


class ResponseHeader(NamedTuple):
    """A validated response frame header."""

    total_bytes: int
    opcode_code: int
    request_id: int
    status: Status


def decode_response_header(frame: bytes) -> ResponseHeader:
    """Validates the header of a whole received frame (length field included).

    A request frame from a server, a non-zero flags byte, an unknown status code or a length
    field that disagrees with the bytes are framing errors: the connection cannot be trusted
    after one, so the caller closes it.
    """
    if len(frame) < RESPONSE_HEADER_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than a response header")
    after_length, kind, flags, opcode_code, request_id, status_code = _RESPONSE_HEADER.unpack_from(
        frame
    )
    if after_length + LENGTH_FIELD_BYTES != len(frame):
        raise ProtocolError(
            f"frame length field says {after_length + LENGTH_FIELD_BYTES} bytes, "
            f"frame has {len(frame)}"
        )
    if kind == FRAME_KIND_REQUEST:
        raise ProtocolError("server sent a request frame")
    if kind != FRAME_KIND_RESPONSE:
        raise ProtocolError(f"unknown frame kind {kind}")
    if flags != 0:
        raise ProtocolError(f"non-zero frame flags {flags:#04x}")
    status = Status.from_code(status_code)
    if status is None:
        raise ProtocolError(f"unknown status code {status_code}")
    return ResponseHeader(len(frame), opcode_code, request_id, status)


# ---------------------------------------------------------------------------------------------
# Request bodies.


class BodyWriter:
    """Appends fields to a request body in the specification's encodings."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def to_bytes(self) -> bytes:
        return b"".join(self._parts)

    def u8(self, value: int) -> BodyWriter:
        self._parts.append(bytes((value,)))
        return self

    def u16(self, value: int) -> BodyWriter:
        self._parts.append(_U16.pack(value))
        return self

    def u32(self, value: int) -> BodyWriter:
        self._parts.append(_U32.pack(value))
        return self

    def u64(self, value: int) -> BodyWriter:
        if not 0 <= value <= _U64_MAX:
            raise ValueError(f"{value} does not fit an unsigned 64-bit field")
        self._parts.append(_U64.pack(value))
        return self

    def i64(self, value: int) -> BodyWriter:
        if not _I64_MIN <= value <= _I64_MAX:
            raise ValueError(f"{value} does not fit a signed 64-bit field")
        self._parts.append(_I64.pack(value))
        return self

    def string(self, text: str, bytes_max: int) -> BodyWriter:
        """u16 length + UTF-8; longer than ``bytes_max`` is the caller's bug, refused here."""
        encoded = text.encode("utf-8")
        if len(encoded) > bytes_max:
            raise ValueError(f"string of {len(encoded)} bytes exceeds {bytes_max}")
        self._parts.append(_U16.pack(len(encoded)))
        self._parts.append(encoded)
        return self

    def key(self, key: bytes) -> BodyWriter:
        """u16 length + bytes. The specification's encoder sends an over-long key as the empty
        key; this one refuses it outright, so no request can name a different key."""
        if len(key) > KEY_BYTES_MAX:
            raise InvalidKey(f"key of {len(key)} bytes")
        self._parts.append(_U16.pack(len(key)))
        self._parts.append(key)
        return self

    def value(self, value: bytes) -> BodyWriter:
        """u32 length + bytes (the frame limit refuses a value long before the u32 does)."""
        if len(value) > FRAME_BYTES_MAX:
            raise RequestTooLarge(f"value of {len(value)} bytes cannot fit in a frame")
        self._parts.append(_U32.pack(len(value)))
        self._parts.append(value)
        return self

    def expiry(self, expiry: Expiry | None) -> BodyWriter:
        expiry = expiry or Expiry.NEVER
        if expiry.kind not in (Expiry.NEVER_KIND, Expiry.KEEP_KIND, Expiry.AFTER_KIND, Expiry.AT_KIND):
            raise ValueError(f"not an expiry kind: {expiry.kind}")
        millis = expiry.millis if expiry.kind in (Expiry.AFTER_KIND, Expiry.AT_KIND) else 0
        return self.u8(expiry.kind).u64(millis)

    def rules(self, rules: RejectRules | None) -> BodyWriter:
        rules = rules or RejectRules()
        return self.u64(rules.given_version).u8(rules.flags)

    def hash_range(self, hash_range: HashRange) -> BodyWriter:
        return self.u64(hash_range.start).u64(hash_range.end)

    def cursor(self, cursor: EnumerationCursor) -> BodyWriter:
        self.u64(cursor.reversed_hash)
        if cursor.after_key is None:
            return self.u8(0)
        return self.u8(1).key(cursor.after_key)

    def count(self, count: int) -> BodyWriter:
        return self.u32(count)

    def rpc_identity(self, identity: RpcIdentity | None) -> BodyWriter:
        """Option of (lease, rpc id, acknowledged); tag 0 when the mutation has none. An
        identity a server would refuse as malformed (lease 0, rpc id 0, or acknowledged not
        below the rpc id) is the caller's bug, refused here."""
        if identity is None:
            return self.u8(0)
        lease, rpc, acknowledged = identity
        if lease == 0 or rpc == 0 or not 0 <= acknowledged < rpc:
            raise ValueError(f"not a valid rpc identity: {identity!r}")
        return self.u8(1).u64(lease).u64(rpc).u64(acknowledged)


def create_table_body(name: str, server_span: int, tier: Tier = Tier.MEMORY) -> bytes:
    writer = BodyWriter().string(name, TABLE_NAME_BYTES_MAX).u32(server_span)
    return writer.u8(int(tier)).to_bytes()


def table_name_body(name: str) -> bytes:
    """The body of DROP_TABLE and GET_TABLE_ID: the table's name."""
    return BodyWriter().string(name, TABLE_NAME_BYTES_MAX).to_bytes()


def _put_grants(writer: BodyWriter, grants: tuple[TableGrant, ...] | list[TableGrant]) -> None:
    writer.u32(len(grants))
    for grant in grants:
        writer.string(grant.pattern, TABLE_PATTERN_BYTES_MAX).u8(grant.access)


def set_user_body(
    name: str,
    enabled: bool,
    credentials: tuple[bytes, bytes, bytes] | None,
    grants: tuple[TableGrant, ...] | list[TableGrant],
) -> bytes:
    """The body of SET_USER: a user record (u16 name length + name; u8 flags, bit 0 enabled,
    bit 1 credentials follow; the 16-byte salt, 32-byte stored key and 32-byte server key;
    u32 grant count, each grant u16 pattern length + pattern + u8 access bits)."""
    writer = BodyWriter().string(name, USER_NAME_BYTES_MAX)
    writer.u8((1 if enabled else 0) | (2 if credentials is not None else 0))
    if credentials is not None:
        salt, stored_key, server_key = credentials
        if (len(salt), len(stored_key), len(server_key)) != (16, 32, 32):
            raise ValueError("credentials are a 16-byte salt and two 32-byte keys")
        writer._parts.extend([salt, stored_key, server_key])
    _put_grants(writer, grants)
    return writer.to_bytes()


def user_name_body(name: str) -> bytes:
    """The body of DELETE_USER: the user's name."""
    return BodyWriter().string(name, USER_NAME_BYTES_MAX).to_bytes()


def _grant(reader: BodyReader) -> TableGrant:
    pattern = reader.string(TABLE_PATTERN_BYTES_MAX, "table pattern")
    access = reader.u8()
    if access & ~_ACCESS_ALL or access == 0:
        raise reader.fail(f"grant access bits {access:#04x}")
    return TableGrant(pattern, access)


def _grants(reader: BodyReader) -> tuple[TableGrant, ...]:
    return tuple(reader.list(GRANTS_PER_USER_MAX, 2 + 1, _grant))


def _user_summary(reader: BodyReader) -> UserSummary:
    name = reader.string(USER_NAME_BYTES_MAX, "user name")
    flags = reader.u8()
    if flags & ~0b11:
        raise reader.fail(f"user flags {flags:#04x}")
    return UserSummary(name, bool(flags & 1), bool(flags & 2), _grants(reader))


def _identity(reader: BodyReader) -> Identity:
    code = reader.u8()
    try:
        kind = IdentityKind(code)
    except ValueError:
        raise reader.fail(f"identity kind {code}") from None
    if kind is not IdentityKind.USER:
        return Identity(kind)
    name = reader.string(USER_NAME_BYTES_MAX, "user name")
    return Identity(kind, name, _grants(reader))


def _flag(reader: BodyReader) -> bool:
    value = reader.u8()
    if value > 1:
        raise reader.fail(f"boolean {value}")
    return value == 1


def table_id_body(table_id: int) -> bytes:
    """The body of GET_TABLET_MAP: a table id (0 means every table)."""
    return BodyWriter().u64(table_id).to_bytes()


def read_body(table_id: int, key: bytes, rules: RejectRules | None) -> bytes:
    """The body of READ: table id, key, rules."""
    return BodyWriter().u64(table_id).key(key).rules(rules).to_bytes()


def remove_body(
    table_id: int, key: bytes, rules: RejectRules | None, rpc: RpcIdentity | None = None
) -> bytes:
    """The body of REMOVE: table id, key, rules (as READ), then the rpc identity."""
    return BodyWriter().u64(table_id).key(key).rules(rules).rpc_identity(rpc).to_bytes()


def write_body(
    table_id: int,
    key: bytes,
    value: bytes,
    rules: RejectRules | None,
    expiry: Expiry | None = None,
    rpc: RpcIdentity | None = None,
) -> bytes:
    return (
        BodyWriter()
        .u64(table_id)
        .key(key)
        .value(value)
        .rules(rules)
        .expiry(expiry)
        .rpc_identity(rpc)
        .to_bytes()
    )


def set_expiry_body(
    table_id: int,
    key: bytes,
    expiry: Expiry,
    rules: RejectRules | None,
    rpc: RpcIdentity | None = None,
) -> bytes:
    return (
        BodyWriter().u64(table_id).key(key).expiry(expiry).rules(rules).rpc_identity(rpc).to_bytes()
    )


def increment_body(
    table_id: int,
    key: bytes,
    delta: int,
    rules: RejectRules | None,
    rpc: RpcIdentity | None = None,
) -> bytes:
    return BodyWriter().u64(table_id).key(key).i64(delta).rules(rules).rpc_identity(rpc).to_bytes()


# The item type of each multi-operation (MULTI_REMOVE's items are key items, as MULTI_READ's,
# but with an rpc identity).
_MULTI_ITEM_TYPES = {
    Opcode.MULTI_READ: KeyItem,
    Opcode.MULTI_WRITE: WriteItem,
    Opcode.MULTI_REMOVE: KeyItem,
    Opcode.MULTI_INCREMENT: IncrementItem,
}


def multi_body(
    opcode: Opcode, items: list, identities: list[RpcIdentity | None] | None = None
) -> bytes:
    """The body of MULTI_READ, MULTI_WRITE, MULTI_REMOVE or MULTI_INCREMENT.

    Items' keys and values must already be ``bytes`` (the client normalises them). The items
    of the mutations end with an rpc identity each: ``identities[i]`` for item ``i`` (None, or
    no list at all: the item has none). MULTI_READ items carry none.
    """
    item_type = _MULTI_ITEM_TYPES.get(opcode)
    if item_type is None:
        raise ValueError(f"{opcode!r} is not a multi-operation")
    if len(items) > MULTI_OP_ITEMS_MAX:
        raise ValueError(f"{len(items)} items exceed the maximum of {MULTI_OP_ITEMS_MAX}")
    mutation = opcode is not Opcode.MULTI_READ
    if identities is not None and (not mutation or len(identities) != len(items)):
        raise ValueError(f"{opcode.name} of {len(items)} items given {len(identities)} identities")
    writer = BodyWriter().count(len(items))
    for index, item in enumerate(items):
        if not isinstance(item, item_type):
            raise TypeError(f"not a {opcode.name} item: {item!r}")
        writer.u64(item.table_id).key(item.key)
        if isinstance(item, WriteItem):
            writer.value(item.value)
        elif isinstance(item, IncrementItem):
            writer.i64(item.delta)
        writer.rules(item.reject_rules)
        if isinstance(item, WriteItem):
            writer.expiry(item.expiry)
        if mutation:
            writer.rpc_identity(None if identities is None else identities[index])
    return writer.to_bytes()


def client_lease_body(lease: int) -> bytes:
    """The body of CLIENT_LEASE: the lease to renew, or 0 to open a new one."""
    return BodyWriter().u64(lease).to_bytes()


def check_client_leases_body(leases: list[int]) -> bytes:
    """The body of CHECK_CLIENT_LEASES (a master's request; here for the test vectors)."""
    if len(leases) > CLIENT_LEASES_PER_CHECK_MAX:
        raise ValueError(
            f"{len(leases)} leases exceed the maximum of {CLIENT_LEASES_PER_CHECK_MAX}"
        )
    writer = BodyWriter().count(len(leases))
    for lease in leases:
        writer.u64(lease)
    return writer.to_bytes()


def enumerate_body(
    table_id: int, hash_range: HashRange, cursor: EnumerationCursor, bytes_max: int
) -> bytes:
    return (
        BodyWriter().u64(table_id).hash_range(hash_range).cursor(cursor).u32(bytes_max).to_bytes()
    )


def _check_transaction(lease: int, acknowledged: int, transaction: int) -> None:
    """A transaction's identity as TX_PREPARE and TX_DECISION carry it; one a master would
    refuse as malformed (lease 0, transaction 0 or at or below acknowledged) is the caller's
    bug, refused here."""
    if lease == 0 or transaction == 0 or not 0 <= acknowledged < transaction:
        raise ValueError(
            f"not a valid transaction identity: lease {lease}, acknowledged {acknowledged}, "
            f"transaction {transaction}"
        )


def _put_tx_op_names(
    writer: BodyWriter, names: list[TxOpName], count_max: int, acknowledged: int
) -> None:
    """A list of tx op names: table id, key hash, rpc id (u64 each); every rpc id above
    ``acknowledged`` (so never 0)."""
    if len(names) > count_max:
        raise ValueError(f"{len(names)} transaction ops exceed the maximum of {count_max}")
    writer.count(len(names))
    for name in names:
        if not name.rpc > acknowledged:
            raise ValueError(f"transaction op {name!r}: its rpc id is not above {acknowledged}")
        writer.u64(name.table_id).u64(name.key_hash).u64(name.rpc)


def tx_prepare_body(
    lease: int,
    acknowledged: int,
    transaction: int,
    validate_only: bool,
    ops: list[TxOp],
    participants: list[TxOpName],
) -> bytes:
    """The body of TX_PREPARE: the transaction's identity, the validate-only flag, the ops for
    this master, then every op of the transaction (empty for a validation, and only then)."""
    _check_transaction(lease, acknowledged, transaction)
    if len(ops) > MULTI_OP_ITEMS_MAX:
        raise ValueError(f"{len(ops)} ops exceed the maximum of {MULTI_OP_ITEMS_MAX}")
    if validate_only == bool(participants):
        raise ValueError("a TX_PREPARE lists participants unless it only validates")
    writer = BodyWriter().u64(lease).u64(acknowledged).u64(transaction)
    writer.u8(1 if validate_only else 0).count(len(ops))
    for op in ops:
        kind = TxOpKind(op.kind)
        if not op.rpc > acknowledged:
            raise ValueError(f"transaction op rpc id {op.rpc} is not above {acknowledged}")
        if validate_only and kind is not TxOpKind.READ:
            raise ValueError(f"a validate-only TX_PREPARE carries only reads, not {kind.name}")
        if kind is not TxOpKind.WRITE and op.value:
            raise ValueError(f"a {kind.name} op carries no value")
        writer.u64(op.table_id).key(op.key).u64(op.rpc).u8(kind).u64(op.version_read)
        writer.value(op.value)
    _put_tx_op_names(writer, participants, TRANSACTION_OBJECTS_MAX, acknowledged)
    return writer.to_bytes()


def tx_decision_body(
    lease: int, acknowledged: int, transaction: int, decision: TxDecision, ops: list[TxOpName]
) -> bytes:
    """The body of TX_DECISION: the transaction's identity, the decision, the ops it is for."""
    _check_transaction(lease, acknowledged, transaction)
    writer = BodyWriter().u64(lease).u64(acknowledged).u64(transaction).u8(TxDecision(decision))
    _put_tx_op_names(writer, ops, MULTI_OP_ITEMS_MAX, acknowledged)
    return writer.to_bytes()


def tx_request_abort_body(lease: int, transaction: int, ops: list[TxOpName]) -> bytes:
    """The body of TX_REQUEST_ABORT: lease, transaction, the ops whose votes to make final (no
    acknowledged mark)."""
    if lease == 0 or transaction == 0:
        raise ValueError(f"not a valid transaction: lease {lease}, transaction {transaction}")
    writer = BodyWriter().u64(lease).u64(transaction)
    _put_tx_op_names(writer, ops, MULTI_OP_ITEMS_MAX, 0)
    return writer.to_bytes()


# ---------------------------------------------------------------------------------------------
# Response bodies.

_Item = TypeVar("_Item")


class BodyReader:
    """A bounds-checked reader over a received body; every failure is a ``ProtocolError``."""

    def __init__(self, body: bytes, what: str) -> None:
        self._body = memoryview(body)
        self._position = 0
        self._what = what

    def fail(self, problem: str) -> ProtocolError:
        return ProtocolError(f"bad {self._what}: {problem} at byte {self._position} of the body")

    @property
    def remaining(self) -> int:
        return len(self._body) - self._position

    def take(self, length: int) -> bytes:
        if length > self.remaining:
            raise self.fail(f"truncated: {length} bytes announced, {self.remaining} present")
        start = self._position
        self._position += length
        return bytes(self._body[start : self._position])

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return _U16.unpack(self.take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def string(self, bytes_max: int, field: str) -> str:
        raw = self.take(self.u16())
        if len(raw) > bytes_max:
            raise self.fail(f"{field} of {len(raw)} bytes exceeds {bytes_max}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(f"{field} is not UTF-8 ({error.reason})") from None

    def key(self) -> bytes:
        return self.take(self.u16())

    def value(self) -> bytes:
        return self.take(self.u32())

    def status(self) -> Status:
        code = self.u16()
        status = Status.from_code(code)
        if status is None:
            raise self.fail(f"unknown status code {code}")
        return status

    def hash_range(self) -> HashRange:
        start, end = self.u64(), self.u64()
        if start > end:
            raise self.fail(f"hash range start {start:#x} after its end {end:#x}")
        return HashRange(start, end)

    def rules(self) -> RejectRules:
        given_version, flags = self.u64(), self.u8()
        if flags & ~REJECT_FLAGS_KNOWN:
            raise self.fail(f"reject rule flags {flags:#04x} have undefined bits")
        return RejectRules.from_wire(given_version, flags)

    def cursor(self) -> EnumerationCursor:
        reversed_hash = self.u64()
        flag = self.u8()
        if flag == 0:
            return EnumerationCursor(reversed_hash, None)
        if flag == 1:
            return EnumerationCursor(reversed_hash, self.key())
        raise self.fail(f"cursor after-key flag {flag}")

    def tablet_state(self) -> TabletState:
        code = self.u8()
        try:
            return TabletState(code)
        except ValueError:
            raise self.fail(f"unknown tablet state {code}") from None

    def tier(self) -> Tier:
        code = self.u8()
        try:
            return Tier(code)
        except ValueError:
            raise self.fail(f"unknown storage tier code {code}") from None

    def server_status(self) -> ServerStatus:
        code = self.u8()
        try:
            return ServerStatus(code)
        except ValueError:
            raise self.fail(f"unknown server status {code}") from None

    def services(self) -> int:
        mask = self.u32()
        if mask & ~SERVICES_KNOWN:
            raise self.fail(f"service mask {mask:#x} has undefined bits")
        return mask

    def list(
        self, count_max: int, item_bytes_min: int, read_item: Callable[[BodyReader], _Item]
    ) -> list[_Item]:
        """A u32 count, then that many items. A count over ``count_max``, or one the remaining
        bytes cannot hold at ``item_bytes_min`` each, is refused before any item is read."""
        count = self.u32()
        if count > count_max:
            raise self.fail(f"list of {count} items exceeds the maximum of {count_max}")
        if count * item_bytes_min > self.remaining:
            raise self.fail(f"list of {count} items cannot fit in {self.remaining} bytes")
        return [read_item(self) for _ in range(count)]

    def finish(self) -> None:
        if self.remaining:
            raise self.fail(f"{self.remaining} trailing bytes")


def decode_error_body(body: bytes, what: str) -> str:
    """The message of an error body (every status that carries no operation body)."""
    reader = BodyReader(body, what)
    message = reader.string(ERROR_MESSAGE_BYTES_MAX, "error message")
    reader.finish()
    return message


class MultiItemResult(NamedTuple):
    """One item's outcome in a multi-operation response (unused fields are empty or zero)."""

    status: Status
    version: int
    value: bytes = b""
    integer: int = 0


class EnumerateResponse(NamedTuple):
    objects: list[EnumeratedObject]
    next_cursor: EnumerationCursor | None


def _table_entry(reader: BodyReader) -> TableEntry:
    return TableEntry(
        name=reader.string(TABLE_NAME_BYTES_MAX, "table name"),
        table_id=reader.u64(),
        tablet_count=reader.u32(),
        tier=reader.tier(),
    )


def _server_entry(reader: BodyReader) -> ServerEntry:
    return ServerEntry(
        server_id=reader.u64(),
        address=reader.string(SERVER_ADDRESS_BYTES_MAX, "server address"),
        services=reader.services(),
        status=reader.server_status(),
        failure_domain=reader.string(FAILURE_DOMAIN_BYTES_MAX, "failure domain"),
    )


def _tablet_entry(reader: BodyReader) -> TabletEntry:
    return TabletEntry(
        table_id=reader.u64(),
        range=reader.hash_range(),
        owner_server_id=reader.u64(),
        owner_address=reader.string(SERVER_ADDRESS_BYTES_MAX, "server address"),
        state=reader.tablet_state(),
    )


def _read_result(reader: BodyReader) -> MultiItemResult:
    return MultiItemResult(reader.status(), reader.u64(), value=reader.value())


def _version_result(reader: BodyReader) -> MultiItemResult:
    return MultiItemResult(reader.status(), reader.u64())


def _increment_result(reader: BodyReader) -> MultiItemResult:
    return MultiItemResult(reader.status(), reader.u64(), integer=reader.i64())


def _tx_vote(reader: BodyReader) -> TxVoteResult:
    status = reader.status()
    code = reader.u8()
    try:
        vote = TxVote(code)
    except ValueError:
        raise reader.fail(f"unknown transaction vote {code}") from None
    return TxVoteResult(status, vote, reader.u64())


def _enumerated_object(reader: BodyReader) -> EnumeratedObject:
    key, value, version = reader.key(), reader.value(), reader.u64()
    # The object's expiry time (read_object tells it for one key; an enumeration does not).
    tag = reader.u8()
    if tag == 1:
        reader.u64()
    elif tag != 0:
        raise reader.fail(f"expiry time option tag {tag}")
    return EnumeratedObject(key=key, value=value, version=version)


def _decode_enumerate(reader: BodyReader) -> EnumerateResponse:
    objects = reader.list(ENUMERATED_OBJECTS_MAX, 2 + 4 + 8 + 1, _enumerated_object)
    flag = reader.u8()
    if flag == 0:
        return EnumerateResponse(objects, None)
    if flag == 1:
        return EnumerateResponse(objects, reader.cursor())
    raise reader.fail(f"next-cursor option tag {flag}")


# Per opcode: how to read its operation body. Empty bodies read nothing.
_OPERATION_BODY_DECODERS: dict[Opcode, Callable[[BodyReader], object]] = {
    Opcode.PING: lambda reader: None,
    Opcode.GET_SERVER_LIST: lambda reader: reader.list(SERVERS_MAX, 8 + 2 + 4 + 1 + 2, _server_entry),
    Opcode.CREATE_TABLE: lambda reader: reader.u64(),
    Opcode.DROP_TABLE: lambda reader: None,
    Opcode.GET_TABLE_ID: lambda reader: reader.u64(),
    Opcode.LIST_TABLES: lambda reader: reader.list(TABLES_MAX, 2 + 8 + 4 + 1, _table_entry),
    Opcode.GET_TABLET_MAP: lambda reader: reader.list(
        TABLETS_MAX, 8 + 16 + 8 + 2 + 1, _tablet_entry
    ),
    # (version, value)
    # (version, value, expires in milliseconds; 0: no expiry)
    Opcode.READ: lambda reader: (reader.u64(), reader.value(), reader.u64()),
    Opcode.WRITE: lambda reader: reader.u64(),
    Opcode.SET_EXPIRY: lambda reader: reader.u64(),
    Opcode.REMOVE: lambda reader: reader.u64(),
    # (version, value after the increment)
    Opcode.INCREMENT: lambda reader: (reader.u64(), reader.i64()),
    Opcode.MULTI_READ: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2 + 8 + 4, _read_result),
    Opcode.MULTI_WRITE: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2 + 8, _version_result),
    Opcode.MULTI_REMOVE: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2 + 8, _version_result),
    Opcode.MULTI_INCREMENT: lambda reader: reader.list(
        MULTI_OP_ITEMS_MAX, 2 + 8 + 8, _increment_result
    ),
    Opcode.ENUMERATE: _decode_enumerate,
    # Per op, in the request's order: its status, vote and version.
    Opcode.TX_PREPARE: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2 + 1 + 8, _tx_vote),
    Opcode.TX_REQUEST_ABORT: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2 + 1 + 8, _tx_vote),
    # Per op, in the request's order: OK once the decision is applied.
    Opcode.TX_DECISION: lambda reader: reader.list(MULTI_OP_ITEMS_MAX, 2, BodyReader.status),
    Opcode.CLIENT_LEASE: lambda reader: ClientLeaseGrant(reader.u64(), reader.u32()),
    # Milliseconds each lease stays valid (0: expired), in the request's order.
    Opcode.CHECK_CLIENT_LEASES: lambda reader: reader.list(
        CLIENT_LEASES_PER_CHECK_MAX, 4, BodyReader.u32
    ),
    # True if the user was created (SET_USER), existed (DELETE_USER).
    Opcode.SET_USER: _flag,
    Opcode.DELETE_USER: _flag,
    Opcode.LIST_USERS: lambda reader: reader.list(USERS_MAX, 2 + 1 + 4, _user_summary),
    Opcode.WHO_AM_I: _identity,
}


class ErrorBody(NamedTuple):
    """The body of a response whose status carries no operation body."""

    message: str


def decode_response_body(opcode: Opcode, status: Status, body: bytes) -> object:
    """The decoded body of a response to ``opcode`` answered with ``status``.

    Statuses that carry the operation body (OK and the three object outcomes) give the
    operation's decoded value; every other status gives an ``ErrorBody``.
    """
    what = f"{opcode.name} response ({status.name})"
    if not status.carries_operation_body:
        return ErrorBody(decode_error_body(body, what))
    decoder = _OPERATION_BODY_DECODERS.get(opcode)
    if decoder is None:
        raise ValueError(f"this client does not decode {opcode.name} responses")
    reader = BodyReader(body, what)
    decoded = decoder(reader)
    reader.finish()
    return decoded
