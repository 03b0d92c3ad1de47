"""Tensor handles in /update_weights_from_tensor: unpickled safely, checked, made tensors.

The body's ``serialized_named_tensors`` holds one entry per TP rank: base64 of
what SGLang's ``MultiprocessingSerializer`` pickles (a handle to memory the
trainer shares: CUDA IPC on a GPU, a shared-memory file on CPU). SGLang reads
(model_runner_components/weight_updater.py ``update_weights_from_tensor``):

- ``load_format: "flattened_bucket"``: ``{"flattened_tensor": uint8 tensor,
  "metadata": [FlattenedTensorMetadata]}``, each tensor a view of its bytes
  (what miles sends: tensor_bucket.py);
- no ``load_format`` (or ``"direct"``): a list of ``(name, tensor)`` pairs.

Unpickling runs code a pickle names: handles are taken from loopback only, and
``_HandleUnpickler`` resolves only the classes a tensor handle needs. Every field
of the payload is checked here, before a byte of the weights changes; an error
names the field as ``serialized_named_tensors[0]...``.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import pickle
from typing import Any, Final

import torch

from backends.common.engine.requests import MAX_DIMS, MAX_TENSORS, BadRequest
from backends.common.session.ray_session import LOOPBACK_NAMES
from backends.common.wire.tensor_bucket import SGLANG_METADATA, FlattenedTensorMetadata
from miles_core.transfer import DTYPE_ITEMSIZE

FIELD: Final = "serialized_named_tensors"

_DTYPES: Final = {getattr(torch, name): name for name in DTYPE_ITEMSIZE if hasattr(torch, name)}

_HANDLE_GLOBALS: Final = {
    "torch": {"Tensor", "Size", "device", *(name for name in _DTYPES.values())},
    "torch.storage": {"UntypedStorage", "TypedStorage"},
    "torch.cuda": {"UntypedStorage"},
    "torch._utils": {"_rebuild_tensor_v2"},
    "collections": {"OrderedDict"},
}

_METADATA_PATHS: Final = {
    SGLANG_METADATA,
    (FlattenedTensorMetadata.__module__, "FlattenedTensorMetadata"),
}
"""SGLang's class path (miles' bodies) and ours (a sender without SGLang) for the metadata."""

Named = list[tuple[str, torch.Tensor]]


class _HandleUnpickler(pickle.Unpickler):
    """Unpickles a tensor handle and nothing else: any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_PATHS:
            return FlattenedTensorMetadata  # SGLang's own is never imported
        allowed = module == "torch.multiprocessing.reductions" and name.startswith("rebuild_")
        if allowed or name in _HANDLE_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a tensor handle")


def named_tensors(body: dict[str, Any], peer: str | None, tp_size: int = 1) -> Named:
    """The body's tensors, by name, as views of the shared memory (nothing copied yet)."""
    if peer not in LOOPBACK_NAMES:
        raise BadRequest(
            FIELD,
            f"tensor handles are unpickled, so they are taken from loopback only, not {peer}",
            status=403,
        )
    handles = body[FIELD]
    if len(handles) != tp_size:
        raise BadRequest(FIELD, f"one per TP rank ({tp_size}), got {len(handles)}")
    field = f"{FIELD}[0]"
    try:
        raw = base64.b64decode(handles[0], validate=True)
        payload = _HandleUnpickler(io.BytesIO(raw)).load()
    except (binascii.Error, ValueError) as error:
        raise BadRequest(field, f"not base64: {error}") from None
    except Exception as error:  # a hostile pickle can raise anything while loading
        raise BadRequest(field, f"not a tensor handle: {str(error)[:120]}") from None
    if body["load_format"] == "flattened_bucket":
        return _flattened(payload, field)
    return _pairs(payload, field)


def _shape(field: str, value: Any) -> tuple[int, ...]:
    ok = isinstance(value, tuple | list) and len(value) <= MAX_DIMS
    if not ok or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise BadRequest(field, f"expected at most {MAX_DIMS} sizes >= 0, got {value!r}"[:160])
    return tuple(value)


def _dtype(field: str, value: Any) -> torch.dtype:
    if not isinstance(value, torch.dtype) or value not in _DTYPES:
        raise BadRequest(field, f"expected one of {', '.join(_DTYPES.values())}, got {value!r}")
    return value


def _index(field: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(field, f"expected an integer >= 0, got {value!r}"[:120])
    return value


def _flattened(payload: Any, field: str) -> Named:
    """miles' form: each metadata entry names a byte range of the flattened uint8 tensor."""
    if not isinstance(payload, dict):
        raise BadRequest(field, "expected a pickled dict (load_format flattened_bucket)")
    flat = payload.get("flattened_tensor")
    if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8 or flat.dim() != 1:
        raise BadRequest(f"{field}.flattened_tensor", "expected a 1-D uint8 tensor")
    metadata = payload.get("metadata")
    if not isinstance(metadata, list) or not metadata or len(metadata) > MAX_TENSORS:
        raise BadRequest(f"{field}.metadata", f"expected 1 to {MAX_TENSORS} entries")
    out: Named = []
    for i, meta in enumerate(metadata):
        at = f"{field}.metadata[{i}]"
        if not isinstance(meta, FlattenedTensorMetadata):
            raise BadRequest(at, "expected a FlattenedTensorMetadata")
        name = getattr(meta, "name", None)
        if not isinstance(name, str):
            raise BadRequest(f"{at}.name", "expected a string")
        shape = _shape(f"{at}.shape", getattr(meta, "shape", None))
        dtype = _dtype(f"{at}.dtype", getattr(meta, "dtype", None))
        start = _index(f"{at}.start_idx", getattr(meta, "start_idx", None))
        end = _index(f"{at}.end_idx", getattr(meta, "end_idx", None))
        size = math.prod(shape) * dtype.itemsize
        if end - start != size or not start <= end <= flat.numel():
            raise BadRequest(
                at,
                f"{name}: bytes [{start}, {end}) of a {flat.numel()}-byte tensor, but "
                f"{list(shape)} x {_DTYPES[dtype]} is {size} bytes",
            )
        if start % dtype.itemsize:
            raise BadRequest(at, f"{name}: byte offset {start} is not a multiple of its item size")
        out.append((name, flat[start:end].view(dtype).view(shape)))
    return out


def _pairs(payload: Any, field: str) -> Named:
    """SGLang's plain form: (name, tensor) pairs."""
    if not isinstance(payload, list | tuple) or not payload or len(payload) > MAX_TENSORS:
        raise BadRequest(field, f"expected 1 to {MAX_TENSORS} (name, tensor) pairs")
    out: Named = []
    for i, pair in enumerate(payload):
        ok = isinstance(pair, tuple | list) and len(pair) == 2
        if not ok or not isinstance(pair[0], str) or not isinstance(pair[1], torch.Tensor):
            raise BadRequest(f"{field}[{i}]", "expected a (name, tensor) pair")
        _dtype(f"{field}[{i}].dtype", pair[1].dtype)
        out.append((pair[0], pair[1]))
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's spelling of a dtype ("bfloat16")."""
    return _DTYPES[dtype]
