"""The wait-for graph over asyncio (the Ray worlds' runtime): the same reading of the
coroutines as the simulator's, without Ray."""

from __future__ import annotations

import asyncio

from backends.common.world.runtime import AsyncioRuntime
from miles_core.sync import Lock


def test_the_graph_follows_a_task_to_the_lock_it_waits_on() -> None:
    async def main() -> tuple[str, tuple[str, ...]]:
        rt = AsyncioRuntime(0)
        lock = Lock(rt, "the weights lock")
        await lock.acquire("the sync of engine-1")  # never released: the planted leak

        async def update() -> None:
            await lock.acquire("step 3's train and update")

        async def loop() -> None:
            await rt.spawn(update(), "update-3")

        main_task = rt.spawn(loop(), "loop")
        await asyncio.sleep(0.05)
        graph = rt.waits()
        main_task.cancel("done")
        await asyncio.sleep(0)
        return graph.root(), graph.lines()

    root, lines = asyncio.run(main())
    assert root.startswith("'loop' -> 'update-3': waits on the weights lock, held by the sync of")
    assert any(line.startswith("update-3: awaits") and "Lock.acquire" in line for line in lines)
