"""The weight-transfer plan: update units packed into buckets, and who sends what.

Parameters are described by specs (name, shape, dtype name, bytes), never by
tensors, so the plan is made and checked without torch. Tensors that must
arrive together (an MoE expert group, a fused q/kv pair, a LoRA adapter) form
one *update unit*, which is never split across buckets. Buckets hold at most
--update-weight-buffer-size bytes; a unit larger than that gets a bucket of its
own (miles: flush when buf + unit > size and the bucket is not empty).

Inside a bucket every tensor gets a *staging span* of a uint8 buffer whose
start is aligned to the tensor's item size (miles' RDT ``_staging_span``), so
the receiver can view the span as the tensor's dtype and shape without a copy.
The span layout is the bucket's layout on the wire in every mode.

Modes (--update-weight-transfer-mode): broadcast sends each bucket once from
the trainer's source rank to a collective group of all engines; p2p sends each
bucket to each engine from that engine's source rank; rdt is p2p into
pre-registered staging buffers (planned here, simulated first).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import ConfigError, int_at_least

DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE = 512 * 1024**2
"""miles' default --update-weight-buffer-size."""

DTYPE_ITEMSIZE: Mapping[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def itemsize(dtype: str) -> int:
    try:
        return DTYPE_ITEMSIZE[dtype]
    except KeyError:
        raise ConfigError(
            "dtype", f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPE_ITEMSIZE)}"
        ) from None


@dataclass(frozen=True)
class ParamSpec:
    """A parameter as the plan sees it: no tensor, just its name, shape, dtype and size."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def __post_init__(self) -> None:
        if any(d < 0 for d in self.shape):
            raise ConfigError(f"{self.name}.shape", f"got {self.shape}", "dimensions must be >= 0")
        expected = math.prod(self.shape) * itemsize(self.dtype)
        if self.nbytes != expected:
            raise ConfigError(
                f"{self.name}.nbytes",
                f"got {self.nbytes} but shape {self.shape} of {self.dtype} is {expected} bytes",
                "pass numel x itemsize (or build the spec with ParamSpec.of)",
            )

    @classmethod
    def of(cls, name: str, shape: Sequence[int], dtype: str) -> ParamSpec:
        shape = tuple(shape)
        return cls(name, shape, dtype, math.prod(shape) * itemsize(dtype))


@dataclass(frozen=True)
class UpdateUnit:
    """Parameters that must arrive together; never split across buckets."""

    name: str
    params: tuple[ParamSpec, ...]

    def __post_init__(self) -> None:
        if not self.params:
            raise ConfigError(f"unit {self.name}", "has no parameters", "give each unit >= 1 param")

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)


def units_of(
    params: Iterable[ParamSpec], atomic_key: Callable[[str], str | None] = lambda name: None
) -> tuple[UpdateUnit, ...]:
    """Group parameters into units: those with the same atomic key go together.

    A parameter whose key is None is a unit of its own. Units are ordered by the
    position of their first member, as in miles' get_named_update_units.
    """
    members: dict[tuple[bool, str], list[ParamSpec]] = {}  # insertion order = first member
    names: set[str] = set()
    for param in params:
        if param.name in names:
            raise ConfigError("params", f"parameter {param.name!r} appears twice", "pass each once")
        names.add(param.name)
        key = atomic_key(param.name)
        members.setdefault((False, param.name) if key is None else (True, key), []).append(param)
    units = tuple(
        UpdateUnit(f"group:{name}" if grouped else name, tuple(group))
        for (grouped, name), group in members.items()
    )
    counts = Counter(u.name for u in units)
    clash = {name for name, n in counts.items() if n > 1}
    if clash:
        raise ConfigError(
            "atomic_key",
            f"unit names {sorted(clash)} are both a parameter name and a group name",
            "return keys that no parameter is named 'group:<key>' after",
        )
    return units


def lora_unit(adapter: str, params: Iterable[ParamSpec]) -> UpdateUnit:
    """A LoRA adapter is one atomic unit; it must hold lora_A and lora_B weights."""
    params = tuple(params)
    if not any("lora_A" in p.name for p in params) or not any("lora_B" in p.name for p in params):
        raise ConfigError(
            f"adapter {adapter}",
            "has no lora_A or no lora_B parameter",
            "pass the adapter's lora_A and lora_B weights",
        )
    return UpdateUnit(f"{LORA_UNIT_PREFIX}{adapter}", params)


LORA_UNIT_PREFIX = "lora:"
"""A LoRA adapter's unit is named this, then the adapter's name."""


def staging_span(offset: int, dtype: str, nbytes: int) -> tuple[int, int]:
    """[start, end) of a tensor placed at or after ``offset``, start aligned to its item size."""
    size = itemsize(dtype)
    start = -(-offset // size) * size
    return start, start + nbytes


@dataclass(frozen=True)
class StagingSpan:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Bucket:
    index: int
    units: tuple[str, ...]
    spans: tuple[StagingSpan, ...]
    capacity: int
    """Bytes of the uint8 buffer: the budget, or the unit's own size when oversize."""
    oversize: bool = False
    """One unit larger than the budget, alone in its bucket."""

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (the end of the last span, padding included)."""
        return self.spans[-1].end if self.spans else 0

    @property
    def payload_bytes(self) -> int:
        return sum(s.end - s.start for s in self.spans)


def _layout(unit: UpdateUnit, offset: int) -> tuple[list[StagingSpan], int]:
    spans = []
    for p in unit.params:
        start, end = staging_span(offset, p.dtype, p.nbytes)
        spans.append(StagingSpan(p.name, p.dtype, p.shape, start, end))
        offset = end
    return spans, offset


def _end(unit: UpdateUnit, offset: int) -> int:
    """Where ``_layout(unit, offset)`` ends, without building its spans (the planner tries
    a unit at the current offset before it knows whether it fits)."""
    for p in unit.params:
        size = DTYPE_ITEMSIZE.get(p.dtype) or itemsize(p.dtype)
        offset = -(-offset // size) * size + p.nbytes
    return offset


def plan_buckets(
    units: Sequence[UpdateUnit], buffer_size: int = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE
) -> tuple[Bucket, ...]:
    """Pack units, in order, into buckets of at most ``buffer_size`` bytes."""
    if not int_at_least(buffer_size, 1):
        raise ConfigError(
            "--update-weight-buffer-size", f"got {buffer_size!r}", "pass a byte count >= 1"
        )
    buckets: list[Bucket] = []
    names: list[str] = []
    spans: list[StagingSpan] = []
    offset = 0

    def flush(capacity: int, oversize: bool = False) -> None:
        nonlocal names, spans, offset
        buckets.append(Bucket(len(buckets), tuple(names), tuple(spans), capacity, oversize))
        names, spans, offset = [], [], 0

    for unit in units:
        if _end(unit, offset) > buffer_size and names:
            flush(buffer_size)
        unit_spans, end = _layout(unit, offset)
        if end > buffer_size:
            names, spans = [unit.name], unit_spans
            flush(end, oversize=True)
            continue
        names.append(unit.name)
        spans.extend(unit_spans)
        offset = end
    if names:
        flush(buffer_size)
    return tuple(buckets)


class TransferMode(StrEnum):
    """--update-weight-transfer-mode."""

    BROADCAST = "broadcast"
    P2P = "p2p"
    RDT = "rdt"
    DISK_DELTA = "disk-delta"
    """Each bucket's changed tensors written as a delta file, the engines pulling every
    version onto their local checkpoints and loading it from disk (miles_core/disk_delta.py);
    planned as a broadcast: written once, for every engine."""


@dataclass(frozen=True)
class Transfer:
    """Send one bucket from a trainer rank to some engines."""

    bucket: int
    source_rank: int
    targets: tuple[str, ...]


@dataclass(frozen=True)
class TransferPlan:
    mode: TransferMode
    buckets: tuple[Bucket, ...]
    transfers: tuple[Transfer, ...]
    staging_bytes: int
    """Size of the uint8 staging buffer each receiver needs (the largest bucket)."""

    @property
    def bytes_sent(self) -> int:
        """Bytes that leave source ranks: a broadcast counts once, p2p once per engine."""
        per_target = self.mode not in (TransferMode.BROADCAST, TransferMode.DISK_DELTA)
        sizes = {b.index: b.nbytes for b in self.buckets}  # t.bucket is an index, not a position
        return sum(sizes[t.bucket] * (len(t.targets) if per_target else 1) for t in self.transfers)


def plan_transfer(
    mode: TransferMode | str,
    buckets: Sequence[Bucket],
    engines: Sequence[str],
    source_rank: int = 0,
    engine_sources: Mapping[str, int] | None = None,
) -> TransferPlan:
    """Who sends which bucket to whom, in order (bucket-major)."""
    try:
        mode = TransferMode(mode)
    except ValueError:
        raise ConfigError(
            "--update-weight-transfer-mode",
            f"got {mode!r}",
            "choose broadcast, p2p, rdt or disk-delta",
        ) from None
    engines = tuple(engines)
    if not engines:
        raise ConfigError("engines", "no engine to update", "pass at least one engine")
    if len(set(engines)) != len(engines):
        raise ConfigError("engines", f"duplicate engine ids in {engines}", "pass each engine once")
    indices = [b.index for b in buckets]
    if len(set(indices)) != len(indices):
        raise ConfigError(
            "buckets", f"duplicate bucket indices in {indices}", "pass each bucket once"
        )
    sources = dict(engine_sources or {})
    if sources and mode in (TransferMode.BROADCAST, TransferMode.DISK_DELTA):
        raise ConfigError(
            "engine_sources",
            "per-engine source ranks were given but broadcast sends from one source_rank",
            "use p2p or rdt for per-engine sources, or pass source_rank",
        )
    unknown = set(sources) - set(engines)
    if unknown:
        raise ConfigError(
            "engine_sources",
            f"names unknown engines {sorted(unknown)}",
            "map only the engines updated",
        )
    transfers: list[Transfer] = []
    for bucket in buckets:
        if mode in (TransferMode.BROADCAST, TransferMode.DISK_DELTA):
            transfers.append(Transfer(bucket.index, source_rank, engines))
        else:
            transfers.extend(
                Transfer(bucket.index, sources.get(engine, source_rank), (engine,))
                for engine in engines
            )
    staging = max((b.capacity for b in buckets), default=0)
    return TransferPlan(mode, tuple(buckets), tuple(transfers), staging)
