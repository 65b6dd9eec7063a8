"""A cluster started with ``stratus up --secure`` speaks only TLS (with a local CA) and asks
for the client password: the Python client reaches it with ``tls_ca_file=`` and ``password=``;
redis-py reaches its RESP front end with ``ssl=True`` and the password; without TLS, or
without the password, both are refused."""

from __future__ import annotations

import pytest
import redis

from conftest import SERVER_SIZE_FLAGS, ManagedProcess, free_loopback_port, log_tails, stratus_binary
from stratus_client import Client, StratusError


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A two-server cluster from `up --secure`, with RESP front ends: (coordinator, RESP port,
    CA file, password)."""
    directory = tmp_path_factory.mktemp("stratus-tls")
    data = directory / "data"
    coordinator = f"127.0.0.1:{free_loopback_port()}"
    up = ManagedProcess(
        [
            str(stratus_binary()),
            "--coordinator",
            coordinator,
            "up",
            "--secure",
            "--dir",
            str(data),
            "--servers",
            "2",
            "--resp-port",
            "0",
            *SERVER_SIZE_FLAGS,
        ],
        "stratus up --secure",
    )
    try:
        resp_line = up.wait_for_line("redis: server-0 ")
        if resp_line is None or up.wait_for_line("ready") is None:
            pytest.fail("\n".join(up.output) + "\n" + log_tails(directory), pytrace=False)
        port = int(resp_line.rsplit(":", 1)[1])
        password = (data / "secrets" / "client-password").read_text().strip()
        yield coordinator, port, data / "tls" / "ca.pem", password
    finally:
        up.stop()


def test_the_client_speaks_tls_with_the_ca_and_is_refused_without_it(secure):
    coordinator, _, ca, password = secure
    with Client(coordinator, timeout=30, password=password, tls_ca_file=ca) as client:
        table = client.create_table("tls-table", span=2)
        client.write(table, b"alice", b"100")
        assert client.read(table, b"alice")[0] == b"100"
    with Client(coordinator, timeout=3, password=password) as plain:
        with pytest.raises(StratusError):
            plain.list_tables()


def test_tls_options_are_checked_when_the_client_is_made():
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", tls_cert_file="client.pem")
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", tls_ca_file="ca.pem", tls_cert_file="client.pem")


def test_redis_py_over_tls_with_the_password(secure):
    _, port, ca, password = secure
    client = redis.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), password=password,
        socket_timeout=20,
    )
    assert client.set("greeting", "hello")
    assert client.get("greeting") == b"hello"
    client.close()

    anonymous = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), socket_timeout=20)
    with pytest.raises(redis.AuthenticationError):
        anonymous.get("greeting")
    anonymous.close()

    wrong = redis.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), password="not the password!",
        socket_timeout=20,
    )
    with pytest.raises(redis.AuthenticationError):
        wrong.get("greeting")
    wrong.close()

    plain = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=5)
    with pytest.raises(redis.ConnectionError):
        plain.get("greeting")
    plain.close()


def test_named_users_over_tls_native_redis_py_and_redis_cli(secure):
    """A named user over TLS: the native client, redis-py with a user name, and redis-cli
    --tls --user, each allowed on its table and refused (NOPERM) on another."""
    import shutil
    import subprocess

    from stratus_client import PermissionDenied

    coordinator, port, ca, password = secure
    user_password = "carol-password-over-tls"
    with Client(coordinator, timeout=30, password=password, tls_ca_file=ca) as admin:
        admin.create_table("redis-db-0")
        secret = admin.create_table("tls-secret")
        admin.write(secret, b"k", b"hidden")
        admin.set_user("tls-carol", password=user_password, grants=["redis-db-0=rw", "tls-users=rw"])
        users = admin.create_table("tls-users")
    with Client(coordinator, timeout=30, user="tls-carol", password=user_password, tls_ca_file=ca) as carol:
        carol.write(users, b"k", b"v")
        assert carol.read(users, b"k")[0] == b"v"
        with pytest.raises(PermissionDenied):
            carol.read(secret, b"k")

    over_tls = redis.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), username="tls-carol",
        password=user_password, socket_timeout=20,
    )
    assert over_tls.acl_whoami() == "tls-carol"
    assert over_tls.set("carols-key", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        over_tls.acl_list()
    over_tls.close()

    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed (scripts/test installs it)")
    command = [
        "redis-cli", "--tls", "--cacert", str(ca), "-p", str(port),
        "--user", "tls-carol", "--pass", user_password, "--no-auth-warning",
    ]
    allowed = subprocess.run([*command, "GET", "carols-key"], capture_output=True, text=True, timeout=30)
    assert allowed.stdout.strip() == "1", allowed.stdout + allowed.stderr
    refused = subprocess.run([*command, "ACL", "LIST"], capture_output=True, text=True, timeout=30)
    assert "NOPERM" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
