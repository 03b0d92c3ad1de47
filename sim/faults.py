"""Scheduled faults: at a virtual time, or at a named point in the cluster's code.

A fault names what it does (FaultKind), its target (a cell index or an engine
id) and when: ``at`` seconds of virtual time, or a ``point``:

    before_allreduce   a cell dies after its forward/backward, before the exchange (with step)
    after_bucket       the updating cell dies right after bucket k reached the engines (bucket)
    during_heal        a healing source or destination dies (cell)
    mid_generation     an engine dies halfway through a request
    step_begin         when step ``step`` begins (for start_cell / stop_cell / engine faults)

``after_step`` arms a point fault only once that step has committed, so "the
updater dies after many updates" is one line. Each fault fires once. Firing
records FaultInjected in the history, then acts on the cluster; a start_cell
waits until the control plane has stopped the cell (it must notice the death
first).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

from miles_core.cells import CellState
from miles_core.errors import ConfigError, int_at_least
from miles_core.events import (
    CellStateChanged,
    Event,
    FaultInjected,
    FaultKind,
    FaultScheduled,
    StepBegan,
    StepCommitted,
)
from miles_core.loop import Orchestrator
from sim.cluster import FaultPoints

POINTS = ("before_allreduce", "after_bucket", "during_heal", "mid_generation", "step_begin")
_CELL_FAULTS = (
    FaultKind.KILL_CELL,
    FaultKind.STOP_CELL,
    FaultKind.START_CELL,
    FaultKind.SLOW_CELL,
    FaultKind.DROP_HEARTBEAT,
)
_ENGINE_FAULTS = (FaultKind.KILL_ENGINE, FaultKind.RESTART_ENGINE)
_TIMED = (
    FaultKind.SLOW_CELL,
    FaultKind.SLOW_LINK,
    FaultKind.DELAY_ROUTER,
    FaultKind.FAIL_ROUTER,
    FaultKind.DROP_HEARTBEAT,
)
"""Faults that last ``duration`` seconds."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    cell: int | None = None
    engine: str | None = None
    at: float | None = None
    point: str | None = None
    step: int | None = None
    bucket: int | None = None
    after_step: int | None = None
    duration: float | None = None
    """How long a slow_*, *_router or drop_heartbeat fault lasts (seconds)."""
    factor: float | None = None
    """slow_cell / slow_link: how many times slower."""
    seconds: float | None = None
    """delay_router: extra seconds per request."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", FaultKind(self.kind))
        except ValueError:
            raise ConfigError(
                "fault.kind",
                f"unknown kind {self.kind!r}",
                f"use one of {[k.value for k in FaultKind]}",
            ) from None
        where = f"fault {self.kind.value}"
        for name in ("cell", "step", "bucket", "after_step"):
            value = getattr(self, name)
            if value is not None and not int_at_least(value, 0):
                raise ConfigError(f"{where}.{name}", f"got {value!r}", "pass an integer >= 0")
        if self.engine is not None and not isinstance(self.engine, str):
            raise ConfigError(f"{where}.engine", f"got {self.engine!r}", "pass an id like engine-0")
        if self.kind in _CELL_FAULTS and self.cell is None:
            raise ConfigError(f"{where}.cell", "is missing", "name the cell index")
        if self.kind in _ENGINE_FAULTS and self.engine is None:
            raise ConfigError(f"{where}.engine", "is missing", "name the engine id, e.g. engine-0")
        if self.kind in _TIMED and (self.duration is None or self.duration <= 0):
            raise ConfigError(f"{where}.duration", f"got {self.duration!r}", "pass seconds > 0")
        if self.kind in (FaultKind.SLOW_CELL, FaultKind.SLOW_LINK) and (
            self.factor is None or self.factor < 1
        ):
            raise ConfigError(f"{where}.factor", f"got {self.factor!r}", "pass a slowdown >= 1")
        if self.kind is FaultKind.DELAY_ROUTER and (self.seconds is None or self.seconds <= 0):
            raise ConfigError(f"{where}.seconds", f"got {self.seconds!r}", "pass seconds > 0")
        if (self.at is None) == (self.point is None):
            raise ConfigError(
                where,
                "needs exactly one of 'at' (seconds) and 'point'",
                f"set at, or point to one of {POINTS}",
            )
        if self.point is not None and self.point not in POINTS:
            raise ConfigError(
                f"{where}.point", f"unknown point {self.point!r}", f"use one of {POINTS}"
            )
        if self.at is not None and self.at < 0:
            raise ConfigError(f"{where}.at", f"got {self.at}", "pass seconds >= 0")
        if self.point == "after_bucket" and self.bucket is None:
            raise ConfigError(
                f"{where}.bucket", "is missing for point after_bucket", "name the bucket index"
            )
        if self.point in ("before_allreduce", "step_begin") and self.step is None:
            raise ConfigError(
                f"{where}.step", f"is missing for point {self.point}", "name the step"
            )

    @property
    def detail(self) -> str:
        """Where the fault strikes, in words (recorded with the fault)."""
        if self.at is not None:
            return f"at t={self.at:g}"
        parts = [self.point or ""]
        parts += [
            f"{k}={v}"
            for k in ("step", "bucket", "after_step")
            if (v := getattr(self, k)) is not None
        ]
        return " ".join(parts)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Fault:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError("fault", f"unknown keys {unknown}", f"use only {sorted(known)}")
        return cls(**data)  # type: ignore[arg-type]


class FaultTarget(Protocol):
    """What a world offers a fault: the simulated cluster and the Ray cluster alike.

    ``point`` says where the kill strikes; a real world may need it to kill at the
    right moment (inside the call about to be made), a simulated one kills at once.
    """

    def kill_cell(self, index: int, point: str | None) -> None: ...

    def kill_engine(self, engine: str, point: str | None) -> None: ...

    async def restart_engine(self, engine: str) -> None:
        """Kill the engine's process and start a new one; return once it serves HTTP."""
        ...

    def impair(self, what: str, factor: float, seconds: float) -> None: ...


class ScheduledFaults(FaultPoints):
    """The faults of one run, wired to its cluster and control plane."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self.faults = faults
        self._fired: set[int] = set()
        self._committed = -1
        self._pending_starts: list[Fault] = []
        self.cluster: FaultTarget | None = None
        self.control: Orchestrator | None = None

    def install(self, cluster: FaultTarget, control: Orchestrator) -> None:
        self.cluster, self.control = cluster, control
        control.history.observe(self._observe)
        for fault in self.faults:
            control.emit(
                FaultScheduled,
                fault=fault.kind,
                cell=fault.cell,
                engine=fault.engine,
                detail=fault.detail,
            )
        for index, fault in enumerate(self.faults):
            if fault.at is not None:
                control.rt.spawn(self._timed(index, fault), f"fault-{index}")

    async def _timed(self, index: int, fault: Fault) -> None:
        assert self.control is not None
        await self.control.rt.sleep(fault.at or 0.0)
        self._apply(index, fault)

    def _armed(self, fault: Fault) -> bool:
        return fault.after_step is None or self._committed >= fault.after_step

    def fire(self, point: str, **where: object) -> bool:
        fired = False
        for index, fault in enumerate(self.faults):
            if index in self._fired or fault.point != point or not self._armed(fault):
                continue
            if fault.step is not None and "step" in where and where["step"] != fault.step:
                continue
            if fault.bucket is not None and where.get("bucket") != fault.bucket:
                continue
            if fault.cell is not None and where.get("cell", fault.cell) != fault.cell:
                continue
            if fault.engine is not None and where.get("engine", fault.engine) != fault.engine:
                continue
            delay = float(where.get("delay", 0.0))  # type: ignore[arg-type]
            if delay > 0:
                self._fired.add(index)
                assert self.control is not None
                self.control.rt.spawn(self._later(index, fault, delay), f"fault-{index}")
            else:
                self._apply(index, fault)
            fired = True
        return fired

    async def _later(self, index: int, fault: Fault, delay: float) -> None:
        assert self.control is not None
        await self.control.rt.sleep(delay)
        self._fired.discard(index)
        self._apply(index, fault)

    def _observe(self, event: Event) -> None:
        if isinstance(event, StepCommitted):
            self._committed = max(self._committed, event.step)
        elif isinstance(event, StepBegan):
            self.fire("step_begin", step=event.step)
        elif isinstance(event, CellStateChanged) and event.new == CellState.STOPPED.value:
            for fault in [f for f in self._pending_starts if f.cell == event.cell]:
                self._pending_starts.remove(fault)
                self._start(fault)

    def _apply(self, index: int, fault: Fault) -> None:
        if index in self._fired:
            return
        self._fired.add(index)
        cluster, control = self.cluster, self.control
        assert cluster is not None and control is not None
        control.emit(
            FaultInjected,
            fault=fault.kind,
            cell=fault.cell,
            engine=fault.engine,
            detail=fault.detail,
        )
        if fault.kind in (FaultKind.KILL_CELL, FaultKind.STOP_CELL):
            cluster.kill_cell(fault.cell, fault.point)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.START_CELL:
            if control.cells.state(fault.cell) in (CellState.STOPPED, CellState.ERRORED):  # type: ignore[arg-type]
                self._start(fault)
            else:  # the control plane has not noticed the death yet
                self._pending_starts.append(fault)
        elif fault.kind is FaultKind.KILL_ENGINE:
            cluster.kill_engine(fault.engine, fault.point)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.SLOW_CELL:
            cluster.impair(f"cell-{fault.cell}", fault.factor, fault.duration)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.SLOW_LINK:
            cluster.impair("link", fault.factor, fault.duration)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.DELAY_ROUTER:
            cluster.impair("router-delay", 1.0 + fault.seconds, fault.duration)  # type: ignore[operator, arg-type]
        elif fault.kind is FaultKind.FAIL_ROUTER:
            cluster.impair("router-fail", 1.0, fault.duration)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.DROP_HEARTBEAT:
            cluster.impair(f"heartbeat-{fault.cell}", 1.0, fault.duration)  # type: ignore[arg-type]
        elif fault.kind is FaultKind.RESTART_ENGINE:
            control.engine_down(fault.engine, "process restarted")  # type: ignore[arg-type]
            control.rt.spawn(self._restart(fault.engine), f"restart-{fault.engine}")  # type: ignore[arg-type]

    async def _restart(self, engine: str) -> None:
        assert self.cluster is not None and self.control is not None
        await self.cluster.restart_engine(engine)
        self.control.engine_up(engine, "process restarted")

    def _start(self, fault: Fault) -> None:
        assert self.control is not None
        self.control.start_cell(fault.cell, f"{fault.kind.value} fault")  # type: ignore[arg-type]


__all__ = ["POINTS", "Fault", "FaultTarget", "ScheduledFaults"]
