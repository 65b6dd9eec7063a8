"""Transactions without a cluster: the buffer and its limits, the retry policy, the decision
from the votes, and the whole commit against scripted fake masters (what each phase sends to
whom, and what the caller is told for each combination of votes).

Timeouts here are short but generous for loopback; no test asserts a duration.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest
from fake_server import (
    MULTI_READ,
    READ,
    TX_DECISION,
    TX_PREPARE,
    TX_REQUEST_ABORT,
    FakeServer,
    Request,
    ScriptedCoordinator,
    TxPrepareOp,
    error_frame,
    read_request_key,
    response_frame,
    start,
    tx_decision_request,
    tx_prepare_request,
    tx_request_abort_request,
    tx_results_body,
    tx_votes_body,
    unused_address,
)

from stratus_client import (
    AbortKind,
    AbortReason,
    Client,
    InvalidObject,
    InvalidParameter,
    Status,
    Timeout,
    TransactionAborted,
    TxDecision,
    TxOpName,
    TxOutcome,
    ValueTooLarge,
    key_hash,
)
from stratus_client import transaction as tx_module
from stratus_client.codec import TRANSACTION_BYTES_MAX, TRANSACTION_OBJECTS_MAX, TxOpKind, TxVote
from stratus_client.retry import Attempts
from stratus_client.transaction import (
    Answered,
    Batch,
    ConflictRetries,
    LeaseExpired,
    PlannedOp,
    Refused,
    TxBuffer,
    TxObject,
    Waiting,
    batches,
    decided,
    incremented,
    outcome,
    unknown_outcome,
    validation_outcome,
)

TABLE = 5
HALF = 1 << 63
TOP = (1 << 64) - 1
NORMAL = 0
OK, OBJECT_DOESNT_EXIST, RETRY, VALUE_TOO_LARGE, EXPIRED_LEASE = 0, 3, 9, 15, 30
PREPARED, ABORT = 1, 2
COMMIT = 1


def key_where(predicate, prefix: str = "key") -> bytes:
    for number in range(10_000):
        key = f"{prefix}-{number}".encode()
        if predicate(key_hash(TABLE, key)):
            return key
    raise AssertionError("no such key")


LOW_KEY = key_where(lambda hash_value: hash_value < HALF)
HIGH_KEY = key_where(lambda hash_value: hash_value >= HALF)
LOW_NAME = (TABLE, key_hash(TABLE, LOW_KEY))
HIGH_NAME = (TABLE, key_hash(TABLE, HIGH_KEY))


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# A master with objects, answering reads and the transaction requests.


class TxMaster(FakeServer):
    """A fake master holding ``objects`` (key -> (value, version)). It answers READ and
    MULTI_READ from them; TX_PREPARE with ``vote(op, request)`` per op (by default PREPARED
    when the object is at the version read, else ABORT); TX_REQUEST_ABORT with
    ``request_abort(name)`` per op (by default ABORT); TX_DECISION with OK per op. ``prepare``
    and ``request_abort`` may also return a whole frame instead (a status for the request)."""

    def __init__(self) -> None:
        self.objects: dict[bytes, tuple[bytes, int]] = {}
        self.vote = self.vote_by_version
        self.request_abort = lambda name: (OK, ABORT)
        self.whole_prepare = None  # a function of the request giving a frame, or None
        super().__init__(self._answer)

    def version_of(self, key: bytes) -> int:
        found = self.objects.get(key)
        return 0 if found is None else found[1]

    def vote_by_version(self, op: TxPrepareOp, request) -> tuple[int, int]:
        return OK, PREPARED if self.version_of(op.key) == op.version_read else ABORT

    def prepares(self):
        return [tx_prepare_request(r) for r in self.requests_with_opcode(TX_PREPARE)]

    def decisions(self):
        return [tx_decision_request(r) for r in self.requests_with_opcode(TX_DECISION)]

    def request_aborts(self):
        return [tx_request_abort_request(r) for r in self.requests_with_opcode(TX_REQUEST_ABORT)]

    def _answer(self, request: Request) -> bytes:
        if request.opcode == READ:
            _, key = read_request_key(request.body)
            if key not in self.objects:
                return response_frame(request, OBJECT_DOESNT_EXIST, struct.pack("<QIQ", 0, 0, 0))
            value, version = self.objects[key]
            body = struct.pack("<QI", version, len(value)) + value + struct.pack("<Q", 0)
            return response_frame(request, OK, body)
        if request.opcode == MULTI_READ:
            (count,) = struct.unpack_from("<I", request.body)
            offset, body = 4, struct.pack("<I", count)
            for _ in range(count):
                _, key_length = struct.unpack_from("<QH", request.body, offset)
                key = request.body[offset + 10 : offset + 10 + key_length]
                offset += 10 + key_length + 9
                if key in self.objects:
                    value, version = self.objects[key]
                    body += struct.pack("<HQI", OK, version, len(value)) + value
                else:
                    body += struct.pack("<HQI", OBJECT_DOESNT_EXIST, 0, 0)
            return response_frame(request, OK, body)
        if request.opcode == TX_PREPARE:
            if self.whole_prepare is not None:
                frame = self.whole_prepare(request)
                if frame is not None:
                    return frame
            prepare = tx_prepare_request(request)
            votes = []
            for op in prepare.ops:
                status, vote = self.vote(op, prepare)
                votes.append((status, vote, self.version_of(op.key)))
            return response_frame(request, OK, tx_votes_body(votes))
        if request.opcode == TX_REQUEST_ABORT:
            names = tx_request_abort_request(request).ops
            votes = [(*self.request_abort(name), 0) for name in names]
            return response_frame(request, OK, tx_votes_body(votes))
        if request.opcode == TX_DECISION:
            names = tx_decision_request(request).ops
            return response_frame(request, OK, tx_results_body([OK] * len(names)))
        return error_frame(request, 8, "not scripted")


@pytest.fixture
def cluster2(servers):
    """Two fake masters, each serving half of TABLE, and a coordinator."""
    low = start(servers, TxMaster())
    high = start(servers, TxMaster())
    coordinator = start(
        servers,
        ScriptedCoordinator(
            [
                (TABLE, 0, HALF - 1, 1, low.address, NORMAL),
                (TABLE, HALF, TOP, 2, high.address, NORMAL),
            ]
        ),
    )
    return low, high, coordinator


def outstanding_acknowledged(client: Client) -> int:
    """What the client's next mutation would acknowledge (below its oldest ticket out)."""
    ticket = client._lease_agent.ticket(Attempts("test", 5.0))
    try:
        return ticket.identity().acknowledged
    finally:
        ticket.release()


# ---------------------------------------------------------------------------------------------
# The buffer.


def obj(key: bytes) -> tuple[int, bytes]:
    return (1, key)


def test_a_transaction_reads_its_own_writes_and_removals():
    buffer = TxBuffer()
    assert buffer.seen(obj(b"a")) == (False, None)
    buffer.change(obj(b"a"), b"1")
    assert buffer.seen(obj(b"a")) == (True, b"1")
    buffer.change(obj(b"a"), b"2")
    assert buffer.seen(obj(b"a")) == (True, b"2"), "the last write wins"
    buffer.change(obj(b"a"), None)
    assert buffer.seen(obj(b"a")) == (True, None)
    # Its own write hides what it read, and a read arriving after a write changes nothing.
    buffer.change(obj(b"b"), b"mine")
    assert buffer.record_read(obj(b"b"), b"theirs", 4) == b"mine"
    assert buffer.objects == 2


def test_the_first_read_of_an_object_is_the_one_the_transaction_sees():
    buffer = TxBuffer()
    assert buffer.record_read(obj(b"a"), b"old", 3) == b"old"
    assert buffer.record_read(obj(b"a"), b"new", 5) == b"old"
    assert buffer.seen(obj(b"a")) == (True, b"old")
    buffer.record_read(obj(b"absent"), None, 0)
    assert buffer.seen(obj(b"absent")) == (True, None)
    assert [(op.key, op.version_read) for op in buffer.take()] == [(b"a", 3), (b"absent", 0)]


def test_the_plan_has_one_op_per_object_with_the_version_read():
    buffer = TxBuffer()
    buffer.record_read(obj(b"read"), b"x", 7)
    buffer.record_read(obj(b"read-then-written"), None, 0)
    buffer.change(obj(b"read-then-written"), b"new")
    buffer.record_read(obj(b"read-then-removed"), b"y", 2)
    buffer.change(obj(b"read-then-removed"), None)
    buffer.change(obj(b"blind"), b"z")
    plan = sorted(buffer.take(), key=lambda op: op.key)
    assert [(op.key, op.kind, op.version_read, op.value) for op in plan] == [
        (b"blind", TxOpKind.WRITE, None, b"z"),
        (b"read", TxOpKind.READ, 7, b""),
        (b"read-then-removed", TxOpKind.REMOVE, 2, b""),
        (b"read-then-written", TxOpKind.WRITE, 0, b"new"),
    ]


def test_an_expected_version_is_the_version_read_and_a_read_at_another_one_makes_it_stale():
    buffer = TxBuffer()
    buffer.expect_version(obj(b"watched"), 3)
    buffer.expect_version(obj(b"watched-written"), 0)
    buffer.change(obj(b"watched-written"), b"new")
    buffer.expect_version(obj(b"read-same"), 5)
    assert buffer.seen(obj(b"read-same")) == (False, None)
    buffer.record_read(obj(b"read-same"), b"x", 5)
    assert buffer.objects == 3, "an expected object counts once, read or not"
    assert buffer.stale is None
    assert buffer.record_read(obj(b"watched"), b"y", 4) == b"y"
    assert buffer.stale == obj(b"watched"), "version 4 is not the one expected"
    plan = sorted(buffer.take(), key=lambda op: op.key)
    assert [(op.key, op.kind, op.version_read, op.version_given) for op in plan] == [
        (b"read-same", TxOpKind.READ, 5, False),
        (b"watched", TxOpKind.READ, 3, False),
        (b"watched-written", TxOpKind.WRITE, 0, True),
    ]
    buffer = TxBuffer()
    buffer.record_read(obj(b"a"), None, 0)
    buffer.expect_version(obj(b"a"), 0)
    assert buffer.stale is None
    buffer.expect_version(obj(b"a"), 2)
    assert buffer.stale == obj(b"a"), "read at 0, expected at 2"


def test_a_committed_transaction_refuses_everything():
    buffer = TxBuffer()
    buffer.change(obj(b"a"), b"1")
    buffer.take()
    for call in (
        buffer.take,
        lambda: buffer.change(obj(b"a"), b"2"),
        lambda: buffer.change(obj(b"a"), None),
        lambda: buffer.seen(obj(b"a")),
        lambda: buffer.record_read(obj(b"b"), None, 0),
        lambda: buffer.expect_version(obj(b"b"), 1),
    ):
        with pytest.raises(InvalidParameter, match="committed already"):
            call()


def test_objects_past_the_limit_are_refused_before_anything_is_sent():
    buffer = TxBuffer()
    for index in range(TRANSACTION_OBJECTS_MAX):
        if index % 2 == 0:
            buffer.change(obj(f"k{index}".encode()), b"v")
        else:
            buffer.record_read(obj(f"k{index}".encode()), None, 0)
    one_more = obj(b"one more")
    with pytest.raises(InvalidParameter, match="TRANSACTION_OBJECTS_MAX"):
        buffer.change(one_more, b"v")
    with pytest.raises(InvalidParameter):
        buffer.seen(one_more)
    with pytest.raises(InvalidParameter):
        buffer.record_read(one_more, None, 0)
    with pytest.raises(InvalidParameter):
        buffer.expect_version(one_more, 0)
    # Objects it holds may still change.
    buffer.change(obj(b"k1"), b"read, now written")
    buffer.change(obj(b"k0"), None)
    assert len(buffer.take()) == TRANSACTION_OBJECTS_MAX


def test_bytes_past_the_limit_are_refused_and_replaced_values_are_given_back():
    buffer = TxBuffer()
    half = bytes(TRANSACTION_BYTES_MAX // 2)
    buffer.change(obj(b"a"), half)
    # Keys count too: "a" and "b" take two bytes beside the values.
    with pytest.raises(InvalidParameter, match="TRANSACTION_BYTES_MAX"):
        buffer.change(obj(b"b"), half)
    buffer.change(obj(b"b"), bytes(TRANSACTION_BYTES_MAX // 2 - 2))
    assert buffer.bytes == TRANSACTION_BYTES_MAX
    # Replacing a value (or removing the object) gives its bytes back.
    buffer.change(obj(b"a"), None)
    assert buffer.bytes == TRANSACTION_BYTES_MAX - TRANSACTION_BYTES_MAX // 2
    buffer.change(obj(b"a"), half)
    with pytest.raises(InvalidParameter):
        buffer.record_read(obj(b"c"), None, 0)


def test_increments_are_eight_byte_little_endian_sums():
    assert incremented(None, 5) == 5, "an absent object counts as 0"
    assert incremented((7).to_bytes(8, "little", signed=True), -10) == -3
    for wrong in (b"", b"1234567", b"123456789"):
        with pytest.raises(InvalidObject):
            incremented(wrong, 1)
    with pytest.raises(InvalidObject, match="overflows"):
        incremented(((1 << 63) - 1).to_bytes(8, "little", signed=True), 1)


def test_the_limits_hold_through_the_transaction_before_anything_is_sent():
    # Nothing listens at the coordinator's address: any request would fail.
    with Client(unused_address(), timeout=1) as client:
        tx = client.transaction()
        for index in range(TRANSACTION_OBJECTS_MAX):
            tx.write(TABLE, f"k{index}", b"")
        with pytest.raises(InvalidParameter):
            tx.write(TABLE, "one more", b"")
        with pytest.raises(InvalidParameter):
            tx.read(TABLE, "one more")
        tx = client.transaction()
        with pytest.raises(InvalidParameter):
            tx.write(TABLE, "big", bytes(TRANSACTION_BYTES_MAX))
        with pytest.raises(TypeError):
            tx.write(TABLE, "k", 5)
        with pytest.raises(ValueError):
            tx.expect_version(TABLE, "k", -1)


# ---------------------------------------------------------------------------------------------
# The retry policy, phases' batches, and the decision.


def test_conflicts_are_retried_with_growing_pauses_a_bounded_number_of_times():
    import random

    retries = ConflictRetries(10.0, random.Random(7))
    pauses = []
    while (pause := retries.next_pause(0.0)) is not None:
        pauses.append(pause)
    assert len(pauses) == tx_module.TRANSACTION_ATTEMPTS_MAX - 1 == 31
    assert 0.0005 <= pauses[0] < 0.001
    assert all(pause < 0.064 for pause in pauses)
    assert pauses[-1] >= 0.032
    assert sum(pauses) < 2.0


def test_no_attempt_starts_past_the_time_budget():
    retries = ConflictRetries(0.1)
    assert retries.next_pause(0.01) is not None
    assert retries.next_pause(0.1) is None


def test_ops_are_grouped_by_master_and_split_by_count_and_by_bytes():
    grouped = batches({"b:1": [0, 2], "a:1": [1, 3, 4]}, lambda index: 10, 100, 1_000)
    assert grouped == [Batch("a:1", [1, 3, 4]), Batch("b:1", [0, 2])]
    seven = {"a:1": list(range(7))}
    assert batches(seven, lambda index: 1, 3, 1_000) == [
        Batch("a:1", [0, 1, 2]),
        Batch("a:1", [3, 4, 5]),
        Batch("a:1", [6]),
    ]
    # Op 2 is large: it ends the first request, and alone over the limit it still goes alone.
    sizes = [4, 4, 30, 4, 4, 4, 4]
    assert batches(seven, lambda index: sizes[index], 100, 12) == [
        Batch("a:1", [0, 1]),
        Batch("a:1", [2]),
        Batch("a:1", [3, 4, 5]),
        Batch("a:1", [6]),
    ]


def test_the_decision_needs_every_vote_unless_one_is_abort():
    assert decided([TxVote.PREPARED, TxVote.PREPARED]) is TxDecision.COMMIT
    assert decided([TxVote.PREPARED, None]) is None
    assert decided([None, TxVote.ABORT]) is TxDecision.ABORT
    assert decided([TxVote.PREPARED, TxVote.ABORT]) is TxDecision.ABORT


def three_objects() -> list[TxObject]:
    return [TxObject(1, f"k{i}".encode(), TxOpKind.WRITE, 1, b"v") for i in range(3)]


PREPARED_STATE = Answered(TxVote.PREPARED)
ABORT_STATE = Answered(TxVote.ABORT)


def refused():
    return Refused(ValueTooLarge("value of 2 MiB"))


def waiting():
    from stratus_client import CouldNotConnect

    return Waiting(CouldNotConnect("master a:1"))


def test_the_outcome_is_the_decision_with_its_reason():
    objects = three_objects()
    commit, abort = TxDecision.COMMIT, TxDecision.ABORT
    # Committed, even when some votes were made final by TX_REQUEST_ABORT.
    assert outcome(objects, [PREPARED_STATE, waiting(), PREPARED_STATE], commit).committed
    # An ABORT on PREPARE is a conflict on its object, whatever else happened.
    conflict = TxOutcome.aborted(AbortReason.conflict(1, b"k1"))
    for votes in (
        [PREPARED_STATE, ABORT_STATE, PREPARED_STATE],
        [waiting(), ABORT_STATE, ABORT_STATE],
        [refused(), ABORT_STATE, LeaseExpired()],
    ):
        assert outcome(objects, votes, abort) == conflict
    # Aborted by votes made final: for want of votes, or for an op refused.
    assert outcome(objects, [PREPARED_STATE, waiting(), Waiting()], abort) == TxOutcome.aborted(
        AbortReason.TIMEOUT
    )
    with pytest.raises(ValueTooLarge, match="nothing of it applied"):
        outcome(objects, [PREPARED_STATE, refused(), waiting()], abort)


def test_votes_neither_learnt_nor_made_final_leave_the_outcome_unknown():
    error = unknown_outcome(
        [TxVote.PREPARED, None], [PREPARED_STATE, waiting()], [Waiting(), LeaseExpired()]
    )
    assert isinstance(error, Timeout)
    assert "outcome is unknown" in error.message
    assert "1 of its 2 ops" in error.message
    assert "master a:1" in error.message
    assert "lease expired" in error.message


def test_a_validation_commits_when_every_read_is_unchanged():
    objects = three_objects()[:2]
    assert validation_outcome(objects, [PREPARED_STATE, PREPARED_STATE]).committed
    aborted = validation_outcome(objects, [ABORT_STATE, waiting()])
    assert aborted.reason is not None and aborted.reason.kind is AbortKind.CONFLICT
    assert validation_outcome(objects, [PREPARED_STATE, waiting()]) == TxOutcome.aborted(
        AbortReason.TIMEOUT
    )
    with pytest.raises(ValueTooLarge):
        validation_outcome(objects, [PREPARED_STATE, refused()])


def test_outcomes_and_reasons_read_as_their_meaning():
    assert TxOutcome.COMMITTED and not TxOutcome.aborted(AbortReason.TIMEOUT)
    with pytest.raises(ValueError):
        TxOutcome(True, AbortReason.TIMEOUT)
    with pytest.raises(ValueError):
        TxOutcome(False)
    assert "conflict on key alice of table 3" in str(AbortReason.conflict(3, b"alice"))
    assert AbortReason.conflict(3, b"a").is_conflict and not AbortReason.TIMEOUT.is_conflict
    planned = PlannedOp(1, b"k", TxOpKind.READ, 0)
    assert not planned.version_given


# ---------------------------------------------------------------------------------------------
# Commits against fake masters.


def test_a_commit_prepares_on_each_master_then_delivers_the_decision(cluster2):
    low, high, coordinator = cluster2
    low.objects[LOW_KEY] = (b"10", 3)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        assert tx.read(TABLE, LOW_KEY) == b"10"
        tx.write(TABLE, LOW_KEY, b"9")
        assert tx.read(TABLE, LOW_KEY) == b"9", "a transaction reads its own writes"
        tx.write(TABLE, HIGH_KEY, b"1")  # blind: its version is read at commit
        assert tx.commit() == TxOutcome.COMMITTED
        with pytest.raises(InvalidParameter, match="committed already"):
            tx.commit()
        with pytest.raises(InvalidParameter):
            tx.read(TABLE, LOW_KEY)
        # Every op acknowledged its decision: the tickets (rpcs 1 and 2) are given back.
        assert outstanding_acknowledged(client) == 2
    assert len(high.requests_with_opcode(MULTI_READ)) == 1
    assert low.requests_with_opcode(MULTI_READ) == []
    (low_prepare,) = low.prepares()
    (high_prepare,) = high.prepares()
    # In (table, key hash) order: the low key's op is the first, and its rpc id names the
    # transaction; every request lists every op.
    participants = [(*LOW_NAME, 1), (*HIGH_NAME, 2)]
    for prepare in (low_prepare, high_prepare):
        assert (prepare.lease, prepare.acknowledged, prepare.transaction) == (1, 0, 1)
        assert not prepare.validate_only
        assert prepare.participants == participants
    assert low_prepare.ops == [TxPrepareOp(TABLE, LOW_KEY, 1, 2, 3, b"9")]
    assert high_prepare.ops == [TxPrepareOp(TABLE, HIGH_KEY, 2, 2, 0, b"1")]
    assert [(d.transaction, d.decision, d.ops) for d in low.decisions()] == [
        (1, COMMIT, [participants[0]])
    ]
    assert [(d.transaction, d.decision, d.ops) for d in high.decisions()] == [
        (1, COMMIT, [participants[1]])
    ]
    assert low.request_aborts() == [] and high.request_aborts() == []


def test_an_object_changed_since_it_was_read_aborts_in_a_conflict(cluster2):
    low, high, coordinator = cluster2
    low.objects[LOW_KEY] = (b"10", 3)
    high.objects[HIGH_KEY] = (b"0", 8)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        tx.read(TABLE, LOW_KEY)
        tx.read(TABLE, HIGH_KEY)
        tx.write(TABLE, LOW_KEY, b"x")
        tx.write(TABLE, HIGH_KEY, b"y")
        low.objects[LOW_KEY] = (b"11", 4)  # written by someone else meanwhile
        result = tx.commit()
        assert outstanding_acknowledged(client) == 2
    assert result == TxOutcome.aborted(AbortReason.conflict(TABLE, LOW_KEY))
    # The ABORT decided: no vote is asked for, and every op hears the decision.
    assert low.request_aborts() == [] and high.request_aborts() == []
    assert [d.decision for d in low.decisions()] == [2]
    assert [d.decision for d in high.decisions()] == [2]


def test_ops_answered_retry_go_again_with_the_same_rpc_ids(cluster2):
    low, high, coordinator = cluster2
    retries = {"low": 2, "high": 1}

    def low_vote(op, request):
        if retries["low"]:
            retries["low"] -= 1
            return RETRY, ABORT  # not voted on: the vote byte means nothing
        return OK, PREPARED

    def high_whole(request):
        if retries["high"]:
            retries["high"] -= 1
            return error_frame(request, RETRY, "busy")
        return None

    low.vote = low_vote
    high.whole_prepare = high_whole
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        tx.write(TABLE, HIGH_KEY, b"b")
        assert tx.commit().committed
    low_prepares = low.prepares()
    assert len(low_prepares) == 3
    assert {(p.transaction, tuple(op.rpc for op in p.ops)) for p in low_prepares} == {(1, (1,))}
    assert len(high.requests_with_opcode(TX_PREPARE)) == 2
    assert [d.decision for d in low.decisions() + high.decisions()] == [COMMIT, COMMIT]


@pytest.mark.parametrize(
    "final_vote, expected",
    [
        (ABORT, TxOutcome.aborted(AbortReason.TIMEOUT)),
        (PREPARED, TxOutcome.COMMITTED),
    ],
)
def test_votes_not_learnt_in_time_are_made_final_before_deciding(cluster2, final_vote, expected):
    low, high, coordinator = cluster2
    low.vote = lambda op, request: (RETRY, ABORT)  # never votes
    low.request_abort = lambda name: (OK, final_vote)
    with Client(coordinator.address, timeout=0.5) as client:
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        tx.write(TABLE, HIGH_KEY, b"b")
        assert tx.commit() == expected
    # Only the op without a vote was asked for it; then every op hears the decision.
    assert [(r.lease, r.transaction, r.ops) for r in low.request_aborts()] == [
        (1, 1, [(*LOW_NAME, 1)])
    ]
    assert high.request_aborts() == []
    decision = COMMIT if final_vote == PREPARED else 2
    assert [d.decision for d in low.decisions()] == [decision]
    assert [d.decision for d in high.decisions()] == [decision]


def test_an_unknown_outcome_is_a_timeout_and_the_commit_finishes_in_the_background(cluster2):
    low, high, coordinator = cluster2
    answering = threading.Event()
    low.vote = lambda op, request: (RETRY, ABORT)
    low.request_abort = lambda name: (OK, PREPARED) if answering.is_set() else (RETRY, ABORT)
    with Client(coordinator.address, timeout=0.5) as client:
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        tx.write(TABLE, HIGH_KEY, b"b")
        with pytest.raises(Timeout, match="outcome is unknown"):
            tx.commit()
        # The tickets stay out: a participant finishing the transaction may still ask
        # every op for its vote.
        assert outstanding_acknowledged(client) == 0
        answering.set()
        wait_until(lambda: len(low.decisions()) == 1 and len(high.decisions()) == 1)
        assert [d.decision for d in low.decisions() + high.decisions()] == [COMMIT, COMMIT]
        wait_until(lambda: outstanding_acknowledged(client) >= 2)


def test_an_op_refused_for_good_aborts_the_transaction_with_its_error(cluster2):
    low, high, coordinator = cluster2
    high.vote = lambda op, request: (VALUE_TOO_LARGE, ABORT)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        tx.write(TABLE, HIGH_KEY, b"b")
        with pytest.raises(ValueTooLarge, match="nothing of it applied"):
            tx.commit()
    # The refused op's vote is made final (it may have reached its master), then ABORT.
    assert [r.ops for r in high.request_aborts()] == [[(*HIGH_NAME, 2)]]
    assert [d.decision for d in low.decisions() + high.decisions()] == [2, 2]


def test_a_lease_found_expired_is_dropped_and_the_next_transaction_takes_another(cluster2):
    low, _high, coordinator = cluster2
    expired = {"once": True}

    def low_vote(op, request):
        if expired.pop("once", False):
            return EXPIRED_LEASE, ABORT
        return OK, PREPARED

    low.vote = low_vote
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        tx.write(TABLE, HIGH_KEY, b"b")
        assert tx.commit() == TxOutcome.aborted(AbortReason.TIMEOUT)
        tx = client.transaction()
        tx.write(TABLE, LOW_KEY, b"a")
        assert tx.commit().committed
    assert coordinator.lease_requests == [0, 0]
    assert [p.lease for p in low.prepares()] == [1, 2]


def test_a_read_only_transaction_of_one_object_sends_nothing_but_its_read(cluster2):
    low, _high, coordinator = cluster2
    low.objects[LOW_KEY] = (b"v", 2)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        assert tx.read(TABLE, LOW_KEY) == b"v"
        assert tx.read(TABLE, LOW_KEY) == b"v"
        assert tx.commit().committed
        assert client.transaction().commit().committed, "an empty transaction commits"
    assert len(low.requests) == 1 and low.requests[0].opcode == READ
    assert coordinator.lease_requests == [], "no lease needed"


def test_a_read_only_transaction_is_validated_without_locks_or_decision(cluster2):
    low, high, coordinator = cluster2
    low.objects[LOW_KEY] = (b"v", 2)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        assert tx.read(TABLE, LOW_KEY) == b"v"
        assert tx.read(TABLE, HIGH_KEY) is None
        assert tx.commit().committed
        tx = client.transaction()
        tx.read(TABLE, LOW_KEY)
        tx.read(TABLE, HIGH_KEY)
        high.objects[HIGH_KEY] = (b"new", 1)
        assert tx.commit() == TxOutcome.aborted(AbortReason.conflict(TABLE, HIGH_KEY))
        assert outstanding_acknowledged(client) == 4
    for master, key, version in ((low, LOW_KEY, 2), (high, HIGH_KEY, 0)):
        first = master.prepares()[0]
        assert first.validate_only and first.participants == []
        assert [(op.key, op.kind, op.version_read, op.value) for op in first.ops] == [
            (key, 1, version, b"")
        ]
        assert master.decisions() == [] and master.request_aborts() == []


def test_an_expected_version_is_checked_and_a_stale_one_aborts_at_once(cluster2):
    low, _high, coordinator = cluster2
    low.objects[LOW_KEY] = (b"v", 3)
    with Client(coordinator.address, timeout=5) as client:
        tx = client.transaction()
        tx.expect_version(TABLE, LOW_KEY, 2)
        assert tx.read(TABLE, LOW_KEY) == b"v"
        assert tx.commit() == TxOutcome.aborted(AbortReason.conflict(TABLE, LOW_KEY))
        assert low.prepares() == [], "nothing sent: it could only abort"
        # Alone and never read, an expected version is still validated.
        tx = client.transaction()
        tx.expect_version(TABLE, LOW_KEY, 3)
        assert tx.commit().committed
    (validation,) = low.prepares()
    assert validation.validate_only and validation.ops[0].version_read == 3


def test_run_transaction_retries_conflicts_until_one_commits(cluster2):
    low, _high, coordinator = cluster2
    low.objects[LOW_KEY] = (struct.pack("<q", 5), 1)
    conflicts = {"left": 2}

    def low_vote(op, request):
        if conflicts["left"]:
            conflicts["left"] -= 1
            return OK, ABORT
        return OK, PREPARED

    low.vote = low_vote
    calls = []

    def body(tx):
        calls.append(tx)
        return tx.increment(TABLE, LOW_KEY, 10)

    with Client(coordinator.address, timeout=5) as client:
        assert client.run_transaction(body) == 15
        assert len(calls) == 3 and len({id(tx) for tx in calls}) == 3, "a fresh one each time"
        conflicts["left"] = 1
        with pytest.raises(TransactionAborted) as raised:
            client.run_transaction_retrying_if(body, lambda reason: reason.key != LOW_KEY)
        assert raised.value.reason == AbortReason.conflict(TABLE, LOW_KEY)
        assert raised.value.status is Status.WRONG_VERSION
        assert len(calls) == 4

        def failing(tx):
            raise KeyError("the body's own error")

        with pytest.raises(KeyError):
            client.run_transaction(failing)


def test_finish_transaction_asks_every_vote_then_delivers_the_decision(cluster2):
    low, high, coordinator = cluster2
    low.request_abort = lambda name: (OK, PREPARED)
    high.request_abort = lambda name: (OK, PREPARED)
    names = [TxOpName(*LOW_NAME, 12), TxOpName(*HIGH_NAME, 13)]
    with Client(coordinator.address, timeout=5) as client:
        assert client.finish_transaction(7, 12, names) is TxDecision.COMMIT
        high.request_abort = lambda name: (OK, ABORT)
        assert client.finish_transaction(7, 12, names) is TxDecision.ABORT
        with pytest.raises(InvalidParameter):
            client.finish_transaction(7, 12, [])
        with pytest.raises(InvalidParameter):
            client.finish_transaction(0, 12, names)
    decisions = low.decisions()
    assert [(d.lease, d.acknowledged, d.transaction, d.decision) for d in decisions] == [
        (7, 0, 12, COMMIT),
        (7, 0, 12, 2),
    ]
    assert coordinator.lease_requests == [], "finishing another client's transaction"
