"""miles' two retries, in the simulator: a request the router fails and a refused flush.

miles retries a failed generate request (``_post``, miles/utils/http_utils.py: 60 tries,
1 s apart, then the error ends the fully-async worker and the step) and a refused
/flush_cache (``SGLangEngine.flush_cache``: 60 tries, 1 s after each, then TimeoutError;
a connection error at once). Here --request-max-retries / --request-retry-interval and
--flush-cache-max-retries / --flush-cache-retry-interval, with those defaults; the waits
are the runtime's, so the simulator charges their time.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter, defaultdict
from typing import Any

import pytest

from miles_core.backend import EngineFailure, RequestRefused
from miles_core.errors import ConfigError
from miles_core.events import (
    EngineGivenUp,
    EnginesFlushed,
    FlushRefused,
    GroupDropped,
    GroupRecycled,
    RequestRetried,
    SampleGenerated,
    UpdateAborted,
    UpdateSessionOpened,
)
from miles_core.kinds import AbortCause, RunStatus, SampleOutcome
from miles_core.loop import LoopConfig
from miles_core.loop.flags import with_flags
from miles_core.profile import MilesProfile
from miles_core.report.summary import summary
from miles_core.report.trace import chrome_trace
from miles_core.scenario import SCENARIOS
from miles_core.scenario.faults import make_fault
from sim.run import SimResult, run_scenario
from sim.world.engine import SimEngine

WINDOW = (10.0, 30.0)


def _failing_router(duration: float = 20.0, **loop: Any) -> SimResult:
    """no_failure with the router failing every request for ``duration`` s from t=10 within
    a millisecond, about as fast as the Ray world's (the simulator's takes 0.5 s by
    default, which hid a retry loop with no back-off)."""
    base = SCENARIOS["no_failure"]
    scenario = dataclasses.replace(
        base,
        timing=dataclasses.replace(base.timing, router_failure_seconds=0.001),
        loop=dataclasses.replace(base.loop, **loop),
        faults=(make_fault("fail_router", at=WINDOW[0], duration=duration),),
    )
    return run_scenario(scenario, 0)


def test_a_router_that_fails_at_once_costs_time_not_groups() -> None:
    """Each in-flight sample tries again once per interval: at most one try per sample per
    second of the window, each after a full interval, and no group is lost to the outage.
    (Before, every failure aborted its group: with the Ray router failing at once, the
    unused-samples handler recycled 51,680 groups in 3 to 4 s.)"""
    result = _failing_router()
    assert result.ok, result.failures()
    retries = [e for e in result.history if isinstance(e, RequestRetried)]
    assert retries and all(WINDOW[0] <= e.sent < WINDOW[1] for e in retries)
    loop = result.scenario.loop
    in_flight = loop.in_flight_groups * loop.n_samples_per_prompt
    per_second = Counter(int(e.sent) for e in retries)
    assert max(per_second.values()) <= in_flight, per_second
    assert len(retries) <= in_flight * (WINDOW[1] - WINDOW[0] + 1)
    tries: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in result.history:  # every try's send, a request's retried ones and its last
        if isinstance(e, RequestRetried | SampleGenerated):
            tries[(e.group_id, e.sample)].append(e.sent)
    for retry in retries:  # the next try went out one interval after the failure, not sooner
        sends = tries[(retry.group_id, retry.sample)]
        assert sends[retry.attempt] == pytest.approx(retry.t + loop.request_retry_interval)
    samples = [e for e in result.history if isinstance(e, SampleGenerated)]
    assert not any(s.outcome is SampleOutcome.ROUTER_FAILED for s in samples)
    assert not any(isinstance(e, GroupRecycled | GroupDropped) for e in result.history)
    info = summary(result.scenario, result.seed, result.history, result.report, result.verdicts)
    assert (info["requests_retried"], info["flushes_refused"]) == (len(retries), 0)
    instants = [e for e in chrome_trace(result.history)["traceEvents"] if e["ph"] == "i"]
    assert sum(e["name"] == "request retried" for e in instants) == len(retries)


def test_the_retry_interval_paces_the_tries() -> None:
    """Twice the interval, about half the tries (counted in simulated time)."""
    one = _failing_router()
    two = _failing_router(request_retry_interval=2.0)
    assert two.ok, two.failures()
    count = [sum(isinstance(e, RequestRetried) for e in r.history) for r in (one, two)]
    assert 0 < count[1] < 0.6 * count[0], count


def test_after_the_last_request_try_the_run_fails_as_miles_does() -> None:
    """A router down longer than the tries last: the last failure ends the run, named."""
    result = _failing_router(duration=60.0, request_max_retries=3, request_retry_interval=0.5)
    report = result.report
    assert report.status is RunStatus.FAILED, report.reason
    assert type(report.error).__name__ == "RequestFailedError"
    assert "on all 3 tries, 0.5s apart" in report.reason
    assert "--request-max-retries" in report.reason
    last = [e for e in result.history if isinstance(e, SampleGenerated) and e.aborted]
    assert last and last[0].outcome is SampleOutcome.ROUTER_FAILED
    retried = [
        e.attempt
        for e in result.history
        if isinstance(e, RequestRetried)
        and (e.group_id, e.sample) == (last[0].group_id, last[0].sample)
    ]
    assert retried == [1, 2]  # tries 1 and 2 were retried; the third was the last


# -- flush -----------------------------------------------------------------------------


def _refusing(monkeypatch, times: int | None, engines: tuple[str, ...] = ()) -> Counter[str]:
    """Test hook: each engine's /flush_cache is refused its first ``times`` calls (every call
    with None), as SGLang refuses while requests still drain; the calls are counted."""
    calls: Counter[str] = Counter()
    original = SimEngine.flush_cache

    async def flush_cache(self: SimEngine) -> None:
        calls[self.id] += 1
        if (not engines or self.id in engines) and (times is None or calls[self.id] <= times):
            raise RequestRefused(self.id, "planted: requests are still draining")
        await original(self)

    monkeypatch.setattr(SimEngine, "flush_cache", flush_cache)
    return calls


def test_a_flush_refused_three_times_then_accepted_lets_the_update_go_on(monkeypatch) -> None:
    calls = _refusing(monkeypatch, 3)
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.ok, result.failures()
    refused = [e for e in result.history if isinstance(e, FlushRefused)]
    engines = SCENARIOS["no_failure"].world.engine_ids
    assert {(e.engine, e.attempt) for e in refused} == {(g, a) for g in engines for a in (1, 2, 3)}
    assert all(e.update_id == 0 for e in refused)
    for engine in engines:  # one interval between tries, the fourth accepted
        times = [e.t for e in refused if e.engine == engine]
        assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx([1.0, 1.0])
        assert calls[engine] == 3 + len(result.report.versions)
    (flushed,) = [e for e in result.history if isinstance(e, EnginesFlushed) and e.update_id == 0]
    assert flushed.engines == engines and flushed.t == pytest.approx(refused[-1].t + 1.0)
    opened = [e for e in result.history if isinstance(e, UpdateSessionOpened)]
    assert opened[0].t >= flushed.t and len(result.report.versions) == 8
    info = summary(result.scenario, result.seed, result.history, result.report, result.verdicts)
    assert (info["requests_retried"], info["flushes_refused"]) == (0, 3 * len(engines))


def test_after_the_last_flush_try_the_update_fails_as_miles_does(monkeypatch) -> None:
    """miles: TimeoutError after 60 refusals; here FlushTimeoutError, after the flag's tries
    (each followed by the interval, the last too, as miles sleeps before it raises)."""
    _refusing(monkeypatch, None)
    scenario = SCENARIOS["no_failure"]
    loop = dataclasses.replace(scenario.loop, flush_cache_max_retries=4)
    result = run_scenario(dataclasses.replace(scenario, loop=loop), 0)
    report = result.report
    assert report.status is RunStatus.FAILED and isinstance(report.error, TimeoutError)
    assert type(report.error).__name__ == "FlushTimeoutError"
    assert "refused /flush_cache on all 4 tries, 1s apart" in report.reason
    assert "planted: requests are still draining" in report.reason
    refused = [e for e in result.history if isinstance(e, FlushRefused)]
    attempts = Counter(e.engine for e in refused)
    assert max(attempts.values()) == 4 and report.versions == []
    assert result.history[len(result.history) - 1].t == pytest.approx(refused[-1].t + 1.0)


@pytest.mark.parametrize("profile", list(MilesProfile))
def test_a_dead_engines_flush_is_not_tried_again(monkeypatch, profile: MilesProfile) -> None:
    """An EngineFailure (miles' connection error) is not a refusal: its flush was called
    once. aug2026: it fails the update at once, the engine taken out and the update retried
    without it. today: it gives up that engine alone and the update goes on with the others
    (cell_isolation.py; rollout_cell_updater.py ``submit_client_call``, 3eacefd0)."""
    calls: Counter[str] = Counter()
    original = SimEngine.flush_cache

    async def flush_cache(self: SimEngine) -> None:
        calls[self.id] += 1
        if self.id == "engine-1":
            raise EngineFailure(self.id, "planted: connection refused")
        await original(self)

    monkeypatch.setattr(SimEngine, "flush_cache", flush_cache)
    scenario = SCENARIOS["no_failure"]
    loop = dataclasses.replace(scenario.loop, miles_profile=profile)
    result = run_scenario(dataclasses.replace(scenario, loop=loop), 0)
    assert result.report.status is RunStatus.COMPLETED, result.report.reason
    assert calls["engine-1"] == 1
    assert not any(isinstance(e, FlushRefused) for e in result.history)
    aborted = [e for e in result.history if isinstance(e, UpdateAborted)]
    given_up = [e for e in result.history if isinstance(e, EngineGivenUp)]
    if profile is MilesProfile.AUG2026:
        assert not given_up and len(aborted) == 1
        assert (aborted[0].cause, aborted[0].component) == (AbortCause.ENGINE, "engine-1")
    else:
        assert not aborted and len(given_up) == 1
        assert (given_up[0].engine, given_up[0].call) == ("engine-1", "flush_cache")
        assert "planted: connection refused" in given_up[0].reason


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("request_max_retries", 0, "--request-max-retries: got 0; pass an integer >= 1"),
        ("request_retry_interval", 0, "--request-retry-interval: got 0; pass seconds > 0"),
        ("flush_cache_max_retries", 1.5, "--flush-cache-max-retries: got 1.5; pass an integer"),
        ("flush_cache_retry_interval", -1, "--flush-cache-retry-interval: got -1; pass seconds"),
    ],
)
def test_a_bad_retry_flag_names_the_flag_and_the_fix(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        with_flags(LoopConfig(steps=1), {field: value})
    assert str(caught.value).startswith(message)


def test_the_retry_defaults_are_miles() -> None:
    loop = LoopConfig(steps=1)
    assert (loop.request_max_retries, loop.request_retry_interval) == (60, 1.0)
    assert (loop.flush_cache_max_retries, loop.flush_cache_retry_interval) == (60, 1.0)
