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
import threading

from .errors import AuthenticationFailed, ProtocolError
from .status import Status

__all__ = [
    "client_key",
    "CHALLENGE_BYTES",
    "ANSWER_BYTES",
    "VERDICT_BYTES",
    "UserPassword",
    "new_user_credentials",
]

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
    check_answer_status(
        answer,
        "this client",
        "it has no client password configured, or speaks another preamble version",
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


# ---------------------------------------------------------------------------------------------
# Named users (role 2): SCRAM-style keys derived with Argon2id from the password and the user's
# salt, which the server sends in its answer.

ROLE_USER = 2
USER_SALT_BYTES = 16
USER_KEY_BYTES = 32
USER_NAME_BYTES_MAX = 64
USER_PASSWORD_BYTES_MIN = 8
USER_PASSWORD_BYTES_MAX = 4096

_USER_CONNECTOR_LABEL = b"stratus user   c"
_USER_ACCEPTOR_LABEL = b"stratus user   a"
_USER_NAME_CHARACTERS = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.@-"
)


def check_user_name(name: str) -> str:
    """``name`` if it is a valid user name (1 to 64 ASCII letters, digits and ``_ . @ -``, not
    ``default``); ``ValueError`` otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"a user name is a str, not {type(name).__name__}")
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= USER_NAME_BYTES_MAX:
        raise ValueError(f"a user name has 1 to {USER_NAME_BYTES_MAX} bytes, not {len(raw)}")
    if not all(byte in _USER_NAME_CHARACTERS for byte in raw):
        raise ValueError(f"user name {name!r}: only ASCII letters, digits and _ . @ - are allowed")
    if name == "default":
        raise ValueError('"default" is the client password\'s user; pass password= alone for it')
    return name


def check_user_password(password: str | bytes) -> bytes:
    """The password's bytes without surrounding ASCII whitespace, if 8 to 4096 remain."""
    secret = (password.encode() if isinstance(password, str) else bytes(password)).strip(
        b" \t\n\r\x0c"
    )
    if not USER_PASSWORD_BYTES_MIN <= len(secret) <= USER_PASSWORD_BYTES_MAX:
        raise ValueError(
            f"a user's password has {USER_PASSWORD_BYTES_MIN} to {USER_PASSWORD_BYTES_MAX} "
            f"bytes, not {len(secret)}"
        )
    return secret


def _argon2id(secret: bytes, salt: bytes) -> bytes:
    try:
        from argon2.low_level import Type, hash_secret_raw
    except ImportError:
        raise ImportError(
            "a password needs the argon2-cffi package: pip install 'stratus-client[password]'"
        ) from None
    return hash_secret_raw(
        secret,
        salt,
        time_cost=_PASSES,
        memory_cost=_MEMORY_KIB,
        parallelism=_LANES,
        hash_len=32,
        type=Type.ID,
    )


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def user_keys(password: bytes, salt: bytes) -> tuple[bytes, bytes, bytes]:
    """(client key, stored key, server key) of ``password`` (already checked) with ``salt``:
    salted = Argon2id(password, salt); client key = HMAC(salted, "Client Key"); stored key =
    SHA-256(client key); server key = HMAC(salted, "Server Key")."""
    salted = _argon2id(password, salt)
    client = _hmac(salted, b"Client Key")
    return client, hashlib.sha256(client).digest(), _hmac(salted, b"Server Key")


def new_user_credentials(password: str | bytes) -> tuple[bytes, bytes, bytes]:
    """(salt, stored key, server key) for ``password`` with a fresh random salt: what SET_USER
    carries (the password itself never leaves this process)."""
    secret = check_user_password(password)
    salt = os.urandom(USER_SALT_BYTES)
    _, stored, server = user_keys(secret, salt)
    return salt, stored, server


def _encoded_name(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes([len(raw)]) + raw


def _user_transcript(label: bytes, client_nonce: bytes, server_nonce: bytes, name: str) -> bytes:
    return label + client_nonce + server_nonce + _encoded_name(name)


class UserPassword:
    """A named user's name and password, held by a client to prove them on every connection.
    The keys derived for the last salt a server sent are kept, so the Argon2id is paid once
    per salt, not once per connection. Thread-safe."""

    def __init__(self, name: str, password: str | bytes) -> None:
        self.name = check_user_name(name)
        self._password = check_user_password(password)
        self._lock = threading.Lock()
        self._keys: tuple[bytes, tuple[bytes, bytes, bytes]] | None = None
        self.derivations = 0  # Argon2id runs so far (tests check the cache with it)

    def __repr__(self) -> str:
        return f"UserPassword({self.name!r}, <redacted>)"

    def keys_for(self, salt: bytes) -> tuple[bytes, bytes, bytes]:
        with self._lock:
            if self._keys is not None and hmac.compare_digest(self._keys[0], salt):
                return self._keys[1]
        keys = user_keys(self._password, salt)
        with self._lock:
            self._keys = (salt, keys)
            self.derivations += 1
        return keys

    def challenge(self) -> tuple[bytes, bytes]:
        """A fresh client nonce and the challenge that carries it and the name."""
        nonce = os.urandom(NONCE_BYTES)
        head = MEMBER_MAGIC + struct.pack("<HH", PREAMBLE_VERSION, ROLE_USER) + nonce
        return nonce, head + _encoded_name(self.name)

    def answer_proof(self, client_nonce: bytes, answer: bytes, salt: bytes) -> bytes:
        """Checks the server's answer (``ANSWER_BYTES``, then the user's salt): its status and
        its proof that it holds the user's server key; returns this client's proof. Raises
        ``AuthenticationFailed`` when the server refuses or does not know this password."""
        server_nonce = answer[8 : 8 + NONCE_BYTES]
        server_proof = answer[8 + NONCE_BYTES :]
        client_key, stored_key, server_key = self.keys_for(salt)
        acceptor = _user_transcript(_USER_ACCEPTOR_LABEL, client_nonce, server_nonce, self.name)
        expected = _hmac(server_key, acceptor)
        if not hmac.compare_digest(expected, server_proof):
            raise AuthenticationFailed(
                f"the server does not accept user {self.name!r} with this password (a wrong "
                "user name or password, a disabled user, or a server of another cluster)"
            )
        signature = _hmac(
            stored_key,
            _user_transcript(_USER_CONNECTOR_LABEL, client_nonce, server_nonce, self.name),
        )
        return bytes(key ^ sign for key, sign in zip(client_key, signature))


def check_answer_status(
    answer: bytes,
    who: str,
    why: str = "it has no users configured, refuses that name for a moment after many "
    "failures, or speaks another preamble version",
) -> None:
    """Raises unless ``answer`` (``ANSWER_BYTES``) is well formed with status OK; a refusal
    names ``who`` was refused and ``why`` that may be."""
    if len(answer) != ANSWER_BYTES or answer[:4] != MEMBER_MAGIC or answer[6:8] != b"\0\0":
        raise ProtocolError("malformed answer to the credentials challenge")
    (code,) = struct.unpack_from("<H", answer, 4)
    try:
        status = Status(code)
    except ValueError:
        raise ProtocolError(f"unknown status {code} in the answer to the challenge") from None
    if status is not Status.OK:
        raise AuthenticationFailed(
            f"the server refused to authenticate {who} ({status.description}): {why}"
        )
