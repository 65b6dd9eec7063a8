"""The client's side of exactly-once mutations (RIFL, docs/design/exactly-once.md): its lease,
the ids of its mutations, and what it has acknowledged. The Rust client's counterpart is
crates/stratus-client/src/exactly_once.rs.

Every mutation (a single-object WRITE, SET_EXPIRY, REMOVE or INCREMENT, or one item of a
mutating multi-operation) takes an ``RpcTicket`` before its first attempt: the lease and a
fresh rpc id, which every attempt of the mutation carries, so that a master that applied it
answers the retries with the first result instead of applying it again. The ticket is given
back (``release``) when the mutation ends, with an answer or an error: either way the client
will not send it again. Every identity carries the highest id of its lease below which no
ticket is out (``acknowledged``), and the masters forget the results up to it.

The lease is opened by the first mutation (CLIENT_LEASE with lease 0), renewed by the mutation
that finds it due (every ``CLIENT_LEASE_RENEW_INTERVAL_SECONDS``; inline: the mutation waits for
the renewal, which only one thread runs at a time), and opened anew by the first mutation after
it lapsed or was found expired. An idle client needs no lease: nothing of it is kept.

Thread-safe: a ``Client`` is shared by threads, and so is its agent.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .codec import ClientLeaseGrant, RpcIdentity
from .errors import (
    ExpiredLease,
    InternalError,
    StratusError,
    Timeout,
    Unavailable,
    UnknownTablet,
    WrongServer,
)
from .retry import Attempts

__all__ = ["LeaseAgent", "RpcTicket", "outcome_unknown"]

# How much earlier than the coordinator's term the client stops using a lease: the coordinator
# counts the term from when it received the request, the client from when it sent it, and
# clocks run at slightly different rates.
LEASE_SAFETY_MARGIN_SECONDS = 2.0
# How often a lease in use is renewed (at most a third of its term).
CLIENT_LEASE_RENEW_INTERVAL_SECONDS = 10.0
# How long after a failed renewal the next one may start (a coordinator that cannot be reached
# is not asked on every mutation).
RENEWAL_RETRY_DELAY_SECONDS = 1.0

# Failures of a CLIENT_LEASE that opens a lease after which another attempt may succeed.
_RETRYABLE_ERRORS = (Unavailable, UnknownTablet, WrongServer)

# Asks the coordinator, once, to open (lease 0) or renew a lease, within the attempts'
# deadline; raises the typed error of a failure.
LeaseCall = Callable[[int, Attempts], ClientLeaseGrant]


def outcome_unknown(last_error: StratusError | None) -> Timeout:
    """What a mutation reports when its lease expired after an attempt that may have been
    applied: retrying under a new lease could apply it twice, so its outcome is unknown."""
    return Timeout(
        "the client's lease expired before the mutation's outcome was known: it may or may not "
        "have been applied",
        last_error=last_error,
    )


@dataclass
class _HeldLease:
    lease: int
    # Past this (time.monotonic) the client does not use it: the term, less the margin.
    usable_until: float
    # From this on, the next mutation renews it.
    renew_at: float


@dataclass
class _Outstanding:
    """The tickets out under one lease: their ids, and a heap of ids from which the smallest
    one still out is found (ids given back are dropped from the heap lazily)."""

    live: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)

    def oldest(self) -> int | None:
        while self.heap and self.heap[0] not in self.live:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


class RpcTicket:
    """The identity of one mutation, held from before its first attempt to its end."""

    __slots__ = ("_agent", "lease", "rpc", "_released")

    def __init__(self, agent: LeaseAgent, lease: int, rpc: int) -> None:
        self._agent = agent
        self.lease = lease
        self.rpc = rpc
        self._released = False

    def identity(self) -> RpcIdentity:
        """What the mutation's next attempt carries: its lease and id, and the highest id of
        the lease below which no ticket is out (it grows as other mutations end)."""
        return self._agent._identity(self)

    def release(self) -> None:
        """The mutation ended: it will not be sent again, so its id may be acknowledged.
        Idempotent."""
        if not self._released:
            self._released = True
            self._agent._release(self)

    def __repr__(self) -> str:
        return f"RpcTicket(lease={self.lease}, rpc={self.rpc})"


class LeaseAgent:
    """A client's lease and rpc ids. ``call`` asks the coordinator for a lease (one attempt);
    ``clock`` is ``time.monotonic`` but for tests."""

    def __init__(self, call: LeaseCall, clock: Callable[[], float] = time.monotonic) -> None:
        self._call = call
        self._clock = clock
        self._lock = threading.Lock()
        # Held while a lease is being opened, so that concurrent mutations open one, not many.
        self._opening = threading.Lock()
        self._lease: _HeldLease | None = None
        self._next_rpc = 1
        self._outstanding: dict[int, _Outstanding] = {}
        self._renewing = False

    @property
    def lease(self) -> int | None:
        """The id of the lease held now (usable or not), or None."""
        with self._lock:
            return None if self._lease is None else self._lease.lease

    # -----------------------------------------------------------------------------------------
    # Tickets.

    def ticket(self, attempts: Attempts) -> RpcTicket:
        """A ticket under the current lease, opening a lease first if none is usable (within
        the operation's deadline; ``Timeout`` when it passes first)."""
        return self.tickets(attempts, 1)[0]

    def tickets(self, attempts: Attempts, count: int) -> list[RpcTicket]:
        """``count`` tickets under one lease, with consecutive rpc ids taken in one go (a
        transaction's ops: its id is its lease and the first one's rpc id), opening a lease
        first if none is usable (within the operation's deadline)."""
        while True:
            tickets = self.tickets_now(count, attempts)
            if tickets is not None:
                return tickets
            left = attempts.deadline - time.monotonic()  # (the deadline's clock, not the lease's)
            if left <= 0 or not self._opening.acquire(timeout=left):
                raise attempts.timeout_error(attempts.last_error)
            try:
                # Another mutation may have opened one while this one waited.
                if not self._usable():
                    self._open(attempts)
            finally:
                self._opening.release()

    def ticket_now(self, attempts: Attempts | None = None) -> RpcTicket | None:
        """A ticket under the current lease if one is usable now (renewing it first when due
        and ``attempts`` is given), else None: a lapsed lease is replaced, not renewed."""
        tickets = self.tickets_now(1, attempts)
        return None if tickets is None else tickets[0]

    def tickets_now(self, count: int, attempts: Attempts | None = None) -> list[RpcTicket] | None:
        """``count`` tickets under the current lease, with consecutive rpc ids, if one is usable
        now (see ``ticket_now``), else None."""
        if count < 1:
            raise ValueError(f"cannot take {count} tickets")
        if attempts is not None and self._usable():
            self.renew_if_due(attempts)
        with self._lock:
            held = self._lease
            if held is None or self._clock() >= held.usable_until:
                return None
            first = self._next_rpc
            self._next_rpc += count
            outstanding = self._outstanding.setdefault(held.lease, _Outstanding())
            tickets = []
            for rpc in range(first, first + count):
                outstanding.live.add(rpc)
                heapq.heappush(outstanding.heap, rpc)
                tickets.append(RpcTicket(self, held.lease, rpc))
            return tickets

    def _identity(self, ticket: RpcTicket) -> RpcIdentity:
        with self._lock:
            outstanding = self._outstanding.get(ticket.lease)
            oldest = outstanding.oldest() if outstanding is not None else None
        if oldest is None or oldest > ticket.rpc:
            oldest = ticket.rpc  # (a ticket given back and used again: never below itself)
        return RpcIdentity(ticket.lease, ticket.rpc, oldest - 1)

    def _release(self, ticket: RpcTicket) -> None:
        with self._lock:
            outstanding = self._outstanding.get(ticket.lease)
            if outstanding is None:
                return
            outstanding.live.discard(ticket.rpc)
            if not outstanding.live:
                del self._outstanding[ticket.lease]
            else:
                outstanding.oldest()  # drops given-back ids from the heap's top

    # -----------------------------------------------------------------------------------------
    # The lease.

    def lost(self, lease: int) -> None:
        """Forgets ``lease`` (a master or the coordinator said it expired): the next mutation
        opens a new one. A lease held since is kept."""
        with self._lock:
            if self._lease is not None and self._lease.lease == lease:
                self._lease = None

    def renew_if_due(self, attempts: Attempts) -> None:
        """Renews the lease, inline and once, when it is due and no other thread renews it.

        A renewal that fails leaves the lease as it is (it stays usable until its term ends)
        and is tried again a second later; one refused with EXPIRED_LEASE drops the lease.
        """
        with self._lock:
            held = self._lease
            if held is None or self._renewing or self._clock() < held.renew_at:
                return
            self._renewing = True
        try:
            sent = self._clock()
            try:
                grant = self._call(held.lease, attempts)
            except ExpiredLease:
                self.lost(held.lease)
                return
            except StratusError:
                grant = None
            if grant is not None and grant.lease == held.lease:
                self._renewed(grant, sent)
                return
            with self._lock:
                if self._lease is not None and self._lease.lease == held.lease:
                    self._lease.renew_at = self._clock() + RENEWAL_RETRY_DELAY_SECONDS
        finally:
            with self._lock:
                self._renewing = False

    def _usable(self) -> bool:
        with self._lock:
            return self._lease is not None and self._clock() < self._lease.usable_until

    def _open(self, attempts: Attempts) -> None:
        """Opens a new lease, retrying what may pass until the operation's deadline."""
        while True:
            sent = self._clock()
            try:
                grant = self._call(0, attempts)
            except _RETRYABLE_ERRORS as error:
                attempts.wait_before_retry(error)
                continue
            if grant.lease == 0:
                raise InternalError("the coordinator answered CLIENT_LEASE with lease 0")
            self._hold(grant, sent)
            if self._usable():
                return
            # A term shorter than the safety margin gives nothing usable: ask again later
            # rather than spin on the coordinator.
            attempts.wait_before_retry(
                InternalError(
                    f"the coordinator granted lease {grant.lease} for {grant.term_ms} ms, "
                    f"less than the client's safety margin"
                )
            )

    def _renewed(self, grant: ClientLeaseGrant, sent: float) -> None:
        """Extends the lease ``grant`` renewed, counted from ``sent``, if it is still the
        current lease: a renewal answered after another thread moved to a new lease changes
        nothing (taking the old lease back would reuse its rpc ids)."""
        term = grant.term_ms / 1000
        renew_after = min(CLIENT_LEASE_RENEW_INTERVAL_SECONDS, term / 3)
        with self._lock:
            held = self._lease
            if held is None or held.lease != grant.lease:
                return
            held.usable_until = max(
                held.usable_until, sent + max(0.0, term - LEASE_SAFETY_MARGIN_SECONDS)
            )
            held.renew_at = sent + renew_after

    def _hold(self, grant: ClientLeaseGrant, sent: float) -> None:
        """Takes ``grant``, counted from ``sent``, as the current lease (a new lease starts its
        rpc ids at 1)."""
        term = grant.term_ms / 1000
        renew_after = min(CLIENT_LEASE_RENEW_INTERVAL_SECONDS, term / 3)
        held = _HeldLease(
            grant.lease,
            usable_until=sent + max(0.0, term - LEASE_SAFETY_MARGIN_SECONDS),
            renew_at=sent + renew_after,
        )
        with self._lock:
            if self._lease is None or self._lease.lease != grant.lease:
                self._next_rpc = 1
            self._lease = held
