"""A real multi-node Ray cluster on this machine, for tests: ``ray start --head`` and a
second ``ray start --address`` node, each in its own process group, with their own
temporary directory, ports and auth token; stopped afterwards, even on failure, and
checked to leave no process behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass(frozen=True)
class Cluster:
    address: str
    env: dict[str, str]
    """What a driver needs to join it (its auth token)."""
    temp_dir: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leftovers(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (a temp dir, an address)."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [pid for pid in found.split() if int(pid) != os.getpid()]


def session_processes(tmp: Path) -> list[int]:
    """Processes of a run started with RAY_TMPDIR=tmp: Ray's daemons and workers inherit
    the variable (their titles, like ``ray::DashboardAgent``, may not name the path)."""
    marker = f"RAY_TMPDIR={tmp}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        if marker in environ:
            found.append(int(entry.name))
    return found


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    probe = f"import ray; ray.init(address={address!r}, log_to_driver=False); "
    probe += "print(sum(n['Alive'] for n in ray.nodes()))"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout else 0


def _stop(nodes: list[subprocess.Popen], temp_dir: Path) -> None:
    for node in reversed(nodes):  # `ray start --block` stops its node on SIGTERM
        with contextlib.suppress(ProcessLookupError):
            node.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while leftovers(str(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in leftovers(str(temp_dir)):  # what did not stop in time
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)


@contextlib.contextmanager
def two_node_cluster(cpus: int = 1, gpus: int = 2) -> Iterator[Cluster]:
    temp_dir = Path(tempfile.mkdtemp(prefix="rmn-", dir="/tmp"))  # short: Ray's socket paths
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = os.environ | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    common = ["--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    common += ["--num-cpus", str(cpus), "--num-gpus", str(gpus)]
    head = [RAY, "start", "--head", "--port", str(port), "--temp-dir", str(temp_dir)]
    head += ["--include-dashboard", "false"]
    worker = [RAY, "start", "--address", address]
    nodes: list[subprocess.Popen] = []
    log = (temp_dir / "nodes.log").open("w")
    try:
        for command in (head + common, worker + common):
            nodes.append(
                subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
            )
            deadline = time.monotonic() + 90
            while _alive_nodes(address, env) < len(nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(nodes)} Ray nodes did not start: {temp_dir}")
                time.sleep(1)
        yield Cluster(address, env, temp_dir)
    finally:
        _stop(nodes, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
