"""``python -m sim judge-joined`` on a save-then-continue (issue 52, item 7): a run that ended
by itself, then ``--load`` of its save going on for more steps. The join put a JobKilled
after the first run's RunEnded and ``end_state`` called that "recorded after the run
ended", failing a correct job. Each run is held to its own ending instead: a correct
continue passes, a first run that crashed or kept acting after its end still fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_core.events import (
    Event,
    History,
    JobKilled,
    JobResumed,
    RunEnded,
    RunStarted,
    StepCommitted,
)
from miles_core.kinds import RunStatus
from miles_core.oracles import end_state
from sim.cli.judge_joined import KILLED, join
from sim.cli.judge_joined import main as judge_joined_main


def _run(t: float, status: RunStatus, steps: range, resumed_from: int | None = None) -> list[Event]:
    """One controller's run: it starts (from a save), commits ``steps``, and ends."""
    events: list[Event] = [
        RunStarted(t=t, seed=0, scenario="s", engines=("e0",), num_cells=1, max_weight_staleness=1)
    ]
    if resumed_from is not None:
        version = resumed_from + 1
        events.append(
            JobResumed(
                t=t, save_step=resumed_from, version=version, next_step=steps[0], cursor=0,
                pending=(),
            )
        )  # fmt: skip
    events += [
        StepCommitted(t=t + 1 + i, step=step, attempt=0, n_groups=1) for i, step in enumerate(steps)
    ]
    reason = "crashed" if status is RunStatus.CRASHED else f"{len(steps)} steps"
    events.append(
        RunEnded(t=t + 1 + len(steps), status=status, reason=reason, outstanding_prompts=())
    )
    return events


def _kill(events: list[Event]) -> list[Event]:
    """The run's events up to a SIGKILL mid-run: its ending never recorded."""
    return [e for e in events if not isinstance(e, RunEnded)]


def test_a_run_that_ended_then_went_on_from_its_save_passes_end_state() -> None:
    joined = join(
        [_run(0.0, RunStatus.COMPLETED, range(3)), _run(0.0, RunStatus.COMPLETED, range(3, 6), 2)]
    )
    assert end_state(joined) is None
    (gone,) = [e for e in joined if isinstance(e, JobKilled)]
    assert gone.reason == "every process of the job exited after the run ended (completed)"


def test_a_run_interrupted_then_resumed_passes_end_state() -> None:
    joined = join(
        [_run(0.0, RunStatus.INTERRUPTED, range(2)), _run(0.0, RunStatus.COMPLETED, range(2, 6), 1)]
    )
    assert end_state(joined) is None


def test_a_first_run_that_crashed_still_fails_though_its_resume_completed() -> None:
    joined = join(
        [_run(0.0, RunStatus.CRASHED, range(2)), _run(0.0, RunStatus.COMPLETED, range(2, 6), 1)]
    )
    violation = end_state(joined)
    assert violation is not None and "the run crashed" in violation.message


def test_an_event_after_a_first_runs_end_is_still_a_violation() -> None:
    first = _run(0.0, RunStatus.COMPLETED, range(3))
    first.append(
        StepCommitted(t=99.0, step=3, attempt=0, n_groups=1)
    )  # the world kept acting on a finished run
    joined = join([first, _run(0.0, RunStatus.COMPLETED, range(3, 6), 2)])
    violation = end_state(joined)
    assert violation is not None and "StepCommitted was recorded after the run ended" in str(
        violation
    )
    assert violation.evidence[-1][0] == len(first) - 1  # where the join put it


def test_a_job_killed_mid_run_and_resumed_is_judged_by_its_last_run() -> None:
    killed = _kill(_run(0.0, RunStatus.COMPLETED, range(3)))
    joined = join([killed, _run(0.0, RunStatus.COMPLETED, range(2, 6), 1)])
    assert [e.reason for e in joined if isinstance(e, JobKilled)] == [KILLED]
    assert end_state(joined) is None
    cut = join([killed, _kill(_run(0.0, RunStatus.COMPLETED, range(2, 6), 1))])
    violation = end_state(cut)
    assert violation is not None and "never recorded its end" in violation.message


def test_a_history_without_a_kill_is_judged_as_before() -> None:
    assert end_state(History(_run(0.0, RunStatus.COMPLETED, range(3)))) is None
    violation = end_state(History(_run(0.0, RunStatus.CRASHED, range(3))))
    assert violation is not None and "the run crashed" in violation.message


def _write(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in events))
    return path


def test_judge_joined_passes_end_state_of_a_save_then_continue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _write(tmp_path / "a.jsonl", _run(0.0, RunStatus.COMPLETED, range(3)))
    second = _write(tmp_path / "b.jsonl", _run(0.0, RunStatus.COMPLETED, range(3, 6), 2))
    judge_joined_main([str(first), str(second)])
    out = capsys.readouterr().out
    assert "  oracle end_state            pass" in out, out
