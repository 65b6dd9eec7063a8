"""Named users (role 2 of the credentials preamble) against a fake server that runs the server's
side of it, independently of the client's code: the proofs, the salt, the keys kept per salt,
WHO_AM_I, the user-management bodies, and PERMISSION_DENIED raised at once."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time

import pytest
from argon2.low_level import Type, hash_secret_raw

from fake_server import FakeServer, Request, error_frame, response_frame

from stratus_client import (
    ACCESS_READ,
    ACCESS_WRITE,
    AuthenticationFailed,
    Client,
    IdentityKind,
    PermissionDenied,
    TableGrant,
    codec,
)
from stratus_client.codec import Opcode

PERMISSION_DENIED = 32
SALT = bytes(range(16))


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def stored_keys(password: bytes, salt: bytes = SALT) -> tuple[bytes, bytes]:
    """(stored key, server key) as the cluster keeps them for ``password``."""
    salted = hash_secret_raw(
        password, salt, time_cost=2, memory_cost=19456, parallelism=1, hash_len=32, type=Type.ID
    )
    client_key = _hmac(salted, b"Client Key")
    return hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")


def transcript(side: bytes, client_nonce: bytes, server_nonce: bytes, name: bytes) -> bytes:
    return b"stratus user   " + side + client_nonce + server_nonce + bytes([len(name)]) + name


class UserAcceptor:
    """The server's side of a named user's preamble, for the users in ``users`` (name → the
    password). Counts what it accepted and refused."""

    def __init__(self, users: dict[bytes, bytes]) -> None:
        self.keys = {name: stored_keys(password) for name, password in users.items()}
        self.accepted = 0
        self.refused = 0

    def __call__(self, receive, send) -> bool:
        head = receive(40)
        if head is None:
            return False
        magic, version, role = head[:4], *struct.unpack_from("<HH", head, 4)
        assert (magic, version, role) == (b"STRM", 1, 2), head[:8]
        client_nonce = head[8:]
        (length,) = receive(1)
        name = receive(length)
        server_nonce = os.urandom(32)
        stored_key, server_key = self.keys.get(name, (os.urandom(32), os.urandom(32)))
        server_proof = _hmac(server_key, transcript(b"a", client_nonce, server_nonce, name))
        send(b"STRM" + struct.pack("<HH", 0, 0) + server_nonce + server_proof + SALT)
        proof = receive(32)
        if proof is None:
            return False
        signature = _hmac(stored_key, transcript(b"c", client_nonce, server_nonce, name))
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if hashlib.sha256(client_key).digest() != stored_key:
            self.refused += 1
            send(struct.pack("<HH", 31, 0))  # AUTHENTICATION_FAILED
            return False
        self.accepted += 1
        send(struct.pack("<HH", 0, 0))
        return True


def who_am_i_body(name: bytes, grants: list[tuple[bytes, int]]) -> bytes:
    body = b"\x04" + struct.pack("<H", len(name)) + name + struct.pack("<I", len(grants))
    for pattern, access in grants:
        body += struct.pack("<H", len(pattern)) + pattern + bytes([access])
    return body


def answer(request: Request) -> bytes:
    if request.opcode == Opcode.WHO_AM_I:
        return response_frame(request, 0, who_am_i_body(b"alice", [(b"logs*", 3)]))
    return error_frame(
        request, PERMISSION_DENIED, 'ListTables needs --a on table "*", and user "alice" has rw-'
    )


@pytest.fixture
def acceptor_server():
    acceptor = UserAcceptor({b"alice": b"alice-password"})
    server = FakeServer(answer, preamble=acceptor)
    yield acceptor, server
    server.close()


def test_a_user_proves_its_password_and_the_keys_are_derived_once_per_salt(acceptor_server):
    acceptor, server = acceptor_server
    with Client(server.address, timeout=5, user="alice", password=" alice-password\n") as client:
        identity = client.who_am_i()
        assert identity.kind is IdentityKind.USER
        assert identity.name == "alice" and identity.user_name == "alice"
        assert identity.grants == (TableGrant("logs*", ACCESS_READ | ACCESS_WRITE),)
        # A second connection (the first one closed) proves again without a new Argon2id.
        client._connections[server.address].close()
        client.who_am_i()
        assert acceptor.accepted == 2
        assert client._user.derivations == 1
        assert "alice-password" not in repr(client._user)


def test_a_wrong_password_or_user_fails_at_once(acceptor_server):
    acceptor, server = acceptor_server
    for user, password in (("alice", "not-her-password"), ("mallory", "alice-password")):
        started = time.monotonic()
        with Client(server.address, timeout=20, user=user, password=password) as client:
            with pytest.raises(AuthenticationFailed):
                client.who_am_i()
        assert time.monotonic() - started < 10, "not retried until the timeout"
    assert acceptor.accepted == 0


def test_permission_denied_is_raised_at_once_with_the_clusters_words(acceptor_server):
    _, server = acceptor_server
    with Client(server.address, timeout=20, user="alice", password="alice-password") as client:
        started = time.monotonic()
        with pytest.raises(PermissionDenied) as denied:
            client.list_tables()
        assert time.monotonic() - started < 10
        assert 'user "alice" has rw-' in str(denied.value)
    assert len(server.requests_with_opcode(Opcode.LIST_TABLES)) == 1, "not retried"


def test_bad_user_settings_are_refused_before_any_connection():
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", user="alice", password="short")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", user="default", password="long enough password")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", user="no spaces", password="long enough password")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", user="alice")


def test_user_records_and_summaries_have_the_wire_layout():
    body = codec.set_user_body(
        "bob", True, (b"s" * 16, b"k" * 32, b"v" * 32), [TableGrant.parse("t*=ra")]
    )
    assert body == (
        b"\x03\x00bob" + b"\x03" + b"s" * 16 + b"k" * 32 + b"v" * 32
        + b"\x01\x00\x00\x00" + b"\x02\x00t*" + b"\x05"
    )
    assert codec.set_user_body("bob", False, None, []) == b"\x03\x00bob\x00\x00\x00\x00\x00"
    assert codec.user_name_body("bob") == b"\x03\x00bob"
    summaries = b"\x01\x00\x00\x00" + b"\x03\x00bob" + b"\x03" + b"\x01\x00\x00\x00\x01\x00*\x01"
    (summary,) = codec.decode_response_body(Opcode.LIST_USERS, codec.Status.OK, summaries)
    assert (summary.name, summary.enabled, summary.has_password) == ("bob", True, True)
    assert summary.grants == (TableGrant("*", ACCESS_READ),)
    default = codec.decode_response_body(Opcode.WHO_AM_I, codec.Status.OK, b"\x02")
    assert default.kind is IdentityKind.DEFAULT and default.user_name == "default"
    assert str(TableGrant.parse("logs*=WR")) == "logs*=rw"
    with pytest.raises(ValueError):
        TableGrant.parse("logs*=rx")
