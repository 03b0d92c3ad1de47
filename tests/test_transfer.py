"""The weight-transfer plan: specs, staging spans, bucket packing and who sends what."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.errors import ConfigError
from miles_core.transfer import (
    DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE,
    DTYPE_ITEMSIZE,
    ParamSpec,
    Transfer,
    TransferMode,
    UpdateUnit,
    lora_unit,
    plan_buckets,
    plan_transfer,
    staging_span,
    units_of,
)

# Element sizes as torch defines them, written out here rather than read from the module.
TORCH_ITEMSIZE = {
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


def f32(name: str, n: int) -> ParamSpec:
    return ParamSpec.of(name, (n,), "float32")  # 4 * n bytes


def u8(name: str, n: int) -> ParamSpec:
    return ParamSpec.of(name, (n,), "uint8")  # n bytes


def unit(name: str, *params: ParamSpec) -> UpdateUnit:
    return UpdateUnit(name, params)


def spans_of(bucket) -> list[tuple[str, int, int]]:
    return [(s.name, s.start, s.end) for s in bucket.spans]


def align_up(offset: int, size: int) -> int:
    while offset % size:
        offset += 1
    return offset


# --------------------------------------------------------------------------- ParamSpec


def test_dtype_table_matches_torch_item_sizes() -> None:
    assert dict(DTYPE_ITEMSIZE) == TORCH_ITEMSIZE


@pytest.mark.parametrize("dtype", sorted(TORCH_ITEMSIZE))
def test_param_spec_of_computes_nbytes(dtype: str) -> None:
    spec = ParamSpec.of("w", [3, 5], dtype)
    assert spec.shape == (3, 5)
    assert spec.nbytes == 15 * TORCH_ITEMSIZE[dtype]
    assert spec == ParamSpec("w", (3, 5), dtype, 15 * TORCH_ITEMSIZE[dtype])


def test_param_spec_of_scalar_and_zero_sized() -> None:
    assert ParamSpec.of("scalar", (), "float64").nbytes == 8
    assert ParamSpec.of("empty", (0, 7), "float32").nbytes == 0
    assert ParamSpec.of("empty2", (4, 0, 2), "bfloat16").nbytes == 0


def test_param_spec_nbytes_mismatch_names_the_numbers() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("w.nbytes: got 10 but shape (2, 3) of float32 is 24 bytes")
    ) as info:
        ParamSpec("w", (2, 3), "float32", 10)
    assert info.value.field == "w.nbytes"


def test_param_spec_unknown_dtype() -> None:
    with pytest.raises(
        ConfigError, match=r"^dtype: unknown dtype 'float128'; use one of .*float32"
    ):
        ParamSpec("w", (2,), "float128", 32)
    with pytest.raises(ConfigError, match=r"^dtype: unknown dtype 'fp4'"):
        ParamSpec.of("w", (2,), "fp4")


def test_param_spec_negative_dimension() -> None:
    with pytest.raises(ConfigError, match=re.escape("w.shape: got (2, -1)")):
        ParamSpec("w", (2, -1), "float32", 0)


def test_update_unit_needs_a_parameter() -> None:
    with pytest.raises(ConfigError, match=r"^unit empty: has no parameters"):
        UpdateUnit("empty", ())
    assert unit("u", f32("a", 3), u8("b", 5)).nbytes == 12 + 5


# --------------------------------------------------------------------------- staging_span


@pytest.mark.parametrize(
    ("offset", "dtype", "nbytes", "expected"),
    [
        (3, "float32", 8, (4, 12)),
        (4, "float32", 4, (4, 8)),
        (5, "bfloat16", 6, (6, 12)),
        (7, "float16", 2, (8, 10)),
        (6, "bfloat16", 2, (6, 8)),
        (9, "float64", 8, (16, 24)),
        (0, "float64", 16, (0, 16)),
        (7, "int8", 1, (7, 8)),
        (1, "float8_e4m3fn", 3, (1, 4)),
        (5, "int32", 0, (8, 8)),
    ],
)
def test_staging_span_alignment(
    offset: int, dtype: str, nbytes: int, expected: tuple[int, int]
) -> None:
    assert staging_span(offset, dtype, nbytes) == expected


@pytest.mark.parametrize("dtype", sorted(TORCH_ITEMSIZE))
def test_staging_span_is_the_first_aligned_offset(dtype: str) -> None:
    size = TORCH_ITEMSIZE[dtype]
    for offset in range(40):
        start, end = staging_span(offset, dtype, 3 * size)
        assert start == align_up(offset, size)
        assert end - start == 3 * size


def test_staging_span_unknown_dtype() -> None:
    with pytest.raises(ConfigError, match=r"^dtype: unknown dtype 'complex64'"):
        staging_span(0, "complex64", 8)


# --------------------------------------------------------------------------- plan_buckets


def test_units_are_never_split() -> None:
    # b alone would still fit after a (40 + 40 <= 100), but b and c travel together.
    buckets = plan_buckets([unit("u0", f32("a", 10)), unit("u1", f32("b", 10), f32("c", 10))], 100)
    assert [b.units for b in buckets] == [("u0",), ("u1",)]
    assert spans_of(buckets[0]) == [("a", 0, 40)]
    assert spans_of(buckets[1]) == [("b", 0, 40), ("c", 40, 80)]
    assert [b.index for b in buckets] == [0, 1]
    assert not any(b.oversize for b in buckets)
    assert all(b.capacity == 100 for b in buckets)


def test_a_new_bucket_starts_only_when_the_next_unit_would_exceed_the_budget() -> None:
    exact = plan_buckets(
        [unit("u0", u8("a", 50)), unit("u1", u8("b", 50)), unit("u2", u8("c", 1))], 100
    )
    assert [b.units for b in exact] == [("u0", "u1"), ("u2",)]  # 50 + 50 == 100 still fits
    assert [b.nbytes for b in exact] == [100, 1]
    over = plan_buckets([unit("u0", u8("a", 50)), unit("u1", u8("b", 51))], 100)
    assert [b.units for b in over] == [("u0",), ("u1",)]  # 50 + 51 > 100


def test_alignment_padding_counts_against_the_budget() -> None:
    # The float32 would start at 8 (not 5): 12 bytes > 10, though the payload is only 9.
    buckets = plan_buckets([unit("u0", u8("a", 5)), unit("u1", f32("b", 1))], 10)
    assert [b.units for b in buckets] == [("u0",), ("u1",)]
    assert spans_of(buckets[1]) == [("b", 0, 4)]
    # With room for the padding they share a bucket.
    shared = plan_buckets([unit("u0", u8("a", 5)), unit("u1", f32("b", 1))], 12)
    assert len(shared) == 1
    assert spans_of(shared[0]) == [("a", 0, 5), ("b", 8, 12)]


def test_spans_inside_a_bucket_are_aligned_and_padded() -> None:
    params = (
        u8("a", 3),
        ParamSpec.of("b", (1,), "bfloat16"),
        ParamSpec.of("c", (1,), "float64"),
    )
    (bucket,) = plan_buckets([unit("u", *params)], 100)
    # a [0, 3); b aligned to 2 -> [4, 6); c aligned to 8 -> [8, 16).
    assert spans_of(bucket) == [("a", 0, 3), ("b", 4, 6), ("c", 8, 16)]
    assert bucket.nbytes == 16
    assert bucket.payload_bytes == 3 + 2 + 8
    assert [(s.dtype, s.shape) for s in bucket.spans] == [(p.dtype, p.shape) for p in params]


def test_a_unit_larger_than_the_budget_gets_its_own_oversize_bucket() -> None:
    units = [
        unit("small0", u8("s0", 40)),
        unit("big", f32("b", 60)),  # 240 bytes > 100
        unit("small1", u8("s1", 40)),
        unit("small2", u8("s2", 40)),
    ]
    buckets = plan_buckets(units, 100)
    assert [b.units for b in buckets] == [("small0",), ("big",), ("small1", "small2")]
    assert [b.oversize for b in buckets] == [False, True, False]
    assert [b.capacity for b in buckets] == [100, 240, 100]
    assert [b.nbytes for b in buckets] == [40, 240, 80]
    assert [b.index for b in buckets] == [0, 1, 2]


def test_oversize_first_unit_and_capacity_includes_its_own_padding() -> None:
    (bucket,) = plan_buckets([unit("odd", u8("x", 3), f32("y", 30))], 100)
    assert bucket.oversize
    assert spans_of(bucket) == [("x", 0, 3), ("y", 4, 124)]
    assert bucket.capacity == bucket.nbytes == 124  # the unit's 123 bytes plus 1 of padding
    assert bucket.payload_bytes == 123


def test_no_units_no_buckets() -> None:
    assert plan_buckets([], 100) == ()


def test_default_budget_is_512_mib() -> None:
    assert DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE == 512 * 2**20
    units = [unit(f"u{i}", ParamSpec.of(f"w{i}", (64 * 2**20,), "bfloat16")) for i in range(5)]
    buckets = plan_buckets(units)  # 128 MiB each: four fill one 512 MiB bucket exactly
    assert [len(b.units) for b in buckets] == [4, 1]
    assert buckets[0].nbytes == 512 * 2**20


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "512"])
def test_invalid_buffer_size(size: object) -> None:
    with pytest.raises(
        ConfigError, match=rf"^--update-weight-buffer-size: got {re.escape(repr(size))}; .*>= 1"
    ):
        plan_buckets([unit("u", u8("a", 1))], size)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- units_of, LoRA


def expert_layer(name: str) -> str | None:
    match = re.match(r"(layers\.\d+)\.mlp\.experts\.", name)
    return match.group(1) if match else None


def test_units_of_groups_experts_of_one_layer_ordered_by_first_member() -> None:
    params = [
        f32("layers.0.attn.qkv", 10),
        f32("layers.0.mlp.experts.0.w1", 10),
        f32("layers.0.mlp.experts.1.w1", 10),
        f32("layers.1.attn.qkv", 10),
        f32("layers.0.mlp.experts.2.w1", 10),
        f32("layers.1.mlp.experts.0.w1", 10),
    ]
    units = units_of(params, expert_layer)
    assert [[p.name for p in u.params] for u in units] == [
        ["layers.0.attn.qkv"],
        ["layers.0.mlp.experts.0.w1", "layers.0.mlp.experts.1.w1", "layers.0.mlp.experts.2.w1"],
        ["layers.1.attn.qkv"],
        ["layers.1.mlp.experts.0.w1"],
    ]
    assert units[0].name == "layers.0.attn.qkv"  # an ungrouped parameter is its own unit
    assert len({u.name for u in units}) == len(units)
    # The expert group (120 bytes) stays whole: it gets its own oversize bucket.
    buckets = plan_buckets(units, 100)
    assert [b.units for b in buckets] == [
        (units[0].name,),
        (units[1].name,),
        (units[2].name, units[3].name),
    ]
    assert buckets[1].oversize
    assert [s.name for s in buckets[1].spans] == [p.name for p in units[1].params]


def test_units_of_without_a_key_makes_one_unit_per_parameter() -> None:
    params = [f32("b", 1), f32("a", 2), u8("c", 3)]
    units = units_of(params)
    assert [u.name for u in units] == ["b", "a", "c"]
    assert [u.params for u in units] == [(p,) for p in params]


def test_units_of_duplicate_names_raise() -> None:
    with pytest.raises(ConfigError, match=r"^params: parameter 'w' appears twice"):
        units_of([f32("w", 1), f32("v", 1), u8("w", 4)])


def lora_params(prefix: str, rank: int = 8, dim: int = 64) -> list[ParamSpec]:
    return [
        ParamSpec.of(f"{prefix}.lora_A.weight", (rank, dim), "float32"),
        ParamSpec.of(f"{prefix}.lora_B.weight", (dim, rank), "float32"),
    ]


def test_lora_unit_is_one_unit_with_both_matrices() -> None:
    params = lora_params("layers.0.q_proj")
    lora = lora_unit("layers.0.q_proj", iter(params))
    assert lora.params == tuple(params)
    assert lora.nbytes == 2 * 8 * 64 * 4
    assert lora.name.endswith("layers.0.q_proj")


@pytest.mark.parametrize("keep", ["lora_A", "lora_B", None])
def test_lora_unit_rejects_an_adapter_missing_a_or_b(keep: str | None) -> None:
    params = [p for p in lora_params("layers.0.q_proj") if keep and keep in p.name]
    with pytest.raises(
        ConfigError, match=r"^adapter layers\.0\.q_proj: has no lora_A or no lora_B parameter"
    ):
        lora_unit("layers.0.q_proj", params)


def test_lora_adapter_larger_than_the_budget_is_still_one_bucket() -> None:
    lora = lora_unit("q", lora_params("layers.0.q_proj"))  # 2 x 2048 bytes
    units = [unit("before", f32("x", 16)), lora, unit("after", f32("y", 16))]
    buckets = plan_buckets(units, 1024)
    assert [b.units for b in buckets] == [("before",), (lora.name,), ("after",)]
    assert buckets[1].oversize and buckets[1].capacity == 4096
    assert spans_of(buckets[1]) == [
        ("layers.0.q_proj.lora_A.weight", 0, 2048),
        ("layers.0.q_proj.lora_B.weight", 2048, 4096),
    ]


# --------------------------------------------------------------------------- plan_transfer

ENGINES = ("e0", "e1", "e2")


@pytest.fixture
def buckets():
    # [u0 40 + u1 40] = 80, [u2] = 40, [big] = 240 oversize.
    units = [unit(f"u{i}", u8(f"w{i}", 40)) for i in range(3)] + [unit("big", f32("b", 60))]
    planned = plan_buckets(units, 100)
    assert [b.nbytes for b in planned] == [80, 40, 240]
    return planned


def test_broadcast_sends_each_bucket_once_to_all_engines(buckets) -> None:
    plan = plan_transfer("broadcast", buckets, list(ENGINES), source_rank=3)
    assert plan.mode is TransferMode.BROADCAST
    assert plan.transfers == (
        Transfer(0, 3, ENGINES),
        Transfer(1, 3, ENGINES),
        Transfer(2, 3, ENGINES),
    )
    assert plan.bytes_sent == 80 + 40 + 240
    assert plan.staging_bytes == 240
    assert plan.buckets == tuple(buckets)


@pytest.mark.parametrize("mode", ["p2p", "rdt", TransferMode.P2P, TransferMode.RDT])
def test_p2p_and_rdt_send_each_bucket_to_each_engine_bucket_major(buckets, mode) -> None:
    plan = plan_transfer(mode, buckets, ENGINES, source_rank=3, engine_sources={"e1": 5})
    assert plan.mode is TransferMode(mode)
    sources = {"e0": 3, "e1": 5, "e2": 3}
    assert plan.transfers == tuple(Transfer(b, sources[e], (e,)) for b in range(3) for e in ENGINES)
    assert plan.bytes_sent == 3 * (80 + 40 + 240)
    assert plan.staging_bytes == 240


def test_staging_bytes_is_the_largest_capacity_not_the_largest_payload() -> None:
    buckets = plan_buckets(
        [unit("u0", u8("a", 30)), unit("u1", u8("b", 70)), unit("u2", u8("c", 5))], 100
    )
    assert [b.nbytes for b in buckets] == [100, 5]
    assert plan_transfer("p2p", buckets, ["e"]).staging_bytes == 100
    small = plan_buckets([unit("u0", u8("a", 30))], 100)
    assert plan_transfer("broadcast", small, ["e"]).staging_bytes == 100  # capacity, not 30


def test_no_buckets_no_transfers() -> None:
    plan = plan_transfer("p2p", [], ["e0"])
    assert plan.transfers == () and plan.bytes_sent == 0 and plan.staging_bytes == 0


def test_bytes_sent_for_a_subset_of_buckets(buckets) -> None:
    # Resending buckets 1 and 2 only: Transfer.bucket is the bucket's index, not its position.
    plan = plan_transfer("p2p", buckets[1:], ["e0", "e1"])
    assert [t.bucket for t in plan.transfers] == [1, 1, 2, 2]
    assert plan.bytes_sent == 2 * (40 + 240)
    assert plan_transfer("broadcast", buckets[2:], ["e0", "e1"]).bytes_sent == 240


def test_bad_mode_names_the_flag(buckets) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^--update-weight-transfer-mode: got 'nccl'; choose broadcast, p2p, rdt or disk-",
    ):
        plan_transfer("nccl", buckets, ENGINES)


def test_engine_errors(buckets) -> None:
    with pytest.raises(ConfigError, match=r"^engines: no engine to update"):
        plan_transfer("broadcast", buckets, [])
    with pytest.raises(
        ConfigError, match=re.escape("engines: duplicate engine ids in ('e0', 'e1', 'e0')")
    ):
        plan_transfer("p2p", buckets, ["e0", "e1", "e0"])
    with pytest.raises(
        ConfigError, match=re.escape("engine_sources: names unknown engines ['e7', 'e9']")
    ):
        plan_transfer("p2p", buckets, ENGINES, engine_sources={"e9": 1, "e0": 2, "e7": 3})


# --------------------------------------------------------------------------- properties


@st.composite
def unit_lists(draw: st.DrawFn) -> list[UpdateUnit]:
    units = []
    for u in range(draw(st.integers(0, 12))):
        params = []
        for p in range(draw(st.integers(1, 4))):
            dtype = draw(st.sampled_from(sorted(TORCH_ITEMSIZE)))
            shape = draw(st.lists(st.integers(0, 6), max_size=3))
            params.append(ParamSpec.of(f"u{u}.p{p}", shape, dtype))
        units.append(UpdateUnit(f"u{u}", tuple(params)))
    return units


@settings(max_examples=200, deadline=None)
@given(units=unit_lists(), budget=st.integers(1, 800))
def test_bucket_plan_invariants(units: list[UpdateUnit], budget: int) -> None:
    buckets = plan_buckets(units, budget)
    params = {p.name: p for u in units for p in u.params}
    unit_of_param = {p.name: u.name for u in units for p in u.params}
    assert [b.index for b in buckets] == list(range(len(buckets)))
    # Units appear once each, in input order.
    assert [name for b in buckets for name in b.units] == [u.name for u in units]
    # Every parameter appears in exactly one span.
    seen = Counter(s.name for b in buckets for s in b.spans)
    assert seen == Counter(list(params))
    bucket_of_unit: dict[str, set[int]] = {}
    for b in buckets:
        assert b.spans and b.units
        previous_end = 0
        for s in b.spans:
            param = params[s.name]
            size = TORCH_ITEMSIZE[param.dtype]
            assert s.start % size == 0
            # No overlap, increasing, and no padding beyond what alignment needs.
            assert s.start == align_up(previous_end, size)
            assert s.end - s.start == param.nbytes
            assert (s.dtype, s.shape) == (param.dtype, param.shape)
            assert s.end <= b.capacity
            previous_end = s.end
            bucket_of_unit.setdefault(unit_of_param[s.name], set()).add(b.index)
        assert {unit_of_param[s.name] for s in b.spans} == set(b.units)
        assert b.nbytes == previous_end
        if b.oversize:
            assert len(b.units) == 1 and b.capacity == b.nbytes > budget
        else:
            assert b.capacity == budget and b.nbytes <= budget
        if len(b.units) > 1:
            assert b.nbytes <= budget
    # A unit's parameters all land in one bucket.
    assert all(len(indices) == 1 for indices in bucket_of_unit.values())
    # Greedy: a bucket closed only because the next unit would not have fit after it.
    by_name = {u.name: u for u in units}
    for b, following in itertools.pairwise(buckets):
        offset = b.nbytes
        for p in by_name[following.units[0]].params:
            offset = align_up(offset, TORCH_ITEMSIZE[p.dtype]) + p.nbytes
        assert offset > budget


@settings(max_examples=100, deadline=None)
@given(
    units=unit_lists(),
    budget=st.integers(1, 800),
    engines=st.integers(1, 5),
    mode=st.sampled_from(list(TransferMode)),
)
def test_transfer_plan_counts(units: list[UpdateUnit], budget: int, engines: int, mode) -> None:
    buckets = plan_buckets(units, budget)
    names = [f"e{i}" for i in range(engines)]
    plan = plan_transfer(mode, buckets, names)
    total = sum(b.nbytes for b in buckets)
    if mode in (TransferMode.BROADCAST, TransferMode.DISK_DELTA):  # disk-delta: written once
        assert len(plan.transfers) == len(buckets)
        assert all(t.targets == tuple(names) for t in plan.transfers)
        assert plan.bytes_sent == total
    else:
        assert len(plan.transfers) == len(buckets) * engines
        assert plan.bytes_sent == total * engines
        assert [(t.bucket, t.targets) for t in plan.transfers] == [
            (b.index, (e,)) for b in buckets for e in names
        ]
    assert plan.staging_bytes == max((b.capacity for b in buckets), default=0)
    assert all(plan.staging_bytes >= b.nbytes for b in buckets)


def test_a_parameter_named_like_a_group_does_not_merge_into_it() -> None:
    params = [ParamSpec.of("group:x", (2,), "float32"), ParamSpec.of("e.0", (2,), "float32")]
    with pytest.raises(ConfigError, match=r"atomic_key: unit names \['group:x'\]"):
        units_of(params, lambda name: "x" if name.startswith("e.") else None)


def test_plan_transfer_refuses_duplicate_buckets_and_broadcast_sources() -> None:
    (bucket,) = plan_buckets(units_of([ParamSpec.of("w", (4,), "float32")]), buffer_size=64)
    with pytest.raises(ConfigError, match=r"buckets: duplicate bucket indices in \[0, 0\]"):
        plan_transfer("p2p", [bucket, bucket], ["e0"])
    with pytest.raises(ConfigError, match="engine_sources: per-engine source ranks"):
        plan_transfer("broadcast", [bucket], ["e0"], engine_sources={"e0": 1})
