"""Named users on a real cluster that requires the client password (``stratus up`` with
``--client-password-file``): the default user creates a user allowed on one table; that user
reads and writes it, is refused the other at once (``PermissionDenied``), cannot manage users,
and a wrong password is refused (``AuthenticationFailed``). Over RESP, redis-py authenticates as
the user and gets NOPERM for what its grants do not allow."""

from __future__ import annotations

import time

import pytest
import redis

from conftest import SERVER_SIZE_FLAGS, ManagedProcess, free_loopback_port, log_tails, stratus_binary

from stratus_client import (
    ACCESS_READ,
    ACCESS_WRITE,
    AuthenticationFailed,
    Client,
    IdentityKind,
    PermissionDenied,
    TableGrant,
)

ALICE_PASSWORD = "alice-password-of-this-test"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A one-server cluster with a cluster secret and a client password (created by `up`)."""
    directory = tmp_path_factory.mktemp("stratus-users")
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
            "1",
            "--cluster-secret-file",
            str(directory / "cluster-secret"),
            "--client-password-file",
            str(password_file),
            "--resp-port",
            "0",
            *SERVER_SIZE_FLAGS,
        ],
        "stratus up (users)",
    )
    try:
        resp_line = up.wait_for_line("redis: server-0 ")
        if resp_line is None or up.wait_for_line("ready") is None:
            pytest.fail("\n".join(up.output) + "\n" + log_tails(directory), pytrace=False)
        resp_port = int(resp_line.rsplit(":", 1)[1])
        yield coordinator, password_file.read_text().strip(), resp_port
    finally:
        up.stop()


def test_a_user_may_do_what_its_grants_allow_and_nothing_else(secured):
    coordinator, password, _ = secured
    with Client(coordinator, timeout=30, password=password) as admin:
        assert admin.who_am_i().kind is IdentityKind.DEFAULT
        allowed = admin.create_table("py-allowed")
        refused = admin.create_table("py-refused")
        admin.write(refused, b"k", b"secret")
        created = admin.set_user("py-alice", password=ALICE_PASSWORD, grants=["py-allowed=rw"])
        assert created
        (alice,) = [user for user in admin.list_users() if user.name == "py-alice"]
        assert alice.enabled and alice.has_password
        assert alice.grants == (TableGrant("py-allowed", ACCESS_READ | ACCESS_WRITE),)

    with Client(coordinator, timeout=30, user="py-alice", password=ALICE_PASSWORD) as client:
        identity = client.who_am_i()
        assert (identity.kind, identity.name) == (IdentityKind.USER, "py-alice")
        client.write(allowed, b"k", b"v")
        assert client.read(allowed, b"k")[0] == b"v"
        started = time.monotonic()
        with pytest.raises(PermissionDenied) as denied:
            client.read(refused, b"k")
        assert "py-alice" in str(denied.value)
        with pytest.raises(PermissionDenied):
            client.write(refused, b"k", b"overwritten")
        with pytest.raises(PermissionDenied):
            client.list_users()
        with pytest.raises(PermissionDenied):
            client.set_user("py-mallory", password=ALICE_PASSWORD, grants=["*=rwa"])
        assert time.monotonic() - started < 15, "refusals are not retried until the timeout"

    with Client(coordinator, timeout=30, user="py-alice", password="not-alices-password") as wrong:
        with pytest.raises(AuthenticationFailed):
            wrong.who_am_i()

    with Client(coordinator, timeout=30, password=password) as admin:
        assert admin.read(refused, b"k")[0] == b"secret"
        # Grants changed without a password keep it.
        assert not admin.set_user("py-alice", grants=["py-allowed=r"])
    with Client(coordinator, timeout=30, user="py-alice", password=ALICE_PASSWORD) as client:
        assert client.read(allowed, b"k")[0] == b"v"
        with pytest.raises(PermissionDenied):
            client.write(allowed, b"k", b"v2")
    with Client(coordinator, timeout=30, password=password) as admin:
        assert admin.delete_user("py-alice")
        assert not admin.delete_user("py-alice")


def test_redis_py_authenticates_as_a_user_and_gets_noperm(secured):
    coordinator, password, port = secured
    with Client(coordinator, timeout=30, password=password) as admin:
        admin.create_table("redis-db-0")
        admin.create_table("redis-db-1")
        admin.set_user("py-bob", password="bob-password-of-this-test", grants=["redis-db-0=rw"])
    bob = redis.Redis(
        host="127.0.0.1",
        port=port,
        username="py-bob",
        password="bob-password-of-this-test",
        socket_timeout=20,
    )
    assert bob.acl_whoami() == "py-bob"
    assert bob.set("bobs-key", "1")
    assert bob.incr("bobs-key") == 2
    with pytest.raises(redis.exceptions.NoPermissionError):
        bob.acl_list()
    other = redis.Redis(
        host="127.0.0.1",
        port=port,
        db=1,
        username="py-bob",
        password="bob-password-of-this-test",
        socket_timeout=20,
    )
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.get("anything")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(
            host="127.0.0.1",
            port=port,
            username="py-bob",
            password="wrong-password",
            socket_timeout=20,
        ).get("bobs-key")
    admin_redis = redis.Redis(
        host="127.0.0.1", port=port, password=password, socket_timeout=20, decode_responses=True
    )
    assert admin_redis.acl_setuser(
        "py-carol", enabled=True, passwords=["+carol-password-1"], keys=["redis-db-1"]
    )
    assert "py-carol" in admin_redis.acl_users()
    assert admin_redis.acl_deluser("py-bob", "py-carol") == 2
    with pytest.raises(redis.exceptions.NoPermissionError):
        bob.get("bobs-key")
    for connection in (bob, other, admin_redis):
        connection.close()
