"""The weight-transfer wire path, torch only: gloo groups, bucket packing and unpacking.

Kept apart from the policy (which imports transformers) and the actors (which
import ray) so the transfer benchmark times exactly this code in processes that
start in a couple of seconds.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
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
