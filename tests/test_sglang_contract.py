"""Our SGLang client and our SGLang-shaped engine, held to the pinned SGLang wheel's source.

The wheel is downloaded once (backends.common.sglang.contract.ensure_wheel) and read as
text; a download that fails fails these tests: CI has network, and an unchecked contract
must not pass quietly. The parser is also tested on small synthetic sources, wheel-free.
"""

from __future__ import annotations

import dataclasses
import subprocess
import zipfile
from pathlib import Path

import pytest

from backends.common.sglang.api import (
    MILES_SENDS,
    REQUESTS,
    TESTBED_PREFIX,
    SGLangRequest,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightVersionReqInput,
)
from backends.common.sglang.contract import (
    Route,
    SGLangAPI,
    WheelUnavailable,
    api_from_sources,
    check_client,
    check_engine_fields,
    check_engine_routes,
    check_miles,
    ensure_wheel,
    parse_routes,
    parse_types,
    read_sglang_api,
)


@pytest.fixture(scope="module")
def api() -> SGLangAPI:
    try:
        wheel = ensure_wheel()
    except WheelUnavailable as error:
        pytest.fail(f"the SGLang contract cannot be checked: {error}", pytrace=False)
    return read_sglang_api(wheel)


@pytest.fixture(scope="module")
def engine_app():
    from backends.common.engine.server import EngineServer
    from backends.common.training.policy import PolicyConfig

    return EngineServer("engine-0", PolicyConfig()).app()


def _copy(
    request: type[SGLangRequest], rename: dict[str, str] | None = None, route: str | None = None
) -> type[SGLangRequest]:
    """A copy of ``request`` (same class name) with fields renamed and maybe another ROUTE."""
    rename = rename or {}
    fields = [
        (
            rename.get(f.name, f.name),
            f.type,
            dataclasses.field()
            if f.default is dataclasses.MISSING
            else dataclasses.field(default=f.default),
        )
        for f in dataclasses.fields(request)
    ]
    return dataclasses.make_dataclass(
        request.__name__,
        fields,
        bases=(SGLangRequest,),
        frozen=True,
        namespace={"ROUTE": route or request.ROUTE, "METHOD": request.METHOD},
    )


def _swapped(
    original: type[SGLangRequest], copy: type[SGLangRequest]
) -> tuple[type[SGLangRequest], ...]:
    return tuple(copy if r is original else r for r in REQUESTS)


# -- the real wheel ------------------------------------------------------------------------


def test_our_client_speaks_sglang(api: SGLangAPI) -> None:
    assert check_client(api) == []


def test_our_client_sends_what_miles_sends(api: SGLangAPI) -> None:
    assert check_miles(api, REQUESTS, MILES_SENDS) == []


def test_our_engine_serves_only_sglang_routes(api: SGLangAPI, engine_app) -> None:
    from backends.common.engine.delta_routes import BEYOND_THE_PIN

    routes = [(r.method, r.resource.canonical) for r in engine_app.router.routes()]
    routes = [(m, path) for m, path in routes if path not in BEYOND_THE_PIN]
    assert ("GET", "/model_info") in routes
    assert check_engine_routes(api, routes) == []


def test_our_engine_reads_only_sglang_fields(api: SGLangAPI, engine_app) -> None:
    from backends.common.engine.requests import ENGINE_READS

    posts = {
        r.resource.canonical
        for r in engine_app.router.routes()
        if r.method == "POST" and not r.resource.canonical.startswith(TESTBED_PREFIX)
    }
    from backends.common.engine.delta_routes import BEYOND_THE_PIN

    assert posts <= ENGINE_READS.keys(), "a POST route whose body fields go unchecked"
    ours = {r: f for r, f in ENGINE_READS.items() if r not in BEYOND_THE_PIN}
    assert check_engine_fields(api, ours) == []


def test_known_facts_of_sglang(api: SGLangAPI) -> None:
    assert api.routes["/model_info"].methods == {"GET"}
    assert "/get_weight_version" not in api.routes
    assert {"GET", "POST"} <= api.routes["/flush_cache"].methods
    assert api.routes["/flush_cache"].request_type is None
    assert api.routes["/update_weight_version"].request_type == "UpdateWeightVersionReqInput"
    version = api.types["UpdateWeightVersionReqInput"]
    assert version["abort_all_requests"] is True and version["new_version"] is False
    distributed = api.types["UpdateWeightsFromDistributedReqInput"]
    assert {"load_format", "weight_version", "flush_cache", "group_name"} <= distributed.keys()
    assert not distributed["names"] and distributed["group_name"]
    assert api.types["AbortReq"]["rid"]  # from BaseReq, msgspec-style inheritance
    assert api.routes["/generate"].request_type == "GenerateReqInput"
    assert api.types["GenerateReqInput"]["rid"] is True  # field(default=None, kw_only=True)


def test_a_renamed_client_field_fails(api: SGLangAPI) -> None:
    """SGLang drops unknown keys: ``group`` would be ignored and its default group used. SGLang
    defaults group_name, so the unknown field is the one problem (a required field renamed
    is reported twice: the next test)."""
    original = UpdateWeightsFromDistributedReqInput
    copy = _copy(original, {"group_name": "group"})
    assert "group" in {f.name for f in dataclasses.fields(copy)}
    problems = check_client(api, _swapped(original, copy))
    assert len(problems) == 1, problems
    assert "/update_weights_from_distributed" in problems[0] and ".group:" in problems[0]


def test_a_renamed_required_field_is_reported_twice(api: SGLangAPI) -> None:
    original = UpdateWeightsFromDistributedReqInput
    problems = check_client(api, _swapped(original, _copy(original, {"shapes": "shape"})))
    assert len(problems) == 2, problems
    assert all(p.startswith("/update_weights_from_distributed:") for p in problems)
    assert any(".shape:" in p for p in problems)
    assert any("never sends shapes" in p for p in problems)


def test_a_renamed_route_fails(api: SGLangAPI) -> None:
    original = UpdateWeightVersionReqInput
    copy = _copy(original, route="/update_weights_version")
    problems = check_client(api, _swapped(original, copy))
    assert problems == [
        "/update_weights_version: SGLang serves no such route (UpdateWeightVersionReqInput)"
    ]


def test_an_engine_serving_get_weight_version_fails(api: SGLangAPI) -> None:
    problems = check_engine_routes(api, [("GET", "/get_weight_version"), ("GET", "/health")])
    assert problems == ["/get_weight_version: the engine serves it, SGLang does not"]
    assert check_engine_routes(api, [("PUT", "/model_info")]) != []
    assert check_engine_routes(api, [("GET", "/testbed/anything"), ("*", "/flush_cache")]) == []


def test_an_engine_reading_a_field_sglang_lacks_fails(api: SGLangAPI) -> None:
    problems = check_engine_fields(api, {"/update_weight_version": ["new_version", "version"]})
    assert problems == [
        "/update_weight_version: the engine reads version, "
        "SGLang's UpdateWeightVersionReqInput has no version"
    ]


def test_miles_fields_our_client_lacks_fail(api: SGLangAPI) -> None:
    sends = {**MILES_SENDS, "/pause_generation": frozenset({"mode", "timeout"})}
    problems = check_miles(api, REQUESTS, sends)
    assert any("/pause_generation: miles sends timeout" in p for p in problems), problems


# -- the parser, wheel-free ------------------------------------------------------------------

HTTP_SERVER = """
import os
from typing import Annotated, Optional
from fastapi import Body, FastAPI, Query, Request

app = FastAPI()

@app.get("/health")
@app.get("/health_generate")
async def health(request: Request):
    ...

@app.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(timeout: float = Query(0.0)):
    ...

@app.api_route("/generate", methods=["POST", "PUT"], response_class=None)
async def generate(obj: GenerateReqInput, request: Request):
    ...

@app.post("/abort_request")
async def abort(obj: Annotated[AbortReq, Body()], request: Request):
    ...

@app.api_route("/start_profile", methods=["GET", "POST"])
async def start_profile(obj: Annotated[Optional[ProfileReq], Body()] = None):
    ...

@app.get("/q")
async def query_only(level: Annotated[int, Query()], name: "str | None" = None):
    ...

@app.post(os.environ.get("AIP_PREDICT_ROUTE", "/vertex_generate"))
async def vertex(req: "VertexReq | None", raw_request: Request):
    ...

if os.environ.get("X"):
    @app.api_route("/conditional")
    async def conditional():
        ...

@app.api_route("/split", methods=["PUT"])
async def split_put(obj: Annotated[SplitReq, Body()]):
    ...

@app.api_route("/split", methods=["DELETE"])
async def split_delete():
    ...

@router.post("/elsewhere")
async def not_on_app(obj: Other):
    ...
"""

IO_STRUCT = """
from dataclasses import dataclass, field
from typing import ClassVar
import msgspec

class BaseReq(msgspec.Struct, tag=True, kw_only=True):
    rid: Optional[str] = None

@dataclass
class GenerateReqInput:
    rid: Optional[str] = field(default=None, kw_only=True)
    input_ids: list[int] = None
    tags: list = field(default_factory=list)
    must: int = field(repr=False)
    kind: ClassVar[str] = "generate"

class AbortReq(BaseReq, kw_only=True):
    abort_all: bool = False

class Derived(AbortReq, kw_only=True):
    extra: int
    abort_all: bool

class AbortReqOutput(BaseReq, kw_only=True):
    success: bool

AliasOutput = OtherAlias = AbortReqOutput
"""


def test_parse_routes() -> None:
    routes = parse_routes(HTTP_SERVER)
    assert routes["/health"] == routes["/health_generate"] == Route(frozenset({"GET"}), None)
    assert routes["/flush_cache"] == Route(frozenset({"GET", "POST"}), None)
    assert routes["/generate"] == Route(frozenset({"POST", "PUT"}), "GenerateReqInput")
    assert routes["/abort_request"] == Route(frozenset({"POST"}), "AbortReq")
    assert routes["/start_profile"].request_type == "ProfileReq"
    assert routes["/q"].request_type is None
    assert routes["/vertex_generate"] == Route(frozenset({"POST"}), "VertexReq")
    assert routes["/conditional"] == Route(frozenset({"GET"}), None)
    assert routes["/split"] == Route(frozenset({"PUT", "DELETE"}), "SplitReq")
    assert "/elsewhere" not in routes


def test_parse_types() -> None:
    types = parse_types(IO_STRUCT)
    assert types["GenerateReqInput"] == {
        "rid": True,
        "input_ids": True,
        "tags": True,
        "must": False,
    }
    assert types["AbortReq"] == {"rid": True, "abort_all": True}
    assert types["Derived"] == {"rid": True, "abort_all": False, "extra": False}
    assert types["AliasOutput"] == types["OtherAlias"] == {"rid": True, "success": False}


def test_check_client_on_synthetic_api() -> None:
    api = api_from_sources(HTTP_SERVER, IO_STRUCT)

    @dataclasses.dataclass(frozen=True)
    class AbortReq(SGLangRequest):
        ROUTE = "/abort_request"
        rid: str = ""
        abort_everything: bool = False

    @dataclasses.dataclass(frozen=True)
    class Generate(SGLangRequest):
        ROUTE = "/generate"
        METHOD = "GET"
        input_ids: tuple[int, ...] = ()

    @dataclasses.dataclass(frozen=True)
    class Health(SGLangRequest):
        ROUTE = "/health"
        METHOD = "GET"
        verbose: bool = False

    problems = check_client(api, (AbortReq, Generate, Health))
    assert problems == [
        "/abort_request: AbortReq.abort_everything: SGLang's AbortReq has no abort_everything",
        "/generate: SGLang takes ['POST', 'PUT'], Generate sends GET",
        "/generate: Generate should be named GenerateReqInput, as in SGLang",
        "/generate: Generate never sends must, which SGLang's GenerateReqInput requires",
        "/health: SGLang's handler reads no body, Health sends ['verbose']",
    ]


# -- getting the wheel ---------------------------------------------------------------------------


def test_a_cached_wheel_is_reused_without_pip(tmp_path: Path, monkeypatch) -> None:
    wheel = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("sglang/__init__.py", "")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the wheel is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert ensure_wheel(tmp_path) == wheel


def test_a_failed_download_raises(tmp_path: Path) -> None:
    with pytest.raises(WheelUnavailable, match=r"sglang==0\.0\.0\.0\.0\.1"):
        ensure_wheel(tmp_path, version="0.0.0.0.0.1")


def test_our_launch_command_uses_only_flags_sglang_takes() -> None:
    """backends/gpu/sglang_engine.py starts real SGLang with these flags; a misspelt one
    would only fail on a GPU host."""
    from backends.common.sglang.contract import check_launch, read_server_flags
    from backends.gpu.sglang_engine import launch_command

    flags = read_server_flags(ensure_wheel())
    assert {"--model-path", "--skip-tokenizer-init", "--api-key"} <= flags
    assert check_launch(flags, launch_command(Path("/m"), 1)) == []
    assert check_launch(flags, ["--skip-tokenizer", "x"]) == [
        "launch_server has no --skip-tokenizer"
    ]


def test_our_server_info_reports_only_sglang_server_arguments() -> None:
    """miles builds ServerArgs from /server_info (p2p_transfer_utils.py) and compares its
    fields (sglang_engine.py ``_init_external``): a key SGLang's server does not have would
    be one it never reports."""
    from backends.common.engine.info import SERVER_INFO_EXTRAS, EngineInfo
    from backends.common.sglang.contract import read_server_flags

    flags = read_server_flags(ensure_wheel())
    info = EngineInfo("m", "127.0.0.1", 1, 4096, "cpu", "float32", 0.0)
    keys = set(info.server_info(0, False)) - SERVER_INFO_EXTRAS
    assert {k for k in keys if "--" + k.replace("_", "-") not in flags} == set()
    assert {"--context-length", "--tp-size"} <= flags


def test_the_routes_miles_reads_are_sglang_routes(api: SGLangAPI, engine_app) -> None:
    from backends.common.sglang.api import MILES_READS

    served = {r.resource.canonical for r in engine_app.router.routes()}
    assert set(MILES_READS) <= set(api.routes)
    assert set(MILES_READS) <= served


def test_a_field_our_client_sends_that_miles_does_not_fails(api: SGLangAPI) -> None:
    """Our client once sent load_format "flattened_bucket" on the distributed path, which
    miles leaves out (SGLang then receives tensor by tensor): a difference that matters."""
    packed = dataclasses.make_dataclass(
        "UpdateWeightsFromDistributedReqInput",
        [("load_format", str, dataclasses.field(default="flattened_bucket"))],
        bases=(UpdateWeightsFromDistributedReqInput,),
        frozen=True,
    )
    problems = check_miles(api, _swapped(UpdateWeightsFromDistributedReqInput, packed))
    assert problems == [
        "/update_weights_from_distributed: UpdateWeightsFromDistributedReqInput sends "
        "load_format, miles does not"
    ]
