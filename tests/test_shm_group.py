"""The shm update group (backends/common/wire/shm_group.py) between real processes.

Each test spawns its processes against a TCPStore of its own on loopback; a
process that fails raises in the test (torch.multiprocessing.spawn), and none
outlives it.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from backends.common.wire import shm_group
from backends.common.wire.shm_group import (
    NODE_KEY,
    PeerFailure,
    ShmArena,
    ShmGroup,
    ShmUnavailable,
    send_many,
)

HOST = "127.0.0.1"
CHUNK = shm_group.CHUNK
SIZES = (1, 4097, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 5, 5, 2 * CHUNK)
"""Within a piece, across pieces, growing the arena twice, then smaller again."""


def _store() -> dist.TCPStore:
    return dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )


def _group(port: int, prefix: str, rank: int, size: int, arena=None, seconds: float = 30.0):
    client = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=60))
    store = dist.PrefixStore(prefix, client)
    return ShmGroup(store, rank, size, datetime.timedelta(seconds=seconds), arena)


def _payload(size: int, index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * index + size)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)


def _fan_out(rank: int, port: int, receivers: int) -> None:
    """Broadcast on a group of everyone, then p2p on one pair group per receiver."""
    arena = ShmArena() if rank == 0 else None
    everyone = _group(port, "everyone", rank, receivers + 1, arena)
    if rank == 0:
        pairs = [_group(port, f"pair{r}", 0, 2, arena) for r in range(1, receivers + 1)]
    else:
        mine = _group(port, f"pair{rank}", 1, 2)
    for index, size in enumerate(SIZES):
        expected = _payload(size, index)
        if rank == 0:
            everyone.broadcast([expected.clone()])
            send_many(pairs, expected.clone())
            continue
        got = torch.zeros(size, dtype=torch.uint8)
        everyone.broadcast([got])
        assert torch.equal(got, expected), f"broadcast of {size} bytes differs"
        got.zero_()
        mine.broadcast([got])
        assert torch.equal(got, expected), f"p2p of {size} bytes differs"


def test_every_receiver_gets_the_bytes_exactly_by_broadcast_and_by_pairs() -> None:
    before = set(os.listdir("/dev/shm")) if Path("/dev/shm").is_dir() else set()
    store = _store()
    mp.spawn(_fan_out, args=(store.port, 3), nprocs=4, join=True)
    after = set(os.listdir("/dev/shm")) if Path("/dev/shm").is_dir() else set()
    assert after <= before, f"files left in /dev/shm: {after - before}"


def test_a_tensor_of_another_dtype_travels_as_its_bytes() -> None:
    store = _store()
    mp.spawn(_typed, args=(store.port,), nprocs=2, join=True)


def _typed(rank: int, port: int) -> None:
    arena = ShmArena() if rank == 0 else None
    group = _group(port, "typed", rank, 2, arena)
    values = torch.arange(1000, dtype=torch.bfloat16).reshape(10, 100) / 7
    tensor = values.clone() if rank == 0 else torch.zeros(10, 100, dtype=torch.bfloat16)
    group.broadcast([tensor])
    assert torch.equal(tensor, values)


def _broadcast_noting_failure(group: ShmGroup, tensor: torch.Tensor, out: str) -> None:
    """The broadcast, its PeerFailure written to ``out`` for the test to read."""
    try:
        group.broadcast([tensor])
    except PeerFailure as error:
        Path(out).write_text(str(error))


def _dies_before_receiving(rank: int, port: int, out: str) -> None:
    arena = ShmArena() if rank == 0 else None
    group = _group(port, "dies", rank, 2, arena, seconds=60)
    if rank == 1:
        os._exit(0)  # joined, then gone without a word
    while not group.header.pid(1):
        time.sleep(0.01)
    _broadcast_noting_failure(group, torch.ones(3 * CHUNK, dtype=torch.uint8), out)


def test_a_dead_receiver_is_named_not_waited_for(tmp_path: Path) -> None:
    out = tmp_path / "error.txt"
    store = _store()
    mp.spawn(_dies_before_receiving, args=(store.port, str(out)), nprocs=2, join=True)
    # the source's liveness check named the dead rank; the 60 s timeout never came into it
    assert "rank 1 (pid" in out.read_text() and "died" in out.read_text()


def _silent_receiver(rank: int, port: int, out: str) -> None:
    arena = ShmArena() if rank == 0 else None
    group = _group(port, "silent", rank, 2, arena, seconds=1)
    if rank == 1:
        time.sleep(3)  # alive, but never takes the bucket
        return
    _broadcast_noting_failure(group, torch.ones(10, dtype=torch.uint8), out)


def test_a_receiver_that_never_answers_meets_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "error.txt"
    store = _store()
    mp.spawn(_silent_receiver, args=(store.port, str(out)), nprocs=2, join=True)
    assert "rank 1 of the shm group did not finish the broadcast in 1 s" in out.read_text()


def _source_dies(rank: int, port: int, out: str) -> None:
    arena = ShmArena() if rank == 0 else None
    group = _group(port, "source", rank, 2, arena, seconds=60)
    if rank == 0:
        while not group.header.pid(1):  # the receiver joined
            time.sleep(0.01)
        time.sleep(0.2)  # and is waiting for the first piece
        os._exit(0)
    _broadcast_noting_failure(group, torch.zeros(10, dtype=torch.uint8), out)


def test_a_dead_source_is_named_by_its_receivers(tmp_path: Path) -> None:
    out = tmp_path / "error.txt"
    store = _store()
    mp.spawn(_source_dies, args=(store.port, str(out)), nprocs=2, join=True)
    assert "rank 0 (pid" in out.read_text() and "died" in out.read_text()


def test_a_receiver_on_another_node_is_refused_naming_gloo() -> None:
    store = dist.HashStore()
    store.set(NODE_KEY, "elsewhere/0000")
    with pytest.raises(ShmUnavailable, match="source's node; use gloo across nodes"):
        ShmGroup(store, 1, 2, datetime.timedelta(seconds=1), None)


def test_only_rank_zero_sends_and_only_host_tensors_travel() -> None:
    store = dist.HashStore()
    with pytest.raises(ValueError, match="needs its ShmArena"):
        ShmGroup(store, 0, 2, datetime.timedelta(seconds=1), None)
    group = ShmGroup(store, 0, 1, datetime.timedelta(seconds=1), ShmArena())
    options = dist.BroadcastOptions()
    options.rootRank = 1
    with pytest.raises(ValueError, match="from rank 0"):
        group.broadcast([torch.zeros(4, dtype=torch.uint8)], options)
    with pytest.raises(ValueError, match="contiguous host tensors"):
        group.broadcast([torch.zeros(4, 4).t()])
    group.broadcast([torch.zeros(4, dtype=torch.uint8)])  # a group of one: nobody to wait for


def test_an_arena_grows_by_a_new_segment_and_never_reuses_a_generation() -> None:
    arena = ShmArena()
    first, _ = arena.reserve(10)
    same, _ = arena.reserve(CHUNK)
    grown, view = arena.reserve(CHUNK + 1)
    assert same == first and first.capacity == CHUNK
    assert grown.capacity == 2 * CHUNK and grown.generation > first.generation
    assert view.numel() == grown.capacity
    other, _ = ShmArena().reserve(10)
    assert other.generation not in (first.generation, grown.generation)


# -- the wire as the CPU backend offers it ---------------------------------------------


def test_a_cuda_engine_refuses_an_shm_group_naming_the_backend() -> None:
    import asyncio

    from backends.common.engine.requests import BadRequest
    from backends.common.engine.weights import EngineWeights

    weights = EngineWeights(torch.nn.Linear(2, 2), "cuda")
    body = {
        "backend": "shm",
        "master_address": HOST,
        "master_port": 1,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
    }
    with pytest.raises(BadRequest, match="shm moves host memory") as caught:
        asyncio.run(weights.join(body))
    assert caught.value.field == "backend"


def test_the_shm_wire_is_a_cpu_stack_only() -> None:
    from backends.common.stack import Stack, Wire

    assert Stack(wire=Wire.SHM).collective_backend == "shm"
    with pytest.raises(ValueError, match="device cpu only"):
        Stack(device="cuda", wire=Wire.SHM)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--wire", "shm", "--address", "10.0.0.1:6379"], ("--wire", "pass --wire gloo")),
        (["--wire", "tcp"], ("--wire", "invalid choice")),
    ],
)
def test_a_wire_the_run_cannot_use_exits_2_before_ray(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv, words
) -> None:
    from backends.common.run import command as cli
    from backends.cpu.__main__ import main

    monkeypatch.setattr(cli, "run_real", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as caught:
        main(["run", "--steps", "1", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


def test_the_replay_line_keeps_the_wire() -> None:
    from backends.common.run.flags import build_parser, replay_line
    from backends.cpu.stack import CPU

    parser, _ = build_parser(CPU)
    args = parser.parse_args(["run", "--wire", "shm", "--seed", "3"])
    line = replay_line(CPU, args, 4)
    assert line.startswith("python -m backends.cpu run --wire shm --seed 3 --steps 4")
    default = replay_line(CPU, parser.parse_args(["run"]), 4)
    assert default == "python -m backends.cpu run --seed 0 --steps 4"  # gloo is not spelt


def test_a_receiver_joining_a_dead_source_is_told_it_died() -> None:
    import subprocess
    import sys

    from backends.common.wire.shm_group import HEADER_KEY, node_id

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store = dist.HashStore()
    store.set(NODE_KEY, node_id())
    store.set(HEADER_KEY, f"{gone.pid},3")
    with pytest.raises(PeerFailure, match=f"rank 0 \\(pid {gone.pid}\\) of the shm group died"):
        ShmGroup(store, 1, 2, datetime.timedelta(seconds=1), None)


def test_a_dead_sources_mapping_is_dropped_when_another_is_mapped(monkeypatch) -> None:
    """An engine outlives trainer cells: the mapping of a killed cell's arena would keep
    its pages (a bucket's worth) alive for as long as the engine runs."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    received = {(gone.pid, 5): (1, torch.zeros(1)), (os.getpid(), 999): (1, torch.zeros(1))}
    monkeypatch.setattr(shm_group, "_RECEIVED", received)
    arena = ShmArena()
    segment, mine = arena.reserve(10)
    mine[:3] = torch.tensor([7, 8, 9], dtype=torch.uint8)
    view = shm_group._arena_view(segment)
    assert view[:3].tolist() == [7, 8, 9]  # the same pages, mapped again through /proc
    assert set(received) == {(os.getpid(), 999), (os.getpid(), segment.fd)}


def test_a_zombie_peer_counts_as_dead() -> None:
    """An exited process its parent has not reaped yet reads nothing: a waiter must not wait
    for it until the timeout."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while "Z" not in Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2][:3]:
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    assert not shm_group._alive(child.pid)  # exited, not yet reaped
    child.wait()
    assert not shm_group._alive(child.pid) and shm_group._alive(os.getpid())
