"""A weight version an engine reports that the control plane cannot trust (issue 52, item 1).

SGLang's /update_weight_version takes any string from anyone, and so does the CPU engine:
"abc", a lower number, 100,000 digits. The Ray world's router used to ``int()`` what the
engine reported and the run ended crashed with a ValueError. Now a version the router cannot
read is VersionOutOfSync, and a readable one below the process's last stamp (or beyond any
version an update sent) is judged by the producer: either way that engine is out of sync,
out of rotation and re-synced to the published version, the sample unused, and the oracles
judge the run as any other.

The control plane's part runs in the simulator (milliseconds a run): the engine's version is
changed from outside mid-run, as the HTTP call would change it. The router's part runs the
Ray world's router against a fake engine reply (no Ray).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from miles_core.backend import GenerateRequest, VersionOutOfSync
from miles_core.engines import EngineState
from miles_core.events import (
    EngineRecoveryAsked,
    EngineStamped,
    EngineStateChanged,
    Event,
    SampleGenerated,
    VersionPublished,
)
from miles_core.kinds import SampleOutcome
from miles_core.profile import MilesProfile
from miles_core.versions import untrusted_version
from sim.run import SimResult, run_scenario
from sim.scenarios import SCENARIOS
from sim.world.cluster import SimCluster
from sim.world.router import SimRouter

ENGINE = "engine-1"


# -- the decision, pure ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "stamped", "published", "why"),
    [
        ((3,), 3, 3, None),
        ((3, 4), 3, 3, None),  # lived across the update to 4 (stamped, not yet published)
        ((None,), None, None, None),  # never updated: SGLang's "default"
        ((2,), 3, 3, "weight_version 2 after version 3"),
        ((3, 1), 3, 3, "1 after version 3"),
        ((1, 2, 1), 1, 3, "1 after version 2 (its stamp, or an earlier span"),
        ((None,), 3, 3, "no version"),
        ((99,), 3, 3, "above 4, the newest"),
        ((5,), None, 3, "above 4, the newest"),
    ],
)
def test_a_reported_version_is_trusted_only_between_its_stamp_and_the_newest_issued(
    reported: tuple[int | None, ...], stamped: int | None, published: int | None, why: str | None
) -> None:
    verdict = untrusted_version(reported, stamped, published)
    if why is None:
        assert verdict is None
    else:
        assert verdict is not None and why in verdict, verdict


# -- the Ray world's router reads what the engine reported -----------------------------------


class _Engine:
    doomed = False

    def __init__(self, version: Any) -> None:
        self.version = version

    async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        meta = {
            "weight_version": self.version,
            "weight_versions": [self.version],
            "finish_reason": {"type": "length"},
            "e2e_latency": 0.01,
        }
        return {"output_ids": [5, 6], "meta_info": meta}


class _Task:
    max_new_tokens = 2

    def prompt(self, prompt_id: int) -> list[int]:
        return [1, 3, 4, 2]

    async def score(self, *args: Any) -> float:
        return 1.0


class _Cluster:
    """What RayRouter reads of its cluster (router.py's RouterCluster), one engine."""

    def __init__(self, version: Any) -> None:
        self.settings = type("Settings", (), {"seed": 0, "miles_today": True})()
        self.engines = {ENGINE: _Engine(version)}
        self.task = _Task()
        self.faults = type("Faults", (), {"fire": lambda *a, **k: None})()
        self.http = None
        self.rewards: dict[int, tuple[float, ...]] = {}

    def spawn(self, coro: Any, name: str) -> None:
        coro.close()

    def slowdown(self, what: str) -> float:
        return 1.0

    def impaired(self, what: str) -> bool:
        return False


def _answer(version: Any) -> Any:
    pytest.importorskip("ray", reason="the Ray world's router needs the cpu extra")
    from backends.common.world.router import RayRouter

    router = RayRouter(_Cluster(version))  # type: ignore[arg-type]
    return asyncio.run(router.generate(ENGINE, 0, GenerateRequest(0, 0, 0)))


@pytest.mark.parametrize(
    "version",
    ["abc", "-1", "1e3", " 7", "", "\u0663", "9" * 19, "9" * 100_000, None, 7, [1]],
    ids=[
        *("abc", "negative", "float", "space", "empty", "arabic-3", "19-digits"),
        *("100k-digits", "null", "json-int", "list"),
    ],
)
def test_a_version_the_router_cannot_read_is_out_of_sync_not_a_crash(version: Any) -> None:
    """Before: ValueError (int("abc"), or int() of 100,000 digits past sys.int_max_str_digits)
    ended the run crashed; "\u0663" (an Arabic 3) even passed int() as 3."""
    with pytest.raises(VersionOutOfSync) as caught:
        _answer(version)
    assert caught.value.engine == ENGINE
    assert "not a version" in caught.value.reason
    assert len(caught.value.reason) < 300  # 100,000 digits are not copied into the history


READABLE = [("default", None), ("12", 12), ("9" * 18, 10**18 - 1)]


@pytest.mark.parametrize(("version", "read"), READABLE)
def test_a_version_the_router_can_read_is_read(version: str, read: int | None) -> None:
    result = _answer(version)
    assert result.weight_version == read and result.versions == (read,)


# -- the control plane: the engine's version changed from outside, in the simulator ----------


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SimCluster]]:
    """Every SimCluster a run makes, so that a test can reach its engines mid-run."""
    made: list[SimCluster] = []
    init = SimCluster.__init__

    def keep(self: SimCluster, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(SimCluster, "__init__", keep)
    yield made


def _when_published(
    clusters: list[SimCluster], version: int, act: Callable[[SimCluster], None]
) -> Callable[[Event], None]:
    """An observer that acts once, as ``version`` is published (the engines still paused)."""
    done: list[bool] = []

    def observe(e: Event) -> None:
        if isinstance(e, VersionPublished) and e.version == version and not done:
            done.append(True)
            act(clusters[-1])

    return observe


def _stamp_from_outside(version: Any) -> Callable[[SimCluster], None]:
    """What POST /update_weight_version {"new_version": ..., "abort_all_requests": false}
    does to engine-1's process: its version changes, nothing else."""

    def act(cluster: SimCluster) -> None:
        cluster.engines[ENGINE].version = version

    return act


def _judged_and_resynced(result: SimResult, why: str) -> None:
    """The run completed and every oracle passed; engine-1 answered out of sync once the
    version changed, left rotation naming why, and was stamped again (by a sync, or by the
    update a step holding the weights lock ends with) before it served again."""
    failed = {name: str(v) for name, v in result.verdicts.items() if v}
    assert result.report.status.value == "completed" and not failed, (result.report, failed)
    history = list(result.history)
    out = [
        e
        for e in history
        if isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.OUT_OF_SYNC
    ]
    assert out and {e.engine for e in out} == {ENGINE}
    changes = [e for e in history if isinstance(e, EngineStateChanged) and e.engine == ENGINE]
    (left,) = [e for e in changes if e.new is EngineState.UNSYNCED]
    assert left.old is EngineState.SERVING and why in left.reason, left.reason
    restamped = [  # by a sync, or by the next update when a step holds the weights lock
        e for e in history if isinstance(e, EngineStamped) and e.engine == ENGINE and e.t >= left.t
    ]
    published = [e.version for e in history if isinstance(e, VersionPublished) and e.t <= left.t]
    assert restamped and restamped[0].version >= published[-1]
    back = [e for e in changes if e.t >= restamped[0].t]
    assert back and back[0].new is EngineState.SERVING
    served = [  # it served again, under trusted versions only
        e
        for e in history
        if isinstance(e, SampleGenerated)
        and e.engine == ENGINE
        and e.sent > back[0].t
        and e.outcome is SampleOutcome.COMPLETED
    ]
    assert served


@pytest.mark.parametrize(
    ("version", "why"),
    [(1, "its version went backwards"), (99, "above 4, the newest any update sent")],
    ids=["backwards", "ahead"],
)
def test_an_engine_whose_version_is_changed_from_outside_is_resynced(
    clusters: list[SimCluster], version: int, why: str
) -> None:
    """Before: the run went on serving samples labelled with a version no update sent, and
    the oracles failed it (published_weights: "reported 1 but was stamped 3")."""
    scenario = SCENARIOS["no_failure"]
    observer = _when_published(clusters, 3, _stamp_from_outside(version))
    result = run_scenario(scenario, seed=0, observers=[observer])
    _judged_and_resynced(result, why)


def test_an_answer_after_the_resume_is_judged_by_the_stamp_it_was_resumed_with(
    clusters: list[SimCluster],
) -> None:
    """Set back to 2 as 3 is published: a request the update retracted was sent under 2 and
    its every span says 2, so only the stamp the engine was resumed with (3) shows that its
    answer is wrong (the CPU world's run with "1" stamped from outside got such an answer
    through, and published_weights failed it)."""
    observer = _when_published(clusters, 3, _stamp_from_outside(2))
    result = run_scenario(SCENARIOS["no_failure"], seed=0, observers=[observer])
    _judged_and_resynced(result, "weight_version 2 after version 3 (its stamp")


def test_a_version_the_router_cannot_read_gets_the_engine_resynced(
    clusters: list[SimCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated router raises what the Ray world's raises for "abc". Under aug2026:
    today's miles fails the run instead (tests/test_version_rules.py)."""
    broken: list[bool] = []
    generate = SimRouter.generate

    def reading(self: SimRouter, engine: str, incarnation: int, request: Any) -> Any:
        answer = generate(self, engine, incarnation, request)
        if engine != ENGINE or not broken or broken[0]:
            return answer

        async def unreadable() -> Any:
            await answer
            broken[0] = True
            raise VersionOutOfSync(engine, "reported weight_version 'abc', not a version")

        return unreadable()

    monkeypatch.setattr(SimRouter, "generate", reading)
    observer = _when_published(clusters, 3, lambda cluster: broken.append(False))
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(base.loop, miles_profile=MilesProfile.AUG2026)
    result = run_scenario(dataclasses.replace(base, loop=loop), seed=0, observers=[observer])
    _judged_and_resynced(result, "'abc', not a version")


def test_before_any_version_is_published_the_engine_is_replaced(
    clusters: list[SimCluster],
) -> None:
    """Nothing to re-stamp it with: the process is failed, and fault tolerance replaces it
    (a new process reports "default" again); the run completes and the oracles pass."""
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(base.loop, use_fault_tolerance=True)
    scenario = dataclasses.replace(base, loop=loop)
    armed: list[bool] = []

    def observe(e: Event) -> None:
        if isinstance(e, SampleGenerated) and e.engine == ENGINE and not armed:
            armed.append(True)
            clusters[-1].engines[ENGINE].version = 7  # no update sent anything yet

    result = run_scenario(scenario, seed=0, observers=[observe])
    failed = {name: str(v) for name, v in result.verdicts.items() if v}
    assert result.report.status.value == "completed" and not failed, (result.report, failed)
    history = list(result.history)
    (down,) = [
        e
        for e in history
        if isinstance(e, EngineStateChanged) and e.engine == ENGINE and e.new is EngineState.DOWN
    ]
    assert "above 1, the newest any update sent" in down.reason
    assert "no version was published to re-stamp it" in down.reason
    assert any(isinstance(e, EngineRecoveryAsked) and e.engine == ENGINE for e in history)
