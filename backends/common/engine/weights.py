"""An engine's weights and the ways buckets reach them: a collective group, or tensor handles.

Collective (SGLang's /init_weights_update_group, /update_weights_from_distributed):
the engine joins a group made for it (gloo, NCCL on CUDA, or on CPU ``shm``: the
trainer's shared-memory segment, backends/common/wire/shm_group.py) and receives the
bucket as the body's ``load_format`` says, as SGLang 0.5.x does
(model_executor/model_runner_components/weight_updater.py
``receive_weights_from_distributed``):

- absent (what miles sends: broadcast.py ``update_weights_from_distributed``): one
  broadcast per tensor, in ``names`` order, each of its dtype and shape, received
  into fresh tensors and loaded only once every one arrived, so a broadcast that
  fails leaves the weights as they were;
- ``flattened_bucket``: one broadcast of the packed uint8 buffer, received straight
  into the weights (wire.BucketViews).

Tensor handles (SGLang's /update_weights_from_tensor, colocated with the trainer):
the body carries, per TP rank, base64 of a pickled handle (CUDA IPC on a GPU, a
shared-memory file on CPU); with ``load_format: flattened_bucket`` it is miles'
``{"flattened_tensor", "metadata": [FlattenedTensorMetadata]}`` (tensor_bucket.py),
without it a list of ``(name, tensor)`` pairs (SGLang's ``load_weights`` input).
Unpickling runs code a pickle names, so handles are taken only from loopback, and
only the classes a tensor handle needs may be named (``_HandleUnpickler``).

Every check runs before a byte of the weights changes (requests.py): a body the
engine cannot honour is a 4xx and the weights keep their checksum.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch

from backends.common.engine.handles import Named, dtype_name, named_tensors
from backends.common.engine.requests import BadRequest, bucket_payload
from backends.common.wire.buckets import BucketViews, UnalignedTensor, wire_spans
from backends.common.wire.groups import (
    GLOO_TIMEOUT,
    broadcast,
    broadcast_each,
    group_store,
    update_group,
)
from backends.common.wire.participation import JOINED, arrive
from backends.common.wire.shm_group import ShmUnavailable

MAX_LAYOUTS = 4096
"""Checked layouts kept at most (a plan has one per bucket; a new plan adds its own)."""

Layout = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]


class EngineWeights:
    def __init__(
        self, model: torch.nn.Module, device: str, timeout: datetime.timedelta = GLOO_TIMEOUT
    ) -> None:
        self.model = model
        self.device = device
        self.timeout = timeout
        """How long a broadcast waits for a member that never takes part (every group's)."""
        self.views = BucketViews(model)
        self.groups: dict[str, Any] = {}
        self._joining: set[str] = set()
        """Group names a join is under way for (a second join of one is refused)."""
        self._taking_part: dict[str, tuple[Any, int]] = {}
        """Per group: the store this engine counts its broadcasts in, and its rank."""
        self._params = dict(model.named_parameters())
        """The parameters by name (BucketViews rebinds their data, never the objects)."""
        self._schema = {
            name: (str(p.dtype).removeprefix("torch."), tuple(p.shape))
            for name, p in self._params.items()
        }
        """Each parameter's dtype and shape, read once: a check per bucket rebuilt the whole
        parameter map (backends/bench: 70 of 131 ms for the 44 checks of a 4 MiB plan)."""
        self.lying = False
        """Loads answer success and change no weight (the lying_engine fault, tokenspeed
        #1373): set only by the fault injector, through the actor (server.py ``lie``), never
        by a route. It still takes part in every broadcast (receiving into scratch), so
        its group does not stall: what it holds, its checksum says."""
        self._valid: set[tuple[bool, Layout]] = set()
        """Bucket layouts that passed ``check_bucket`` (the schema never changes), with
        whether they passed as packed."""

    def check_bucket(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        packed: bool = True,
    ) -> None:
        """Each tensor names a parameter of this model with its dtype and shape, and, packed,
        starts aligned in the flattened bucket. A layout that passed is remembered: the same
        buckets come every update, and checking one of 331 tensors took 0.4 to 0.7 ms, a
        tenth of its transfer over shm (backends/bench)."""
        key = (packed, (tuple(names), tuple(dtypes), tuple(tuple(s) for s in shapes)))
        if key in self._valid:
            return
        self._check(names, dtypes, shapes)
        if packed:
            try:
                wire_spans(names, dtypes, shapes)
            except UnalignedTensor as error:
                raise BadRequest("names", str(error)) from None
        if len(self._valid) >= MAX_LAYOUTS:
            self._valid.clear()
        self._valid.add(key)

    def _check(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> None:
        for i, (name, dt, shape) in enumerate(zip(names, dtypes, shapes, strict=True)):
            known = self._schema.get(name)
            if known is None:
                raise BadRequest(f"names[{i}]", f"{name!r} is no parameter of this model")
            have, have_shape = known
            if dt != have:
                raise BadRequest(f"dtypes[{i}]", f"{name} is {have} here, the request says {dt}")
            if tuple(shape) != have_shape:
                raise BadRequest(
                    f"shapes[{i}]", f"{name} is {list(have_shape)} here, the request says {shape}"
                )

    async def join(self, body: dict[str, Any]) -> None:
        backend = body["backend"]
        if backend == "nccl" and self.device != "cuda":
            raise BadRequest("backend", "nccl needs CUDA and this engine runs on CPU: send gloo")
        if backend == "shm" and self.device != "cpu":
            raise BadRequest("backend", "shm moves host memory and this engine runs on CUDA")
        if body["rank_offset"] < 1 or body["rank_offset"] >= body["world_size"]:
            raise BadRequest("rank_offset", "must be in [1, world_size): rank 0 is the trainer")
        store = (body["master_address"], body["master_port"])
        name, rank = body["group_name"], body["rank_offset"]
        if name in self.groups or name in self._joining:
            raise BadRequest(  # SGLang would replace the group it holds, leaking its communicator
                "group_name",
                f"{name!r} is joined already (or being joined): destroy it first, or use another "
                "name",
            )
        args = (backend, store, name, rank, body["world_size"], None, self.timeout)
        self._joining.add(name)
        try:
            group, marks = await self._join(store, name, rank, args)
        finally:
            self._joining.discard(name)
        self.groups[name] = group
        self._taking_part[name] = (marks, rank)

    async def _join(
        self, store: tuple[str, int], name: str, rank: int, args: tuple[Any, ...]
    ) -> tuple[Any, Any]:
        """Dial the store, count this member in, make the group; its group and marks."""
        await _reachable(*store)
        loop = asyncio.get_running_loop()
        try:
            marks = await loop.run_in_executor(None, group_store, store, name, self.timeout)
            await loop.run_in_executor(None, arrive, marks, rank, JOINED)
            group = await loop.run_in_executor(None, update_group, *args)
        except ShmUnavailable as error:
            raise BadRequest("backend", f"{error}") from None
        return group, marks

    def group_of(self, body: dict[str, Any]) -> Any:
        """The group a receive names, checked with the bucket before anything is received."""
        names, dtypes, shapes = bucket_payload(body)
        group = self.groups.get(body["group_name"])
        if group is None:
            raise BadRequest("group_name", f"no group {body['group_name']!r}: init it first")
        self.check_bucket(names, dtypes, shapes, packed=body["load_format"] == "flattened_bucket")
        return group

    async def receive(
        self, group: Any, body: dict[str, Any], current: Callable[[], bool] = lambda: True
    ) -> None:
        """One bucket by broadcast in ``group`` (``group_of``): packed straight into the
        weights, or tensor by tensor into fresh tensors loaded once all arrived. Raises what
        the collective raised (a peer died, or the group's timeout ran out)."""
        names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
        loop = asyncio.get_running_loop()
        marks = self._taking_part.get(body["group_name"])
        if body["load_format"] == "flattened_bucket":
            buffer = self.views.buffer_for(names, dtypes, shapes)
            if self.lying:  # received, and written nowhere the weights are
                buffer = torch.empty_like(buffer)
            await loop.run_in_executor(None, _taking_part, marks, broadcast, group, buffer)
            return
        tensors = [
            torch.empty(shape, dtype=getattr(torch, dt), device=self.device)
            for dt, shape in zip(dtypes, shapes, strict=True)
        ]
        await loop.run_in_executor(None, _taking_part, marks, broadcast_each, group, tensors)
        if not current():  # left behind by a newer load: what it got may be older weights
            raise RuntimeError("a newer load began while this one waited: nothing loaded")
        self.load(list(zip(names, tensors, strict=True)))

    def handles(self, body: dict[str, Any], peer: str | None) -> Named:
        """The tensors a /update_weights_from_tensor body hands over, checked (nothing loaded)."""
        named = named_tensors(body, peer)
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            raise BadRequest("serialized_named_tensors[0]", "a tensor named twice")
        dtypes = [dtype_name(t.dtype) for _, t in named]
        self.check_bucket(names, dtypes, [tuple(t.shape) for _, t in named], packed=False)
        return named

    def load(self, named: Named) -> None:
        """Copy checked tensors into the weights (SGLang's ``load_weights``); a lying
        engine's copy nothing."""
        if self.lying:
            return
        with torch.no_grad():
            for name, tensor in named:
                self._params[name].copy_(tensor)

    def leave(self, name: str) -> None:
        """Forget group ``name``. One this engine does not hold is refused, as SGLang refuses
        it (400, success false: model_executor/model_runner_components/weight_updater.py
        ``WeightUpdater.destroy_weights_update_group`` answers "The group to be destroyed
        does not exist.", and entrypoints/http_server.py ``destroy_weights_update_group``
        turns a failure into 400)."""
        if name not in self.groups:
            raise BadRequest("group_name", f"{name!r}: The group to be destroyed does not exist.")
        del self.groups[name]
        self._taking_part.pop(name, None)


REACH_SECONDS = 5.0
"""How long a join waits to reach the trainer's store before it fails: a closed port or an
unknown host fails the join in seconds, not in torch's retries (about 40 s here), and a
pile of such joins cannot hold the threads a real join needs."""


async def _reachable(host: str, port: int) -> None:
    """Raise (naming the store) unless a TCP connection to it opens within REACH_SECONDS."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), REACH_SECONDS)
    except (OSError, TimeoutError) as error:
        why = type(error).__name__ if isinstance(error, TimeoutError) else str(error)
        raise ConnectionError(f"cannot reach the store within {REACH_SECONDS:g}s: {why}") from None
    writer.close()


def _taking_part(marks: tuple[Any, int] | None, receive: Any, *args: Any) -> None:
    """Count this broadcast as entered (participation.py), then take part in it."""
    if marks is not None:
        arrive(*marks)
    receive(*args)
