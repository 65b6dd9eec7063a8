"""A Python client for Stratus, speaking its native binary protocol.

    from stratus_client import Client, RejectRules, WrongVersion

    with Client("127.0.0.1:7400") as client:
        table = client.create_table("users", span=2)
        version = client.write(table, b"alice", b"hello")
        value, version = client.read(table, b"alice")

See ``Client`` for every operation, and ``errors`` for what each failure raises.
"""

from .client import Client
from .enumeration import Enumeration, EnumerationPosition
from .errors import (
    CouldNotConnect,
    InternalError,
    InvalidKey,
    InvalidObject,
    InvalidParameter,
    NoTableSpace,
    ObjectDoesNotExist,
    ObjectExists,
    ProtocolError,
    ProtocolVersionMismatch,
    RequestFormatError,
    RequestTooLarge,
    RetryLater,
    ServiceNotAvailable,
    StratusError,
    TableDoesNotExist,
    Timeout,
    Unavailable,
    UnimplementedRequest,
    UnknownTablet,
    ValueTooLarge,
    WrongServer,
    WrongVersion,
)
from .key_hash import key_hash
from .model import (
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
    WriteItem,
)
from .status import Status

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CouldNotConnect",
    "EnumeratedObject",
    "Enumeration",
    "EnumerationPosition",
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
    "ProtocolError",
    "ProtocolVersionMismatch",
    "RejectRules",
    "RequestFormatError",
    "RequestTooLarge",
    "RetryLater",
    "ServerEntry",
    "ServerStatus",
    "ServiceNotAvailable",
    "Status",
    "StratusError",
    "TableDoesNotExist",
    "TableEntry",
    "TabletEntry",
    "TabletState",
    "Timeout",
    "Unavailable",
    "UnimplementedRequest",
    "UnknownTablet",
    "ValueTooLarge",
    "WriteItem",
    "WrongServer",
    "WrongVersion",
    "key_hash",
]
