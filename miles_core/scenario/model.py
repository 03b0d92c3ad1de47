"""A scenario: a world, the loop's flags, faults and how the run must end, all checked at once.

A Scenario is world-neutral: the simulator and the real backends run the same
value. Building one checks every fault against the world and the run (a cell
that does not exist, an engine id not in the world, a bucket beyond the
update's buckets, a step beyond the run), so a mistake is a ConfigError before
anything runs, never a KeyError inside a world or a "never fired" afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from miles_core import errors
from miles_core.errors import ConfigError, MilesCoreError
from miles_core.kinds import FaultKind, FaultPoint, RunStatus
from miles_core.loop.config import FLAGS, LoopConfig, check_until_witnessed
from miles_core.loop.flags import with_flags
from miles_core.oracle_names import CATCHERS
from miles_core.scenario.faults import (
    After,
    AfterBucket,
    AnyFault,
    DropHeartbeat,
    SlowStart,
    target_cell,
    target_engine,
)
from miles_core.scenario.limits import (
    Limits,
    check_loop,
    check_steps,
    check_world,
    loop_key,
    over,
)
from miles_core.scenario.liveness import Liveness, liveness_bound
from miles_core.scenario.world import TimeModel, WorldShape
from miles_core.stopping import LivenessPlan
from miles_core.transfer import lora_unit, plan_buckets


def error_classes() -> dict[str, type[MilesCoreError]]:
    """The errors a scenario may expect a run to end with, by class name."""
    found: dict[str, type[MilesCoreError]] = {}
    todo: list[type[MilesCoreError]] = [MilesCoreError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors.__name__:
            found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Expect:
    """How the run must end: completed (the default), or failed with a named error; and
    ``caught_by``: the oracle that must fail it (a fault no control plane gets past, such
    as an engine that lies about its weights), every other passing as usual. Judged on the
    verdicts (miles_core/report/caught.py), never recorded in the history."""

    status: RunStatus = RunStatus.COMPLETED
    error: str | None = None
    caught_by: str | None = None

    def __post_init__(self) -> None:
        if self.status not in (RunStatus.COMPLETED, RunStatus.FAILED):
            raise ConfigError(
                "expect.status",
                f"got {self.status!r}: a stalled or crashed run is never what a scenario expects",
                "expect 'completed', or 'failed' with the error class",
            )
        names = list(error_classes())
        if self.status is RunStatus.FAILED and self.error is None:
            raise ConfigError(
                "expect.error",
                "is missing for status 'failed'",
                f"name the error the run must end with, one of {names}",
            )
        if self.status is RunStatus.COMPLETED and self.error is not None:
            raise ConfigError(
                "expect.error", f"{self.error!r} with status 'completed'", "set status = 'failed'"
            )
        if self.error is not None and self.error not in names:
            raise ConfigError(
                "expect.error", f"unknown error {self.error!r}", f"use one of {names}"
            )
        if self.caught_by is not None and self.caught_by not in CATCHERS:
            raise ConfigError(
                "expect.caught_by",
                f"unknown oracle {self.caught_by!r}",
                f"name the oracle that must catch the fault, one of {list(CATCHERS)}",
            )

    def describe(self) -> str:
        ending = "completed" if self.status is RunStatus.COMPLETED else f"failed with {self.error}"
        return ending if self.caught_by is None else f"{ending}, caught by {self.caught_by}"


DEFAULT_PROGRESS_WINDOW = 600.0
"""The progress oracle's window when a scenario sets none (a real world's steps take seconds)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    world: WorldShape = field(default_factory=WorldShape)
    timing: TimeModel = field(default_factory=TimeModel)
    """The simulator's time models (real worlds take the time things take)."""
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(steps=8))
    faults: tuple[AnyFault, ...] = ()
    expect: Expect = field(default_factory=Expect)
    progress_window: float | None = None
    """Seconds within which a step must commit after the last fault (the progress oracle).
    None: ``DEFAULT_PROGRESS_WINDOW``, which the simulator raises to four nominal steps of
    its time model where a step is expected to take longer (sim/horizon.py)."""
    max_seconds: float | None = None
    """Virtual-time horizon; a run still going then is STALLED (default: 50 steps' time a
    step, the longer of a cell's training and a batch's generation: sim/horizon.py)."""
    preset: str = "small"
    until_witnessed: int | None = None
    """Run past ``loop.steps`` while a fault has not fired yet or has not had its witnessed
    effect yet, up to this many steps in all (None: exactly ``loop.steps``). For real
    worlds, where a restarted engine takes seconds to come back and steps take what the
    machine takes."""
    limits: Limits = field(default_factory=Limits)
    """The bounds on the world's size, the run's length and the faults (a file's [limits]):
    checked first, so that a typo such as 10**8 cells is an error, not a machine's memory."""
    liveness: Liveness | None = None
    """Liveness mode: every fault healed as step ``heal_step`` begins, and then progress
    within a bound (miles_core.scenario.liveness; the liveness oracle judges it)."""

    def __post_init__(self) -> None:
        for name in ("progress_window", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            ):
                raise ConfigError(name, f"got {value!r}", "pass seconds > 0")
        if not isinstance(self.faults, tuple):
            object.__setattr__(self, "faults", tuple(self.faults))
        self._check_bounds()
        check_until_witnessed(self.until_witnessed, self.loop.steps)
        check_faults(self)
        self._check_liveness()

    def _check_liveness(self) -> None:
        live = self.liveness
        if live is None:
            return
        if not isinstance(live, Liveness):
            raise ConfigError("liveness", f"got {live!r}", "write liveness = { heal_step = N }")
        if live.heal_step > self.loop.steps:
            raise ConfigError(
                "liveness.heal_step",
                f"step {live.heal_step} is beyond the run's {self.loop.steps} steps",
                f"pass heal_step <= {self.loop.steps} (the heal comes as that step begins)",
            )
        if any(f.kind is FaultKind.KILL_JOB for f in self.faults):
            raise ConfigError(
                "liveness",
                "is set beside a kill_job fault: liveness mode does not judge a job killed "
                "whole and resumed (its heal would have to span the job's restart)",
                "remove the kill_job, or the liveness table",
            )
        if self.expect.status is not RunStatus.COMPLETED:
            raise ConfigError(
                "liveness",
                f"is set, but the run is expected to {self.expect.describe()}",
                "liveness asks a run that fails on purpose for nothing: remove one of them",
            )

    def liveness_plan(self) -> LivenessPlan | None:
        """What the Orchestrator is told of liveness mode (None without it)."""
        live = self.liveness
        if live is None:
            return None
        slow = max((f.seconds for f in self.faults if isinstance(f, SlowStart)), default=0.0)
        bound = liveness_bound(self.world, self.timing, self.loop, live, slow)
        return LivenessPlan(live.heal_step, live.steps, bound.seconds, bound.describe())

    def with_liveness(self, heal_step: int | None = None, steps: int = 3) -> Scenario:
        """This scenario in liveness mode: healed as step ``heal_step`` begins (default: after
        its last step, so every fault has had its chance), then ``steps`` more steps."""
        heal = self.loop.steps if heal_step is None else heal_step
        return dataclasses.replace(self, liveness=Liveness(heal_step=heal, steps=steps))

    def _check_bounds(self) -> None:
        """The world, the steps and the faults within ``limits``, before anything is built
        from them (a bucket fault's check plans the model's tensors)."""
        check_world(self.world, self.limits)
        check_steps(self.loop.steps, self.limits)
        check_loop(self.loop, self.limits)
        until = self.until_witnessed
        if isinstance(until, int) and not isinstance(until, bool):
            check_steps(until, self.limits, "until_witnessed")
        if len(self.faults) > self.limits.faults:
            raise over("faults", "faults", len(self.faults), self.limits, "faults")

    @property
    def n_buckets(self) -> int:
        """How many buckets one weight update of this world's model takes."""
        loop = self.loop
        units = self.world.units()
        if loop.lora_adapter is not None:
            units = (lora_unit(loop.lora_adapter, self.world.lora_params()),)
        return len(plan_buckets(units, loop.update_weight_buffer_size))

    def with_loop_flags(self, overrides: Mapping[str, Any]) -> Scenario:
        """The loop flags given on a command line applied and bounded: an error names the
        flag as the user gave it (a key the file set, as the file wrote it)."""
        loop = with_flags(self.loop, overrides)
        check_loop(loop, self.limits, lambda f: FLAGS[f] if f in overrides else loop_key(f))
        return dataclasses.replace(self, loop=loop)

    def with_run(self, steps: int | None = None, seed: int | None = None) -> Scenario:
        """The scenario as one run of it sees it (``--steps`` and the seed applied, rechecked)."""
        until = self.until_witnessed
        if steps is not None:
            check_steps(steps, self.limits, "--steps")
        if steps is not None and until is not None and steps > until:
            raise ConfigError(
                "--steps",
                f"{steps} is more than the until_witnessed = {until} of scenario {self.name} "
                "(the most steps its run may take)",
                f"pass --steps <= {until}, or a scenario file with a larger until_witnessed",
            )
        loop = dataclasses.replace(
            self.loop,
            steps=steps if steps is not None else self.loop.steps,
            seed=seed if seed is not None else self.loop.seed,
            scenario=self.name,
        )
        return dataclasses.replace(self, loop=loop)


def indexed(scenario: Scenario) -> Iterator[tuple[str, AnyFault]]:
    for i, fault in enumerate(scenario.faults):
        yield f"faults[{i}] ({fault.kind.value})", fault


def check_faults(scenario: Scenario) -> None:
    """Every fault names a target this world has and a moment this run reaches."""
    world, loop = scenario.world, scenario.loop
    steps = loop.steps
    seen: dict[AnyFault, str] = {}
    for where, fault in indexed(scenario):
        cell, engine = target_cell(fault), target_engine(fault)
        if fault in seen:
            first, this = seen[fault], where.split(" ")[0]
            target = f"cell {cell} " if cell is not None else f"{engine} " if engine else ""
            raise ConfigError(
                where,
                f"is the same fault as {first} ({fault.kind.value} {target}{fault.detail}): "
                "the second would strike nothing new, yet be reported as fired and pass its "
                "witness",
                f"remove one of {first} and {this}, or give them different moments",
            )
        seen[fault] = where.split(" ")[0]
        if cell is not None and not 0 <= cell < world.num_cells:
            raise ConfigError(
                f"{where}.cell",
                f"cell {cell} does not exist in a world of {world.num_cells} cells",
                f"pass 0 <= cell <= {world.num_cells - 1} (cells count from 0)",
            )
        rank = getattr(fault, "rank", None)
        if rank is not None and not rank < world.gpus_per_cell:
            raise ConfigError(
                f"{where}.rank",
                f"rank {rank} does not exist in cells of {world.gpus_per_cell} rank(s)",
                f"pass 0 <= rank <= {world.gpus_per_cell - 1}, or more [sim].gpus_per_cell",
            )
        if fault.kind is FaultKind.RAISE_HOLDING_LOCK and not (
            loop.today and world.gpus_per_cell > 1
        ):
            raise ConfigError(
                where,
                "miles takes the weight-update ticket lock only today (broadcast.py 069a4115) "
                "and only with more than one pipeline stage: here a cell of several ranks",
                'set [miles] profile = "today" and [sim].gpus_per_cell >= 2',
            )
        if fault.kind is FaultKind.RESTART_DRIVER and loop.lora_adapter is not None:
            raise ConfigError(
                where,
                "a new driver does not learn which engine processes hold the LoRA adapter "
                "(the dead driver's record of its deliveries is lost; not modelled), so its "
                "first sync would load an adapter a process already holds",
                "remove the restart_driver, or [loop].lora_adapter",
            )
        if fault.kind.value.startswith("delta_") and loop.transfer_mode != "disk-delta":
            raise ConfigError(
                where,
                f"{fault.kind.value} acts on disk-delta's files, but the transfer mode is "
                f"{loop.transfer_mode}",
                'set [loop].transfer_mode = "disk-delta" (--update-weight-transfer-mode)',
            )
        if engine is not None and engine not in world.engine_ids:
            raise ConfigError(
                f"{where}.engine",
                f"{engine!r} does not exist in a world of {world.num_engines} engines",
                f"use one of {list(world.engine_ids)}",
            )
        when = fault.when
        for key in ("step", "after_step"):
            value = getattr(when, key, None)
            if value is not None and value >= steps:
                raise ConfigError(
                    f"{where}.{key}",
                    f"step {value} is beyond the run's {steps} steps (0..{steps - 1})",
                    "move the fault to an earlier step, or run more steps ([loop].steps / --steps)",
                )
        if isinstance(when, After) and when.fault is not None:
            _check_after_fault(scenario, where, when.fault)
        if isinstance(when, AfterBucket) and when.bucket >= scenario.n_buckets:
            raise ConfigError(
                f"{where}.bucket",
                f"an update of this world's model has {scenario.n_buckets} buckets "
                f"(0..{scenario.n_buckets - 1}), so bucket {when.bucket} never arrives",
                "pick a smaller bucket, or a smaller [loop].update_weight_buffer_size",
            )
        if fault.point is FaultPoint.DURING_SAVE and not loop.save_interval:
            raise ConfigError(
                f"{where}.point",
                "during_save strikes while a save is written, but [loop].save_interval is 0: "
                "the run never saves",
                "set [loop].save_interval = N (miles' --save-interval: a save every N steps)",
            )
        if isinstance(fault, DropHeartbeat) and loop.heartbeat_interval is None:
            raise ConfigError(
                f"{where}",
                "drops heartbeats, but the heartbeat checker is off",
                "set [loop].heartbeat_interval (miles' --trainer-heartbeat-checker-interval)",
            )


def _check_after_fault(scenario: Scenario, where: str, first: int) -> None:
    """``after = { fault = N }`` names a fault of the scenario, and the chain of faults it
    waits on ends at one that does not wait on another (a cycle would never fire)."""
    faults = scenario.faults
    seen: list[int] = []
    index: int | None = first
    while index is not None:
        if not 0 <= index < len(faults):
            raise ConfigError(
                f"{where}.after.fault",
                f"fault {index} does not exist: the scenario has {len(faults)} faults",
                f"pass 0 <= fault <= {len(faults) - 1} (faults count from 0, in file order)",
            )
        if index in seen:
            chain = " -> ".join(map(str, [*seen, index]))
            raise ConfigError(
                f"{where}.after.fault",
                f"waits on itself through faults {chain}, so none of them would fire",
                "make one of them strike at a time or a point",
            )
        seen.append(index)
        when = faults[index].when
        index = when.fault if isinstance(when, After) else None
