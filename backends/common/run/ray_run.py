"""One real run on Ray: a scenario (named or a file, the same the simulator runs) and a seed
in; the event history, the oracles' verdicts and the training/transfer figures out.

The scenario's world shape (cells, ranks, engines) is built for real; its time
models are the simulator's and do not apply here. Its loop section is used as
is, with two translations: the bucket size is scaled so the real model splits
into as many buckets as the simulated one (a fault "after bucket 2" exists in
both worlds), and heartbeat timeouts are at least REAL_HEARTBEAT_TIMEOUT wall
seconds (a busy 2-core machine answers a Ray call slower than a simulated second).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from backends.common.run.driver_restart import RayDriverRestarts, restarts_driver
from backends.common.run.restore import restore, save_at_end
from backends.common.run.result import RealResult, StepLine, StepMetrics
from backends.common.run.saves import RayCheckpoints
from backends.common.session.ray_session import (
    bundle_nodes,
    placed_bundles,
    ray_session,
    remove_placement_group,
)
from backends.common.session.spinner import spinner
from backends.common.stack import CPU_STACK, Stack
from backends.common.training.policy import AnyPolicy, PolicyConfig
from backends.common.training.task import Task
from backends.common.world.cluster import RayCluster, buffer_size_for
from backends.common.world.delta_transport import delta_transport
from backends.common.world.faults import RayFaultActions
from backends.common.world.runtime import AsyncioRuntime
from miles_core.ctrl_c import lost_ctrl_c
from miles_core.errors import ConfigError
from miles_core.events import (
    Event,
    History,
)
from miles_core.kinds import FaultKind, RunStatus
from miles_core.loop import LoopConfig, Orchestrator, RunReport
from miles_core.oracles import WHOLE_RUN, Violation, check_all
from miles_core.oracles.base import forget
from miles_core.placement import Layout, LayoutConfig, compute_layout
from miles_core.report.interrupt import CUT, judge_prefix
from miles_core.scenario import Scenario, WorldShape
from miles_core.scenario.model import DEFAULT_PROGRESS_WINDOW
from miles_core.scenario.schedule import FaultSchedule, orchestrator_for, schedule_for
from miles_core.scenario.world import MAX_TOKEN_SECONDS
from miles_core.transfer import TransferMode

REAL_HEARTBEAT_TIMEOUT = 5.0

T = TypeVar("T")

TRAIN = Scenario(
    "train",
    "two cells, two engines, no fault: GRPO on the climb task, reward rises",
    world=WorldShape(num_cells=2, num_engines=2),
    loop=LoopConfig(
        steps=20,
        rollout_batch_size=8,
        n_samples_per_prompt=8,
        max_weight_staleness=2,
        update_weight_buffer_size=64 * 1024,
        heartbeat_interval=5.0,
        heartbeat_timeout=REAL_HEARTBEAT_TIMEOUT,
    ),
)
"""The default real run (python -m backends.cpu run)."""


async def _cancel_leftovers() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel("run ended")
    await asyncio.gather(*tasks, return_exceptions=True)


def check_real(scenario: Scenario) -> Scenario:
    """What this world cannot run, refused before anything starts."""
    if scenario.loop.lora_adapter is not None:
        raise ConfigError(
            "[loop].lora_adapter",
            "the CPU backend trains the full model, not a LoRA adapter",
            "run LoRA scenarios in the simulator (python -m sim run ...)",
        )
    if any(f.kind is FaultKind.KILL_JOB for f in scenario.faults):
        raise ConfigError(
            "faults (kill_job)",
            "a real run cannot kill its own driver and start again",
            "kill the job from outside (SIGKILL to every process) and resume it with --load "
            "(docs/training.md), or run the scenario in the simulator",
        )
    if scenario.loop.transfer_mode is TransferMode.RDT:
        raise ConfigError(
            "--update-weight-transfer-mode",
            "rdt moves weights by RDMA, which the CPU backend does not have",
            "use broadcast (one gloo group of all engines) or p2p (one per engine)",
        )
    return scenario


def check_token_seconds(seconds: object) -> None:
    """--engine-token-seconds: None (not given: the scenario's [sim] engine_token_seconds) or
    what a scenario may set."""
    if seconds is None:
        return
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not (ok and math.isfinite(seconds) and 0 <= seconds <= MAX_TOKEN_SECONDS):  # type: ignore[arg-type]
        raise ConfigError(
            "--engine-token-seconds",
            f"got {seconds!r}",
            f"pass seconds from 0 to {MAX_TOKEN_SECONDS:g}",
        )


def real_loop(scenario: Scenario, seed: int, model_bytes: int) -> LoopConfig:
    loop = scenario.loop
    buffer = (
        loop.update_weight_buffer_size
        if scenario.name == TRAIN.name
        else buffer_size_for(model_bytes, scenario.n_buckets)
    )
    return dataclasses.replace(
        loop,
        seed=seed,
        scenario=scenario.name,
        update_weight_buffer_size=buffer,
        heartbeat_timeout=max(loop.heartbeat_timeout, REAL_HEARTBEAT_TIMEOUT),
        heartbeat_interval=None
        if loop.heartbeat_interval is None
        else max(loop.heartbeat_interval, REAL_HEARTBEAT_TIMEOUT),
    )


@dataclass(frozen=True)
class _Options:
    policy: AnyPolicy
    timeout: float
    observers: Sequence[Callable[[Event], None]]
    on_line: Callable[[StepLine], None]
    announce: Callable[[str], None]
    save_to: Path | None
    load_from: Path | None
    engine_token_seconds: float
    stack: Stack
    interruptible: bool = False
    show_start: bool = False
    task: Task | None = None
    history: History | None = None


async def _drive(
    control: Orchestrator | RayDriverRestarts,
    cluster: RayCluster,
    timeout: float,
    ctrl_c: asyncio.Future[None],
) -> RunReport:
    """Run the loop until it ends, the world itself fails, the timeout passes or Ctrl-C."""
    run = asyncio.ensure_future(control.run())
    done, _ = await asyncio.wait(
        {run, cluster.failed, ctrl_c}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if run in done:
        return run.result()
    if cluster.failed in done:
        return control.end_with(cluster.failed.result(), "raised in the Ray world")
    if ctrl_c in done:
        why = f"interrupted (Ctrl-C) at t={control.rt.now():.2f}"
        control.record_waits(why)
        return control.end(RunStatus.INTERRUPTED, why)
    why = f"no end within {timeout:g} s"
    control.record_waits(why)
    return control.end(RunStatus.STALLED, why)


def _driver(
    scenario: Scenario, loop: LoopConfig, history: History, cluster: RayCluster, control: Any
) -> Orchestrator | RayDriverRestarts:
    """The loop, or a driver that a restart_driver replaces over the same Ray actors."""
    if restarts_driver(scenario):
        return RayDriverRestarts(scenario, loop, history, cluster, control)
    return control


class _StartInterrupted(Exception):
    """Ctrl-C came while the world started: no step ran."""


@contextlib.contextmanager
def _ctrl_c_sets(interruptible: bool) -> Iterator[asyncio.Future[None]]:
    """A future that Ctrl-C sets while the block runs, handled by the event loop between two
    callbacks (the run then ends as interrupted, its world whole) instead of raised at the
    line it lands on. A second Ctrl-C raises KeyboardInterrupt: the first did not stop it.
    Not ``interruptible``: a future that nothing sets, and Ctrl-C is asyncio's."""
    loop = asyncio.get_running_loop()
    ctrl_c: asyncio.Future[None] = loop.create_future()
    if not interruptible or threading.current_thread() is not threading.main_thread():
        yield ctrl_c  # (and no signal reaches another thread)
        return

    def on_sigint() -> None:
        if ctrl_c.done():
            raise KeyboardInterrupt
        ctrl_c.set_result(None)

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    if lost_ctrl_c():  # one Python dropped while the world started: the run stops at once
        on_sigint()
    try:
        yield ctrl_c
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _unless(ctrl_c: asyncio.Future[None], work: Awaitable[T]) -> T:
    """``work``'s result; _StartInterrupted (``work`` cancelled) if Ctrl-C comes first."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, ctrl_c}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel("Ctrl-C")
    raise _StartInterrupted


def _world_line(scenario: Scenario) -> str:
    """What a run says while its processes start (each imports torch: tens of seconds)."""
    w = scenario.world
    return (
        f"starting the world: {w.num_cells} cell(s) x {w.gpus_per_cell} rank(s), "
        f"{w.num_engines} engine(s)"
    )


def _cluster(
    rt: AsyncioRuntime,
    schedule: FaultSchedule,
    scenario: Scenario,
    pg: Any,
    placement: Any,
    options: _Options,
) -> RayCluster:
    """The Ray cluster of the scenario's shape; nothing starts until ``start``."""
    return RayCluster(
        rt,
        num_cells=scenario.world.num_cells,
        gpus_per_cell=scenario.world.gpus_per_cell,
        num_engines=scenario.world.num_engines,
        policy=options.policy,
        pg=pg,
        placement=placement,
        faults=schedule,
        seed=rt.seed,
        engine_token_seconds=options.engine_token_seconds,
        stack=options.stack,
        collective_timeout=scenario.loop.update_weight_collective_timeout,
        flush_refuses_while_queued=scenario.world.flush_refuses_while_queued,
        prefix_cache=scenario.world.prefix_cache,
        task=options.task,
        miles_today=scenario.loop.today,
    )


def _judge(
    history: History, report: RunReport, window: float
) -> tuple[dict[str, Violation | None], dict[str, str]]:
    """Every oracle's verdict; an interrupted run's: the safety oracles' that fit in the time
    left (and why the others gave none)."""
    if report.status is RunStatus.INTERRUPTED:
        return judge_prefix(history)
    try:
        return check_all(history, window), {}
    except KeyboardInterrupt:  # Ctrl-C while judging a run that ended by itself
        forget(history)  # its index may be half-updated
        verdicts, not_judged = judge_prefix(history)
        return verdicts, not_judged | dict.fromkeys(WHOLE_RUN, CUT)


async def _run(
    scenario: Scenario, seed: int, pg: Any, placement: Any, options: _Options
) -> RealResult:
    rt = AsyncioRuntime(seed)
    schedule = schedule_for(scenario)
    cluster = _cluster(rt, schedule, scenario, pg, placement, options)
    history = History() if options.history is None else options.history
    metrics = StepMetrics(cluster, options.on_line)
    wall, saved = 0.0, None
    try:
        loop = real_loop(scenario, seed, cluster.model_bytes)
        if loop.transfer_mode is TransferMode.DISK_DELTA:  # real files in a temp dir
            cluster.transport = delta_transport(cluster, loop)
        with _ctrl_c_sets(options.interruptible) as ctrl_c:
            with spinner(_world_line(scenario), enabled=options.show_start):
                await _unless(ctrl_c, cluster.start())
            periodic = options.save_to is not None and loop.save_interval > 0
            if periodic:
                cluster.checkpoints = RayCheckpoints(cluster, options.save_to, options.policy)
            ledger, resume = await _unless(
                ctrl_c, restore(cluster, options.load_from, options.policy)
            )
            history.observe(metrics)
            for observer in options.observers:
                history.observe(observer)
            control = orchestrator_for(scenario, rt, cluster, history, ledger, loop, resume)
            driver = _driver(scenario, loop, history, cluster, control)
            schedule.install(rt, history, RayFaultActions(cluster, options.announce))
            started = rt.now()
            report = await _drive(driver, cluster, options.timeout, ctrl_c)
            wall = rt.now() - started
            if isinstance(driver, RayDriverRestarts):  # the loop that ran last
                control = driver.control or control
            if periodic:  # the loop saved after its last step (miles_core.saves.save_due)
                saved = options.save_to
            elif options.save_to is not None and report.status is not RunStatus.INTERRUPTED:
                saved = await save_at_end(cluster, control, options.save_to, options.policy)
    except _StartInterrupted:
        why = "interrupted (Ctrl-C) while the world started: no step ran"
        report = RunReport(RunStatus.INTERRUPTED, why, 0)
    finally:
        await _cancel_leftovers()  # generation still in flight must not outlive the run
        await cluster.close()
    window = scenario.progress_window or DEFAULT_PROGRESS_WINDOW
    verdicts, not_judged = _judge(history, report, window)
    scenario = dataclasses.replace(scenario, loop=loop)
    return RealResult(
        scenario,
        seed,
        history,
        report,
        verdicts,
        metrics.lines,
        wall,
        metrics.rewards,
        saved,
        options.stack,
        not_judged=not_judged,
    )


def run_real(
    scenario: Scenario = TRAIN,
    seed: int = 0,
    steps: int | None = None,
    *,
    address: str | None = None,
    show_start: bool = False,
    **options: Any,
) -> RealResult:
    """Start Ray (or join ``address``; ``show_start``: saying so on stderr), run, and shut Ray
    down, errors included."""
    scenario = check_real(scenario.with_run(steps=steps, seed=seed))
    layout = layout_of(scenario)
    if options.get("stack", CPU_STACK).device == "cuda":
        # Ray's GPUs here may be virtual (several per physical GPU): every actor keeps the
        # host's CUDA devices instead of Ray's ids, which need not exist
        os.environ.setdefault("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    with ray_session(layout.total_gpus, address, show_start=show_start):
        return run_in_ray(scenario, seed, steps, show_start=show_start, **options)


def layout_of(scenario: Scenario) -> Layout:
    """Where a real run of ``scenario`` places its trainer ranks and engines (miles' layout:
    one node of the cells' GPUs, an engine a GPU): what its Ray session must hold."""
    world = scenario.world
    return compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=world.num_cells * world.gpus_per_cell,
            rollout_num_gpus=world.num_engines,
            rollout_num_gpus_per_engine=1,
            indep_dp=True,
            gpus_per_cell=world.gpus_per_cell,
        )
    )


def run_in_ray(
    scenario: Scenario = TRAIN,
    seed: int = 0,
    steps: int | None = None,
    *,
    policy: AnyPolicy | None = None,
    timeout: float = 900.0,
    observers: Sequence[Callable[[Event], None]] = (),
    on_line: Callable[[StepLine], None] = lambda line: None,
    announce: Callable[[str], None] = lambda text: None,
    save_to: Path | None = None,
    load_from: Path | None = None,
    engine_token_seconds: float | None = None,
    stack: Stack = CPU_STACK,
    interruptible: bool = False,
    show_start: bool = False,
    task: Task | None = None,
    history: History | None = None,
) -> RealResult:
    """One run on the Ray this process is connected to; its actors and placement group
    are gone when it returns. ``task``: the prompts and reward (task.py; None: the tiny
    policy's); ``save_to`` / ``load_from``: checkpoint directories;
    ``announce``: told before the run kills a process for a fault;
    ``engine_token_seconds``: a floor on each generated token's time (the tiny policy takes
    about a millisecond; a real engine's decode takes longer, and so requests live across
    more weight updates), None for the scenario's ``[sim] engine_token_seconds``;
    ``interruptible``: Ctrl-C ends the run as interrupted, its world
    closed, and the safety oracles judge what ran (a command's choice: in a test, Ctrl-C
    stops the tests); ``show_start``: stderr says that the world's processes are starting
    (tens of seconds: each imports torch); ``history``: an empty History the run records
    into, for an observer that judges it as it goes without a list of its own (the soak)."""
    if history is not None and len(history):
        raise ValueError(f"history: got one of {len(history)} events; pass an empty History")
    scenario = check_real(scenario.with_run(steps=steps, seed=seed))
    check_token_seconds(engine_token_seconds)
    options = _Options(
        policy or PolicyConfig(),
        timeout,
        observers,
        on_line,
        announce,
        save_to,
        load_from,
        float(
            scenario.world.engine_token_seconds
            if engine_token_seconds is None
            else engine_token_seconds
        ),
        stack,
        interruptible,
        show_start,
        task,
        history,
    )
    pg, placement = placed_bundles(layout_of(scenario))
    try:
        result = asyncio.run(_run(scenario, seed, pg, placement, options))
        return dataclasses.replace(result, bundle_nodes=bundle_nodes(pg))
    finally:
        remove_placement_group(pg)
