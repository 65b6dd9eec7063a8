#!/usr/bin/env python3
"""Exercises deploy/compose.yaml as a user would: brings the cluster up from the `stratus:local`
image (deploy/build-image.sh), runs the file's own `cli` and `workload` services against it,
then takes it down with its volumes.

Checks, in order:
  1. `up -d` starts the coordinator and every server of the file;
  2. `run --rm cli status` lists every server as up;
  3. `run --rm cli table create` / `put` / `get` round-trip a value;
  4. `run --rm workload` (recorded clients, then every key read back and the history checked
     for linearizability) exits 0;
  5. every server's Redis port (6379, `--resp-listen`) answers PING; a SET through one server
     is read back by GET through every server (keys another server owns are forwarded);
  6. after `restart` of one server container, the value written in 3 is still readable, the
     Redis key of 5 is read back through the restarted server, and the workload passes again.

The Redis checks speak RESP from this host straight to the containers' addresses on the
compose network (the image holds no redis-cli); the network is internal, which cuts it off
from the outside, not from the host that runs the engine.

Every docker command is bounded (--deadline for the whole run); the project's containers and
volumes are removed in a finally block. Usage:

  python3 tests/containers/compose.py [--workload-seconds 10] [--deadline 300]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
PROJECT = "stratus-compose-test"
# The servers' Redis port in the compose file (`--resp-listen=0.0.0.0:6379`).
RESP_PORT = 6379
# How long one docker command of the Redis checks may take (the engine is local).
DOCKER_TIMEOUT = 60


def compose_command() -> list[str]:
    """`docker compose` (v2) where it exists, else `docker-compose` (v1)."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    sys.exit("compose.py: neither `docker compose` nor `docker-compose` is available")


class Compose:
    def __init__(self, deadline: float) -> None:
        self.base = compose_command() + ["-p", PROJECT, "-f", str(COMPOSE_FILE)]
        self.deadline = deadline

    def run(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"deadline passed before: {' '.join(arguments)}")
        command = self.base + list(arguments)
        print("+ compose", " ".join(arguments), flush=True)
        result = subprocess.run(command, capture_output=True, text=True, timeout=left)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(arguments)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result


def server_services() -> list[str]:
    """The storage server services the compose file declares."""
    text = COMPOSE_FILE.read_text()
    return sorted(set(re.findall(r"^  (server-\d+):$", text, flags=re.MULTILINE)))


class Resp:
    """A minimal RESP2 client: enough for PING, SET and GET against one server."""

    def __init__(self, address: str, timeout: float) -> None:
        self.socket = socket.create_connection((address, RESP_PORT), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.socket.close()

    def command(self, *words: str) -> object:
        request = f"*{len(words)}\r\n".encode()
        for word in words:
            data = word.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        self.socket.sendall(request)
        return self.reply()

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.socket.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def reply(self) -> object:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"error reply: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            length = int(rest)
            if length < 0:
                return None
            while len(self.buffer) < length + 2:
                chunk = self.socket.recv(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection")
                self.buffer += chunk
            data, self.buffer = self.buffer[:length], self.buffer[length + 2 :]
            return data.decode()
        raise RuntimeError(f"unexpected reply {line!r}")


def container_address(compose: Compose, service: str) -> str:
    """The address of `service`'s container on the compose network."""
    container = compose.run("ps", "-q", service).stdout.strip()
    assert container, f"no container for {service}"
    inspected = subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
         container],
        capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=True,
    )
    addresses = inspected.stdout.split()
    assert addresses, f"{service} has no address: {inspected.stdout!r}"
    return addresses[0]


def resp_call(compose: Compose, service: str, *words: str) -> object:
    """One command on `service`'s Redis port, retried while the server is still starting
    (its RESP port opens once it has enlisted) until the deadline."""
    last: Exception | None = None
    while time.monotonic() < compose.deadline:
        try:
            client = Resp(container_address(compose, service), timeout=10)
            try:
                return client.command(*words)
            finally:
                client.close()
        except (OSError, ConnectionError, RuntimeError) as error:
            last = error
            time.sleep(1)
    raise TimeoutError(f"{service}: {' '.join(words)} got no answer before the deadline: {last}")


def check_redis_round_trip(compose: Compose, servers: list[str], key: str, value: str) -> None:
    """PING on every server; SET through the first; GET through every one."""
    for service in servers:
        assert resp_call(compose, service, "PING") == "PONG", f"{service}: PING"
    assert resp_call(compose, servers[0], "SET", key, value) == "OK"
    for service in servers:
        got = resp_call(compose, service, "GET", key)
        assert got == value, f"GET {key} through {service}: {got!r}"
    print(f"compose.py: Redis round trip through {len(servers)} servers", flush=True)


def wait_for_servers(compose: Compose, count: int) -> str:
    """Polls `cli status` until `count` servers are up; returns the last status."""
    last = ""
    while time.monotonic() < compose.deadline:
        result = compose.run("run", "--rm", "cli", "status", "--json", check=False)
        last = result.stdout + result.stderr
        if result.returncode == 0:
            servers = json.loads(result.stdout)["servers"]
            if sum(1 for server in servers if server["status"] == "up") >= count:
                return result.stdout
        time.sleep(2)
    raise TimeoutError(f"{count} servers not up before the deadline; last status:\n{last}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload-seconds", type=int, default=10)
    parser.add_argument("--deadline", type=int, default=300, help="seconds for the whole run")
    arguments = parser.parse_args()
    compose = Compose(time.monotonic() + arguments.deadline)
    images = subprocess.run(
        ["docker", "image", "inspect", "stratus:local"], capture_output=True, text=True
    )
    if images.returncode != 0:
        sys.exit("compose.py: no stratus:local image; run deploy/build-image.sh first")
    servers = server_services()
    assert servers, "the compose file declares no server-N service"
    workload = [
        "run", "--rm", "workload", "workload", f"--servers={len(servers)}", "--keys=32",
        "--clients=2", f"--seconds={arguments.workload_seconds}",
    ]
    try:
        compose.run("down", "-v", "--remove-orphans", check=False)
        compose.run("up", "-d")
        status = wait_for_servers(compose, len(servers))
        print(status, flush=True)

        compose.run("run", "--rm", "cli", "table", "create", "compose", "--span", str(len(servers)))
        compose.run("run", "--rm", "cli", "put", "compose", "greeting", "hello from compose")
        read = compose.run("run", "--rm", "cli", "get", "compose", "greeting")
        assert "hello from compose" in read.stdout, f"read back: {read.stdout!r}"

        check_redis_round_trip(compose, servers, "compose-redis", "hello over RESP")

        result = compose.run(*workload, check=False)
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n", flush=True)
        assert result.returncode == 0, f"workload exited {result.returncode}"

        # A server container restarted (a clean stop and start): its tablets are recovered or
        # it comes back; either way the value and the workload survive.
        compose.run("restart", servers[0])
        wait_for_servers(compose, len(servers))
        read = compose.run("run", "--rm", "cli", "get", "compose", "greeting")
        assert "hello from compose" in read.stdout, f"after restart, read back: {read.stdout!r}"
        got = resp_call(compose, servers[0], "GET", "compose-redis")
        assert got == "hello over RESP", f"after restart, GET through {servers[0]}: {got!r}"
        result = compose.run(*workload, check=False)
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n", flush=True)
        assert result.returncode == 0, f"workload after a restart exited {result.returncode}"
        print("compose.py: PASS", flush=True)
        return 0
    except Exception:
        logs = compose.run("logs", "--no-color", "--tail", "200", check=False)
        print(logs.stdout[-20000:], file=sys.stderr)
        raise
    finally:
        # The run's own deadline may have passed: cleanup gets its own bound.
        compose.deadline = time.monotonic() + 120
        compose.run("down", "-v", "--remove-orphans", check=False)


if __name__ == "__main__":
    sys.exit(main())
