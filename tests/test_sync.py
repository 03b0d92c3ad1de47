"""miles_core.sync.join_all: the tasks a cancelled waiter joined end with it, in both worlds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.common.world.runtime import AsyncioRuntime
from miles_core.runtime import Cancelled, Runtime
from miles_core.sync import join_all
from sim.world.runtime import SimRuntime


async def _cancel_a_joining_waiter(rt: Runtime, unit: float) -> tuple[list[str], bool]:
    """A waiter joins two workers and is cancelled before either ends: what the workers
    recorded, and whether the waiter saw its own cancellation."""
    recorded: list[str] = []

    async def worker(name: str, seconds: float) -> str:
        await rt.sleep(seconds)
        recorded.append(name)  # what a sample recording SampleGenerated stands for
        return name

    async def waiter() -> Any:
        tasks = [rt.spawn(worker(n, s), n) for n, s in (("a", 2 * unit), ("b", 3 * unit))]
        return await join_all(rt, tasks, "the waiter was cancelled")

    joining = rt.spawn(waiter(), "waiter")
    await rt.sleep(unit)
    joining.cancel("the run ended")
    await rt.sleep(4 * unit)  # long past both workers' ends
    try:
        await joining
    except (Cancelled, asyncio.CancelledError):
        return recorded, True
    return recorded, False


def test_a_cancelled_waiter_cancels_the_tasks_it_joined_in_the_simulator() -> None:
    rt = SimRuntime(seed=0)
    recorded, cancelled = rt.run(_cancel_a_joining_waiter(rt, 1.0))
    assert cancelled
    assert recorded == []


def test_a_cancelled_waiter_cancels_the_tasks_it_joined_on_asyncio() -> None:
    async def main() -> tuple[list[str], bool]:
        return await _cancel_a_joining_waiter(AsyncioRuntime(seed=0), 0.05)

    recorded, cancelled = asyncio.run(main())
    assert cancelled
    assert recorded == []


def test_join_all_gives_every_result_in_order_when_nobody_cancels() -> None:
    rt = SimRuntime(seed=1)

    async def worker(value: int) -> int:
        await rt.sleep(3 - value)
        return value

    async def main() -> list[int]:
        return await join_all(rt, [rt.spawn(worker(v), f"w{v}") for v in range(3)], "unused")

    assert rt.run(main()) == [0, 1, 2]


def test_a_crashed_task_cancels_the_others_it_was_joined_with() -> None:
    rt = SimRuntime(seed=2)
    recorded: list[str] = []

    async def crash() -> None:
        await rt.sleep(1)
        raise ValueError("boom")

    async def slow() -> None:
        await rt.sleep(5)
        recorded.append("slow")

    async def main() -> None:
        with pytest.raises(ValueError, match="boom"):
            await join_all(rt, [rt.spawn(crash(), "crash"), rt.spawn(slow(), "slow")], "crash")
        await rt.sleep(10)

    rt.run(main())
    assert recorded == []


# -- rt.gather: the same contract in both worlds; the simulator makes tasks only of waits --


async def _gather_mixed(rt: Runtime, unit: float) -> tuple[list[str], float, list[str]]:
    """Three calls, one answering at once and two after waits of 2 and 1 units: their
    results, how long the gather took, and the order they finished in."""
    finished: list[str] = []

    async def call(name: str, units: int) -> str:
        if units:
            await rt.sleep(units * unit)
        finished.append(name)
        return name.upper()

    started = rt.now()
    results = await rt.gather([call("a", 2), call("b", 0), call("c", 1)], ["a", "b", "c"], "x")
    return results, (rt.now() - started) / unit, finished


@pytest.mark.parametrize("world", ["simulator", "asyncio"])
def test_gather_gives_results_in_order_and_runs_the_calls_at_once(world: str) -> None:
    if world == "simulator":
        rt: Runtime = SimRuntime(seed=3)
        results, units, finished = rt.run(_gather_mixed(rt, 1.0))  # type: ignore[attr-defined]
    else:

        async def main() -> tuple[list[str], float, list[str]]:
            return await _gather_mixed(AsyncioRuntime(seed=3), 0.2)

        results, units, finished = asyncio.run(main())
    assert results == ["A", "B", "C"]
    assert finished == ["b", "c", "a"]
    assert 2.0 <= units < 2.9  # concurrent: the longest wait, not the sum (3)


async def _gather_failing(rt: Runtime, unit: float, at_once: bool) -> tuple[str, list[str]]:
    """A call fails (at once, or after one unit) while another waits 3 units: what the
    waiter caught, and what the calls recorded once the waiter had gone on for 5 units."""
    recorded: list[str] = []

    async def slow() -> None:
        await rt.sleep(3 * unit)
        recorded.append("slow")  # must not happen: the gather's failure cancelled it

    async def refuse() -> None:
        if not at_once:
            await rt.sleep(unit)
        raise ValueError("engine-1 refused")

    try:
        await rt.gather([slow(), refuse()], ["slow", "refuse"], "a call failed")
        caught = "nothing"
    except ValueError as error:
        caught = str(error)
    await rt.sleep(5 * unit)
    return caught, recorded


@pytest.mark.parametrize("at_once", [True, False], ids=["fails-at-once", "fails-later"])
@pytest.mark.parametrize("world", ["simulator", "asyncio"])
def test_a_failed_call_of_a_gather_raises_and_cancels_the_others(world: str, at_once: bool) -> None:
    if world == "simulator":
        rt = SimRuntime(seed=4)
        caught, recorded = rt.run(_gather_failing(rt, 1.0, at_once))
    else:

        async def main() -> tuple[str, list[str]]:
            return await _gather_failing(AsyncioRuntime(seed=4), 0.02, at_once)

        caught, recorded = asyncio.run(main())
    assert caught == "engine-1 refused"
    assert recorded == []


def test_a_cancelled_gather_cancels_its_calls_in_both_worlds() -> None:
    async def cancelled(rt: Runtime, unit: float) -> tuple[list[str], bool]:
        recorded: list[str] = []

        async def call(name: str, units: int) -> None:
            await rt.sleep(units * unit)
            recorded.append(name)

        async def waiter() -> Any:
            return await rt.gather([call("a", 2), call("b", 3)], ["a", "b"], "waiter cancelled")

        joining = rt.spawn(waiter(), "waiter")
        await rt.sleep(unit)
        joining.cancel("the run ended")
        await rt.sleep(4 * unit)
        try:
            await joining
        except (Cancelled, asyncio.CancelledError):
            return recorded, True
        return recorded, False

    sim = SimRuntime(seed=5)
    assert sim.run(cancelled(sim, 1.0)) == ([], True)

    async def on_asyncio() -> tuple[list[str], bool]:
        return await cancelled(AsyncioRuntime(seed=5), 0.05)

    assert asyncio.run(on_asyncio()) == ([], True)


def test_the_simulator_makes_a_task_only_of_a_call_that_waits() -> None:
    """A call that answers at once runs inside its caller (the active task is the caller's)
    and costs no SimPy event; one that waits goes on in a task of its own name."""
    rt = SimRuntime(seed=6)
    ran_in: dict[str, list[str]] = {}

    async def call(name: str, waits: bool) -> str:
        ran_in[name] = [rt.env._active_task.name]  # type: ignore[union-attr]
        if waits:
            await rt.sleep(1)
            ran_in[name].append(rt.env._active_task.name)  # type: ignore[union-attr]
        return name

    async def main() -> list[str]:
        return await rt.gather(
            [call(f"e{i}", i == 3) for i in range(5)], [f"pause-e{i}" for i in range(5)], "x"
        )

    assert rt.run(main()) == [f"e{i}" for i in range(5)]
    assert ran_in == {
        "e0": ["main"],
        "e1": ["main"],
        "e2": ["main"],
        "e3": ["main", "pause-e3"],
        "e4": ["main"],
    }
    assert rt.env.processed == 2  # the one sleep, and main's end
