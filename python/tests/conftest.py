"""Real Stratus processes for integration tests: the ``cluster`` fixture (``stratus up``) and
``ManagedProcess``, which test_crash.py uses to run the roles one by one.

The binary is ``$STRATUS_BINARY``, by default ``../target/debug/stratus`` relative to this
package (build it with ``cargo build -p stratus``). Clusters get a temporary directory and a
free coordinator port (storage servers pick free ports themselves). Every process is started in
its own process group and stopped with its whole group: SIGTERM, then SIGKILL if it has not
exited in time. Every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratus_client import Client

PACKAGE_DIRECTORY = Path(__file__).resolve().parents[1]
DEFAULT_BINARY = PACKAGE_DIRECTORY.parent / "target" / "debug" / "stratus"

# Storage servers of the shared test cluster: three, so that a table spans three masters
# (enough for enumeration and multi-operations to cross tablets); each segment has one replica.
SERVERS = 3
# Small logs and segments: the tests store a few megabytes. With 1 MiB segments the servers'
# largest value is 128 KiB (segment / 8), which test_cluster.py relies on.
LOG_MIB = 32
SEGMENT_MIB = 1
VALUE_BYTES_MAX = SEGMENT_MIB * 1024 * 1024 // 8
# Flags every storage server of the tests gets: small logs, small backups.
SERVER_SIZE_FLAGS = [
    "--log-mib",
    str(LOG_MIB),
    "--segment-mib",
    str(SEGMENT_MIB),
    "--backup-frames",
    "64",
    "--backup-buffers",
    "16",
]

STARTUP_PATIENCE_SECONDS = 90
SHUTDOWN_GRACE_SECONDS = 15
STARTUP_TRIES = 3


@dataclass(frozen=True)
class Cluster:
    coordinator: str
    directory: Path
    value_bytes_max: int

    def client(self, **settings) -> Client:
        settings.setdefault("timeout", 30.0)
        return Client(self.coordinator, **settings)


def stratus_binary() -> Path:
    binary = Path(os.environ.get("STRATUS_BINARY", DEFAULT_BINARY))
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(
            f"no stratus binary at {binary}: build it with `cargo build -p stratus`, or set "
            "STRATUS_BINARY to its path",
            pytrace=False,
        )
    return binary


def free_loopback_port() -> int:
    """A port free now on 127.0.0.1. Another process may take it before the cluster binds it;
    callers then try again with another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ManagedProcess:
    """A child process in its own process group, its output collected line by line (and so
    never blocking it), stopped with its whole group."""

    def __init__(self, arguments: list[str], name: str) -> None:
        self.name = name
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group, so the group can be stopped
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for_line(self, text: str, seconds: float = STARTUP_PATIENCE_SECONDS) -> str | None:
        """The first output line containing ``text``; None if the process exits first."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name} printed no {text!r} in {seconds} s: {self.output}")
            try:
                line = self._lines.get(timeout=min(1.0, left))
            except queue.Empty:
                continue
            if line is None:
                return None
            self.output.append(line)
            if text in line:
                return line

    def kill(self) -> None:
        """SIGKILL to the whole group, as a crash would."""
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait(timeout=SHUTDOWN_GRACE_SECONDS)

    def stop(self) -> None:
        """Stops the whole process group: SIGTERM, then SIGKILL after a grace period."""
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self._process.wait(timeout=SHUTDOWN_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        # Children that outlived their parent (they exit with it, but not at once).
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self._process.wait(timeout=SHUTDOWN_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=SHUTDOWN_GRACE_SECONDS)


def log_tails(directory: Path) -> str:
    texts = []
    for log in sorted(directory.glob("**/*.log")):
        texts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}")
    return "\n".join(texts)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A `stratus up` cluster shared by the tests of the session (each uses its own tables)."""
    binary = stratus_binary()
    failures = []
    for attempt in range(STARTUP_TRIES):
        directory = tmp_path_factory.mktemp(f"stratus-cluster-{attempt}")
        coordinator = f"127.0.0.1:{free_loopback_port()}"
        up = ManagedProcess(
            [
                str(binary),
                "--coordinator",
                coordinator,
                "up",
                "--dir",
                str(directory),
                "--servers",
                str(SERVERS),
                *SERVER_SIZE_FLAGS,
            ],
            "stratus up",
        )
        try:
            ready = up.wait_for_line("ready")
        except BaseException:
            up.stop()
            raise
        if ready is None:
            # Most likely the port was taken between probing and binding: try another.
            up.stop()
            failures.append("\n".join(up.output) + "\n" + log_tails(directory))
            continue
        try:
            with Client(coordinator, timeout=30) as client:
                client.list_tables()  # the coordinator answers clients
            yield Cluster(coordinator, directory, VALUE_BYTES_MAX)
        finally:
            up.stop()
        return
    pytest.fail(f"stratus up failed {STARTUP_TRIES} times:\n" + "\n".join(failures), pytrace=False)


@pytest.fixture
def client(cluster):
    with cluster.client() as connected:
        yield connected


@pytest.fixture
def table_name(request) -> str:
    """A table name unique to the test, so tests share the cluster without sharing data."""
    return request.node.name.replace("[", "-").replace("]", "")[:200]


@pytest.fixture
def servers():
    """Collects fake servers (``fake_server.start``) so that every one is closed, whatever the
    test's outcome."""
    started = []
    yield started
    for server in started:
        server.close()
