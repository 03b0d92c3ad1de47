"""A trainer cell's rank as a Ray actor: a torch policy, GRPO steps, gloo exchanges.

A cell of several ranks is its own torch.distributed world (a gloo default
group named by the cell and its incarnation) and shards the policy with FSDP2
(``fully_shard`` per decoder layer and at the root). Across cells, rank r of
every member cell averages its local gradient shards with the others' rank r
over a gloo group made for that attempt (independent DP); the ranks of a cell
then agree (MIN of their success flags) before anyone steps, so a cell never
ends with some shards stepped and others not.

Each attempt's cross-cell group is joined *before* the forward pass, so a
member that dies later resets its peers' connections at once instead of
leaving them in a rendezvous timeout. A failed exchange means the attempt is
DISCARDED: no optimizer step, gradients dropped. An exception in the cell's own
forward, backward or gradient reduction is not an exchange's failure: it is
raised, and the driver fails that cell alone (miles' ``RayTrainCell._execute_raw``
stops a cell whose actors raised; its tests inject ``RuntimeError`` there, which
a retry would only meet again).

The actor is threaded (max_concurrency > 1) so it answers heartbeats while a
step runs, as a real trainer's heartbeat thread does.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from backends.common.stack import CPU_STACK, Stack
from backends.common.training.policy import (
    AnyPolicy,
    HFPolicy,
    Trajectory,
    bucket_tensors,
    build_model,
    checksum,
    grpo_loss,
)
from backends.common.training.policy_loss import checkpoint_loss
from backends.common.wire.buckets import BucketViews, pack_into, payload_of, wire_layout
from backends.common.wire.cell_lock import raise_holding, send_in_turn
from backends.common.wire.devices import prepare_process
from backends.common.wire.disk_delta import Publisher, tensor_bytes
from backends.common.wire.groups import (
    CELL_TIMEOUT,
    GLOO_TIMEOUT,
    attempt_group,
    client_store,
    group_store,
    update_group,
)
from backends.common.wire.participation import JOINED, arrive
from backends.common.wire.shm_group import ShmArena, ShmGroup, send_many
from backends.common.wire.tensor_bucket import bucket_handle
from miles_core.disk_delta import DeltaEncoding
from miles_core.scenario.faults import LOCK_RAISED, RANK_FAILED
from miles_core.transfer import Bucket

EXIT, RAISE = "exit", "raise"
"""What a fault injects into a rank's step before the exchange (``train``'s ``injected``)."""


def _first_line(error: BaseException) -> str:
    """A failure's reason as a step report carries it: its first line, at most 200 chars."""
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def _local(tensor: Any) -> Any:
    """This rank's shard of a DTensor; a plain tensor as is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _locals(obj: Any) -> Any:
    """A state dict with every DTensor replaced by a copy of this rank's shard (picklable)."""
    if isinstance(obj, dict):
        return {k: _locals(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_locals(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _local(obj).detach().clone()
    return obj


def _copy_into(dst: Any, src: Any) -> Any:
    """Copy a ``_locals`` state into a live state dict of the same structure, in place."""
    if isinstance(dst, dict):
        for k in dst:
            dst[k] = _copy_into(dst[k], src[k])
        return dst
    if isinstance(dst, list):
        return [_copy_into(d, s) for d, s in zip(dst, src, strict=True)]
    if isinstance(dst, torch.Tensor):
        _local(dst).copy_(src)
        return dst
    return src


class TrainerRank:
    def __init__(
        self,
        cell: int,
        policy: AnyPolicy,
        rank: int = 0,
        ranks: int = 1,
        store_addr: tuple[str, int] | None = None,
        world: str = "",
        stack: Stack = CPU_STACK,
        ticket_lock: bool = False,
    ) -> None:
        torch.set_num_threads(1)
        prepare_process(stack.device)
        self.cell, self.rank, self.ranks = cell, rank, ranks
        self.device = stack.device
        if ranks > 1:  # this cell's ranks are one torch world
            assert store_addr is not None
            store = dist.PrefixStore(world, client_store(store_addr))
            backend = "nccl" if stack.device == "cuda" else "gloo"
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=ranks, timeout=CELL_TIMEOUT
            )
        self._lock_at = (store_addr, world) if ticket_lock and ranks > 1 else None
        """Where the cell's weight-update ticket lock is (today's miles: wire/cell_lock.py)."""
        self.policy = policy
        """Kept for disk-delta's version 0 (``write_delta``: the initial weights)."""
        self.model = self.build(policy, stack)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=policy.lr)
        self.loss_config = policy.loss if isinstance(policy, HFPolicy) else None
        """miles' loss flags for a checkpoint's policy (None: the tiny policy's GRPO)."""
        self.ref_model = None
        if self.loss_config is not None and self.loss_config.use_kl_loss:
            self.ref_model = self.reference(policy, stack).eval().requires_grad_(False)
        self._update_groups: dict[str, Any] = {}
        self._taking_part: dict[str, Any] = {}
        """Per update group, the store rank 0 counts its broadcasts in (participation.py)."""
        self._arena: ShmArena | None = None
        """The shared-memory segment of this rank's shm update groups (made at the first)."""
        self._shared: dict[int, list[torch.Tensor]] = {}
        """Buffers whose handles went to engines, kept alive until the next update."""
        # one rank: the weights are the buckets' wire buffers (a sharded cell gathers instead)
        self._views = BucketViews(self.model) if ranks == 1 and self.views_ok else None

    views_ok = True
    """The model's parameters are the engines' (so buckets can be views of them)."""

    @property
    def data_rank(self) -> int:
        """Which share of the cell's batch this rank computes (FSDP2: each rank its own)."""
        return self.rank

    @property
    def data_ranks(self) -> int:
        return self.ranks

    def reduce_grads(self) -> None:
        """Average gradients within the cell after backward (FSDP2 already has)."""

    def build(self, policy: AnyPolicy, stack: Stack) -> torch.nn.Module:
        """The policy, sharded with FSDP2 (per decoder layer and at the root) over the cell."""
        model = build_model(policy).to(stack.device)
        if self.ranks > 1:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(stack.device, (self.ranks,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return model

    def reference(self, policy: AnyPolicy, stack: Stack) -> torch.nn.Module:
        """The initial weights, kept for --use-kl-loss's KL term (sharded as the policy)."""
        return self.build(policy, stack)

    def hf_tensors(self, bucket: Bucket) -> dict[str, torch.Tensor]:
        """The bucket's tensors, whole, by the engines' names (a collective of the cell)."""
        return bucket_tensors(self.model, bucket)

    def ready(self) -> int:
        return os.getpid()

    def heartbeat(self) -> bool:
        return True

    def train(
        self,
        step: int,
        attempt: int,
        batch: Sequence[Sequence[Trajectory]],
        members: Sequence[int],
        store_addr: tuple[str, int],
        injected: str = "",
        slowdown: float = 1.0,
    ) -> dict[str, Any]:
        """One attempt on this rank's share of the batch: the cell's share (by its position
        among the members), split again among the cell's ranks. ``injected``: a fault that
        strikes this rank before the exchange, ``exit`` (the process dies) or ``raise`` (it
        raises RANK_FAILED and lives on)."""
        started = time.perf_counter()
        position, cells = members.index(self.cell), len(members)
        shard = list(batch)[position::cells][self.data_rank :: self.data_ranks]
        failure, computed, group = "", 0.0, None
        if cells > 1:
            try:
                group = attempt_group(store_addr, step, attempt, self.rank, position, cells)
            except RuntimeError as error:  # a member died before it joined
                failure = _first_line(error)
        # The cell's own work, on every rank whether or not its join failed (a rank that
        # skipped it would leave its cell-mates waiting in FSDP2's collectives): what raises
        # here is raised to the driver, which fails this cell. No other cell takes part.
        self.optimizer.zero_grad(set_to_none=False)
        if self.loss_config is None:
            loss = grpo_loss(self.model, shard)
        else:
            loss, _ = checkpoint_loss(self.model, shard, self.loss_config, self.ref_model)
        loss.backward()  # FSDP2 reduce-scatters (averages) within the cell here
        self.reduce_grads()
        if slowdown > 1:
            time.sleep((time.perf_counter() - started) * (slowdown - 1))
        computed = time.perf_counter() - started  # forward/backward: what a slowdown slows
        if injected == EXIT:
            os._exit(1)  # a real death: the process ends, its sockets reset
        if injected == RAISE:  # alive: the driver fails the cell and kills its ranks
            raise RuntimeError(RANK_FAILED)
        if group is not None:
            try:
                self._average_across_cells(group, cells)
            except RuntimeError as error:  # a peer died or hung: the exchange failed
                failure = _first_line(error)
        failure = self._cell_agrees(failure)
        if failure:
            self.optimizer.zero_grad(set_to_none=False)
            return {"outcome": "discarded", "reason": failure, "seconds": computed}
        self.optimizer.step()
        return {"outcome": "normal", "loss": float(loss), "seconds": computed}

    def _cell_agrees(self, failure: str) -> str:
        """Every rank of the cell exchanged, or none steps: the MIN of the ranks' success
        flags (one collective on every path, so the ranks never fall out of step)."""
        if self.ranks == 1:
            return failure
        flag = torch.tensor([0.0 if failure else 1.0], device=self.device)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        except RuntimeError as error:  # a cell-mate died: the driver sees the cell errored
            return failure or _first_line(error)
        return failure or ("a cell-mate's exchange failed" if flag.item() < 1 else "")

    def _average_across_cells(self, group: Any, cells: int) -> None:
        grads = [_local(p.grad) for p in self.model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        group.allreduce([flat]).wait()  # gloo has no AVG: sum, then divide
        flat /= cells
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    # -- checkpoints (healing copies these rank to rank) ------------------------------

    def get_state(self) -> dict[str, Any]:
        """This rank's share of model and optimizer state, copied (a parameter may be a view
        into a bucket buffer, and a pickled view would carry its whole buffer)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        return {
            "model": _locals(get_model_state_dict(self.model)),
            "optimizer": _locals(get_optimizer_state_dict(self.model, self.optimizer)),
        }

    def set_state(self, state: dict[str, Any]) -> str:
        """Load a rank's share; returns the (whole) model's checksum: a cell collective."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        model = _copy_into(get_model_state_dict(self.model), state["model"])
        optimizer = get_optimizer_state_dict(self.model, self.optimizer)  # creates Adam state
        optimizer = _copy_into(optimizer, state["optimizer"])
        set_model_state_dict(self.model, model)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer)
        return checksum(self.model)

    def checksum(self) -> str:
        """The checksum of the weights as the engines hold them (a collective of the cell)."""
        return checksum(self.model)

    # -- a driver hot restart (backends/common/world/adopted.py) ---------------------------

    def hold(self, held: Any) -> None:
        """Keep, in this process, the control plane's state at a published version (a
        miles_core.saves.SaveState) and this rank's share of model and optimizer as they
        are now (miles' ``load_state`` after a hot restart, hot_restart.py at 14aca060)."""
        self._held = (held, self.get_state())

    def held(self) -> Any:
        """The state held at the last published version (None: nothing published yet)."""
        held = getattr(self, "_held", None)
        return None if held is None else held[0]

    def load_held(self, version: int) -> str | None:
        """Roll model and optimizer back to the share held at ``version`` (a cell
        collective); the model's checksum, or None where this rank holds another version."""
        held = getattr(self, "_held", None)
        if held is None or held[0].version != version:
            return None
        return self.set_state(held[1])

    # -- weight updates (rank 0 is the source, rank 0 of each update group) -------------

    def init_update_group(
        self,
        store_addr: tuple[str, int],
        name: str,
        world: int,
        backend: str = "gloo",
        timeout: float = GLOO_TIMEOUT.total_seconds(),
    ) -> None:
        """Rank 0 joins the group as its source; a broadcast it sends fails after ``timeout``
        seconds if a member never takes part."""
        if self.rank == 0:
            if backend == "shm" and self._arena is None:
                self._arena = ShmArena()
            wait = datetime.timedelta(seconds=timeout)
            self._taking_part[name] = group_store(store_addr, name, wait)
            arrive(self._taking_part[name], 0, JOINED)
            self._update_groups[name] = update_group(
                backend, store_addr, name, 0, world, self._arena, wait
            )

    def share_bucket(self, update_id: int, bucket: Bucket) -> tuple[str | None, float]:
        """The bucket flattened into a fresh buffer on this device, as miles'
        ``_send_to_colocated_engine`` builds it for /update_weights_from_tensor (rank 0; the
        other ranks help gather). The buffer stays alive until the next update: the engines
        copy from it."""
        started = time.perf_counter()
        tensors = self.hf_tensors(bucket)
        if self.rank != 0:
            return None, 0.0
        for old in [u for u in self._shared if u != update_id]:
            del self._shared[old]
        named = [(name, tensors[name]) for name in payload_of(bucket)[0]]
        buffer = torch.empty(wire_layout(bucket)[1], dtype=torch.uint8, device=self.device)
        handle = bucket_handle(named, buffer)
        self._shared.setdefault(update_id, []).append(buffer)
        return handle, time.perf_counter() - started

    def send_bucket(self, names: str | Sequence[str], bucket: Bucket, packed: bool = True) -> float:
        """Broadcast one bucket from rank 0 on each named group (p2p: one pair group per
        engine, all at once); returns its seconds in the broadcasts. ``packed``: as one
        ``flattened_bucket`` buffer; otherwise one broadcast per tensor in the bucket's
        order, as miles' distributed path sends (broadcast.py
        ``update_weights_from_distributed``: one ``dist.broadcast`` per name).

        One rank: the parameters are views into the bucket's buffer (bound at its first
        packed send), so nothing is packed (backends/bench measured packing into a fresh
        buffer per bucket at well under half of the wire's rate), and each tensor is sent
        as it lies. A sharded cell: every rank takes part in gathering the bucket's whole
        tensors, and rank 0 sends them."""
        order = payload_of(bucket)[0]
        if self._views is None:
            tensors = self.hf_tensors(bucket)
            if self.rank != 0:
                return self._in_turn(lambda: 0.0)  # its turn in the lock; nothing to send
            if packed:
                buffer = torch.empty(wire_layout(bucket)[1], dtype=torch.uint8, device=self.device)
                pack_into(tensors, bucket, buffer)
                sent = [buffer]
            else:
                sent = [tensors[name].detach().contiguous() for name in order]
        elif packed:
            sent = [self._views.buffer_for(*payload_of(bucket))]
        else:
            params = dict(self.model.named_parameters())
            sent = [params[name].detach().contiguous() for name in order]
        names = [names] if isinstance(names, str) else list(names)

        def broadcast() -> float:
            for name in names:  # the source enters each group's broadcast (participation.py)
                marks = self._taking_part.get(name)
                if marks is not None:
                    arrive(marks, 0)
            return send_to_groups([self._update_groups[n] for n in names], sent)

        return self._in_turn(broadcast)

    def _in_turn(self, part: Callable[[], float]) -> float:
        """This rank's ``part`` of a bucket's send, in the cell's ticket lock where today's
        miles takes one (broadcast.py ``send_bucket``, 069a4115; wire/cell_lock.py)."""
        if self._lock_at is None:
            return part()
        store = group_store(*self._lock_at)
        return send_in_turn(store, self.rank, self.ranks, dist.barrier, part)

    def raise_holding_lock(self) -> str:
        """The fault raise_holding_lock: this rank takes the cell's lock, raises inside it and
        lives on, the exception caught here (no one kills the cell); what it raised."""
        assert self._lock_at is not None, "the cell takes no weight-update lock"
        return raise_holding(group_store(*self._lock_at), self.rank, LOCK_RAISED)

    def write_delta(
        self, root: str, encoding: str, version: int, bucket: Bucket, total: int
    ) -> tuple[int, float]:
        """disk-delta: this bucket's delta of ``version`` against the version before, written
        by rank 0 (backends/common/wire/disk_delta.py ``Publisher``; the other ranks help
        gather on a sharded cell); the bytes written and its seconds. Version 0 is the
        initial weights, built afresh (miles reads them from hf_checkpoint)."""
        started = time.perf_counter()
        tensors = self.hf_tensors(bucket)
        if self.rank != 0:
            return 0, 0.0
        names = payload_of(bucket)[0]

        def initial() -> dict[str, bytes]:
            params = dict(build_model(self.policy).named_parameters())
            return {name: tensor_bytes(params[name]) for name in names}

        new = {name: tensor_bytes(tensors[name]) for name in names}
        written = Publisher(Path(root), DeltaEncoding(encoding)).write(
            version, bucket.index, total, new, initial
        )
        return written, time.perf_counter() - started

    def destroy_update_group(self, name: str) -> None:
        self._update_groups.pop(name, None)
        self._taking_part.pop(name, None)


def send_to_groups(groups: Sequence[Any], tensors: Sequence[torch.Tensor]) -> float:
    """Broadcast each tensor in order from rank 0 on every group at once, then wait for all;
    returns the seconds. Each group has its own gloo (or NCCL) workers, so p2p's engines
    receive concurrently (backends/bench: sent in turn instead, 2 and 4 engines got about
    0.75x of this GB/s). The first failed group raises; the others are left to their
    timeouts with the groups discarded."""
    started = time.perf_counter()
    if groups and all(isinstance(g, ShmGroup) for g in groups):
        for tensor in tensors:
            send_many(groups, tensor)  # one write into the arena for all of them
        return time.perf_counter() - started
    options = dist.BroadcastOptions()
    options.rootRank = 0
    works = [group.broadcast([tensor], options) for tensor in tensors for group in groups]
    for work in works:
        work.wait()
    return time.perf_counter() - started


TrainerActor = ray.remote(num_cpus=0, max_concurrency=4)(TrainerRank)
