"""What a real run gives back: its per-step lines as they come (StepMetrics turns the event
stream into them) and the result a command reports."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.common.stack import CPU_STACK, Stack
from miles_core.events import (
    Event,
    GroupGot,
    GroupTrained,
    History,
    StepCommitted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.loop import RunReport
from miles_core.oracles import Violation
from miles_core.report import summary
from miles_core.report.judged import JudgedRun
from miles_core.scenario import Scenario

if TYPE_CHECKING:
    from backends.common.world.cluster import RayCluster


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
class RealResult(JudgedRun):
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
    stack: Stack = CPU_STACK
    bundle_nodes: tuple[str, ...] = ()
    """The Ray node each GPU bundle (so each trainer rank and engine) landed on, by index."""
    not_judged: dict[str, str] = field(default_factory=dict)
    """Oracles that gave no verdict, by name, and why (an interrupted run's)."""

    def summary(self) -> dict[str, Any]:
        """The simulator's summary of the run (its seconds are wall time), with the training
        and transfer figures."""
        info = summary(
            self.scenario, self.seed, self.history, self.report, self.verdicts, clock="wall"
        )
        rewards = [self.step_rewards[s] for s in sorted(self.step_rewards)]
        transfers = [line for line in self.lines if line.transfer_seconds > 0]
        info |= {
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
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "stack": self.stack.describe(),
            "ray_nodes": dict(collections.Counter(self.bundle_nodes)),
        }
        return info


class StepMetrics:
    """Turns the event stream into StepLines: the reward and staleness of the groups a
    step trained, and the transfer of the update that followed it."""

    def __init__(self, cluster: RayCluster, on_line: Callable[[StepLine], None]) -> None:
        self.cluster = cluster
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
            scores = self.cluster.rewards.get(event.group_id, ())
            self.trained.setdefault(event.step, []).extend(scores)
            self.rewards[event.step] = statistics.fmean(self.trained[event.step] or [0.0])
        elif isinstance(event, UpdateBegan) and event.publishes:
            self.update = event.update_id
        elif isinstance(event, VersionPublished):
            log = self.cluster.transfers
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
