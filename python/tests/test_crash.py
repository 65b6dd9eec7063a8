"""A master killed with SIGKILL under a client: the client follows its tablets to the masters
that recovered them, and no acknowledged write is lost.

``stratus up`` stops the whole cluster when one of its children dies, so this test runs the
roles itself: a coordinator and four storage servers, each in its own process group.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from conftest import (
    SERVER_SIZE_FLAGS,
    STARTUP_TRIES,
    ManagedProcess,
    free_loopback_port,
    log_tails,
    stratus_binary,
)

from stratus_client import Client, KeyItem, ServerStatus, WriteItem, key_hash

SERVERS = 4
# Two replicas: after one crash every survivor still finds two backups besides itself.
REPLICAS = 2
OBJECT_COUNT = 1000


@pytest.fixture
def roles(tmp_path):
    """(coordinator address, {server address: its process}) of a freshly started cluster."""
    binary = stratus_binary()
    processes: list[ManagedProcess] = []
    try:
        coordinator = None
        for attempt in range(STARTUP_TRIES):
            address = f"127.0.0.1:{free_loopback_port()}"
            process = ManagedProcess(
                [
                    str(binary),
                    "coordinator",
                    "--listen",
                    address,
                    "--dir",
                    str(tmp_path / f"coordinator-{attempt}"),
                    "--exit-with-parent",
                ],
                "coordinator",
            )
            processes.append(process)
            if process.wait_for_line("listening on") is not None:
                coordinator = address
                break
        if coordinator is None:
            pytest.fail("the coordinator did not start: " + str(processes[-1].output))
        servers: dict[str, ManagedProcess] = {}
        for index in range(SERVERS):
            process = ManagedProcess(
                [
                    str(binary),
                    "--coordinator",
                    coordinator,
                    "server",
                    "--exit-with-parent",
                    "--listen",
                    "127.0.0.1:0",
                    "--replicas",
                    str(REPLICAS),
                    *SERVER_SIZE_FLAGS,
                ],
                f"server-{index}",
            )
            processes.append(process)
            line = process.wait_for_line("listening on")
            if line is None:
                pytest.fail(f"server {index} did not start: {process.output}")
            servers[line.rsplit(" ", 1)[1]] = process
        with Client(coordinator, timeout=60) as client:
            wait_until_servers_are_up(client, set(servers))
        yield coordinator, servers
    finally:
        for process in processes:
            process.stop()


def wait_until_servers_are_up(client: Client, addresses: set[str]) -> None:
    """Waits until every server enlisted: at most 600 polls, each bounded by the client's
    timeout."""
    up: set[str] = set()
    for _ in range(600):
        up = {server.address for server in client.server_list() if server.status is ServerStatus.UP}
        if addresses <= up:
            return
        time.sleep(0.1)
    raise TimeoutError(f"servers {addresses - up} never enlisted")


def test_a_killed_master_is_followed_to_its_tablets_new_owners(roles, tmp_path):
    coordinator, servers = roles
    with Client(coordinator, timeout=60) as client:
        table_id = client.create_table("crash", span=SERVERS)
        items = [
            WriteItem(table_id, f"key-{number}", f"value-{number}")
            for number in range(OBJECT_COUNT)
        ]
        versions = client.multi_write(items)
        assert all(isinstance(version, int) for version in versions), versions
        expected = {
            item.key.encode(): (item.value.encode(), version)
            for item, version in zip(items, versions, strict=True)
        }

        victim = client.tablet_map(table_id)[0].owner_address
        servers[victim].kill()

        # Every acknowledged write is read back, with its version, once recovery is done: the
        # client waits through the recovery by itself.
        results = client.multi_read([KeyItem(table_id, key) for key in expected])
        assert dict(zip(expected, results, strict=True)) == expected, log_tails(tmp_path)

        # The tablets have new owners, and every operation works on them.
        tablets = client.tablet_map(table_id)
        assert victim not in {tablet.owner_address for tablet in tablets}
        moved_key = next(
            key for key in expected if tablets[0].range.contains(key_hash(table_id, key))
        )
        assert client.read(table_id, moved_key) == expected[moved_key]
        assert client.write(table_id, moved_key, b"after") > expected[moved_key][1]
        assert client.increment(table_id, b"counter", 3)[0] == 3
        keys = Counter(key for key, _, _ in client.enumerate(table_id))
        assert set(keys.values()) == {1}
        assert set(keys) == set(expected) | {b"counter"}
        statuses = {server.address: server.status for server in client.server_list()}
        assert statuses[victim] in (ServerStatus.CRASHED, ServerStatus.REMOVED)
