"""A Python client for Stratus, speaking its native binary protocol.

    from stratus_client import Client, RejectRules, WrongVersion

    with Client("127.0.0.1:7400") as client:
        table = client.create_table("users", span=2)
        version = client.write(table, b"alice", b"hello")
        value, version = client.read(table, b"alice")

        tx = client.transaction()                  # multi-object, strictly serializable
        tx.increment(table, b"alice-balance", -10)
        tx.increment(table, b"bob-balance", 10)
        if not tx.commit():                        # a TxOutcome: committed, or an AbortReason
            ...

See ``Client`` for every operation, and ``errors`` for what each failure raises.
"""

from .client import Client
from .codec import TxDecision, TxOpName
from .enumeration import Enumeration, EnumerationPosition
from .errors import (
    AuthenticationFailed,
    CouldNotConnect,
    ExpiredLease,
    InternalError,
    InvalidKey,
    InvalidObject,
    InvalidParameter,
    NoTableSpace,
    ObjectDoesNotExist,
    ObjectExists,
    PermissionDenied,
    ProtocolError,
    ProtocolVersionMismatch,
    RequestFormatError,
    RequestTooLarge,
    RetryLater,
    ServiceNotAvailable,
    StaleRpc,
    StratusError,
    TableDoesNotExist,
    Timeout,
    TransactionAborted,
    Unavailable,
    UnimplementedRequest,
    UnknownTablet,
    ValueTooLarge,
    WrongServer,
    WrongVersion,
)
from .key_hash import key_hash
from .model import (
    ACCESS_ADMIN,
    ACCESS_READ,
    ACCESS_WRITE,
    AbortKind,
    Identity,
    IdentityKind,
    TableGrant,
    UserSummary,
    AbortReason,
    EnumeratedObject,
    Expiry,
    HashRange,
    IncrementItem,
    KeyItem,
    ObjectRead,
    RejectRules,
    ServerEntry,
    ServerStatus,
    TableEntry,
    TabletEntry,
    TabletState,
    Tier,
    TxOutcome,
    WriteItem,
)
from .status import Status
from .transaction import Transaction

__version__ = "0.1.0"

__all__ = [
    "ACCESS_ADMIN",
    "ACCESS_READ",
    "ACCESS_WRITE",
    "Identity",
    "IdentityKind",
    "TableGrant",
    "UserSummary",
    "AuthenticationFailed",
    "AbortKind",
    "AbortReason",
    "Client",
    "CouldNotConnect",
    "EnumeratedObject",
    "Enumeration",
    "EnumerationPosition",
    "ExpiredLease",
    "Expiry",
    "HashRange",
    "IncrementItem",
    "InternalError",
    "InvalidKey",
    "InvalidObject",
    "InvalidParameter",
    "KeyItem",
    "NoTableSpace",
    "ObjectDoesNotExist",
    "ObjectExists",
    "ObjectRead",
    "PermissionDenied",
    "ProtocolError",
    "ProtocolVersionMismatch",
    "RejectRules",
    "RequestFormatError",
    "RequestTooLarge",
    "RetryLater",
    "ServerEntry",
    "ServerStatus",
    "ServiceNotAvailable",
    "StaleRpc",
    "Status",
    "StratusError",
    "TableDoesNotExist",
    "TableEntry",
    "TabletEntry",
    "TabletState",
    "Tier",
    "Timeout",
    "Transaction",
    "TransactionAborted",
    "TxDecision",
    "TxOpName",
    "TxOutcome",
    "Unavailable",
    "UnimplementedRequest",
    "UnknownTablet",
    "ValueTooLarge",
    "WriteItem",
    "WrongServer",
    "WrongVersion",
    "key_hash",
]
