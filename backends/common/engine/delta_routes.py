"""The CPU engine's disk-delta routes, as a part of EngineServer: /pull_weights and
/update_weights_from_disk (miles' bodies, ``sglang_engine.py`` at 31f1ca9: ``pull_weights``
{local_checkpoint_dir, source_dir, target_version}, ``update_weights_from_disk``
{model_path, weight_version}).

/pull_weights applies the delta chain after the local checkpoint's marker onto it
(backends/common/wire/disk_delta.py ``LocalCheckpoint.pull``: staged, every tensor's
checksum of the new bytes verified, committed only then); what it refuses (a base_version
mismatch, a torn file, a checksum that fails) is a 409 with nothing changed. The local
checkpoint is made from this process's initial weights the first time (miles:
``init_local_checkpoint`` from the base checkpoint) and outlives the process.
/update_weights_from_disk loads the checkpoint into the model, a load like any other
(inside the session, refused while serving); a checkpoint whose tensors are not this
model's is a 400 before a byte changes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from backends.common.engine.http import ok, refused
from backends.common.engine.requests import BadRequest
from backends.common.engine.weights import EngineWeights
from backends.common.wire.disk_delta import LocalCheckpoint, tensor_bytes
from miles_core.disk_delta import DeltaError

DELTA_FAULTS = ("applied_twice", "skipped")
"""What the testbed's disk-delta faults arm in an engine (its next pull)."""


DELTA_ROOT_PREFIX = "miles-disk-delta-"
"""The engine writes only under a directory of the system's temp dir named so (the world makes
one per run, backends/common/world/delta_transport.py): a client's path elsewhere is refused,
a check SGLang does not make (it writes where it is told)."""


def delta_path(body: dict[str, Any], name: str) -> Path:
    """``body[name]`` as a path under a DELTA_ROOT_PREFIX directory of the temp dir."""
    path = Path(body[name])
    inside = path.is_absolute() and ".." not in path.parts
    tmp = Path(tempfile.gettempdir()).resolve()
    parts = path.parts[len(tmp.parts) :] if inside and path.is_relative_to(tmp) else ()
    if not (parts and parts[0].startswith(DELTA_ROOT_PREFIX)):
        raise BadRequest(name, f"{str(path)[:80]!r} is not under {tmp}/{DELTA_ROOT_PREFIX}*")
    return path


class DeltaRoutes:
    """Handlers over the engine's local checkpoint; EngineServer holds the state they share."""

    model: Any
    weights: EngineWeights
    weight_version: str
    delta_fault: str | None = None
    """A disk-delta fault armed for the next pull (``arm_delta_fault``)."""

    def _require_session(self, route: str) -> None: ...

    def arm_delta_fault(self, fault: str) -> None:
        """The testbed's disk-delta faults: an actor call, not a route (no HTTP client can arm
        one); ``fault`` is one of DELTA_FAULTS, used by the next pull."""
        if fault not in DELTA_FAULTS:
            raise ValueError(f"fault: got {fault!r}, choose one of {DELTA_FAULTS}")
        self.delta_fault = fault

    async def _body(self, request: web.Request) -> dict[str, Any]: ...

    async def pull_weights(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        local = LocalCheckpoint(delta_path(body, "local_checkpoint_dir"))
        source, target = delta_path(body, "source_dir"), body["target_version"]
        fault, self.delta_fault = self.delta_fault, None
        try:
            applied = local.pull(source, target, fault, self._initial)
        except (DeltaError, OSError) as error:  # nothing was committed
            return refused(f"source_dir: {error}", status=409)
        return ok(applied=list(applied), version=local.applied)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self._require_session("update_weights_from_disk")
        local = LocalCheckpoint(delta_path(body, "model_path"))
        version = body["weight_version"]
        try:
            if local.applied is None:
                raise BadRequest("model_path", f"{local.path} holds no checkpoint: pull first")
            named = self._checked(local.tensors())
        except (DeltaError, OSError, ValueError, KeyError) as error:  # not BadRequest: its own
            raise BadRequest("model_path", str(error)[:200]) from None
        if not getattr(self.weights, "lying", False):  # the lying_engine fault loads nothing
            self.weights.load(named)
        if version is not None:
            self.weight_version = version
        return ok()

    def _initial(self) -> dict[str, bytes]:
        """Version 0: this process's weights before any load from disk (its initial ones)."""
        return {n: tensor_bytes(p) for n, p in self.model.named_parameters()}

    def _checked(self, tensors: dict[str, bytes]) -> list[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors as this model's parameters, every one checked first."""
        params = dict(self.model.named_parameters())
        if set(tensors) != set(params):
            raise BadRequest("model_path", "the checkpoint's tensors are not this model's")
        named = []
        for name, data in tensors.items():
            p = params[name]
            if len(data) != p.numel() * p.element_size():
                raise BadRequest("model_path", f"{name}: {len(data)} bytes, not {p.nbytes}")
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            named.append((name, flat.view(p.dtype).reshape(p.shape)))
        return named


BEYOND_THE_PIN = {
    "/pull_weights": (
        "the SGLang miles runs against serves it (sglang.srt.weight_sync.local_checkpoint; "
        "miles 31f1ca9 sglang_engine.py pull_weights calls it); the pinned wheel has none"
    ),
}
"""Routes this engine serves that the pinned SGLang wheel lacks, and why (the contract test
leaves them out)."""
