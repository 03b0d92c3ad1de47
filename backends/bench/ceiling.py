"""The ceiling: the fastest way this machine moves the payload into every receiver process.

The old ceiling (one flat gloo broadcast) was beaten by methods it should bound,
so it was no ceiling. Now several ways are measured in every block of trials,
interleaved with the methods, and the report takes the fastest of them in each
repeat: a method above that is a way the ceiling missed, a bug in the ceiling,
and the report flags it.

- ``flat-bcast``: one broadcast of one flat tensor in the group of everyone;
- ``flat-pairs``: one flat broadcast per (source, receiver) pair group, all at once;
- ``flat-sendrecv``: a send of the flat tensor to each receiver at once (recv on theirs);
- ``flat-chunks``: the flat tensor in ``CHUNKS`` pieces, every piece to every pair group
  at once (several messages in flight beat one large one, as ``inflight`` showed);
- ``shm``: the source copies the flat tensor into a shared-memory segment (a memfd of
  the source's that every process maps through /proc), a one-element
  broadcast says it is there, each receiver copies it into its own flat tensor;
- ``shm-pipe``: the same in ``CHUNKS`` chunks, so receivers copy chunk k while
  the source writes chunk k+1;
- ``shm-flags``: the flat tensor in one broadcast of an shm group
  (backends/common/wire/shm_group.py): pieces of ``shm_group.CHUNK`` bytes, each
  published by a flag in shared memory instead of a gloo token (microseconds
  instead of 0.1 to 1 ms), the pipelining of ``shm-pipe`` without its tokens'
  cost. The CPU backend's ``--wire shm`` sends buckets this way, so without this
  way the backend beat the ceiling.

The first four are the wire the backend is bound to (gloo on CPU, NCCL on CUDA);
the shared-memory ways are CPU only. ``memcpy`` (one copy inside the source) moves
nothing between processes: it is shown as a bound, not taken into the ceiling.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch
import torch.distributed as dist

from backends.common.wire.shm_group import map_fd, map_peer, new_memfd

WIRE_CEILINGS = ("flat-bcast", "flat-pairs", "flat-sendrecv", "flat-chunks")
SHM_CEILINGS = ("shm", "shm-pipe", "shm-flags")
CEILINGS = WIRE_CEILINGS + SHM_CEILINGS
CHUNKS = 8


def ceilings_for(backend: str) -> tuple[str, ...]:
    """The ways measured: shared memory only where the tensors live in host memory."""
    return CEILINGS if backend == "gloo" else WIRE_CEILINGS


class CeilingRank(Protocol):
    """What a ceiling's trial reads of a process's side of the bench (methods.Rank): its
    groups and buffers, not the methods that share them."""

    rank: int
    receivers: int
    everyone: Any
    pairs: dict[int, Any]
    flat: torch.Tensor
    shared: torch.Tensor | None
    shm_everyone: Any
    token: torch.Tensor

    @property
    def is_source(self) -> bool: ...


def start_broadcast(group: Any, tensor: torch.Tensor) -> Any:
    """A broadcast from rank 0 of ``group``, started: the caller waits on the work."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([tensor], options)


def run_ceiling(rank: CeilingRank, method: str) -> None:
    """One trial of one way; a receiver's trial ends with the bytes in its flat tensor."""
    if method == "flat-bcast":
        start_broadcast(rank.everyone, rank.flat).wait()
    elif method == "flat-pairs":
        groups = rank.pairs.values() if rank.is_source else [rank.pairs[rank.rank]]
        for work in [start_broadcast(g, rank.flat) for g in groups]:
            work.wait()
    elif method == "flat-sendrecv":
        if rank.is_source:
            works = [rank.everyone.send([rank.flat], r, 0) for r in range(1, rank.receivers + 1)]
            for work in works:
                work.wait()
        else:
            rank.everyone.recv([rank.flat], 0, 0).wait()
    elif method == "flat-chunks":
        groups = list(rank.pairs.values()) if rank.is_source else [rank.pairs[rank.rank]]
        pieces = _chunks(rank.flat.numel(), CHUNKS)
        works = [start_broadcast(g, rank.flat[a:b]) for a, b in pieces for g in groups]
        for work in works:
            work.wait()
    elif method == "shm-flags":
        if rank.shm_everyone is None:
            raise ValueError("no shm group: the shm ceilings are CPU only")
        rank.shm_everyone.broadcast([rank.flat])
    elif method in SHM_CEILINGS:
        _shared_copy(rank, CHUNKS if method == "shm-pipe" else 1)
    else:
        raise ValueError(f"unknown ceiling {method!r}")


def _shared_copy(rank: CeilingRank, chunks: int) -> None:
    """Source: flat -> segment, chunk by chunk, each followed by a token broadcast that
    tells the receivers it is there; receivers: segment -> flat after each token."""
    shared = rank.shared
    if shared is None:
        raise ValueError("no shared-memory segment: the shm ceilings are CPU only")
    token = rank.token
    for start, end in _chunks(shared.numel(), chunks):
        if rank.is_source:
            shared[start:end].copy_(rank.flat[start:end])
        start_broadcast(rank.everyone, token).wait()
        if not rank.is_source:
            rank.flat[start:end].copy_(shared[start:end])


def _chunks(nbytes: int, chunks: int) -> list[tuple[int, int]]:
    step = -(-nbytes // chunks)
    return [(a, min(a + step, nbytes)) for a in range(0, nbytes, step)]


SEGMENT_KEY = "ceiling-segment"


def shared_segment(store: Any, rank: int, nbytes: int) -> torch.Tensor:
    """The shm ceilings' segment as a uint8 tensor: a memfd of rank 0's (nothing named in
    /dev/shm, so a killed run leaves nothing there: the kernel frees it with the last
    process that maps it), which the others map through /proc once rank 0 has said where."""
    if rank == 0:
        fd = new_memfd(nbytes, "transfer-bench-ceiling")
        view = map_fd(fd, nbytes)  # the mapping keeps the pages; the fd stays for the peers
        store.set(SEGMENT_KEY, f"{os.getpid()},{fd}")
        return view
    pid, fd = (int(v) for v in store.get(SEGMENT_KEY).decode().split(","))
    return map_peer(pid, fd, nbytes)
