"""Shrinking a failing run: fewer faults, steps, cells and engines, the same oracle failing.

Delta debugging (Zeller's ddmin) over the scenario's faults first: a fault
whose removal keeps the failure goes. Then the steps (halving while it still
fails, then one at a time), the cells and the engines (the fewest that still
fail). Every candidate is a whole run under the same seed, judged by the same
oracles; a candidate the scenario checks refuse (a fault at a step the shorter
run never reaches, a cell the smaller world lacks) is simply not taken. What
fails is the oracle the original run failed, with the same kind of evidence (the
type of its first evidence event, and the fault's kind when that event is a
fault), not any oracle: a shrunk scenario that fails something else, or the
same oracle over another fault, is another bug.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from miles_core.errors import ConfigError
from miles_core.oracles import Violation
from miles_core.scenario import Scenario
from miles_core.scenario.faults import After, AnyFault, target_cell, target_engine
from sim.run import run_scenario
from sim.search.plants import planted

T = TypeVar("T")


def signature(violation: Violation) -> tuple[str, ...]:
    """What makes two violations the same failure: the oracle, the type of the first event
    of its evidence and, if that event is a fault, the fault's kind."""
    if not violation.evidence:
        return (violation.oracle,)
    event = violation.evidence[0][1]
    kind = getattr(event, "fault", None)
    return (violation.oracle, type(event).__name__, "" if kind is None else str(kind))


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal subsequence of ``items`` that still ``fails`` (which it must at first)."""
    current = list(items)
    if fails([]):
        return []
    n = 2
    while len(current) >= 2:
        size = math.ceil(len(current) / n)
        parts = [current[i : i + size] for i in range(0, len(current), size)]
        for i, part in enumerate(parts):
            if fails(part):
                current, n = part, 2
                break
            rest = [x for j, p in enumerate(parts) if j != i for x in p]
            if len(parts) > 2 and fails(rest):
                current, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current


@dataclass
class Shrinker:
    """The runs a shrink makes, counted, for one seed, oracle and planted bug."""

    seed: int
    oracle: str
    plant: str | None = None
    signature: tuple[str, ...] | None = None
    """The original violation's signature(); None: any violation of the oracle."""
    runs: int = 0

    def fails(self, scenario: Scenario) -> bool:
        self.runs += 1
        with planted(self.plant):
            result = run_scenario(scenario, self.seed)
        violation = result.verdicts.get(self.oracle)
        if violation is None:
            return False
        return self.signature is None or signature(violation) == self.signature

    def candidate(self, scenario: Scenario, **changes: object) -> Scenario | None:
        """``scenario`` with ``changes`` (``steps`` goes to the loop), or None if refused."""
        try:
            if "steps" in changes:
                loop = dataclasses.replace(scenario.loop, steps=changes.pop("steps"))
                scenario = dataclasses.replace(scenario, loop=loop)
            if "num_cells" in changes or "num_engines" in changes:
                world = dataclasses.replace(scenario.world, **changes)  # type: ignore[arg-type]
                return dataclasses.replace(scenario, world=world)
            return dataclasses.replace(scenario, **changes)  # type: ignore[arg-type]
        except ConfigError:
            return None

    def still_fails(self, scenario: Scenario | None) -> bool:
        return scenario is not None and self.fails(scenario)


def kept(faults: Sequence[AnyFault], indices: Sequence[int]) -> tuple[AnyFault, ...] | None:
    """The faults at ``indices``, an ``after = { fault = N }`` renumbered to N's new place;
    None when a kept fault waits on one that is not kept (it would never fire)."""
    place = {old: new for new, old in enumerate(indices)}
    out = []
    for i in indices:
        fault, when = faults[i], faults[i].when
        if isinstance(when, After) and when.fault is not None:
            if when.fault not in place:
                return None
            moved = dataclasses.replace(when, fault=place[when.fault])
            fault = dataclasses.replace(fault, when=moved)
        out.append(fault)
    return tuple(out)


def _faults(s: Shrinker, scenario: Scenario) -> Scenario:
    def fails(indices: list[int]) -> bool:
        faults = kept(scenario.faults, indices)
        return faults is not None and s.still_fails(s.candidate(scenario, faults=faults))

    indices = ddmin(range(len(scenario.faults)), fails)
    faults = kept(scenario.faults, indices)
    assert faults is not None  # ddmin keeps only subsets that fail, which are whole
    return dataclasses.replace(scenario, faults=faults)


def _steps(s: Shrinker, scenario: Scenario) -> Scenario:
    steps = scenario.loop.steps
    while steps > 1 and s.still_fails(smaller := s.candidate(scenario, steps=steps // 2)):
        scenario, steps = smaller, steps // 2  # type: ignore[assignment]
    while steps > 1 and s.still_fails(smaller := s.candidate(scenario, steps=steps - 1)):
        scenario, steps = smaller, steps - 1  # type: ignore[assignment]
    return scenario


def _renumbered(scenario: Scenario) -> Scenario:
    """The faults' cells and engines renamed to the lowest ids, in order of first use (so a
    fault on engine-3 alone lets the world shrink to one engine)."""
    cells: dict[int, int] = {}
    engines: dict[str, str] = {}

    def renamed(key: str, value: object) -> object:
        if key in _CELL_FIELDS and isinstance(value, int):
            return cells.setdefault(value, len(cells))
        if key in _ENGINE_FIELDS and isinstance(value, str):
            return engines.setdefault(value, f"engine-{len(engines)}")
        return value

    faults = []
    for fault in scenario.faults:
        changes: dict[str, object] = {}
        if (cell := target_cell(fault)) is not None:
            changes["cell"] = renamed("cell", cell)
        if (engine := target_engine(fault)) is not None:
            changes["engine"] = renamed("engine", engine)
        when = fault.when
        if isinstance(when, After) and when.fields:  # the event it waits on names them too
            fields = tuple((k, renamed(k, v)) for k, v in when.fields)
            changes["when"] = dataclasses.replace(when, fields=fields)
        faults.append(dataclasses.replace(fault, **changes))
    return dataclasses.replace(scenario, faults=tuple(faults))


_CELL_FIELDS = frozenset({"cell", "src_cell", "dst_cell", "updater"})
_ENGINE_FIELDS = frozenset({"engine"})


def _world(s: Shrinker, scenario: Scenario, key: str, least: int) -> Scenario:
    for count in range(least, getattr(scenario.world, key)):
        if s.still_fails(smaller := s.candidate(scenario, **{key: count})):
            return smaller  # type: ignore[return-value]
    return scenario


def shrink(scenario: Scenario, shrinker: Shrinker) -> Scenario:
    """The smallest scenario found that still fails ``shrinker.oracle`` under its seed."""
    scenario = _faults(shrinker, scenario)
    scenario = _steps(shrinker, scenario)
    if shrinker.still_fails(renumbered := _renumbered(scenario)):
        scenario = renumbered
    scenario = _world(shrinker, scenario, "num_cells", 1)
    scenario = _world(shrinker, scenario, "num_engines", 1)
    return _faults(shrinker, scenario)  # a smaller world may need fewer faults still


__all__ = ["Shrinker", "ddmin", "shrink", "signature"]
