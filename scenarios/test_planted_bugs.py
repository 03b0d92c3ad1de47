"""Planted control bugs: each is caught by an oracle over the named scenarios and the swarm.

A plant changes the control plane the way a user's own change might, then the
named scenarios (seed 0) and the first SWARM_SEEDS swarm seeds run with every
oracle. The test asserts that the oracle named for the bug fails on some run,
never that a scenario-specific check does; the share of swarm seeds that saw
it is printed (``pytest -s``) for the table in the README.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from miles_core.cells import CellGroup, Decision, Outcome
from miles_core.events import PromptDrawn
from miles_core.loop import update as update_module
from miles_core.loop.producer import Producer
from miles_core.loop.train import Trainer
from miles_core.loop.update import Updater
from miles_core.scenario import SCENARIOS
from miles_core.transfer import TransferMode
from miles_core.weight_update import FlushCache, PublishVersion, ResumeEngines, StampEngines
from sim.run import run_scenario
from sim.swarm import swarm_scenario

SWARM_SEEDS = 100

Plant = Callable[[pytest.MonkeyPatch], None]


def publish_after_resume(mp: pytest.MonkeyPatch) -> None:
    """The engines resume before the version is published (seed report on PR #2244, risk 3)."""
    import miles_core.weight_update as wu

    plan = wu.plan_update_actions

    def swapped(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        actions = list(plan(*args, **kwargs))
        publish = [i for i, a in enumerate(actions) if isinstance(a, PublishVersion)]
        if publish:
            i = publish[0]
            actions[i], actions[i + 1] = actions[i + 1], actions[i]
        return tuple(actions)

    mp.setattr(wu, "plan_update_actions", swapped)


def discarded_attempt_commits(mp: pytest.MonkeyPatch) -> None:
    """An attempt whose allreduce failed for some cell commits on the cells that finished."""
    finish = CellGroup.finish_attempt

    def lenient(self: CellGroup, outcomes: dict[int, Outcome]) -> Any:
        result = finish(self, outcomes)
        if result.decision is Decision.RETRY and result.discarded:
            self._step_attempts.pop(result.attempt.step, None)
            return dataclasses.replace(result, decision=Decision.COMMIT)
        return result

    mp.setattr(CellGroup, "finish_attempt", lenient)


def dead_cell_in_exchange(mp: pytest.MonkeyPatch) -> None:
    """A retry keeps the first attempt's exchange group, dead cell and all."""
    train_on = Trainer._train_on
    first: dict[int, tuple[int, ...]] = {}

    async def stale(
        self: Trainer, cell: int, step: int, attempt: int, batch: Any, cells: Any
    ) -> Any:
        return await train_on(self, cell, step, attempt, batch, first.setdefault(step, cells))

    mp.setattr(Trainer, "_train_on", stale)


def p2p_to_one_engine(mp: pytest.MonkeyPatch) -> None:
    """p2p sends each bucket to the first engine of the update only."""
    plan = update_module.plan_transfer

    def first_only(mode: Any, buckets: Any, engines: Any, *args: Any, **kwargs: Any) -> Any:
        result = plan(mode, buckets, engines, *args, **kwargs)
        if result.mode is TransferMode.P2P:
            return dataclasses.replace(result, transfers=result.transfers[:1])
        return result

    mp.setattr(update_module, "plan_transfer", first_only)


def recycled_never_regenerated(mp: pytest.MonkeyPatch) -> None:
    """Recycled prompts are queued but the producer always draws new ones."""

    def draw_new(self: Producer) -> int:
        prompt = next(self._prompts)
        self.ctx.emit(PromptDrawn, prompt_id=prompt)
        return prompt

    mp.setattr(Producer, "_next_prompt", draw_new)


def stamp_by_engine_id(mp: pytest.MonkeyPatch) -> None:
    """The original restart-before-stamp bug: the stamp and the resume go to whatever process
    serves the engine id now, not to the process that received the buckets."""
    run_action = Updater._run_action

    async def by_id(self: Updater, update_id: int, cell: int, action: Any, targets: Any) -> None:
        if isinstance(action, StampEngines | ResumeEngines):
            targets = {e: self.ctx.engines.incarnation(e) for e in targets}
        await run_action(self, update_id, cell, action, targets)

    mp.setattr(Updater, "_run_action", by_id)


def version_update_aborts_all(mp: pytest.MonkeyPatch) -> None:
    """The client posts only {"new_version": ...}: SGLang's default abort_all_requests=true
    aborts every request in flight at each update (miles #2589, #2296)."""
    each = Updater._each

    async def default_body(self: Updater, targets: Any, method: str, *args: Any, **kw: Any) -> Any:
        if method == "stamp":
            args = args[:1]  # the version only: the engine's default applies
        return await each(self, targets, method, *args, **kw)

    mp.setattr(Updater, "_each", default_body)


def flush_under_in_place(mp: pytest.MonkeyPatch) -> None:
    """The cache is flushed whatever the pause mode (miles #1497): under in_place the frozen
    requests still hold KV pages, and SGLang refuses."""
    import miles_core.weight_update as wu

    plan = wu.plan_update_actions

    def always_flush(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        actions = list(plan(*args, **kwargs))
        if not any(isinstance(a, FlushCache) for a in actions):
            actions.insert(1, FlushCache(actions[0].engines))
        return tuple(actions)

    mp.setattr(wu, "plan_update_actions", always_flush)


def staleness_from_final_version(mp: pytest.MonkeyPatch) -> None:
    """A sample keeps only the version it finished under, not every span's: a response that
    spanned updates looks fresher than it is (miles counts from the oldest)."""
    generate = Producer._generate_sample

    async def last_only(self: Producer, group_id: int, prompt_id: int, index: int) -> Any:
        sample = await generate(self, group_id, prompt_id, index)
        return dataclasses.replace(sample, weight_versions=sample.weight_versions[-1:])

    mp.setattr(Producer, "_generate_sample", last_only)


PLANTS: dict[str, tuple[Plant, str]] = {
    "publish_after_resume": (publish_after_resume, "update_order"),
    "discarded_attempt_commits": (discarded_attempt_commits, "step_attempts"),
    "dead_cell_in_exchange": (dead_cell_in_exchange, "step_attempts"),
    "p2p_to_one_engine": (p2p_to_one_engine, "update_order"),
    "recycled_never_regenerated": (recycled_never_regenerated, "recycled_regenerated"),
    "stamp_by_engine_id": (stamp_by_engine_id, "update_order"),
    "version_update_aborts_all": (version_update_aborts_all, "requests_kept"),
    "flush_under_in_place": (flush_under_in_place, "end_state"),
    "staleness_from_final_version": (staleness_from_final_version, "bounded_staleness"),
}


@contextlib.contextmanager
def planted(plant: Plant) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        plant(mp)
        yield


def sweep(plant: Plant, swarm_seeds: int = SWARM_SEEDS) -> tuple[Counter[str], Counter[str]]:
    """(oracles failed over the named scenarios, over the swarm seeds), run by run."""
    named: Counter[str] = Counter()
    swarm: Counter[str] = Counter()
    with planted(plant):
        for scenario in SCENARIOS.values():
            named.update(k for k, v in run_scenario(scenario, 0).verdicts.items() if v)
        for seed in range(swarm_seeds):
            result = run_scenario(swarm_scenario(seed), seed)
            swarm.update(k for k, v in result.verdicts.items() if v)
    return named, swarm


@pytest.mark.parametrize("bug", sorted(PLANTS))
def test_a_planted_bug_fails_its_oracle(bug: str) -> None:
    plant, oracle = PLANTS[bug]
    named, swarm = sweep(plant)
    print(
        f"\n{bug}: {oracle} failed on {named[oracle]}/{len(SCENARIOS)} named scenarios and "
        f"{swarm[oracle]}/{SWARM_SEEDS} swarm seeds; all oracles: named {dict(named)}, "
        f"swarm {dict(swarm)}"
    )
    assert named[oracle] + swarm[oracle] > 0, f"{bug} passed {oracle} everywhere"


def test_the_swarm_alone_catches_the_restart_before_stamp_bug() -> None:
    """The window was reachable only by hand; the swarm's drawn fault points reach it."""
    _, swarm = sweep(stamp_by_engine_id)
    assert swarm["update_order"] > 0
