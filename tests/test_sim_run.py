"""run_scenario's housekeeping: what it changes in the process, it puts back."""

from __future__ import annotations

import gc

from miles_core.events import SampleGenerated
from sim.run import run_scenario
from sim.scenarios import SCENARIOS


def test_a_run_leaves_the_garbage_collector_as_it_found_it() -> None:
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert run_scenario(SCENARIOS["no_failure"], 0, 1).ok
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_samples_of_the_same_span_versions_share_one_tuple() -> None:
    """A large run keeps a sample event per request, and the collector walks every tuple
    still alive when the run ends: equal span lists are one object."""
    history = run_scenario(SCENARIOS["no_failure"], 0, 4).history
    versions = [e.versions for e in history if isinstance(e, SampleGenerated)]
    assert len(set(versions)) < len(versions)  # some repeat (else this checks nothing)
    assert len({id(v) for v in versions}) == len(set(versions))


def test_an_answer_after_the_run_ended_is_not_recorded(monkeypatch) -> None:
    """A group's sample tasks learn of the run's end only when the group next runs; an
    answer that arrives first is no part of the run (CI saw one on the CPU backend)."""
    from miles_core.backend import GenerateRequest, GenerateResult
    from miles_core.events import RunEnded, SampleGenerated
    from miles_core.kinds import SampleOutcome
    from miles_core.loop.run import Orchestrator
    from miles_core.scenario.library import SCENARIOS
    from sim.run import run_scenario

    end = Orchestrator.end

    def end_then_answer(self: Orchestrator, *args, **kwargs):
        report = end(self, *args, **kwargs)
        late = GenerateResult("engine-0", None, False)
        self.producer._record(
            GenerateRequest(99, 99, 0), "engine-0", 0, 0.0, SampleOutcome.COMPLETED, late
        )
        return report

    monkeypatch.setattr(Orchestrator, "end", end_then_answer)
    history = list(run_scenario(SCENARIOS["no_failure"], 0).history)
    ended = next(i for i, e in enumerate(history) if isinstance(e, RunEnded))
    assert not any(isinstance(e, SampleGenerated) for e in history[ended:])
