"""Typed errors: one exception class per status a caller may want to handle.

Every failure the client reports is a ``StratusError`` carrying the wire ``Status`` (so code that
logs or counts failures needs no table of classes), and a subclass per status (so code that
handles one outcome writes ``except ObjectExists``). Rejections by reject rules and reads of
missing objects also carry the object's current ``version`` (0 when it is missing), as the
server reports it.

``Unavailable`` groups the failures that may go away by themselves (the cluster is busy,
recovering, or unreachable); the client already retried those until the operation's timeout, so
when one reaches the caller it is a ``Timeout`` whose ``last_error`` says what was seen last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .status import Status

if TYPE_CHECKING:
    from .model import AbortReason

__all__ = [
    "AuthenticationFailed",
    "CouldNotConnect",
    "ExpiredLease",
    "InternalError",
    "InvalidKey",
    "InvalidObject",
    "InvalidParameter",
    "NoTableSpace",
    "ObjectDoesNotExist",
    "ObjectExists",
    "PermissionDenied",
    "ProtocolError",
    "ProtocolVersionMismatch",
    "RequestFormatError",
    "RequestTooLarge",
    "RetryLater",
    "ServiceNotAvailable",
    "StaleRpc",
    "StratusError",
    "TableDoesNotExist",
    "Timeout",
    "TransactionAborted",
    "Unavailable",
    "UnimplementedRequest",
    "UnknownTablet",
    "ValueTooLarge",
    "WrongServer",
    "WrongVersion",
    "error_for_status",
]

_OBJECT_OUTCOMES = frozenset(
    {Status.OBJECT_DOESNT_EXIST, Status.OBJECT_EXISTS, Status.WRONG_VERSION}
)


class StratusError(Exception):
    """A failed operation: its status, a detail message, and the object's current version.

    ``version`` is meaningful for the object outcomes (``OBJECT_DOESNT_EXIST``,
    ``OBJECT_EXISTS``, ``WRONG_VERSION``): it is the version the reject rules were checked
    against, so a caller doing optimistic concurrency can retry with it. It is 0 otherwise.
    """

    status: Status = Status.INTERNAL_ERROR

    def __init__(self, message: str = "", *, status: Status | None = None, version: int = 0):
        if status is not None:
            self.status = Status(status)
        self.message = message
        self.version = version
        super().__init__(self._describe())

    @property
    def status_name(self) -> str:
        """The status's name as in the wire specification, for example ``WRONG_VERSION``."""
        return self.status.name

    def _describe(self) -> str:
        text = f"{self.status.description} ({self.status.name})"
        if self.message:
            text += f": {self.message}"
        if self.status in _OBJECT_OUTCOMES:
            text += f" [current version {self.version}]"
        return text

    def __reduce__(self):
        # Keyword-only arguments are not restored by Exception's default pickling, and errors
        # cross process boundaries (multiprocessing, concurrent.futures).
        return (_rebuild_error, (type(self), self.message, self.status, self.version))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status.name}, message={self.message!r}, "
            f"version={self.version})"
        )


def _rebuild_error(cls, message, status, version):
    return cls(message, status=status, version=version)


class UnknownTablet(StratusError):
    """The master does not own the key's tablet (the client's tablet map was stale)."""

    status = Status.UNKNOWN_TABLET


class WrongServer(StratusError):
    """The request reached a server other than the one it was meant for."""

    status = Status.WRONG_SERVER


class TableDoesNotExist(StratusError):
    """No table with that name or id exists."""

    status = Status.TABLE_DOESNT_EXIST


class ObjectDoesNotExist(StratusError):
    """The object is missing: a read of a missing key, or the ``doesnt_exist`` reject rule."""

    status = Status.OBJECT_DOESNT_EXIST


class ObjectExists(StratusError):
    """The ``exists`` reject rule refused the operation; ``version`` is the object's version."""

    status = Status.OBJECT_EXISTS


class WrongVersion(StratusError):
    """A version reject rule refused the operation; ``version`` is the current version."""

    status = Status.WRONG_VERSION


class NoTableSpace(StratusError):
    """The coordinator has no master to place a tablet on."""

    status = Status.NO_TABLE_SPACE


class RequestFormatError(StratusError):
    """The server could not decode the request body."""

    status = Status.REQUEST_FORMAT_ERROR


class UnimplementedRequest(StratusError):
    """The server does not serve this opcode (unknown to it, or not served by its role)."""

    status = Status.UNIMPLEMENTED_REQUEST


class InternalError(StratusError):
    """An unexpected failure on the server; the message says what."""

    status = Status.INTERNAL_ERROR


class RequestTooLarge(StratusError):
    """The request frame would exceed the protocol's 16 MiB frame limit."""

    status = Status.REQUEST_TOO_LARGE


class InvalidKey(StratusError):
    """The key is empty or longer than 65 535 bytes."""

    status = Status.INVALID_KEY


class ValueTooLarge(StratusError):
    """The value is longer than the server's configured maximum."""

    status = Status.VALUE_TOO_LARGE


class InvalidObject(StratusError):
    """The object is not an 8-byte integer (or the increment would overflow it)."""

    status = Status.INVALID_OBJECT


class InvalidParameter(StratusError):
    """A request parameter is out of range (for example a server span of 0 or an empty name)."""

    status = Status.INVALID_PARAMETER


class StaleRpc(StratusError):
    """A master refused a mutation as an old duplicate: its rpc id is at or below what this
    client acknowledged. Nothing was applied. A correct client never sees it (it is a bug in
    the client's exactly-once bookkeeping, or in the server's), so it is not retried."""

    status = Status.STALE_RPC


class ExpiredLease(StratusError):
    """The client lease a mutation was sent under expired (nothing was applied). The client
    handles it itself (it takes a new lease, and sends the mutation again under it when no
    earlier attempt may have been applied); a caller sees it only as a ``Timeout``'s
    ``last_error``, or when the coordinator refuses to open a lease."""

    status = Status.EXPIRED_LEASE


class AuthenticationFailed(StratusError):
    """A server refused this client's password, or does not hold it itself (a wrong
    ``password``, an unknown or disabled ``user``, or a server of another cluster). Not
    retried."""

    status = Status.AUTHENTICATION_FAILED


class PermissionDenied(StratusError):
    """The server requires the cluster's client password and this client gave none (pass
    ``password=``), the client's named user lacks the grant the request needs (the message says
    which: ``Write needs -w- on table "logs", and user "alice" has r--``), the user was
    deleted or disabled, or the request is one only cluster members may send. Nothing was
    done; not retried."""

    status = Status.PERMISSION_DENIED


class Unavailable(StratusError):
    """The cluster could not serve the request now; trying again later may succeed."""


class RetryLater(Unavailable):
    """The server is temporarily unable to serve (for example its log is full)."""

    status = Status.RETRY


class CouldNotConnect(Unavailable):
    """The server could not be reached, or the connection broke before the response."""

    status = Status.COULDNT_CONNECT


class ServiceNotAvailable(Unavailable):
    """The service asked for is not running on this server (yet)."""

    status = Status.SERVICE_NOT_AVAILABLE


class Timeout(Unavailable):
    """The operation did not finish within its timeout, retries included.

    ``last_error`` is the failure seen on the last attempt (for example ``CouldNotConnect``
    while a master was down, or ``RetryLater`` while its tablets were recovering), or None when
    no attempt failed with an error of its own.
    """

    status = Status.TIMEOUT

    def __init__(
        self,
        message: str = "",
        *,
        status: Status | None = None,
        version: int = 0,
        last_error: StratusError | None = None,
    ):
        self.last_error = last_error
        super().__init__(message, status=status, version=version)

    def __reduce__(self):
        return (_rebuild_timeout, (self.message, self.last_error))


def _rebuild_timeout(message, last_error):
    return Timeout(message, last_error=last_error)


class TransactionAborted(StratusError):
    """``run_transaction`` gave up: the last attempt's commit aborted, for ``reason`` (an
    ``AbortReason``): a conflict on the last attempt the retry policy allows (or one the caller
    chose not to retry), or a timeout. Nothing of that attempt was applied. Its status is
    WRONG_VERSION for a conflict (an object was not at the version read) and TIMEOUT for a
    timeout (the transaction is aborted, not of unknown outcome: that is ``Timeout``)."""

    status = Status.WRONG_VERSION

    def __init__(
        self,
        message: str = "",
        *,
        status: Status | None = None,
        version: int = 0,
        reason: AbortReason | None = None,
    ):
        self.reason = reason
        super().__init__(message, status=status, version=version)

    def __reduce__(self):
        return (_rebuild_transaction_aborted, (self.message, self.status, self.reason))


def _rebuild_transaction_aborted(message, status, reason):
    return TransactionAborted(message, status=status, reason=reason)


class ProtocolError(StratusError):
    """The peer sent bytes that violate the wire protocol; the connection was closed.

    Not retried: garbage means a peer that is not a Stratus server of this protocol version (or
    a bug), not a passing condition.
    """

    status = Status.INTERNAL_ERROR


class ProtocolVersionMismatch(ProtocolError):
    """The server speaks another protocol version than this client (handshake refused)."""

    status = Status.PROTOCOL_VERSION_MISMATCH


_CLASS_BY_STATUS: dict[Status, type[StratusError]] = {
    error_class.status: error_class
    for error_class in (
        UnknownTablet,
        WrongServer,
        TableDoesNotExist,
        ObjectDoesNotExist,
        ObjectExists,
        WrongVersion,
        NoTableSpace,
        RequestFormatError,
        UnimplementedRequest,
        InternalError,
        RequestTooLarge,
        InvalidKey,
        ValueTooLarge,
        InvalidObject,
        InvalidParameter,
        StaleRpc,
        ExpiredLease,
        AuthenticationFailed,
        PermissionDenied,
        RetryLater,
        CouldNotConnect,
        ServiceNotAvailable,
        Timeout,
        ProtocolVersionMismatch,
    )
}


def error_for_status(status: Status, message: str = "", version: int = 0) -> StratusError:
    """The typed error for a non-OK ``status`` (a plain ``StratusError`` for server-only ones)."""
    status = Status(status)
    if status is Status.OK:
        raise ValueError("OK is not an error")
    error_class = _CLASS_BY_STATUS.get(status, StratusError)
    return error_class(message, status=status, version=version)
