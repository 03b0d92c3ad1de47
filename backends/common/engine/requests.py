"""What an engine accepts in a request body, field by field, before it acts on any of it.

A malformed or hostile request (a missing or wrong-typed field, sizes that
disagree with the names, dtypes and shapes, a bucket for a group the engine
never joined) gets a 4xx whose message starts with the field as the client
spelt it, and changes nothing: every check here runs before the engine touches
its weights. Field names are SGLang's (io_struct.py); ``ENGINE_READS`` lists
them per route so the contract test holds them against the SGLang wheel.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from backends.common.wire.groups import UPDATE_BACKENDS
from miles_core.transfer import DTYPE_ITEMSIZE

MAX_TENSORS: Final = 1 << 16
"""More tensors than any bucket of a real model holds: a body claiming more is refused."""
MAX_DIMS: Final = 8


class BadRequest(Exception):
    """A request the engine refuses; ``status`` is the HTTP status, the message names the field."""

    def __init__(self, field: str, why: str, status: int = 400) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.status = status


Check = Callable[[str, Any], Any]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadRequest(field, f"expected a string, got {type(value).__name__}")
    return value


def flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(field, f"expected true or false, got {json.dumps(value)[:40]}")
    return value


def count(field: str, value: Any) -> int:
    """A non-negative integer (a rank, a size, a port)."""
    if not _is_int(value) or value < 0:
        raise BadRequest(field, f"expected an integer >= 0, got {json.dumps(value)[:40]}")
    return value


def integer(field: str, value: Any) -> int:
    """Any integer (a version threshold may be below 0)."""
    if not _is_int(value):
        raise BadRequest(field, f"expected an integer, got {json.dumps(value)[:40]}")
    return value


def port(field: str, value: Any) -> int:
    if count(field, value) > 65535:
        raise BadRequest(field, f"a port is at most 65535, got {value}")
    return value


def mapping(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(field, f"expected an object, got {type(value).__name__}")
    return value


def list_of(check: Check, limit: int = MAX_TENSORS) -> Check:
    def checked(field: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise BadRequest(field, f"expected a list, got {type(value).__name__}")
        if len(value) > limit:
            raise BadRequest(field, f"at most {limit} entries, got {len(value)}")
        return [check(f"{field}[{i}]", item) for i, item in enumerate(value)]

    return checked


def dtype(field: str, value: Any) -> str:
    name = text(field, value).removeprefix("torch.")
    if name not in DTYPE_ITEMSIZE:
        raise BadRequest(field, f"unknown dtype {value!r}; one of {', '.join(DTYPE_ITEMSIZE)}")
    return name


shape = list_of(count, MAX_DIMS)


def one_of(*choices: str) -> Check:
    def checked(field: str, value: Any) -> str:
        if text(field, value) not in choices:
            raise BadRequest(field, f"expected one of {list(choices)}, got {value!r}")
        return value

    return checked


@dataclass(frozen=True)
class Field:
    check: Check
    default: Any = ...
    """``...``: required."""


def optional(check: Check) -> Check:
    """``check``, or null."""

    def checked(field: str, value: Any) -> Any:
        return None if value is None else check(field, value)

    return checked


SELECTOR = Field(one_of("target", "draft", "all"), "all")
DISTRIBUTED_FORMAT = Field(one_of("flattened_bucket"), None)
"""Absent: one broadcast per tensor (what miles sends); ``flattened_bucket``: one packed
buffer. SGLang takes any other string as absent; a typo there would receive tensor by
tensor what a trainer sends packed, so this engine refuses it."""
TENSOR_FORMAT = Field(one_of("flattened_bucket", "direct"), None)
"""Absent or ``direct``: (name, tensor) pairs; ``flattened_bucket``: miles' packed form.
SGLang's custom loaders (a dotted path here) are refused."""


def as_sent(field: str, value: Any) -> Any:
    """Taken as sent: the route's handler judges it (generate.py)."""
    return value


UNHONOURED_GENERATE: Final = (
    "lora_path",
    "image_data",
    "audio_data",
    "return_routed_experts",
    "return_indexer_topk",
    "top_logprobs_num",
    "stream",
)
"""/generate fields miles may send that this engine cannot honour: read, so that a value it
cannot honour is refused naming them (generate.py, UNSUPPORTED_TOP) rather than dropped."""

SPECS: Final[Mapping[str, Mapping[str, Field]]] = {
    "/generate": {
        "rid": Field(text, None),
        "input_ids": Field(list_of(count, 1 << 14)),
        "sampling_params": Field(mapping, {}),
        "return_logprob": Field(flag, False),
        "extra_key": Field(optional(text), None),
        "start_weight_version": Field(optional(integer), None),
        **{name: Field(as_sent, None) for name in UNHONOURED_GENERATE},
    },
    "/pause_generation": {
        "mode": Field(one_of("abort", "retract", "in_place"), "abort"),
        "abort_below_start_weight_version": Field(optional(integer), None),
    },
    "/continue_generation": {},
    "/abort_request": {"rid": Field(text, ""), "abort_all": Field(flag, False)},
    "/begin_weight_update": {"selector": SELECTOR},
    "/end_weight_update": {},
    "/update_weight_version": {
        "new_version": Field(text),
        "abort_all_requests": Field(flag, True),
    },
    "/init_weights_update_group": {
        "master_address": Field(text),
        "master_port": Field(port),
        "rank_offset": Field(count),
        "world_size": Field(count),
        "group_name": Field(text, "weight_update_group"),
        "backend": Field(one_of(*UPDATE_BACKENDS), "nccl"),
    },
    "/update_weights_from_distributed": {
        "names": Field(list_of(text)),
        "dtypes": Field(list_of(dtype)),
        "shapes": Field(list_of(shape)),
        "group_name": Field(text, "weight_update_group"),
        "flush_cache": Field(flag, True),
        "abort_all_requests": Field(flag, False),
        "weight_version": Field(text, None),
        "load_format": DISTRIBUTED_FORMAT,
        "selector": SELECTOR,
    },
    "/update_weights_from_tensor": {
        "serialized_named_tensors": Field(list_of(text, 64)),
        "load_format": TENSOR_FORMAT,
        "flush_cache": Field(flag, True),
        "abort_all_requests": Field(flag, False),
        "weight_version": Field(text, None),
        "selector": SELECTOR,
    },
    "/destroy_weights_update_group": {"group_name": Field(text, "weight_update_group")},
    "/weights_checker": {
        "action": Field(one_of("snapshot", "reset_tensors", "compare", "checksum"), "checksum"),
        "allow_quant_error": Field(flag, False),
        "skip_tensor_list": Field(optional(list_of(text, 1024)), None),
        "selector": SELECTOR,
    },
    # disk-delta (delta_routes.py): /pull_weights is radixark's SGLang's, beyond the pin
    "/pull_weights": {
        "local_checkpoint_dir": Field(text),
        "source_dir": Field(text),
        "target_version": Field(count),
    },
    "/update_weights_from_disk": {
        "model_path": Field(text),
        "weight_version": Field(text, None),
    },
}
"""Per route, each field the engine reads, its check and SGLang's default."""

ENGINE_READS: Final[Mapping[str, frozenset[str]]] = {
    route: frozenset(fields) for route, fields in SPECS.items()
}
"""Per route, the fields read; those of an open SGLang draft beyond the pinned wheel are
named in ``backends.common.sglang.api.DRAFT_FIELDS`` (sglang #34185's)."""


def parse(route: str, raw: bytes) -> dict[str, Any]:
    """The body's fields, checked, SGLang's defaults filled in; BadRequest otherwise."""
    if raw.strip():
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise BadRequest("body", "not valid JSON") from None
    else:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest("body", f"expected a JSON object, got {type(body).__name__}")
    out: dict[str, Any] = {}
    for name, spec in SPECS[route].items():
        if name in body and not (body[name] is None and spec.default is None):
            out[name] = spec.check(name, body[name])
        elif spec.default is ...:
            raise BadRequest(name, "missing (required)")
        else:
            out[name] = spec.default
    return out


def bucket_payload(body: Mapping[str, Any]) -> tuple[list[str], list[str], list[list[int]]]:
    """names, dtypes and shapes, checked to describe the same tensors."""
    names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
    for field, values in (("dtypes", dtypes), ("shapes", shapes)):
        if len(values) != len(names):
            raise BadRequest(field, f"{len(values)} entries for {len(names)} names")
    if not names:
        raise BadRequest("names", "an empty bucket (SGLang refuses one too)")
    if len(set(names)) != len(names):
        raise BadRequest("names", "a tensor named twice in one bucket")
    return names, dtypes, shapes
