"""An engine's weights and the two ways buckets reach them: a collective group, or tensor handles.

Collective (SGLang's /init_weights_update_group, /update_weights_from_distributed):
the engine joins a group made for it (gloo, NCCL on CUDA, or on CPU ``shm``: the
trainer's shared-memory segment, backends/common/shm_group.py) and receives each
bucket's packed buffer straight into its weights (wire.BucketViews).

Tensor handles (SGLang's /update_weights_from_tensor, colocated with the trainer):
the body carries base64 of a pickled handle to the trainer's packed buffer (CUDA
IPC on a GPU, a shared-memory file on CPU); the engine copies from it. Unpickling
runs code a pickle names, so handles are taken only from loopback, and only the
torch classes a tensor handle needs may be named (``_HandleUnpickler``).

Every check runs before a byte of the weights changes (engine_requests).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from backends.common import engine_requests as req
from backends.common.engine_requests import BadRequest, bucket_payload
from backends.common.ray_session import LOOPBACK_NAMES
from backends.common.shm_group import ShmUnavailable
from backends.common.wire import (
    BucketViews,
    UnalignedTensor,
    broadcast,
    update_group,
    wire_spans,
)

_HANDLE_GLOBALS = {
    "torch": {
        "Tensor",
        "Size",
        "device",
        *(
            str(d).removeprefix("torch.")
            for d in (
                torch.float64,
                torch.float32,
                torch.bfloat16,
                torch.float16,
                torch.int64,
                torch.int32,
                torch.int16,
                torch.int8,
                torch.uint8,
                torch.bool,
            )
        ),
    },
    "torch.storage": {"UntypedStorage", "TypedStorage"},
    "torch.cuda": {"UntypedStorage"},
    "torch._utils": {"_rebuild_tensor_v2"},
    "collections": {"OrderedDict"},
}


class _HandleUnpickler(pickle.Unpickler):
    """Unpickles a tensor handle and nothing else: any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = module == "torch.multiprocessing.reductions" and name.startswith("rebuild_")
        if allowed or name in _HANDLE_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a tensor handle")


def serialize_handle(
    buffer: torch.Tensor, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Any]
) -> str:
    """What the trainer sends: base64 of the pickled handle to its packed buffer (kept alive
    by the trainer until every engine has answered)."""
    from multiprocessing.reduction import ForkingPickler

    payload = {
        "flattened_tensor": buffer,
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [list(s) for s in shapes],
    }
    return base64.b64encode(bytes(ForkingPickler.dumps(payload))).decode()


MAX_LAYOUTS = 4096
"""Checked layouts kept at most (a plan has one per bucket; a new plan adds its own)."""


class EngineWeights:
    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.model = model
        self.device = device
        self.views = BucketViews(model)
        self.groups: dict[str, Any] = {}
        self._schema = {
            name: (str(p.dtype).removeprefix("torch."), tuple(p.shape))
            for name, p in model.named_parameters()
        }
        """Each parameter's dtype and shape, read once: a check per bucket rebuilt the whole
        parameter map (backends/bench: 70 of 131 ms for the 44 checks of a 4 MiB plan)."""
        self._valid: set[tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]] = set()
        """Bucket layouts that passed ``check_bucket`` (the schema never changes)."""

    def check_bucket(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> None:
        """Each tensor names a parameter of this model with its dtype and shape. A layout that
        passed is remembered: the same buckets come every update, and checking one of 331
        tensors took 0.4 to 0.7 ms, a tenth of its transfer over shm (backends/bench)."""
        layout = (tuple(names), tuple(dtypes), tuple(tuple(s) for s in shapes))
        if layout in self._valid:
            return
        self._check(names, dtypes, shapes)
        if len(self._valid) >= MAX_LAYOUTS:
            self._valid.clear()
        self._valid.add(layout)

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
        try:
            wire_spans(names, dtypes, shapes)
        except UnalignedTensor as error:
            raise BadRequest("names", str(error)) from None

    async def join(self, body: dict[str, Any]) -> None:
        backend = body["backend"]
        if backend == "nccl" and self.device != "cuda":
            raise BadRequest("backend", "nccl needs CUDA and this engine runs on CPU: send gloo")
        if backend == "shm" and self.device != "cpu":
            raise BadRequest("backend", "shm moves host memory and this engine runs on CUDA")
        if body["rank_offset"] < 1 or body["rank_offset"] >= body["world_size"]:
            raise BadRequest("rank_offset", "must be in [1, world_size): rank 0 is the trainer")
        store = (body["master_address"], body["master_port"])
        args = (backend, store, body["group_name"], body["rank_offset"], body["world_size"])
        loop = asyncio.get_running_loop()
        try:
            group = await loop.run_in_executor(None, update_group, *args)
        except ShmUnavailable as error:
            raise BadRequest("backend", f"{error}") from None
        self.groups[body["group_name"]] = group

    async def receive(self, body: dict[str, Any]) -> None:
        """One bucket by broadcast, straight into the weights."""
        names, dtypes, shapes = bucket_payload(body)
        group = self.groups.get(body["group_name"])
        if group is None:
            raise BadRequest("group_name", f"no group {body['group_name']!r}: init it first")
        self.check_bucket(names, dtypes, shapes)
        buffer = self.views.buffer_for(names, dtypes, shapes)
        await asyncio.get_running_loop().run_in_executor(None, broadcast, group, buffer)

    def load_handles(self, body: dict[str, Any], peer: str | None) -> None:
        """One bucket from tensor handles (one per TP rank; this engine has one rank)."""
        if peer not in LOOPBACK_NAMES:
            raise BadRequest(
                "serialized_named_tensors",
                f"tensor handles are unpickled, so they are taken from loopback only, not {peer}",
                status=403,
            )
        handles = body["serialized_named_tensors"]
        if len(handles) != 1:
            raise BadRequest("serialized_named_tensors", f"one per TP rank (1), got {len(handles)}")
        field = "serialized_named_tensors[0]"
        try:
            raw = base64.b64decode(handles[0], validate=True)
            payload = _HandleUnpickler(io.BytesIO(raw)).load()
        except (binascii.Error, ValueError) as error:
            raise BadRequest(field, f"not base64: {error}") from None
        except Exception as error:  # a hostile pickle can raise anything while loading
            raise BadRequest(field, f"not a tensor handle: {str(error)[:120]}") from None
        names, dtypes, shapes, tensor = _handle_payload(payload, field)
        self.check_bucket(names, dtypes, shapes)
        nbytes = wire_spans(names, dtypes, shapes)[1]
        if tensor.numel() != nbytes:
            raise BadRequest(field, f"the buffer holds {tensor.numel()} bytes, the names {nbytes}")
        self.views.buffer_for(names, dtypes, shapes).copy_(tensor)

    def leave(self, name: str) -> None:
        self.groups.pop(name, None)


def _handle_payload(
    payload: Any, field: str
) -> tuple[list[str], list[str], list[list[int]], torch.Tensor]:
    if not isinstance(payload, dict):
        raise BadRequest(field, "expected a pickled dict")
    tensor = payload.get("flattened_tensor")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise BadRequest(f"{field}.flattened_tensor", "expected a 1-D uint8 tensor")
    body = {
        "names": req.list_of(req.text)(f"{field}.names", payload.get("names")),
        "dtypes": req.list_of(req.dtype)(f"{field}.dtypes", payload.get("dtypes")),
        "shapes": req.list_of(req.shape)(f"{field}.shapes", payload.get("shapes")),
    }
    names, dtypes, shapes = bucket_payload(body)
    return names, dtypes, shapes, tensor
