"""A scripted stand-in for a Stratus server, to drive the client through situations a healthy
cluster does not produce on demand: stale tablet maps, RETRY, silence, garbage.

The server listens on loopback, answers the handshake (or sends what it is told to instead),
then reads request frames and answers each with whatever its ``respond`` function returns.
Every blocking call has a timeout, and ``close`` stops every thread, so a test that goes wrong
fails instead of hanging.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

HELLO_OK = b"STRA\x02\x00\x00\x00"


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


class FakeServer:
    """A loopback server that answers each request frame with ``respond(request)``."""

    def __init__(self, respond: Respond, hello: bytes = HELLO_OK) -> None:
        self._respond = respond
        self._hello = hello
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
        connection.settimeout(0.05)
        try:
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
