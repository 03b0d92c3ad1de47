"""What today's miles changes for a user, fault by fault: recovery time and serving capacity
lost under each miles profile, in the simulator (``python -m sim predict --profiles``).

Three faults, each struck once as step 2 begins, under miles' own fault-tolerance defaults
(configs/fault_tolerance.py at 3c07fcdd: health checks every 30 s with a 30 s timeout, the
mini FT controller polling every 10 s and resuming after 10 s; heartbeats every 10 s,
failing after 3 misses) unless a case says otherwise:

- a killed engine (``kill_engine``): its process exits;
- a hung engine (``hang_engine``): alive, answering nothing;
- a killed trainer cell (``kill_cell``): found by the heartbeat checker, brought back by
  the mini FT controller, healed at the next refresh.

Each is run under ``aug2026`` and ``today`` at two presets, seed 0, with a new engine process
taking ``ENGINE_START_SECONDS`` to start and a new cell ``CELL_START_SECONDS`` (assumed, not
measured: an SGLang server loading a 30B model, a Megatron cell loading its shard). The
figures are the simulator's prediction under those assumptions, not measurements.

- recovery: seconds from the fault to the target serving again (an engine: a new process
  back in rotation; a cell: alive again), or "not by the end" when the run ended first;
- capacity lost: engine-seconds out of rotation from the fault to the end of the run, summed
  over every engine (a hung engine serving nothing while still in rotation counts as lost
  from the fault until it leaves rotation: it takes requests and answers none).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from miles_core.cells import CellState
from miles_core.engines import EngineState
from miles_core.events import (
    CellStateChanged,
    EngineStateChanged,
    FaultInjected,
    History,
    RunEnded,
)
from miles_core.profile import MilesProfile
from miles_core.scenario import Scenario, scenario_from_mapping

PRESETS = ("small", "production-64x256")
ENGINE_START_SECONDS = 120.0
"""Assumed: an SGLang server's start with a 30B model's weights (not measured here)."""
CELL_START_SECONDS = 120.0
"""Assumed: a trainer cell's actors started and its shard loaded (not measured here)."""
STEPS = {"small": 60, "production-64x256": 8}
"""Steps a run takes: enough for the slowest recovery to land inside it (a small step is
seconds, a production one minutes)."""

_FT = {
    "use_fault_tolerance": True,
    "rollout_health_check_interval": 30.0,
    "rollout_health_check_timeout": 30.0,
}
_HEARTBEATS = {
    "heartbeat_interval": 10.0,
    "heartbeat_timeout": 10.0,
    "mini_ft_controller_enable": True,
}


@dataclass(frozen=True)
class Case:
    name: str
    fault: Mapping[str, Any]
    loop: Mapping[str, Any]


CASES = (
    Case(
        "killed engine",
        {"kind": "kill_engine", "engine": "engine-1", "point": "step_begin", "step": 2},
        _FT,
    ),
    Case(
        "hung engine",
        {"kind": "hang_engine", "engine": "engine-1", "point": "step_begin", "step": 2},
        _FT,
    ),
    Case(
        "killed trainer cell",
        {"kind": "kill_cell", "cell": 1, "point": "step_begin", "step": 2},
        _FT | _HEARTBEATS,
    ),
)


@dataclass(frozen=True)
class Row:
    preset: str
    case: str
    profile: MilesProfile
    recovery_seconds: float | None
    """None: the target did not serve again before the run ended."""
    lost_engine_seconds: float
    run_seconds: float
    status: str


def scenario(preset: str, case: Case, profile: MilesProfile) -> Scenario:
    data = {
        "name": f"{case.name} ({preset}, {profile.value})",
        "preset": preset,
        "until_witnessed": 400,
        "sim": {
            "engine_start_seconds": ENGINE_START_SECONDS,
            "cell_start_seconds": CELL_START_SECONDS,
        },
        "loop": {"steps": STEPS[preset], **case.loop},
        "miles": {"profile": profile.value},
        "faults": [dict(case.fault)],
    }
    return scenario_from_mapping(data, case.name)


def _fault_time(history: History) -> float:
    return next(e.t for e in history if isinstance(e, FaultInjected))


def recovery_seconds(history: History, case: Case) -> float | None:
    """Seconds from the fault to its target serving again (None: not by the end)."""
    struck = _fault_time(history)
    if "cell" in case.fault:
        cell = case.fault["cell"]
        failed = False
        for e in history:
            if isinstance(e, CellStateChanged) and e.cell == cell and e.t >= struck:
                failed = failed or e.new is not CellState.ALIVE
                if failed and e.new is CellState.ALIVE:
                    return e.t - struck
        return None
    engine = case.fault["engine"]
    left = False
    for e in history:
        if isinstance(e, EngineStateChanged) and e.engine == engine and e.t >= struck:
            left = left or e.new is not EngineState.SERVING
            if left and e.new is EngineState.SERVING:
                return e.t - struck
    return None


def lost_engine_seconds(history: History, case: Case) -> float:
    """Engine-seconds out of rotation from the fault to the end, over every engine; a hung
    engine counts from the fault (it answers nothing while still in rotation)."""
    struck = _fault_time(history)
    end = next(e.t for e in reversed(list(history)) if isinstance(e, RunEnded))
    out_since: dict[str, float] = {}
    if case.fault.get("kind") == "hang_engine":
        out_since[case.fault["engine"]] = struck
    lost = 0.0
    for e in history:
        if not isinstance(e, EngineStateChanged) or e.t < struck:
            continue
        serving = e.new is EngineState.SERVING
        if serving and e.engine in out_since:
            lost += e.t - out_since.pop(e.engine)
        elif not serving and e.engine not in out_since:
            out_since[e.engine] = e.t
    return lost + sum(end - t for t in out_since.values())


def rows(seed: int = 0) -> Iterator[Row]:
    from sim.run import run_scenario

    for preset in PRESETS:
        for case in CASES:
            for profile in (MilesProfile.AUG2026, MilesProfile.TODAY):
                result = run_scenario(scenario(preset, case, profile), seed)
                history = result.history
                ended = next(e for e in reversed(list(history)) if isinstance(e, RunEnded))
                yield Row(
                    preset,
                    case.name,
                    profile,
                    recovery_seconds(history, case),
                    lost_engine_seconds(history, case),
                    ended.t,
                    ended.status.value,
                )


def table(found: list[Row]) -> str:
    lines = [
        "| preset | fault | profile | recovery (s) | capacity lost (engine-s) | run (s) "
        "| run ended |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found:
        recovery = "not by the end" if r.recovery_seconds is None else f"{r.recovery_seconds:.0f}"
        lines.append(
            f"| {r.preset} | {r.case} | {r.profile.value} | {recovery} | "
            f"{r.lost_engine_seconds:.0f} | {r.run_seconds:.0f} | {r.status} |"
        )
    return "\n".join(lines)


def report(seed: int = 0) -> str:
    return table(list(rows(seed)))


if __name__ == "__main__":
    print(report())
