"""An attempt's cross-cell group: how long a rank can be held joining it, and that its
cell-mates' own collectives outlast that (a CI run lost a live cell when they did not)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import time

import pytest
import torch
import torch.distributed as dist

from backends.common.wire import groups
from backends.common.wire.groups import (
    CELL_TIMEOUT,
    GLOO_TIMEOUT,
    JOIN_BOUND,
    attempt_group,
    attempt_key,
    gloo_group,
)


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_a_peer_that_arrived_and_never_made_its_group_fails_the_join_at_the_rendezvous_bound(
    store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer counts itself in and dies before gloo's rendezvous: the join fails after
    ATTEMPT_RENDEZVOUS, not after the group's collective timeout (gloo waits for the
    others' addresses with the group's timeout, whatever the store's)."""
    monkeypatch.setattr(groups, "ATTEMPT_RENDEZVOUS", datetime.timedelta(seconds=1))
    store.add(f"{attempt_key(3, 1)}/rank0/arrived", 1)  # the peer, arrived
    began = time.monotonic()
    with pytest.raises(RuntimeError):
        attempt_group(
            ("127.0.0.1", store.port), 3, 1, rank=0, position=0, members=2,
            timeout=datetime.timedelta(seconds=20),
        )  # fmt: skip
    assert time.monotonic() - began < 10


def _member(port: int, rank: int, late: float, results: mp.Queue) -> None:
    group = gloo_group(
        ("127.0.0.1", port), "g", rank, 2,
        timeout=datetime.timedelta(seconds=30), rendezvous=datetime.timedelta(seconds=1),
    )  # fmt: skip
    time.sleep(late)
    try:
        total = torch.ones(2)
        group.allreduce([total]).wait()
        results.put((rank, float(total[0])))
    except RuntimeError as error:
        results.put((rank, str(error)[:80]))


def test_a_group_made_with_a_short_rendezvous_keeps_its_collective_timeout(
    store: dist.TCPStore,
) -> None:
    """A member 4 s late to the exchange is waited for: the rendezvous's 1 s bounds only
    the making of the group."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    members = [ctx.Process(target=_member, args=(store.port, r, 4.0 * r, results)) for r in (0, 1)]
    for p in members:
        p.start()
    try:
        got = dict(results.get(timeout=120) for _ in members)
    finally:
        for p in members:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert got == {0: 2.0, 1: 2.0}


def test_a_cells_own_collectives_outlast_any_wait_on_another_cell() -> None:
    """Between two of its cell's collectives a rank may wait a whole join or a whole
    exchange on another cell; its cell-mates must not time out first."""
    assert CELL_TIMEOUT > JOIN_BOUND
    assert CELL_TIMEOUT > GLOO_TIMEOUT
