"""The tree's layout holds: no import circle, and each floor imports only the floors below it.

Read from the source (tests/import_graph.py: ast, every import, lazy and TYPE_CHECKING
ones included), so a failure names the modules, never an import error. docs/layout.md
draws the same floors.
"""

from __future__ import annotations

import ast

import pytest
from import_graph import circles, external, graph, modules, one_circle

MODULES = modules()
EDGES = graph(MODULES)

HEAVY = {"simpy", "ray", "torch", "sglang", "sglang_router", "megatron", "transformers"}

FLOORS: dict[str, list[set[str]]] = {
    # python -m sim reads top-down; search/ and timing/ share a floor and know nothing
    # of each other
    "sim": [
        {"sim.__main__"},
        {"sim.cli"},
        {"sim.scenarios"},
        {"sim.search", "sim.timing"},
        {"sim.run"},
        {"sim.horizon"},
        {"sim.world"},
    ],
    "backends.common": [
        {"backends.common.run"},
        {"backends.common.world"},
        {"backends.common.engine"},
        {"backends.common.training", "backends.common.wire", "backends.common.sglang"},
        {"backends.common.session"},
        {"backends.common.stack"},
    ],
}
"""Per package, its parts from the top floor down: a module may import its own part and
any part of a lower floor, never a part above it or beside it on its floor."""


def _part(module: str, floors: list[set[str]]) -> tuple[int, str] | None:
    for level, parts in enumerate(floors):
        for part in parts:
            if module == part or module.startswith(part + "."):
                return level, part
    return None


def test_the_scan_sees_the_tree() -> None:
    assert len(MODULES) > 150
    assert {"sim.run", "backends.common.stack", "miles_core.events"} <= set(MODULES)
    assert "sim.world.cluster" in EDGES["sim.run"]


def test_no_import_circle() -> None:
    found = [" -> ".join(one_circle(part, EDGES)) for part in circles(EDGES)]
    assert found == [], f"{len(found)} import circle(s):\n" + "\n".join(found)


def test_a_planted_circle_is_found() -> None:
    """The check itself: a circle added to the real graph is named, shortest path first."""
    edges = {name: set(targets) for name, targets in EDGES.items()}
    edges["sim.world.runtime"].add("sim.run")
    found = [part for part in circles(edges) if part not in circles(EDGES)]
    assert len(found) == 1
    path = one_circle(found[0], edges)
    assert path[0] == path[-1] == found[0][0]
    assert {"sim.run", "sim.world.runtime"} <= set(path)


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_each_floor_imports_only_the_floors_below(package: str) -> None:
    floors = FLOORS[package]
    unplaced = sorted(
        m for m in MODULES if m.startswith(package + ".") and _part(m, floors) is None
    )
    assert unplaced == [], f"modules of {package} on no floor: {unplaced}"
    wrong = []
    for module, targets in sorted(EDGES.items()):
        mine = _part(module, floors)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = _part(target, floors)
            if theirs is not None and theirs[1] != mine[1] and theirs[0] <= mine[0]:
                wrong.append(f"{module} imports {target}")
    assert wrong == [], "\n".join(wrong)


def test_miles_core_imports_nothing_outside_itself_and_no_heavy_framework() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in EDGES.items()
        if module.startswith("miles_core")
        for target in targets
        if not target.startswith("miles_core")
    )
    heavy = sorted(
        f"{module} imports {name}"
        for module, names in external(MODULES).items()
        if module.startswith("miles_core")
        for name in names & HEAVY
    )
    assert wrong + heavy == []


def test_backends_never_import_the_simulator() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in EDGES.items()
        if module.startswith("backends")
        for target in targets
        if target.startswith("sim")
    )
    assert wrong == []


def test_the_simulator_takes_only_the_ray_session_from_the_backends() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in EDGES.items()
        if module.startswith("sim")
        for target in targets
        if target.startswith("backends") and not target.startswith("backends.common.session")
    )
    assert wrong == []


CHECKERS = ("miles_core.oracles", "miles_core.report")
"""The parts of miles_core that judge a history after (or beside) the run."""

HISTORY_READERS = {"miles_core.conformance", "miles_core.coverage", "miles_core.probes"}
"""Modules that, like the checkers, only read a finished history (what two worlds decided,
which fault struck in which phase, which rare states a run reached) and never drive a run:
they may use the oracles' helpers."""

CONTROL = ("miles_core.loop", "miles_core.scenario", "sim.world")
"""The side that runs: the control plane, what it is told to run, the simulated world."""


def _within(module: str, parts: tuple[str, ...]) -> bool:
    return any(module == part or module.startswith(part + ".") for part in parts)


def _reachable(start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in EDGES.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_control_side_imports_no_oracle() -> None:
    """Checkers read the history and never drive the run (Jepsen's rule): outside the
    checkers, no module of miles_core imports miles_core.oracles, and nothing the control
    side imports, however far down, is a checker. What both sides need (segments, the
    witnesses, the stopping predicates, the history's index) sits outside oracles/."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in EDGES.items()
        if _within(module, ("miles_core",))
        and not _within(module, CHECKERS)
        and module not in HISTORY_READERS
        for target in targets
        if _within(target, ("miles_core.oracles",))
    )
    reached = sorted(
        f"{start} reaches {target}"
        for start in EDGES
        if _within(start, CONTROL)
        for target in _reachable(start)
        if _within(target, CHECKERS)
    )
    assert {m for m in EDGES if _within(m, CONTROL)} >= {"miles_core.loop.run", "sim.world.job"}
    assert wrong + reached == [], "\n".join(wrong + reached)


def test_every_package_says_what_its_folder_holds() -> None:
    """Each ``__init__.py`` opens with a docstring (docs/layout.md draws the same folders)."""
    silent = sorted(
        name
        for name, module in MODULES.items()
        if module.is_package and not ast.get_docstring(ast.parse(module.path.read_text()))
    )
    assert silent == []


def test_a_command_and_a_library_never_share_a_file_name() -> None:
    """``sim/cli/sweep.py`` runs ``sim/search/fanout.py``: a reader finding ``sweep.py`` knows
    it is the command. (sim/run.py, one run, keeps its path: tests and scenarios import it.)"""
    commands = {m.rpartition(".")[2] for m in MODULES if m.startswith("sim.cli.")}
    libraries = {
        m.rpartition(".")[2]: m
        for m in MODULES
        if m.startswith(("sim.search.", "sim.timing.", "sim.world."))
    }
    assert sorted(libraries[name] for name in commands & set(libraries)) == []
