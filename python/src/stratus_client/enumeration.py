"""Table enumeration with a resumable cursor (the Rust client's `Enumeration`, in Python).

Masters return a tablet's objects in ascending order of bit-reversed key hash, then key: an
order that depends neither on which master holds the tablet nor on its hash table's size. The
enumeration keeps a queue of (hash range, cursor) work items, starting with the whole hash
space. Each step takes the first item, finds the tablet holding its first hash, and asks that
tablet's master for the part of the item inside the tablet; the rest of the item is put back
with the *same* cursor, because every object before the cursor in that rest was already
returned too. So an object present for the whole enumeration is returned exactly once, even
when tablets split or move between calls.

The queue is the enumeration's whole state, so it is also its resumable position: ``position``
gives it after the last object returned, and ``Client.enumerate(..., resume_from=position)``
continues from there, in this process or another.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import codec
from .codec import EnumerateResponse, Opcode
from .errors import ProtocolError, StratusError, TableDoesNotExist, Unavailable
from .key_hash import key_hash, reverse_bits
from .model import FULL_HASH_RANGE, EnumeratedObject, EnumerationCursor, HashRange
from .retry import Attempts, failure_from_response
from .status import Status

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Enumeration", "EnumerationPosition"]

# Statuses after which the same ENUMERATE may succeed once the map is fetched again or after a
# short wait (the Rust client retries the first three; SERVICE_NOT_AVAILABLE is retryable in
# the specification's status table).
_RETRY_STATUSES = frozenset(
    {Status.UNKNOWN_TABLET, Status.WRONG_SERVER, Status.RETRY, Status.SERVICE_NOT_AVAILABLE}
)


@dataclass(frozen=True)
class EnumerationPosition:
    """Where an enumeration of table ``table_id`` stands: the hash ranges still to enumerate,
    each with the cursor to resume it at. Immutable, and only meaningful for that table."""

    table_id: int
    work: tuple[tuple[HashRange, EnumerationCursor], ...]

    @property
    def finished(self) -> bool:
        return not self.work


class Enumeration:
    """An enumeration in progress; see ``Client.enumerate``. Iterate over it for objects, or
    call ``next_batch`` for one master's response at a time."""

    def __init__(
        self,
        client: Client,
        table_id: int,
        batch_bytes: int,
        resume_from: EnumerationPosition | None,
    ) -> None:
        self._client = client
        self._table_id = table_id
        self._batch_bytes = batch_bytes
        if resume_from is None:
            self._work: deque[tuple[HashRange, EnumerationCursor]] = deque(
                [(FULL_HASH_RANGE, EnumerationCursor())]
            )
        else:
            if not isinstance(resume_from, EnumerationPosition):
                raise TypeError("resume_from must be an EnumerationPosition")
            if resume_from.table_id != table_id:
                raise ValueError(
                    f"position of table {resume_from.table_id} cannot resume table {table_id}"
                )
            self._work = deque(resume_from.work)
        # The last batch received, how many of its objects were handed out, and where it came
        # from: needed to express the position between two objects of one batch.
        self._batch: list[EnumeratedObject] = []
        self._handed_out = 0
        self._batch_range = FULL_HASH_RANGE
        self._batch_start_cursor = EnumerationCursor()
        self._batch_range_continues = False

    @property
    def table_id(self) -> int:
        return self._table_id

    def __iter__(self) -> Iterator[EnumeratedObject]:
        return self

    def __next__(self) -> EnumeratedObject:
        if self._handed_out == len(self._batch) and not self._fetch_batch():
            raise StopIteration
        item = self._batch[self._handed_out]
        self._handed_out += 1
        return item

    def next_batch(self) -> list[EnumeratedObject] | None:
        """The next non-empty batch of objects (what iteration has not handed out yet of the
        current one, if any), or None when the table is exhausted."""
        if self._handed_out == len(self._batch) and not self._fetch_batch():
            return None
        rest = self._batch[self._handed_out :]
        self._handed_out = len(self._batch)
        return rest

    @property
    def position(self) -> EnumerationPosition:
        """The position right after the last object handed out, to pass as ``resume_from``."""
        work = list(self._work)
        if self._handed_out < len(self._batch):
            # Inside a batch: resume its range after the last object handed out, in (reversed
            # hash, key) order, rather than after the whole batch.
            if self._batch_range_continues:
                work.pop(0)  # the batch range's entry with the cursor after the whole batch
            if self._handed_out == 0:
                cursor = self._batch_start_cursor
            else:
                last_key = self._batch[self._handed_out - 1].key
                cursor = EnumerationCursor(
                    reverse_bits(key_hash(self._table_id, last_key)), last_key
                )
            work.insert(0, (self._batch_range, cursor))
        return EnumerationPosition(self._table_id, tuple(work))

    def _fetch_batch(self) -> bool:
        """Fetches the next non-empty batch; False when the table is exhausted. On an error the
        work queue is unchanged, so the position stays valid."""
        while self._work:
            hash_range, cursor = self._work[0]
            part, response = self._step(hash_range, cursor)
            self._work.popleft()
            if part.end < hash_range.end:
                self._work.appendleft((HashRange(part.end + 1, hash_range.end), cursor))
            if response.next_cursor is not None:
                self._work.appendleft((part, response.next_cursor))
            if response.objects:
                self._batch = response.objects
                self._handed_out = 0
                self._batch_range = part
                self._batch_start_cursor = cursor
                self._batch_range_continues = response.next_cursor is not None
                return True
        return False

    def _step(
        self, hash_range: HashRange, cursor: EnumerationCursor
    ) -> tuple[HashRange, EnumerateResponse]:
        """Asks the master of the tablet holding ``hash_range.start`` for the next objects of
        the part of ``hash_range`` inside that tablet, retrying until the deadline; returns the
        part asked for and the response."""
        client = self._client
        attempts = Attempts(f"enumerate(table {self._table_id})", client.timeout)
        while True:
            try:
                tablet = client._locate(self._table_id, hash_range.start, attempts)
            except (TableDoesNotExist, ProtocolError):
                raise
            except StratusError as error:
                attempts.wait_before_retry(error)
                continue
            part = hash_range.intersection(tablet.range) or hash_range
            body = codec.enumerate_body(self._table_id, part, cursor, self._batch_bytes)
            try:
                status, decoded = client._send(
                    tablet.owner_address, Opcode.ENUMERATE, body, attempts
                )
            except Unavailable as error:
                client._forget_tablet_map(self._table_id)
                attempts.wait_before_retry(error)
                continue
            if status is Status.OK:
                return part, decoded
            error = failure_from_response(status, decoded)
            if status not in _RETRY_STATUSES:
                raise error
            client._forget_tablet_map(self._table_id)
            attempts.wait_before_retry(error)
