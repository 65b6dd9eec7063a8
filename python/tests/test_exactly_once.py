"""Exactly-once mutations (RIFL, docs/design/exactly-once.md): the lease agent on its own, with
a clock the test moves, and the client against scripted fake servers: the identity every
attempt carries, what the client acknowledges, and what it does when a lease expires.

Timeouts here are short but generous for loopback; no test asserts a duration.
"""

from __future__ import annotations

import struct
import threading

import pytest
from fake_server import (
    CLIENT_LEASE,
    Close,
    FakeServer,
    LeaseGranter,
    Request,
    ScriptedCoordinator,
    Silence,
    answers_in_turn,
    client_lease_asked,
    error_frame,
    multi_identities,
    response_frame,
    rpc_identity,
    start,
    unused_address,
)

import stratus_client
from stratus_client import Client, Expiry, IncrementItem, KeyItem, Status, WriteItem, key_hash
from stratus_client.codec import ClientLeaseGrant, RpcIdentity
from stratus_client.exactly_once import LeaseAgent
from stratus_client.retry import Attempts

TABLE = 5
HALF = 1 << 63
TOP = (1 << 64) - 1
NORMAL = 0


def key_where(predicate) -> bytes:
    for number in range(10_000):
        key = f"key-{number}".encode()
        if predicate(key_hash(TABLE, key)):
            return key
    raise AssertionError("no such key")


LOW_KEY = key_where(lambda hash_value: hash_value < HALF)
HIGH_KEY = key_where(lambda hash_value: hash_value >= HALF)


def whole_table_on(master: FakeServer):
    return [(TABLE, 0, TOP, 1, master.address, NORMAL)]


def version_ok(request: Request, version: int = 1) -> bytes:
    """OK to a WRITE, REMOVE or SET_EXPIRY (its version), or an INCREMENT (version, value)."""
    body = struct.pack("<Q", version)
    if request.opcode == 33:
        body += struct.pack("<q", 10)
    return response_frame(request, 0, body)


def identities(master: FakeServer) -> list:
    return [rpc_identity(request) for request in master.requests]


# ---------------------------------------------------------------------------------------------
# The lease agent, with a clock the test moves.


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Coordinator:
    """Stands in for the client's CLIENT_LEASE call: opens leases 1, 2, ... and renews any
    lease, for 30 s; ``refuse`` makes it answer with that error instead."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.opened = 0
        self.refuse: stratus_client.StratusError | None = None
        self.lock = threading.Lock()

    def __call__(self, lease: int, attempts: Attempts) -> ClientLeaseGrant:
        with self.lock:
            self.asked.append(lease)
            if self.refuse is not None:
                raise self.refuse
            if lease == 0:
                self.opened += 1
                lease = self.opened
        return ClientLeaseGrant(lease, 30_000)


def attempts() -> Attempts:
    return Attempts("test", 5.0)


def test_acknowledgements_trail_the_oldest_ticket_out():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    first = agent.ticket(attempts())
    second = agent.ticket(attempts())
    third = agent.ticket(attempts())
    assert coordinator.asked == [0], "one lease, opened by the first ticket"
    assert first.identity() == RpcIdentity(1, 1, 0)
    assert third.identity() == RpcIdentity(1, 3, 0)
    second.release()
    assert third.identity().acknowledged == 0, "rpc 1 is still out"
    first.release()
    first.release()  # idempotent
    assert third.identity().acknowledged == 2
    fourth = agent.ticket(attempts())
    third.release()
    assert fourth.identity() == RpcIdentity(1, 4, 3)


def test_a_lapsed_lease_gives_no_ticket_and_a_new_one_starts_at_rpc_1():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    assert agent.ticket_now() is None, "no lease yet"
    old = agent.ticket(attempts())
    clock.now += 29  # within the 2 s margin of the 30 s term
    assert agent.ticket_now() is None
    new = agent.ticket(attempts())  # opens a new lease: a lapsed one is not renewed
    assert coordinator.asked == [0, 0]
    assert new.identity() == RpcIdentity(2, 1, 0)
    # A ticket of the old lease ending does not touch the new lease's.
    old.release()
    assert new.identity().acknowledged == 0
    agent.lost(1)
    assert agent.ticket_now() is not None, "losing an old lease keeps the new one"
    agent.lost(2)
    assert agent.ticket_now() is None


def test_a_due_lease_is_renewed_by_the_next_mutation():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    agent.ticket(attempts())
    clock.now += 9
    agent.ticket(attempts())
    assert coordinator.asked == [0], "not due yet"
    clock.now += 2
    ticket = agent.ticket(attempts())
    assert coordinator.asked == [0, 1], "renewed, inline"
    assert ticket.identity().lease == 1 and ticket.rpc == 3, "a renewal keeps the rpc ids going"
    # Renewed from when it was sent: usable until 28 s after that, not after the opening.
    clock.now += 20
    assert agent.ticket_now() is not None, "no renewal without a mutation's deadline"
    assert coordinator.asked == [0, 1]
    agent.ticket(attempts())
    assert coordinator.asked == [0, 1, 1]


def test_a_failed_renewal_keeps_the_lease_and_is_tried_again_a_second_later():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    agent.ticket(attempts())
    clock.now += 11
    coordinator.refuse = stratus_client.CouldNotConnect("coordinator down")
    assert agent.ticket(attempts()).lease == 1, "the lease is still usable"
    assert agent.ticket(attempts()).lease == 1
    assert coordinator.asked == [0, 1], "not asked again at once"
    clock.now += 1.5
    coordinator.refuse = None
    agent.ticket(attempts())
    assert coordinator.asked == [0, 1, 1]


def test_a_renewal_answered_after_the_client_moved_to_a_new_lease_changes_nothing():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    agent.ticket(attempts())
    clock.now += 11
    renew_call = coordinator.__call__

    def renewal_while_another_thread_moves_on(lease, attempts_):
        if lease == 1:
            # Meanwhile a master said lease 1 expired, and another mutation opened lease 2.
            agent.lost(1)
            agent.ticket(attempts()).release()
        return renew_call(lease, attempts_)

    agent._call = renewal_while_another_thread_moves_on
    ticket = agent.ticket(attempts())
    assert ticket.identity().lease == 2, "the late renewal of lease 1 did not take it back"
    assert ticket.rpc == 2, "lease 2's rpc ids go on: none is reused"


def test_a_renewal_refused_as_expired_opens_a_new_lease():
    coordinator, clock = Coordinator(), Clock()
    agent = LeaseAgent(coordinator, clock)
    agent.ticket(attempts())
    clock.now += 11
    coordinator.refuse = stratus_client.ExpiredLease("lease 1 expired")
    with pytest.raises(stratus_client.ExpiredLease):
        # The renewal drops the lease; opening one is refused the same way here.
        agent.ticket(attempts())
    coordinator.refuse = None
    ticket = agent.ticket(attempts())
    assert ticket.identity() == RpcIdentity(2, 1, 0)
    assert coordinator.asked == [0, 1, 0, 0]


def test_threads_open_one_lease_and_never_share_an_rpc_id():
    coordinator = Coordinator()
    agent = LeaseAgent(coordinator)
    barrier = threading.Barrier(8)
    taken: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        barrier.wait(timeout=5)
        for _ in range(50):
            ticket = agent.ticket(attempts())
            identity = ticket.identity()
            assert identity.acknowledged < identity.rpc
            with lock:
                taken.append(identity.rpc)
            ticket.release()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert coordinator.asked == [0]
    assert sorted(taken) == list(range(1, 401))


# ---------------------------------------------------------------------------------------------
# Single-object mutations against fake servers.

MUTATIONS = {
    "write": lambda client: client.write(TABLE, b"k", b"v"),
    "remove": lambda client: client.remove(TABLE, b"k"),
    "increment": lambda client: client.increment(TABLE, b"k", 1),
    "set_expiry": lambda client: client.set_expiry(TABLE, b"k", Expiry.after(60)),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("lost", [Silence, Close], ids=["unanswered", "connection-lost"])
def test_a_mutation_whose_answer_was_lost_is_retried_with_the_same_identity(
    servers, mutation, lost
):
    master = start(
        servers, FakeServer(answers_in_turn(lambda request: lost, version_ok))
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5, request_timeout=0.2) as client:
        MUTATIONS[mutation](client)
        # The next mutation acknowledges the first: the client has its result.
        MUTATIONS[mutation](client)
    assert identities(master) == [(1, 1, 0), (1, 1, 0), (1, 2, 1)]
    assert coordinator.lease_requests == [0], "one lease, opened by the first mutation"


def test_reads_carry_no_identity_and_take_no_lease(servers):
    def answer(request: Request) -> bytes:
        if request.opcode == 34:  # MULTI_READ of one item
            return response_frame(request, 0, struct.pack("<IHQI", 1, 0, 1, 1) + b"v")
        return response_frame(request, 0, struct.pack("<QI", 1, 1) + b"v" + struct.pack("<Q", 0))

    master = start(servers, FakeServer(answer))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, b"k") == (b"v", 1)
        assert client.multi_read([(TABLE, b"k")]) == [(b"v", 1)]
    assert coordinator.lease_requests == []


def test_a_retry_after_retry_status_keeps_the_identity(servers):
    master = start(
        servers,
        FakeServer(
            answers_in_turn(
                lambda request: error_frame(request, Status.RETRY, "checking the lease"),
                lambda request: version_ok(request, 4),
            )
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.write(TABLE, b"k", b"v") == 4
    assert identities(master) == [(1, 1, 0), (1, 1, 0)]


def expired(request: Request) -> bytes:
    return error_frame(request, Status.EXPIRED_LEASE, "lease expired")


def test_an_expired_lease_is_replaced_when_no_attempt_was_applied(servers):
    master = start(servers, FakeServer(answers_in_turn(expired, version_ok)))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.write(TABLE, b"k", b"v") == 1
        client.write(TABLE, b"k", b"v")
    assert identities(master) == [(1, 1, 0), (2, 1, 0), (2, 2, 1)]
    assert coordinator.lease_requests == [0, 0]


@pytest.mark.parametrize("refusal", [Status.UNKNOWN_TABLET, Status.WRONG_SERVER])
def test_a_refusal_by_a_master_that_does_not_own_the_key_is_not_ambiguous(servers, refusal):
    old = start(servers, FakeServer(lambda request: error_frame(request, refusal)))
    new = start(servers, FakeServer(answers_in_turn(expired, version_ok)))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(old), whole_table_on(new)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.write(TABLE, b"k", b"v") == 1
    assert identities(old) == [(1, 1, 0)]
    assert identities(new) == [(1, 1, 0), (2, 1, 0)]


def test_a_master_never_reached_is_not_ambiguous(servers):
    master = start(servers, FakeServer(answers_in_turn(expired, version_ok)))
    coordinator = start(
        servers,
        ScriptedCoordinator(
            [(TABLE, 0, TOP, 1, unused_address(), NORMAL)], whole_table_on(master)
        ),
    )
    with Client(coordinator.address, timeout=5) as client:
        assert client.write(TABLE, b"k", b"v") == 1
    assert identities(master) == [(1, 1, 0), (2, 1, 0)]


@pytest.mark.parametrize(
    "ambiguous",
    [
        lambda request: Silence,
        lambda request: Close,
        lambda request: error_frame(request, Status.RETRY, "replication not confirmed"),
    ],
    ids=["unanswered", "connection-lost", "retry"],
)
def test_an_expired_lease_after_an_attempt_that_may_have_run_is_a_timeout(servers, ambiguous):
    master = start(servers, FakeServer(answers_in_turn(ambiguous, expired, version_ok)))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5, request_timeout=0.2) as client:
        with pytest.raises(stratus_client.Timeout, match="may or may not") as raised:
            client.increment(TABLE, b"counter", 1)
        assert isinstance(raised.value.last_error, stratus_client.ExpiredLease)
        assert identities(master) == [(1, 1, 0), (1, 1, 0)], "not sent under a new lease"
        # The lease is gone: the next mutation opens another.
        client.increment(TABLE, b"counter", 1)
    assert identities(master)[2:] == [(2, 1, 0)]
    assert coordinator.lease_requests == [0, 0]


def test_a_stale_rpc_is_an_error_and_not_retried(servers):
    master = start(
        servers,
        FakeServer(lambda request: error_frame(request, Status.STALE_RPC, "rpc 1 acknowledged")),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.StaleRpc, match="rpc 1 acknowledged") as raised:
            client.remove(TABLE, b"k")
    assert raised.value.status is Status.STALE_RPC
    assert len(master.requests) == 1


def test_a_lease_that_cannot_be_opened_fails_the_mutation_at_its_deadline(servers):
    master = start(servers, FakeServer(version_ok))
    coordinator = start(
        servers,
        ScriptedCoordinator(
            whole_table_on(master),
            leases=lambda request: error_frame(request, Status.RETRY, "not the active coordinator"),
        ),
    )
    with Client(coordinator.address, timeout=0.3) as client:
        with pytest.raises(stratus_client.Timeout) as raised:
            client.write(TABLE, b"k", b"v")
    assert isinstance(raised.value.last_error, stratus_client.RetryLater)
    assert master.requests == [], "no mutation is sent without its lease"


def test_the_client_renews_its_lease_and_replaces_one_found_expired(servers):
    refuse_renewals = threading.Event()
    granter = LeaseGranter()

    def leases(request: Request) -> bytes:
        if client_lease_asked(request) and refuse_renewals.is_set():
            return expired(request)
        return granter(request)

    master = start(servers, FakeServer(version_ok))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master), leases=leases))
    clock = Clock()
    with Client(coordinator.address, timeout=5) as client:
        client._lease_agent = LeaseAgent(client._client_lease_call, clock)
        client.write(TABLE, b"k", b"v")
        clock.now += 11
        client.write(TABLE, b"k", b"v")
        assert coordinator.lease_requests == [0, 1]
        clock.now += 11
        refuse_renewals.set()
        client.write(TABLE, b"k", b"v")
    assert coordinator.lease_requests == [0, 1, 1, 0]
    assert identities(master) == [(1, 1, 0), (1, 2, 1), (2, 1, 0)]


def test_threads_sharing_a_client_share_its_lease(servers):
    master = start(servers, FakeServer(version_ok))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=10) as client:

        def write() -> None:
            for number in range(10):
                client.write(TABLE, f"k{number}", b"v")

        threads = [threading.Thread(target=write) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    assert coordinator.lease_requests == [0]
    sent = identities(master)
    assert sorted(rpc for _, rpc, _ in sent) == list(range(1, 61))
    assert all(lease == 1 and acknowledged < rpc for lease, rpc, acknowledged in sent)


def test_without_exactly_once_no_lease_is_taken_and_no_identity_sent(servers):
    def answer(request: Request) -> bytes:
        if request.opcode == 36:  # MULTI_REMOVE
            return multi_answer(request, [(0, 1)] * len(multi_identities(request)))
        return version_ok(request)

    master = start(servers, FakeServer(answers_in_turn(lambda request: Silence, answer)))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5, request_timeout=0.2, exactly_once=False) as client:
        assert client.write(TABLE, b"k", b"v") == 1, "retried after the lost answer, as before"
        assert client.multi_remove([(TABLE, b"a"), (TABLE, b"b")]) == [1, 1]
    assert [rpc_identity(request) for request in master.requests[:2]] == [None, None]
    assert multi_identities(master.requests[2]) == [None, None]
    assert coordinator.lease_requests == []


# ---------------------------------------------------------------------------------------------
# Multi-operations: each item has its own identity.


def multi_answer(request: Request, results: list[tuple[int, int]]) -> bytes:
    """A MULTI_WRITE or MULTI_REMOVE answer of (status, version) per item (MULTI_INCREMENT
    items get value 0 as well)."""
    body = struct.pack("<I", len(results))
    for status, version in results:
        body += struct.pack("<HQ", status, version)
        if request.opcode == 37:
            body += struct.pack("<q", 0)
    return response_frame(request, 0, body)


def test_multi_items_each_get_their_own_id_and_keep_it_when_retried(servers):
    rounds = {"low": 0}

    def low_answer(request: Request) -> bytes:
        if request.opcode == 31:  # the WRITE after the multi-operation
            return version_ok(request)
        rounds["low"] += 1
        count = len(multi_identities(request))
        if rounds["low"] == 1:
            # The second item is busy the first time.
            return multi_answer(request, [(0, 5), (Status.RETRY, 0)][:count])
        return multi_answer(request, [(0, 6)] * count)

    low = start(servers, FakeServer(low_answer))
    high = start(
        servers,
        FakeServer(
            lambda request: multi_answer(request, [(0, 7)] * len(multi_identities(request)))
        ),
    )
    coordinator = start(
        servers,
        ScriptedCoordinator(
            [
                (TABLE, 0, HALF - 1, 1, low.address, NORMAL),
                (TABLE, HALF, TOP, 2, high.address, NORMAL),
            ]
        ),
    )
    low_second = key_where(
        lambda hash_value: hash_value < HALF and hash_value != key_hash(TABLE, LOW_KEY)
    )
    with Client(coordinator.address, timeout=5) as client:
        results = client.multi_write(
            [WriteItem(TABLE, LOW_KEY, b"1"), (TABLE, HIGH_KEY, b"2"), (TABLE, low_second, b"3")]
        )
        assert results == [5, 7, 6]
        client.write(TABLE, LOW_KEY, b"again")
    assert coordinator.lease_requests == [0]
    assert multi_identities(low.requests[0]) == [(1, 1, 0), (1, 3, 0)]
    # Sent after the low master's answer (masters are asked in turn): item 1 has its result.
    assert multi_identities(high.requests[0]) == [(1, 2, 1)]
    # Items 1 and 2 have their results: the retry of item 3 acknowledges them.
    assert multi_identities(low.requests[1]) == [(1, 3, 2)]
    assert rpc_identity(low.requests[2]) == (1, 4, 3)


def test_multi_items_whose_lease_expired(servers):
    answers = answers_in_turn(
        # Item a: its lease expired (nothing applied). Item b: busy (it may have been applied).
        lambda request: multi_answer(request, [(Status.EXPIRED_LEASE, 0), (Status.RETRY, 0)]),
        # a goes again under a new lease; b's lease expired after it may have run.
        lambda request: multi_answer(request, [(0, 3), (Status.EXPIRED_LEASE, 0)]),
    )
    master = start(servers, FakeServer(answers))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        results = client.multi_increment([IncrementItem(TABLE, b"a", 1), (TABLE, b"b", 1)])
    assert results[0] == (0, 3)
    assert isinstance(results[1], stratus_client.Timeout)
    assert "may or may not have been applied" in str(results[1])
    assert [multi_identities(request) for request in master.requests] == [
        [(1, 1, 0), (1, 2, 0)],
        [(2, 1, 0), (1, 2, 1)],
    ]
    assert coordinator.lease_requests == [0, 0]


def test_a_multi_request_refused_for_its_expired_lease_goes_again_under_a_new_one(servers):
    master = start(
        servers,
        FakeServer(
            answers_in_turn(
                expired,
                lambda request: multi_answer(request, [(0, 2)] * len(multi_identities(request))),
            )
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.multi_remove([KeyItem(TABLE, b"a"), (TABLE, b"b")]) == [2, 2]
    assert [multi_identities(request) for request in master.requests] == [
        [(1, 1, 0), (1, 2, 0)],
        [(2, 1, 0), (2, 2, 0)],
    ]


def test_multi_items_lost_with_their_connection_keep_their_identities(servers):
    master = start(
        servers,
        FakeServer(
            answers_in_turn(
                lambda request: Close,
                lambda request: multi_answer(request, [(0, 4)] * len(multi_identities(request))),
            )
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.multi_write([(TABLE, b"a", b"1"), (TABLE, b"b", b"2")]) == [4, 4]
    assert [multi_identities(request) for request in master.requests] == [
        [(1, 1, 0), (1, 2, 0)],
        [(1, 1, 0), (1, 2, 0)],
    ]


def test_every_lease_request_is_one_the_coordinator_understands(servers):
    """The CLIENT_LEASE frames the client sends are the specification's (opcode 24, a u64)."""
    master = start(servers, FakeServer(version_ok))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        client.write(TABLE, b"k", b"v")
    (request,) = coordinator.requests_with_opcode(CLIENT_LEASE)
    assert request.body == struct.pack("<Q", 0)
