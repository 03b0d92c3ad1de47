"""The weight-transfer wire path, torch only: update groups, bucket packing and unpacking.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from backends.common.engine.requests import UPDATE_BACKENDS
from backends.common.wire.shm_group import ShmGroup
from miles_core.transfer import Bucket, ParamSpec, StagingSpan, itemsize

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
    after ``rendezvous`` (default: ``timeout``) if one never comes."""
    store = group_store(store_addr, prefix, rendezvous or timeout)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


ATTEMPT_RENDEZVOUS = datetime.timedelta(seconds=10)
"""How long an attempt's group waits at its rendezvous once every member has arrived."""
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
    timeout, which a cell-mate waiting for this rank would otherwise run out: seen when
    a cell was killed whole right after one of its ranks had arrived). RuntimeError (as
    gloo's own) when the attempt was abandoned or a member never came."""
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


class UnalignedTensor(ValueError):
    """A tensor of the bucket would start at an offset its dtype cannot be viewed at."""


def wire_spans(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> tuple[list[StagingSpan], int]:
    """The packed layout of a bucket from SGLang's (names, dtypes, shapes) payload, and its
    bytes. Raises UnalignedTensor as SGLang's FlattenedTensorBucket.empty does."""
    spans, offset = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        spec = ParamSpec.of(name, shape, dtype)
        size = itemsize(dtype)
        if offset % size:
            raise UnalignedTensor(
                f"{name}: byte offset {offset} in the packed bucket is not a multiple of its "
                f"{dtype} item size {size} (SGLang's flattened_bucket refuses it too); "
                "order the bucket's tensors so each starts aligned"
            )
        spans.append(StagingSpan(name, dtype, tuple(shape), offset, offset + spec.nbytes))
        offset += spec.nbytes
    return spans, offset


def payload_of(bucket: Bucket) -> tuple[list[str], list[str], list[list[int]]]:
    """SGLang's (names, dtypes, shapes) for a planned bucket."""
    spans = bucket.spans
    return [s.name for s in spans], [s.dtype for s in spans], [list(s.shape) for s in spans]


def wire_layout(bucket: Bucket) -> tuple[list[StagingSpan], int]:
    return wire_spans(*payload_of(bucket))


def pack_bucket(model: torch.nn.Module, bucket: Bucket) -> torch.Tensor:
    """The bucket's uint8 wire buffer (packed)."""
    params = dict(model.named_parameters())
    spans, nbytes = wire_layout(bucket)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    pack_into({s.name: params[s.name] for s in spans}, bucket, buffer)
    return buffer


def unpack_into(model: torch.nn.Module, spans: Iterable[StagingSpan], buffer: torch.Tensor) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for span in spans:
            dst = params[span.name]
            dst.view(torch.uint8).reshape(-1).copy_(buffer[span.start : span.end])


def pack_into(params: Mapping[str, torch.Tensor], bucket: Bucket, buffer: torch.Tensor) -> None:
    """pack_bucket's bytes written into a reused ``buffer`` (nothing allocated: a fresh
    large buffer costs a page fault per 4 KiB on every bucket)."""
    for span in wire_layout(bucket)[0]:
        src = params[span.name].detach()
        buffer[span.start : span.end].copy_(src.contiguous().view(torch.uint8).reshape(-1))


Layout = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]


class BucketViews:
    """Parameters as views into one persistent uint8 buffer per bucket layout (RDT-style
    staging), so the buffer *is* the bucket on the wire: the sender broadcasts it without
    packing, the receiver receives straight into its weights without unpacking. The layout
    is the packed wire layout, whose spans are aligned (``wire_spans`` refuses others), so a
    span views as its tensor without a copy. The wire bytes are pack_bucket's, unchanged.

    The first bucket of a layout binds its parameters (their values copied into the new
    buffer); a later layout that takes a parameter over retires the older layout, so a
    buffer is only reused while it still backs every one of its parameters.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._buffers: dict[Layout, torch.Tensor] = {}
        self._owner: dict[str, Layout] = {}

    def buffer_for(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """The bucket's wire buffer; its bytes are the parameters' bytes, both ways."""
        layout = (tuple(names), tuple(dtypes), tuple(tuple(s) for s in shapes))
        buffer = self._buffers.get(layout)
        return buffer if buffer is not None else self._bind(layout)

    def _bind(self, layout: Layout) -> torch.Tensor:
        spans, nbytes = wire_spans(*layout)
        params = dict(self.model.named_parameters())
        for span in spans:
            p = params.get(span.name)
            if p is None or str(p.dtype).removeprefix("torch.") != span.dtype:
                have = None if p is None else str(p.dtype).removeprefix("torch.")
                raise ValueError(f"{span.name}: the bucket says {span.dtype}, the model has {have}")
            if tuple(p.shape) != span.shape:
                raise ValueError(f"{span.name}: bucket shape {span.shape}, model {tuple(p.shape)}")
        device = params[spans[0].name].device if spans else None
        buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        with torch.no_grad():
            for span in spans:
                p = params[span.name]
                view = buffer[span.start : span.end].view(p.dtype).view(span.shape)
                view.copy_(p)
                p.data = view
                old = self._owner.get(span.name)
                if old is not None and old != layout:
                    self._buffers.pop(old, None)
                self._owner[span.name] = layout
        self._buffers[layout] = buffer
        return buffer
