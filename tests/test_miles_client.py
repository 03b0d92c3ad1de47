"""miles' own client against our engine: every body as miles builds it, the whole sequence.

Each request below is written from radixark/miles (31f1ca9), not from this project's
client (backends/common/sglang/api.py), so that a difference between the two shows
here; the function each body comes from is named beside it. The sequence is miles'
(update_weight_from_distributed/mixin.py ``_pause_and_prepare_engines``, the buckets,
``_finalize_and_resume_engines``; update_weight_from_tensor.py ``update_weights``
for the colocated path), with a request in flight as the pause lands, for each pause
mode and for each way buckets travel: the distributed path tensor by tensor (what
miles sends: no ``load_format``), the distributed path packed (``flattened_bucket``,
this project's ``--flattened-bucket``), and tensor handles (miles' colocated path).
After it the engine's weights are bitwise the trainer's, the version reads back the
way miles reads it (``get_weight_version``: /model_info), /weights_checker's
checksums are the trainer tensors' own, and every response field miles reads is there
(backends/common/sglang/api.py, MILES_READS).

The engines: the CPU engine (the GPU backend's ``--engine local`` is the same server
on another device). The real SGLang server needs CUDA and the ``gpu`` extra; its
variant is skipped on a machine without them (every CPU machine, CI included).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import importlib.util
import io
import socket
import sys
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

import aiohttp
import torch
import torch.distributed as dist

from backends.common.engine.server import EngineServer
from backends.common.sglang.api import missing_reads
from backends.common.training.policy import BOS, SEP, PolicyConfig
from backends.common.wire.devices import use_file_system_sharing

MODES = ("abort", "retract", "in_place")
PATHS = ("distributed", "distributed-packed", "tensor")
SGLANG_MODULE = "sglang.srt.weight_sync.tensor_bucket"

MILES_SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 2048,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": True,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}
"""rollout/sglang_rollout.py ``GenerateState.__init__``: miles' defaults, with
--rollout-max-response-len 2048 (thousands, as miles runs)."""


# -- SGLang's metadata class where miles' pickle names it ----------------------------------


@pytest.fixture
def sglang_metadata() -> Iterator[type]:
    """SGLang's FlattenedTensorMetadata at its own module path, so the pickle miles sends is
    the one SGLang's would be (SGLang is not installed here: a stand-in module with its
    fields, sglang/srt/weight_sync/tensor_bucket.py, for this test only)."""
    if importlib.util.find_spec("sglang") is not None:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        yield FlattenedTensorMetadata
        return
    names = ["sglang", "sglang.srt", "sglang.srt.weight_sync", SGLANG_MODULE]
    modules = {name: types.ModuleType(name) for name in names}

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    FlattenedTensorMetadata.__module__ = SGLANG_MODULE
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    modules[SGLANG_MODULE].FlattenedTensorMetadata = FlattenedTensorMetadata  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield FlattenedTensorMetadata
    finally:
        for name in names:
            sys.modules.pop(name, None)


# -- miles' client, body by body -------------------------------------------------------------


@dataclasses.dataclass
class MilesClient:
    """The HTTP calls of miles' SGLangEngine (backends/sglang_utils/sglang_engine.py)."""

    url: str
    http: aiohttp.ClientSession

    async def _make_request(self, endpoint: str, payload: dict[str, Any] | None) -> Any:
        """``_make_request``: POST json (``{}`` for none), raise_for_status, the JSON."""
        async with self.http.post(f"{self.url}/{endpoint}", json=payload or {}) as reply:
            text = await reply.text()
            assert reply.status == 200, f"/{endpoint} answered {reply.status}: {text}"
            return await reply.json()

    async def pause_generation(self, mode: str) -> None:
        """``pause_generation``: POST {"mode": mode}."""
        async with self.http.post(f"{self.url}/pause_generation", json={"mode": mode}) as r:
            assert r.status == 200, await r.text()

    async def flush_cache(self, tries: int = 60, interval: float = 0.05) -> int:
        """``flush_cache``: GET, tried again while not 200 (miles: 60 tries, 1 s apart; the
        interval is shorter here); how many tries it took."""
        for attempt in range(1, tries + 1):
            async with self.http.get(f"{self.url}/flush_cache") as reply:
                if reply.status == 200:
                    return attempt
            await asyncio.sleep(interval)
        raise TimeoutError("Timeout while flushing cache")

    async def begin_weight_update(self, selector: str = "all") -> Any:
        return await self._make_request("begin_weight_update", {"selector": selector})

    async def init_weights_update_group(
        self, address: str, port: int, rank_offset: int, world_size: int, group: str, backend: str
    ) -> Any:
        return await self._make_request(
            "init_weights_update_group",
            {
                "master_address": address,
                "master_port": port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group,
                "backend": backend,
            },
        )

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[torch.dtype],
        shapes: list[torch.Size],
        group_name: str,
        weight_version: str,
        load_format: str | None = None,
    ) -> Any:
        """``update_weights_from_distributed``: dtypes as ``str(dtype).replace("torch.", "")``,
        shapes as the tensors' (a torch.Size is a tuple: JSON's list), flush_cache False, no
        load_format (``load_format`` here only for the packed variant, which miles does not
        send on this path)."""
        payload: dict[str, Any] = {
            "names": names,
            "dtypes": [str(dtype).replace("torch.", "") for dtype in dtypes],
            "shapes": [list(shape) for shape in shapes],
            "group_name": group_name,
            "flush_cache": False,
            "selector": "all",
        }
        payload["weight_version"] = weight_version
        if load_format is not None:
            payload["load_format"] = load_format
        return await self._make_request("update_weights_from_distributed", payload)

    async def update_weights_from_tensor(self, serialized: list[str], weight_version: str) -> Any:
        """``update_weights_from_tensor`` as update_weight_from_tensor.py
        ``_send_to_colocated_engine`` calls it: flattened_bucket, the version, selector all."""
        payload = {
            "serialized_named_tensors": serialized,
            "load_format": "flattened_bucket",
            "flush_cache": False,
            "selector": "all",
            "weight_version": weight_version,
        }
        return await self._make_request("update_weights_from_tensor", payload)

    async def update_weight_version(self, weight_version: str) -> Any:
        return await self._make_request(
            "update_weight_version", {"new_version": weight_version, "abort_all_requests": False}
        )

    async def end_weight_update(self) -> Any:
        return await self._make_request("end_weight_update", {})

    async def continue_generation(self) -> None:
        async with self.http.post(f"{self.url}/continue_generation", json={}) as reply:
            assert reply.status == 200, await reply.text()

    async def destroy_weights_update_group(self, group_name: str) -> Any:
        return await self._make_request("destroy_weights_update_group", {"group_name": group_name})

    async def get_weight_version(self) -> str:
        """``get_weight_version``: /model_info's weight_version (SGLang removed the old route)."""
        async with self.http.get(f"{self.url}/model_info") as reply:
            assert reply.status == 200
            body = await reply.json()
            assert missing_reads("/model_info", body) == []
            return body["weight_version"]

    async def check_weights(self, action: str) -> Any:
        """``check_weights``: {"action", "allow_quant_error", "selector"}."""
        payload = {"action": action, "allow_quant_error": False, "selector": "all"}
        return await self._make_request("weights_checker", payload)

    async def get_server_info(self) -> Any:
        async with self.http.get(f"{self.url}/server_info") as reply:
            assert reply.status == 200
            return await reply.json()

    async def generate(self, rid: str, sampling: dict[str, Any]) -> dict[str, Any]:
        """rollout/sglang_rollout.py ``generate``: the router's /generate with
        ``{"sampling_params", "return_logprob": True, "input_ids"}`` (a rid added so the
        test can find the request)."""
        payload = {
            "sampling_params": sampling,
            "return_logprob": True,
            "input_ids": [BOS, 3, 1, 4, SEP],
            "rid": rid,
        }
        async with self.http.post(f"{self.url}/generate", json=payload) as reply:
            assert reply.status == 200, await reply.text()
            return await reply.json()


def serialize(obj: Any) -> str:
    """SGLang's ``MultiprocessingSerializer.serialize(obj, output_str=True)``, which miles
    calls: ForkingPickler, then base64."""
    from multiprocessing.reduction import ForkingPickler

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode("utf-8")


def flattened_bucket(
    named: list[tuple[str, torch.Tensor]], metadata_type: type
) -> tuple[torch.Tensor, list[Any]]:
    """SGLang's ``FlattenedTensorBucket(named_tensors=...)``: bytes back to back."""
    metadata, flat, offset = [], [], 0
    for name, tensor in named:
        raw = tensor.flatten().view(torch.uint8)
        metadata.append(
            metadata_type(
                name, tensor.shape, tensor.dtype, offset, offset + raw.numel(), raw.numel()
            )
        )
        flat.append(raw)
        offset += raw.numel()
    return torch.cat(flat), metadata


# -- the engine and a trainer ------------------------------------------------------------------


Body = Callable[[EngineServer, MilesClient], Awaitable[None]]


def with_engine(body: Body) -> None:
    """Run ``body`` against a fresh CPU engine on loopback, with miles' client to it."""

    async def main() -> None:
        server = EngineServer("miles-client", PolicyConfig(), token_seconds=0.005)
        port = await server.start()
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await body(server, MilesClient(f"http://127.0.0.1:{port}", http))
        finally:
            await server.stop()

    asyncio.run(main())


def trainer_weights(server: EngineServer, seed: int) -> list[tuple[str, torch.Tensor]]:
    """New values for every parameter (what a trained step gives), in the model's order."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (name, p.detach() + 0.01 * torch.randn(p.shape, generator=generator))
        for name, p in server.model.named_parameters()
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def send_distributed(
    client: MilesClient, named: list[tuple[str, torch.Tensor]], version: str, packed: bool
) -> None:
    """connect_rollout_engines_from_distributed, then broadcast.py
    ``update_weights_from_distributed``: the engine's request goes out first, then one
    ``dist.broadcast`` per tensor from rank 0 (all async, then waited); packed: one
    broadcast of the flattened bucket instead."""
    loop = asyncio.get_running_loop()
    group_name, port = "miles-pp_0", _free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)

    def rank0() -> Any:
        return dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), 0, 2, _timeout())

    joining = loop.run_in_executor(None, rank0)
    await client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name, "gloo")
    group = await joining
    names = [name for name, _ in named]
    tensors = [t.contiguous() for _, t in named]

    def broadcast() -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        sent = (
            [torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])] if packed else tensors
        )
        for work in [group.broadcast([t], options) for t in sent]:
            work.wait()

    request = asyncio.ensure_future(
        client.update_weights_from_distributed(
            names,
            [t.dtype for t in tensors],
            [t.shape for t in tensors],
            group_name,
            version,
            load_format="flattened_bucket" if packed else None,
        )
    )
    await loop.run_in_executor(None, broadcast)
    reply = await request
    assert missing_reads("/update_weights_from_distributed", reply) == []
    await client.destroy_weights_update_group(group_name)


def _timeout() -> Any:
    import datetime

    return datetime.timedelta(seconds=30)


async def send_tensor(
    client: MilesClient, named: list[tuple[str, torch.Tensor]], version: str, metadata_type: type
) -> None:
    """update_weight_from_tensor.py ``_send_to_colocated_engine``: one flattened bucket of
    every dtype (FlattenedTensorBucket.supports_multi_dtypes), one handle per TP rank."""
    use_file_system_sharing()
    flat, metadata = flattened_bucket(named, metadata_type)
    serialized = serialize({"flattened_tensor": flat, "metadata": metadata})
    reply = await client.update_weights_from_tensor([serialized], version)
    assert missing_reads("/update_weights_from_tensor", reply) == []


# -- the sequence ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_miles_update_sequence_leaves_the_engine_bitwise_the_trainers(
    sglang_metadata: type, mode: str, path: str
) -> None:
    async def body(server: EngineServer, client: MilesClient) -> None:
        first = await client.generate("warm", {**MILES_SAMPLING, "max_new_tokens": 4})
        assert missing_reads("/generate", first) == []
        assert await client.get_weight_version() == "default"
        in_flight = asyncio.ensure_future(client.generate("in-flight", MILES_SAMPLING))
        await tokens(server, "in-flight", lambda job: len(job.tokens) >= 3)
        named = trainer_weights(server, seed=MODES.index(mode) * 10 + PATHS.index(path))
        version = "7"

        # _pause_and_prepare_engines
        await client.pause_generation(mode)
        if mode != "in_place":
            await client.flush_cache()
        await client.begin_weight_update()
        # the buckets: one bucket of every tensor here
        if path == "tensor":
            await send_tensor(client, named, version, sglang_metadata)
        else:
            await send_distributed(client, named, version, packed=path == "distributed-packed")
        # _finalize_and_resume_engines
        await client.update_weight_version(version)
        await client.end_weight_update()
        await client.continue_generation()

        for name, tensor in named:
            got = dict(server.model.named_parameters())[name].detach()
            assert torch.equal(got.view(torch.int32), tensor.view(torch.int32)), name
        assert await client.get_weight_version() == version
        checksums = await client.check_weights("checksum")
        assert missing_reads("/weights_checker", checksums) == []
        expected = {
            name: hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()
            for name, t in named
        }
        assert checksums["ranks"][0]["checksums"] == expected

        if mode != "abort":  # it goes on, on the new weights
            await tokens(server, "in-flight", lambda job: job.spans[-1] == version)
        await client._make_request("abort_request", {"abort_all": True})  # the rollout's end
        reply = await in_flight
        assert missing_reads("/generate", reply) == []
        assert reply["meta_info"]["finish_reason"]["type"] == "abort"
        spans = reply["meta_info"]["weight_versions"]
        assert spans == (["default"] if mode == "abort" else ["default", version]), spans

    with_engine(body)


async def tokens(server: EngineServer, rid: str, ready: Callable[[Any], bool]) -> None:
    """Wait until the engine's request ``rid`` is ``ready``."""
    for _ in range(2000):
        job = server._jobs.get(rid)
        if job is not None and job.tokens and ready(job):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"request {rid} never got there")


def test_a_refused_flush_is_retried_until_the_frozen_requests_are_gone() -> None:
    """SGLang refuses a flush while requests hold KV; miles' flush_cache tries again (60
    tries, 1 s apart) instead of failing, and goes on once they are gone."""

    async def body(server: EngineServer, client: MilesClient) -> None:
        http, url = client.http, client.url
        requests = [
            asyncio.ensure_future(client.generate(f"r{i}", MILES_SAMPLING)) for i in range(4)
        ]
        for i in range(4):
            await tokens(server, f"r{i}", lambda job: True)
        await client.pause_generation("in_place")
        async with http.get(f"{url}/flush_cache") as reply:
            assert reply.status == 400  # the frozen requests hold KV: SGLang refuses
        flushing = asyncio.ensure_future(client.flush_cache(interval=0.01))
        await asyncio.sleep(0.05)
        assert not flushing.done()  # still trying
        await client._make_request("abort_request", {"abort_all": True})
        assert await flushing > 1
        for request in requests:
            assert (await request)["meta_info"]["finish_reason"]["type"] == "abort"

    with_engine(body)


# -- what miles reads back -------------------------------------------------------------------


def test_generate_answers_what_miles_reads_and_stops_on_a_stop_token() -> None:
    """max_new_tokens in the thousands is taken (the context is 4096); a stop token ends the
    request with finish_reason "stop" (miles marks the sample COMPLETED), the length limit
    with "length" (TRUNCATED); the stop token is the last output token, as SGLang keeps it;
    the model's EOS stops it too, unless ignore_eos."""

    async def body(server: EngineServer, client: MilesClient) -> None:
        every_token = list(range(server.model.config.vocab_size))
        stopped = await client.generate("s", {**MILES_SAMPLING, "stop_token_ids": every_token})
        meta = stopped["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": stopped["output_ids"][-1]}
        assert meta["completion_tokens"] == len(stopped["output_ids"]) == 1
        long = await client.generate("l", {**MILES_SAMPLING, "max_new_tokens": 40})
        assert long["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
        assert len(long["meta_info"]["output_token_logprobs"]) == 40
        server.model.config.eos_token_id = long["output_ids"][0]  # an EOS, as a real model has
        try:
            eos = await client.generate("e", {**MILES_SAMPLING, "max_new_tokens": 40})
            assert eos["meta_info"]["finish_reason"]["type"] == "stop"
            assert eos["output_ids"] == long["output_ids"][:1]
            ignored = await client.generate(
                "i", {**MILES_SAMPLING, "max_new_tokens": 40, "ignore_eos": True}
            )
            assert ignored["output_ids"] == long["output_ids"]  # the same seed, no stop
        finally:
            server.model.config.eos_token_id = None

    with_engine(body)


def test_server_info_is_served_under_both_names_with_what_miles_reads() -> None:
    async def body(server: EngineServer, client: MilesClient) -> None:
        for route in ("/server_info", "/get_server_info"):
            async with client.http.get(client.url + route) as reply:
                assert reply.status == 200
                info = await reply.json()
            assert missing_reads(route, info) == []
            assert info["context_length"] == 4096 and info["tp_size"] == 1

    with_engine(body)


def test_the_weights_checker_snapshots_resets_and_compares_as_miles_drives_it() -> None:
    """miles/ray/placement_group.py with --check-weight-update-equal: snapshot, then
    reset_tensors; an update later puts the weights back and compare passes. Here the reset
    alone makes compare fail (400, success false), as it must; a snapshot compared with
    unchanged weights passes."""

    async def body(server: EngineServer, client: MilesClient) -> None:
        before = (await client.check_weights("checksum"))["per_engine_checksum"]
        await client.check_weights("snapshot")
        await client.check_weights("compare")
        await client.check_weights("snapshot")
        await client.check_weights("reset_tensors")
        assert (await client.check_weights("checksum"))["per_engine_checksum"] != before
        payload = {"action": "compare", "allow_quant_error": False, "selector": "all"}
        async with client.http.post(f"{client.url}/weights_checker", json=payload) as reply:
            assert reply.status == 400
            assert (await reply.json())["success"] is False

    with_engine(body)
