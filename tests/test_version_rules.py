"""miles' weight-version hygiene under --miles-profile today (issue 50, item 7).

miles/utils/weight_version.py (3eacefd0): a trained span under "default" or a non-numeric
version, and more than max(3, --update-weights-interval + 1) rollouts without a published
version, fail the run (assertions). Under today the loop fails the run with
WeightVersionError (miles_core/loop/version_rules.py); under aug2026 (31f1ca9, no such
checks) an untrusted answer re-syncs its engine and nothing counts rollouts. The oracle
``weight_versions_sane`` judges any history for the same rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from miles_core.backend import VersionOutOfSync
from miles_core.events import Event, SampleGenerated, VersionPublished
from miles_core.kinds import RunStatus, SampleOutcome
from miles_core.loop.update import Updater
from miles_core.oracles.version_rules import weight_versions_sane
from miles_core.profile import MilesProfile
from miles_core.scenario.model import Scenario
from miles_core.version_rules import (
    PublishCounter,
    WeightVersionError,
    default_span,
    max_rollouts_without_publish,
)
from miles_core.weight_update import PublishVersion
from sim.run import SimResult, run_scenario
from sim.scenarios import SCENARIOS
from sim.world.cluster import SimCluster
from sim.world.router import SimRouter

ENGINE = "engine-1"

# -- the rules, pure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "stamped", "broken"),
    [
        ((None,), None, False),  # the initial weights (miles stamps them by its first update)
        ((3,), 3, False),
        ((3, 4), 3, False),
        ((None,), 3, True),  # "default" from a process stamped 3
        ((2, None), None, True),  # "default" after a numbered span of the same request
    ],
)
def test_a_default_span_breaks_the_rule_only_once_its_process_had_a_version(
    reported: tuple[int | None, ...], stamped: int | None, broken: bool
) -> None:
    why = default_span(reported, stamped)
    assert (why is not None) is broken, why
    if broken:
        assert "'default'" in why  # type: ignore[operator]


def test_the_limit_is_max_3_and_the_update_interval_plus_one() -> None:
    assert max_rollouts_without_publish() == 3
    assert max_rollouts_without_publish(1) == 3
    assert max_rollouts_without_publish(5) == 6


def test_the_counter_fails_at_more_than_the_limit_and_a_publish_resets_it() -> None:
    counter = PublishCounter()
    for _ in range(3):
        counter.rollout(None)
    counter.rollout(1)  # a newer version: back to 1
    counter.rollout(1)
    counter.rollout(1)
    with pytest.raises(WeightVersionError, match="served 4 rollouts without a published"):
        counter.rollout(1)


# -- in the simulator --------------------------------------------------------------------------


def _scenario(profile: MilesProfile, lora: bool = False) -> Scenario:
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(
        base.loop, miles_profile=profile, lora_adapter="adapter" if lora else None
    )
    return dataclasses.replace(base, loop=loop)


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SimCluster]]:
    made: list[SimCluster] = []
    init = SimCluster.__init__

    def keep(self: SimCluster, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(SimCluster, "__init__", keep)
    yield made


def _at_publish(clusters: list[SimCluster], act: Callable[[SimCluster], None]) -> Any:
    done: list[bool] = []

    def observe(e: Event) -> None:
        if isinstance(e, VersionPublished) and e.version == 3 and not done:
            done.append(True)
            act(clusters[-1])

    return observe


def _failed_with_weight_version_error(result: SimResult, words: str) -> None:
    report = result.report
    assert report.status is RunStatus.FAILED, report
    assert report.reason.startswith("WeightVersionError") and words in report.reason, report


def test_a_default_span_fails_the_run_under_today_and_resyncs_under_aug2026(
    clusters: list[SimCluster],
) -> None:
    """engine-1's version set back to "default" (None) from outside, after it was stamped 3."""

    def unversion(cluster: SimCluster) -> None:
        cluster.engines[ENGINE].version = None

    made = clusters
    today = run_scenario(_scenario(MilesProfile.TODAY), 0, observers=[_at_publish(made, unversion)])
    _failed_with_weight_version_error(today, "'default'")
    out = [e for e in today.history if isinstance(e, SampleGenerated)][-1]
    assert out.outcome is SampleOutcome.OUT_OF_SYNC and out.engine == ENGINE  # recorded first
    old = run_scenario(_scenario(MilesProfile.AUG2026), 0, observers=[_at_publish(made, unversion)])
    assert old.report.status is RunStatus.COMPLETED, old.report
    assert weight_versions_sane(old.history) is None  # re-synced: nothing of it was trained
    lora = run_scenario(
        _scenario(MilesProfile.TODAY, lora=True), 0, observers=[_at_publish(made, unversion)]
    )
    assert lora.report.status is RunStatus.COMPLETED, lora.report  # miles skips LoRA runs


def test_a_version_the_router_cannot_read_fails_the_run_under_today(
    clusters: list[SimCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Ray router raises for "abc" (router.py ``reported_version``): miles' second
    rule (``[0-9]+``). Under aug2026: tests/test_reported_versions.py (re-synced)."""
    armed: list[bool] = []
    generate = SimRouter.generate

    def reading(self: SimRouter, engine: str, incarnation: int, request: Any) -> Any:
        answer = generate(self, engine, incarnation, request)
        if engine != ENGINE or not armed:
            return answer

        async def unreadable() -> Any:
            await answer
            raise VersionOutOfSync(engine, "reported weight_version 'abc', not a version")

        return unreadable()

    monkeypatch.setattr(SimRouter, "generate", reading)
    made = clusters
    result = run_scenario(
        _scenario(MilesProfile.TODAY), 0, observers=[_at_publish(made, lambda c: armed.append(1))]
    )
    _failed_with_weight_version_error(result, "'abc', not a version")


def _never_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that never publishes (miles' assertion guards against one): every update
    runs but its PublishVersion action."""
    run_action = Updater._run_action

    async def skipping(self: Updater, update_id: int, cell: int, action: Any, targets: Any) -> Any:
        if isinstance(action, PublishVersion):
            return None
        return await run_action(self, update_id, cell, action, targets)

    monkeypatch.setattr(Updater, "_run_action", skipping)


def test_rollouts_without_a_published_version_fail_the_run_under_today(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _never_publish(monkeypatch)
    result = run_scenario(_scenario(MilesProfile.TODAY), 0)
    _failed_with_weight_version_error(result, "served 4 rollouts")
    old = run_scenario(_scenario(MilesProfile.AUG2026), 0)
    assert "WeightVersionError" not in old.report.reason
    verdict = weight_versions_sane(old.history)  # the oracle finds it in the aug2026 history
    assert verdict is not None and "without a published weight version" in str(verdict)


def test_the_oracle_passes_every_healthy_run_in_both_profiles() -> None:
    for profile in MilesProfile:
        result = run_scenario(_scenario(profile), 0)
        assert result.report.status is RunStatus.COMPLETED
        assert weight_versions_sane(result.history) is None
