"""The values the client exchanges with its caller and with the cluster.

Everything here is immutable: items, rules and tablet maps are shared between the caller, the
tablet-map cache and requests being retried, and none of them may change under another.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from .status import Status

__all__ = [
    "ACCESS_ADMIN",
    "ACCESS_READ",
    "ACCESS_WRITE",
    "Identity",
    "IdentityKind",
    "TableGrant",
    "UserSummary",
    "AbortKind",
    "AbortReason",
    "EnumeratedObject",
    "EnumerationCursor",
    "HashRange",
    "IncrementItem",
    "KeyItem",
    "RejectRules",
    "ServerEntry",
    "ServerStatus",
    "TableEntry",
    "TabletEntry",
    "TabletState",
    "Tier",
    "TxOutcome",
    "WriteItem",
]

HASH_MAX = (1 << 64) - 1

REJECT_DOESNT_EXIST = 1 << 0
REJECT_EXISTS = 1 << 1
REJECT_VERSION_LE_GIVEN = 1 << 2
REJECT_VERSION_NE_GIVEN = 1 << 3
REJECT_FLAGS_KNOWN = (
    REJECT_DOESNT_EXIST | REJECT_EXISTS | REJECT_VERSION_LE_GIVEN | REJECT_VERSION_NE_GIVEN
)


@dataclass(frozen=True)
class RejectRules:
    """Conditions under which the server refuses an operation; all false means unconditional.

    The names are the wire specification's ("reject rules" in docs/design/wire-protocol.md).
    The server checks them in this order against the object's current version, 0 when the
    object is missing, and the first that matches decides:

    - ``doesnt_exist``: refuse if the object is missing (``ObjectDoesNotExist``);
    - ``exists``: refuse if the object exists (``ObjectExists``);
    - ``version_le_given``: refuse if current version <= ``given_version`` (``WrongVersion``);
    - ``version_ne_given``: refuse if current version != ``given_version`` (``WrongVersion``).

    A READ of a missing object answers ``ObjectDoesNotExist`` before any rule is checked.
    """

    given_version: int = 0
    doesnt_exist: bool = False
    exists: bool = False
    version_le_given: bool = False
    version_ne_given: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.given_version, int) or not 0 <= self.given_version <= HASH_MAX:
            raise ValueError(f"given_version {self.given_version!r} is not a 64-bit version")

    @classmethod
    def only_if_missing(cls) -> RejectRules:
        """Proceed only if the object does not exist yet (create, never overwrite)."""
        return cls(exists=True)

    @classmethod
    def only_if_exists(cls) -> RejectRules:
        """Proceed only if the object exists (update, never create)."""
        return cls(doesnt_exist=True)

    @classmethod
    def only_if_version(cls, version: int) -> RejectRules:
        """Proceed only if the object's current version is ``version`` (0: only if missing)."""
        return cls(given_version=version, version_ne_given=True)

    @classmethod
    def only_if_newer_than(cls, version: int) -> RejectRules:
        """Proceed only if the object's current version is greater than ``version``."""
        return cls(given_version=version, version_le_given=True)

    @property
    def flags(self) -> int:
        """The flags byte on the wire: bit 0 doesnt_exist, 1 exists, 2 version_le_given,
        3 version_ne_given."""
        return (
            (REJECT_DOESNT_EXIST if self.doesnt_exist else 0)
            | (REJECT_EXISTS if self.exists else 0)
            | (REJECT_VERSION_LE_GIVEN if self.version_le_given else 0)
            | (REJECT_VERSION_NE_GIVEN if self.version_ne_given else 0)
        )

    @classmethod
    def from_wire(cls, given_version: int, flags: int) -> RejectRules:
        """The rules for a wire (given version, flags byte) pair; unknown flag bits are refused."""
        if flags & ~REJECT_FLAGS_KNOWN:
            raise ValueError(f"reject rule flags {flags:#04x} have undefined bits set")
        return cls(
            given_version=given_version,
            doesnt_exist=bool(flags & REJECT_DOESNT_EXIST),
            exists=bool(flags & REJECT_EXISTS),
            version_le_given=bool(flags & REJECT_VERSION_LE_GIVEN),
            version_ne_given=bool(flags & REJECT_VERSION_NE_GIVEN),
        )

    def check(self, current_version: int) -> Status:
        """The status the server answers for an object at ``current_version`` (0: missing).

        The client never needs this to talk to the cluster; it states the rules' semantics in
        code so that they can be tested and read in one place.
        """
        exists = current_version != 0
        if self.doesnt_exist and not exists:
            return Status.OBJECT_DOESNT_EXIST
        if self.exists and exists:
            return Status.OBJECT_EXISTS
        if self.version_le_given and current_version <= self.given_version:
            return Status.WRONG_VERSION
        if self.version_ne_given and current_version != self.given_version:
            return Status.WRONG_VERSION
        return Status.OK


NO_REJECT_RULES = RejectRules()


@dataclass(frozen=True)
class HashRange:
    """A range of key hashes, both ends inclusive (``start <= end``)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= HASH_MAX:
            raise ValueError(f"hash range [{self.start:#x}, {self.end:#x}] is not valid")

    def contains(self, key_hash: int) -> bool:
        return self.start <= key_hash <= self.end

    def intersection(self, other: HashRange) -> HashRange | None:
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        return HashRange(start, end) if start <= end else None


FULL_HASH_RANGE = HashRange(0, HASH_MAX)


@dataclass(frozen=True)
class EnumerationCursor:
    """Where an enumeration of a hash range resumes (wire-protocol.md, "Enumeration order").

    Objects are returned in ascending (bit-reversed key hash, key) order; the cursor means:
    resume at bit-reversed hash ``reversed_hash``, skipping the objects at exactly that reversed
    hash whose key is <= ``after_key`` when ``after_key`` is set (they were returned already).
    """

    reversed_hash: int = 0
    after_key: bytes | None = None


class TabletState(enum.IntEnum):
    """A tablet's state in the tablet map (a ``u8`` on the wire)."""

    NORMAL = 0
    RECOVERING = 1
    """Its master crashed; the tablet is served again once recovery finishes."""
    UNAVAILABLE = 2
    """Its master crashed and its log cannot be recovered: unavailable until an operator
    accepts the loss (``stratus recovery accept-loss``) or a backup holding the log returns."""


@dataclass(frozen=True)
class TabletEntry:
    """One tablet of the coordinator's tablet map: a hash range of a table and its master."""

    table_id: int
    range: HashRange
    owner_server_id: int
    owner_address: str
    state: TabletState

    @property
    def recovering(self) -> bool:
        return self.state == TabletState.RECOVERING


class ServerStatus(enum.IntEnum):
    """A server's state in the coordinator's server list (a ``u8`` on the wire)."""

    UP = 0
    CRASHED = 1
    """Declared crashed; its tablets are being recovered elsewhere."""
    REMOVED = 2
    """Recovered: it is gone for good."""
    STOPPED = 3
    """Stopped in order; its tablets are being recovered elsewhere, as a crashed server's."""


SERVICE_MASTER = 1 << 0
SERVICE_BACKUP = 1 << 1
SERVICE_UNREPLICATED = 1 << 2
"""Not a service: the master keeps no replicas (R = 0), so its data cannot be recovered."""
SERVICES_KNOWN = SERVICE_MASTER | SERVICE_BACKUP | SERVICE_UNREPLICATED


@dataclass(frozen=True)
class ServerEntry:
    """One server as GET_SERVER_LIST reports it."""

    server_id: int
    address: str
    services: int
    """Bit 0: runs a master; bit 1: runs a backup; bit 2: its master keeps no replicas."""
    status: ServerStatus
    failure_domain: str = ""
    """The server's failure domain (e.g. its rack), empty for none."""

    @property
    def is_master(self) -> bool:
        return bool(self.services & SERVICE_MASTER)

    @property
    def is_backup(self) -> bool:
        return bool(self.services & SERVICE_BACKUP)


class Tier(enum.IntEnum):
    """Where a table's objects live on the masters that serve it, chosen when the table is
    created and never changed (a ``u8`` on the wire). ``str(tier)`` is the name the ``stratus``
    command takes and shows (``memory``, ``flash``, ``auto``)."""

    MEMORY = 0
    """In the masters' log-structured memory (the default)."""
    FLASH = 1
    """On the masters' flash logs, with only their index (and a small reference each) in
    memory, so a table may be many times the servers' memory."""
    AUTO = 2
    """The working set in memory, the rest on flash, moved by the masters: objects not read or
    written for longest go to flash past each server's memory budget for auto tables, and one
    read on flash comes back."""

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, tier: Tier | str) -> Tier:
        """``tier`` itself, or the tier named ``tier`` (``"memory"``, ``"flash"`` or ``"auto"``, any case);
        ``ValueError`` for anything else (never a guess: a table's tier cannot change)."""
        if isinstance(tier, Tier):
            return tier
        if isinstance(tier, str):
            found = cls.__members__.get(tier.upper())
            if found is not None:
                return found
        names = ", ".join(repr(str(known)) for known in cls)
        raise ValueError(f"tier {tier!r} is not one of {names}")


@dataclass(frozen=True)
class TableEntry:
    """One table as LIST_TABLES reports it."""

    name: str
    table_id: int
    tablet_count: int
    tier: Tier = Tier.MEMORY
    """Where its objects live."""


class EnumeratedObject(NamedTuple):
    """One object returned by an enumeration; unpacks as ``key, value, version``."""

    key: bytes
    value: bytes
    version: int


@dataclass(frozen=True)
class KeyItem:
    """An item of ``multi_read`` or ``multi_remove``."""

    table_id: int
    key: bytes | str
    reject_rules: RejectRules | None = None


@dataclass(frozen=True)
class Expiry:
    """What a write does to its object's expiry (wire-protocol.md, field "expiry").

    ``Expiry.NEVER`` (what a plain write means: it clears an expiry the object had),
    ``Expiry.KEEP`` (keep the expiry of the object replaced), ``Expiry.after(seconds)`` (a time
    to live, counted by the master's clock from when it applies the write) or
    ``Expiry.at(unix_seconds)`` (a wall-clock time, compared with the master's clock).
    """

    kind: int
    millis: int = 0

    NEVER_KIND = 0
    KEEP_KIND = 1
    AFTER_KIND = 2
    AT_KIND = 3

    @staticmethod
    def after(seconds: float) -> Expiry:
        """Expire ``seconds`` after the master applies the write (0 or less: at once)."""
        return Expiry(Expiry.AFTER_KIND, max(0, round(seconds * 1000)))

    @staticmethod
    def at(unix_seconds: float) -> Expiry:
        """Expire at this Unix time, by the master's clock."""
        return Expiry(Expiry.AT_KIND, max(0, round(unix_seconds * 1000)))


Expiry.NEVER = Expiry(Expiry.NEVER_KIND)
Expiry.KEEP = Expiry(Expiry.KEEP_KIND)


class ObjectRead(NamedTuple):
    """An object as ``read_object`` found it; unpacks as ``value, version, expires_in``."""

    value: bytes
    version: int
    expires_in: float | None
    """Seconds until it expires, by its master's clock when it answered; None: never."""


@dataclass(frozen=True)
class WriteItem:
    """An item of ``multi_write``."""

    table_id: int
    key: bytes | str
    value: bytes | str
    reject_rules: RejectRules | None = None
    expiry: Expiry | None = None


@dataclass(frozen=True)
class IncrementItem:
    """An item of ``multi_increment``: add ``delta`` to an 8-byte little-endian integer."""

    table_id: int
    key: bytes | str
    delta: int
    reject_rules: RejectRules | None = None


class AbortKind(enum.Enum):
    """Why a transaction aborted (``AbortReason.kind``)."""

    CONFLICT = "conflict"
    """An object changed since the transaction read it, or another transaction held it (its
    master voted ABORT). Running the transaction again may commit: ``run_transaction`` does."""

    TIMEOUT = "timeout"
    """Not every vote could be learnt by the operation's deadline (a master could not be
    reached, or answered RETRY throughout); the client then asked the masters of the ops
    without a vote for their final votes (TX_REQUEST_ABORT, which records ABORT for an op that
    had not voted), and not every one was PREPARED, so the transaction can never commit."""


@dataclass(frozen=True)
class AbortReason:
    """Why a transaction aborted: ``kind``, and for a conflict the object (``table_id``,
    ``key``) whose master voted ABORT."""

    kind: AbortKind
    table_id: int = 0
    key: bytes = b""

    TIMEOUT: ClassVar[AbortReason]

    @classmethod
    def conflict(cls, table_id: int, key: bytes) -> AbortReason:
        return cls(AbortKind.CONFLICT, table_id, key)

    @property
    def is_conflict(self) -> bool:
        return self.kind is AbortKind.CONFLICT

    def __str__(self) -> str:
        if self.kind is AbortKind.CONFLICT:
            key = self.key.decode("utf-8", errors="replace")
            return (
                f"conflict on key {key} of table {self.table_id}: it changed since the "
                "transaction read it, or another transaction held it"
            )
        return (
            "not every participant's vote could be learnt in time, and one made final then "
            "was ABORT"
        )


AbortReason.TIMEOUT = AbortReason(AbortKind.TIMEOUT)


@dataclass(frozen=True)
class TxOutcome:
    """How a transaction's commit ended, when its outcome is known: ``committed`` (every op
    was prepared: its writes are applied, as of one instant between the call of ``commit`` and
    its return), or aborted (nothing of it was applied, and nothing will be) for ``reason``.
    True exactly when committed."""

    committed: bool
    reason: AbortReason | None = None

    COMMITTED: ClassVar[TxOutcome]

    def __post_init__(self) -> None:
        if self.committed != (self.reason is None):
            raise ValueError("a committed transaction has no abort reason; an aborted one has one")

    @classmethod
    def aborted(cls, reason: AbortReason) -> TxOutcome:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.committed


TxOutcome.COMMITTED = TxOutcome(True)


# Access bits of a grant, as on the wire (one byte).
ACCESS_READ = 1
ACCESS_WRITE = 2
ACCESS_ADMIN = 4
_ACCESS_LETTERS = {"r": ACCESS_READ, "w": ACCESS_WRITE, "a": ACCESS_ADMIN}


@dataclass(frozen=True)
class TableGrant:
    """What a named user may do on the tables whose names match ``pattern`` (``*`` any run of
    characters, ``?`` one character): ``access`` is a set of bits (``ACCESS_READ``,
    ``ACCESS_WRITE``, ``ACCESS_ADMIN``), or give letters with ``TableGrant.parse("logs*=rw")``."""

    pattern: str
    access: int

    @classmethod
    def parse(cls, text: str) -> TableGrant:
        """``PATTERN=LETTERS`` (letters r, w, a in any order), the CLI's form."""
        pattern, separator, letters = text.rpartition("=")
        access = 0
        for letter in letters.lower():
            if letter not in _ACCESS_LETTERS:
                raise ValueError(f"grant {text!r}: access letters are r, w and a")
            access |= _ACCESS_LETTERS[letter]
        if not separator or not pattern or access == 0:
            raise ValueError(f"grant {text!r} is not PATTERN=rwa")
        return cls(pattern, access)

    def __str__(self) -> str:
        letters = "".join(
            letter for letter, bit in _ACCESS_LETTERS.items() if self.access & bit
        )
        return f"{self.pattern}={letters}"


@dataclass(frozen=True)
class UserSummary:
    """A named user as ``Client.list_users`` shows it (no keys)."""

    name: str
    enabled: bool
    has_password: bool
    grants: tuple[TableGrant, ...]


class IdentityKind(enum.IntEnum):
    """Who a connection is (WHO_AM_I's first byte)."""

    OPEN = 0  # the cluster has no cluster secret: everyone may do everything
    MEMBER = 1  # a cluster member (proved the cluster secret)
    DEFAULT = 2  # the default user (proved the client password)
    ANONYMOUS = 3  # proved nothing, on a cluster that requires no client password
    USER = 4  # a named user


@dataclass(frozen=True)
class Identity:
    """Who the cluster takes a client for (``Client.who_am_i``); ``name`` and ``grants`` only
    for a named user."""

    kind: IdentityKind
    name: str | None = None
    grants: tuple[TableGrant, ...] = ()

    @property
    def user_name(self) -> str:
        """The user's name, or ``default`` (as Redis's ACL WHOAMI)."""
        return self.name if self.kind is IdentityKind.USER and self.name else "default"
