"""The ``backend`` method: the CPU backend's own transfer code, called as its actors call it.

Source: ``TrainerRank.send_bucket`` (backends/common/world/trainer.py), the method the
trainer actor runs for each bucket, packed (``flattened_bucket``) or one broadcast per
tensor (what miles sends, the backend's default), on a stand-in that holds what a one-rank
cell's actor holds (its parameters as ``BucketViews``, its update groups made
by ``gloo_group`` as ``init_update_group`` makes them). Receivers: an
``EngineWeights`` (backends/common/engine/weights.py) that joins its groups with
``join`` and takes each bucket with ``receive``, from the bodies SGLang's routes
take (backends/common/sglang/api.py), on an event loop as the engine serves them. Left out: the Ray
call and the HTTP request around each, which are not the transfer.

The bench calls the code rather than copying it, so a change to the backend's
send or receive changes the figure. Each wire gets its own groups: the bench's
``--backend`` (gloo, or NCCL on CUDA) and, on CPU, ``shm`` (the CPU backend's
``--wire shm``: backends/common/wire/shm_group.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from backends.common.engine.requests import parse
from backends.common.engine.weights import EngineWeights
from backends.common.sglang import api
from backends.common.wire.buckets import BucketViews, payload_of
from backends.common.wire.groups import update_group
from backends.common.wire.shm_group import ShmArena
from backends.common.world.trainer import TrainerRank
from miles_core.transfer import Bucket


def everyone_name(wire: str = "") -> str:
    return f"backend-{wire}-everyone" if wire else "backend-everyone"


def pair_name(receiver: int, wire: str = "") -> str:
    return f"backend-{wire}-pair{receiver}" if wire else f"backend-pair{receiver}"


def engine_group(mode: str, receiver: int, wire: str = "") -> str:
    """The one update group ``receiver`` takes a bucket on in ``mode``."""
    return everyone_name(wire) if mode == "broadcast" else pair_name(receiver, wire)


def group_names(mode: str, receivers: int, wire: str = "") -> list[str]:
    """The update groups of one send: broadcast one of everyone, p2p one per engine; ``wire``
    "" is the bench's backend, "shm" the shared-memory groups."""
    if mode == "broadcast":
        return [everyone_name(wire)]
    return [pair_name(r, wire) for r in range(1, receivers + 1)]


@dataclass
class TrainerSide:
    """What ``TrainerRank.send_bucket`` reads of its actor in a one-rank cell."""

    device: torch.device
    _views: BucketViews
    _update_groups: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    _arena: ShmArena = field(default_factory=ShmArena)
    _taking_part: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> torch.nn.Module:
        return self._views.model

    def send(self, names: Sequence[str], bucket: Bucket, packed: bool = True) -> float:
        return TrainerRank.send_bucket(self, names, bucket, packed)  # type: ignore[arg-type]

    def _in_turn(self, part: Callable[[], float]) -> float:
        """A one-rank cell takes no weight-update lock (today's miles takes it only with
        several pipeline stages: wire/cell_lock.py)."""
        return part()


class EngineSide:
    """An engine's weights with their groups joined, fed bucket bodies as the routes are."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.weights = EngineWeights(model, device.type)
        self.loop = asyncio.new_event_loop()
        self.bodies: dict[tuple[str, int], dict[str, Any]] = {}

    def join(self, store: tuple[str, int], name: str, rank: int, world: int, backend: str) -> None:
        body = api.InitWeightsUpdateGroupReqInput(store[0], store[1], rank, world, name, backend)
        self.loop.run_until_complete(self.weights.join(api.body(body)))

    def prepare(self, buckets: Sequence[Bucket], names: Sequence[str]) -> None:
        """The /update_weights_from_distributed bodies, packed and per tensor, parsed as the
        route parses them, built before timing (the trainer's side builds them, not the
        engine)."""
        self.bodies = {}
        route = api.UpdateWeightsFromDistributedReqInput.ROUTE
        for name in names:
            for bucket in buckets:
                for packed in (True, False):
                    request = api.UpdateWeightsFromDistributedReqInput(
                        *payload_of(bucket),
                        group_name=name,
                        load_format="flattened_bucket" if packed else api.OMIT,
                    )
                    raw = json.dumps(api.body(request)).encode()
                    self.bodies[(name, bucket.index, packed)] = parse(route, raw)

    def receive_all(self, name: str, buckets: Sequence[Bucket], packed: bool = True) -> None:
        """Each bucket as the route takes it: checked against the group, then received."""

        async def serve() -> None:
            for bucket in buckets:
                body = self.bodies[(name, bucket.index, packed)]
                await self.weights.receive(self.weights.group_of(body), body)

        self.loop.run_until_complete(serve())

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


def join_groups(
    me: int,
    receivers: int,
    store: tuple[str, int],
    side: TrainerSide | EngineSide,
    backend: str,
    wire: str = "",
) -> None:
    """Every process makes the backend's groups of one wire, in one order: everyone, then
    the pairs (the trainer as ``init_update_group`` does, an engine by its ``join``)."""
    world = receivers + 1
    backend = wire or backend
    if isinstance(side, TrainerSide):
        arena = side._arena
        side._update_groups[everyone_name(wire)] = update_group(
            backend, store, everyone_name(wire), 0, world, arena
        )
        for r in range(1, world):
            name = pair_name(r, wire)
            side._update_groups[name] = update_group(backend, store, name, 0, 2, arena)
        return
    side.join(store, everyone_name(wire), me, world, backend)
    side.join(store, pair_name(me, wire), 1, 2, backend)
