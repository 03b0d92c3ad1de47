"""miles_core.sync.join_all: the tasks a cancelled waiter joined end with it, in both worlds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.common.aio_runtime import AsyncioRuntime
from miles_core.runtime import Cancelled, Runtime
from miles_core.sync import join_all
from sim.runtime import SimRuntime


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
