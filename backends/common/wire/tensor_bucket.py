"""SGLang's flattened tensor bucket as miles builds it for tensor handles, and as an engine
reads it back.

miles' colocated path (megatron_utils/update_weight/update_weight_from_tensor.py
``_send_to_colocated_engine``; fsdp_utils/update_weight_utils.py
``UpdateWeightFromTensor.update_bucket_weights``) packs a bucket's tensors back to back
into one uint8 tensor with SGLang's ``FlattenedTensorBucket`` and sends, per TP rank,
base64 of the pickled ``{"flattened_tensor": ..., "metadata": [FlattenedTensorMetadata]}``
with ``load_format: "flattened_bucket"``. SGLang rebuilds each tensor as a view of its
``[start_idx, end_idx)`` bytes (sglang/srt/weight_sync/tensor_bucket.py).

The metadata's class is SGLang's own in the pickle; SGLang is not installed in the CPU
world, so ``FlattenedTensorMetadata`` here has SGLang's fields and the engine's
unpickler maps SGLang's class path onto it (``SGLANG_METADATA``) without importing
SGLang. A sender takes SGLang's class when SGLang is installed (``metadata_type``).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

SGLANG_METADATA: Final = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")
"""The module and name SGLang's metadata pickles under (what miles' bodies carry)."""


@dataclass
class FlattenedTensorMetadata:
    """SGLang's fields, in its order: a tensor's name, shape, dtype and its bytes'
    ``[start_idx, end_idx)`` in the flattened uint8 tensor (``numel`` counts those bytes)."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def metadata_type() -> type:
    """SGLang's class when SGLang is installed (so the pickle is exactly miles'), else ours."""
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata as sglangs
    except ImportError:
        return FlattenedTensorMetadata
    return sglangs


def flatten(named: Sequence[tuple[str, torch.Tensor]], out: torch.Tensor | None = None) -> Any:
    """``(flattened_tensor, metadata)`` for these tensors, packed back to back with no padding
    (as ``FlattenedTensorBucket(named_tensors=...)``); ``out``: a uint8 buffer to pack into."""
    meta_type = metadata_type()
    metadata, offset = [], 0
    for name, tensor in named:
        size = tensor.numel() * tensor.element_size()
        metadata.append(meta_type(name, tensor.shape, tensor.dtype, offset, offset + size, size))
        offset += size
    if out is None:
        out = torch.empty(offset, dtype=torch.uint8, device=named[0][1].device if named else None)
    for meta, (_, tensor) in zip(metadata, named, strict=True):
        view = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        out[meta.start_idx : meta.end_idx].copy_(view)
    return out, metadata


def serialize(obj: Any) -> str:
    """base64 of ``obj`` pickled by torch's ForkingPickler, whose reducers turn a tensor into
    a handle to its shared memory (SGLang's ``MultiprocessingSerializer.serialize`` with
    ``output_str=True``, which miles calls)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensor reducers)

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode()


def bucket_handle(named: Sequence[tuple[str, torch.Tensor]], out: torch.Tensor) -> str:
    """miles' colocated body for one bucket: the tensors flattened into ``out`` (shared
    memory the sender keeps alive until the engines answered) and its metadata, serialized."""
    flat, metadata = flatten(named, out)
    return serialize({"flattened_tensor": flat, "metadata": metadata})
