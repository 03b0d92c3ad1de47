"""A bucket's bytes on the wire, torch only: SGLang's packed layout (``flattened_bucket``),
packing and unpacking, and parameters viewed in place in a persistent bucket buffer.

SGLang's receiver refuses a tensor whose byte offset is not a multiple of its item size,
and so does ours (``wire_spans``). miles_core's aligned staging spans stay the plan's
layout for RDT, where registered buffers need them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from miles_core.transfer import Bucket, ParamSpec, StagingSpan, itemsize


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
