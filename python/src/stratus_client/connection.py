"""One TCP connection to one Stratus server, carrying one request at a time.

The protocol allows pipelining (many requests in flight, answered in any order), but a client
that sends one request and waits for its answer is correct and much simpler to make robust.
Every socket operation runs under a deadline, and any failure closes the connection: after a
timeout or a broken frame the byte stream's position is unknown, so reusing it could match a
late answer to the wrong request. The client then opens a new connection on its next attempt.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time

from . import codec, credentials
from .codec import Opcode
from .errors import (
    CouldNotConnect,
    ProtocolError,
    ProtocolVersionMismatch,
    StratusError,
    Timeout,
)
from .status import Status

__all__ = ["Connection", "parse_address"]

# Largest single recv: bounds the buffer a read asks the kernel for, not the frame size.
_RECEIVE_CHUNK_BYTES = 1 << 20


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6 address]:port"``) as a (host, port) pair for ``socket``."""
    host, separator, port_text = address.rpartition(":")
    if not separator or not host or not port_text.isdigit() or not 0 < int(port_text) < 65_536:
        raise ValueError(f"address {address!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def _unsent(error: StratusError) -> StratusError:
    """``error``, noted as having happened before the request was sent whole: no server can
    have run it (exactly-once mutations may then be retried under a new lease)."""
    error.request_sent = False
    return error


def _seconds_left(deadline: float, address: str, doing: str) -> float:
    """Time left until ``deadline``; a ``Timeout`` when none is, so that no socket is ever
    given a zero timeout (which would make it non-blocking rather than fail)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout(f"{address}: ran out of time {doing}")
    return left


class Connection:
    """A handshaken connection to the server at ``address``.

    Thread-safe: callers take turns (each waits for its turn no longer than its own deadline).
    """

    def __init__(
        self,
        address: str,
        deadline: float,
        password_key: bytes | None = None,
        tls: ssl.SSLContext | None = None,
        user: credentials.UserPassword | None = None,
    ) -> None:
        """Connects and performs the handshake, all before ``deadline`` (``time.monotonic``);
        with ``tls``, runs a TLS handshake first (the server's certificate must name its host);
        with ``password_key`` (``credentials.client_key``), proves the client password (inside
        TLS, if any); with ``user`` (``credentials.UserPassword``), proves that named user's
        password instead.

        Raises ``CouldNotConnect`` or ``Timeout`` when the server cannot be reached in time,
        ``ProtocolVersionMismatch`` when it speaks another protocol version,
        ``AuthenticationFailed`` when the password is refused (or the server lacks it), and
        ``ProtocolError`` when what answers is not a Stratus server.
        """
        self.address = address
        self._turn = threading.Lock()
        self._next_request_id = 1
        self._socket: socket.socket | None = None
        host, port = parse_address(address)
        try:
            self._socket = socket.create_connection(
                (host, port), timeout=_seconds_left(deadline, address, "connecting")
            )
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                self._socket.settimeout(_seconds_left(deadline, address, "the TLS handshake"))
                self._socket = tls.wrap_socket(self._socket, server_hostname=host)
            if user is not None:
                self._prove_user(user, deadline)
            elif password_key is not None:
                self._prove_password(password_key, deadline)
            self._send_all(codec.encode_hello(), deadline)
            server_version, status = codec.decode_hello(
                self._receive_exactly(codec.HELLO_BYTES, deadline)
            )
        except ProtocolError as error:
            self.close()
            raise ProtocolError(f"{address}: {error.message}") from None
        except StratusError:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise Timeout(f"{address}: no answer to connect and handshake in time") from None
        except ssl.SSLError as error:
            self.close()
            raise CouldNotConnect(
                f"{address}: TLS handshake: {error} (does it speak TLS, with a certificate "
                "the given CA signed?)"
            ) from None
        except OSError as error:
            self.close()
            raise CouldNotConnect(f"{address}: {error}") from None
        if status is Status.PROTOCOL_VERSION_MISMATCH or (
            status is Status.OK and server_version != codec.PROTOCOL_VERSION
        ):
            self.close()
            raise ProtocolVersionMismatch(
                f"{address} speaks protocol version {server_version}, "
                f"this client {codec.PROTOCOL_VERSION}"
            )
        if status is not Status.OK:
            self.close()
            raise ProtocolError(f"{address} refused the handshake with {status.name}")

    def _prove_password(self, key: bytes, deadline: float) -> None:
        """The client side of the credentials preamble (see ``credentials``)."""
        client_nonce, challenge = credentials.challenge()
        self._send_all(challenge, deadline)
        answer = self._receive_exactly(credentials.ANSWER_BYTES, deadline)
        self._send_all(credentials.answer_proof(key, client_nonce, answer), deadline)
        credentials.check_verdict(self._receive_exactly(credentials.VERDICT_BYTES, deadline))

    def _prove_user(self, user: credentials.UserPassword, deadline: float) -> None:
        """The client side of a named user's preamble (role 2): the challenge carries the name,
        the answer the user's salt; the server proves it knows the user's server key before
        this client proves the password."""
        client_nonce, challenge = user.challenge()
        self._send_all(challenge, deadline)
        answer = self._receive_exactly(credentials.ANSWER_BYTES, deadline)
        credentials.check_answer_status(answer, f"user {user.name!r}")
        salt = self._receive_exactly(credentials.USER_SALT_BYTES, deadline)
        self._send_all(user.answer_proof(client_nonce, answer, salt), deadline)
        credentials.check_verdict(self._receive_exactly(credentials.VERDICT_BYTES, deadline))

    @property
    def closed(self) -> bool:
        return self._socket is None

    def close(self) -> None:
        """Closes the socket; safe to call more than once and from any state."""
        sock, self._socket = self._socket, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def call(self, opcode: Opcode, body: bytes, deadline: float) -> tuple[Status, object]:
        """Sends one request and returns its (status, decoded body), before ``deadline``.

        Raises ``Timeout`` (no answer in time) or ``CouldNotConnect`` (connection lost; the
        request may or may not have run), both retryable, or ``ProtocolError`` when the answer
        violates the protocol. After any of these the connection is closed. Each error's
        ``request_sent`` says whether the whole request had been handed to the socket: if not,
        the server cannot have run it (it never received a whole frame).
        """
        try:
            left = _seconds_left(deadline, self.address, "waiting")
        except Timeout as error:
            raise _unsent(error) from None
        if not self._turn.acquire(timeout=left):
            raise _unsent(
                Timeout(f"{self.address}: the connection stayed busy with other requests")
            )
        try:
            if self._socket is None:
                raise _unsent(CouldNotConnect(f"{self.address}: connection closed"))
            request_id = self._next_request_id
            self._next_request_id += 1
            # Encoded before anything is sent: a request that is too large fails alone and
            # leaves the connection usable.
            frame = codec.encode_request(opcode, request_id, body)
            sent = False
            try:
                self._send_all(frame, deadline)
                sent = True
                response = self._receive_frame(deadline)
                header = codec.decode_response_header(response)
                if header.request_id != request_id:
                    raise ProtocolError(
                        f"{self.address} answered request id {header.request_id}, "
                        f"the one outstanding is {request_id}"
                    )
                if header.opcode_code != opcode:
                    raise ProtocolError(
                        f"{self.address} answered opcode {header.opcode_code} to a "
                        f"{opcode.name} ({int(opcode)}) request"
                    )
                decoded = codec.decode_response_body(
                    opcode, header.status, response[codec.RESPONSE_HEADER_BYTES :]
                )
                return header.status, decoded
            except ProtocolError as error:
                self.close()
                failure: StratusError = ProtocolError(f"{self.address}: {error.message}")
            except StratusError as error:
                self.close()
                error.request_sent = sent
                raise
            except TimeoutError:
                self.close()
                failure = Timeout(f"{self.address}: no response to {opcode.name} in time")
            except OSError as error:
                self.close()
                failure = CouldNotConnect(f"{self.address}: connection lost: {error}")
            failure.request_sent = sent
            raise failure
        finally:
            self._turn.release()

    def _send_all(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            sock = self._require_socket()
            sock.settimeout(_seconds_left(deadline, self.address, "sending"))
            sent = sock.send(view)
            view = view[sent:]

    def _receive_exactly(self, count: int, deadline: float) -> bytes:
        buffer = bytearray(count)
        view = memoryview(buffer)
        received = 0
        while received < count:
            sock = self._require_socket()
            sock.settimeout(_seconds_left(deadline, self.address, "receiving"))
            got = sock.recv_into(view[received:], min(count - received, _RECEIVE_CHUNK_BYTES))
            if got == 0:
                raise CouldNotConnect(f"{self.address} closed the connection")
            received += got
        return bytes(buffer)

    def _receive_frame(self, deadline: float) -> bytes:
        """One whole frame. Its length is checked before the rest is read, so a lying length
        field costs nothing."""
        length_field = self._receive_exactly(codec.LENGTH_FIELD_BYTES, deadline)
        total = codec.frame_total_bytes(length_field)
        return length_field + self._receive_exactly(total - codec.LENGTH_FIELD_BYTES, deadline)

    def _require_socket(self) -> socket.socket:
        if self._socket is None:
            raise CouldNotConnect(f"{self.address}: connection closed")
        return self._socket
