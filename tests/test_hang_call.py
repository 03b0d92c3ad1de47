"""hang_call: one control call of an engine accepted and never answered, while the engine
generates (miles #2983 / #3036). Fault tolerance's deadline on the call gets past it;
without it the update waits for ever, and the wait-for graph names the call; liveness
mode's heal restarts the engine and the run goes on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import EngineStateChanged, SampleGenerated, TasksWaiting, UpdateAborted
from miles_core.kinds import RunStatus
from miles_core.probes import probes_hit
from miles_core.scenario import load_scenario_file, make_fault
from miles_core.scenario.faults import HUNG_CALLS
from miles_core.scenario.liveness import Liveness
from sim.run import run_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios" / "files" / "ft_flush_never_answers.toml"


def _without_ft(call: str = "flush_cache") -> object:
    scenario = load_scenario_file(FILE)
    loop = dataclasses.replace(scenario.loop, use_fault_tolerance=False)
    fault = dataclasses.replace(scenario.faults[0], call=call)
    return dataclasses.replace(scenario, loop=loop, faults=(fault,))


@pytest.mark.parametrize("call", HUNG_CALLS)
def test_fault_tolerance_takes_the_engine_out_when_the_call_times_out(call: str) -> None:
    scenario = load_scenario_file(FILE)
    scenario = dataclasses.replace(
        scenario, faults=(dataclasses.replace(scenario.faults[0], call=call),)
    )
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    down = [e for e in result.history if isinstance(e, EngineStateChanged) and not e.up]
    assert down[0].engine == "engine-1"
    assert down[0].reason.startswith("no answer to ")  # the call's deadline ran out
    assert "call_deadline_passed" in probes_hit(result.history)
    aborted = [e for e in result.history if isinstance(e, UpdateAborted)]
    if call == "continue_generation":  # the version was published before the resume
        assert aborted == []
    else:
        assert aborted[0].component == "engine-1"


def test_the_engine_keeps_generating_while_its_call_hangs() -> None:
    result = run_scenario(_without_ft(), 0)
    assert result.report.status is RunStatus.STALLED
    fired = next(e.t for e in result.history if type(e).__name__ == "FaultInjected")
    after = [e for e in result.history if isinstance(e, SampleGenerated) and e.t > fired]
    assert any(e.engine == "engine-1" for e in after)


def test_without_fault_tolerance_the_update_hangs_and_the_graph_names_the_call() -> None:
    result = run_scenario(_without_ft(), 0)
    assert result.report.status is RunStatus.STALLED
    waits = [e for e in result.history if isinstance(e, TasksWaiting)][-1]
    assert "waits on engine-1 process 0 (alive, flush_cache unanswered)" in waits.root


def test_liveness_mode_restarts_the_engine_and_the_run_goes_on() -> None:
    scenario = dataclasses.replace(_without_ft(), liveness=Liveness(heal_step=5))
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    assert result.verdicts["liveness"] is None


def test_a_call_no_update_makes_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"fault \(hang_call\)\.call"):
        make_fault("hang_call", engine="engine-0", call="generate", at=1.0)
    with pytest.raises(ConfigError, match=r"fault \(hang_call\)\.point"):
        make_fault(
            "hang_call", engine="engine-0", call="flush_cache", point="after_bucket", bucket=0
        )
