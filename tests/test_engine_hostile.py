"""Hostile requests to the CPU engine over HTTP: a 4xx naming the field, and nothing changed.

One EngineServer on loopback serves the whole module, in this process, on an
event loop the module owns (no Ray, no pytest-asyncio). Every request the
engine must refuse is sent as a client would send it. For each one the test
checks that the answer is a 4xx whose JSON ``message`` starts with the field as
the client spelt it (``names[1]``, ``dtypes``, ``serialized_named_tensors[0]``,
...), that ``/health`` still answers, that a valid ``/generate`` still works, and
that the weights (``/testbed/weights_checksum``), the weight version and the
pause state are as they were.

Two positive controls show that the refusals come from checks and not from a
broken path. A valid bucket by tensor handle, and one by a real gloo group that
the engine joins, both change the weights to exactly the bytes that were sent.
A hypothesis corpus then posts random JSON, random bytes and near-valid bodies
(one field dropped or randomised) to every POST route. Every answer must be
below 500, a refusal must carry a JSON message that names a field, and at the
end the weights are unchanged. Mutations of a valid bucket are checked more
strictly: each must be refused naming the field the engine checks first. The
corpus is derandomized, so a red run replays as is.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import copy
import datetime
import io
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")
pytest.importorskip("aiohttp", reason="the CPU engine needs the cpu extra (see the README)")

import aiohttp
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from backends.common.engine.requests import SPECS, BadRequest, bucket_payload, parse
from backends.common.engine.server import MAX_BODY_BYTES, EngineServer
from backends.common.training.policy import BOS, CONTEXT_LENGTH, SEP, VOCAB, PolicyConfig
from backends.common.wire.buckets import wire_spans
from backends.common.wire.devices import use_file_system_sharing
from backends.common.wire.groups import broadcast, broadcast_each
from backends.common.wire.tensor_bucket import FlattenedTensorMetadata, serialize

NORM = "model.norm.weight"
K_PROJ = "model.layers.0.self_attn.k_proj.weight"
NORM_SHAPE = [64]
K_SHAPE = [32, 64]
NORM_BYTES = 64 * 4

GOOD_GENERATE = {
    "rid": "still-serving",
    "input_ids": [BOS, 3, 1, 4, SEP],
    "sampling_params": {"max_new_tokens": 2, "sampling_seed": 5},
}
BUCKET = {
    "names": [NORM, K_PROJ],
    "dtypes": ["float32", "float32"],
    "shapes": [NORM_SHAPE, K_SHAPE],
    "group_name": "weight_update_group",
    "flush_cache": True,
    "abort_all_requests": False,
    "weight_version": "hostile-1",
    "load_format": "flattened_bucket",
}
"""A valid /update_weights_from_distributed body, for a group this engine never joins."""
INIT_GLOO = {
    "master_address": "127.0.0.1",
    "master_port": 29500,
    "rank_offset": 1,
    "world_size": 2,
    "group_name": "weight_update_group",
    "backend": "gloo",
}
"""Its gloo join. The cases below only send it with one field broken (never a whole
valid body: the engine would try to reach a store that does not exist)."""
POST_ROUTES = (
    "/abort_request",
    "/begin_weight_update",
    "/continue_generation",
    "/destroy_weights_update_group",
    "/end_weight_update",
    "/flush_cache",
    "/generate",
    "/init_weights_update_group",
    "/pause_generation",
    "/update_weight_version",
    "/update_weights_from_distributed",
    "/update_weights_from_tensor",
    "/weights_checker",
    "/pull_weights",
    "/update_weights_from_disk",
)
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)

KEEP_ALIVE: list[torch.Tensor] = []
"""Buffers whose handles are in flight: the sender keeps them alive until the engine answers."""


# -- an engine on a loop this module owns --------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.raw)

    @property
    def message(self) -> str:
        return self.json()["message"]

    def __str__(self) -> str:
        return f"{self.status} {self.raw[:300]!r}"


class Engine:
    """A started EngineServer, an HTTP session to it and the event loop both run on.

    Each call runs the loop until its request is answered; between calls nothing runs.
    """

    def __init__(self, server: EngineServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.http: aiohttp.ClientSession | None = None
        self.url = ""

    @classmethod
    def open(cls, server: EngineServer) -> Engine:
        engine = cls(server)
        try:
            port = engine.run(server.start())
            engine.url = f"http://{server.host}:{port}"
            engine.http = engine.run(_session())
        except BaseException:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        """Close the session, stop the server and close the loop, whatever fails on the way."""
        try:
            if self.http is not None:
                self.run(self.http.close())
        finally:
            try:
                self.run(self.server.stop())
            finally:
                try:
                    self.run(self.loop.shutdown_asyncgens())
                    self.run(self.loop.shutdown_default_executor())
                finally:
                    self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def request(
        self,
        method: str,
        route: str,
        data: bytes = b"",
        headers: dict[str, str] | None = None,
        http: aiohttp.ClientSession | None = None,
    ) -> Reply:
        session = http or self.http
        assert session is not None
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        payload = io.BytesIO(data) if len(data) > 1 << 16 else data  # aiohttp's advice for big ones
        async with session.request(
            method, self.url + route, data=payload, headers=all_headers
        ) as r:
            return Reply(r.status, await r.read())

    def post(self, route: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
        """POST ``body``: bytes as they are, anything else as JSON (None: ``{}``)."""
        return self.run(self.request("POST", route, encode({} if body is None else body), headers))

    def get(self, route: str, headers: dict[str, str] | None = None) -> Reply:
        return self.run(self.request("GET", route, headers=headers))

    def checksum(self) -> str:
        reply = self.get("/testbed/weights_checksum")
        assert reply.status == 200, str(reply)
        return reply.json()["checksum"]

    def weight_version(self) -> str:
        return self.get("/model_info").json()["weight_version"]

    def set_paused(self, paused: bool) -> None:
        """Paused, inside an update session (where weights may load), or serving with none."""
        if not paused and self.server.session_open:
            assert self.post("/end_weight_update").status == 200
        reply = self.post("/pause_generation" if paused else "/continue_generation")
        assert reply.status == 200, str(reply)
        if paused and not self.server.session_open:
            assert self.post("/begin_weight_update").status == 200
        assert self.server.paused is paused and self.server.session_open is paused

    def param(self, name: str) -> torch.Tensor:
        return dict(self.server.model.named_parameters())[name].detach().clone()


async def _session(**connector: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=CLIENT_TIMEOUT, connector=aiohttp.TCPConnector(**connector) if connector else None
    )


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    harness = Engine.open(EngineServer("hostile-0", PolicyConfig()))
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(autouse=True)
def _release_buffers() -> Iterator[None]:
    yield
    KEEP_ALIVE.clear()


# -- what every refusal must show ----------------------------------------------------------


def assert_refused(reply: Reply, field: str, status: int = 400) -> None:
    """A ``status`` whose JSON message starts with ``field`` as the client spelt it."""
    assert reply.status == status, f"expected {status} naming {field!r}, got {reply}"
    body = reply.json()
    assert isinstance(body, dict) and body.get("success") is False, str(reply)
    assert body["message"].startswith(f"{field}: "), (field, body["message"])


@dataclass(frozen=True)
class State:
    checksum: str
    version: str
    paused: bool
    session: bool

    @classmethod
    def of(cls, engine: Engine) -> State:
        server = engine.server
        return cls(engine.checksum(), engine.weight_version(), server.paused, server.session_open)


def assert_nothing_changed(engine: Engine, before: State) -> None:
    """Still serving, with the weights, version and pause state of ``before``; then a valid
    /generate (after unpausing) still answers."""
    assert engine.get("/health").status == 200
    assert State.of(engine) == before
    engine.set_paused(False)
    reply = engine.post("/generate", GOOD_GENERATE)
    assert reply.status == 200, str(reply)
    assert len(reply.json()["output_ids"]) == 2


# -- bodies: buckets, handles and hostile pickles ------------------------------------------


def bucket(**changes: Any) -> dict[str, Any]:
    """BUCKET with fields replaced; a value of ``...`` drops the field."""
    body = copy.deepcopy(BUCKET)
    for key, value in changes.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return body


def new_values(seed: int) -> dict[str, torch.Tensor]:
    """New weights for NORM and K_PROJ, unlike anything the engine holds."""
    generator = torch.Generator().manual_seed(seed)
    return {
        NORM: torch.randn(NORM_SHAPE, generator=generator),
        K_PROJ: torch.randn(K_SHAPE, generator=generator),
    }


def pack(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[str], list[str], list[Any]]:
    """SGLang's flattened_bucket: each tensor's bytes back to back, in wire_spans' layout."""
    names = list(tensors)
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors.values()]
    shapes = [list(t.shape) for t in tensors.values()]
    spans, nbytes = wire_spans(names, dtypes, shapes)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    for span in spans:
        raw = tensors[span.name].contiguous().view(torch.uint8).reshape(-1)
        buffer[span.start : span.end].copy_(raw)
    return buffer, names, dtypes, shapes


def metadata(names: list[str], dtypes: list[str], shapes: list[Any]) -> list[Any]:
    """SGLang's FlattenedTensorMetadata for tensors packed back to back."""
    out, offset = [], 0
    for name, dt, shape in zip(names, dtypes, shapes, strict=True):
        dtype = getattr(torch, dt)
        size = int(torch.Size(shape).numel()) * dtype.itemsize
        out.append(
            FlattenedTensorMetadata(name, torch.Size(shape), dtype, offset, offset + size, size)
        )
        offset += size
    return out


def handle(buffer: torch.Tensor, names: list[str], dtypes: list[str], shapes: list[Any]) -> str:
    """What a colocated trainer sends (miles' flattened bucket): a file_system handle to
    ``buffer`` (kept alive) and the metadata of its tensors."""
    return handle_of(buffer, metadata=metadata(names, dtypes, shapes))


def handle_of(buffer: torch.Tensor, **payload: Any) -> str:
    """A handle whose payload is exactly ``{"flattened_tensor": buffer, **payload}``."""
    use_file_system_sharing()
    KEEP_ALIVE.append(buffer)
    return serialize({"flattened_tensor": buffer, **payload})


def pairs_handle(pairs: list[tuple[str, torch.Tensor]]) -> str:
    """SGLang's other form (no load_format): (name, tensor) pairs, each shared."""
    use_file_system_sharing()
    shared = [(name, t.clone()) for name, t in pairs]
    KEEP_ALIVE.extend(t for _, t in shared)
    return serialize(shared)


def valid_handle(seed: int = 1) -> str:
    return handle(*pack(new_values(seed)))


def noise(nbytes: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8)


class Calls:
    """Pickles as a call of ``func(*args)``: what a hostile pickle runs while loading."""

    def __init__(self, func: Callable[..., Any], *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def b64_pickle(obj: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> str:
    return base64.b64encode(pickle.dumps(obj, protocol=protocol)).decode()


def touches(marker: Path) -> Calls:
    """``os.system("touch MARKER")``: if the marker exists afterwards, the pickle ran."""
    return Calls(os.system, f"touch {marker}")


def tensors(*handles: str) -> dict[str, Any]:
    """miles' body: flattened_bucket handles, the version as a string."""
    return {
        "serialized_named_tensors": list(handles),
        "load_format": "flattened_bucket",
        "flush_cache": False,
        "weight_version": "hostile-t",
        "selector": "all",
    }


# -- 1. one hand-written bad request per rule ----------------------------------------------

DIST = "/update_weights_from_distributed"
TENSOR = "/update_weights_from_tensor"
GENERATE = "/generate"
INIT = "/init_weights_update_group"

Body = Any
"""A body (bytes as sent, anything else as JSON), or a function of the marker path giving one."""


def case(
    name: str,
    route: str,
    body: Body,
    field: str,
    *,
    paused: bool = True,
    status: int = 400,
    says: str = "",
) -> Any:
    """One bad request: the field its refusal names, the pause state it is sent in, and
    words the message must hold beyond the field."""
    return pytest.param(route, body, field, paused, status, says, id=name)


CASES = [
    # /update_weights_from_distributed: fields, sizes, the group, the pause
    case("missing-names", DIST, bucket(names=...), "names"),
    case("names-not-a-list", DIST, bucket(names=NORM), "names"),
    case("names-entry-an-int", DIST, bucket(names=[NORM, 7]), "names[1]"),
    case("missing-dtypes", DIST, bucket(dtypes=...), "dtypes"),
    case("dtypes-shorter-than-names", DIST, bucket(dtypes=["float32"]), "dtypes"),
    case("shapes-longer-than-names", DIST, bucket(shapes=[NORM_SHAPE, K_SHAPE, [1]]), "shapes"),
    case("unknown-dtype-string", DIST, bucket(dtypes=["float32", "float33"]), "dtypes[1]"),
    case("dtype-not-a-string", DIST, bucket(dtypes=["float32", 4]), "dtypes[1]"),
    case("negative-dim", DIST, bucket(shapes=[NORM_SHAPE, [32, -64]]), "shapes[1][1]"),
    case("dim-a-float", DIST, bucket(shapes=[[64.0], K_SHAPE]), "shapes[0][0]"),
    case("nine-dims", DIST, bucket(shapes=[[1] * 9, K_SHAPE]), "shapes[0]"),
    case("empty-bucket", DIST, bucket(names=[], dtypes=[], shapes=[]), "names"),
    case(
        "a-tensor-named-twice",
        DIST,
        bucket(names=[NORM, NORM], shapes=[NORM_SHAPE, NORM_SHAPE]),
        "names",
    ),
    case("too-many-tensors", DIST, bucket(names=["x"] * (1 << 16 | 1)), "names"),
    case("group-never-joined", DIST, bucket(), "group_name"),
    case("group-name-an-int", DIST, bucket(group_name=0), "group_name"),
    case("update-while-serving", DIST, bucket(), "state", paused=False, status=409),
    case("load-format-safetensors", DIST, bucket(load_format="safetensors"), "load_format"),
    case("weight-version-an-int", DIST, bucket(weight_version=3), "weight_version"),
    case("flush-cache-a-string", DIST, bucket(flush_cache="yes"), "flush_cache"),
    case("selector-bogus", DIST, bucket(selector="both"), "selector"),
    # other routes' fields
    case("new-version-an-int", "/update_weight_version", {"new_version": 3}, "new_version"),
    case("new-version-missing", "/update_weight_version", {}, "new_version"),
    case(
        "abort-all-requests-a-string",
        "/update_weight_version",
        {"new_version": "v", "abort_all_requests": "false"},
        "abort_all_requests",
    ),
    case("pause-mode-bogus", "/pause_generation", {"mode": "bogus"}, "mode", paused=False),
    case("pause-mode-an-int", "/pause_generation", {"mode": 1}, "mode", paused=False),
    case("init-nccl-on-cpu", INIT, {**INIT_GLOO, "backend": "nccl"}, "backend"),
    case(
        "init-nccl-by-default",
        INIT,
        {k: v for k, v in INIT_GLOO.items() if k != "backend"},
        "backend",
    ),
    case("init-port-70000", INIT, {**INIT_GLOO, "master_port": 70000}, "master_port"),
    case("init-rank-offset-0", INIT, {**INIT_GLOO, "rank_offset": 0}, "rank_offset"),
    case("init-rank-offset-past-world", INIT, {**INIT_GLOO, "world_size": 1}, "rank_offset"),
    case(
        "init-missing-address",
        INIT,
        {k: v for k, v in INIT_GLOO.items() if k != "master_address"},
        "master_address",
    ),
    case("init-backend-mpi", INIT, {**INIT_GLOO, "backend": "mpi"}, "backend"),
    case("abort-all-a-string", "/abort_request", {"abort_all": "true"}, "abort_all"),
    case("abort-rid-an-int", "/abort_request", {"rid": 5}, "rid"),
    case("begin-selector-bogus", "/begin_weight_update", {"selector": "x"}, "selector"),
    case("destroy-group-an-int", "/destroy_weights_update_group", {"group_name": 5}, "group_name"),
    # the body itself
    case("body-not-json", DIST, b"{names: [", "body"),
    case("body-a-json-list", DIST, b"[1, 2]", "body"),
    case("body-a-json-string", "/pause_generation", b'"abort"', "body", paused=False),
    case("body-a-json-null", "/update_weight_version", b"null", "body"),
    case("body-not-utf8", GENERATE, b'{"input_ids": [1], "\xff\xfe": 1}', "body", paused=False),
    case("body-nested-too-deep", GENERATE, b"[" * 100_000, "body", paused=False),
    case(
        "body-over-the-limit",
        GENERATE,
        {"input_ids": [BOS], "rid": "r" * MAX_BODY_BYTES},
        "body",
        paused=False,
        status=413,
    ),
    # /generate
    case("token-id-at-vocab", GENERATE, {"input_ids": [BOS, VOCAB]}, "input_ids", paused=False),
    case("token-id-huge", GENERATE, {"input_ids": [2**70]}, "input_ids", paused=False),
    case("token-id-negative", GENERATE, {"input_ids": [BOS, -1]}, "input_ids[1]", paused=False),
    case("token-id-a-bool", GENERATE, {"input_ids": [True]}, "input_ids[0]", paused=False),
    case("token-id-a-float", GENERATE, {"input_ids": [1.0]}, "input_ids[0]", paused=False),
    case("no-tokens", GENERATE, {"input_ids": []}, "input_ids", paused=False),
    case("input-ids-missing", GENERATE, {"rid": "x"}, "input_ids", paused=False),
    case(
        "too-many-tokens", GENERATE, {"input_ids": [1] * ((1 << 14) + 1)}, "input_ids", paused=False
    ),
    case(
        "max-new-tokens-1e9",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"max_new_tokens": 10**9}},
        "sampling_params.max_new_tokens",
        paused=False,
    ),
    case(
        "max-new-tokens-negative",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"max_new_tokens": -1}},
        "sampling_params.max_new_tokens",
        paused=False,
    ),
    case(
        "max-new-tokens-a-bool",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"max_new_tokens": True}},
        "sampling_params.max_new_tokens",
        paused=False,
    ),
    case(
        "sampling-seed-a-string",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"sampling_seed": "1"}},
        "sampling_params.sampling_seed",
        paused=False,
    ),
    case(
        "sampling-seed-2**64",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"sampling_seed": 2**64}},
        "sampling_params.sampling_seed",
        paused=False,
    ),
    case(
        "sampling-seed-below-int64",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"sampling_seed": -(2**63) - 1}},
        "sampling_params.sampling_seed",
        paused=False,
    ),
    case(
        "sampling-params-a-list",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": [1]},
        "sampling_params",
        paused=False,
    ),
    case("rid-an-int", GENERATE, {"input_ids": [BOS], "rid": 1}, "rid", paused=False),
    case(
        "max-new-tokens-past-the-context",
        GENERATE,
        {"input_ids": [BOS, SEP], "sampling_params": {"max_new_tokens": CONTEXT_LENGTH - 1}},
        "sampling_params.max_new_tokens",
        paused=False,
        says=f"at most {CONTEXT_LENGTH - 2}",
    ),
    case(
        "prompt-as-long-as-the-context",
        GENERATE,
        {"input_ids": [BOS] * CONTEXT_LENGTH, "sampling_params": {"max_new_tokens": 0}},
        "input_ids",
        paused=False,
        says="context length",
    ),
    case(
        "an-unknown-sampling-parameter",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"max_new_token": 4}},
        "sampling_params.max_new_token",
        paused=False,
    ),
    case(
        "stop-strings-without-a-tokenizer",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"stop": ["</s>"]}},
        "sampling_params.stop",
        paused=False,
    ),
    case(
        "two-samples-per-request",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"n": 2}},
        "sampling_params.n",
        paused=False,
    ),
    case(
        "top-p-zero",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"top_p": 0.0}},
        "sampling_params.top_p",
        paused=False,
    ),
    case(
        "temperature-negative",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"temperature": -0.5}},
        "sampling_params.temperature",
        paused=False,
    ),
    case(
        "top-k-zero",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"top_k": 0}},
        "sampling_params.top_k",
        paused=False,
    ),
    case(
        "stop-token-past-the-vocab",
        GENERATE,
        {"input_ids": [BOS], "sampling_params": {"stop_token_ids": [VOCAB]}},
        "sampling_params.stop_token_ids[0]",
        paused=False,
    ),
    case(
        "a-lora-path-this-engine-lacks",
        GENERATE,
        {"input_ids": [BOS], "lora_path": "adapter"},
        "lora_path",
        paused=False,
    ),
    case(
        "routed-experts-asked-of-a-dense-model",
        GENERATE,
        {"input_ids": [BOS], "return_routed_experts": True},
        "return_routed_experts",
        paused=False,
    ),
    case(
        "return-logprob-a-string",
        GENERATE,
        {"input_ids": [BOS], "return_logprob": "yes"},
        "return_logprob",
        paused=False,
    ),
    # /update_weights_from_tensor: the list, the base64, the pickle, the handle's bucket
    case("handles-missing", TENSOR, {}, "serialized_named_tensors"),
    case(
        "handles-a-string", TENSOR, {"serialized_named_tensors": "abc"}, "serialized_named_tensors"
    ),
    case("handle-an-int", TENSOR, {"serialized_named_tensors": [1]}, "serialized_named_tensors[0]"),
    case("sixty-five-handles", TENSOR, tensors(*["x"] * 65), "serialized_named_tensors"),
    case("no-handles", TENSOR, tensors(), "serialized_named_tensors"),
    case(
        "two-handles",
        TENSOR,
        lambda _: tensors(valid_handle(), valid_handle()),
        "serialized_named_tensors",
    ),
    case(
        "handle-not-base64",
        TENSOR,
        tensors("%%% not base64 %%%"),
        "serialized_named_tensors[0]",
        says="not base64",
    ),
    case(
        "handle-base64-of-garbage",
        TENSOR,
        tensors(base64.b64encode(b"\x80\x05garbage").decode()),
        "serialized_named_tensors[0]",
    ),
    case(
        "pickle-calls-os-system",
        TENSOR,
        lambda marker: tensors(b64_pickle(touches(marker))),
        "serialized_named_tensors[0]",
        says="system is not part of a tensor handle",
    ),
    case(
        "protocol-0-pickle-calls-os-system",
        TENSOR,
        lambda marker: tensors(b64_pickle(touches(marker), protocol=0)),
        "serialized_named_tensors[0]",
        says="system is not part of a tensor handle",
    ),
    case(
        "pickle-calls-eval",
        TENSOR,
        lambda marker: tensors(b64_pickle(Calls(eval, f"open({str(marker)!r}, 'w')"))),
        "serialized_named_tensors[0]",
        says="eval is not part of a tensor handle",
    ),
    case(
        "os-system-inside-a-handle-dict",
        TENSOR,
        lambda marker: tensors(b64_pickle({"flattened_tensor": touches(marker), "names": [NORM]})),
        "serialized_named_tensors[0]",
        says="system is not part of a tensor handle",
    ),
    case("pickle-of-a-list", TENSOR, tensors(b64_pickle([1, 2])), "serialized_named_tensors[0]"),
    case(
        "pickle-without-a-tensor",
        TENSOR,
        tensors(b64_pickle({"names": [NORM], "dtypes": ["float32"], "shapes": [NORM_SHAPE]})),
        "serialized_named_tensors[0].flattened_tensor",
    ),
    case(
        "handle-buffer-float32",
        TENSOR,
        lambda _: tensors(handle(torch.zeros(64), [NORM], ["float32"], [NORM_SHAPE])),
        "serialized_named_tensors[0].flattened_tensor",
    ),
    case(
        "handle-buffer-too-short",
        TENSOR,
        lambda _: tensors(handle(noise(10), [NORM], ["float32"], [NORM_SHAPE])),
        "serialized_named_tensors[0].metadata[0]",
        says="10-byte tensor",
    ),
    case(
        "handle-metadata-not-a-list",
        TENSOR,
        lambda _: tensors(handle_of(noise(NORM_BYTES), metadata=NORM)),
        "serialized_named_tensors[0].metadata",
    ),
    case(
        "handle-metadata-of-dicts",
        TENSOR,
        lambda _: tensors(handle_of(noise(NORM_BYTES), metadata=[{"name": NORM}])),
        "serialized_named_tensors[0].metadata[0]",
    ),
    case(
        "handle-metadata-without-a-shape",
        TENSOR,
        lambda _: tensors(
            handle_of(
                noise(NORM_BYTES),
                metadata=[FlattenedTensorMetadata(NORM, None, torch.float32, 0, 256, 256)],
            )
        ),
        "serialized_named_tensors[0].metadata[0].shape",
    ),
    case(
        "handle-metadata-unaligned",
        TENSOR,
        lambda _: tensors(
            handle_of(
                noise(NORM_BYTES + 2),
                metadata=[
                    FlattenedTensorMetadata(NORM, torch.Size([64]), torch.float32, 2, 258, 256)
                ],
            )
        ),
        "serialized_named_tensors[0].metadata[0]",
        says="not a multiple",
    ),
    case(
        "handle-metadata-past-the-end",
        TENSOR,
        lambda _: tensors(
            handle_of(
                noise(NORM_BYTES),
                metadata=[
                    FlattenedTensorMetadata(NORM, torch.Size([64]), torch.float32, 256, 512, 256)
                ],
            )
        ),
        "serialized_named_tensors[0].metadata[0]",
    ),
    case(
        "handle-unknown-parameter",
        TENSOR,
        lambda _: tensors(
            handle(noise(NORM_BYTES * 2), [NORM, "model.nope.weight"], ["float32"] * 2, [[64]] * 2)
        ),
        "names[1]",
    ),
    case(
        "handle-float16-for-float32",
        TENSOR,
        lambda _: tensors(handle(noise(NORM_BYTES // 2), [NORM], ["float16"], [NORM_SHAPE])),
        "dtypes[0]",
    ),
    case(
        "handle-wrong-shape",
        TENSOR,
        lambda _: tensors(handle(noise(NORM_BYTES), [NORM], ["float32"], [[32, 2]])),
        "shapes[0]",
    ),
    case(
        "handle-unknown-dtype",
        TENSOR,
        lambda _: tensors(handle(noise(NORM_BYTES * 2), [NORM], ["complex64"], [NORM_SHAPE])),
        "serialized_named_tensors[0]",
        says="complex64 is not part of a tensor handle",
    ),
    case(
        "handle-while-serving",
        TENSOR,
        lambda _: tensors(valid_handle()),
        "state",
        paused=False,
        status=409,
    ),
    case(
        "handle-flattened-sent-as-direct",
        TENSOR,
        lambda _: {**tensors(valid_handle()), "load_format": "direct"},
        "serialized_named_tensors[0]",
        says="(name, tensor) pairs",
    ),
    case(
        "handle-load-format-a-custom-loader",
        TENSOR,
        lambda _: {**tensors(valid_handle()), "load_format": "my.module.loader"},
        "load_format",
    ),
    case(
        "pairs-of-an-unknown-parameter",
        TENSOR,
        lambda _: {**tensors(pairs_handle([("model.nope.weight", noise(8))])), "load_format": None},
        "names[0]",
    ),
    case(
        "pairs-named-twice",
        TENSOR,
        lambda _: {
            **tensors(pairs_handle([(NORM, torch.zeros(64))] * 2)),
            "load_format": None,
        },
        "serialized_named_tensors[0]",
        says="named twice",
    ),
]


@pytest.mark.parametrize(("route", "body", "field", "paused", "status", "says"), CASES)
def test_a_bad_request_is_refused_naming_its_field(
    engine: Engine,
    tmp_path: Path,
    route: str,
    body: Body,
    field: str,
    paused: bool,
    status: int,
    says: str,
) -> None:
    marker = tmp_path / "pickle-ran"
    engine.set_paused(paused)
    before = State.of(engine)
    reply = engine.post(route, body(marker) if callable(body) else body)
    assert_refused(reply, field, status)
    assert says in reply.message, (says, reply.message)
    assert not marker.exists(), "the engine ran code a pickle named"
    assert_nothing_changed(engine, before)


@pytest.mark.parametrize(
    ("seed", "tokens"), [(2**64 - 1, 2), (2**63 - 1, 2), (-(2**63), 2)], ids=str
)
def test_a_seed_at_the_edge_of_int64_never_gives_a_5xx(
    engine: Engine, seed: int, tokens: int
) -> None:
    """The engine seeds token i with ``sampling_seed + i``: a seed at the edge of torch's
    range either works for every token or is refused naming the field, never a 500."""
    engine.set_paused(False)
    before = State.of(engine)
    body = {
        "input_ids": [BOS],
        "sampling_params": {"sampling_seed": seed, "max_new_tokens": tokens},
    }
    reply = engine.post("/generate", body)
    if reply.status != 200:
        assert_refused(reply, "sampling_params.sampling_seed")
    assert_nothing_changed(engine, before)


def test_handles_from_a_non_loopback_peer_are_refused_before_unpickling(
    engine: Engine, tmp_path: Path
) -> None:
    """Straight into EngineWeights.handles, as the handler calls it with request.remote."""
    marker = tmp_path / "pickle-ran"
    before = State.of(engine)
    for peer in ("10.0.0.1", "192.168.1.5", "::ffff:10.0.0.1", "", None):
        for body in (tensors(b64_pickle(touches(marker))), tensors(valid_handle())):
            with pytest.raises(BadRequest) as refused:
                engine.server.weights.handles(body, peer)
            assert refused.value.status == 403
            assert refused.value.field == "serialized_named_tensors"
            assert str(refused.value).startswith("serialized_named_tensors: ")
    assert not marker.exists(), "the engine ran code a pickle named"
    assert State.of(engine) == before


def test_handles_over_http_from_a_peer_outside_the_loopback_set_get_403(
    engine: Engine, tmp_path: Path
) -> None:
    """A client bound to 127.0.0.3 (request.remote is not one of the loopback peers the
    engine trusts) gets 403 for a valid handle and for a hostile pickle alike."""
    marker = tmp_path / "pickle-ran"
    engine.set_paused(True)
    before = State.of(engine)

    async def from_elsewhere(bodies: list[dict[str, Any]]) -> list[Reply]:
        http = await _session(local_addr=("127.0.0.3", 0))
        try:
            return [
                await engine.request("POST", "/update_weights_from_tensor", encode(b), http=http)
                for b in bodies
            ]
        finally:
            await http.close()

    bodies = [tensors(valid_handle()), tensors(b64_pickle(touches(marker)))]
    try:
        replies = engine.run(from_elsewhere(bodies))
    except (OSError, aiohttp.ClientConnectorError) as error:
        pytest.skip(f"cannot bind a client to 127.0.0.3 here: {error}")
    for reply in replies:
        assert_refused(reply, "serialized_named_tensors", status=403)
    assert not marker.exists(), "the engine ran code a pickle named"
    assert_nothing_changed(engine, before)


# -- 2. positive controls: the same paths load a valid bucket, bitwise --------------------


def test_a_valid_handle_loads_exactly_the_sent_bytes(engine: Engine) -> None:
    engine.set_paused(True)
    before = engine.checksum()
    sent = new_values(seed=42)
    assert not any(torch.equal(engine.param(n), t) for n, t in sent.items())
    reply = engine.post("/update_weights_from_tensor", tensors(handle(*pack(sent))))
    assert reply.status == 200, str(reply)
    assert reply.json()["success"] is True
    assert engine.checksum() != before
    assert engine.weight_version() == "hostile-t"
    for name, tensor in sent.items():
        got = engine.param(name)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.view(torch.int32), tensor.view(torch.int32)), name
    assert_nothing_changed(engine, State.of(engine))


def _join(engine: Engine, group_name: str) -> Any:
    """The engine joins a gloo group of two as rank 1; this process is rank 0."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=20)

    def rank0() -> Any:
        return dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), 0, 2, timeout)

    async def both() -> tuple[Reply, Any]:
        trainer = engine.loop.run_in_executor(None, rank0)
        body = {**INIT_GLOO, "master_port": store.port, "group_name": group_name}
        reply = await engine.request("POST", "/init_weights_update_group", encode(body))
        return reply, await trainer

    reply, group = engine.run(both())
    assert reply.status == 200, str(reply)
    return store, group


def test_a_joined_group_refuses_bad_buckets_before_the_collective_and_loads_a_good_one(
    engine: Engine,
) -> None:
    """With a real group joined, names, dtypes and shapes that disagree with the model are
    refused before the engine enters the broadcast (else it would block there); a valid
    bucket then arrives bitwise; after /destroy_weights_update_group the group is unknown."""
    name = "hostile-joined"
    _store, group = _join(engine, name)
    try:
        engine.set_paused(True)
        refusals = [
            (bucket(group_name=name, names=[NORM, "model.nope.weight"]), "names[1]"),
            (bucket(group_name=name, names=["lm_head.bias", K_PROJ]), "names[0]"),
            (bucket(group_name=name, dtypes=["float32", "float16"]), "dtypes[1]"),
            (bucket(group_name=name, dtypes=["bfloat16", "float32"]), "dtypes[0]"),
            (bucket(group_name=name, shapes=[NORM_SHAPE, [64, 32]]), "shapes[1]"),
            (bucket(group_name=name, shapes=[[65], K_SHAPE]), "shapes[0]"),
            (bucket(group_name=name, shapes=[[64, 1], K_SHAPE]), "shapes[0]"),
        ]
        for body, field in refusals:
            before = State.of(engine)
            assert_refused(engine.post("/update_weights_from_distributed", body), field)
            assert State.of(engine) == before
            assert engine.get("/health").status == 200

        sent = new_values(seed=43)
        buffer = pack(sent)[0]
        before = engine.checksum()

        async def send() -> Reply:
            trainer = engine.loop.run_in_executor(None, broadcast, group, buffer)
            body = bucket(group_name=name, weight_version="hostile-d")
            reply = await engine.request("POST", "/update_weights_from_distributed", encode(body))
            await trainer
            return reply

        reply = engine.run(send())
        assert reply.status == 200, str(reply)
        assert engine.checksum() != before
        assert engine.weight_version() == "hostile-d"
        for param, tensor in sent.items():
            assert torch.equal(engine.param(param).view(torch.int32), tensor.view(torch.int32))
    finally:
        destroyed = engine.post("/destroy_weights_update_group", {"group_name": name})
    assert destroyed.status == 200, str(destroyed)
    engine.set_paused(True)
    assert_refused(
        engine.post("/update_weights_from_distributed", bucket(group_name=name)), "group_name"
    )
    assert_nothing_changed(engine, State.of(engine))


def test_a_per_tensor_update_as_miles_sends_it_loads_exactly_the_sent_bytes(
    engine: Engine,
) -> None:
    """miles' distributed path: no load_format, one broadcast per tensor in names order
    (broadcast.py ``update_weights_from_distributed``); the engine ends bitwise equal."""
    name = "hostile-per-tensor"
    _store, group = _join(engine, name)
    try:
        engine.set_paused(True)
        sent = new_values(seed=44)
        before = engine.checksum()

        async def send() -> Reply:
            trainer = engine.loop.run_in_executor(None, broadcast_each, group, list(sent.values()))
            body = bucket(group_name=name, weight_version="hostile-p", load_format=...)
            reply = await engine.request("POST", "/update_weights_from_distributed", encode(body))
            await trainer
            return reply

        reply = engine.run(send())
        assert reply.status == 200, str(reply)
        assert reply.json() == {"success": True, "message": ""}
        assert engine.checksum() != before
        assert engine.weight_version() == "hostile-p"
        for param, tensor in sent.items():
            assert torch.equal(engine.param(param).view(torch.int32), tensor.view(torch.int32))
    finally:
        engine.post("/destroy_weights_update_group", {"group_name": name})
    assert_nothing_changed(engine, State.of(engine))


CUT_SHORT_TRAINER = """
import datetime, os, sys
import torch, torch.distributed as dist
port, name = int(sys.argv[1]), sys.argv[2]
store = dist.TCPStore("127.0.0.1", port, is_master=False)
group = dist.ProcessGroupGloo(dist.PrefixStore(name, store), 0, 2, datetime.timedelta(seconds=20))
options = dist.BroadcastOptions()
options.rootRank = 0
group.broadcast([torch.full([64], 3.0)], options).wait()
os._exit(0)  # dies before the bucket's second tensor
"""


def test_a_per_tensor_update_cut_short_answers_400_and_keeps_every_weight(
    engine: Engine,
) -> None:
    """The trainer (a process of its own) broadcasts the first of the bucket's two tensors and
    dies: the engine answers SGLang's "Failed to receive weights" (400), never success, and
    since tensors load only once all arrived, the weights, the version and the checksum are
    as they were."""
    import subprocess
    import sys

    name = "hostile-cut-short"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    engine.set_paused(True)
    before = State.of(engine)
    trainer = subprocess.Popen([sys.executable, "-c", CUT_SHORT_TRAINER, str(store.port), name])
    try:
        body = {**INIT_GLOO, "master_port": store.port, "group_name": name}
        assert engine.post("/init_weights_update_group", body).status == 200
        cut = bucket(group_name=name, weight_version="never", load_format=...)
        reply = engine.post("/update_weights_from_distributed", cut)
    finally:
        trainer.wait(timeout=30)
        engine.post("/destroy_weights_update_group", {"group_name": name})
    assert reply.status == 400, str(reply)
    assert reply.json()["success"] is False
    assert reply.message.startswith("Failed to receive weights"), reply.message
    assert_nothing_changed(engine, before)


def test_a_pairs_handle_loads_exactly_the_sent_bytes(engine: Engine) -> None:
    """SGLang's other tensor form (no load_format): (name, tensor) pairs."""
    engine.set_paused(True)
    sent = new_values(seed=46)
    body = {**tensors(pairs_handle(list(sent.items()))), "load_format": None}
    reply = engine.post("/update_weights_from_tensor", body)
    assert reply.status == 200, str(reply)
    for name, tensor in sent.items():
        assert torch.equal(engine.param(name).view(torch.int32), tensor.view(torch.int32)), name
    assert_nothing_changed(engine, State.of(engine))


def test_a_load_that_asks_for_a_flush_while_requests_hold_kv_says_so(engine: Engine) -> None:
    """SGLang's ``flush_cache_after_weight_update``: the weights load, and the answer is a
    400 saying the cache was not flushed (miles sends flush_cache false for this reason)."""
    engine.set_paused(False)
    request = engine.loop.create_task(
        engine.request(
            "POST",
            "/generate",
            encode({"input_ids": [BOS], "sampling_params": {"max_new_tokens": 500}}),
        )
    )
    engine.run(asyncio.sleep(0.05))
    engine.post("/pause_generation", {"mode": "in_place"})  # frozen on its KV
    assert engine.post("/begin_weight_update").status == 200
    sent = new_values(seed=47)
    body = {**tensors(handle(*pack(sent))), "flush_cache": True}
    reply = engine.post("/update_weights_from_tensor", body)
    assert reply.status == 400 and "the cache was not flushed" in reply.message, str(reply)
    assert torch.equal(engine.param(NORM).view(torch.int32), sent[NORM].view(torch.int32))
    engine.set_paused(False)
    assert engine.run(request).status == 200


# -- 3. a corpus: random JSON, random bytes, mutated buckets to every POST route ----------

FIELD_NAMES = sorted(
    {key for spec in SPECS.values() for key in spec} | {"max_new_tokens", "sampling_seed"}
)
WORDS = [
    *FIELD_NAMES,
    NORM,
    K_PROJ,
    "model.nope.weight",
    "float32",
    "float16",
    "torch.float32",
    "bfloat16",
    "abort",
    "retract",
    "in_place",
    "nccl",
    "flattened_bucket",
    "direct",
    "all",
    "weight_update_group",
    "127.0.0.1",
    "",
    "\ud800",
    "\x00",
    "A" * 300,
]
"""Strings the engine reacts to (never "gloo": a valid gloo join would dial a store)."""

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, VOCAB, -1, 0, 65536])
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(WORDS)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=24,
)
json_objects = st.dictionaries(
    st.sampled_from(FIELD_NAMES) | st.text(max_size=6), json_values, max_size=7
)
bodies = json_objects | json_values | st.binary(max_size=48)

DELTA_DIR = Path(tempfile.gettempdir()) / f"miles-disk-delta-hostile-{os.getpid()}"
"""Where disk-delta's routes may write (delta_routes.py): a pull of version 0 makes the
local checkpoint there; removed when the tests end."""
atexit.register(shutil.rmtree, DELTA_DIR, True)

VALID_BODIES: dict[str, dict[str, Any]] = {
    "/abort_request": {"rid": "nobody", "abort_all": False},
    "/begin_weight_update": {"selector": "all"},
    "/continue_generation": {},
    "/destroy_weights_update_group": {"group_name": "never-joined"},
    "/end_weight_update": {},
    "/flush_cache": {},
    "/generate": GOOD_GENERATE,
    "/init_weights_update_group": {**INIT_GLOO, "backend": "nccl"},
    "/pause_generation": {"mode": "retract"},
    "/update_weight_version": {"new_version": "v", "abort_all_requests": False},
    "/update_weights_from_distributed": BUCKET,
    "/update_weights_from_tensor": tensors("not-a-handle"),
    "/weights_checker": {"action": "checksum", "skip_tensor_list": ["norm"]},
    "/pull_weights": {  # version 1 was never written there: refused, nothing made
        "local_checkpoint_dir": str(DELTA_DIR / "local"),
        "source_dir": str(DELTA_DIR),
        "target_version": 1,
    },
    "/update_weights_from_disk": {"model_path": str(DELTA_DIR / "local"), "weight_version": "v"},
}
"""Per route, a body the engine accepts (or refuses for state only), to mutate one field at
a time: random JSON rarely gets past the first check, these reach the later ones."""


@st.composite
def near_valid(draw: st.DrawFn, route: str) -> dict[str, Any]:
    """VALID_BODIES[route] with a few of its fields (or sampling_params' keys) dropped or set
    to random JSON."""
    body = copy.deepcopy(VALID_BODIES[route])
    keys = sorted({*SPECS.get(route, {}), "max_new_tokens", "sampling_seed"} - {"backend"})
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(keys))
        target = body
        if key in ("max_new_tokens", "sampling_seed"):
            if not isinstance(body.get("sampling_params"), dict):
                body["sampling_params"] = {}
            target = body["sampling_params"]
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(scalars | json_values)
    return body


@st.composite
def routed_bodies(draw: st.DrawFn) -> tuple[str, Any]:
    """A POST route and, half the time, a near-valid body for it; else any body at all."""
    route = draw(st.sampled_from(POST_ROUTES))
    return route, draw(near_valid(route) if draw(st.booleans()) else bodies)


def assert_answered(reply: Reply) -> None:
    """Below 500, and a refusal is JSON whose message starts with a field name."""
    assert reply.status < 500, str(reply)
    if reply.status >= 400:
        body = reply.json()
        assert isinstance(body, dict) and isinstance(body.get("message"), str), str(reply)
        field = body["message"].split(": ", 1)[0]
        root = field.split("[", 1)[0].split(".", 1)[0]
        assert root in {*FIELD_NAMES, "body", "state", "session"}, str(reply)


def test_the_corpus_covers_every_post_route(engine: Engine) -> None:
    served = {
        route.resource.canonical
        for route in engine.server.app().router.routes()
        if route.method in ("POST", "*") and route.resource is not None
    }
    assert served == set(POST_ROUTES)


CORPUS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same corpus on every run: a red run replays as is
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_any_body_to_any_post_route_is_answered_below_500(engine: Engine) -> None:
    before = engine.checksum()

    @CORPUS
    @given(routed=routed_bodies(), paused=st.booleans())
    def one(routed: tuple[str, Any], paused: bool) -> None:
        route, body = routed
        if isinstance(body, dict) and body.get("backend") in ("gloo", "shm"):
            body["backend"] = "nccl"  # never dial a store (see WORDS)
        engine.set_paused(paused and route != "/generate")  # a paused engine holds /generate
        reply = engine.post(route, encode(body))
        event(f"{route} {reply.status}")  # shown by --hypothesis-show-statistics
        assert_answered(reply)
        assert engine.get("/health").status == 200

    one()
    assert engine.checksum() == before
    assert_nothing_changed(engine, State.of(engine))


CONFUSING = [
    *(NORM, K_PROJ, "model.nope.weight", "float16", "torch.float32", "int8"),
    *([-1], [64, 1], [], [2**70], None, 10**20, "", {"a": 1}),
]
"""Entries that look almost right in a bucket's lists."""


@st.composite
def mutated_buckets(draw: st.DrawFn) -> dict[str, Any]:
    """BUCKET after a few edits: a field dropped, retyped or added; a list truncated,
    extended, reordered or given a confusing entry; two fields' values swapped."""
    body: dict[str, Any] = copy.deepcopy(BUCKET)
    confusing = st.sampled_from(CONFUSING).map(copy.deepcopy)  # lists get edited
    for _ in range(draw(st.integers(0, 4))):
        op = draw(
            st.sampled_from(["drop", "retype", "truncate", "extend", "swap", "entry", "fields"])
        )
        key = draw(st.sampled_from(sorted(body))) if body else None
        lists = sorted(k for k, v in body.items() if isinstance(v, list))
        if op == "drop" and key is not None:
            del body[key]
        elif op == "retype" and key is not None:
            body[key] = draw(json_values)
        elif op == "fields":
            body[draw(st.sampled_from(FIELD_NAMES))] = draw(json_values | confusing)
        elif lists:
            lst = body[draw(st.sampled_from(lists))]
            if op == "truncate":
                del lst[draw(st.integers(0, len(lst))) :]
            elif op == "extend":
                lst.append(draw(confusing | json_values))
            elif op == "swap" and len(lst) >= 2:
                i, j = draw(st.permutations(range(len(lst))))[:2]
                lst[i], lst[j] = lst[j], lst[i]
            elif op == "entry" and lst:
                lst[draw(st.integers(0, len(lst) - 1))] = draw(confusing)
        if op == "swap" and len(body) >= 2:
            a, b = draw(st.permutations(sorted(body)))[:2]
            if draw(st.booleans()):
                body[a], body[b] = body[b], body[a]
    return body


def expected_field(body: dict[str, Any], paused: bool) -> tuple[str, int]:
    """The field the engine must name and its status, in the order it checks: its state
    (serving: no load, 409, before the body is read), the body's fields, the bucket's
    sizes, then the group (this engine joined none)."""
    route = "/update_weights_from_distributed"
    if not paused:
        return "state", 409
    try:
        parsed = parse(route, encode(body))
        bucket_payload(parsed)
    except BadRequest as error:
        return error.field, error.status
    return "group_name", 400


def test_mutated_buckets_are_refused_and_a_valid_one_names_the_unjoined_group(
    engine: Engine,
) -> None:
    before = engine.checksum()
    engine.set_paused(True)
    assert_refused(engine.post("/update_weights_from_distributed", BUCKET), "group_name")

    @CORPUS
    @given(body=mutated_buckets(), paused=st.booleans())
    def one(body: dict[str, Any], paused: bool) -> None:
        engine.set_paused(paused)
        reply = engine.post("/update_weights_from_distributed", body)
        assert_refused(reply, *expected_field(body, paused))
        assert engine.get("/health").status == 200

    one()
    assert engine.checksum() == before
    assert_nothing_changed(engine, State.of(engine))


# -- 4. api_key ---------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [None, ""])
def test_binding_off_loopback_without_an_api_key_is_refused(api_key: str | None) -> None:
    with pytest.raises(ValueError) as refused:
        EngineServer("open-0", PolicyConfig(), host="0.0.0.0", api_key=api_key)
    assert "api_key" in str(refused.value) and "host" in str(refused.value)


def test_every_request_needs_the_api_key_when_one_is_set() -> None:
    keyed = Engine.open(EngineServer("keyed-0", PolicyConfig(), api_key="k"))
    try:
        hostile = {"input_ids": [BOS, VOCAB]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k"}):
            for reply in (
                keyed.get("/health", headers),
                keyed.get("/testbed/weights_checksum", headers),
                keyed.post("/generate", GOOD_GENERATE, headers),
                keyed.post("/generate", hostile, headers),
                keyed.post("/pause_generation", {}, headers),
            ):
                assert reply.status == 401, str(reply)
                assert "Authorization" in reply.message
        assert keyed.server.paused is False
        auth = {"Authorization": "Bearer k"}
        assert keyed.get("/health", auth).status == 200
        reply = keyed.post("/generate", GOOD_GENERATE, auth)
        assert reply.status == 200 and len(reply.json()["output_ids"]) == 2, str(reply)
        assert_refused(keyed.post("/generate", hostile, auth), "input_ids")
        port = int(keyed.url.rsplit(":", 1)[1])
    finally:
        keyed.close()

    async def connect() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()

    with pytest.raises(OSError):  # stopped: nothing listens on its port any more
        asyncio.run(connect())
