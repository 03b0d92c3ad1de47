"""An update's call to one engine (``Updater._call``) ends with the update.

With fault tolerance the call runs as a task of its own, raced against the health
check's timeout (aug2026); under the today profile every control call does, raced against
--update-weight-engine-request-timeout (``CellIsolation.call``, cell_isolation.py). When the
update is cancelled (the run ends, a failover), that task is cancelled with it: a pause or a
stamp of an update nobody waits for any more must not reach the engine afterwards and change
it unrecorded. Both profiles' paths are run here.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from miles_core.loop.cell_isolation import CellIsolation
from miles_core.loop.engine_calls import EngineCall
from miles_core.loop.update import Updater, _CallNames
from miles_core.runtime import Cancelled
from sim.world.runtime import SimRuntime


class _Engine:
    """An engine whose pause takes a second to act."""

    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self.paused_at: float | None = None

    async def pause(self) -> None:
        await self.rt.sleep(1.0)
        self.paused_at = self.rt.now()


PAUSE = EngineCall("pause", lambda engine: engine.pause())  # type: ignore[attr-defined]
"""A pause as the updater makes it, to this test's engine (which takes no mode)."""


PROFILES = pytest.mark.parametrize("today", [False, True], ids=["aug2026", "today"])
"""aug2026: the health check's timeout in ``Updater._call``; today: ``CellIsolation.call``."""


def _updater(rt: SimRuntime, engine: _Engine, today: bool) -> Updater:
    updater = Updater.__new__(Updater)  # only what _call reads
    updater.ctx = SimpleNamespace(  # type: ignore[assignment]
        rt=rt,
        engines=SimpleNamespace(current=lambda engine, incarnation: True),
        cluster=SimpleNamespace(engine=lambda engine_id, incarnation: engine),
        config=SimpleNamespace(
            use_fault_tolerance=True,
            rollout_health_check_timeout=5.0,
            today=today,
            lora_adapter=None,
            update_weight_engine_request_timeout=5.0,
        ),
    )
    # no give-up is reached here (every call answers within 5 s or is cancelled)
    updater.isolation = CellIsolation(updater.ctx, SimpleNamespace(), lambda *_: None)  # type: ignore[arg-type]
    return updater


@PROFILES
def test_a_cancelled_update_cancels_its_call_to_the_engine(today: bool) -> None:
    rt = SimRuntime(0)
    engine = _Engine(rt)
    updater = _updater(rt, engine, today)

    async def main() -> str:
        call = rt.spawn(updater._call("engine-0", 0, PAUSE, lambda e, answer: None), "call")
        await rt.sleep(0.5)
        call.cancel("the update was cancelled")
        try:
            await call
        except Cancelled as cancelled:
            reason = cancelled.reason
        await rt.sleep(2.0)
        return reason

    assert rt.run(main()) == "the update was cancelled"
    assert engine.paused_at is None  # the pause never acted for the cancelled update


@PROFILES
def test_a_call_that_answers_in_time_acts_and_is_answered(today: bool) -> None:
    rt = SimRuntime(0)
    engine = _Engine(rt)
    answered: list[str] = []

    async def main() -> object:
        return await _updater(rt, engine, today)._call(
            "engine-0", 0, PAUSE, lambda e, answer: answered.append(e)
        )

    assert rt.run(main()) is None
    assert engine.paused_at == 1.0 and answered == ["engine-0"]


def test_an_updates_call_names_are_made_only_when_asked_for() -> None:
    names = _CallNames("pause", ("engine-0", "engine-1"))
    assert len(names) == 2
    assert list(names) == ["pause-engine-0", "pause-engine-1"]
    assert names[1] == "pause-engine-1"
    assert names[:1] == ["pause-engine-0"]
