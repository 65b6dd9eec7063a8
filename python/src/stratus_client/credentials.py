"""The client password: how a client proves it to a server before the handshake.

A cluster whose servers run with ``--client-password-file`` serves nothing but PING to a
connection that has not proved the password. The proof is the membership preamble of
docs/design/wire-protocol.md with role 1 (client): both sides send a fresh 32-byte nonce, the
server proves it holds the password's key first, then the client does, each with an
HMAC-SHA-256 over a label and both nonces. The key is Argon2id of the password (slow on
purpose), computed once per ``Client``; it needs the ``argon2-cffi`` package
(``pip install stratus-client[password]``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from .errors import AuthenticationFailed, ProtocolError
from .status import Status

__all__ = ["client_key", "CHALLENGE_BYTES", "ANSWER_BYTES", "VERDICT_BYTES"]

MEMBER_MAGIC = b"STRM"
PREAMBLE_VERSION = 1
ROLE_CLIENT = 1
NONCE_BYTES = 32
PROOF_BYTES = 32
CHALLENGE_BYTES = 8 + NONCE_BYTES
ANSWER_BYTES = 8 + NONCE_BYTES + PROOF_BYTES
VERDICT_BYTES = 4
SECRET_BYTES_MIN = 16

# The labels of a client-role proof: which side proves (16 ASCII bytes each).
_CONNECTOR_LABEL = b"stratus client c"
_ACCEPTOR_LABEL = b"stratus client a"

# Argon2id's parameters and salt for client passwords, as the servers derive them.
_SALT = b"stratus client key v1"
_MEMORY_KIB = 19 * 1024
_PASSES = 2
_LANES = 1


def client_key(password: str | bytes) -> bytes:
    """The 32-byte key of ``password`` (surrounding whitespace removed, at least 16 bytes)."""
    # The ASCII whitespace Rust's `trim_ascii` removes (bytes.strip() would also take \x0b).
    secret = (password.encode() if isinstance(password, str) else bytes(password)).strip(
        b" \t\n\r\x0c"
    )
    if len(secret) < SECRET_BYTES_MIN:
        raise ValueError(f"the client password has {len(secret)} bytes; at least 16 are needed")
    try:
        from argon2.low_level import Type, hash_secret_raw
    except ImportError:
        raise ImportError(
            "a client password needs the argon2-cffi package: pip install 'stratus-client[password]'"
        ) from None
    return hash_secret_raw(
        secret,
        _SALT,
        time_cost=_PASSES,
        memory_cost=_MEMORY_KIB,
        parallelism=_LANES,
        hash_len=32,
        type=Type.ID,
    )


def _proof(key: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(key, label + client_nonce + server_nonce, hashlib.sha256).digest()


def challenge() -> tuple[bytes, bytes]:
    """A fresh client nonce and the challenge that carries it."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, MEMBER_MAGIC + struct.pack("<HH", PREAMBLE_VERSION, ROLE_CLIENT) + nonce


def answer_proof(key: bytes, client_nonce: bytes, answer: bytes) -> bytes:
    """Checks the server's answer (its status, and that it holds the key); returns this
    client's proof to send. Raises ``ProtocolError`` for a malformed answer and
    ``AuthenticationFailed`` when the server refuses or does not hold the key."""
    if len(answer) != ANSWER_BYTES or answer[:4] != MEMBER_MAGIC or answer[6:8] != b"\0\0":
        raise ProtocolError("malformed answer to the password challenge")
    (code,) = struct.unpack_from("<H", answer, 4)
    try:
        status = Status(code)
    except ValueError:
        raise ProtocolError(f"unknown status {code} in the answer to the password challenge") from None
    if status is not Status.OK:
        raise AuthenticationFailed(
            f"the server refused to authenticate ({status.description}): it has no client "
            "password configured, or speaks another preamble version"
        )
    server_nonce = answer[8 : 8 + NONCE_BYTES]
    server_proof = answer[8 + NONCE_BYTES :]
    expected = _proof(key, _ACCEPTOR_LABEL, client_nonce, server_nonce)
    if not hmac.compare_digest(expected, server_proof):
        raise AuthenticationFailed(
            "the server does not hold this client password (another cluster, or a wrong password)"
        )
    return _proof(key, _CONNECTOR_LABEL, client_nonce, server_nonce)


def check_verdict(verdict: bytes) -> None:
    """Raises unless the server accepted this client's proof."""
    if len(verdict) != VERDICT_BYTES or verdict[2:] != b"\0\0":
        raise ProtocolError("malformed verdict on the password proof")
    (code,) = struct.unpack_from("<H", verdict)
    if code != Status.OK:
        raise AuthenticationFailed("the server refused this client's password")
