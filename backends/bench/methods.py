"""What each rank does for one timed trial of each method, in each mode.

The source is rank 0; receivers are ranks 1..N. ``broadcast`` mode uses one
group of everyone (the real backend's broadcast group of the trainer and all
engines); ``p2p`` uses one two-rank group per receiver, as the CPU backend's
p2p mode does (a broadcast inside each pair group).

Methods (a receiver's trial ends when the bytes are where that method puts them).
The bucketed ones form a ladder, each adding one technique:

- ``v0``: the CPU backend's path before this benchmark, call for call: the
  trainer packs each bucket into a fresh ``pack_bucket`` buffer (p2p: once per
  engine, one ``send_bucket`` call each), the engine builds spans from the
  (names, dtypes, shapes) payload, receives into a fresh buffer and
  ``unpack_into`` its model;
- ``reuse``: preallocated bucket buffers on both sides (no allocation, no
  page faults, no zero fill);
- ``inplace``: ``reuse``, and the receiver's parameters are views into its
  bucket buffers (``wire.BucketViews``): it receives straight into its weights;
- ``pipeline``: ``inplace``, and the sender packs bucket k+1 while bucket k is
  on the wire (double buffer, async gloo work; p2p sends to all receivers at
  once). Not in the backend: the orchestration sends one bucket per call;
- ``backend``: the CPU backend now, its own code (``backend_path``): the
  trainer's ``send_bucket`` from its ``BucketViews`` (nothing packed) and the
  engine's ``EngineWeights.receive`` straight into its weights; p2p sends each
  bucket to every engine's pair group at once (``trainer.send_to_groups``);
- ``backend-per-tensor``: the same code with no ``load_format``, the backend's default
  and what miles sends: one broadcast per tensor of the bucket, received into fresh
  tensors and loaded once all arrived (``backend`` is ``--flattened-bucket``);
- ``backend-shm`` (CPU only): the same code on the CPU backend's other wire
  (``--wire shm``): update groups over the trainer's shared memory
  (backends/common/wire/shm_group.py), the way NCCL moves bytes within a node;
- ``in-turn`` (p2p only): the same code, with the bucket sent to one engine after
  another, as miles_core's update loop calls the transport today (one
  ``send_bucket`` per engine);
- ``inflight``: ``backend`` with every bucket (and p2p receiver) in flight at
  once: what one call per bucket leaves on the table;
- the ceiling's ways (``ceiling.py``): flat gloo broadcast, pair broadcasts,
  send/recv, shared-memory copies; the report divides by the fastest;
- ``naive``: one collective per tensor; the receiver gets a fresh tensor and
  copies it into the parameter (SGLang's per-tensor update path);
- ``memcpy``: one copy of the same bytes inside the source (a bound, moving nothing
  between processes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from backends.bench.backend_path import EngineSide, TrainerSide, engine_group, group_names
from backends.bench.ceiling import CEILINGS, run_ceiling, start_broadcast
from backends.common.wire.buckets import (
    BucketViews,
    pack_bucket,
    pack_into,
    unpack_into,
    wire_spans,
)
from miles_core.transfer import Bucket

MODES = ("broadcast", "p2p")
BUCKETED = (
    "v0",
    "reuse",
    "inplace",
    "pipeline",
    "backend",
    "backend-per-tensor",
    "backend-shm",
    "in-turn",
    "inflight",
)
"""The bucketed ladder: each step keeps the techniques of the one before it."""
P2P_ONLY = frozenset(("in-turn",))
CPU_ONLY = frozenset(("backend-shm",))
"""Measured where the tensors live in host memory (the bench's gloo runs)."""
QUICK_METHODS = ("backend", "backend-per-tensor", "backend-shm", "in-turn")
"""A default run's methods: the backend's own paths; the ladder that led to them is
``--full``'s (it costs most of a full run's time and its figures do not move)."""
REFERENCES = ("naive", "memcpy")
QUICK_REFERENCES = ("memcpy",)
"""``naive`` (one collective per tensor) takes a quarter of a default run and is
``backend-per-tensor`` without its buckets: ``--full`` times it."""
METHODS = BUCKETED + CEILINGS + REFERENCES
WRITES_WEIGHTS = frozenset((*BUCKETED, "naive"))
"""Methods whose receivers end with the weights in their model: checked bitwise."""


@dataclass
class Rank:
    """One process's side of the benchmark: its groups, model and buffers."""

    rank: int
    receivers: int
    everyone: Any
    pairs: dict[int, Any]
    """p2p groups: on the source, receiver -> group; on a receiver, its own under its rank."""
    model: torch.nn.Module
    device: torch.device
    flat: torch.Tensor
    sync: Callable[[], None] = lambda: None
    buckets: tuple[Bucket, ...] = ()
    staging: list[torch.Tensor] = field(default_factory=list)
    """Reused bucket buffers (two on the source for double buffering, one on a receiver)."""
    views: BucketViews | None = None
    """Parameters as views into bucket buffers, as the CPU backend keeps them (both sides)."""
    copy_target: torch.Tensor | None = None
    shared: torch.Tensor | None = None
    """The shared-memory segment of the shm ceilings (CPU only)."""
    shm_everyone: Any = None
    """An shm group of everyone, for the ``shm-flags`` ceiling (CPU only)."""
    token: torch.Tensor = field(default_factory=lambda: torch.zeros(1))
    backend: TrainerSide | EngineSide | None = None
    """The backend's own sender (source) or receiver (engines), for ``backend``/``in-turn``."""
    wires: tuple[str, ...] = ("",)
    """The backend's groups this rank joined: "" the bench's backend, "shm" on CPU."""

    @property
    def is_source(self) -> bool:
        return self.rank == 0

    def params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    # -- sending in a mode -------------------------------------------------------------

    def send(self, mode: str, tensor: torch.Tensor, concurrent: bool = False) -> list[Any]:
        """Source: send ``tensor`` and wait; p2p goes to each receiver in turn. With
        ``concurrent`` nothing is waited for: the pending works are returned."""
        groups = [self.everyone] if mode == "broadcast" else list(self.pairs.values())
        works = []
        for group in groups:
            works.append(start_broadcast(group, tensor))
            if not concurrent:
                works.pop().wait()
        return works

    def recv(self, mode: str, tensor: torch.Tensor) -> Any:
        group = self.everyone if mode == "broadcast" else self.pairs[self.rank]
        return start_broadcast(group, tensor)

    # -- preparing for a bucket plan (outside the timed region) -----------------------

    def prepare(self, buckets: Sequence[Bucket]) -> None:
        """Reused buffers for this plan, and parameters bound as views into its buckets
        (the backend binds at a layout's first send; here it is done before timing)."""
        self.buckets = tuple(buckets)
        size = max(b.nbytes for b in buckets)
        copies = 2 if self.is_source else 1
        self.staging = [
            torch.zeros(size, dtype=torch.uint8, device=self.device) for _ in range(copies)
        ]
        if self.views is None:
            self.views = BucketViews(self.model)
        for bucket in buckets:
            self.views.buffer_for(*_payload(bucket))
        if isinstance(self.backend, EngineSide):
            names = [engine_group(m, self.rank, w) for w in self.wires for m in MODES]
            self.backend.prepare(buckets, names)

    # -- one trial ---------------------------------------------------------------------

    def run(self, method: str, mode: str) -> None:
        if method in CEILINGS:
            run_ceiling(self, method)
        else:
            getattr(self, "_" + method.replace("-", "_"))(mode)
        self.sync()

    def _v0(self, mode: str) -> None:
        if self.is_source:
            for bucket in self.buckets:
                if mode == "broadcast":
                    self.send(mode, self._pack(bucket))
                else:  # one send_bucket call, hence one pack, per engine
                    for group in self.pairs.values():
                        start_broadcast(group, self._pack(bucket)).wait()
            return
        for bucket in self.buckets:
            spans, nbytes = wire_spans(*_payload(bucket))
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.recv(mode, buffer).wait()
            unpack_into(self.model, spans, buffer)

    def _pack(self, bucket: Bucket) -> torch.Tensor:
        """The CPU backend's pack_bucket; on CUDA the same bytes in a fresh device buffer."""
        if self.device.type == "cpu":
            return pack_bucket(self.model, bucket)
        buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
        pack_into(self.params(), bucket, buffer)
        return buffer

    def _reuse(self, mode: str) -> None:
        if self.is_source:
            for bucket in self.buckets:
                buffer = self.staging[0][: bucket.nbytes]
                pack_into(self.params(), bucket, buffer)
                self.send(mode, buffer)
            return
        for bucket in self.buckets:
            spans, nbytes = wire_spans(*_payload(bucket))
            buffer = self.staging[0][:nbytes]
            self.recv(mode, buffer).wait()
            unpack_into(self.model, spans, buffer)

    def _wire(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's buffer of BucketViews: the weights themselves, on either side."""
        assert self.views is not None
        return self.views.buffer_for(*_payload(bucket))

    def _receive_in_place(self, mode: str) -> None:
        """The engine's /update_weights_from_distributed, bucket after bucket."""
        for bucket in self.buckets:
            self.recv(mode, self._wire(bucket)).wait()

    def _inplace(self, mode: str) -> None:
        if self.is_source:
            self._reuse(mode)
        else:
            self._receive_in_place(mode)

    def _pipeline(self, mode: str) -> None:
        if not self.is_source:
            self._receive_in_place(mode)
            return
        params, pending = self.params(), []
        for k, bucket in enumerate(self.buckets):
            buffer = self.staging[k % 2][: bucket.nbytes]
            pack_into(params, bucket, buffer)  # while bucket k-1 is on the wire
            for work in pending:
                work.wait()
            pending = self.send(mode, buffer, concurrent=True)
        for work in pending:
            work.wait()

    def _backend(
        self, mode: str, in_turn: bool = False, wire: str = "", packed: bool = True
    ) -> None:
        """The backend's own send_bucket / receive, bucket after bucket."""
        side = self.backend
        if isinstance(side, EngineSide):
            side.receive_all(engine_group(mode, self.rank, wire), self.buckets, packed)
            return
        assert isinstance(side, TrainerSide)
        names = group_names(mode, self.receivers, wire)
        for bucket in self.buckets:
            if in_turn:  # one send_bucket call per engine, as the update loop makes them
                for name in names:
                    side.send([name], bucket, packed)
            else:
                side.send(names, bucket, packed)

    def _backend_per_tensor(self, mode: str) -> None:
        """The backend's default: one broadcast per tensor, as miles sends them."""
        self._backend(mode, packed=False)

    def _backend_shm(self, mode: str) -> None:
        self._backend(mode, wire="shm")

    def _in_turn(self, mode: str) -> None:
        self._backend(mode, in_turn=True)

    def _inflight(self, mode: str) -> None:
        if not self.is_source:
            self._receive_in_place(mode)
            return
        works = [w for b in self.buckets for w in self.send(mode, self._wire(b), concurrent=True)]
        for work in works:
            work.wait()

    def _naive(self, mode: str) -> None:
        params = self.params()
        with torch.no_grad():
            for bucket in self.buckets:
                for span in bucket.spans:
                    p = params[span.name]
                    if self.is_source:
                        self.send(mode, p.detach().view(torch.uint8).reshape(-1))
                        continue
                    fresh = torch.empty(span.shape, dtype=p.dtype, device=self.device)
                    self.recv(mode, fresh.view(torch.uint8).reshape(-1)).wait()
                    p.copy_(fresh)

    def _memcpy(self, mode: str) -> None:
        if self.is_source:
            if self.copy_target is None:
                self.copy_target = torch.zeros_like(self.flat)
            self.copy_target.copy_(self.flat)


def _payload(bucket: Bucket) -> tuple[list[str], list[str], list[list[int]]]:
    """What the engine is told in /update_weights_from_distributed: names, dtypes, shapes."""
    spans = bucket.spans
    return [s.name for s in spans], [s.dtype for s in spans], [list(s.shape) for s in spans]
