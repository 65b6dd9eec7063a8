"""Status codes: the closed set every response carries (docs/design/wire-protocol.md, "Statuses").

Codes are never renumbered; new ones are appended together with a protocol version bump, so a
code this module does not know is a protocol violation, not something to guess about.
"""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(enum.IntEnum):
    """Outcome of a request. On the wire: a little-endian ``u16``."""

    OK = 0
    UNKNOWN_TABLET = 1
    TABLE_DOESNT_EXIST = 2
    OBJECT_DOESNT_EXIST = 3
    OBJECT_EXISTS = 4
    WRONG_VERSION = 5
    NO_TABLE_SPACE = 6
    REQUEST_FORMAT_ERROR = 7
    UNIMPLEMENTED_REQUEST = 8
    RETRY = 9
    TIMEOUT = 10
    INTERNAL_ERROR = 11
    WRONG_SERVER = 12
    REQUEST_TOO_LARGE = 13
    INVALID_KEY = 14
    VALUE_TOO_LARGE = 15
    PROTOCOL_VERSION_MISMATCH = 16
    COULDNT_CONNECT = 17
    SERVICE_NOT_AVAILABLE = 18
    INVALID_OBJECT = 19
    INVALID_PARAMETER = 20
    BACKUP_OPEN_REJECTED = 21
    BACKUP_BAD_SEGMENT_ID = 22
    BACKUP_SEGMENT_OVERFLOW = 23
    BACKUP_OFFSET_MISMATCH = 24
    BACKUP_REPLICA_CLOSED = 25
    BACKUP_STORAGE_FAILED = 26
    SERVER_CRASHED = 27
    IN_PROGRESS = 28
    STALE_RPC = 29
    EXPIRED_LEASE = 30
    AUTHENTICATION_FAILED = 31
    PERMISSION_DENIED = 32

    @property
    def carries_operation_body(self) -> bool:
        """True when a response with this status carries the operation's own body.

        Success does, and so do the three object outcomes, so that a rejected client still
        learns the object's current version; every other status carries an error message.
        """
        return self in _OPERATION_BODY_STATUSES

    @property
    def description(self) -> str:
        """A short human-readable description, the same words the ``stratus`` CLI prints."""
        return _DESCRIPTIONS[self]

    @classmethod
    def from_code(cls, code: int) -> Status | None:
        """The status for a wire code, or None for a code this protocol version does not know."""
        try:
            return cls(code)
        except ValueError:
            return None


_OPERATION_BODY_STATUSES = frozenset(
    {Status.OK, Status.OBJECT_DOESNT_EXIST, Status.OBJECT_EXISTS, Status.WRONG_VERSION}
)

_DESCRIPTIONS = {
    Status.OK: "ok",
    Status.UNKNOWN_TABLET: "unknown tablet",
    Status.TABLE_DOESNT_EXIST: "table doesn't exist",
    Status.OBJECT_DOESNT_EXIST: "object doesn't exist",
    Status.OBJECT_EXISTS: "object exists",
    Status.WRONG_VERSION: "wrong version",
    Status.NO_TABLE_SPACE: "no master has room for the table",
    Status.REQUEST_FORMAT_ERROR: "malformed request",
    Status.UNIMPLEMENTED_REQUEST: "unimplemented request",
    Status.RETRY: "retry later",
    Status.TIMEOUT: "timed out",
    Status.INTERNAL_ERROR: "internal error",
    Status.WRONG_SERVER: "wrong server",
    Status.REQUEST_TOO_LARGE: "request too large",
    Status.INVALID_KEY: "invalid key (empty or longer than 65535 bytes)",
    Status.VALUE_TOO_LARGE: "value too large",
    Status.PROTOCOL_VERSION_MISMATCH: "protocol version mismatch",
    Status.COULDNT_CONNECT: "couldn't connect",
    Status.SERVICE_NOT_AVAILABLE: "service not available",
    Status.INVALID_OBJECT: "object is not an 8-byte integer",
    Status.INVALID_PARAMETER: "invalid parameter",
    Status.BACKUP_OPEN_REJECTED: "backup cannot open another replica",
    Status.BACKUP_BAD_SEGMENT_ID: "backup holds no replica of that segment",
    Status.BACKUP_SEGMENT_OVERFLOW: "write past the replica's capacity",
    Status.BACKUP_OFFSET_MISMATCH: "write offset does not match the replica's length",
    Status.BACKUP_REPLICA_CLOSED: "replica is closed",
    Status.BACKUP_STORAGE_FAILED: "backup storage failed",
    Status.SERVER_CRASHED: "server declared crashed",
    Status.IN_PROGRESS: "still in progress",
    Status.STALE_RPC: "stale rpc: its result was acknowledged already",
    Status.EXPIRED_LEASE: "client lease expired",
    Status.AUTHENTICATION_FAILED: "authentication failed",
    Status.PERMISSION_DENIED: "permission denied",
}
