"""A trainer cell's rank as a Ray actor: a torch policy, GRPO steps, gloo exchanges.

The actor is threaded (max_concurrency > 1) so it answers heartbeats while a
step runs, as a real trainer's heartbeat thread does. Each attempt of a step
joins a fresh gloo group of the attempt's members (named by step and attempt,
rendezvous through the driver's TCPStore) *before* its forward pass, so a
member that dies later resets its peers' connections at once instead of
leaving them waiting for a rendezvous timeout. A failed exchange means the
attempt is DISCARDED: no optimizer step, the gradients are dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch

from backends.cpu.policy import (
    PolicyConfig,
    Trajectory,
    build_model,
    checksum,
    grpo_loss,
)
from backends.cpu.wire import BucketViews, broadcast, gloo_group
from miles_core.transfer import Bucket


class TrainerRank:
    def __init__(self, cell: int, policy: PolicyConfig) -> None:
        torch.set_num_threads(1)
        self.cell = cell
        self.model = build_model(policy)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=policy.lr)
        self._update_groups: dict[str, Any] = {}
        self._views = BucketViews(self.model)  # the weights are the buckets' wire buffers

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
        die_before_allreduce: bool = False,
        slowdown: float = 1.0,
    ) -> dict[str, Any]:
        """One attempt on this cell's shard of the batch; {'outcome': normal|discarded, ...}."""
        started = time.perf_counter()
        rank, size = members.index(self.cell), len(members)
        group = None
        try:
            if size > 1:
                group = gloo_group(store_addr, f"step{step}/attempt{attempt}", rank, size)
            self.optimizer.zero_grad(set_to_none=False)
            loss = grpo_loss(self.model, list(batch)[rank::size])
            loss.backward()
            if slowdown > 1:
                time.sleep((time.perf_counter() - started) * (slowdown - 1))
            if die_before_allreduce:
                os._exit(1)  # a real death: the process ends, its sockets reset
            if group is not None:
                flat = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])
                group.allreduce([flat]).wait()
                flat /= size
                offset = 0
                for p in self.model.parameters():
                    p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        except RuntimeError as error:  # a peer died or hung: the exchange failed
            self.optimizer.zero_grad(set_to_none=False)
            return {"outcome": "discarded", "reason": str(error).splitlines()[0][:200]}
        self.optimizer.step()
        return {
            "outcome": "normal",
            "loss": float(loss),
            "seconds": time.perf_counter() - started,
        }

    def get_state(self) -> dict[str, Any]:
        """The checkpoint a healing cell receives: model and optimizer.

        Parameters are cloned: each is a view into a bucket buffer, and a pickled view
        would carry its whole buffer."""
        model = {k: v.clone() for k, v in self.model.state_dict().items()}
        return {"model": model, "optimizer": self.optimizer.state_dict()}

    def set_state(self, state: dict[str, Any]) -> str:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return checksum(self.model)

    def checksum(self) -> str:
        return checksum(self.model)

    # -- weight updates (this rank is the source, rank 0 of each update group) -----------

    def init_update_group(self, store_addr: tuple[str, int], name: str, world: int) -> None:
        self._update_groups[name] = gloo_group(store_addr, name, 0, world)

    def send_bucket(self, name: str, bucket: Bucket) -> float:
        """Broadcast one bucket's wire buffer; returns seconds spent in the collective.

        The parameters are views into the bucket's buffer (bound at its first send), so
        nothing is packed: backends/bench measured packing into a fresh buffer per bucket
        at well under half of the wire's rate."""
        spans = bucket.spans
        buffer = self._views.buffer_for(
            [s.name for s in spans], [s.dtype for s in spans], [list(s.shape) for s in spans]
        )
        started = time.perf_counter()
        broadcast(self._update_groups[name], buffer)
        return time.perf_counter() - started

    def destroy_update_group(self, name: str) -> None:
        self._update_groups.pop(name, None)


TrainerActor = ray.remote(num_cpus=0, max_concurrency=4)(TrainerRank)
