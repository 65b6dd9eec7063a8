"""A scripted stand-in for a Stratus server, to drive the client through situations a healthy
cluster does not produce on demand: stale tablet maps, RETRY, silence, garbage.

The server listens on loopback, answers the handshake (or sends what it is told to instead),
then reads request frames and answers each with whatever its ``respond`` function returns.
Every blocking call has a timeout, and ``close`` stops every thread, so a test that goes wrong
fails instead of hanging. ``ScriptedCoordinator`` answers GET_TABLET_MAP from a script and
CLIENT_LEASE (exactly-once leases) with a ``LeaseGranter`` or a function of the test's;
``rpc_identity`` and ``multi_identities`` read the exactly-once identities a client sent;
``tx_prepare_request``, ``tx_decision_request`` and ``tx_request_abort_request`` read the
transaction requests, and ``tx_votes_body`` and ``tx_results_body`` make their answers.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

HELLO_OK = b"STRA\x06\x00\x00\x00"

READ, WRITE, REMOVE, INCREMENT = 30, 31, 32, 33
MULTI_READ, MULTI_WRITE, MULTI_REMOVE, MULTI_INCREMENT = 34, 35, 36, 37
SET_EXPIRY = 39
TX_PREPARE, TX_DECISION, TX_REQUEST_ABORT = 60, 61, 62
CLIENT_LEASE = 24
GET_TABLET_MAP = 16
UNIMPLEMENTED_REQUEST = 8
# The coordinator's lease term (CLIENT_LEASE_TERM).
LEASE_TERM_MS = 30_000


class Close:
    """Returned by ``respond``: close the connection without answering."""


class Silence:
    """Returned by ``respond``: never answer this request (the client must time out)."""


@dataclass(frozen=True)
class Request:
    opcode: int
    request_id: int
    body: bytes


Respond = Callable[[Request], "bytes | type[Close] | type[Silence]"]


def response_frame(request: Request, status: int, body: bytes = b"") -> bytes:
    """A response frame answering ``request``."""
    return (
        struct.pack("<IBBHQH", 14 + len(body), 2, 0, request.opcode, request.request_id, status)
        + body
    )


def error_frame(request: Request, status: int, message: str = "") -> bytes:
    encoded = message.encode("utf-8")
    return response_frame(request, status, struct.pack("<H", len(encoded)) + encoded)


def tablet_map_body(tablets: list[tuple[int, int, int, int, str, int]]) -> bytes:
    """GET_TABLET_MAP's body for (table id, start, end, server id, address, state) tablets."""
    body = struct.pack("<I", len(tablets))
    for table_id, start, end, server_id, address, state in tablets:
        encoded = address.encode("utf-8")
        body += struct.pack("<QQQQH", table_id, start, end, server_id, len(encoded))
        body += encoded + bytes([state])
    return body


def read_request_key(body: bytes) -> tuple[int, bytes]:
    """(table id, key) of a READ, WRITE, REMOVE or INCREMENT request body."""
    table_id, key_length = struct.unpack_from("<QH", body)
    return table_id, body[10 : 10 + key_length]


def client_lease_grant(request: Request, lease: int, term_ms: int = LEASE_TERM_MS) -> bytes:
    """CLIENT_LEASE's answer: ``lease`` granted for ``term_ms``."""
    return response_frame(request, 0, struct.pack("<QI", lease, term_ms))


def client_lease_asked(request: Request) -> int:
    """The lease a CLIENT_LEASE request renews (0: it opens a new one)."""
    (lease,) = struct.unpack("<Q", request.body)
    return lease


def _identity_at(body: bytes, offset: int) -> tuple[tuple[int, int, int] | None, int]:
    """The rpc identity at ``offset`` (lease, rpc id, acknowledged; None for tag 0), and the
    offset after it."""
    tag = body[offset]
    if tag == 0:
        return None, offset + 1
    assert tag == 1, f"rpc identity tag {tag}"
    return struct.unpack_from("<QQQ", body, offset + 1), offset + 25


def _item_end(opcode: int, body: bytes, offset: int) -> int:
    """Where the fields before the rpc identity end, for a mutation's item or body at
    ``offset`` (table id, key, then per opcode value / delta / expiry, rules, expiry)."""
    (key_length,) = struct.unpack_from("<H", body, offset + 8)
    offset += 10 + key_length
    if opcode in (WRITE, MULTI_WRITE):
        (value_length,) = struct.unpack_from("<I", body, offset)
        return offset + 4 + value_length + 9 + 9  # value, rules, expiry
    if opcode in (INCREMENT, MULTI_INCREMENT):
        return offset + 8 + 9  # delta, rules
    if opcode == SET_EXPIRY:
        return offset + 9 + 9  # expiry, rules
    assert opcode in (REMOVE, MULTI_REMOVE), f"opcode {opcode} is not a mutation"
    return offset + 9  # rules


def rpc_identity(request: Request):
    """The rpc identity of a WRITE, REMOVE, INCREMENT or SET_EXPIRY request (None: none)."""
    identity, end = _identity_at(request.body, _item_end(request.opcode, request.body, 0))
    assert end == len(request.body), "the identity ends the body"
    return identity


def multi_identities(request: Request) -> list:
    """The rpc identity of each item of a MULTI_WRITE, MULTI_REMOVE or MULTI_INCREMENT."""
    (count,) = struct.unpack_from("<I", request.body)
    identities, offset = [], 4
    for _ in range(count):
        end = _item_end(request.opcode, request.body, offset)
        identity, offset = _identity_at(request.body, end)
        identities.append(identity)
    assert offset == len(request.body)
    return identities


@dataclass(frozen=True)
class TxPrepareOp:
    table_id: int
    key: bytes
    rpc: int
    kind: int
    version_read: int
    value: bytes


@dataclass(frozen=True)
class TxPrepareRequest:
    lease: int
    acknowledged: int
    transaction: int
    validate_only: bool
    ops: list[TxPrepareOp]
    # (table id, key hash, rpc id) of every op of the transaction
    participants: list[tuple[int, int, int]]


@dataclass(frozen=True)
class TxDecisionRequest:
    lease: int
    acknowledged: int
    transaction: int
    decision: int
    ops: list[tuple[int, int, int]]


@dataclass(frozen=True)
class TxRequestAbortRequest:
    lease: int
    transaction: int
    ops: list[tuple[int, int, int]]


def _tx_op_names(body: bytes, offset: int) -> tuple[list[tuple[int, int, int]], int]:
    (count,) = struct.unpack_from("<I", body, offset)
    offset += 4
    names = [struct.unpack_from("<QQQ", body, offset + 24 * i) for i in range(count)]
    return names, offset + 24 * count


def tx_prepare_request(request: Request) -> TxPrepareRequest:
    """A TX_PREPARE request's fields (the wire's layout, checked to be consumed whole)."""
    assert request.opcode == TX_PREPARE
    body = request.body
    lease, acknowledged, transaction, validate_only, count = struct.unpack_from("<QQQBI", body)
    assert validate_only in (0, 1)
    offset = 8 * 3 + 1 + 4
    ops = []
    for _ in range(count):
        table_id, key_length = struct.unpack_from("<QH", body, offset)
        offset += 10
        key = body[offset : offset + key_length]
        offset += key_length
        rpc, kind, version_read, value_length = struct.unpack_from("<QBQI", body, offset)
        offset += 8 + 1 + 8 + 4
        value = body[offset : offset + value_length]
        offset += value_length
        ops.append(TxPrepareOp(table_id, key, rpc, kind, version_read, value))
    participants, offset = _tx_op_names(body, offset)
    assert offset == len(body), "the participants end the body"
    return TxPrepareRequest(
        lease, acknowledged, transaction, bool(validate_only), ops, participants
    )


def tx_decision_request(request: Request) -> TxDecisionRequest:
    assert request.opcode == TX_DECISION
    lease, acknowledged, transaction, decision = struct.unpack_from("<QQQB", request.body)
    ops, offset = _tx_op_names(request.body, 25)
    assert offset == len(request.body)
    return TxDecisionRequest(lease, acknowledged, transaction, decision, ops)


def tx_request_abort_request(request: Request) -> TxRequestAbortRequest:
    assert request.opcode == TX_REQUEST_ABORT
    lease, transaction = struct.unpack_from("<QQ", request.body)
    ops, offset = _tx_op_names(request.body, 16)
    assert offset == len(request.body)
    return TxRequestAbortRequest(lease, transaction, ops)


def tx_votes_body(votes: list[tuple[int, int, int]]) -> bytes:
    """TX_PREPARE's or TX_REQUEST_ABORT's answer body: (status, vote, version) per op."""
    return struct.pack("<I", len(votes)) + b"".join(
        struct.pack("<HBQ", status, vote, version) for status, vote, version in votes
    )


def tx_results_body(statuses: list[int]) -> bytes:
    """TX_DECISION's answer body: a status per op."""
    return struct.pack("<I", len(statuses)) + b"".join(
        struct.pack("<H", status) for status in statuses
    )


class LeaseGranter:
    """A coordinator's CLIENT_LEASE: opens leases 1, 2, 3... and renews any lease asked, each
    for ``term_ms``."""

    def __init__(self, term_ms: int = LEASE_TERM_MS) -> None:
        self.term_ms = term_ms
        self._lock = threading.Lock()
        self.opened: list[int] = []

    def __call__(self, request: Request) -> bytes:
        lease = client_lease_asked(request)
        if lease == 0:
            with self._lock:
                lease = len(self.opened) + 1
                self.opened.append(lease)
        return client_lease_grant(request, lease, self.term_ms)


class FakeServer:
    """A loopback server that answers each request frame with ``respond(request)``."""

    def __init__(
        self,
        respond: Respond,
        hello: bytes = HELLO_OK,
        preamble: Callable[[Callable[[int], bytes | None], Callable[[bytes], None]], bool]
        | None = None,
    ) -> None:
        self._respond = respond
        self._hello = hello
        # Run before the handshake with (receive exactly n bytes, send bytes): the server side
        # of a credentials preamble; False closes the connection.
        self._preamble = preamble
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        self.requests: list[Request] = []
        self.connections_accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._start(self._accept_loop)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exception_info: object) -> None:
        self.close()

    def requests_with_opcode(self, opcode: int) -> list[Request]:
        with self._lock:
            return [request for request in self.requests if request.opcode == opcode]

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.close()
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5)

    def _start(self, target, *arguments) -> None:
        thread = threading.Thread(target=target, args=arguments, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._connections.append(connection)
                self.connections_accepted += 1
            self._start(self._serve, connection)

    def _receive_exactly(self, connection: socket.socket, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            if self._stopping.is_set():
                return None
            try:
                chunk = connection.recv(count - len(data))
            except TimeoutError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def _serve(self, connection: socket.socket) -> None:
        try:
            # (Inside: ``close`` may have closed the socket already.)
            connection.settimeout(0.05)
            if self._preamble is not None and not self._preamble(
                lambda count: self._receive_exactly(connection, count), connection.sendall
            ):
                return
            if self._receive_exactly(connection, 8) is None:
                return
            connection.sendall(self._hello)
            while not self._stopping.is_set():
                length_field = self._receive_exactly(connection, 4)
                if length_field is None:
                    return
                (after_length,) = struct.unpack("<I", length_field)
                rest = self._receive_exactly(connection, after_length)
                if rest is None:
                    return
                _, _, opcode, request_id = struct.unpack_from("<BBHQ", rest)
                request = Request(opcode, request_id, rest[12:])
                with self._lock:
                    self.requests.append(request)
                answer = self._respond(request)
                if answer is Close:
                    return
                if answer is Silence:
                    continue
                connection.sendall(answer)
        except OSError:
            return
        finally:
            connection.close()


class ScriptedCoordinator(FakeServer):
    """Answers GET_TABLET_MAP with the scripted maps in turn, repeating the last one, and
    CLIENT_LEASE with ``leases`` (by default a ``LeaseGranter``: leases 1, 2, 3...)."""

    def __init__(self, *maps, leases=None) -> None:
        self._maps = list(maps)
        self._maps_lock = threading.Lock()
        self.leases = leases if leases is not None else LeaseGranter()
        super().__init__(self._answer)

    def _answer(self, request: Request) -> bytes:
        if request.opcode == CLIENT_LEASE:
            return self.leases(request)
        if request.opcode != GET_TABLET_MAP:
            return error_frame(request, UNIMPLEMENTED_REQUEST, "not scripted")
        with self._maps_lock:
            tablets = self._maps.pop(0) if len(self._maps) > 1 else self._maps[0]
        return response_frame(request, 0, tablet_map_body(tablets))

    @property
    def map_requests(self) -> int:
        return len(self.requests_with_opcode(GET_TABLET_MAP))

    @property
    def lease_requests(self) -> list[int]:
        """The lease each CLIENT_LEASE asked for (0: open a new one), in order."""
        return [client_lease_asked(request) for request in self.requests_with_opcode(CLIENT_LEASE)]


def answers_in_turn(*answers):
    """A ``respond`` function giving ``answers[i](request)`` to the i-th request, then the
    last one forever."""
    script = list(answers)
    lock = threading.Lock()

    def respond(request: Request):
        with lock:
            answer = script.pop(0) if len(script) > 1 else script[0]
        return answer(request)

    return respond


def unused_address() -> str:
    """A loopback address nothing listens on (bound, then released)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"127.0.0.1:{port}"


def start(servers: list[FakeServer], server: FakeServer) -> FakeServer:
    """``server``, added to ``servers`` (the ``servers`` fixture's list) to be closed."""
    servers.append(server)
    return server
