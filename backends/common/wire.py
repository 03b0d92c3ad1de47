"""The weight-transfer wire path, torch only: gloo groups, bucket packing and unpacking.

Kept apart from the policy (which imports transformers) and the actors (which
import ray) so the transfer benchmark times exactly this code in processes that
start in a couple of seconds.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from miles_core.transfer import Bucket, ParamSpec, StagingSpan, staging_span

GLOO_TIMEOUT = datetime.timedelta(seconds=30)


def gloo_group(store_addr: tuple[str, int], prefix: str, rank: int, size: int) -> Any:
    """A gloo process group of its own (not the default world), as torchft builds them."""
    host, port = store_addr
    store = dist.TCPStore(host, port, is_master=False, timeout=GLOO_TIMEOUT)
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, GLOO_TIMEOUT)


def broadcast(group: Any, tensor: torch.Tensor, root: int = 0) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = root
    group.broadcast([tensor], options).wait()


def pack_bucket(model: torch.nn.Module, bucket: Bucket) -> torch.Tensor:
    """The bucket's uint8 wire buffer, each tensor at its staging span."""
    params = dict(model.named_parameters())
    buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
    for span in bucket.spans:
        src = params[span.name].detach().contiguous().view(torch.uint8).reshape(-1)
        buffer[span.start : span.end].copy_(src)
    return buffer


def spans_of(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> tuple[list[StagingSpan], int]:
    """The receiver's view of a bucket from SGLang's (names, dtypes, shapes) payload."""
    spans, offset = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        spec = ParamSpec.of(name, shape, dtype)
        start, end = staging_span(offset, dtype, spec.nbytes)
        spans.append(StagingSpan(name, dtype, tuple(shape), start, end))
        offset = end
    return spans, offset


def unpack_into(model: torch.nn.Module, spans: Iterable[StagingSpan], buffer: torch.Tensor) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for span in spans:
            dst = params[span.name]
            dst.view(torch.uint8).reshape(-1).copy_(buffer[span.start : span.end])


def pack_into(params: Mapping[str, torch.Tensor], bucket: Bucket, buffer: torch.Tensor) -> None:
    """pack_bucket's bytes written into a reused ``buffer`` (padding zeroed, nothing allocated):
    a fresh large buffer costs a page fault per 4 KiB on every bucket."""
    offset = 0
    for span in bucket.spans:
        if span.start > offset:
            buffer[offset : span.start].zero_()
        buffer[span.start : span.end].copy_(
            params[span.name].detach().view(torch.uint8).reshape(-1)
        )
        offset = span.end


Layout = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]


class BucketViews:
    """Parameters as views into one persistent uint8 buffer per bucket layout (RDT-style
    staging), so the buffer *is* the bucket on the wire: the sender broadcasts it without
    packing, the receiver receives straight into its weights without unpacking. The staging
    spans are aligned to each dtype's item size, so a span views as its tensor without a
    copy; padding stays zero. The wire bytes are pack_bucket's, unchanged.

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
        spans, nbytes = spans_of(*layout)
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
