"""Verdicts a user can trust: a crash never passes, the world reports what it saw, every fault
kind shows that it took effect, and the restart-before-stamp window is covered.

Each test changes one thing (an ending, a task that raises, a world that does not act on a
fault) and asserts that an oracle, not a test-specific check, says so.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import TransitionError
from miles_core.events import (
    BucketReceived,
    EngineExited,
    EngineStamped,
    EngineStarted,
    Event,
    FaultInjected,
    FaultScheduled,
    GroupPut,
    History,
    SampleGenerated,
    UpdateAborted,
    UpdateBegan,
)
from miles_core.fault_kinds import BY_KIND
from miles_core.kinds import FaultKind, FaultPoint, PutFate, RunStatus
from miles_core.loop.producer import Producer
from miles_core.oracles import idle_faults
from miles_core.oracles.witnesses import fault_witness
from miles_core.profile import MilesProfile
from miles_core.scenario import SCENARIOS, Expect, Scenario, TimeModel, make_fault
from miles_core.scenario.schedule import FaultSchedule
from sim.__main__ import main
from sim.run import SimResult, run_scenario
from sim.scenarios import load_scenario_file
from sim.world.cluster import SimCluster
from sim.world.faults import SimFaultActions
from sim.world.runtime import Deadlock, SimRuntime

FILES = Path(__file__).resolve().parent / "files"


def failing(result: SimResult) -> dict[str, str]:
    return {name: str(v) for name, v in result.verdicts.items() if v is not None}


# -- endings -------------------------------------------------------------------------------


def test_a_run_out_of_retries_does_not_pass_unless_the_scenario_expects_it(capsys) -> None:
    expected = SCENARIOS["one_attempt_per_step"]
    assert run_scenario(expected, 0).ok  # the scenario says: failed with RetriesExhaustedError
    plain = dataclasses.replace(expected, expect=Expect())
    result = run_scenario(plain, 0)
    assert result.report.status is RunStatus.FAILED
    assert set(failing(result)) == {"end_state"}
    assert "RetriesExhaustedError" in failing(result)["end_state"]
    assert "expects it to complete" in failing(result)["end_state"]


def test_the_cli_exits_1_with_the_cause_and_a_replay_line(tmp_path, capsys) -> None:
    file = tmp_path / "one_try.toml"
    file.write_text(
        'name = "one_try"\n[loop]\nmax_step_attempts = 1\n'
        '[[faults]]\nkind = "kill_cell"\ncell = 1\npoint = "before_allreduce"\nstep = 2\n'
    )
    assert main(["run", str(file), "--json"]) == 1
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert info["status"] == "failed" and info["error"] == "RetriesExhaustedError"
    assert info["oracles"]["end_state"] == "fail"
    assert "miles_core/cells.py" in info["traceback"]  # where it was raised
    assert err.strip().splitlines()[-1].startswith(f"replay: python -m sim run {file}")


def test_an_injected_transition_error_fails_with_its_traceback(monkeypatch) -> None:
    from miles_core.cells import CellGroup

    begin = CellGroup.begin_attempt

    def broken(self: CellGroup, step: int) -> Any:
        if step == 2:
            raise TransitionError("planted: step 2 cannot begin")
        return begin(self, step)

    monkeypatch.setattr(CellGroup, "begin_attempt", broken)
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.report.status is RunStatus.FAILED
    violation = failing(result)["end_state"]
    assert "TransitionError: planted: step 2 cannot begin" in violation
    assert "miles_core/loop/train.py" in violation  # the traceback is kept, frames and all


def test_an_exception_in_a_task_nobody_awaits_ends_the_run_with_that_exception(
    monkeypatch,
) -> None:
    generate = Producer._generate_group

    async def broken(self: Producer, group_id: int, prompt_id: int) -> bool:
        if group_id == 6:
            raise KeyError("planted: group 6")
        return await generate(self, group_id, prompt_id)

    monkeypatch.setattr(Producer, "_generate_group", broken)
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.report.status is RunStatus.CRASHED
    end = result.history[len(result.history) - 1]
    assert end.error == "KeyError" and "group-6" in end.reason
    assert "deadlock" not in end.reason
    assert "miles_core/loop/producer.py" in end.traceback or "test_verdicts.py" in end.traceback
    assert "the run crashed: KeyError" in failing(result)["end_state"]


def test_the_simulator_reports_a_task_failure_as_itself_and_a_deadlock_as_one() -> None:
    rt = SimRuntime(0)

    async def boom() -> None:
        await rt.sleep(1)
        raise RuntimeError("planted failure nobody awaits")

    async def waits_forever() -> None:
        rt.spawn(boom(), "boom")
        await rt.signal()

    with pytest.raises(RuntimeError, match="planted failure nobody awaits") as raised:
        rt.run(waits_forever())
    assert not isinstance(raised.value, Deadlock)
    rt = SimRuntime(0)
    with pytest.raises(Deadlock, match="deadlock at t=0"):
        rt.run(_forever(rt))


async def _forever(rt: SimRuntime) -> None:
    await rt.signal()


def test_a_stall_is_a_violation_with_its_reason() -> None:
    scenario = dataclasses.replace(SCENARIOS["no_failure"], max_seconds=12.0)
    result = run_scenario(scenario, 0)
    assert result.report.status is RunStatus.STALLED
    assert "the run stalled: main did not finish by t=12" in failing(result)["end_state"]


# -- each world reports its own state; the injector only acts ----------------------------


class _Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []

    def engine_started(self, engine: str, incarnation: int, how: str) -> None:
        self.calls.append(("engine_started", engine, incarnation))

    def engine_exited(self, engine: str, incarnation: int, how: str) -> None:
        self.calls.append(("engine_exited", engine, incarnation))

    def cell_started(self, cell: int, incarnation: int, how: str) -> None:
        self.calls.append(("cell_started", cell, incarnation))


def test_the_simulated_world_reports_exits_and_new_processes_itself() -> None:
    cluster = SimCluster(SimRuntime(0), SCENARIOS["no_failure"].world)
    observer = _Observer()
    cluster.attach(observer)
    cluster.restart_engine("engine-1")
    cluster.kill_engine("engine-0")
    cluster.kill_engine("engine-0")  # already dead: nothing new to report
    cluster.start_cell(1)
    assert observer.calls == [
        ("engine_exited", "engine-1", 0),
        ("engine_started", "engine-1", 1),
        ("engine_exited", "engine-0", 0),
        ("cell_started", 1, 1),
    ]


def test_a_restarted_engine_answers_after_its_start_time_and_a_later_restart_replaces_it() -> None:
    """engine_start_seconds: the old process dies at once; the new one comes up that long
    after, and is dead to calls meanwhile. A second restart while the first new process
    starts replaces that start: one new process, 5 s after the second restart (t=10)."""
    rt = SimRuntime(0)
    cluster = SimCluster(rt, SCENARIOS["no_failure"].world, TimeModel(engine_start_seconds=5.0))
    observer = _Observer()
    cluster.attach(observer)
    engine = cluster.engines["engine-1"]
    exited = [("engine_exited", "engine-1", 0)]

    async def main() -> None:
        await rt.sleep(1.0)
        cluster.restart_engine("engine-1")
        assert observer.calls == exited  # at t=1
        await rt.sleep(4.0)
        assert engine.dead  # still starting at t=5
        cluster.restart_engine("engine-1")  # the first start is replaced
        await rt.sleep(4.0)
        assert engine.dead and observer.calls == exited  # t=9
        await rt.sleep(2.0)
        assert not engine.dead  # t=11

    rt.run(main())
    assert observer.calls == [*exited, ("engine_started", "engine-1", 1)]
    instant = SimCluster(SimRuntime(0), SCENARIOS["no_failure"].world, TimeModel())
    instant.restart_engine("engine-1")
    assert not instant.engines["engine-1"].dead  # 0 s: up at once, as before


def test_the_fault_schedule_records_only_that_faults_fired() -> None:
    rt = SimRuntime(0)
    history = History()
    acted: list[str] = []

    class Actions:
        def kill_cell(self, cell: int, point: FaultPoint | None) -> None:
            acted.append(f"kill_cell {cell} {point}")

        def start_cell(self, cell: int) -> None:
            acted.append(f"start_cell {cell}")

        def kill_engine(self, engine: str, point: FaultPoint | None) -> None:
            acted.append(f"kill_engine {engine}")

        def restart_engine(self, engine: str) -> None:
            acted.append(f"restart_engine {engine}")

        def impair(self, fault: Any) -> None:
            acted.append(f"impair {fault.kind.value}")

    faults = (
        make_fault("restart_engine", engine="engine-0", at=1.0),
        make_fault("kill_cell", cell=1, point="after_bucket", bucket=2),
        make_fault("slow_link", at=2.0, duration=3.0, factor=2.0),
    )
    schedule = FaultSchedule(faults)

    async def main_task() -> None:
        schedule.install(rt, history, Actions())
        await rt.sleep(3.0)
        assert not schedule.fire(FaultPoint.AFTER_BUCKET, cell=0, bucket=2)  # not cell 1's
        assert schedule.fire(FaultPoint.AFTER_BUCKET, cell=1, bucket=2)

    rt.run(main_task())
    assert acted == ["restart_engine engine-0", "impair slow_link", "kill_cell 1 after_bucket"]
    assert {type(e) for e in history} == {FaultScheduled, FaultInjected}


# -- every fault kind shows it took effect ------------------------------------------------


def test_every_fault_kind_has_a_witness() -> None:
    assert set(BY_KIND) == set(FaultKind)


class _DoesNothing(SimFaultActions):
    """A world whose fault actions fire but change nothing (a broken injector or world)."""

    def kill_cell(self, cell: int, point: FaultPoint | None) -> None:
        pass

    def start_cell(self, cell: int) -> None:
        pass

    def kill_engine(self, engine: str, point: FaultPoint | None) -> None:
        pass

    def restart_engine(self, engine: str) -> None:
        pass

    def impair(self, fault: Any) -> None:
        pass


WITNESSED = {
    "slow_cell": "slow_cell",
    "slow_link": "slow_link",
    "router_trouble": "delay_router",
    "heartbeat_false_positive": "drop_heartbeat",
    "engine_restart": "restart_engine",
    "engine_killed_mid_update": "kill_engine",
    "cell_killed_between_steps": "kill_cell",
}


@pytest.mark.parametrize("name", sorted(WITNESSED))
def test_a_fault_that_changes_nothing_fails_its_witness(monkeypatch, name: str) -> None:
    import sim.run

    assert run_scenario(SCENARIOS[name], 0).ok
    monkeypatch.setattr(sim.run, "SimFaultActions", _DoesNothing)
    result = run_scenario(SCENARIOS[name], 0)
    witness = failing(result).get("fault_witness", "")
    assert f"fault {WITNESSED[name]}" in witness and "had no effect" in witness


def test_a_failing_router_that_fails_nothing_fails_its_witness(monkeypatch) -> None:
    import sim.run

    class NoFailure(SimFaultActions):
        def impair(self, fault: Any) -> None:
            if fault.kind is not FaultKind.FAIL_ROUTER:
                super().impair(fault)

    monkeypatch.setattr(sim.run, "SimFaultActions", NoFailure)
    witness = failing(run_scenario(SCENARIOS["router_trouble"], 0))["fault_witness"]
    assert "fault fail_router" in witness and "sent during the window failed at the" in witness


def test_a_router_window_that_backpressure_kept_empty_passes() -> None:
    """Swarm seed 3155, shrunk: a full buffer holds every request back for the whole window,
    so the router had nothing to fail (what the witness reads), and the run passes."""
    scenario = load_scenario_file(FILES / "router_window_under_backpressure.toml")
    result = run_scenario(scenario, 3155)
    assert result.ok, result.failures()
    assert idle_faults(result.history) == {0: "no request was sent through the router in it"}
    (fired,) = [e for e in result.history if isinstance(e, FaultInjected)]
    window = (fired.t, fired.t + (fired.duration or 0.0))
    samples = [e for e in result.history if isinstance(e, SampleGenerated)]
    assert not [s for s in samples if window[0] <= s.sent < window[1]]
    blocked = [e for e in result.history if isinstance(e, GroupPut) and e.fate is PutFate.BLOCKED]
    assert [e for e in blocked if e.t <= window[0]], "the buffer was full as the window opened"


def test_a_link_window_that_no_update_reached_passes_and_says_so(capsys) -> None:
    """Swarm seed 16833, shrunk: the filter keeps the rollout going past the slow_link window
    (4 to 6 nominal steps), so no bucket was sent in it; the run passes, and its report says
    that the window met nothing to act on."""
    path = FILES / "slow_link_while_the_filter_refills.toml"
    result = run_scenario(load_scenario_file(path), 16833)
    assert result.ok, result.failures()
    (fired,) = [e for e in result.history if isinstance(e, FaultInjected)]
    end = fired.t + (fired.duration or 0.0)
    sends = [e.t - e.seconds for e in result.history if isinstance(e, BucketReceived)]
    assert not [t for t in sends if fired.t <= t < end]
    assert [t for t in sends if t >= end], "the next update comes after the window"
    assert main(["run", str(path), "--seed", "16833"]) == 0
    assert "its window met nothing to act on: no bucket send began in it" in capsys.readouterr().out


def test_a_started_cell_never_healed_fails_its_witness(monkeypatch) -> None:
    import sim.run

    class NoStart(SimFaultActions):
        def start_cell(self, cell: int) -> None:
            pass

    monkeypatch.setattr(sim.run, "SimFaultActions", NoStart)
    witness = failing(run_scenario(SCENARIOS["cell_crash_before_allreduce"], 0))["fault_witness"]
    assert "the world never reported new processes for cell 1" in witness


# -- the restart-before-stamp window --------------------------------------------------------


def _events(result: SimResult, kind: type[Event]) -> list[Any]:
    return [e for e in result.history if isinstance(e, kind)]


@pytest.mark.parametrize("seed", range(5))
def test_an_engine_restarted_before_the_stamp_is_not_stamped_and_the_update_retries(
    seed: int,
) -> None:
    # 31f1ca9's retry of the whole update; today's miles gives up only the replaced process
    # and publishes to the rest (EngineGivenUp: scenarios/test_miles_deadlines.py)
    result = run_scenario(_aug2026(SCENARIOS["restart_before_stamp"]), seed)
    assert result.ok, result.failures()
    (started,) = _events(result, EngineStarted)
    assert [e.engine for e in _events(result, EngineExited)] == ["engine-1"]
    first = _events(result, UpdateBegan)[0]
    (aborted,) = _events(result, UpdateAborted)
    assert aborted.update_id == first.update_id and aborted.component == "engine-1"
    assert "replaced" in aborted.reason
    # every bucket of update 0 reached the old process only; the new one was never stamped by it
    buckets = [e for e in _events(result, BucketReceived) if e.update_id == first.update_id]
    assert {dict(zip(b.engines, b.incarnations, strict=True))["engine-1"] for b in buckets} == {0}
    stamps = [e for e in _events(result, EngineStamped) if e.engine == "engine-1"]
    assert all(e.update_id != first.update_id for e in stamps)
    retried = [e for e in stamps if e.incarnation == started.incarnation]
    assert retried and retried[0].version == first.version  # the retry brought it everything


def test_the_window_is_reached_at_other_buckets_and_after_later_steps() -> None:
    for bucket in range(4):
        for after in (None, 3):
            keys: dict[str, Any] = {"engine": "engine-0", "point": "after_bucket", "bucket": bucket}
            if after is not None:
                keys["after_step"] = after
            scenario = dataclasses.replace(
                _aug2026(SCENARIOS["restart_before_stamp"]),
                faults=(make_fault("restart_engine", **keys),),
            )
            result = run_scenario(scenario, 1)
            assert result.ok, f"bucket {bucket} after {after}: {result.failures()}"
            assert _events(result, UpdateAborted)


def _aug2026(scenario: Scenario) -> Scenario:
    """The scenario under miles at 31f1ca9 (an update retried whole when a process it was
    sending to was replaced)."""
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    return dataclasses.replace(scenario, loop=loop)


def _router_window(*sent: float) -> History:
    """A fail_router window opening at t=5 and requests sent at ``sent`` that all went through."""
    history = History([FaultInjected(t=5.0, index=0, fault=FaultKind.FAIL_ROUTER, duration=3.0)])
    for i, at in enumerate(sent):
        history.append(
            SampleGenerated(
                t=at + 1.0, group_id=i, prompt_id=i, sample=0, turn=0, engine="engine-0",
                incarnation=1, version=None, sent=at, engine_seconds=1.0,
            )
        )  # fmt: skip
    return history


def test_a_router_window_passes_requests_sent_at_its_opening_instant() -> None:
    """Sent at the very instant the window opened, a request may have left before the fault
    fired (history order at one instant): as for delay_router, only later ones must fail."""
    assert fault_witness(_router_window(5.0, 5.0)) is None
    witness = fault_witness(_router_window(5.0, 6.0))
    assert witness is not None and "none of the 1 request(s) sent during the window" in str(witness)
