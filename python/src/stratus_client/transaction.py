"""Multi-object transactions (docs/design/transactions.md): strictly serializable reads and
writes of objects on any masters, committed by the client in two rounds of requests.

The Rust client's counterpart is crates/stratus-client/src/transaction.rs and its modules
(``buffer``, ``commit``, ``fanout``, ``finish``, ``retry``); this module follows it step by step,
and its names are theirs.

A ``Transaction`` reads through the ordinary read path and remembers the version of every object
it read (the first read of an object is the one the transaction sees: reading it again returns
the same value); it buffers its writes, removals and increments, and a read of an object it
wrote returns its own write. Nothing is sent to a master before ``commit``, which:

1. reads the version of every object written without being read first (one multi-read), so
   every op carries the version the transaction observed;
2. takes one exactly-once ticket per object, in one go under one lease, in (table, key hash,
   key) order: the transaction's id is its lease and its first op's rpc id, and each op's vote
   is the RIFL result of its own rpc id;
3. sends TX_PREPARE to every master holding an object, in parallel, and goes on with each op a
   master could not vote on (a stale map, RETRY, a lost connection) as a multi-operation goes on
   with its items, with the same rpc id, until every op has a vote, one voted ABORT, or the
   deadline passes. Every request carries the transaction's participants (every op, by table,
   key hash and rpc id), so that any participant can finish the transaction if the client dies;
4. when some votes are still unknown (and none is ABORT), sends TX_REQUEST_ABORT for those ops,
   which makes each vote final (an op that had not voted is recorded ABORT), within another
   operation's time;
5. decides from the final votes as any participant would: COMMIT if every op voted PREPARED,
   ABORT otherwise; sends TX_DECISION for every op until each is acknowledged, within another
   operation's time, and returns the outcome;
6. gives the tickets back once every op acknowledged the decision (until then the client
   acknowledges none of them, so a participant finishing the transaction can still learn every
   vote). Ops still unacknowledged then are told by a background thread, for at most half a
   client lease term, after which the tickets are given back anyway.

A transaction that only reads locks nothing: one object it read itself needs no request at all;
more are validated (TX_PREPARE, validate-only): committed if each is still unlocked at its
version.

Transactions always run under the client's lease, whatever ``exactly_once`` says: their votes
are RIFL results.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from . import codec
from .codec import Opcode, TxDecision, TxOp, TxOpKind, TxOpName, TxVote, TxVoteResult
from .errors import (
    InternalError,
    InvalidObject,
    InvalidParameter,
    ObjectDoesNotExist,
    ProtocolError,
    RetryLater,
    StratusError,
    TableDoesNotExist,
    Timeout,
    TransactionAborted,
    Unavailable,
    UnknownTablet,
    error_for_status,
)
from .key_hash import key_hash
from .model import AbortKind, AbortReason, KeyItem, TxOutcome
from .retry import Attempts, failure_from_response
from .status import Status

if TYPE_CHECKING:
    from .client import Client
    from .exactly_once import RpcTicket

__all__ = ["ConflictRetries", "Transaction", "finish_transaction", "run_transaction"]

_log = logging.getLogger(__name__)

_Result = TypeVar("_Result")
_Answer = TypeVar("_Answer")

ObjectKey = tuple[int, bytes]

# The retry policy of run_transaction (Rust: transaction/retry.rs). The first pause after a
# conflict is about a commit's two round trips, the time the conflicting transaction needs to
# finish; pauses double to 64 ms (reached after six conflicts in a row), each scaled by a random
# factor in [0.5, 1); at most 32 attempts (about 1.7 s of pauses in all), and none starts past
# the client's operation timeout since the first.
CONFLICT_PAUSE_INITIAL_SECONDS = 0.001
CONFLICT_PAUSE_MAX_SECONDS = 0.064
TRANSACTION_ATTEMPTS_MAX = 32

# How long a commit's tickets are held in the background, at most, while its decision (or its
# votes) are still being delivered (or learnt): half a client lease term (30 s), so the lease the
# client renews meanwhile keeps the participants' records of its ops.
BACKGROUND_FINISH_SECONDS = 15.0

# Bytes of a TX_PREPARE op besides its key and value: table id, key length, rpc id, kind,
# version read, value length.
_PREPARE_OP_FIXED_BYTES = 8 + 2 + 8 + 1 + 8 + 4
# Bytes of a MULTI_READ item besides its key: table id, key length, reject rules.
_KEY_ITEM_FIXED_BYTES = 8 + 2 + 9
# Bytes of a TX_DECISION or TX_REQUEST_ABORT op: table id, key hash, rpc id.
_OP_NAME_BYTES = 8 + 8 + 8

# Statuses after which an op goes again (the first two after its table's map is dropped).
_STALE_MAP_STATUSES = frozenset({Status.UNKNOWN_TABLET, Status.WRONG_SERVER})
_TRANSIENT_STATUSES = frozenset({Status.RETRY, Status.SERVICE_NOT_AVAILABLE})


# ---------------------------------------------------------------------------------------------
# The buffer: what a transaction read and wrote before its commit, and its limits.


@dataclass(frozen=True)
class PlannedOp:
    """An op of the transaction as its commit plans it. ``version_read`` is None for an object
    written without being read (the commit reads its version first); ``version_given`` says the
    version was given by the caller (``expect_version``) and never compared with the master's:
    a commit must check it even where a read it made itself would need no check."""

    table_id: int
    key: bytes
    kind: TxOpKind
    version_read: int | None
    value: bytes = b""
    version_given: bool = False


def _committed_already() -> InvalidParameter:
    return InvalidParameter("the transaction was committed already: start another one to go on")


class TxBuffer:
    """The reads and buffered changes of one transaction. Not thread-safe (``Transaction``
    holds a lock around it).

    Invariants:
    1. ``objects`` counts the objects in ``reads``, ``expected`` or ``changes`` (any of them),
       and never exceeds ``TRANSACTION_OBJECTS_MAX``. ``reads`` and ``expected`` never share
       an object.
    2. ``bytes`` is the sum of the keys of those objects and the values of the buffered
       writes, and never exceeds ``TRANSACTION_BYTES_MAX``.
    3. A read is recorded once per object: the first read is what the transaction saw, and its
       version is what the commit checks.
    4. Once ``taken`` (committed), the buffer refuses everything.
    5. An object in ``expected`` was given a version by the caller (``expect_version``), not
       read: its first read moves it to ``reads`` at the expected version, and marks the
       transaction ``stale`` if the master had another one (versions only grow, so the commit
       could only abort; it aborts without asking).
    """

    def __init__(self) -> None:
        # object -> (value seen, None: absent; its version, 0: absent)
        self.reads: dict[ObjectKey, tuple[bytes | None, int]] = {}
        self.expected: dict[ObjectKey, int] = {}
        # object -> the value written, None: removed
        self.changes: dict[ObjectKey, bytes | None] = {}
        self.stale: ObjectKey | None = None
        self.objects = 0
        self.bytes = 0
        self.taken = False

    def _check_open(self) -> None:
        if self.taken:
            raise _committed_already()

    def _is_known(self, key: ObjectKey) -> bool:
        return key in self.reads or key in self.expected or key in self.changes

    def _room_for(self, key: ObjectKey, value_bytes: int) -> tuple[int, int]:
        """Checks that the transaction may hold ``key`` with a buffered value of
        ``value_bytes`` (0 for none), within its limits; returns its objects and bytes after."""
        new = not self._is_known(key)
        objects = self.objects + (1 if new else 0)
        if objects > codec.TRANSACTION_OBJECTS_MAX:
            raise InvalidParameter(
                f"a transaction holds at most {codec.TRANSACTION_OBJECTS_MAX} objects "
                "(TRANSACTION_OBJECTS_MAX); this one would hold more"
            )
        replaced = self.changes.get(key)
        replaced_bytes = 0 if replaced is None else len(replaced)
        key_bytes = len(key[1]) if new else 0
        total = self.bytes - replaced_bytes + key_bytes + value_bytes
        if total > codec.TRANSACTION_BYTES_MAX:
            raise InvalidParameter(
                f"a transaction holds at most {codec.TRANSACTION_BYTES_MAX} bytes of keys and "
                f"buffered values (TRANSACTION_BYTES_MAX); this one would hold {total}"
            )
        return objects, total

    def seen(self, key: ObjectKey) -> tuple[bool, bytes | None]:
        """(True, value) when the transaction knows what it sees of ``key`` without asking its
        master (its own change, or its first read; None: absent); (False, None) when the
        object must be read, and there is room for it."""
        self._check_open()
        if key in self.changes:
            return True, self.changes[key]
        if key in self.reads:
            return True, self.reads[key][0]
        self._room_for(key, 0)
        return False, None

    def record_read(self, key: ObjectKey, value: bytes | None, version: int) -> bytes | None:
        """Records what a read of ``key`` found, and returns what the transaction sees of it:
        a change or first read recorded meanwhile (another thread's), else this read."""
        known, seen = self.seen(key)
        if known:
            return seen
        objects, total = self._room_for(key, 0)
        expected = self.expected.pop(key, None)
        if expected is not None:
            if expected != version and self.stale is None:
                self.stale = key
            version = expected
        self.reads[key] = (value, version)
        self.objects, self.bytes = objects, total
        return value

    def expect_version(self, key: ObjectKey, version: int) -> None:
        """Records that the transaction saw ``key`` at ``version`` (0: absent) without reading
        it: its commit checks that version, even if the transaction writes the object. An
        object read (or expected) already at another version makes the transaction stale."""
        self._check_open()
        if key in self.reads or key in self.expected:
            seen = self.reads[key][1] if key in self.reads else self.expected[key]
            if seen != version and self.stale is None:
                self.stale = key
            return
        objects, total = self._room_for(key, 0)
        self.expected[key] = version
        self.objects, self.bytes = objects, total

    def change(self, key: ObjectKey, value: bytes | None) -> None:
        """Buffers a write of ``value`` (None: a removal)."""
        self._check_open()
        objects, total = self._room_for(key, 0 if value is None else len(value))
        self.changes[key] = value
        self.objects, self.bytes = objects, total

    def take(self) -> list[PlannedOp]:
        """Ends the buffering (invariant 4) and plans the ops: one per object, changed objects
        with their change and the version read if they were read, the others as reads."""
        self._check_open()
        self.taken = True
        reads, expected, changes = self.reads, self.expected, self.changes
        self.reads, self.expected, self.changes = {}, {}, {}
        ops = []
        for (table_id, key), value in changes.items():
            given = expected.get((table_id, key))
            read = reads.get((table_id, key))
            ops.append(
                PlannedOp(
                    table_id,
                    key,
                    TxOpKind.REMOVE if value is None else TxOpKind.WRITE,
                    read[1] if read is not None else given,
                    b"" if value is None else value,
                    version_given=given is not None,
                )
            )
        unchanged = [(object_key, read[1], False) for object_key, read in reads.items()]
        unchanged += [(object_key, version, True) for object_key, version in expected.items()]
        for (table_id, key), version, version_given in unchanged:
            if (table_id, key) not in changes:
                ops.append(
                    PlannedOp(table_id, key, TxOpKind.READ, version, version_given=version_given)
                )
        assert len(ops) == self.objects, "invariant 1"
        return ops


def incremented(current: bytes | None, delta: int) -> int:
    """The value an increment of ``current`` (an 8-byte little-endian integer, None for an
    absent object: 0) by ``delta`` gives."""
    if current is None:
        value = 0
    elif len(current) != 8:
        raise InvalidObject(f"the object is {len(current)} bytes long, not an 8-byte integer")
    else:
        value = int.from_bytes(current, "little", signed=True)
    total = value + delta
    if not -(1 << 63) <= total < 1 << 63:
        raise InvalidObject(f"{value} + {delta} overflows an i64")
    return total


# ---------------------------------------------------------------------------------------------
# The transaction.


class Transaction:
    """A multi-object transaction of ``client`` (see the module's documentation): start one
    with ``Client.transaction()``. A transaction may be used from several threads (each call
    is atomic), but is meant for one.

    Reads see the transaction's own writes; the first read of an object is what the
    transaction sees of it afterwards, and its version is what the commit checks. ``write``,
    ``remove``, ``increment`` and ``expect_version`` are refused with ``InvalidParameter``,
    before anything is sent, when the transaction would hold more than
    ``TRANSACTION_OBJECTS_MAX`` (4096) objects or ``TRANSACTION_BYTES_MAX`` (64 MiB) of keys
    and buffered values; so is every call once ``commit`` was called.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._buffer = TxBuffer()

    def read(self, table_id: int, key: bytes | str) -> bytes | None:
        """The object's value as the transaction sees it: its own write (or None after its own
        removal), else what it read of the object first, else what the object's master holds
        now (None: absent), which the transaction then remembers with its version. A read of
        an object another transaction holds locked waits (its master answers RETRY) within the
        client's operation timeout."""
        object_key = self._object_key(table_id, key)
        with self._lock:
            known, seen = self._buffer.seen(object_key)
        if known:
            return seen
        try:
            value, version = self._client.read(*object_key)
        except ObjectDoesNotExist:
            value, version = None, 0
        with self._lock:
            return self._buffer.record_read(object_key, value, version)

    def write(self, table_id: int, key: bytes | str, value: bytes | str) -> None:
        """Buffers a write of ``value`` to the object (sent at commit)."""
        from .client import _as_bytes

        object_key = self._object_key(table_id, key)
        value = _as_bytes(value, "value")
        with self._lock:
            self._buffer.change(object_key, value)

    def remove(self, table_id: int, key: bytes | str) -> None:
        """Buffers the removal of the object (sent at commit)."""
        object_key = self._object_key(table_id, key)
        with self._lock:
            self._buffer.change(object_key, None)

    def increment(self, table_id: int, key: bytes | str, delta: int) -> int:
        """Adds ``delta`` to an 8-byte little-endian integer object as the transaction sees it
        (an absent object counts as 0; see ``read``) and buffers the sum as a write; returns
        the sum. ``InvalidObject`` for an object of another length, or a sum that overflows."""
        from .client import _checked_delta

        delta = _checked_delta(delta)
        total = incremented(self.read(table_id, key), delta)
        self.write(table_id, key, total.to_bytes(8, "little", signed=True))
        return total

    def expect_version(self, table_id: int, key: bytes | str, version: int) -> None:
        """Records that the transaction saw the object at ``version`` (0: absent) without
        reading it now, as if it had read it then: the commit checks that the object is still
        at that version (locking it there if the transaction also writes or removes it) and
        aborts with a conflict on it otherwise. A later ``read`` of the object fetches its
        value; if the master has another version by then, the commit aborts at once, sending
        nothing. (The RESP gateway's WATCH, whose versions were read before the transaction.)"""
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int, not {type(version).__name__}")
        if not 0 <= version < 1 << 64:
            raise ValueError(f"version {version} is not a 64-bit version")
        object_key = self._object_key(table_id, key)
        with self._lock:
            self._buffer.expect_version(object_key, version)

    def commit(self) -> TxOutcome:
        """Commits the transaction (see the module's documentation). Returns its outcome when
        it is known: committed once every op's final vote is PREPARED (even if a master could
        not be told so in time: it is committed, and the decision is delivered in the
        background), or aborted with its ``AbortReason``.

        ``Timeout`` means the outcome is unknown (its message says so: some vote could neither
        be learnt nor made final in time); the participants settle it, and it committed only if
        every op was prepared. Any other error means the transaction did not commit and never
        will: an object could not be read or prepared for a reason retrying cannot cure (a
        table that does not exist, a value the master refuses), or the transaction was
        committed already.
        """
        with self._lock:
            stale = self._buffer.stale
            plan = self._buffer.take()
        if stale is not None:
            # A version it expected is gone already (see expect_version).
            return TxOutcome.aborted(AbortReason.conflict(*stale))
        return _commit(self._client, plan)

    @staticmethod
    def _object_key(table_id: int, key: bytes | str) -> ObjectKey:
        from .client import _checked_key, _checked_table_id

        return _checked_table_id(table_id), _checked_key(key)


class ConflictRetries:
    """The retry budget of one ``run_transaction`` call: when to run the transaction again
    after a conflict."""

    def __init__(self, time_budget: float, rng: random.Random | None = None) -> None:
        self._time_budget = time_budget
        self._next_pause = CONFLICT_PAUSE_INITIAL_SECONDS
        self._attempts = 1
        self._rng = rng if rng is not None else random.Random()

    def next_pause(self, elapsed: float) -> float | None:
        """After an attempt aborted in a conflict, ``elapsed`` seconds after the first attempt
        started: the pause before the next attempt, or None when the attempts are spent or the
        next would start past the time budget."""
        if self._attempts >= TRANSACTION_ATTEMPTS_MAX:
            return None
        pause = self._next_pause * self._rng.uniform(0.5, 1.0)
        self._next_pause = min(self._next_pause * 2, CONFLICT_PAUSE_MAX_SECONDS)
        if elapsed + pause >= self._time_budget:
            return None
        self._attempts += 1
        return pause


def run_transaction(
    client: Client,
    body: Callable[[Transaction], _Result],
    retry_conflict: Callable[[AbortReason], bool] | None = None,
) -> _Result:
    """``Client.run_transaction`` and ``Client.run_transaction_retrying_if``."""
    started = time.monotonic()
    retries = ConflictRetries(client.timeout)
    while True:
        transaction = Transaction(client)
        value = body(transaction)
        outcome = transaction.commit()
        if outcome.committed:
            return value
        reason = outcome.reason
        assert reason is not None
        pause = None
        if reason.kind is AbortKind.CONFLICT and (retry_conflict is None or retry_conflict(reason)):
            pause = retries.next_pause(time.monotonic() - started)
        if pause is None:
            raise TransactionAborted(
                f"transaction aborted: {reason}",
                status=Status.WRONG_VERSION if reason.is_conflict else Status.TIMEOUT,
                reason=reason,
            )
        time.sleep(pause)


# ---------------------------------------------------------------------------------------------
# One phase on the wire (Rust: transaction/fanout.rs): rounds of routing the ops still without
# an answer by their table and key hash, one request per master (split at MULTI_OP_ITEMS_MAX
# ops and TRANSACTION_REQUEST_BYTES_MAX bytes), all in parallel, judging each op's answer, until
# every op has one, the phase says the rest no longer matters, or the deadline passes.


@dataclass(frozen=True)
class TxObject:
    """One object of a committing transaction, as its requests name it."""

    table_id: int
    key: bytes
    kind: TxOpKind
    version_read: int
    value: bytes = b""


@dataclass(frozen=True)
class Waiting:
    """No answer yet; the failure of its last attempt, if it had one."""

    error: StratusError | None = None


@dataclass(frozen=True)
class Answered(Generic[_Answer]):
    """Its master's answer (status OK)."""

    answer: _Answer


@dataclass(frozen=True)
class Refused:
    """Refused for a reason retrying cannot cure."""

    error: StratusError


@dataclass(frozen=True)
class LeaseExpired:
    """Its master said the transaction's lease expired: no attempt of it can succeed now."""


OpState = Waiting | Answered | Refused | LeaseExpired


class Phase:
    """What one phase sends and how it reads the answers."""

    opcode: Opcode

    def request(self, indices: list[int]) -> bytes:
        """The body of the request carrying the ops at ``indices`` (all to one master)."""
        raise NotImplementedError

    def answers(self, decoded: object) -> list[tuple[Status, object]]:
        """Each op's status and answer from a decoded OK response of this phase."""
        raise NotImplementedError

    def op_bytes(self, index: int) -> int:
        """Bytes op ``index`` takes in a request (its share of the request's limit)."""
        return _OP_NAME_BYTES

    def settled(self, states: list[OpState]) -> bool:
        """True when the ops still waiting no longer matter."""
        return False


@dataclass(frozen=True)
class Batch:
    """The ops of one request to one master."""

    address: str
    indices: list[int]


def batches(
    by_master: dict[str, list[int]],
    op_bytes: Callable[[int], int],
    items_max: int,
    bytes_max: int,
) -> list[Batch]:
    """Cuts each master's ops into requests of at most ``items_max`` ops and ``bytes_max``
    bytes (but at least one op), in the masters' (sorted) order."""
    result = []
    for address in sorted(by_master):
        current: list[int] = []
        size_so_far = 0
        for index in by_master[address]:
            size = op_bytes(index)
            if current and (len(current) == items_max or size_so_far + size > bytes_max):
                result.append(Batch(address, current))
                current, size_so_far = [], 0
            current.append(index)
            size_so_far += size
        if current:
            result.append(Batch(address, current))
    return result


def run_phase(
    client: Client, names: list[TxOpName], indices: list[int], phase: Phase, attempts: Attempts
) -> list[OpState]:
    """Runs ``phase`` for the ops named by ``names`` at ``indices`` (the others stay
    ``Waiting`` and are never sent) until no op waits, the phase is settled, or the deadline of
    ``attempts`` passes; each op goes to the master of its table and key hash."""
    states: list[OpState] = [Waiting() for _ in names]

    def waiting() -> list[int]:
        return [index for index in indices if isinstance(states[index], Waiting)]

    pending = waiting()
    while pending and not phase.settled(states) and time.monotonic() < attempts.deadline:
        # Every attempt carries the lease: a commit that retries for long keeps it alive.
        client._lease_agent.renew_if_due(attempts)
        _send(
            client,
            names,
            _route(client, names, pending, phase, states, attempts),
            phase,
            states,
            attempts,
        )
        pending = waiting()
        if pending and not phase.settled(states) and not attempts.pause_before_retry():
            break
    return states


def _route(
    client: Client,
    names: list[TxOpName],
    pending: list[int],
    phase: Phase,
    states: list[OpState],
    attempts: Attempts,
) -> list[Batch]:
    """Groups the ops at ``pending`` by their master; ops with nowhere to go yet note why, and
    ops that never will are refused."""
    by_master: dict[str, list[int]] = {}
    # Tables whose map could not be fetched this round: one failed request to the coordinator
    # is enough to know, rather than one per op.
    unlocatable: dict[int, StratusError] = {}
    for index in pending:
        table_id = names[index].table_id
        if table_id in unlocatable:
            states[index] = Waiting(unlocatable[table_id])
            continue
        try:
            tablet = client._locate(table_id, names[index].key_hash, attempts)
        except (TableDoesNotExist, ProtocolError) as error:
            states[index] = Refused(error)
            continue
        except StratusError as error:
            if not isinstance(error, (UnknownTablet, RetryLater)):
                unlocatable[table_id] = error
            attempts.note(error)
            states[index] = Waiting(error)
            continue
        by_master.setdefault(tablet.owner_address, []).append(index)
    return batches(
        by_master, phase.op_bytes, codec.MULTI_OP_ITEMS_MAX, codec.TRANSACTION_REQUEST_BYTES_MAX
    )


def _send(
    client: Client,
    names: list[TxOpName],
    to_send: list[Batch],
    phase: Phase,
    states: list[OpState],
    attempts: Attempts,
) -> None:
    """Sends every batch at once (one thread each), each within the phase's time, and judges
    each op's answer."""
    if not to_send:
        return
    bodies = [phase.request(batch.indices) for batch in to_send]

    def call(position: int) -> tuple[tuple[Status, object] | None, StratusError | None]:
        try:
            return client._send(
                to_send[position].address, phase.opcode, bodies[position], attempts
            ), None
        except StratusError as error:
            return None, error

    if len(to_send) == 1:
        results = [call(0)]
    else:
        results = list(client._transaction_executor().map(call, range(len(to_send))))
    for batch, (sent, error) in zip(to_send, results, strict=True):
        _judge_batch(client, names, batch, sent, error, phase, states, attempts)


def _judge_batch(
    client: Client,
    names: list[TxOpName],
    batch: Batch,
    sent: tuple[Status, object] | None,
    error: StratusError | None,
    phase: Phase,
    states: list[OpState],
    attempts: Attempts,
) -> None:
    """Judges the answer to one batch, op by op."""
    address = batch.address
    if error is not None:
        for index in batch.indices:
            if isinstance(error, Unavailable):
                # The master may be gone: the next attempt asks who serves the tablet now.
                client._forget_tablet_map(names[index].table_id)
                attempts.note(error)
                states[index] = Waiting(error)
            else:
                states[index] = Refused(error)
        return
    assert sent is not None
    status, decoded = sent
    if status is not Status.OK:
        # One status for the whole request (refused, or a master that does not own the
        # tablets): it is each op's.
        failure = failure_from_response(status, decoded)
        for index in batch.indices:
            states[index] = _judge_status(client, names[index].table_id, status, failure, attempts)
        return
    answers = phase.answers(decoded)
    if len(answers) != len(batch.indices):
        # An answer that does not fit the request: a broken peer, not retried.
        malformed = InternalError(
            f"master {address}: {len(answers)} answers to a {phase.opcode.name} of "
            f"{len(batch.indices)} ops"
        )
        for index in batch.indices:
            states[index] = Refused(malformed)
        return
    for index, (op_status, answer) in zip(batch.indices, answers, strict=True):
        if op_status is Status.OK:
            states[index] = Answered(answer)
        else:
            failure = error_for_status(op_status, f"master {address}")
            states[index] = _judge_status(
                client, names[index].table_id, op_status, failure, attempts
            )


def _judge_status(
    client: Client, table_id: int, status: Status, error: StratusError, attempts: Attempts
) -> OpState:
    """An op's state after its master answered ``status`` (not OK) for it."""
    if status is Status.EXPIRED_LEASE:
        return LeaseExpired()
    if status in _STALE_MAP_STATUSES:
        client._forget_tablet_map(table_id)
    elif status not in _TRANSIENT_STATUSES:
        return Refused(error)
    attempts.note(error)
    return Waiting(error)


# ---------------------------------------------------------------------------------------------
# The commit (Rust: transaction/commit.rs).


class Tickets:
    """One ticket per object, in the objects' order, all under one lease (taken in one go).
    Releasing them acknowledges the transaction's ops: only once every op acknowledged the
    decision (or the commit gave up on it)."""

    def __init__(self, tickets: list[RpcTicket]) -> None:
        assert tickets, "a commit with no object sends nothing"
        self._tickets = tickets

    @property
    def lease(self) -> int:
        return self._tickets[0].lease

    @property
    def transaction(self) -> int:
        """The transaction's id under its lease: its first op's rpc id."""
        return self._tickets[0].rpc

    def acknowledged(self) -> int:
        """What the client has acknowledged now: below the transaction's first op while its
        tickets are out."""
        return self._tickets[0].identity().acknowledged

    def rpc(self, index: int) -> int:
        return self._tickets[index].rpc

    def release(self) -> None:
        for ticket in self._tickets:
            ticket.release()

    def note_lease_expiry(self, client: Client, states: list[OpState]) -> None:
        """Forgets the lease if a master said it expired: the next mutation takes a new one."""
        if any(isinstance(state, LeaseExpired) for state in states):
            client._lease_agent.lost(self.lease)


class PreparePhase(Phase):
    """The PREPARE phase (or, validate-only, a read-only transaction's validation)."""

    opcode = Opcode.TX_PREPARE

    def __init__(
        self,
        objects: list[TxObject],
        tickets: Tickets,
        participants: list[TxOpName],
        validate_only: bool,
    ) -> None:
        self.objects = objects
        self.tickets = tickets
        self.participants = participants
        self.validate_only = validate_only

    def request(self, indices: list[int]) -> bytes:
        ops = [
            TxOp(
                self.objects[index].table_id,
                self.objects[index].key,
                self.tickets.rpc(index),
                self.objects[index].kind,
                self.objects[index].version_read,
                self.objects[index].value,
            )
            for index in indices
        ]
        return codec.tx_prepare_body(
            self.tickets.lease,
            self.tickets.acknowledged(),
            self.tickets.transaction,
            self.validate_only,
            ops,
            self.participants,
        )

    def answers(self, decoded: object) -> list[tuple[Status, object]]:
        assert isinstance(decoded, list)
        return [(vote.status, vote.vote) for vote in decoded if isinstance(vote, TxVoteResult)]

    def op_bytes(self, index: int) -> int:
        tx_object = self.objects[index]
        return _PREPARE_OP_FIXED_BYTES + len(tx_object.key) + len(tx_object.value)

    def settled(self, states: list[OpState]) -> bool:
        """Once an op voted ABORT, or can never be voted on here, the transaction aborts (or,
        for an op refused after it may have reached its master, is decided by the final
        votes): waiting for more votes is no use, and TX_REQUEST_ABORT makes the others
        final."""
        return any(
            (isinstance(state, Answered) and state.answer is TxVote.ABORT)
            or isinstance(state, (Refused, LeaseExpired))
            for state in states
        )


def participants_of(objects: list[TxObject], tickets: Tickets) -> list[TxOpName]:
    """Every op of the transaction, as TX_PREPARE lists its participants and as the later
    phases name its ops: table, key hash and rpc id."""
    return [
        TxOpName(tx_object.table_id, key_hash(tx_object.table_id, tx_object.key), tickets.rpc(i))
        for i, tx_object in enumerate(objects)
    ]


def in_commit_order(objects: list[TxObject]) -> list[TxObject]:
    """The objects in (table, key hash, key) order: the first one's ticket, the first taken,
    is the transaction's id."""
    return sorted(
        objects, key=lambda item: (item.table_id, key_hash(item.table_id, item.key), item.key)
    )


def _commit(client: Client, plan: list[PlannedOp]) -> TxOutcome:
    """Commits the transaction whose ops ``plan`` lists."""
    if all(op.kind is TxOpKind.READ for op in plan):
        return _validate(client, plan)
    objects = in_commit_order(_with_versions(client, plan))
    every = list(range(len(objects)))
    attempts = Attempts(f"commit of a transaction of {len(objects)} objects", client.timeout)
    tickets = Tickets(client._lease_agent.tickets(attempts, len(objects)))
    # Whether this call still holds the tickets (not handed to a background thread).
    holding = True
    try:
        names = participants_of(objects, tickets)
        prepare = PreparePhase(objects, tickets, names, validate_only=False)
        votes = run_phase(client, names, every, prepare, attempts)
        tickets.note_lease_expiry(client, votes)
        finishing = Finishing(client, tickets.lease, tickets.transaction, tickets, names)
        # Every vote final before deciding: the ones the client did not hear are asked for
        # with TX_REQUEST_ABORT (unless an ABORT decided the transaction already).
        final_votes = [answered(vote) for vote in votes]
        if decided(final_votes) is None:
            unknown = [index for index in every if final_votes[index] is None]
            answers = finishing.request_aborts(unknown, client.timeout)
            for index in unknown:
                final_votes[index] = answered(answers[index])
            if decided(final_votes) is None:
                error = unknown_outcome(final_votes, votes, answers)
                holding = False
                finish_in_background(client, tickets, names, final_votes, None)
                raise error
        decision = decided(final_votes)
        assert decision is not None
        acknowledgements = finishing.deliver(decision, every, client.timeout)
        undelivered = [
            index for index in every if not isinstance(acknowledgements[index], Answered)
        ]
        if undelivered:
            _log.warning(
                "%d of a transaction's ops' masters did not acknowledge its decision %s in "
                "time (first cause: %s): it goes on in the background, and their objects stay "
                "locked until they learn it",
                len(undelivered),
                decision.name,
                first_cause(acknowledgements),
            )
            holding = False
            finish_in_background(client, tickets, names, None, (decision, undelivered))
        return outcome(objects, votes, decision)
    finally:
        if holding:
            # Every op's outcome is settled on its master (or the commit failed): its result
            # may be forgotten.
            tickets.release()


def _validate(client: Client, plan: list[PlannedOp]) -> TxOutcome:
    """Commits a transaction that only read: nothing to do for one object it read itself (it
    was read at one instant); otherwise (more objects, or a version the caller gave) a
    validate-only PREPARE of every object, which locks and logs nothing, so no decision
    follows."""
    if len(plan) <= 1 and not any(op.version_given for op in plan):
        return TxOutcome.COMMITTED
    objects = in_commit_order(
        [TxObject(op.table_id, op.key, TxOpKind.READ, op.version_read or 0) for op in plan]
    )
    attempts = Attempts(f"validation of a transaction of {len(objects)} objects", client.timeout)
    # The wire wants rpc ids (never 0) even where nothing is recorded.
    tickets = Tickets(client._lease_agent.tickets(attempts, len(objects)))
    try:
        # Only to route the ops: a validation names no participants.
        names = participants_of(objects, tickets)
        prepare = PreparePhase(objects, tickets, [], validate_only=True)
        votes = run_phase(client, names, list(range(len(objects))), prepare, attempts)
        tickets.note_lease_expiry(client, votes)
    finally:
        tickets.release()
    return validation_outcome(objects, votes)


def _with_versions(client: Client, plan: list[PlannedOp]) -> list[TxObject]:
    """The ops of ``plan`` with a version each: the version read, or for an object written
    without being read, its current version (0: absent), read now (multi-reads of at most
    ``TRANSACTION_REQUEST_BYTES_MAX`` bytes of keys each), so that its PREPARE can lock it at a
    version the transaction observed."""
    versions = [op.version_read for op in plan]
    blind = [index for index, op in enumerate(plan) if op.version_read is None]
    chunks = batches(
        {"": blind},
        lambda index: len(plan[index].key) + _KEY_ITEM_FIXED_BYTES,
        codec.MULTI_OP_ITEMS_MAX,
        codec.TRANSACTION_REQUEST_BYTES_MAX,
    )
    for chunk in chunks:
        results = client.multi_read(
            [KeyItem(plan[index].table_id, plan[index].key) for index in chunk.indices]
        )
        for index, result in zip(chunk.indices, results, strict=True):
            if isinstance(result, ObjectDoesNotExist):
                versions[index] = 0
            elif isinstance(result, StratusError):
                raise result
            else:
                versions[index] = result[1]
    return [
        TxObject(op.table_id, op.key, op.kind, version or 0, op.value)
        for op, version in zip(plan, versions, strict=True)
    ]


def _conflict(objects: list[TxObject], votes: list[OpState]) -> AbortReason | None:
    """The first op that voted ABORT, as the conflict to report."""
    for tx_object, vote in zip(objects, votes, strict=True):
        if isinstance(vote, Answered) and vote.answer is TxVote.ABORT:
            return AbortReason.conflict(tx_object.table_id, tx_object.key)
    return None


def _refusal(votes: list[OpState]) -> StratusError | None:
    """The first op refused for a reason retrying cannot cure, as the error to report:
    nothing of the transaction was applied."""
    for vote in votes:
        if isinstance(vote, Refused):
            return error_for_status(
                vote.error.status,
                f"the transaction was aborted, nothing of it applied: {vote.error.message}",
                vote.error.version,
            )
    return None


def outcome(objects: list[TxObject], votes: list[OpState], decision: TxDecision) -> TxOutcome:
    """What a read-write transaction's caller is told once ``decision`` is taken from the
    final votes, given the votes its PREPARE round learnt: committed; or aborted in a conflict
    (an op voted ABORT on PREPARE); or the error of an op refused for a reason retrying cannot
    cure (nothing was applied); or aborted for want of votes (made ABORT by TX_REQUEST_ABORT).
    """
    if decision is TxDecision.COMMIT:
        return TxOutcome.COMMITTED
    return _abort_outcome(objects, votes)


def validation_outcome(objects: list[TxObject], votes: list[OpState]) -> TxOutcome:
    """What a read-only transaction's caller is told, from its validation's votes (nothing was
    locked, so an unknown vote only means the reads could not be shown consistent)."""
    if all(isinstance(vote, Answered) and vote.answer is TxVote.PREPARED for vote in votes):
        return TxOutcome.COMMITTED
    return _abort_outcome(objects, votes)


def _abort_outcome(objects: list[TxObject], votes: list[OpState]) -> TxOutcome:
    """Why a transaction did not commit: a conflict (an op voted ABORT); else the error of an
    op refused for a reason retrying cannot cure (raised); else a want of votes (TIMEOUT)."""
    reason = _conflict(objects, votes)
    if reason is not None:
        return TxOutcome.aborted(reason)
    refusal = _refusal(votes)
    if refusal is not None:
        raise refusal
    return TxOutcome.aborted(AbortReason.TIMEOUT)


def unknown_outcome(
    final_votes: list[TxVote | None], votes: list[OpState], answers: list[OpState]
) -> Timeout:
    """The error of a commit whose votes could neither all be learnt nor all be made final:
    ``final_votes`` as they stand, ``votes`` of the PREPARE round, ``answers`` of
    TX_REQUEST_ABORT."""
    unknown = sum(1 for vote in final_votes if vote is None)
    return Timeout(
        f"the transaction's outcome is unknown: {unknown} of its {len(final_votes)} ops have no "
        f"vote (first cause: {first_cause(votes)}), and their masters could not be asked in "
        f"time to make it final (first cause: {first_cause(answers)}); it commits only if "
        "every op was prepared, which the participants settle",
        last_error=_first_error(answers) or _first_error(votes),
    )


# ---------------------------------------------------------------------------------------------
# Finishing (Rust: transaction/finish.rs): making unknown votes final (TX_REQUEST_ABORT),
# deciding from the final votes, and delivering the decision (TX_DECISION).
#
# Why a vote must be final before anyone decides on it: a PREPARE still in flight may yet
# prepare its op, so deciding ABORT for an op whose vote is unknown could contradict a
# participant's recovery that finds every op PREPARED and commits. TX_REQUEST_ABORT makes the
# vote final, so whoever decides, the client or any participant, decides alike.


def answered(state: OpState) -> TxVote | None:
    """The vote of an op of a finished phase, if it has one."""
    if isinstance(state, Answered):
        return state.answer
    return None


def decided(votes: list[TxVote | None]) -> TxDecision | None:
    """The decision from every op's final vote (None while some vote is unknown): COMMIT iff
    every op voted PREPARED; ABORT as soon as one voted ABORT."""
    if TxVote.ABORT in votes:
        return TxDecision.ABORT
    if all(vote is not None for vote in votes):
        return TxDecision.COMMIT
    return None


def _first_error(states: list[OpState]) -> StratusError | None:
    for state in states:
        if isinstance(state, (Waiting, Refused)) and state.error is not None:
            return state.error
    return None


def first_cause(states: list[OpState]) -> str:
    """Why the first op without an answer has none."""
    for state in states:
        if isinstance(state, (Waiting, Refused)) and state.error is not None:
            return str(state.error)
        if isinstance(state, LeaseExpired):
            return "the client's lease expired"
    return "no time left"


class RequestAbortPhase(Phase):
    opcode = Opcode.TX_REQUEST_ABORT

    def __init__(self, finishing: Finishing) -> None:
        self.finishing = finishing

    def request(self, indices: list[int]) -> bytes:
        return codec.tx_request_abort_body(
            self.finishing.lease, self.finishing.transaction, self.finishing.names_at(indices)
        )

    def answers(self, decoded: object) -> list[tuple[Status, object]]:
        assert isinstance(decoded, list)
        return [(vote.status, vote.vote) for vote in decoded if isinstance(vote, TxVoteResult)]

    def settled(self, states: list[OpState]) -> bool:
        """One final ABORT decides the transaction: the other votes no longer matter."""
        return any(isinstance(state, Answered) and state.answer is TxVote.ABORT for state in states)


class DecisionPhase(Phase):
    opcode = Opcode.TX_DECISION

    def __init__(self, finishing: Finishing, decision: TxDecision) -> None:
        self.finishing = finishing
        self.decision = decision

    def request(self, indices: list[int]) -> bytes:
        return codec.tx_decision_body(
            self.finishing.lease,
            self.finishing.acknowledged(),
            self.finishing.transaction,
            self.decision,
            self.finishing.names_at(indices),
        )

    def answers(self, decoded: object) -> list[tuple[Status, object]]:
        assert isinstance(decoded, list)
        return [(status, None) for status in decoded]


class Finishing:
    """One transaction being finished: its identity, its ops, and what its requests
    acknowledge (``tickets``: the client's own, it acknowledges below them; None for a
    participant finishing another client's transaction, which acknowledges nothing)."""

    def __init__(
        self,
        client: Client,
        lease: int,
        transaction: int,
        tickets: Tickets | None,
        names: list[TxOpName],
    ) -> None:
        self.client = client
        self.lease = lease
        self.transaction = transaction
        self.tickets = tickets
        self.names = names

    def names_at(self, indices: list[int]) -> list[TxOpName]:
        return [self.names[index] for index in indices]

    def acknowledged(self) -> int:
        return 0 if self.tickets is None else self.tickets.acknowledged()

    def request_aborts(self, indices: list[int], timeout: float, deadline: float | None = None):
        """TX_REQUEST_ABORT for the ops at ``indices``, until each has its final vote or the
        time is up."""
        attempts = self._attempts("TX_REQUEST_ABORT", timeout, deadline)
        states = run_phase(self.client, self.names, indices, RequestAbortPhase(self), attempts)
        self._note_lease_expiry(states)
        return states

    def deliver(
        self,
        decision: TxDecision,
        indices: list[int],
        timeout: float,
        deadline: float | None = None,
    ) -> list[OpState]:
        """TX_DECISION of ``decision`` for the ops at ``indices``, until each master
        acknowledged its ops or the time is up."""
        attempts = self._attempts("TX_DECISION", timeout, deadline)
        phase = DecisionPhase(self, decision)
        states = run_phase(self.client, self.names, indices, phase, attempts)
        self._note_lease_expiry(states)
        return states

    def _attempts(self, what: str, timeout: float, deadline: float | None) -> Attempts:
        attempts = Attempts(f"{what} of transaction {self.transaction}", timeout)
        if deadline is not None:
            attempts.deadline = min(attempts.deadline, deadline)
        return attempts

    def _note_lease_expiry(self, states: list[OpState]) -> None:
        if self.tickets is not None:
            self.tickets.note_lease_expiry(self.client, states)


def finish_transaction(
    client: Client, lease: int, transaction: int, participants: list[TxOpName]
) -> TxDecision:
    """``Client.finish_transaction``."""
    names = [TxOpName(*name) for name in participants]
    if (
        not names
        or len(names) > codec.TRANSACTION_OBJECTS_MAX
        or lease == 0
        or transaction == 0
        or any(name.rpc == 0 for name in names)
    ):
        raise InvalidParameter(
            f"cannot finish transaction {transaction} of lease {lease} with {len(names)} "
            f"participants (1 to {codec.TRANSACTION_OBJECTS_MAX}, ids not 0)"
        )
    finishing = Finishing(client, lease, transaction, None, names)
    every = list(range(len(names)))
    answers = finishing.request_aborts(every, client.timeout)
    decision = decided([answered(state) for state in answers])
    if decision is None:
        raise _incomplete("its votes could not all be learnt", answers)
    acknowledgements = finishing.deliver(decision, every, client.timeout)
    if not all(isinstance(state, Answered) for state in acknowledgements):
        raise _incomplete(
            f"decided {decision.name}, but not every master acknowledged it", acknowledgements
        )
    return decision


def _incomplete(what: str, states: list[OpState]) -> Timeout:
    unanswered = sum(1 for state in states if not isinstance(state, Answered))
    return Timeout(
        f"the transaction could not be finished: {what} ({unanswered} of its {len(states)} ops "
        f"unanswered; first cause: {first_cause(states)})",
        last_error=_first_error(states),
    )


def finish_in_background(
    client: Client,
    tickets: Tickets,
    names: list[TxOpName],
    votes: list[TxVote | None] | None,
    delivery: tuple[TxDecision, list[int]] | None,
) -> threading.Thread:
    """Goes on with what a commit left unfinished (``votes`` still unknown, or the
    ``delivery`` of a decision to the ops at its indices) in a thread of its own, holding the
    commit's tickets (so the client acknowledges none of its ops meanwhile), for at most
    ``BACKGROUND_FINISH_SECONDS``; then gives the tickets back, with a warning if it did not
    finish. A client closed meanwhile ends it (the participants finish the transaction)."""

    def work() -> None:
        finished = False
        try:
            finished = _finish(client, tickets, names, votes, delivery)
        except RuntimeError:
            # The client was closed: the participants finish the transaction.
            tickets.release()
            return
        except Exception:  # noqa: BLE001 (a thread's last resort: logged, tickets given back)
            _log.exception("finishing a transaction in the background failed")
        finally:
            tickets.release()
        if not finished:
            _log.warning(
                "the decision of transaction %d of lease %d could not be delivered to every op "
                "within %g s: its ops are acknowledged now, and the participants' recovery "
                "finishes it",
                tickets.transaction,
                tickets.lease,
                BACKGROUND_FINISH_SECONDS,
            )

    thread = threading.Thread(target=work, name="stratus-transaction-finish", daemon=True)
    thread.start()
    return thread


def _finish(
    client: Client,
    tickets: Tickets,
    names: list[TxOpName],
    votes: list[TxVote | None] | None,
    delivery: tuple[TxDecision, list[int]] | None,
) -> bool:
    """The work of ``finish_in_background``: rounds of at most an operation's time each (so a
    master that stopped answering is asked again), until finished (True) or out of time or
    lease (False)."""
    end = time.monotonic() + BACKGROUND_FINISH_SECONDS
    finishing = Finishing(client, tickets.lease, tickets.transaction, tickets, names)
    pauses = Attempts("finishing a transaction in the background", BACKGROUND_FINISH_SECONDS)
    while time.monotonic() < end:
        if delivery is None:
            assert votes is not None
            unknown = [index for index, vote in enumerate(votes) if vote is None]
            states = finishing.request_aborts(unknown, client.timeout, end)
            for index in unknown:
                votes[index] = answered(states[index])
            if any(isinstance(state, LeaseExpired) for state in states):
                return False
            decision = decided(votes)
            if decision is not None:
                delivery = (decision, list(range(len(names))))
        else:
            decision, undelivered = delivery
            states = finishing.deliver(decision, undelivered, client.timeout, end)
            if any(isinstance(state, LeaseExpired) for state in states):
                return False
            undelivered = [
                index for index in undelivered if not isinstance(states[index], Answered)
            ]
            if not undelivered:
                _log.debug("a transaction's decision %s was delivered late", decision.name)
                return True
            delivery = (decision, undelivered)
        if not pauses.pause_before_retry():
            break
    return False
