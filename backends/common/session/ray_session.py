"""A Ray session that never outlives its run, and placement groups laid out by miles_core.

``ray_session`` starts a local Ray with virtual GPUs (``ray.init(num_gpus=N)``)
in its own temporary directory on this machine, or joins ``address``; either
way Ray is shut down on exit, errors, SIGTERM and Ctrl-C included, and a local
session's directory is removed. A Ctrl-C while Ray starts or stops is held
until it has (one that cut ``ray.init`` short left a half-started core worker,
and the interpreter then crashed at exit). A command's session says on stderr
that Ray is starting (a spinner on a terminal: it takes seconds), and its
driver prints no raylet alarm about a worker that a fault killed on purpose
(``ray_quiet``); a local session's autoscaler monitor is killed before
``ray.shutdown``, which otherwise waits a second for it, and the session's workers are
waited for (killed after ``SHUTDOWN_WAIT_S``) so none outlives the run. ``placed_bundles``
asks Ray where each bundle of a placement group landed (node address and GPU id, from a task
inside the bundle, where miles asks an InfoActor) and lets miles_core.placement
order them, resolving a node that Ray knows by hostname with ``dns_resolver``
(miles' placement_group.sort_key calls ``socket.gethostbyname``); the resolver
is injectable, so tests give a table.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence

import ray
import ray._private.ray_constants as ray_constants
import ray._private.worker
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from backends.common.session.process_tree import Proc, descendants, wait_gone
from backends.common.session.ray_quiet import quiet_intended_exits
from backends.common.session.spinner import spinner
from miles_core.placement import Bundle, Layout, Placement, Resolver, place

LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = frozenset({LOOPBACK, "::1", "localhost"})
"""What a server binds, or a peer is seen as, on this machine only."""

SYSTEM_CONFIG = {"task_events_report_interval_ms": 0}
"""A local session's Ray settings. Task events off: every actor call's events went to the
GCS, which keeps up to 100,000 tasks for the dashboard and state API (neither is used
here), and grew 56.5 MB per 20,000 calls (0.2 MB with them off); in an 8-minute soak it
was nearly all of the daemons' growth (gcs_server 48 -> 157 MB, raylet 29 -> 34 MB, the
others within 1 MB)."""


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """SIGTERM raises SystemExit while the session is open, so ``finally`` shuts Ray down
    (Python's default for SIGTERM ends the process at once, leaving Ray's daemons behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Ctrl-C (SIGINT) is held while the block runs and raised as KeyboardInterrupt once it
    ends (on the main thread; elsewhere Python delivers no signals anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and previous is not signal.SIG_IGN:
        raise KeyboardInterrupt


@contextlib.contextmanager
def ray_session(
    num_gpus: int, address: str | None = None, num_cpus: int = 16, *, show_start: bool = False
) -> Iterator[None]:
    """Ray for one run; ``num_cpus`` is logical (actors reserve none while running).
    ``show_start``: a line (a spinner on a terminal) on stderr while Ray starts. Ray's alarm
    about a worker that died is not printed for those killed on purpose (ray_quiet)."""
    with _terminate_cleanly():
        yield from _ray_session(num_gpus, address, num_cpus, show_start)


def _where(num_gpus: int, address: str | None, num_cpus: int) -> str:
    if address is not None:
        return f"joining Ray at {address}"
    gpus = f", {num_gpus} virtual GPU(s)" if num_gpus else ""
    return f"starting Ray (local: {num_cpus} CPU(s){gpus})"


def _ray_session(
    num_gpus: int, address: str | None, num_cpus: int, show_start: bool
) -> Iterator[None]:
    tmp = None
    try:  # ray.init inside: a SIGTERM during start-up still shuts down what it started
        with _ctrl_c_held(), spinner(_where(num_gpus, address, num_cpus), enabled=show_start):
            if address is None:
                tmp = tempfile.mkdtemp(prefix="ray-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
                ray.init(
                    num_gpus=num_gpus,
                    num_cpus=num_cpus,
                    _temp_dir=tmp,
                    _node_ip_address=LOOPBACK,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                    _system_config=dict(SYSTEM_CONFIG),  # ray.init adds its own keys to it
                )
            else:
                ray.init(address=address, log_to_driver=False)
        with quiet_intended_exits():
            yield
    finally:
        with _ctrl_c_held():
            started = session_processes() if tmp is not None else set()
            if tmp is not None:
                _kill_monitor()
            ray.shutdown()
            wait_gone(started, timeout_s=SHUTDOWN_WAIT_S)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)


SHUTDOWN_WAIT_S = 5.0
"""How long a local session's workers get to exit after ``ray.shutdown`` before a SIGKILL."""


def session_processes() -> set[Proc]:
    """Ray's daemons of this local session and every process under them (the workers)."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return set()
    roots = [info.process.pid for infos in node.all_processes.values() for info in infos]
    return descendants(roots)


def _kill_monitor() -> None:
    """Kill the autoscaler monitor of the local session Ray is about to shut down, which
    autoscales nothing here: ``ray.shutdown`` gives it a second to exit on SIGTERM, it took
    all of it each time (1.0 of a 1.3 s shutdown, and a Ctrl-C must end a run within 2)."""
    node = getattr(ray._private.worker, "_global_node", None)
    infos = node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, ()) if node else ()
    for info in infos:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            info.process.kill()
            info.process.wait(timeout=1)


@ray.remote(num_cpus=0)
def _bundle_where() -> tuple[str, int]:
    """The node and GPU id of the bundle this task runs in (a task, not miles' InfoActor:
    its worker process stays in Ray's pool for the run's actors instead of dying with it)."""
    node = ray.get_runtime_context().get_node_id()
    gpu_ids = ray.get_gpu_ids()
    return node, int(gpu_ids[0]) if gpu_ids else 0


def node_addresses() -> dict[str, str]:
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def dns_resolver(name: str) -> str | None:
    """A hostname's address: IPv4 as miles resolves it (gethostbyname), else the first IPv6
    address the system resolver knows; None when the name does not resolve."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET6)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def bundles_from_ray(
    where: Sequence[tuple[str, int]], addresses: Mapping[str, str]
) -> list[Bundle]:
    """Bundle i is on node ``where[i][0]`` (a node id) at GPU ``where[i][1]``; a node goes by
    the address Ray registered for it (an IPv4 or IPv6 literal, or a hostname)."""
    return [
        Bundle(index=i, node=addresses.get(node, node), gpu_id=gpu)
        for i, (node, gpu) in enumerate(where)
    ]


def placed_bundles(
    layout: Layout, resolver: Resolver = dns_resolver
) -> tuple[PlacementGroup, Placement]:
    """One GPU bundle per layout GPU; ordered by (node address, GPU id) as miles does, a
    hostname by the address ``resolver`` gives it (each name looked up once)."""
    pg = placement_group([{"GPU": 1, "CPU": 0.001}] * layout.total_gpus, strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    probes = [
        _bundle_where.options(
            num_gpus=0.01,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(layout.total_gpus)
    ]
    where = ray.get(probes, timeout=120)
    bundles = bundles_from_ray(where, node_addresses())
    return pg, place(layout, bundles, functools.cache(resolver))


def bundle_nodes(pg: PlacementGroup) -> tuple[str, ...]:
    """The Ray node id each bundle of ``pg`` was reserved on, by bundle index."""
    table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    return tuple(table[i] for i in sorted(table))


def _in_bundle_index(pg: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)


def in_bundle(pg: PlacementGroup, bundle: Bundle) -> PlacementGroupSchedulingStrategy:
    return _in_bundle_index(pg, bundle.index)


__all__ = [
    "LOOPBACK",
    "bundle_nodes",
    "bundles_from_ray",
    "dns_resolver",
    "in_bundle",
    "node_addresses",
    "placed_bundles",
    "ray_session",
    "remove_placement_group",
]
