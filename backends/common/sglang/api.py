"""The requests our client sends to an SGLang server, one frozen dataclass per request type.

Each class is named after the SGLang request dataclass its route parses the body
into (python/sglang/srt/managers/io_struct.py) and says its ``ROUTE`` and
``METHOD`` (python/sglang/srt/entrypoints/http_server.py). Every body our client
sends is built here by ``body``, so the contract test (tests/test_sglang_contract.py)
can hold these field names against the pinned SGLang wheel: a field SGLang lacks,
or a route it does not serve, fails there instead of on a GPU cluster.

``OMIT`` leaves a field out of the body, so SGLang's default applies (miles sends
``weight_version`` only when it has one, for instance).

``MILES_SENDS`` lists, per route, the fields miles' own client sends
(miles/backends/sglang_utils/sglang_engine.py): a client that misses one of them
behaves differently from miles, and the contract test says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final[Any] = _Omit()
"""Leave the field out of the body (SGLang's default applies)."""


@dataclass(frozen=True)
class SGLangRequest:
    ROUTE: ClassVar[str]
    METHOD: ClassVar[str] = "POST"


def body(request: SGLangRequest) -> dict[str, Any]:
    """The JSON body: every field not OMIT, by its SGLang name."""
    return {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(request)
        if getattr(request, f.name) is not OMIT
    }


DRAFT_FIELDS: Final[dict[str, frozenset[str]]] = {
    "/generate": frozenset({"start_weight_version"}),
    "/pause_generation": frozenset({"abort_below_start_weight_version"}),
}
"""Fields of an open SGLang draft, beyond the pinned wheel, that our client sends and our
engine reads: sglang #34185 (open, draft, 2026-08-09, based on ``sglang-miles``), only under
--pause-abort-below-start-weight-version (miles_core/pause_filter.py). The contract checks
(contract.py) leave them out."""


@dataclass(frozen=True)
class GenerateReqInput(SGLangRequest):
    """Built by generate_body.py as miles builds it, per --miles-profile: today's miles adds
    ``return_routed_experts``, ``return_indexer_topk`` and, with a prefix-cache namespace,
    ``extra_key`` (generate_endpoint_utils.py ``compute_request_payload``, 02aa8e78)."""

    ROUTE: ClassVar[str] = "/generate"
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    return_logprob: bool = True
    return_routed_experts: Any = OMIT
    return_indexer_topk: Any = OMIT
    extra_key: Any = OMIT
    start_weight_version: Any = OMIT
    """sglang #34185's draft field (DRAFT_FIELDS): sent only under
    --pause-abort-below-start-weight-version."""


@dataclass(frozen=True)
class PauseGenerationReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/pause_generation"
    mode: str
    abort_below_start_weight_version: Any = OMIT
    """sglang #34185's draft field (DRAFT_FIELDS)."""


@dataclass(frozen=True)
class ContinueGenerationReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/continue_generation"


@dataclass(frozen=True)
class AbortReq(SGLangRequest):
    ROUTE: ClassVar[str] = "/abort_request"
    rid: Any = OMIT
    abort_all: Any = OMIT


@dataclass(frozen=True)
class BeginWeightUpdateReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/begin_weight_update"
    selector: str = "all"


@dataclass(frozen=True)
class EndWeightUpdateReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/end_weight_update"


@dataclass(frozen=True)
class UpdateWeightVersionReqInput(SGLangRequest):
    """SGLang's abort_all_requests defaults to true; miles sends false."""

    ROUTE: ClassVar[str] = "/update_weight_version"
    new_version: str
    abort_all_requests: Any = OMIT


@dataclass(frozen=True)
class InitWeightsUpdateGroupReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/init_weights_update_group"
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str


@dataclass(frozen=True)
class UpdateWeightsFromDistributedReqInput(SGLangRequest):
    """One bucket, received by broadcast in the named group, as miles sends it
    (sglang_engine.py ``update_weights_from_distributed``, called from broadcast.py's
    ``update_weights_from_distributed``): no ``load_format``, so SGLang receives one
    broadcast per tensor in ``names`` order; ``weight_version`` with every bucket (SGLang
    sets its version when the bucket loads; the stamp sets the same one after the last).
    ``load_format="flattened_bucket"`` asks for one packed uint8 buffer instead (no
    padding: SGLang's FlattenedTensorBucket refuses a tensor whose offset is not a multiple
    of its item size), which miles' distributed path never sends."""

    ROUTE: ClassVar[str] = "/update_weights_from_distributed"
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str
    flush_cache: bool = False
    selector: str = "all"
    weight_version: Any = OMIT
    load_format: Any = OMIT


@dataclass(frozen=True)
class UpdateWeightsFromTensorReqInput(SGLangRequest):
    """One bucket by tensor handles (colocated), as miles sends it (sglang_engine.py
    ``update_weights_from_tensor``; update_weight_from_tensor.py ``_send_to_colocated_engine``):
    per TP rank, base64 of the pickled ``{"flattened_tensor", "metadata"}`` of SGLang's
    FlattenedTensorBucket, ``load_format="flattened_bucket"``, and the version."""

    ROUTE: ClassVar[str] = "/update_weights_from_tensor"
    serialized_named_tensors: list[str]
    load_format: Any = "flattened_bucket"
    flush_cache: bool = False
    selector: str = "all"
    weight_version: Any = OMIT


@dataclass(frozen=True)
class DestroyWeightsUpdateGroupReqInput(SGLangRequest):
    ROUTE: ClassVar[str] = "/destroy_weights_update_group"
    group_name: str


@dataclass(frozen=True)
class FlushCache(SGLangRequest):
    """GET /flush_cache (no body; SGLang answers 400 while requests hold KV)."""

    ROUTE: ClassVar[str] = "/flush_cache"
    METHOD: ClassVar[str] = "GET"


@dataclass(frozen=True)
class HealthGenerate(SGLangRequest):
    ROUTE: ClassVar[str] = "/health_generate"
    METHOD: ClassVar[str] = "GET"


@dataclass(frozen=True)
class ModelInfo(SGLangRequest):
    """GET /model_info: where SGLang reports weight_version."""

    ROUTE: ClassVar[str] = "/model_info"
    METHOD: ClassVar[str] = "GET"


@dataclass(frozen=True)
class Health(SGLangRequest):
    ROUTE: ClassVar[str] = "/health"
    METHOD: ClassVar[str] = "GET"


REQUESTS: Final[tuple[type[SGLangRequest], ...]] = (
    GenerateReqInput,
    PauseGenerationReqInput,
    ContinueGenerationReqInput,
    AbortReq,
    BeginWeightUpdateReqInput,
    EndWeightUpdateReqInput,
    UpdateWeightVersionReqInput,
    InitWeightsUpdateGroupReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput,
    DestroyWeightsUpdateGroupReqInput,
    FlushCache,
    HealthGenerate,
    ModelInfo,
    Health,
)
"""Every request type our client sends."""

TESTBED_PREFIX: Final = "/testbed/"
"""Routes of the testbed's own (the weights' checksum): never sent to a real SGLang."""

MILES_SENDS: Final[dict[str, frozenset[str]]] = {
    "/pause_generation": frozenset({"mode"}),
    "/init_weights_update_group": frozenset(
        {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
    ),
    "/update_weights_from_distributed": frozenset(
        {"names", "dtypes", "shapes", "group_name", "flush_cache", "selector", "weight_version"}
    ),
    "/update_weights_from_tensor": frozenset(
        {"serialized_named_tensors", "load_format", "flush_cache", "selector", "weight_version"}
    ),
    "/update_weight_version": frozenset({"new_version", "abort_all_requests"}),
    "/begin_weight_update": frozenset({"selector"}),
}
"""The fields miles' SGLangEngine sends per route (sglang_engine.py: pause_generation,
init_weights_update_group, update_weights_from_distributed, update_weights_from_tensor,
update_weight_version, begin_weight_update)."""


MILES_READS: Final[dict[str, tuple[str, ...]]] = {
    "/generate": (
        "text",
        "meta_info.finish_reason.type",
        "meta_info.output_token_logprobs",
        "meta_info.weight_version",
        "meta_info.prompt_tokens",
        "meta_info.completion_tokens",
        "meta_info.cached_tokens",
        "meta_info.e2e_latency",
    ),
    "/model_info": ("weight_version",),
    "/update_weights_from_distributed": ("success", "message"),
    "/update_weights_from_tensor": ("success", "message"),
    "/weights_checker": (
        "success",
        "ranks.checksums",
        "ranks.parallelism_info.rank",
        "per_engine_checksum",
    ),
    "/server_info": ("model_path", "tp_size", "context_length"),
    "/get_server_info": ("model_path", "tp_size", "context_length"),
}
"""The response fields miles reads, per route, as dotted paths (a list is looked into):
/generate in miles/rollout/sglang_rollout.py ``generate`` and utils/types.py
``Sample.update_from_meta_info``; /model_info in sglang_engine.py ``get_weight_version``;
the update routes' success in update_weight/common.py ``_check_weight_sync_results``;
/weights_checker in utils/audit_utils/checksum_utils.py; /server_info and /get_server_info
whole, as ServerArgs (p2p_transfer_utils.py, sglang_engine.py ``_init_external``), of
which these are the fields a p2p transfer and an external engine's check need."""


def missing_reads(route: str, reply: Any) -> list[str]:
    """Each MILES_READS path of ``route`` that ``reply`` (a decoded JSON body) lacks."""
    return [path for path in MILES_READS[route] if not _has(reply, path.split("."))]


def _has(value: Any, path: list[str]) -> bool:
    if not path:
        return True
    if isinstance(value, list):
        return bool(value) and all(_has(item, path) for item in value)
    return isinstance(value, dict) and path[0] in value and _has(value[path[0]], path[1:])


def fields_of(request: type[SGLangRequest]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(request))


def sent_by_default(request: type[SGLangRequest]) -> frozenset[str]:
    """The fields a request sends unless told otherwise (every one not defaulting to OMIT)."""
    return frozenset(f.name for f in dataclasses.fields(request) if f.default is not OMIT)


__all__ = [
    "MILES_READS",
    "MILES_SENDS",
    "OMIT",
    "REQUESTS",
    "TESTBED_PREFIX",
    "body",
    "fields_of",
    "missing_reads",
    "sent_by_default",
]
