#!/usr/bin/env python3
"""Multi-host fault-injection test of Stratus in containers.

Brings up a coordinator and N storage servers (default 5), each its own container from the
`stratus:local` image (deploy/build-image.sh), on a private internal network created for this
run; starts a client container running `stratus workload` (recorded exactly-once clients, then
every key read back and the history checked for linearizability and lost writes, and counter
keys checked for increments applied other than once; list-append transactions checked for
every anomaly strict serializability forbids, their own summary line required to read
"workload: list_append ok ... anomalies=0"); and meanwhile injects faults on a
schedule drawn from a seed:

  kill        SIGKILL of a server (docker kill), restarted after the hold: a new server process
              on the same backup volume (it enlists as a new server at the same address)
  pause       the server's processes frozen (docker pause), then thawed
  sigstop     SIGSTOP to the server (docker kill -s STOP), then SIGCONT
  partition   the server cut off the network (docker network disconnect), then reconnected
  coordinator SIGKILL of the coordinator, restarted on its volume after the hold

A fault episode hits one or more distinct servers at once (at most servers - replicas - 1, so
every master always finds enough backups and every crash stays recoverable), holds for a
seeded time (short holds stay under failure detection, long ones get the server declared
crashed, one in ten freezes it for 10 s), heals, restarts every server container that exited (a server declared crashed
exits), and waits until the cluster is healthy again (every server address up, every tablet
served) before the next episode. A cluster that does not recover within --recovery-timeout
fails the run. The workload's exit status is the verdict: 0 pass, 2 violation (lost write or
non-linearizable history, a counter that shows an increment applied twice, or a list-append
anomaly), 3 inconclusive.

Availability is bounded too (issue 27): the workload writes when each operation ran and which
master owned its key (`--availability-out`), and for every episode that faulted only servers,
no operation on a key of a server the episode did not fault may have waited longer than
OTHERS_STALL_BOUND_MS while the episode lasted (from its first fault until the cluster was
healthy again). An episode over the bound fails the run. How long the faulted servers' keys
waited is reported per episode.

The coordinator and the servers run in secure mode: one cluster secret, and TLS on every port
with certificates from a local CA (`stratus tls local-ca`, run in a container of the image),
both copied into each container; the workload is a client: it holds the CA, no secret.

Every wait is bounded (the whole run by --deadline, default 360 s, after the image build);
containers, the network and volumes are removed in a finally block, on failure and on Ctrl-C
too. On failure the logs of every container, the fault schedule and the whole history are
saved under --logs-dir.

  python3 tests/containers/run.py --seed 42 --seconds 60

The same seed gives the same fault schedule and the same workload choices; the interleaving
and recovery timings come from the machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COORDINATOR_PORT = 7400
SERVER_PORT = 7401
LABEL = "org.stratus.container-test"

# Where the coordinator's and the servers' containers find the cluster secret.
SECRET_PATH = "/cluster-secret"
# Where every container finds the local CA's files (`stratus tls local-ca`).
TLS_DIRECTORY = "/tls"

# How long one docker command may take before the run fails (the engine is local).
DOCKER_TIMEOUT = 60
# Seconds of the mixed phase kept free of faults at its end, so the last episode has healed
# before the workload stops writing.
QUIET_TAIL = 6.0
# Where the workload writes when each operation ran and which master owned its key.
AVAILABILITY_FILE = "/tmp/availability.txt"
# The availability bound (issue 27): during a fault episode on servers, operations on keys of
# the servers not faulted may wait at most this long. `stratus bench failover` holds processes
# on one machine to 250 ms (its goal); here seven containers share two cores, servers restart
# during episodes, and two faults may overlap (the CI's seed saw up to 557 ms), so the bound is
# set to catch the multi-second stalls issue 27 reported (3-8 s) without failing on the
# machine's noise. Episodes that kill the only coordinator are reported but not bounded: with
# one coordinator every master stops serving when its lease runs out, by design (standbys on
# etcd take over without a stall: bench failover).
OTHERS_STALL_BOUND_MS = 2000
# An operation that took longer than this waited for the fault ("served again" is when the
# faulted servers' keys' last such operation ended).
STALL_THRESHOLD_MS = 100


class RunFailed(Exception):
    """The run cannot go on; the message says why."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP: handled like Ctrl-C (teardown runs)."""


def log(message: str) -> None:
    elapsed = time.monotonic() - STARTED
    print(f"[{elapsed:7.1f}s] {message}", flush=True)


STARTED = time.monotonic()


def docker(*arguments: str, timeout: float = DOCKER_TIMEOUT, check: bool = True,
           merge: bool = False) -> subprocess.CompletedProcess:
    """Runs one docker command, bounded in time; `merge` puts stderr into stdout, in order."""
    command = ["docker", *arguments]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise RunFailed(f"`{' '.join(command)}` took longer than {timeout:.0f}s") from error
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()
        raise RunFailed(f"`{' '.join(command)}` failed ({result.returncode}): {detail}")
    return result


class Cluster:
    """The containers, network and volumes of one run, and how to break and heal them."""

    def __init__(self, arguments: argparse.Namespace, run_id: str):
        self.arguments = arguments
        self.run_id = run_id
        self.network = f"{run_id}-net"
        self.image = arguments.image
        self.servers = [f"server-{index}" for index in range(1, arguments.servers + 1)]
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.network_created = False
        # Servers started again after they exited on their own (declared crashed).
        self.restarts = 0
        # Holds the cluster secret file while the run lasts (removed in teardown).
        self.secret_directory = tempfile.mkdtemp(prefix=f"{run_id}-")

    # -- naming

    def container(self, role: str) -> str:
        return f"{self.run_id}-{role}"

    @property
    def client(self) -> str:
        return self.container("client")

    @property
    def coordinator(self) -> str:
        return self.container("coordinator")

    def labels(self) -> list[str]:
        return ["--label", f"{LABEL}={self.run_id}"]

    # -- bring-up

    def write_tls_files(self) -> Path:
        """The local CA and one certificate naming every member's host name, written by the
        image's own `stratus tls local-ca` in a throwaway container and copied out."""
        directory = Path(self.secret_directory) / "tls"
        if directory.exists():
            return directory
        name = self.container("tls")
        hosts = [argument for role in ["coordinator", *self.servers] for argument in ("--host", role)]
        docker("create", "--name", name, *self.labels(), self.image,
               "tls", "local-ca", "--dir", "/tmp/tls", *hosts)
        self.containers.append(name)
        docker("start", "--attach", name)
        docker("cp", f"{name}:/tmp/tls", str(directory))
        return directory

    def create(self) -> None:
        docker("network", "create", "--internal", *self.labels(), self.network)
        self.network_created = True
        for role in ["coordinator", *self.servers]:
            volume = f"{self.run_id}-{role}"
            docker("volume", "create", *self.labels(), volume)
            self.volumes.append(volume)
        self.run_container("coordinator", [
            "coordinator", f"--listen=0.0.0.0:{COORDINATOR_PORT}", "--dir=/data/coordinator",
        ], volume=f"{self.run_id}-coordinator")
        for server in self.servers:
            self.run_container(server, [
                f"--coordinator=coordinator:{COORDINATOR_PORT}", "server",
                f"--listen=0.0.0.0:{SERVER_PORT}", f"--advertise={server}:{SERVER_PORT}",
                "--backup-dir=/data/backup", f"--replicas={self.arguments.replicas}",
                f"--durability={self.arguments.durability}",
                f"--log-mib={self.arguments.log_mib}", "--segment-mib=1",
                "--backup-frames=512",
            ], volume=f"{self.run_id}-{server}")

    def run_container(self, role: str, command: list[str], volume: str | None = None) -> None:
        """Starts `role`'s container. The coordinator and the servers run in secure mode: each
        gets the run's cluster secret and the local CA's certificate and key, copied in with
        `docker cp` before it starts (works with a remote engine too), so they speak only TLS
        and admit only each other to server-to-server operations; the workload is a client and
        gets the CA alone."""
        name = self.container(role)
        member = role != "client"
        tls = f"{TLS_DIRECTORY}/"
        arguments = ["--name", name, "--hostname", role,
                     "--network", self.network, "--network-alias", role,
                     "--env", "NO_COLOR=1", *self.labels(),
                     "--env", f"STRATUS_TLS_CA_FILE={tls}ca.pem"]
        if member:
            arguments += ["--env", f"STRATUS_CLUSTER_SECRET_FILE={SECRET_PATH}",
                          "--env", f"STRATUS_TLS_CERT_FILE={tls}node.pem",
                          "--env", f"STRATUS_TLS_KEY_FILE={tls}node-key.pem"]
        if volume:
            arguments += ["--volume", f"{volume}:/data"]
        tls_files = self.write_tls_files()
        docker("create", *arguments, self.image, *command)
        self.containers.append(name)
        docker("cp", str(tls_files), f"{name}:{TLS_DIRECTORY}")
        if member:
            secret_file = Path(self.secret_directory) / "cluster-secret"
            if not secret_file.exists():
                secret_file.write_text(secrets.token_hex(32) + "\n")
            docker("cp", str(secret_file), f"{name}:{SECRET_PATH}")
        docker("start", name)

    def check_tls(self) -> None:
        """Every member said it speaks TLS (its certificate came through), or the run fails."""
        for role in ["coordinator", *self.servers]:
            logs = docker("logs", self.container(role), check=False, merge=True).stdout or ""
            if "speaks TLS on every listener" not in logs:
                raise RunFailed(f"{role} does not say it speaks TLS:\n{logs[-2000:]}")

    def start_workload(self, seed: int) -> None:
        a = self.arguments
        self.run_container("client", [
            f"--coordinator=coordinator:{COORDINATOR_PORT}", "workload",
            f"--seed={seed}", f"--seconds={a.seconds}", f"--servers={a.servers}",
            f"--clients={a.clients}", f"--keys={a.keys}", f"--rate={a.rate}",
            "--settle-seconds=60", "--bank-accounts=16", "--bank-clients=2",
            "--list-append-keys=16", "--list-append-clients=1",
            "--startup-seconds=30", "--history-out=/tmp/history.txt",
            f"--availability-out={AVAILABILITY_FILE}",
        ])

    # -- state

    def state(self, name: str) -> dict:
        result = docker("inspect", "--format", "{{json .State}}", name, check=False)
        if result.returncode != 0:
            return {}
        return json.loads(result.stdout)

    def status_report(self, *options: str) -> str | None:
        """`stratus status` run inside the coordinator's container, or None."""
        result = docker("exec", self.coordinator, "stratus",
                        f"--coordinator=127.0.0.1:{COORDINATOR_PORT}", "--timeout-ms=2000",
                        "status", *options, check=False, timeout=20)
        return result.stdout if result.returncode == 0 else None

    def health(self) -> tuple[bool, str]:
        """Healthy: every server address has an up server that answers, every tablet is
        served (state normal) by an up server."""
        report = self.status_report("--json")
        if report is None:
            return False, "the coordinator does not answer"
        status = json.loads(report)
        up: dict[int, str] = {}
        problems = []
        for server in status["servers"]:
            if server["status"] != "up":
                continue
            server_id, address = server["server_id"], server["address"]
            up[server_id] = address
            if server["problem"]:
                problems.append(f"{address} (id {server_id}) is up but unreachable")
            if (server["backup"] or {}).get("storage_failure"):
                problems.append(f"{address} (id {server_id}): backup storage failed")
        addresses = sorted(up.values())
        expected = sorted(f"{server}:{SERVER_PORT}" for server in self.servers)
        if addresses != expected:
            problems.append(f"up servers {addresses}")
        tablets = [tablet for table in status["tables"] for tablet in table["tablets"]]
        for tablet in tablets:
            owner, state = tablet["server_id"], tablet["state"]
            if state != "normal" or owner not in up:
                problems.append(
                    f"a tablet owned by {owner} ({tablet['server_address']}) is {state}")
                break
        return not problems, "; ".join(problems) or "healthy"

    def restart_exited_servers(self, history: list) -> None:
        """A server declared crashed exits; a killed one stays down: start them again (a new
        process on the same backup volume)."""
        for server in self.servers:
            state = self.state(self.container(server))
            if state and state.get("Status") == "exited":
                log(f"  {server} had exited (status {state.get('ExitCode')}: declared crashed, "
                    "it left on its own); starting it again")
                docker("start", self.container(server))
                self.restarts += 1
                history.append({"t": round(time.monotonic() - STARTED, 1), "event": "restart",
                                "server": server, "exit_code": state.get("ExitCode")})

    def wait_healthy(self, patience: float, deadline: float, history: list) -> float:
        """Restarts exited servers and waits until healthy; returns the seconds it took."""
        started = time.monotonic()
        limit = min(started + patience, deadline)
        last = ""
        while True:
            self.restart_exited_servers(history)
            healthy, last = self.health()
            if healthy:
                return time.monotonic() - started
            if time.monotonic() >= limit:
                raise RunFailed(f"the cluster did not recover within {patience:.0f}s: {last}")
            time.sleep(0.5)

    # -- faults

    def inject(self, kind: str, target: str) -> None:
        name = self.container(target)
        if kind in ("kill", "coordinator"):
            docker("kill", "--signal", "KILL", name)
        elif kind == "pause":
            docker("pause", name)
        elif kind == "sigstop":
            docker("kill", "--signal", "STOP", name)
        elif kind == "partition":
            docker("network", "disconnect", "--force", self.network, name)
        else:
            raise ValueError(kind)

    def heal(self, kind: str, target: str) -> None:
        name = self.container(target)
        if kind in ("kill", "coordinator"):
            state = self.state(name)
            if state.get("Status") != "running":
                log(f"  restarting {target} (a new process on the same volume)")
                docker("start", name)
        elif kind == "pause":
            docker("unpause", name)
        elif kind == "sigstop":
            # A server that was declared crashed meanwhile exits once it runs again.
            docker("kill", "--signal", "CONT", name, check=False)
        elif kind == "partition":
            docker("network", "connect", "--alias", target, self.network, name)
        else:
            raise ValueError(kind)

    # -- evidence and teardown

    def save_logs(self, directory: Path, extra: dict[str, str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in self.containers:
            result = docker("logs", "--timestamps", name, check=False, timeout=60, merge=True)
            (directory / f"{name.removeprefix(self.run_id + '-')}.log").write_text(result.stdout)
            state = self.state(name)
            (directory / f"{name.removeprefix(self.run_id + '-')}.state.json").write_text(
                json.dumps(state, indent=2))
        if self.client in self.containers:
            docker("cp", f"{self.client}:/tmp/history.txt", str(directory / "history.txt"),
                   check=False, timeout=120)
        for file_name, text in extra.items():
            (directory / file_name).write_text(text)

    def teardown(self) -> None:
        """Removes everything this run created, whatever state it is in; never raises."""
        shutil.rmtree(self.secret_directory, ignore_errors=True)
        names = set(self.containers)
        # Anything labelled for this run, even if its creation was interrupted half-way.
        listed = docker("ps", "--all", "--quiet", "--filter", f"label={LABEL}={self.run_id}",
                        check=False, timeout=30)
        names.update(line for line in (listed.stdout or "").split() if line)
        for name in names:
            try:
                if self.state(name).get("Paused"):
                    docker("unpause", name, check=False, timeout=30)
                docker("rm", "--force", "--volumes", name, check=False, timeout=60)
            except RunFailed as error:
                print(f"teardown: {error}", file=sys.stderr)
        if self.network_created:
            try:
                docker("network", "rm", self.network, check=False, timeout=60)
            except RunFailed as error:
                print(f"teardown: {error}", file=sys.stderr)
        volumes = set(self.volumes)
        listed = docker("volume", "ls", "--quiet", "--filter", f"label={LABEL}={self.run_id}",
                        check=False, timeout=30)
        volumes.update(line for line in (listed.stdout or "").split() if line)
        for volume in volumes:
            try:
                docker("volume", "rm", "--force", volume, check=False, timeout=60)
            except RunFailed as error:
                print(f"teardown: {error}", file=sys.stderr)


def plan_episode(rng: random.Random, cluster: Cluster, max_faults: int,
                 coordinator_faults: bool) -> list[tuple[str, str, float]]:
    """One episode: (kind, target, delay before injecting) for each fault."""
    if coordinator_faults and rng.random() < 0.1:
        return [("coordinator", "coordinator", 0.0)]
    count = 1 if max_faults == 1 or rng.random() < 0.6 else rng.randint(2, max_faults)
    targets = rng.sample(cluster.servers, count)
    kinds = ["kill", "pause", "sigstop", "partition"]
    plan = []
    for index, target in enumerate(targets):
        # Faults of an episode start together or staggered (a crash during another's recovery).
        delay = 0.0 if index == 0 else rng.choice([0.0, rng.uniform(0.2, 2.0)])
        plan.append((rng.choice(kinds), target, delay))
    return plan


def inject_faults(cluster: Cluster, rng: random.Random, arguments: argparse.Namespace,
                  mixed_end: float, deadline: float, history: list,
                  counts: collections.Counter) -> None:
    """Episodes until the mixed phase nears its end (or the client exits)."""
    max_faults = min(arguments.max_faults, arguments.servers - arguments.replicas - 1)
    episode = 0
    while True:
        gap = rng.uniform(1.0, 4.0)
        # Short holds stay under failure detection (about 0.6 s of missed pings, and the
        # lease); long ones get the server declared crashed and recovered; one in ten is a
        # 10 s freeze (issue 27's longest pause), which the others must not wait for.
        draw = rng.random()
        hold = (rng.uniform(0.2, 1.0) if draw < 0.45 else rng.uniform(1.0, 5.0) if draw < 0.9
                else 10.0)
        plan = plan_episode(rng, cluster, max_faults, arguments.coordinator_faults)
        time.sleep(gap)
        # Leave room to hold, heal and recover before the workload stops.
        if time.monotonic() + hold + 3.0 > mixed_end - QUIET_TAIL:
            return
        if cluster.state(cluster.client).get("Status") != "running":
            log("the client exited early; no more faults")
            return
        episode += 1
        description = ", ".join(f"{kind} {target}" + (f" +{delay:.1f}s" if delay else "")
                                for kind, target, delay in plan)
        log(f"episode {episode}: {description}; hold {hold:.1f}s")
        injected = []
        try:
            for kind, target, delay in plan:
                time.sleep(delay)
                cluster.inject(kind, target)
                injected.append((kind, target))
                counts[kind] += 1
                history.append({"t": round(time.monotonic() - STARTED, 1), "event": "inject",
                                "episode": episode, "kind": kind, "target": target,
                                "wall": time.time()})
            time.sleep(hold)
        finally:
            for kind, target in injected:
                cluster.heal(kind, target)
                history.append({"t": round(time.monotonic() - STARTED, 1), "event": "heal",
                                "episode": episode, "kind": kind, "target": target})
        # A server declared crashed exits a moment after it runs again: give it that moment,
        # so that the health check sees it gone rather than a zombie about to leave.
        time.sleep(1.0)
        took = cluster.wait_healthy(arguments.recovery_timeout, deadline, history)
        log(f"  healthy again {took:.1f}s after healing")
        history.append({"t": round(time.monotonic() - STARTED, 1), "event": "healthy",
                        "episode": episode, "seconds": round(took, 1), "wall": time.time()})


def read_availability(path: Path) -> list[tuple[float, float, str]]:
    """(start s, end s, owner address) of every timed operation (wall clock)."""
    operations = []
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        start, end, _key, owner = line.split()
        operations.append((int(start) / 1e6, int(end) / 1e6, owner))
    return operations


def availability_report(history: list, operations: list[tuple[float, float, str]]
                        ) -> tuple[list[dict], list[str]]:
    """Per episode: the longest wait of operations on servers not faulted (bounded unless the
    coordinator was faulted) and when the faulted servers' keys were served again. Returns
    the rows and the bound's violations."""
    rows, violations = [], []
    episodes = sorted({event["episode"] for event in history if event["event"] == "inject"})
    for episode in episodes:
        injects = [e for e in history if e["event"] == "inject" and e["episode"] == episode]
        healthy = [e for e in history if e["event"] == "healthy" and e["episode"] == episode]
        if not healthy:
            continue
        start, end = injects[0]["wall"], healthy[0]["wall"]
        targets = {f"{e['target']}:{SERVER_PORT}" for e in injects if e["kind"] != "coordinator"}
        coordinator = any(e["kind"] == "coordinator" for e in injects)
        overlapping = [op for op in operations if op[0] < end and op[1] > start and op[2] != "-"]
        others = [op[1] - op[0] for op in overlapping if op[2] not in targets]
        failed = [op for op in overlapping if op[2] in targets]
        served_again = max((op[1] - start for op in failed
                            if (op[1] - op[0]) * 1000 > STALL_THRESHOLD_MS), default=0.0)
        row = {"episode": episode,
               "faults": ", ".join(f"{e['kind']} {e['target']}" for e in injects),
               "others_operations": len(others),
               "others_longest_ms": round(max(others, default=0.0) * 1000, 1),
               "failed_operations": len(failed),
               "failed_served_again_ms": round(served_again * 1000, 1),
               "bounded": not coordinator}
        rows.append(row)
        if row["bounded"] and row["others_longest_ms"] > OTHERS_STALL_BOUND_MS:
            violations.append(f"episode {episode} ({row['faults']}): an operation on a server "
                              f"not faulted waited {row['others_longest_ms']:.0f} ms "
                              f"(bound {OTHERS_STALL_BOUND_MS} ms)")
    return rows, violations


def check_availability(cluster: "Cluster", history: list, directory: Path) -> tuple[list, list]:
    """Copies the workload's availability file out and measures every episode."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "availability.txt"
    docker("cp", f"{cluster.client}:{AVAILABILITY_FILE}", str(path), timeout=120)
    rows, violations = availability_report(history, read_availability(path))
    log(f"availability per episode (others bounded to {OTHERS_STALL_BOUND_MS} ms unless the "
        "coordinator was faulted):")
    for row in rows:
        log(f"  episode {row['episode']:>2} {row['faults']:<40} others: "
            f"{row['others_longest_ms']:>8.1f} ms longest over {row['others_operations']:>6} ops"
            f"{'' if row['bounded'] else ' (not bounded)'}; faulted keys served again after "
            f"{row['failed_served_again_ms']:.0f} ms")
    return rows, violations


def build_image(arguments: argparse.Namespace) -> None:
    exists = docker("image", "inspect", arguments.image, check=False).returncode == 0
    if arguments.build == "never" or (arguments.build == "auto" and exists):
        if not exists:
            raise RunFailed(f"no image {arguments.image}; run deploy/build-image.sh")
        log(f"using the existing image {arguments.image}")
        return
    log(f"building {arguments.image} (deploy/build-image.sh)")
    try:
        subprocess.run([str(REPO / "deploy" / "build-image.sh"), "--tag", arguments.image],
                       check=True, timeout=arguments.build_timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as error:
        raise RunFailed(f"the image build took longer than {arguments.build_timeout}s") from error
    except subprocess.CalledProcessError as error:
        raise RunFailed(f"the image build failed ({error.returncode})") from error


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the fault schedule and the workload (default: random)")
    parser.add_argument("--seconds", type=int, default=60, help="workload's mixed phase")
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2,
                        help="replicas per segment (at most servers - 2)")
    parser.add_argument("--max-faults", type=int, default=2,
                        help="most servers faulted at once (also at most servers - replicas - 1)")
    parser.add_argument("--durability", choices=["buffered", "fsync"], default="buffered")
    parser.add_argument("--log-mib", type=int, default=32, help="log memory per server")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--rate", type=int, default=1000,
                        help="most operations per second per client (0: unbounded); bounds the "
                        "history, and the checker's time grows faster than its length per key")
    parser.add_argument("--no-coordinator-faults", dest="coordinator_faults",
                        action="store_false", help="never kill the coordinator")
    parser.add_argument("--image", default="stratus:local")
    parser.add_argument("--build", choices=["always", "auto", "never"], default="always",
                        help="build the image first (auto: only if missing)")
    parser.add_argument("--build-timeout", type=int, default=900)
    parser.add_argument("--deadline", type=int, default=360,
                        help="bound of the whole run after the image build, in seconds")
    parser.add_argument("--recovery-timeout", type=float, default=60.0,
                        help="how long the cluster may take to be healthy after a fault heals")
    parser.add_argument("--logs-dir", type=Path,
                        default=Path(os.environ.get("TMPDIR", "/tmp")) / "stratus-container-logs")
    parser.add_argument("--keep-logs", action="store_true", help="save logs on success too")
    arguments = parser.parse_args()
    if arguments.max_faults < 1:
        parser.error("--max-faults must be at least 1")
    if arguments.replicas > arguments.servers - 2:
        parser.error("--replicas must be at most --servers - 2 (a crash must leave every master "
                     "enough backups besides itself)")
    if arguments.seconds + 150 > arguments.deadline:
        parser.error("--deadline must leave 150 s beyond --seconds (startup, final reads, "
                     "check, teardown)")
    return arguments


def main() -> int:
    arguments = parse_arguments()
    seed = arguments.seed if arguments.seed is not None else secrets.randbelow(2**32)
    run_id = f"stratus-ct-{secrets.token_hex(3)}"
    reproduce = " ".join([sys.argv[0], *sys.argv[1:]] + ([] if arguments.seed is not None
                                                         else ["--seed", str(seed)]))
    print(f"container test: seed={seed} run={run_id} servers={arguments.servers} "
          f"replicas={arguments.replicas} durability={arguments.durability} "
          f"seconds={arguments.seconds} (reproduce: {reproduce})", flush=True)
    if shutil.which("docker") is None:
        print("container test: FAILED: no docker command", file=sys.stderr)
        return 1
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        print(f"container test: FAILED: no Docker daemon: {info.stderr.strip()}", file=sys.stderr)
        return 1

    def terminate(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    # Ctrl-C tears down too, even when this process was started with SIGINT ignored (as
    # background jobs of a non-interactive shell are).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    cluster = Cluster(arguments, run_id)
    history: list = []
    counts: collections.Counter = collections.Counter()
    verdict, reason, workload_summary, list_append_summary = "FAILED", "", "", ""
    availability: list = []
    save = arguments.keep_logs
    try:
        build_image(arguments)
        deadline = time.monotonic() + arguments.deadline
        cluster.create()
        log(f"cluster starting: coordinator and {arguments.servers} servers on {cluster.network}")
        took = cluster.wait_healthy(60.0, deadline, history)
        cluster.check_tls()
        log(f"cluster healthy after {took:.1f}s; starting the workload")
        cluster.start_workload(seed)
        mixed_end = time.monotonic() + arguments.seconds
        rng = random.Random(seed)
        inject_faults(cluster, rng, arguments, mixed_end, deadline, history, counts)
        log(f"faults over: {sum(counts.values())} injected {dict(counts)}; waiting for the "
            "workload's final reads and check")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RunFailed("no time left for the workload to finish")
        try:
            docker("wait", cluster.client, timeout=remaining)
        except RunFailed as error:
            raise RunFailed(f"the workload did not finish within the deadline: {error}") from error
        exit_code = cluster.state(cluster.client).get("ExitCode")
        output = docker("logs", cluster.client, check=False, merge=True).stdout
        summary_lines = [line for line in output.splitlines() if "verdict=" in line]
        workload_summary = summary_lines[-1] if summary_lines else ""
        # The list-append transactions' own line: "ok ... anomalies=0" when they check out.
        list_lines = [line for line in output.splitlines()
                      if line.startswith("workload: list_append ")]
        list_append_summary = list_lines[-1] if list_lines else ""
        list_append_ok = (list_append_summary.startswith("workload: list_append ok ")
                          and list_append_summary.endswith(" anomalies=0"))
        print(output, end="", flush=True)
        # The cluster must still be whole at the end.
        healthy, state = cluster.health()
        availability, unavailable = [], []
        if exit_code == 0:
            availability, unavailable = check_availability(
                cluster, history, arguments.logs_dir / run_id)
        if exit_code == 0 and not list_append_ok:
            reason = f"list-append not checked out: {list_append_summary or 'no summary line'}"
        elif exit_code == 0 and healthy and not unavailable:
            verdict = "PASSED"
        elif exit_code == 0 and unavailable:
            reason = "availability: " + "; ".join(unavailable)
        elif exit_code == 0:
            reason = f"cluster unhealthy after the workload: {state}"
        else:
            reason = {2: "history violation (lost write, not linearizable, or a list-append "
                         "anomaly)",
                      3: "inconclusive (a key unreadable or undecided, or a timeout)"}.get(
                exit_code, f"the workload exited with status {exit_code}")
    except RunFailed as error:
        reason = str(error)
    except (KeyboardInterrupt, Terminated) as error:
        reason = f"interrupted ({type(error).__name__} {error})"
    finally:
        # A second Ctrl-C must not cut the teardown short (every docker call in it is bounded).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if verdict != "PASSED":
            save = True
        elapsed = time.monotonic() - STARTED
        result = {"verdict": verdict, "reason": reason, "seed": seed, "run": run_id,
                  "seconds": round(elapsed, 1), "faults": dict(counts),
                  "restarts_after_declared_crash": cluster.restarts,
                  "episodes": sum(1 for event in history if event["event"] == "healthy"),
                  "availability": availability,
                  "workload": workload_summary, "list_append": list_append_summary}
        if save:
            directory = arguments.logs_dir / run_id
            try:
                report = cluster.status_report() or ""
                cluster.save_logs(directory, {
                    "faults.json": json.dumps(history, indent=1),
                    "result.json": json.dumps(result, indent=1),
                    "status-at-end.txt": report,
                })
                print(f"container test: logs saved in {directory}", flush=True)
            except (RunFailed, OSError) as error:
                print(f"container test: saving logs failed: {error}", file=sys.stderr)
        log("tearing down")
        cluster.teardown()
    print(f"container test: {verdict}" + (f": {reason}" if reason else "")
          + f" (seed {seed}, {elapsed:.0f}s, faults {dict(counts)})", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if verdict == "PASSED" else 1


if __name__ == "__main__":
    sys.exit(main())
