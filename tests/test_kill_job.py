"""A job killed whole (kill_job) and its resume from the last committed save: the simulator
restarts it as a new segment of the same run, every oracle judges the joined history, and
the resume oracle catches, on its own, a resume that loses the data cursor, the save's
pending groups, or reads a torn save."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.events import (
    EngineStateChanged,
    GroupTrained,
    History,
    JobKilled,
    JobResumed,
    LedgerRestored,
    RunStarted,
    SaveBegan,
    SaveCommitted,
    StepCommitted,
    VersionPublished,
)
from miles_core.kinds import FaultKind
from miles_core.oracles import ORACLES, resume
from miles_core.report.story import step_stories, story_lines
from miles_core.saves import Resume, SaveState, StoredSave, choose_save, save_due
from miles_core.scenario import Scenario, make_fault, scenario_from_toml
from miles_core.scenario.schedule import FaultSchedule
from miles_core.segments import segments, timeline
from sim.run import SimResult, run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario
from sim.world.runtime import SimRuntime

BASE = """
name = "kill"
[sim]
num_cells = 3
[loop]
steps = 10
save_interval = 2
unused_samples_handler = "retry"
"""


def _scenario(*faults: dict[str, object], extra: str = "") -> Scenario:
    base = scenario_from_toml(BASE + extra, "kill.toml")
    return dataclasses.replace(base, faults=tuple(make_fault("kill_job", **f) for f in faults))


def _events(result: SimResult, kind: type) -> list:
    return [e for e in result.history if isinstance(e, kind)]


def _check(result: SimResult) -> None:
    assert result.ok, result.failures()
    assert set(result.verdicts) == set(ORACLES)


# -- what a save holds and which one a resume reads --------------------------------------


def test_saves_are_due_as_miles_periodic_action_says() -> None:
    assert [s for s in range(10) if save_due(s, 3, 10)] == [2, 5, 8, 9]  # and the last
    assert not any(save_due(s, 0, 10) for s in range(10))
    assert [s for s in range(4) if save_due(s, 1, 4)] == [0, 1, 2, 3]


def test_a_torn_save_is_skipped_for_the_newest_committed_one() -> None:
    def stored(step: int, committed: bool) -> StoredSave:
        return StoredSave(SaveState(step, step + 1, 10 * step + 4, (10 * step,), 0), committed)

    chosen = choose_save([stored(5, False), stored(1, True), stored(3, True)])
    assert chosen.state is not None and chosen.state.step == 3 and chosen.torn == (5,)
    assert chosen.next_step == 4
    fresh = choose_save([stored(1, False)])
    assert fresh == Resume(None, (1,)) and fresh.next_step == 0


def test_a_save_round_trips_as_plain_data_and_refuses_a_malformed_one() -> None:
    state = SaveState(step=4, version=5, cursor=22, pending=(17, 20), seed=7)
    assert SaveState.from_dict(state.to_dict()) == state
    with pytest.raises(ConfigError, match=r"save\.pending"):
        SaveState(step=4, version=5, cursor=22, pending=(20, 17), seed=7)
    with pytest.raises(ConfigError, match=r"--load: the save holds \['step'\]"):
        SaveState.from_dict({"step": 1})


# -- the simulated kill and resume ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_a_kill_at_a_random_step_resumes_from_the_last_save_and_passes_every_oracle(
    seed: int,
) -> None:
    step = random.Random(seed).randint(1, 8)
    result = run_scenario(_scenario({"point": "step_begin", "step": step}), seed)
    _check(result)
    (killed,) = _events(result, JobKilled)
    (resumed,) = _events(result, JobResumed)
    committed = [e.step for e in _events(result, SaveCommitted) if e.t <= killed.t]
    assert resumed.save_step == (max(committed) if committed else None)
    assert resumed.next_step == (resumed.save_step + 1 if committed else 0)
    assert result.report.versions == list(range(1, 11))  # no gap, no repeat, kept
    kept, _ = timeline(result.history)
    trained = [e.prompt_id for e in kept if isinstance(e, GroupTrained)]
    assert len(trained) == len(set(trained)) == 40  # every prompt once across the kill
    assert [e.step for e in kept if isinstance(e, StepCommitted)] == list(range(10))


def test_a_kill_mid_save_resumes_from_the_previous_save() -> None:
    result = run_scenario(_scenario({"point": "during_save", "after_step": 3}), 0)
    _check(result)
    began = next(e for e in _events(result, SaveBegan) if e.step == 3)
    (killed,) = _events(result, JobKilled)
    assert began.t < killed.t
    assert not [e for e in _events(result, SaveCommitted) if e.step == 3 and e.t <= killed.t]
    (resumed,) = _events(result, JobResumed)
    assert (resumed.save_step, resumed.version, resumed.torn) == (1, 2, (3,))
    (restored,) = _events(result, LedgerRestored)
    publishes = [e.version for e in _events(result, VersionPublished) if e.t > restored.t]
    assert publishes[0] == 3  # v + 1 after the save at v = 2
    story = "\n".join(story_lines(step_stories(result.history)))
    assert "the job resumed from the save of step 1 (v2) at step 2, skipping the torn" in story


def test_a_kill_before_any_save_starts_over() -> None:
    result = run_scenario(_scenario({"at": 3.0}), 1)
    _check(result)
    (resumed,) = _events(result, JobResumed)
    assert resumed.save_step is None and resumed.next_step == 0 and resumed.cursor == 0
    assert len(segments(result.history)) == 2


def test_a_kill_while_the_job_restarts_and_a_fault_meanwhile_are_reported_once_it_is_up() -> None:
    """A second kill lands while the job starts again (a new restart begins); an engine the
    schedule kills meanwhile is reported dead when the new controller attaches, and the
    restart that follows brings it back."""
    scenario = _scenario({"at": 20.0}, {"at": 25.0})
    engine = (make_fault("kill_engine", engine="engine-1", at=27.0),)
    engine += (make_fault("restart_engine", engine="engine-1", at=45.0),)
    result = run_scenario(dataclasses.replace(scenario, faults=scenario.faults + engine), 0)
    _check(result)
    assert len(_events(result, JobKilled)) == 2 and len(_events(result, JobResumed)) == 1
    (resumed,) = _events(result, JobResumed)
    down = [e for e in _events(result, EngineStateChanged) if e.engine == "engine-1"]
    assert down[0].t == resumed.t and down[0].new is EngineState.DOWN
    assert any(e.new is EngineState.SERVING and e.t > 45.0 for e in down)


def test_the_same_seed_gives_the_same_joined_history() -> None:
    scenario = _scenario({"point": "after_bucket", "bucket": 1, "after_step": 4})
    assert run_scenario(scenario, 5).hash == run_scenario(scenario, 5).hash


def test_the_swarm_draws_kills_that_pass() -> None:
    drawn = [s for s in range(60) if _kills(swarm_scenario(s))]
    assert drawn, "the swarm drew no kill_job in 60 seeds"
    for seed in drawn[:3]:
        result = run_scenario(swarm_scenario(seed), seed)
        assert result.ok, f"swarm seed {seed}:\n{result.failures()}"
        assert _events(result, JobResumed)


def _kills(scenario: Scenario) -> bool:
    return any(f.kind is FaultKind.KILL_JOB for f in scenario.faults)


# -- planted bugs: the resume oracle catches each on its own -------------------------------


@pytest.mark.parametrize(
    ("plant", "fault", "words"),
    [
        (
            "resume_without_data_state",
            {"point": "step_begin", "step": 5},
            r"prompt 0 was drawn again after the job resumed from the save of step 3 .*"
            r"did not restore the data cursor",
        ),
        (
            "resume_drops_pending",
            {"point": "step_begin", "step": 5},
            r"prompt \d+ was pending in the save of step 3 .* lost across the kill",
        ),
        (
            "resume_from_torn_save",
            {"point": "during_save", "after_step": 3},
            r"resumed from the save of step 3, which the kill at t=[\d.]+ tore",
        ),
    ],
)
def test_a_broken_resume_fails_the_resume_oracle_naming_what_it_lost(
    plant: str, fault: dict[str, object], words: str
) -> None:
    scenario = _scenario(fault)
    assert run_scenario(scenario, 0).ok
    with planted(plant):
        result = run_scenario(scenario, 0)
    violation = result.verdicts["resume"]
    assert violation is not None, f"{plant} passed the resume oracle"
    assert re.search(words, violation.message), violation.message


def test_the_resume_oracle_names_a_repeated_or_missing_version() -> None:
    def history(after_resume: int) -> History:
        h = History()
        h.append(RunStarted(t=0.0, seed=0, scenario="s", engines=("e",), num_cells=1,
                            max_weight_staleness=None))  # fmt: skip
        h.append(VersionPublished(t=1.0, update_id=0, version=1, updater=0))
        h.append(SaveBegan(t=2.0, step=0, version=1, cursor=2, pending=(1,)))
        h.append(SaveCommitted(t=2.5, step=0, cell=0))
        h.append(VersionPublished(t=3.0, update_id=1, version=2, updater=0))
        h.append(JobKilled(t=4.0, reason="kill_job"))
        h.append(JobResumed(t=5.0, save_step=0, version=1, next_step=1, cursor=2, pending=(1,)))
        h.append(LedgerRestored(t=5.0, version=1))
        h.append(VersionPublished(t=6.0, update_id=0, version=after_resume, updater=0))
        return h

    assert resume(history(2)) is None  # the lost tail's version 2 is discarded with it
    gap = resume(history(3))
    assert gap is not None and "version 3 was published after version 1" in gap.message
    assert "a gap: version 2 is missing" in gap.message
    repeat = resume(history(1))
    assert repeat is not None and "a repeat of version 1" in repeat.message


# -- bad input ---------------------------------------------------------------------------


def test_bad_save_settings_are_errors_that_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"\[loop\]\.save_interval: got -1"):
        scenario_from_toml("[loop]\nsave_interval = -1\n", "t.toml")
    mid_save = '[[faults]]\nkind = "kill_job"\npoint = "during_save"\n'
    with pytest.raises(ConfigError, match=r"faults\[0\] \(kill_job\)\.point: .*save_interval"):
        scenario_from_toml(mid_save, "t.toml")
    with pytest.raises(ConfigError, match="liveness: is set beside a kill_job"):
        _scenario({"at": 3.0}).with_liveness()


def test_a_world_that_cannot_kill_a_job_refuses_the_fault_before_the_run() -> None:
    class NoKill:  # a world's fault actions without kill_job (the real backends' today)
        pass

    schedule = FaultSchedule((make_fault("kill_job", at=1.0),))
    with pytest.raises(ConfigError, match=r"faults \(kill_job\): this world cannot kill"):
        schedule.install(SimRuntime(0), History(), NoKill())  # type: ignore[arg-type]
