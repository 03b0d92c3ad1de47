"""A trainer cell's weight-update ticket lock in the Ray world (backends/common/wire/
cell_lock.py; miles/utils/distributed_lock.py ``StoreTicketLock``, 4d412b5a, held per bucket
by protocols/broadcast.py ``send_bucket``, 069a4115): ranks in threads over a real TCPStore.
The whole run is tests/test_cpu_backend.py's conformance case lock_held_fails_over."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch.distributed as dist

from backends.common.wire.cell_lock import LockWait, describe, raise_holding, send_in_turn
from miles_core.waits import await_frames, party_of

WORLD = "cell0.0"
NAME = "cell 0's weight-update lock (process 0)"


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _rank_store(store: dist.TCPStore) -> dist.PrefixStore:
    """What a rank's lock is over: its cell's prefix of the world's store."""
    return dist.PrefixStore(WORLD, dist.TCPStore("127.0.0.1", store.port, is_master=False))


def _ranks(store: dist.TCPStore, parts: list, barrier: threading.Barrier) -> list[threading.Thread]:
    threads = [
        threading.Thread(
            target=send_in_turn,
            args=(_rank_store(store), rank, len(parts), barrier.wait, part),
            daemon=True,
        )
        for rank, part in enumerate(parts)
    ]
    for thread in threads:
        thread.start()
    return threads


def test_each_bucket_draws_in_rank_order_and_releases(store: dist.TCPStore) -> None:
    order: list[int] = []
    for _ in range(3):  # three buckets
        barrier = threading.Barrier(2)
        parts = [lambda r=r: order.append(r) or 0.0 for r in range(2)]
        for thread in _ranks(store, parts, barrier):
            thread.join(10)
    assert order == [0, 1] * 3  # rank 0's ticket first each time: the simulator's order
    text, rank0_waits = describe(store, WORLD, NAME)
    assert text == f"{NAME}: free (serving ticket 6); waiting: none" and not rank0_waits


def test_a_rank_that_raised_holding_it_is_named_and_rank_0_waits(store: dist.TCPStore) -> None:
    said = raise_holding(_rank_store(store), 1, "injected: boom")
    assert said == "RuntimeError: injected: boom"  # caught in the rank: it lives on
    sent: list[int] = []
    threads = _ranks(store, [lambda: sent.append(0) or 0.0, lambda: 0.0], threading.Barrier(2))
    time.sleep(0.3)
    assert sent == [] and all(t.is_alive() for t in threads)  # nothing expires
    text, rank0_waits = describe(store, WORLD, NAME)
    assert rank0_waits
    assert text == (
        f"{NAME}: ticket 0 held by rank 1, which raised holding it and stays alive (fail "
        "closed, no lease: RuntimeError: injected: boom); waiting: ticket 1 (rank 0), "
        "ticket 2 (rank 1)"
    )
    store.add(f"{WORLD}/weight-update-lock/serving", 1)  # by hand: the queue moves on in order
    for thread in threads:
        thread.join(10)
    assert sent == [0] and describe(store, WORLD, NAME)[0].endswith(
        "(serving ticket 3); waiting: none"
    )


def test_a_part_that_raises_keeps_the_lock(store: dist.TCPStore) -> None:
    def broken() -> float:
        raise ValueError("the rank's own bug")

    with pytest.raises(ValueError, match="own bug"):
        send_in_turn(_rank_store(store), 0, 1, lambda: None, broken)
    text, _ = describe(store, WORLD, NAME)
    assert "ticket 0 held by rank 0, which raised holding it" in text
    assert "ValueError: the rank's own bug" in text


def test_a_failed_collective_frees_the_lock_as_the_cell_miles_kills_would(
    store: dist.TCPStore,
) -> None:
    """gloo raises RuntimeError when a peer engine dies mid-broadcast; miles kills the cell
    whose actors raised (lock and store with it), the testbed retries on the same cell: a
    free lock, as in the simulator."""

    def peer_died() -> float:
        raise RuntimeError("gloo: connection reset")

    with pytest.raises(RuntimeError, match="connection reset"):
        send_in_turn(_rank_store(store), 0, 1, lambda: None, peer_died)
    text, _ = describe(store, WORLD, NAME)
    assert "free (serving ticket 1)" in text


def test_the_wait_for_graph_names_the_lock_of_a_task_waiting_through_it() -> None:
    async def scenario() -> str | None:
        stuck = asyncio.get_running_loop().create_future()

        async def calls() -> None:
            await stuck

        task = asyncio.ensure_future(LockWait(lambda: "the lock, held by rank 1").wait(calls()))
        await asyncio.sleep(0)
        party = party_of(await_frames(task.get_coro()))
        task.cancel()
        return party

    assert asyncio.run(scenario()) == "the lock, held by rank 1"
