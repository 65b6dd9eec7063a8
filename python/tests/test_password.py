"""A cluster that requires the client password (``stratus up --client-password-file``): the
Python client proves it with ``password=``, and without it, or with a wrong one, is refused at
once with a typed error (not retried until its timeout)."""

from __future__ import annotations

import pytest
import redis

from conftest import SERVER_SIZE_FLAGS, ManagedProcess, free_loopback_port, log_tails, stratus_binary

from stratus_client import AuthenticationFailed, Client, PermissionDenied


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A two-server cluster with a cluster secret and a client password (created by `up`)."""
    directory = tmp_path_factory.mktemp("stratus-secured")
    coordinator = f"127.0.0.1:{free_loopback_port()}"
    password_file = directory / "client-password"
    up = ManagedProcess(
        [
            str(stratus_binary()),
            "--coordinator",
            coordinator,
            "up",
            "--dir",
            str(directory / "data"),
            "--servers",
            "2",
            "--cluster-secret-file",
            str(directory / "cluster-secret"),
            "--client-password-file",
            str(password_file),
            "--resp-port",
            "0",
            *SERVER_SIZE_FLAGS,
        ],
        "stratus up (secured)",
    )
    try:
        resp_line = up.wait_for_line("redis: server-0 ")
        if resp_line is None or up.wait_for_line("ready") is None:
            pytest.fail("\n".join(up.output) + "\n" + log_tails(directory), pytrace=False)
        resp_port = int(resp_line.rsplit(":", 1)[1])
        yield coordinator, password_file.read_text().strip(), resp_port
    finally:
        up.stop()


def test_the_password_admits_a_client_and_its_absence_is_refused_at_once(secured):
    coordinator, password, _ = secured
    with Client(coordinator, timeout=30, password=password) as client:
        table = client.create_table("secured", span=2)
        client.write(table, b"k", b"v")
        assert client.read(table, b"k")[0] == b"v"

    # The typed errors themselves show the refusals were not retried: a retried failure ends
    # as a Timeout.
    with Client(coordinator, timeout=30) as anonymous:
        with pytest.raises(PermissionDenied) as refused:
            anonymous.list_tables()
        assert "client password" in str(refused.value)
        # The paths that locate many keys, or a transaction's, give up at once too.
        with pytest.raises(PermissionDenied):
            anonymous.multi_read([(table, b"k")])
        with pytest.raises(PermissionDenied):
            anonymous.run_transaction(lambda transaction: transaction.read(table, b"k"))
    with Client(coordinator, timeout=30, password="not the password of this cluster") as wrong:
        with pytest.raises(AuthenticationFailed):
            wrong.list_tables()


def test_a_short_password_is_refused_before_any_connection():
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", password="short")


def test_redis_py_authenticates_with_the_password_in_plain_text(secured):
    _, password, port = secured
    client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=20)
    assert client.set("plain-key", "v")
    assert client.get("plain-key") == b"v"
    client.close()
    anonymous = redis.Redis(host="127.0.0.1", port=port, socket_timeout=20)
    with pytest.raises(redis.AuthenticationError):
        anonymous.get("plain-key")
    anonymous.close()
    # AUTH with the default user's name, as redis-cli --user default sends it.
    named = redis.Redis(
        host="127.0.0.1", port=port, username="default", password=password, socket_timeout=20
    )
    assert named.get("plain-key") == b"v"
    named.close()
