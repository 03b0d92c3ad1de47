"""SGLang's /weights_checker on the CPU engine: snapshot, reset_tensors, compare, checksum.

miles drives it (sglang_engine.py ``check_weights``; miles/ray/placement_group.py
snapshots then resets before the first update with ``--check-weight-update-equal``,
and compares after; miles/ray/train/group.py logs the ``checksum`` action after
each update). SGLang's semantics (sglang/srt/utils/weight_checker.py
``WeightChecker``; entrypoints/http_server.py ``check_weights``): each action runs
over every parameter not named by a ``skip_tensor_list`` substring; ``compare``
needs a snapshot and fails on any difference; ``checksum`` answers each tensor's
SHA-256 and one per GPU and per engine. A failed action is HTTP 400 with
``success: false`` and the message; the weights are unchanged unless the action
is ``reset_tensors``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from backends.common.engine.requests import BadRequest


class WeightChecker:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._snapshot: dict[str, torch.Tensor] | None = None

    def _checked(self, skip: Sequence[str] | None) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            if not any(part in name for part in skip or ()):
                yield name, param.detach()

    def handle(self, action: str, skip: Sequence[str] | None) -> dict[str, Any]:
        """The response body's fields beyond success and message; BadRequest on failure."""
        if action == "snapshot":
            self._snapshot = {name: p.clone() for name, p in self._checked(None)}
            return {}
        if action == "reset_tensors":
            generator = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for _, param in self._checked(skip):
                    param.copy_(torch.rand(param.shape, generator=generator).to(param.dtype))
            return {}
        if action == "compare":
            return self._compare(skip)
        return self._checksum(skip)

    def _compare(self, skip: Sequence[str] | None) -> dict[str, Any]:
        if self._snapshot is None:
            raise BadRequest("action", "compare needs a snapshot first (action snapshot)")
        differ = [
            name
            for name, param in self._checked(skip)
            if not torch.equal(param, self._snapshot[name])
        ]
        if differ:
            raise BadRequest(
                "action", f"compare: {len(differ)} tensor(s) differ from the snapshot: {differ[:5]}"
            )
        self._snapshot = None
        return {}

    def _checksum(self, skip: Sequence[str] | None) -> dict[str, Any]:
        checksums = {name: _sha256(p) for name, p in self._checked(skip)}
        overall = hashlib.sha256()
        for name in sorted(checksums):
            overall.update(name.encode())
            overall.update(checksums[name].encode())
        per_gpu = overall.hexdigest()
        placement = dict(tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, pp_rank=0, pp_size=1)
        info = {**placement, "role": "target", "rank": 0, "size": 1}
        rank = {"checksums": checksums, "per_gpu_checksum": per_gpu, "parallelism_info": [info]}
        per_engine = hashlib.sha256(per_gpu.encode()).hexdigest()
        return {"ranks": [rank], "per_engine_checksum": per_engine}


def _sha256(tensor: torch.Tensor) -> str:
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return hashlib.sha256(raw).hexdigest()
