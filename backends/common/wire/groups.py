"""Weight-update groups, torch only: the collective groups a trainer and its engines make for
each update (gloo, NCCL, or shared memory), and how a bucket is broadcast over one.

A bucket on the wire is what the update body's ``load_format`` says: absent (miles'
distributed path), one broadcast per tensor in the body's order (``broadcast_each``);
``flattened_bucket``, SGLang's packed buffer (sglang/srt/weight_sync/tensor_bucket.py,
FlattenedTensorBucket): each tensor's bytes back to back, no padding. SGLang's
receiver refuses a tensor whose byte offset is not a multiple of its item size, and
so does ours (``wire_spans``). miles_core's aligned staging spans stay the plan's
layout for RDT, where registered buffers need them.

Kept apart from the policy (which imports transformers) and the actors (which
import ray) so the transfer benchmark times exactly this code in processes that
start in a couple of seconds.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from backends.common.wire.shm_group import ShmGroup

UPDATE_BACKENDS: Final = ("nccl", "gloo", "shm")
"""The weight-update groups' backends an engine joins (/init_weights_update_group's
``backend``) and ``update_group`` makes: torch's two, and shared memory on one node
(backends/common/wire/shm_group.py; the CPU world's, not SGLang's)."""

GLOO_TIMEOUT = datetime.timedelta(seconds=30)


_CLIENTS = threading.local()
"""This thread's clients of the world's store, by (address, timeout)."""


def client_store(store_addr: tuple[str, int], timeout: datetime.timedelta = GLOO_TIMEOUT) -> Any:
    """A client of the world's TCPStore (every group here is made over it): reaching the
    store fails after GLOO_TIMEOUT at most (a closed port, an unknown host), a wait for a
    key (a rendezvous, which a member that never comes stalls) after ``timeout``.

    One client per thread, address and timeout, made once: a new TCPStore client took
    5.0 s to connect about one time in twenty on this machine (a bare loop of connects
    shows it, with either server), and a connect per group, three or more a step, put
    those 5 s stalls into steps, updates and heals. Per thread, because a client runs one
    operation at a time and a rendezvous may wait on it for its whole timeout."""
    stores: dict[tuple[tuple[str, int], datetime.timedelta], Any] = _CLIENTS.__dict__
    key = (tuple(store_addr), timeout)
    if key not in stores:
        host, port = store_addr
        client = dist.TCPStore(host, port, is_master=False, timeout=min(timeout, GLOO_TIMEOUT))
        client.set_timeout(timeout)
        stores[key] = client
    return stores[key]


def group_store(
    store_addr: tuple[str, int], prefix: str, timeout: datetime.timedelta = GLOO_TIMEOUT
) -> Any:
    """The store a group named ``prefix`` is made over (a prefix of the world's store)."""
    return dist.PrefixStore(prefix, client_store(store_addr, timeout))


def gloo_group(
    store_addr: tuple[str, int],
    prefix: str,
    rank: int,
    size: int,
    timeout: datetime.timedelta = GLOO_TIMEOUT,
    rendezvous: datetime.timedelta | None = None,
) -> Any:
    """A gloo process group of its own (not the default world), as torchft builds them;
    each collective fails after ``timeout`` if a member never takes part, the rendezvous
    after ``rendezvous`` (default: ``timeout``) if one never comes.

    Gloo's rendezvous waits for the others' addresses with the *group's* timeout, not the
    store's (measured: a store of 3 s under a group of 12 s waited 12 s), so the group is
    made with the rendezvous's timeout and given ``timeout`` for its collectives after."""
    store = group_store(store_addr, prefix, rendezvous or timeout)
    group = dist.ProcessGroupGloo(store, rank, size, rendezvous or timeout)
    if rendezvous is not None:
        group.set_timeout(timeout)
    return group


ATTEMPT_RENDEZVOUS = datetime.timedelta(seconds=10)
"""How long an attempt's group waits at its rendezvous once every member has arrived."""
JOIN_BOUND = GLOO_TIMEOUT + ATTEMPT_RENDEZVOUS
"""The longest a rank spends joining its attempt's group: the others' arrival, then the
rendezvous (``attempt_group``)."""
CELL_TIMEOUT = 2 * GLOO_TIMEOUT
"""The timeout of a cell's own collectives (its torch world: FSDP2's, the ranks'
agreement). Between two of them a rank may spend a whole join (JOIN_BOUND) or a whole
cross-cell exchange (GLOO_TIMEOUT) waiting on another cell, and its cell-mates wait for it
meanwhile: a cell timeout no longer than that fails the cell for another cell's death
(a CI run: a peer that arrived and died before its rendezvous held rank 1 of cell 0 for
30 s, and rank 0 timed out in FSDP2's all-gather at the same 30 s)."""
JOIN_POLL_S = 0.01
"""How often a member waiting for the others of an attempt's group looks again."""


def attempt_key(step: int, attempt: int) -> str:
    """The store prefix of a step's attempt: its groups and its ``abandoned`` mark."""
    return f"step{step}/attempt{attempt}"


def abandon_attempt(store: Any, step: int, attempt: int, reason: str) -> None:
    """Tell the members of an attempt still waiting for the others that one never comes."""
    store.set(f"{attempt_key(step, attempt)}/abandoned", reason)


def attempt_group(
    store_addr: tuple[str, int],
    step: int,
    attempt: int,
    rank: int,
    position: int,
    members: int,
    timeout: datetime.timedelta = GLOO_TIMEOUT,
) -> Any:
    """Rank ``rank``'s cross-cell gloo group of an attempt, once every member has arrived.

    A member that died before it joined would leave the others in gloo's rendezvous for
    the whole timeout (30 s), where the control plane knew at once: its call to that cell
    failed. So the members first count themselves in the store and wait for the count,
    looking for the driver's ``abandoned`` mark (``abandon_attempt``) as they wait, and
    only then make the group, whose rendezvous finds everyone there (one that dies in
    between fails it after ATTEMPT_RENDEZVOUS, well inside the cell's own collectives'
    timeout, CELL_TIMEOUT, which a cell-mate waiting for this rank would otherwise run
    out: seen when a cell was killed whole right after one of its ranks had arrived).
    RuntimeError (as gloo's own) when the attempt was abandoned or a member never came."""
    store = client_store(store_addr, timeout)
    prefix = attempt_key(step, attempt)
    arrived, abandoned = f"{prefix}/rank{rank}/arrived", f"{prefix}/abandoned"
    store.add(arrived, 1)
    deadline = time.monotonic() + timeout.total_seconds()

    def check_abandoned() -> None:
        if store.check([abandoned]):
            raise RuntimeError(f"the attempt was abandoned: {store.get(abandoned).decode()}")

    while store.add(arrived, 0) < members:
        check_abandoned()
        if time.monotonic() > deadline:
            raise RuntimeError(f"a member never joined in {timeout.total_seconds():g} s")
        time.sleep(JOIN_POLL_S)
    check_abandoned()  # a member arrived and was then killed with its cell
    name = f"{prefix}/rank{rank}"
    return gloo_group(store_addr, name, position, members, timeout, ATTEMPT_RENDEZVOUS)


def nccl_group(
    store_addr: tuple[str, int],
    prefix: str,
    rank: int,
    size: int,
    timeout: datetime.timedelta = GLOO_TIMEOUT,
) -> Any:
    """The same on CUDA: an NCCL group of its own, made over the same store protocol."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(group_store(store_addr, prefix, timeout), rank, size, options)


def shm_group(
    store_addr: tuple[str, int],
    prefix: str,
    rank: int,
    size: int,
    arena: Any = None,
    timeout: datetime.timedelta = GLOO_TIMEOUT,
) -> Any:
    """The same members over shared memory (backends/common/wire/shm_group.py); the source
    (rank 0) passes its ShmArena."""
    return ShmGroup(group_store(store_addr, prefix, timeout), rank, size, timeout, arena)


def update_group(
    backend: str,
    store_addr: tuple[str, int],
    prefix: str,
    rank: int,
    size: int,
    arena: Any = None,
    timeout: datetime.timedelta = GLOO_TIMEOUT,
) -> Any:
    """A weight-update group of ``backend``, as the trainer and the engine both make it;
    a broadcast that a member never takes part in fails after ``timeout``."""
    if backend == "shm":
        return shm_group(store_addr, prefix, rank, size, arena, timeout)
    if backend == "nccl":
        return nccl_group(store_addr, prefix, rank, size, timeout)
    if backend == "gloo":
        return gloo_group(store_addr, prefix, rank, size, timeout)
    raise ValueError(f"unknown update backend {backend!r}: one of {', '.join(UPDATE_BACKENDS)}")


def broadcast(group: Any, tensor: torch.Tensor, root: int = 0) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = root
    group.broadcast([tensor], options).wait()


def broadcast_each(group: Any, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
    """One broadcast per tensor, in order, all started before any is waited for: SGLang's
    receive when ``load_format`` is absent (``receive_weights_from_distributed``) and miles'
    send (broadcast.py ``update_weights_from_distributed``), each with ``async_op=True``."""
    options = dist.BroadcastOptions()
    options.rootRank = root
    works = [group.broadcast([tensor], options) for tensor in tensors]
    for work in works:
        work.wait()
