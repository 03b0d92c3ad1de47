"""A weight-update group over shared memory: what NCCL does within a node, for the CPU world.

gloo moves a bucket through loopback sockets, at about half the rate of a copy
through shared memory on this machine (backends/bench: the best gloo way 0.3x to
0.7x of the ``shm`` ceilings). NCCL within a node uses no sockets either: peers
read each other's buffers and signal through flags in shared memory. An
``ShmGroup`` does that on CPU, with the members and the ``broadcast`` call of a
gloo group, so the trainer's send and the engine's receive are the same code:

- the source (rank 0) copies the bucket into its ``ShmArena``, a memfd segment
  that every receiver maps through /proc/<pid>/fd (so no file outlives the
  processes), in ``CHUNK``-byte pieces; each receiver copies piece k into its
  weights while the source writes piece k+1;
- the group's ``Header`` (a small memfd of its own) carries the flags: how many
  pieces the source has published, where the arena is, and how many broadcasts
  each receiver has finished. The source returns only when every receiver holds
  the bytes, so the arena is free again. gloo's small messages cost 0.1 to 1 ms
  each here (measured: 0.13-0.36 ms to one receiver, about 1 ms to four), a flag
  costs microseconds;
- a waiter sleeps on its flag (a futex: backends/common/wire/futex.py), so engines
  that outnumber the cores take none from the trainer while it writes (polling
  did: with four engines on two cores the ``shm`` ceiling's gloo-blocked
  receivers beat it), and every ``LIVENESS_SECONDS`` it checks that the peer it
  waits for is alive: a dead peer is an error naming it at once (as a broken
  gloo connection is), a live one that never answers meets ``timeout`` (gloo's).

The flags are ordered by x86's store order (total store order): the bytes of a
piece are stored before the count that publishes them. The arena belongs to the
source process and is shared by all its groups, so p2p's pair groups cost one
write per bucket, not one per engine (``send_many``). Every member must be on the
source's node: a receiver elsewhere is refused when it joins.
"""

from __future__ import annotations

import itertools
import mmap
import os
import platform
import socket
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from backends.common.wire import futex

CHUNK = 4 * 1024**2
"""Bytes per published piece: the receivers' copy of piece k overlaps the source's write of
k+1, so smaller pieces leave a shorter tail (backends/bench)."""
NODE_KEY = "shm-node"
HEADER_KEY = "shm-header"
LIVENESS_SECONDS = 0.05
"""How often a waiter looks whether the peer it waits for is still alive."""
_GENERATIONS = itertools.count(1)
"""Segment numbers, unique in a process: (pid, generation) names one segment."""
ORDERED_MACHINES = frozenset(("x86_64", "AMD64"))
"""Machines whose stores are seen in program order, and whose futex call futex.py knows."""


class ShmUnavailable(RuntimeError):
    """A member of an shm group cannot share the source's memory (another node, or a
    machine whose stores are not ordered)."""


class PeerFailure(RuntimeError):
    """A peer of an shm group died or stopped answering in a broadcast."""


def node_id() -> str:
    """This machine as the kernel sees it: the host name and this boot's id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.exists() else '?'}"


def new_memfd(nbytes: int, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    return fd


def map_fd(fd: int, nbytes: int) -> torch.Tensor:
    """A read-write uint8 view of ``nbytes`` bytes of the file behind ``fd``."""
    return torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)


def map_peer(pid: int, fd: int, nbytes: int) -> torch.Tensor:
    """Another process's memfd, mapped here through /proc (the same pages, no copy)."""
    try:
        mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    except OSError as error:
        raise ShmUnavailable(f"cannot map process {pid}'s segment: {error}") from None
    try:
        return map_fd(mine, nbytes)
    finally:
        os.close(mine)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped by its parent) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@dataclass(frozen=True)
class Segment:
    """Where a receiver finds the arena: the source's pid and fd, its generation, its size."""

    pid: int
    fd: int
    generation: int
    capacity: int


class ShmArena:
    """The source's segment: a memfd, replaced by a larger one when a bucket does not fit
    (receivers keep the old mapping until a header names the new one)."""

    def __init__(self) -> None:
        self.segment: Segment | None = None
        self.view: torch.Tensor | None = None
        weakref.finalize(self, self._close_fd, self)

    def reserve(self, nbytes: int) -> tuple[Segment, torch.Tensor]:
        if self.segment is None or self.segment.capacity < nbytes:
            self.close()
            capacity = -(-max(nbytes, 1) // CHUNK) * CHUNK
            fd = new_memfd(capacity, "miles-weight-update")
            self.segment = Segment(os.getpid(), fd, next(_GENERATIONS), capacity)
            self.view = map_fd(fd, capacity)
        assert self.view is not None
        return self.segment, self.view

    @staticmethod
    def _close_fd(arena: ShmArena) -> None:
        arena.close()

    def close(self) -> None:
        if self.segment is not None:
            os.close(self.segment.fd)
        self.segment, self.view = None, None


class Header:
    """The group's flags, int64 slots in a memfd of the source's:

    ``[0]`` pieces published (over all broadcasts), ``[1:5]`` the arena's Segment,
    ``[8 + r]`` broadcasts finished by rank r, ``[8 + size + r]`` rank r's pid."""

    PUBLISHED, SEGMENT = 0, slice(1, 5)

    def __init__(self, slots: torch.Tensor, size: int) -> None:
        self.slots, self.size = slots, size

    @classmethod
    def nbytes(cls, size: int) -> int:
        return -(-8 * (8 + 2 * size) // 4096) * 4096

    @staticmethod
    def done_slot(rank: int) -> int:
        return 8 + rank

    def address(self, slot: int) -> int:
        return self.slots.data_ptr() + 8 * slot

    def ring(self, slot: int, value: int) -> None:
        """Set a flag (each is written by one process only) and wake whoever waits on it."""
        self.slots[slot] = value
        futex.wake(self.address(slot))

    def pid(self, rank: int) -> int:
        return int(self.slots[8 + self.size + rank])

    def segment(self) -> Segment:
        pid, fd, generation, capacity = (int(v) for v in self.slots[self.SEGMENT].tolist())
        return Segment(pid, fd, generation, capacity)


_RECEIVED: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
"""A receiver process's arena mappings: (pid, fd) -> (generation, view). One mapping per
segment, whatever the number of groups (a new group per update would map and fault it in
again); a new generation behind the same fd means the old segment is gone, and a dead
source's mappings are dropped when another is mapped (they hold its pages alive)."""


def _arena_view(segment: Segment) -> torch.Tensor:
    key = (segment.pid, segment.fd)
    found = _RECEIVED.get(key)
    if found is None or found[0] != segment.generation:
        for gone in [k for k in _RECEIVED if k[0] != segment.pid and not _alive(k[0])]:
            del _RECEIVED[gone]
        view = map_peer(segment.pid, segment.fd, segment.capacity)
        found = _RECEIVED[key] = (segment.generation, view)
    return found[1]


def _pieces(nbytes: int) -> list[tuple[int, int]]:
    return [(a, min(a + CHUNK, nbytes)) for a in range(0, max(nbytes, 1), CHUNK)]


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("an shm group moves contiguous host tensors only: use gloo or nccl")
    return tensor.view(torch.uint8).reshape(-1)


class _Done:
    """The work of a call that finished before it returned (gloo's ``wait`` has nothing left)."""

    def wait(self, timeout: Any = None) -> bool:
        return True


class ShmGroup:
    """A group whose ``broadcast`` from rank 0 goes through the source's arena."""

    def __init__(
        self, store: Any, rank: int, size: int, timeout: timedelta, arena: ShmArena | None
    ) -> None:
        if platform.machine() not in ORDERED_MACHINES:
            raise ShmUnavailable(
                f"shm groups rely on x86's store order; this is {platform.machine()}: use gloo"
            )
        if rank == 0 and arena is None:
            raise ValueError("the source of an shm group needs its ShmArena")
        self.rank, self.size, self.arena = rank, size, arena
        self.timeout = timeout.total_seconds()
        self.rounds = 0
        """Broadcasts this member took part in (every member calls each one)."""
        self.published = 0
        """Pieces published in this group so far (the source's count, a receiver's mirror)."""
        nbytes = Header.nbytes(size)
        if rank == 0:
            fd = new_memfd(nbytes, "miles-update-flags")
            self.header = Header(map_fd(fd, nbytes).view(torch.int64), size)
            weakref.finalize(self, os.close, fd)
            store.set(NODE_KEY, node_id())
            store.set(HEADER_KEY, f"{os.getpid()},{fd}")
        else:
            here, source = node_id(), store.get(NODE_KEY).decode()
            if source != here:
                raise ShmUnavailable(
                    f"rank {rank} is on {here}, the source on {source}: an shm group needs "
                    "every member on the source's node; use gloo across nodes"
                )
            pid, fd = (int(v) for v in store.get(HEADER_KEY).decode().split(","))
            try:
                view = map_peer(pid, fd, nbytes)
            except ShmUnavailable:
                if not _alive(pid):
                    raise PeerFailure(f"rank 0 (pid {pid}) of the shm group died") from None
                raise
            self.header = Header(view.view(torch.int64), size)
        self.header.slots[8 + size + rank] = os.getpid()

    def broadcast(self, tensors: Sequence[torch.Tensor], options: Any = None) -> _Done:
        """Rank 0's ``tensors[0]`` into every member's; returns when all hold it."""
        if options is not None and options.rootRank != 0:
            raise ValueError("an shm group broadcasts from rank 0 (the trainer) only")
        (tensor,) = tensors
        if self.rank == 0:
            send_many([self], tensor)
        else:
            self._receive(_flat(tensor))
        return _Done()

    def _receive(self, flat: torch.Tensor) -> None:
        for a, b in _pieces(flat.numel()):
            self.published += 1
            self.wait_for(Header.PUBLISHED, self.published, 0, "publish a piece")
            segment = self.header.segment()
            if segment.capacity < flat.numel():
                raise ValueError(
                    f"the source's segment holds {segment.capacity} bytes, this receiver "
                    f"expects {flat.numel()}: the members disagree on the bucket"
                )
            flat[a:b].copy_(_arena_view(segment)[a:b])
        self.rounds += 1
        self.header.ring(Header.done_slot(self.rank), self.rounds)

    def wait_for(self, slot: int, target: int, peer: int, what: str) -> None:
        """Sleep until flag ``slot`` (written by ``peer`` alone) reaches ``target``; a dead
        peer raises within LIVENESS_SECONDS, a live one that never writes at the timeout."""
        slots, address = self.header.slots, self.header.address(slot)
        started = time.monotonic()
        while (seen := int(slots[slot])) < target:
            futex.wait(address, seen, LIVENESS_SECONDS)
            if int(slots[slot]) >= target:
                return
            pid = self.header.pid(peer)
            if pid and not _alive(pid):
                raise PeerFailure(f"rank {peer} (pid {pid}) of the shm group died")
            if time.monotonic() - started > self.timeout:
                raise PeerFailure(
                    f"rank {peer} of the shm group did not {what} in {self.timeout:g} s"
                )


def send_many(groups: Sequence[ShmGroup], tensor: torch.Tensor) -> None:
    """The source's side of one broadcast on each group at once: each piece written once into
    the arena and published on every group; returns when every receiver holds the bytes."""
    flat = _flat(tensor)
    arena = groups[0].arena
    if arena is None or any(g.arena is not arena or g.rank != 0 for g in groups):
        raise ValueError("send_many sends from one source's arena: every group must be its own")
    segment, view = arena.reserve(flat.numel())
    for group in groups:
        group.header.slots[Header.SEGMENT] = torch.tensor(
            [segment.pid, segment.fd, segment.generation, segment.capacity]
        )
    for a, b in _pieces(flat.numel()):
        view[a:b].copy_(flat[a:b])
        for group in groups:
            group.published += 1
            group.header.ring(Header.PUBLISHED, group.published)
    for group in groups:
        group.rounds += 1
        for rank in range(1, group.size):
            group.wait_for(Header.done_slot(rank), group.rounds, rank, "finish the broadcast")
