"""Every fault kind has one complete row in miles_core/fault_kinds.py, and each part the row
names is the one the code uses: the scenario type the parser builds, the witness the oracle
asks, an act that makes one call both worlds answer, the points it may strike at, and a
swarm draw that exists and, over enough seeds, draws the kind."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest

from miles_core.coverage import AT_TIME
from miles_core.fault_kinds import BY_KIND, CAUGHT, ROWS, TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.scenario.actions import FaultActions
from miles_core.scenario.faults import FAULT_TYPES, AnyFault
from miles_core.witness.effects import WITNESSES
from sim.search.swarm import swarm_scenario
from sim.world.faults import SimFaultActions

SEEDS = 400
"""Swarm seeds drawn (no run) to find each kind; every kind appears within the first 340
(the field bugs, sim/search/swarm_field_bugs.py, are the rarest)."""


def _drawn() -> dict[FaultKind, AnyFault]:
    """The first fault of each kind the swarm draws."""
    found: dict[FaultKind, AnyFault] = {}
    for seed in range(SEEDS):
        for fault in swarm_scenario(seed).faults:
            found.setdefault(fault.kind, fault)
        if len(found) == len(FaultKind):
            break
    return found


DRAWN = _drawn()


class _Recorder:
    """FaultActions that record the one call an act makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name not in _PROTOCOL:
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append(name)


_PROTOCOL = {n for n in vars(FaultActions) if not n.startswith("_")}


def test_every_kind_has_exactly_one_row() -> None:
    kinds = [row.kind for row in ROWS]
    assert sorted(kinds) == sorted(FaultKind) and len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("kind", list(FaultKind))
def test_the_row_names_what_the_code_uses(kind: FaultKind) -> None:
    row = BY_KIND[kind]
    assert row.spec is FAULT_TYPES[kind] and row.spec.kind is kind  # what a file's kind builds
    assert row.witness is WITNESSES[kind]  # what fault_witness and until_witnessed ask
    assert row.hows and row.hows <= {AT_TIME, *(p.value for p in FaultPoint)}
    assert (kind in TAKES_A_CELL_DOWN) is row.takes_a_cell_down


@pytest.mark.parametrize("kind", list(FaultKind))
def test_the_act_makes_one_call_that_both_worlds_answer(kind: FaultKind) -> None:
    """The Ray world answers it, or refuses a scenario with the kind before Ray starts."""
    from backends.common.run.ray_run import check_real
    from backends.common.world.faults import RayFaultActions
    from miles_core.errors import ConfigError
    from miles_core.scenario import SCENARIOS

    recorder = _Recorder()
    BY_KIND[kind].act(recorder, DRAWN[kind])  # type: ignore[arg-type]
    assert len(recorder.calls) == 1, recorder.calls
    (call,) = recorder.calls
    assert callable(getattr(SimFaultActions, call, None)), f"the simulator has no {call}"
    if not callable(getattr(RayFaultActions, call, None)):
        scenario = dataclasses.replace(SCENARIOS["no_failure"], faults=(DRAWN[kind],))
        with pytest.raises(ConfigError, match=kind.value):
            check_real(scenario)


@pytest.mark.parametrize("kind", list(FaultKind))
def test_the_swarm_draw_the_row_names_exists_and_the_swarm_draws_the_kind(
    kind: FaultKind,
) -> None:
    module, function = BY_KIND[kind].swarm.split(":")
    draw = getattr(importlib.import_module(f"sim.search.{module}"), function, None)
    assert callable(draw), f"{BY_KIND[kind].swarm} is no function of sim/search/{module}.py"
    assert kind in DRAWN, f"{SEEDS} swarm seeds drew no {kind.value}"


@pytest.mark.parametrize("kind", sorted(CAUGHT))
def test_a_seed_that_draws_a_caught_kind_expects_its_oracle_or_survives_it(
    kind: FaultKind,
) -> None:
    """A field bug's seed names the oracle that must catch it (expect.caught_by), the row's
    where that is an oracle, or none where the drawn form is survived (torn, overwrite
    applied twice, the lock failed over)."""
    from miles_core.oracle_names import CATCHERS

    for seed in range(SEEDS):
        scenario = swarm_scenario(seed)
        if any(f.kind is kind for f in scenario.faults):
            assert scenario.expect.caught_by in (BY_KIND[kind].caught_by, None)
            if scenario.expect.caught_by is not None:
                assert scenario.expect.caught_by in CATCHERS


def test_a_missing_row_is_named() -> None:
    """The check itself: a table short of a kind fails, naming it."""
    kinds = {row.kind for row in ROWS[1:]}
    assert set(FaultKind) - kinds == {ROWS[0].kind}
