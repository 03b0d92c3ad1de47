"""Liveness mode and the wait-for graph: a hang that no safety oracle sees fails ``liveness``,
and the graph names the task that waits and the party it waits on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    FaultInjected,
    FaultsHealed,
    LivenessArmed,
    RunEnded,
    StepCommitted,
    TasksWaiting,
)
from miles_core.kinds import RunStatus
from miles_core.oracles import SAFETY
from miles_core.profile import MilesProfile
from miles_core.scenario import (
    SCENARIOS,
    Scenario,
    load_scenario_file,
    make_fault,
    scenario_from_toml,
    scenario_to_toml,
)
from miles_core.scenario.liveness import Liveness
from miles_core.waits import TaskWait, WaitGraph
from sim.run import SimResult, run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario

HUNG = "ft_update_meets_a_hung_engine"
FILES = Path(__file__).resolve().parent / "files"


def _of(result: SimResult, kind: type) -> list:
    return [e for e in result.history if isinstance(e, kind)]


def _failed(result: SimResult) -> set[str]:
    return {name for name, verdict in result.verdicts.items() if verdict is not None}


def test_a_healed_run_meets_liveness_within_its_printed_bound() -> None:
    result = run_scenario(SCENARIOS[HUNG], 0)
    assert result.ok, result.failures()
    (healed,) = _of(result, FaultsHealed)
    (armed,) = _of(result, LivenessArmed)
    assert healed.step == 5 and armed.t == healed.t
    assert armed.bound.startswith(f"{armed.deadline - armed.t:.1f} s = 3 x (")
    after = [e for e in _of(result, StepCommitted) if e.t > healed.t]
    assert len(after) >= armed.steps and after[armed.steps - 1].t <= armed.deadline


def test_a_fault_after_the_heal_is_disarmed_and_never_fires() -> None:
    base = SCENARIOS["cell_crash_before_allreduce"]
    late = make_fault("kill_engine", engine="engine-0", point="step_begin", step=6)
    scenario = dataclasses.replace(base, faults=(*base.faults, late)).with_liveness(heal_step=5)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    (healed,) = _of(result, FaultsHealed)
    index = len(scenario.faults) - 1
    assert index in healed.disarmed
    assert index not in {e.index for e in _of(result, FaultInjected)}


def test_a_call_with_no_deadline_hangs_fails_only_liveness_and_the_graph_names_the_engine() -> None:
    # the plant takes away 31f1ca9's deadline (the health check's timeout); today's per-call
    # deadline (--update-weight-engine-request-timeout) is cell_isolation's
    with planted("update_call_without_deadline"):
        result = run_scenario(_aug2026(SCENARIOS[HUNG]), 0)
    assert result.report.status is RunStatus.STALLED
    assert not _failed(result) & set(SAFETY), result.failures()
    assert "liveness" in _failed(result)
    (healed,) = _of(result, FaultsHealed)
    assert healed.step is None  # the faults stopped the run before step 5: healed on the stall
    (waits,) = _of(result, TasksWaiting)
    assert waits.root.startswith("'loop' -> 'pause-engine-1': waits on engine-1 process 0 (hung)")
    assert "root 'loop' -> 'pause-engine-1'" in str(result.verdicts["liveness"])


def _aug2026(scenario: Scenario) -> Scenario:
    """The scenario under miles at 31f1ca9: a restarted engine is synced at once (the sync the
    plant lock_kept_when_nothing_to_sync lives in; today's miles never syncs a new process)."""
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    return dataclasses.replace(scenario, loop=loop)


LONE_ENGINE_REPLACED_MID_ROLLOUT = {0}
"""Swarm seeds whose only engine is replaced while its batch is being generated: under today's
miles its new process waits for the next full update (mark_weights_ready), which waits for
that batch, so the run stalls (scenarios/test_miles_cells.py); the liveness swarm checks them
under aug2026."""


def _lock_leak_seed() -> SimResult:
    with planted("lock_kept_when_nothing_to_sync"):
        for seed in range(40):
            result = run_scenario(_aug2026(swarm_scenario(seed, liveness=True)), seed)
            if not result.ok:
                return result
    raise AssertionError("no liveness seed of 40 met the leaked lock")


def test_a_lock_never_released_fails_liveness_naming_its_holder() -> None:
    result = _lock_leak_seed()
    assert _failed(result) == {"end_state", "liveness"}, result.failures()
    waits = _of(result, TasksWaiting)[-1]
    assert waits.root.startswith("'loop': waits on the weights lock, held by the sync of engine-")


def test_staleness_zero_under_slow_updates_passes_and_stalls_only_with_the_plant() -> None:
    """torchforge #557 on miles' loop (scenarios/files): staleness counted against the
    published version lets groups through at a bound of 0; counted against the trainer's
    own version, nothing passes, every safety oracle still holds and liveness fails."""
    scenario = load_scenario_file(FILES / "staleness_zero_while_updates_are_slow.toml")
    good = run_scenario(scenario, 0)
    assert good.ok, good.failures()
    assert {e.step for e in _of(good, FaultsHealed)} == {6}
    with planted("staleness_against_trainer_version"):
        bad = run_scenario(scenario, 0)
    assert bad.report.status is RunStatus.STALLED
    assert not _failed(bad) & set(SAFETY), bad.failures()
    assert "liveness" in _failed(bad)
    assert not _of(bad, StepCommitted)[1:]  # only the first step, before any version existed


def test_a_stall_at_the_horizon_records_its_wait_for_graph() -> None:
    """Without liveness mode the leaked lock stalls the run until its horizon: the graph is
    recorded there too."""
    with planted("lock_kept_when_nothing_to_sync"):
        for seed in range(40):
            result = run_scenario(_aug2026(swarm_scenario(seed, liveness=False)), seed)
            if result.report.status is RunStatus.STALLED:
                break
        else:
            raise AssertionError("no seed of 40 stalled on the leaked lock")
    (waits,) = _of(result, TasksWaiting)
    assert "did not finish by" in waits.reason
    assert "the weights lock, held by the sync of engine-" in waits.root
    assert _of(result, RunEnded)[0].status is RunStatus.STALLED


@pytest.mark.parametrize("seed", range(30))
def test_liveness_seeds_of_the_swarm_pass(seed: int) -> None:
    scenario = swarm_scenario(seed, liveness=True)
    if seed in LONE_ENGINE_REPLACED_MID_ROLLOUT:
        scenario = _aug2026(scenario)
    result = run_scenario(scenario, seed)
    assert result.ok, (
        f"{result.failures()}\nreplay: python -m sim run swarm --seed {seed} --liveness"
    )


def test_the_graph_finds_a_cycle() -> None:
    graph = WaitGraph(
        (
            TaskWait("loop", (), "task 'a'", ("a",), since=1.0),
            TaskWait("a", (), "task 'b'", ("b",), since=2.0),
            TaskWait("b", (), "task 'a'", ("a",), since=3.0),
        )
    )
    assert graph.root() == "a cycle: 'a' -> 'b' -> 'a'"


def test_liveness_in_a_scenario_file_round_trips_and_bad_values_name_the_key() -> None:
    scenario = SCENARIOS[HUNG]
    again = scenario_from_toml(scenario_to_toml(scenario), "test")
    assert again.liveness == Liveness(heal_step=5, steps=3)
    text = 'name = "x"\nliveness = { heal_step = 2, steps = 0 }\n[loop]\nsteps = 4\n'
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(text, "x.toml")
    assert error.value.field == "liveness.steps"
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(text.replace("steps = 0", "steps = 3").replace("= 2", "= 9"), "x")
    assert error.value.field == "liveness.heal_step"
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(text.replace("heal_step", "heal_at"), "x")
    assert error.value.field == "liveness"


def test_the_heal_on_stall_counts_from_the_run_start_not_the_worlds_clock() -> None:
    """A real world's clock runs through its start-up (10 s on the CPU backend, 60 s under
    load) before the schedule is installed; the stall watch counted from its zero and healed
    before step 0 at a bound below that, disarming every fault (the held-lock run on Ray)."""
    from miles_core.events import History
    from miles_core.scenario.schedule import FaultSchedule
    from sim.world.runtime import SimRuntime

    class Actions:  # a world that has nothing to repair
        def heal(self, engines: bool) -> list[int]:
            return []

    rt, history = SimRuntime(0), History()
    schedule = FaultSchedule((), heal_step=4, heal_after_stall=12.7)
    seen: list[int] = []

    async def world_start_then_run() -> None:
        await rt.sleep(60.0)
        schedule.install(rt, history, Actions())  # type: ignore[arg-type]
        await rt.sleep(12.0)
        seen.append(sum(isinstance(e, FaultsHealed) for e in history))
        await rt.sleep(1.0)
        seen.append(sum(isinstance(e, FaultsHealed) for e in history))

    rt.run(world_start_then_run())
    assert seen == [0, 1]
