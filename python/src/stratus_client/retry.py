"""The deadline and backoff that bound every operation's retries, and response-to-error
conversion shared by the client and enumerations."""

from __future__ import annotations

import random
import time

from .codec import ErrorBody
from .errors import (
    AuthenticationFailed,
    PermissionDenied,
    StratusError,
    Timeout,
    error_for_status,
)
from .status import Status

__all__ = ["Attempts", "failure_from_response"]

# Backoff between attempts: 1 ms doubling to 100 ms, each delay scaled by a random factor in
# [0.5, 1.0) so that clients retrying after the same event do not retry in lockstep. The same
# schedule as the Rust client's `Backoff::for_client`.
_BACKOFF_INITIAL_SECONDS = 0.001
_BACKOFF_MAX_SECONDS = 0.1


class Attempts:
    """The deadline and backoff of one operation, shared by every request it sends."""

    def __init__(self, description: str, timeout: float) -> None:
        self.description = description
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self._next_delay = _BACKOFF_INITIAL_SECONDS
        self.last_error: StratusError | None = None

    def timeout_error(self, last_error: StratusError | None) -> Timeout:
        detail = f"; last error: {last_error}" if last_error is not None else ""
        return Timeout(
            f"{self.description} did not finish within {self.timeout:g} s{detail}",
            last_error=last_error,
        )

    def note(self, error: StratusError) -> StratusError:
        """Records ``error`` as the last failure seen, and returns the one to report: a
        ``Timeout`` that came because this operation's own deadline passed (its last attempt
        ran out of time, which a loaded machine makes likely) does not hide an earlier failure
        that explains the timeout. A refused credential is raised at once: no retry can cure a
        wrong or missing password, so no caller may go on after noting one."""
        if isinstance(error, (AuthenticationFailed, PermissionDenied)):
            raise error
        ran_out = isinstance(error, Timeout) and time.monotonic() >= self.deadline
        if not (ran_out and self.last_error is not None):
            self.last_error = error
        return self.last_error

    def wait_before_retry(self, last_error: StratusError) -> None:
        """Sleeps the next backoff delay before another attempt, or raises ``Timeout`` naming
        ``last_error`` when the deadline comes first (a refused credential at once: see
        ``note``)."""
        explaining = self.note(last_error)
        if not self.pause_before_retry():
            raise self.timeout_error(explaining) from explaining

    def pause_before_retry(self) -> bool:
        """Sleeps the next backoff delay and returns True, or sleeps until the deadline and
        returns False when it comes first.

        No attempt is started in the last moment before the deadline: it could only fail for
        lack of time, and its failure would hide the one that explains the timeout.
        """
        delay = self._next_delay * random.uniform(0.5, 1.0)
        self._next_delay = min(self._next_delay * 2, _BACKOFF_MAX_SECONDS)
        left = self.deadline - time.monotonic()
        if left <= delay:
            time.sleep(max(0.0, left))
            return False
        time.sleep(delay)
        return True


def failure_from_response(status: Status, decoded: object) -> StratusError:
    """The typed error for a response that is not OK: the message of an error body, or the
    current version an object outcome reports."""
    if isinstance(decoded, ErrorBody):
        return error_for_status(status, decoded.message)
    if isinstance(decoded, tuple):  # READ (version, value), INCREMENT (version, value)
        return error_for_status(status, version=decoded[0])
    if isinstance(decoded, int):  # WRITE, REMOVE: version
        return error_for_status(status, version=decoded)
    return error_for_status(status)
