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
  5. after `restart` of one server container, the value written in 3 is still readable and
     the workload passes again.

Every docker command is bounded (--deadline for the whole run); the project's containers and
volumes are removed in a finally block. Usage:

  python3 tests/containers/compose.py [--workload-seconds 10] [--deadline 300]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
PROJECT = "stratus-compose-test"


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


def wait_for_servers(compose: Compose, count: int) -> str:
    """Polls `cli status` until `count` servers are up; returns the last status."""
    last = ""
    while time.monotonic() < compose.deadline:
        result = compose.run("run", "--rm", "cli", "status", check=False)
        last = result.stdout + result.stderr
        if result.returncode == 0 and result.stdout.count("status=Up") >= count:
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

        result = compose.run(*workload, check=False)
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n", flush=True)
        assert result.returncode == 0, f"workload exited {result.returncode}"

        # A server container restarted (a clean stop and start): its tablets are recovered or
        # it comes back; either way the value and the workload survive.
        compose.run("restart", servers[0])
        wait_for_servers(compose, len(servers))
        read = compose.run("run", "--rm", "cli", "get", "compose", "greeting")
        assert "hello from compose" in read.stdout, f"after restart, read back: {read.stdout!r}"
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
