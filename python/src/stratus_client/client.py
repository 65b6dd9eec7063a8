"""The client: tables, objects, multi-operations and enumeration over a Stratus cluster.

Routing works like the Rust client (crates/stratus-client). The coordinator is asked once for a
table's tablet map (GET_TABLET_MAP), which is cached; each object request goes straight to the
master owning the key's hash. When a master answers UNKNOWN_TABLET or WRONG_SERVER, or cannot
be reached, the cached map is dropped and fetched again; RETRY (and a tablet whose master is
being recovered) means waiting and trying again. Waits follow a bounded exponential backoff with
jitter, and every operation has one deadline, ``timeout`` seconds after it starts, that bounds
all of its attempts together: when it passes the operation fails with ``Timeout``, whose
``last_error`` says what the last attempt saw.

Mutations are exactly-once (RIFL, docs/design/exactly-once.md; ``exactly_once.py``): each
write, set_expiry, remove and increment, and each item of a mutating multi-operation, carries
the client's lease and an rpc id of its own, the same in every attempt, so that a mutation
retried after a timeout, a lost connection or RETRY is applied once and the retry gets the
first result. A client made with ``exactly_once=False`` sends no identity: a mutation retried
then may be applied twice (an ``increment``'s delta added twice).
"""

from __future__ import annotations

import bisect
import os
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from . import codec, credentials
from .codec import ClientLeaseGrant, MultiItemResult, Opcode, RpcIdentity
from .connection import Connection, parse_address
from .enumeration import Enumeration, EnumerationPosition
from .errors import (
    CouldNotConnect,
    InternalError,
    InvalidKey,
    InvalidParameter,
    ProtocolError,
    RetryLater,
    StratusError,
    TableDoesNotExist,
    Timeout,
    Unavailable,
    UnknownTablet,
    WrongServer,
    error_for_status,
)
from .exactly_once import LeaseAgent, RpcTicket, outcome_unknown
from .key_hash import key_hash
from .model import (
    HASH_MAX,
    Expiry,
    Identity,
    TableGrant,
    UserSummary,
    IncrementItem,
    KeyItem,
    ObjectRead,
    RejectRules,
    ServerEntry,
    TableEntry,
    TabletEntry,
    TabletState,
    Tier,
    WriteItem,
)
from .retry import Attempts, failure_from_response
from .status import Status

if TYPE_CHECKING:
    from .codec import TxDecision, TxOpName
    from .model import AbortReason
    from .transaction import Transaction

__all__ = ["Client"]

_Result = TypeVar("_Result")

# Statuses after which the same request may succeed once the tablet map has been refreshed.
_STALE_MAP_STATUSES = frozenset({Status.UNKNOWN_TABLET, Status.WRONG_SERVER})
# Statuses after which the same request may succeed after a short wait.
_TRANSIENT_STATUSES = frozenset({Status.RETRY, Status.SERVICE_NOT_AVAILABLE})
# Failures of an attempt that the next attempt may not see: the map was stale, or the cluster
# was busy, recovering or unreachable. Everything else is the operation's answer.
_RETRYABLE_ERRORS = (Unavailable, UnknownTablet, WrongServer)
# The multi-operations that change objects: their items carry rpc identities.
_MUTATING_MULTI_OPCODES = frozenset(
    {Opcode.MULTI_WRITE, Opcode.MULTI_REMOVE, Opcode.MULTI_INCREMENT}
)


def _may_have_run(error: StratusError) -> bool:
    """Whether an attempt that failed with ``error`` (and is to be retried) may have reached a
    master and been applied there: anything but a map found stale or a request that never
    left the client. Connection failures say which (``request_sent``); a status a master
    answered, such as RETRY, counts (the master may have applied the mutation without
    confirming it yet)."""
    if isinstance(error, (UnknownTablet, WrongServer)):
        return False
    return getattr(error, "request_sent", True)


_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def _as_bytes(data: bytes | bytearray | memoryview | str, what: str) -> bytes:
    """Keys and values are bytes; ``str`` is accepted for convenience and encoded as UTF-8."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


def _checked_key(key: bytes | str) -> bytes:
    key = _as_bytes(key, "key")
    if not 1 <= len(key) <= codec.KEY_BYTES_MAX:
        raise InvalidKey(f"key of {len(key)} bytes (keys are 1..{codec.KEY_BYTES_MAX} bytes)")
    return key


def _checked_table_id(table_id: int) -> int:
    if isinstance(table_id, bool) or not isinstance(table_id, int):
        raise TypeError(f"table id must be an int, not {type(table_id).__name__}")
    if not 0 <= table_id <= HASH_MAX:
        raise ValueError(f"table id {table_id} is not a 64-bit id")
    if table_id == 0:
        # 0 means "no table" on the wire (and "every table" to GET_TABLET_MAP).
        raise TableDoesNotExist("table id 0 names no table")
    return table_id


def _checked_delta(delta: int) -> int:
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise TypeError(f"delta must be an int, not {type(delta).__name__}")
    if not _I64_MIN <= delta <= _I64_MAX:
        raise ValueError(f"delta {delta} does not fit a signed 64-bit integer")
    return delta


def _checked_rules(rules: RejectRules | None) -> RejectRules | None:
    if rules is not None and not isinstance(rules, RejectRules):
        raise TypeError(f"reject_rules must be RejectRules, not {type(rules).__name__}")
    return rules


def _checked_table_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"table name must be str, not {type(name).__name__}")
    length = len(name.encode("utf-8"))
    if not 1 <= length <= codec.TABLE_NAME_BYTES_MAX:
        raise InvalidParameter(
            f"table name of {length} bytes (names are 1..{codec.TABLE_NAME_BYTES_MAX} bytes "
            "of UTF-8)"
        )
    return name


class Client:
    """A connection to a Stratus cluster through its coordinator.

    ``timeout`` bounds each operation, retries included (seconds); ``request_timeout`` bounds
    one request to one server and ``connect_timeout`` one connection attempt (handshake
    included), both within the operation's timeout. One socket is kept per server.

    A client may be shared by threads: requests to the same server take turns on its one
    connection. Use it as a context manager, or call ``close()``, to close its sockets.

    ``exactly_once`` (the default) makes every mutation exactly-once: the client opens a lease
    at the coordinator on its first mutation and sends each mutation with its own rpc id under
    it, so retrying one after a timeout, a lost connection or RETRY is safe. A mutation whose
    lease expired after an attempt that may have been applied fails with ``Timeout`` (its
    outcome is unknown). With ``exactly_once=False`` no lease is taken and no identity sent
    (a mutation retried after a lost answer may be applied twice).

    ``password`` is the cluster's client password, for a cluster whose servers were started with
    ``--client-password-file``: every connection proves it before its first request (and checks
    that the server holds it too). It needs the ``argon2-cffi`` package
    (``pip install 'stratus-client[password]'``).

    ``user`` names a named user of the cluster (created by a cluster administrator with
    ``stratus user set`` or ``set_user``); ``password`` is then that user's password, proved
    on every connection instead of the client password (the keys derived from it are kept per
    salt, so the Argon2id is paid once, not per connection), and the cluster allows what the
    user's grants allow: anything else raises ``PermissionDenied`` at once.

    ``tls_ca_file`` is the CA that signed the servers' certificates, for a cluster whose servers
    were started with ``--tls-cert-file`` (``stratus up --secure`` writes it to DIR/tls/ca.pem):
    every connection then speaks TLS and trusts that CA alone. ``tls_cert_file`` and
    ``tls_key_file`` are the client's own certificate and key, for servers that ask clients
    for one (``--tls-client-certificates``).
    """

    def __init__(
        self,
        coordinator: str = "127.0.0.1:7400",
        timeout: float = 10.0,
        *,
        request_timeout: float = 2.0,
        connect_timeout: float = 2.0,
        exactly_once: bool = True,
        password: str | bytes | None = None,
        user: str | None = None,
        tls_ca_file: str | os.PathLike[str] | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        # Several addresses, comma-separated: the coordinators of a cluster with standbys (one is
        # active and listens). Malformed addresses are refused now, not at the first call.
        self.coordinators = [a.strip() for a in coordinator.split(",") if a.strip()] or [coordinator]
        for address in self.coordinators:
            parse_address(address)
        for name, seconds in (
            ("timeout", timeout),
            ("request_timeout", request_timeout),
            ("connect_timeout", connect_timeout),
        ):
            if not seconds > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {seconds!r}")
        self.coordinator = coordinator
        self.timeout = float(timeout)
        self.request_timeout = float(request_timeout)
        self.connect_timeout = float(connect_timeout)
        self._lock = threading.Lock()
        self._connections: dict[str, Connection] = {}
        self._tablet_maps: dict[int, tuple[list[int], list[TabletEntry]]] = {}
        self._closed = False
        self._coordinator_index = 0  # the coordinator address that answered last
        self.exactly_once = bool(exactly_once)
        # The client password's key, derived once (slow on purpose), for clusters that require
        # one (servers started with --client-password-file).
        self._password_key: bytes | None = None
        self._user: credentials.UserPassword | None = None
        if user is not None:
            if password is None:
                raise ValueError("a user needs its password: pass password= with user=")
            self._user = credentials.UserPassword(user, password)
        elif password is not None:
            self._password_key = credentials.client_key(password)
        self._tls = _tls_context(tls_ca_file, tls_cert_file, tls_key_file)
        # The lease and rpc ids of exactly-once mutations (and of transactions' ops).
        self._lease_agent = LeaseAgent(self._client_lease_call)
        # Threads sending a transaction phase's requests to several masters at once; made by
        # the first transaction that needs them.
        self._executor: ThreadPoolExecutor | None = None

    # -----------------------------------------------------------------------------------------
    # Lifetime.

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exception_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every connection. Further calls raise ``RuntimeError``."""
        with self._lock:
            self._closed = True
            connections = list(self._connections.values())
            self._connections.clear()
            self._tablet_maps.clear()
            executor, self._executor = self._executor, None
        for connection in connections:
            connection.close()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    # -----------------------------------------------------------------------------------------
    # Tables (coordinator).

    def create_table(self, name: str, span: int = 1, tier: Tier | str = Tier.MEMORY) -> int:
        """Creates a table spread over ``span`` masters (1..1024) whose objects live in
        ``tier`` (``"memory"``, the default, ``"flash"`` or ``"auto"``; or a ``Tier``); returns its id.

        Creating a table whose name exists returns the existing table's id if it has the same
        tier, and raises ``InvalidParameter`` if it has another (a table's tier never changes).
        """
        name = _checked_table_name(name)
        if isinstance(span, bool) or not isinstance(span, int) or not 0 <= span < 1 << 32:
            raise ValueError(f"span {span!r} is not a server count")
        body = codec.create_table_body(name, span, Tier.parse(tier))
        return self._coordinator_operation(f"create_table({name!r})", Opcode.CREATE_TABLE, body)

    def drop_table(self, name: str) -> None:
        """Drops a table and all its objects. ``TableDoesNotExist`` if there is no such table,
        unless an earlier attempt of this call may have dropped it (its answer lost: a timeout,
        a broken connection, or RETRY): then the table is gone, as asked, and the call returns.
        """
        name = _checked_table_name(name)
        attempts = Attempts(f"drop_table({name!r})", self.timeout)
        body = codec.table_name_body(name)
        ambiguous = False
        while True:
            try:
                self._coordinator_request(Opcode.DROP_TABLE, body, attempts)
                break
            except TableDoesNotExist:
                if not ambiguous:
                    raise
                break
            except _RETRYABLE_ERRORS as error:
                # CouldNotConnect covers a connection that broke after the request went out as
                # well as one never made; both count (the Rust client tells them apart).
                ambiguous = ambiguous or isinstance(error, Unavailable)
                attempts.wait_before_retry(error)
        # As the Rust client: forget every map, since the dropped table's id is not known here.
        with self._lock:
            self._tablet_maps.clear()

    def get_table_id(self, name: str) -> int:
        """The id of the table named ``name``; ``TableDoesNotExist`` if there is none."""
        name = _checked_table_name(name)
        return self._coordinator_operation(
            f"get_table_id({name!r})", Opcode.GET_TABLE_ID, codec.table_name_body(name)
        )

    def list_tables(self) -> list[TableEntry]:
        """Every table: name, id, number of tablets and tier."""
        return self._coordinator_operation("list_tables()", Opcode.LIST_TABLES, b"")

    # -----------------------------------------------------------------------------------------
    # Named users (coordinator).

    def who_am_i(self) -> Identity:
        """Who the cluster takes this client for: a named user (with its grants), the default
        user (the client password), a member, an anonymous client or an open cluster's."""
        return self._coordinator_operation("who_am_i()", Opcode.WHO_AM_I, b"")

    def set_user(
        self,
        name: str,
        *,
        password: str | bytes | None = None,
        enabled: bool = True,
        grants: Iterable[TableGrant | str] = (),
    ) -> bool:
        """Creates the user, or replaces its enabled flag, its grants and (if ``password`` is
        given) its password; True if it did not exist. The password is turned into stored keys
        here (one Argon2id with a fresh salt), so it never leaves this process. A grant is a
        ``TableGrant`` or its text form ``"PATTERN=rw"``. Needs a cluster administrator (or
        the client password): ``PermissionDenied`` otherwise."""
        name = credentials.check_user_name(name)
        parsed = tuple(
            grant if isinstance(grant, TableGrant) else TableGrant.parse(grant) for grant in grants
        )
        if len(parsed) > codec.GRANTS_PER_USER_MAX:
            raise InvalidParameter(
                f"a user has at most {codec.GRANTS_PER_USER_MAX} grants, not {len(parsed)}"
            )
        keys = None if password is None else credentials.new_user_credentials(password)
        body = codec.set_user_body(name, bool(enabled), keys, parsed)
        return self._coordinator_operation(f"set_user({name!r})", Opcode.SET_USER, body)

    def delete_user(self, name: str) -> bool:
        """Deletes the user; True if it existed. Its open connections are refused from their
        next request on. Needs a cluster administrator."""
        body = codec.user_name_body(credentials.check_user_name(name))
        return self._coordinator_operation(f"delete_user({name!r})", Opcode.DELETE_USER, body)

    def list_users(self) -> list[UserSummary]:
        """Every named user, without keys. Needs a cluster administrator."""
        return self._coordinator_operation("list_users()", Opcode.LIST_USERS, b"")

    def server_list(self) -> list[ServerEntry]:
        """Every server the coordinator knows: id, address, services and status."""
        return self._coordinator_operation("server_list()", Opcode.GET_SERVER_LIST, b"")

    def tablet_map(self, table_id: int) -> list[TabletEntry]:
        """The tablets of a table, fresh from the coordinator (and now cached)."""
        table_id = _checked_table_id(table_id)
        attempts = Attempts(f"tablet_map({table_id})", self.timeout)
        return self._retrying(attempts, lambda: list(self._fetch_tablet_map(table_id, attempts)))

    # -----------------------------------------------------------------------------------------
    # Objects (masters).

    def read(
        self, table_id: int, key: bytes | str, reject_rules: RejectRules | None = None
    ) -> tuple[bytes, int]:
        """The value and version of an object; ``ObjectDoesNotExist`` if it is missing (or
        expired)."""
        value, version, _ = self.read_object(table_id, key, reject_rules)
        return value, version

    def read_object(
        self, table_id: int, key: bytes | str, reject_rules: RejectRules | None = None
    ) -> ObjectRead:
        """The value, version and time to live (seconds, None: no expiry) of an object;
        ``ObjectDoesNotExist`` if it is missing (or expired)."""
        table_id, key = _checked_table_id(table_id), _checked_key(key)
        body = codec.read_body(table_id, key, _checked_rules(reject_rules))
        version, value, expires_in_millis = self._object_operation(
            "read", Opcode.READ, table_id, key, lambda rpc: body
        )
        expires_in = expires_in_millis / 1000 if expires_in_millis else None
        return ObjectRead(value, version, expires_in)

    def write(
        self,
        table_id: int,
        key: bytes | str,
        value: bytes | str,
        reject_rules: RejectRules | None = None,
        expiry: Expiry | None = None,
        ttl: float | None = None,
    ) -> int:
        """Writes an object (creating or overwriting it); returns its new version. It expires
        as ``expiry`` says, or ``ttl`` seconds after the master applies the write; with
        neither it does not expire (an expiry it had is cleared)."""
        if ttl is not None:
            if expiry is not None:
                raise ValueError("give expiry or ttl, not both")
            expiry = Expiry.after(ttl)
        table_id, key = _checked_table_id(table_id), _checked_key(key)
        value, rules = _as_bytes(value, "value"), _checked_rules(reject_rules)
        return self._mutation(
            "write",
            Opcode.WRITE,
            table_id,
            key,
            lambda rpc: codec.write_body(table_id, key, value, rules, expiry, rpc),
        )

    def set_expiry(
        self,
        table_id: int,
        key: bytes | str,
        expiry: Expiry,
        reject_rules: RejectRules | None = None,
    ) -> int:
        """Sets when an existing object expires (``Expiry.NEVER``: never), keeping its value;
        returns its new version. ``ObjectDoesNotExist`` if it is missing or expired."""
        table_id, key = _checked_table_id(table_id), _checked_key(key)
        rules = _checked_rules(reject_rules)
        return self._mutation(
            "set_expiry",
            Opcode.SET_EXPIRY,
            table_id,
            key,
            lambda rpc: codec.set_expiry_body(table_id, key, expiry, rules, rpc),
        )

    def remove(
        self, table_id: int, key: bytes | str, reject_rules: RejectRules | None = None
    ) -> int:
        """Removes an object; returns the removed version, 0 if it was missing."""
        table_id, key = _checked_table_id(table_id), _checked_key(key)
        rules = _checked_rules(reject_rules)
        return self._mutation(
            "remove",
            Opcode.REMOVE,
            table_id,
            key,
            lambda rpc: codec.remove_body(table_id, key, rules, rpc),
        )

    def increment(
        self,
        table_id: int,
        key: bytes | str,
        delta: int,
        reject_rules: RejectRules | None = None,
    ) -> tuple[int, int]:
        """Adds ``delta`` to an 8-byte little-endian signed integer object (a missing object
        counts as 0); returns (new value, new version). ``InvalidObject`` if the object is not
        8 bytes long or the sum would overflow."""
        table_id, key = _checked_table_id(table_id), _checked_key(key)
        delta, rules = _checked_delta(delta), _checked_rules(reject_rules)
        version, value = self._mutation(
            "increment",
            Opcode.INCREMENT,
            table_id,
            key,
            lambda rpc: codec.increment_body(table_id, key, delta, rules, rpc),
        )
        return value, version

    # -----------------------------------------------------------------------------------------
    # Multi-operations: one result per item, in the caller's order. A result is the value the
    # single-object call would return, or the StratusError it would raise. Items are grouped by
    # master and sent one request per master (sequentially); a protocol violation by a master
    # is raised, not returned per item, since it puts every answer in doubt.

    def multi_read(
        self, items: Iterable[KeyItem | tuple]
    ) -> list[tuple[bytes, int] | StratusError]:
        """Reads many objects; each result is (value, version) or an error."""
        normalized = [self._normalize_item(item, KeyItem) for item in items]
        return self._multi_operation(
            "multi_read",
            Opcode.MULTI_READ,
            normalized,
            lambda result: (result.value, result.version),
        )

    def multi_write(self, items: Iterable[WriteItem | tuple]) -> list[int | StratusError]:
        """Writes many objects; each result is the new version or an error."""
        normalized = [self._normalize_item(item, WriteItem) for item in items]
        return self._multi_operation(
            "multi_write", Opcode.MULTI_WRITE, normalized, lambda result: result.version
        )

    def multi_remove(self, items: Iterable[KeyItem | tuple]) -> list[int | StratusError]:
        """Removes many objects; each result is the removed version (0 if missing) or an
        error."""
        normalized = [self._normalize_item(item, KeyItem) for item in items]
        return self._multi_operation(
            "multi_remove", Opcode.MULTI_REMOVE, normalized, lambda result: result.version
        )

    def multi_increment(
        self, items: Iterable[IncrementItem | tuple]
    ) -> list[tuple[int, int] | StratusError]:
        """Increments many objects; each result is (new value, new version) or an error."""
        normalized = [self._normalize_item(item, IncrementItem) for item in items]
        return self._multi_operation(
            "multi_increment",
            Opcode.MULTI_INCREMENT,
            normalized,
            lambda result: (result.integer, result.version),
        )

    # -----------------------------------------------------------------------------------------
    # Transactions (docs/design/transactions.md; transaction.py).

    def transaction(self) -> Transaction:
        """Starts a multi-object transaction (see ``Transaction``): strictly serializable
        reads and writes of objects on any masters. Nothing is sent until it reads or
        commits."""
        from .transaction import Transaction

        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
        return Transaction(self)

    def run_transaction(self, body: Callable[[Transaction], _Result]) -> _Result:
        """Runs ``body`` on a fresh transaction and commits it; when the commit aborts in a
        conflict, runs it again on another fresh transaction after a pause (1 ms doubling to
        64 ms, with jitter), up to 32 attempts and while the client's ``timeout`` since the
        first has not passed. Returns what ``body`` returned for the transaction that
        committed.

        ``body`` must not commit the transaction, and may run several times: it should do
        nothing but read and buffer through it. An exception from ``body`` ends the call
        without committing, and so does an error of the commit (``Timeout``: its outcome is
        unknown). An abort other than a conflict, or a conflict on the last attempt allowed,
        raises ``TransactionAborted`` with the ``AbortReason``.

            def transfer(tx):
                tx.increment(accounts, "alice", -10)
                tx.increment(accounts, "bob", 10)

            client.run_transaction(transfer)
        """
        from .transaction import run_transaction

        return run_transaction(self, body)

    def run_transaction_retrying_if(
        self,
        body: Callable[[Transaction], _Result],
        retry_conflict: Callable[[AbortReason], bool],
    ) -> _Result:
        """``run_transaction``, retrying only the conflicts ``retry_conflict`` accepts (given
        the conflict's ``AbortReason``); another conflict raises ``TransactionAborted`` at
        once. For callers to which some conflicts are an answer (as Redis's EXEC answers a
        conflict on a WATCHed key)."""
        from .transaction import run_transaction

        return run_transaction(self, body, retry_conflict)

    def finish_transaction(
        self, lease: int, transaction: int, participants: list[TxOpName]
    ) -> TxDecision:
        """Finishes the transaction ``(lease, transaction)`` whose ops are ``participants``
        (every op of the transaction as its TX_PREPARE requests listed them: table, key hash,
        rpc id) as a participant does for a transaction whose client went silent, and returns
        its decision: TX_REQUEST_ABORT for every op (an op that had not voted is recorded
        ABORT, so it can never prepare later), COMMIT iff every vote is PREPARED, then
        TX_DECISION for every op. For tools and tests; applications commit with
        ``Transaction.commit``.

        Each round has the client's ``timeout``; ``Timeout`` means a round could not complete
        (calling again is safe, and decides the same). ``InvalidParameter``: no participants,
        more than 4096, or an id of 0."""
        from .transaction import finish_transaction

        return finish_transaction(self, lease, transaction, participants)

    # -----------------------------------------------------------------------------------------
    # Enumeration.

    def enumerate(
        self,
        table_id: int,
        *,
        batch_bytes: int = codec.ENUMERATE_RESPONSE_BYTES_MAX,
        resume_from: EnumerationPosition | None = None,
    ) -> Enumeration:
        """Iterates over every object of a table as (key, value, version).

        Objects present for the whole enumeration are returned exactly once, even if tablets
        move meanwhile; objects written or removed meanwhile may or may not be. Masters return
        at most ``batch_bytes`` of objects per request (at least one object). The
        enumeration's ``position`` can be kept and passed as ``resume_from`` to continue later.
        """
        table_id = _checked_table_id(table_id)
        if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int):
            raise TypeError("batch_bytes must be an int")
        if not 1 <= batch_bytes <= codec.ENUMERATE_RESPONSE_BYTES_MAX:
            raise ValueError(
                f"batch_bytes must be 1..{codec.ENUMERATE_RESPONSE_BYTES_MAX}, not {batch_bytes}"
            )
        return Enumeration(self, table_id, batch_bytes, resume_from)

    # -----------------------------------------------------------------------------------------
    # Internals shared with Enumeration.

    def _connection(self, address: str, attempts: Attempts) -> Connection:
        """The open connection to ``address``, opened (within the operation's deadline and the
        connect timeout) if there is none."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        deadline = min(time.monotonic() + self.connect_timeout, attempts.deadline)
        connection = Connection(address, deadline, self._password_key, self._tls, self._user)
        with self._lock:
            if self._closed:
                connection.close()
                raise RuntimeError("the client is closed")
            existing = self._connections.get(address)
            if existing is not None and not existing.closed:
                # Another thread connected meanwhile; keep one socket per server.
                connection.close()
                return existing
            self._connections[address] = connection
        return connection

    def _send(
        self, address: str, opcode: Opcode, body: bytes, attempts: Attempts
    ) -> tuple[Status, object]:
        """One request to one server: (status, decoded body). Connection failures raise
        ``CouldNotConnect`` or ``Timeout`` (retryable); the broken connection is dropped. An
        error's ``request_sent`` says whether the server may have received the request."""
        try:
            connection = self._connection(address, attempts)
        except StratusError as error:
            error.request_sent = False
            raise
        deadline = min(time.monotonic() + self.request_timeout, attempts.deadline)
        try:
            return connection.call(opcode, body, deadline)
        except (Unavailable, ProtocolError):
            with self._lock:
                if self._connections.get(address) is connection:
                    del self._connections[address]
            raise

    def _transaction_executor(self) -> ThreadPoolExecutor:
        """The threads that send a transaction phase's requests to several masters at once."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=16, thread_name_prefix="stratus-transaction"
                )
            return self._executor

    def _retrying(self, attempts: Attempts, attempt: Callable[[], _Result]) -> _Result:
        """Runs ``attempt`` until it returns, raises a non-retryable error, or the deadline
        passes."""
        while True:
            try:
                return attempt()
            except _RETRYABLE_ERRORS as error:
                attempts.wait_before_retry(error)

    def _coordinator_request(self, opcode: Opcode, body: bytes, attempts: Attempts) -> object:
        """One request to the coordinator: its decoded body, or its status as a typed error.

        With several coordinator addresses, starts at the one that answered last and tries
        the next, each once, when one cannot be reached (a dead one refuses; a paused one
        times out) or answers RETRY (a standby, or a deposed coordinator, answers that to
        everything). The first RETRY is the answer only if no coordinator gives another. After
        a failure the next request starts at the next address; addresses the time ran out
        before are not tried."""
        count = len(self.coordinators)
        first = self._coordinator_index
        retry: tuple[Status, object] | None = None
        answer: tuple[Status, object] | None = None
        failure: StratusError | None = None
        for turn in range(count):
            if turn > 0 and time.monotonic() >= attempts.deadline:
                # Out of time: the addresses left are not tried, nor blamed.
                break
            index = (first + turn) % count
            try:
                status, decoded = self._send(self.coordinators[index], opcode, body, attempts)
            except (CouldNotConnect, Timeout, ProtocolError) as error:
                self._coordinator_index = (index + 1) % count
                failure = error
                continue
            if status is Status.RETRY:
                if retry is None:
                    retry = (status, decoded)
                continue
            self._coordinator_index = index
            answer = (status, decoded)
            break
        if answer is None:
            # No address gave another answer: the first RETRY, else the last failure.
            if retry is None:
                assert failure is not None
                raise failure
            answer = retry
        status, decoded = answer
        if status is Status.OK:
            return decoded
        raise failure_from_response(status, decoded)

    def _coordinator_operation(self, description: str, opcode: Opcode, body: bytes):
        attempts = Attempts(description, self.timeout)
        return self._retrying(attempts, lambda: self._coordinator_request(opcode, body, attempts))

    def _fetch_tablet_map(self, table_id: int, attempts: Attempts) -> list[TabletEntry]:
        """Asks the coordinator for a table's tablets (one attempt) and caches them."""
        tablets = self._coordinator_request(
            Opcode.GET_TABLET_MAP, codec.table_id_body(table_id), attempts
        )
        # Only this table's tablets, ordered by range start, so lookups can bisect.
        tablets = sorted(
            (tablet for tablet in tablets if tablet.table_id == table_id),
            key=lambda tablet: tablet.range.start,
        )
        starts = [tablet.range.start for tablet in tablets]
        with self._lock:
            if not self._closed:
                self._tablet_maps[table_id] = (starts, tablets)
        return tablets

    def _forget_tablet_map(self, table_id: int) -> None:
        with self._lock:
            self._tablet_maps.pop(table_id, None)

    def _locate(self, table_id: int, hash_value: int, attempts: Attempts) -> TabletEntry:
        """The tablet holding ``hash_value``, from the cache or a fresh map (one attempt).

        ``UnknownTablet`` when no tablet holds it (the map is being changed: retryable), and
        ``RetryLater`` when the tablet's master is being recovered.
        """
        with self._lock:
            cached = self._tablet_maps.get(table_id)
        if cached is None:
            self._fetch_tablet_map(table_id, attempts)
            with self._lock:
                cached = self._tablet_maps.get(table_id)
            if cached is None:
                raise RuntimeError("the client is closed")
        starts, tablets = cached
        index = bisect.bisect_right(starts, hash_value) - 1
        if index < 0 or not tablets[index].range.contains(hash_value):
            self._forget_tablet_map(table_id)
            raise UnknownTablet(f"no tablet of table {table_id} holds hash {hash_value:#x}")
        tablet = tablets[index]
        if tablet.recovering:
            self._forget_tablet_map(table_id)
            raise RetryLater(f"the tablet of table {table_id} holding the key is recovering")
        if tablet.state == TabletState.UNAVAILABLE:
            # Retried like a recovery (a backup holding the log may return, or an operator
            # accept the loss) until the operation's timeout, which then names the cause.
            self._forget_tablet_map(table_id)
            raise RetryLater(
                f"the tablet of table {table_id} holding the key is unavailable: its master's "
                "log cannot be recovered (see `stratus status`)"
            )
        return tablet

    def _client_lease_call(self, lease: int, attempts: Attempts) -> ClientLeaseGrant:
        """One CLIENT_LEASE to the coordinator: open a lease (0) or renew ``lease``."""
        grant = self._coordinator_request(
            Opcode.CLIENT_LEASE, codec.client_lease_body(lease), attempts
        )
        if lease and grant.lease != lease:
            raise InternalError(
                f"the coordinator answered a renewal of lease {lease} with lease {grant.lease}"
            )
        return grant

    def _mutation(
        self,
        name: str,
        opcode: Opcode,
        table_id: int,
        key: bytes,
        make_body: Callable[[RpcIdentity | None], bytes],
    ) -> object:
        """A single-object mutation: exactly once unless the client was made without it."""
        return self._object_operation(
            name, opcode, table_id, key, make_body, exactly_once=self.exactly_once
        )

    def _object_operation(
        self,
        name: str,
        opcode: Opcode,
        table_id: int,
        key: bytes,
        make_body: Callable[[RpcIdentity | None], bytes],
        *,
        exactly_once: bool = False,
    ) -> object:
        """Sends a single-object request to the key's master, refreshing the map and retrying
        as needed; returns the decoded OK body or raises the operation's typed error.

        ``make_body`` makes the request's body for an rpc identity (None: none). With
        ``exactly_once`` the request takes a ticket before its first attempt, and every attempt
        carries its identity (the acknowledged mark brought up to date). When a master says the
        ticket's lease expired, the request is sent again under a new lease only if no earlier
        attempt may have been applied; otherwise its outcome is unknown: ``Timeout``.
        """
        hash_value = key_hash(table_id, key)
        attempts = Attempts(f"{name}(table {table_id}, key {key[:64]!r})", self.timeout)
        ticket: RpcTicket | None = None
        may_have_run = False
        # Made at once, so that an argument that cannot be encoded fails before any lease.
        body = make_body(None)
        try:
            if exactly_once:
                ticket = self._lease_agent.ticket(attempts)
            while True:
                try:
                    tablet = self._locate(table_id, hash_value, attempts)
                except (TableDoesNotExist, ProtocolError):
                    raise
                except StratusError as error:
                    # Any other failure to find the tablet is retried, as the Rust client does:
                    # the coordinator may be restarting or the map changing under a recovery.
                    attempts.wait_before_retry(error)
                    continue
                if ticket is not None:
                    # A mutation that retries for long keeps its lease alive.
                    self._lease_agent.renew_if_due(attempts)
                    body = make_body(ticket.identity())
                try:
                    status, decoded = self._send(tablet.owner_address, opcode, body, attempts)
                except Unavailable as error:
                    # The master may have crashed: its tablets will have new owners.
                    self._forget_tablet_map(table_id)
                    may_have_run = may_have_run or _may_have_run(error)
                    attempts.wait_before_retry(error)
                    continue
                if status is Status.OK:
                    return decoded
                error = failure_from_response(status, decoded)
                if status is Status.EXPIRED_LEASE and ticket is not None:
                    # Nothing of this attempt was applied; of the earlier ones, maybe.
                    self._lease_agent.lost(ticket.lease)
                    ticket.release()
                    ticket = None
                    if may_have_run:
                        raise outcome_unknown(error)
                    ticket = self._lease_agent.ticket(attempts)
                elif status in _STALE_MAP_STATUSES:
                    self._forget_tablet_map(table_id)
                elif status not in _TRANSIENT_STATUSES:
                    raise error
                else:
                    may_have_run = may_have_run or _may_have_run(error)
                attempts.wait_before_retry(error)
        finally:
            if ticket is not None:
                ticket.release()

    def _normalize_item(self, item, item_type):
        """An item with a checked table id, bytes key and value, from an item or a tuple."""
        if isinstance(item, tuple):
            item = item_type(*item)
        if not isinstance(item, item_type):
            raise TypeError(f"expected {item_type.__name__} or a tuple, not {type(item).__name__}")
        fields = {
            "table_id": item.table_id,
            "key": _as_bytes(item.key, "key"),
            "reject_rules": _checked_rules(item.reject_rules),
        }
        if isinstance(item, WriteItem):
            fields["value"] = _as_bytes(item.value, "value")
            fields["expiry"] = item.expiry
        if isinstance(item, IncrementItem):
            fields["delta"] = _checked_delta(item.delta)
        return item_type(**fields)

    def _multi_operation(
        self,
        name: str,
        opcode: Opcode,
        items: list,
        success: Callable[[MultiItemResult], object],
    ) -> list:
        """Runs a multi-operation: groups pending items by master, sends one request per master
        (in chunks of at most 4096 items), keeps the items whose status says "retry" pending,
        and repeats with backoff until every item has an outcome or the deadline passes.

        Each item of a mutating multi-operation of an exactly-once client has its own ticket
        (its own rpc id), taken before its first attempt and carried by every attempt of it,
        whichever master it goes to and whichever items it travels with; it is given back when
        the item has its outcome. An item whose lease a master said expired takes a new ticket
        for the next round if no attempt of it may have been applied; otherwise its outcome is
        unknown (``Timeout``).
        """
        outcomes: list[object] = [None] * len(items)
        hashes: list[int] = [0] * len(items)
        pending: list[int] = []
        for index, item in enumerate(items):
            try:
                _checked_table_id(item.table_id)
                _checked_key(item.key)
            except StratusError as error:
                outcomes[index] = error
                continue
            hashes[index] = key_hash(item.table_id, item.key)
            pending.append(index)
        attempts = Attempts(f"{name} of {len(items)} items", self.timeout)
        last_error: StratusError | None = None
        exactly_once = self.exactly_once and opcode in _MUTATING_MULTI_OPCODES
        tickets: list[RpcTicket | None] = [None] * len(items)
        may_have_run = [False] * len(items)
        # Items that need a (new) ticket before their next attempt: at first, every one.
        needing_tickets: list[int] = list(pending) if exactly_once else []

        def finish(index: int, outcome: object) -> None:
            outcomes[index] = outcome
            ticket = tickets[index]
            if ticket is not None:
                tickets[index] = None
                ticket.release()

        def failed(index: int, error: StratusError) -> None:
            # The item failed in a way that another attempt may cure.
            nonlocal last_error
            if exactly_once:
                may_have_run[index] = may_have_run[index] or _may_have_run(error)
            last_error = attempts.note(error)

        try:
            while pending:
                if exactly_once:
                    ticket_error: StratusError | None = None
                    for index in needing_tickets:
                        old = tickets[index]
                        if old is not None:
                            tickets[index] = None
                            self._lease_agent.lost(old.lease)
                            old.release()
                        if may_have_run[index]:
                            finish(index, outcome_unknown(error_for_status(Status.EXPIRED_LEASE)))
                            continue
                        if ticket_error is not None:
                            # No lease could be had (until the deadline, or at all): the same
                            # for every item, so the coordinator is asked once, not per item.
                            finish(index, ticket_error)
                            continue
                        try:
                            tickets[index] = self._lease_agent.ticket(attempts)
                        except StratusError as error:
                            ticket_error = error
                            finish(index, error)
                    needing_tickets = []
                    self._lease_agent.renew_if_due(attempts)
                    pending = [index for index in pending if outcomes[index] is None]
                    if not pending:
                        break
                groups: dict[str, list[int]] = defaultdict(list)
                # Tables whose map could not be fetched this round: one failed request to the
                # coordinator is enough to know, rather than one per item.
                unlocatable_tables: set[int] = set()
                for index in pending:
                    table_id = items[index].table_id
                    if table_id in unlocatable_tables:
                        continue
                    try:
                        tablet = self._locate(table_id, hashes[index], attempts)
                    except TableDoesNotExist as error:
                        finish(index, error)
                        continue
                    except ProtocolError:
                        raise
                    except StratusError as error:
                        if not isinstance(error, (UnknownTablet, RetryLater)):
                            unlocatable_tables.add(table_id)
                        last_error = attempts.note(error)
                        continue
                    groups[tablet.owner_address].append(index)
                for address, indices in groups.items():
                    for first in range(0, len(indices), codec.MULTI_OP_ITEMS_MAX):
                        chunk = indices[first : first + codec.MULTI_OP_ITEMS_MAX]
                        identities = None
                        if exactly_once:
                            identities = [tickets[index].identity() for index in chunk]
                        body = codec.multi_body(
                            opcode, [items[index] for index in chunk], identities
                        )
                        try:
                            status, decoded = self._send(address, opcode, body, attempts)
                        except Unavailable as error:
                            for index in chunk:
                                self._forget_tablet_map(items[index].table_id)
                                failed(index, error)
                            continue
                        if status is not Status.OK:
                            error = failure_from_response(status, decoded)
                            if status is Status.EXPIRED_LEASE and exactly_once:
                                # The lease of the batch's items: nothing of it was applied.
                                needing_tickets.extend(chunk)
                                last_error = attempts.note(error)
                            elif status in _STALE_MAP_STATUSES:
                                for index in chunk:
                                    self._forget_tablet_map(items[index].table_id)
                                last_error = attempts.note(error)
                            elif status in _TRANSIENT_STATUSES:
                                for index in chunk:
                                    failed(index, error)
                            else:
                                # The master refused the whole batch: sending it again cannot
                                # help.
                                for index in chunk:
                                    finish(index, failure_from_response(status, decoded))
                            continue
                        if len(decoded) != len(chunk):
                            raise ProtocolError(
                                f"{address} answered {len(decoded)} results to a {opcode.name} "
                                f"of {len(chunk)} items"
                            )
                        for index, result in zip(chunk, decoded, strict=True):
                            if result.status is Status.OK:
                                finish(index, success(result))
                            elif result.status is Status.EXPIRED_LEASE and exactly_once:
                                needing_tickets.append(index)
                                last_error = attempts.note(error_for_status(result.status))
                            elif result.status in _STALE_MAP_STATUSES:
                                self._forget_tablet_map(items[index].table_id)
                                last_error = attempts.note(error_for_status(result.status))
                            elif result.status in _TRANSIENT_STATUSES:
                                failed(index, error_for_status(result.status))
                            else:
                                finish(
                                    index,
                                    error_for_status(result.status, version=result.version),
                                )
                pending = [index for index in pending if outcomes[index] is None]
                if not pending or not attempts.pause_before_retry():
                    break
            for index in pending:
                finish(index, attempts.timeout_error(last_error))
        finally:
            for ticket in tickets:
                if ticket is not None:
                    ticket.release()
        return outcomes


def _tls_context(
    ca_file: str | os.PathLike[str] | None,
    cert_file: str | os.PathLike[str] | None,
    key_file: str | os.PathLike[str] | None,
) -> ssl.SSLContext | None:
    """The TLS context of a client given a CA (``None`` without one), with its own certificate
    if given; TLS 1.2 at least, as the servers speak."""
    if ca_file is None:
        if cert_file is not None or key_file is not None:
            raise ValueError("tls_cert_file and tls_key_file need tls_ca_file")
        return None
    if (cert_file is None) != (key_file is None):
        raise ValueError("give tls_cert_file and tls_key_file together")
    context = ssl.create_default_context(cafile=os.fspath(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    return context
