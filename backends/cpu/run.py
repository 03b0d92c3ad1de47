"""One real run on Ray: a scenario (the simulator's, file or name) and a seed in; the event
history, the oracles' verdicts and the training/transfer figures out.

The scenario's sim section gives the world's shape (cells, engines); its time
models are the simulator's and do not apply here. Its loop section is used as
is, with two translations: the bucket size is scaled so the real model splits
into as many buckets as the simulated one (a fault "after bucket 2" exists in
both worlds), and heartbeat timeouts are at least REAL_HEARTBEAT_TIMEOUT wall
seconds (a busy 2-core machine answers a Ray call slower than a simulated second).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.common.aio_runtime import AsyncioRuntime
from backends.common.ray_session import placed_bundles, ray_session, remove_placement_group
from backends.cpu import checkpoint
from backends.cpu.cluster import RayWorld, buffer_size_for
from backends.cpu.policy import PolicyConfig
from miles_core.backend import CellFailure
from miles_core.errors import ConfigError
from miles_core.events import (
    Event,
    GroupGot,
    GroupTrained,
    History,
    RunStatus,
    StepCommitted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.loop import LoopConfig, Orchestrator, RunReport
from miles_core.oracles import Violation, check_all
from miles_core.placement import LayoutConfig, compute_layout
from miles_core.transfer import plan_buckets
from sim.cluster import SimConfig
from sim.faults import ScheduledFaults
from sim.run import Scenario, _end_early

REAL_HEARTBEAT_TIMEOUT = 5.0

TRAIN = Scenario(
    "train",
    "two cells, two engines, no fault: GRPO on the climb task, reward rises",
    SimConfig(num_cells=2, num_engines=2),
    LoopConfig(
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


@dataclass(frozen=True)
class StepLine:
    """One line of per-step metrics, printed as the run goes."""

    step: int
    version: int
    reward: float
    staleness: float
    transfer_seconds: float
    transfer_bytes: int

    @property
    def gbps(self) -> float:
        return self.transfer_bytes / self.transfer_seconds / 1e9 if self.transfer_seconds else 0.0

    def __str__(self) -> str:
        return (
            f"step {self.step:3d}  reward {self.reward:.3f}  version {self.version:3d}  "
            f"staleness {self.staleness:.2f}  transfer {self.transfer_seconds * 1e3:7.1f} ms "
            f"{self.gbps:6.3f} GB/s"
        )


@dataclass
class RealResult:
    scenario: Scenario
    seed: int
    history: History
    report: RunReport
    verdicts: dict[str, Violation | None]
    lines: list[StepLine] = field(default_factory=list)
    wall_seconds: float = 0.0
    step_rewards: dict[int, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    """Where --save wrote the checkpoint (None: not asked, or no cell was left alive)."""

    @property
    def ok(self) -> bool:
        return all(v is None for v in self.verdicts.values())

    def summary(self) -> dict[str, Any]:
        rewards = [self.step_rewards[s] for s in sorted(self.step_rewards)]
        transfers = [line for line in self.lines if line.transfer_seconds > 0]
        return {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "status": self.report.status.value,
            "steps": self.report.steps_done,
            "final_version": self.report.versions[-1] if self.report.versions else None,
            "mean_reward_first": rewards[0] if rewards else None,
            "mean_reward_last": rewards[-1] if rewards else None,
            "seconds_per_step": self.wall_seconds / max(1, self.report.steps_done),
            "transfer": {
                "updates": len(transfers),
                "bytes_per_update": transfers[0].transfer_bytes if transfers else 0,
                "median_seconds": statistics.median(t.transfer_seconds for t in transfers)
                if transfers
                else None,
                "median_gbps": statistics.median(t.gbps for t in transfers) if transfers else None,
            },
            "oracles": {k: "pass" if v is None else "fail" for k, v in self.verdicts.items()},
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "history_hash": self.history.hash(),
        }


class _StepMetrics:
    """Turns the event stream into StepLines: the reward and staleness of the groups a
    step trained, and the transfer of the update that followed it."""

    def __init__(self, world: RayWorld, on_line: Callable[[StepLine], None]) -> None:
        self.world = world
        self.on_line = on_line
        self.staleness: list[int] = []
        self.trained: dict[int, list[int]] = {}
        self.step = -1
        self.update = -1
        self.lines: list[StepLine] = []
        self.rewards: dict[int, float] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupGot):
            self.staleness.append(event.staleness or 0)
        elif isinstance(event, StepCommitted):
            self.step = event.step
        elif isinstance(event, GroupTrained):
            scores = self.world.rewards.get(event.group_id, ())
            self.trained.setdefault(event.step, []).extend(scores)
            self.rewards[event.step] = statistics.fmean(self.trained[event.step] or [0.0])
        elif isinstance(event, UpdateBegan) and event.publishes:
            self.update = event.update_id
        elif isinstance(event, VersionPublished):
            log = self.world.transfers
            line = StepLine(
                step=self.step,
                version=event.version,
                reward=self.rewards.get(self.step, 0.0),
                staleness=statistics.fmean(self.staleness) if self.staleness else 0.0,
                transfer_seconds=log.wall.get(self.update, 0.0),
                transfer_bytes=log.bytes.get(self.update, 0),
            )
            self.staleness = []
            self.lines.append(line)
            self.on_line(line)


async def _save(
    world: RayWorld, control: Orchestrator, to: Path, policy: PolicyConfig
) -> Path | None:
    """Save from the first alive cell that answers; None when no cell is left to save."""
    for cell in control.cells.alive():
        try:
            state = await world.cells[cell].call("get_state")
        except CellFailure:
            continue
        return checkpoint.save(to, state, control.ledger.snapshot(), policy)
    return None


async def _cancel_leftovers() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel("run ended")
    await asyncio.gather(*tasks, return_exceptions=True)


def real_loop(scenario: Scenario, steps: int | None, seed: int, model_bytes: int) -> LoopConfig:
    loop = scenario.loop
    if loop.lora_adapter is not None:
        raise ConfigError(
            "loop.lora_adapter",
            "the CPU backend trains the full model, not a LoRA adapter",
            "run LoRA scenarios in the simulator (python -m sim run ...)",
        )
    sim_buckets = len(plan_buckets(scenario.sim.units(), loop.update_weight_buffer_size))
    buffer = (
        loop.update_weight_buffer_size
        if scenario is TRAIN
        else buffer_size_for(model_bytes, sim_buckets)
    )
    return dataclasses.replace(
        loop,
        steps=steps or loop.steps,
        seed=seed,
        scenario=scenario.name,
        update_weight_buffer_size=buffer,
        heartbeat_timeout=max(loop.heartbeat_timeout, REAL_HEARTBEAT_TIMEOUT),
        heartbeat_interval=None
        if loop.heartbeat_interval is None
        else max(loop.heartbeat_interval, REAL_HEARTBEAT_TIMEOUT),
    )


async def _run(
    scenario: Scenario,
    seed: int,
    steps: int | None,
    policy: PolicyConfig,
    timeout: float,
    observers: Sequence[Callable[[Event], None]],
    on_line: Callable[[StepLine], None],
    pg: Any,
    placement: Any,
    save_to: Path | None = None,
    load_from: Path | None = None,
) -> RealResult:
    rt = AsyncioRuntime(seed)
    faults = ScheduledFaults(scenario.faults)
    world = RayWorld(
        rt,
        num_cells=scenario.sim.num_cells,
        gpus_per_cell=scenario.sim.gpus_per_cell,
        num_engines=scenario.sim.num_engines,
        policy=policy,
        pg=pg,
        placement=placement,
        faults=faults,
        seed=seed,
    )
    try:
        loop = real_loop(scenario, steps, seed, world.model_bytes)
        resumed = checkpoint.load(load_from, policy) if load_from is not None else None
        await world.start()
        if resumed is not None:
            states = resumed[0]
            if len(states) != world.gpus_per_cell:
                raise ConfigError(
                    "--load",
                    f"the checkpoint holds {len(states)} ranks per cell, this run has "
                    f"{world.gpus_per_cell}",
                    "resume with the cell size the checkpoint was saved with",
                )
            args = [(state,) for state in states]
            await asyncio.gather(*(c.call_each("set_state", args) for c in world.cells.values()))
        history = History()
        metrics = _StepMetrics(world, on_line)
        history.observe(metrics)
        for observer in observers:
            history.observe(observer)
        control = Orchestrator(rt, world, loop, history, resumed[1] if resumed else None)
        world.attach(control)
        faults.install(world, control)
        started = rt.now()
        try:
            report = await asyncio.wait_for(control.run(), timeout)
        except TimeoutError:
            report = _end_early(control, RunStatus.STALLED, f"no end within {timeout:g} s")
        wall = rt.now() - started
        saved = await _save(world, control, save_to, policy) if save_to is not None else None
    finally:
        await _cancel_leftovers()  # generation still in flight must not outlive the run
        await world.close()
    verdicts = check_all(history, scenario.progress_window)
    scenario = dataclasses.replace(scenario, loop=loop)
    return RealResult(
        scenario, seed, history, report, verdicts, metrics.lines, wall, metrics.rewards, saved
    )


def run_real(
    scenario: Scenario = TRAIN,
    seed: int = 0,
    steps: int | None = None,
    *,
    address: str | None = None,
    **options: Any,
) -> RealResult:
    """Start Ray (or join ``address``), run, and shut Ray down, errors included."""
    layout = _layout(scenario)
    with ray_session(layout.total_gpus, address):
        return run_in_ray(scenario, seed, steps, **options)


def _layout(scenario: Scenario) -> Any:
    sim = scenario.sim
    return compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=sim.num_cells * sim.gpus_per_cell,
            rollout_num_gpus=sim.num_engines,
            rollout_num_gpus_per_engine=1,
            indep_dp=True,
            gpus_per_cell=sim.gpus_per_cell,
        )
    )


def run_in_ray(
    scenario: Scenario = TRAIN,
    seed: int = 0,
    steps: int | None = None,
    *,
    policy: PolicyConfig | None = None,
    timeout: float = 900.0,
    observers: Sequence[Callable[[Event], None]] = (),
    on_line: Callable[[StepLine], None] = lambda line: None,
    save_to: Path | None = None,
    load_from: Path | None = None,
) -> RealResult:
    """One run on the Ray this process is connected to; its actors and placement group
    are gone when it returns. ``save_to`` / ``load_from``: checkpoint directories."""
    pg, placement = placed_bundles(_layout(scenario))
    try:
        return asyncio.run(
            _run(
                scenario,
                seed,
                steps,
                policy or PolicyConfig(),
                timeout,
                observers,
                on_line,
                pg,
                placement,
                save_to,
                load_from,
            )
        )
    finally:
        remove_placement_group(pg)
