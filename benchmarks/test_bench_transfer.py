"""Bucket planning for a 1T-parameter MoE at miles' default 512 MiB --update-weight-buffer-size.

Timed: ``units_of`` (grouping by the atomic key) plus ``plan_buckets``, from the
spec list to the bucket plan. Two groupings of the routed experts:

- ``expert``: one update unit per expert (its gate/up/down projections and their
  FP8 scales), about 44 MB, so about eleven experts share a bucket;
- ``layer``: all 384 experts of a layer as one unit (about 17 GB, larger than
  the budget), so each layer's experts get an oversize bucket of their own.

Every other tensor is a unit of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from miles_core.transfer import (
    DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE,
    ParamSpec,
    itemsize,
    plan_buckets,
    units_of,
)

EXPERTS = ".mlp.experts."


def per_expert(name: str) -> str | None:
    at = name.find(EXPERTS)
    if at < 0:
        return None
    expert_end = name.index(".", at + len(EXPERTS))
    return name[:expert_end]


def per_layer(name: str) -> str | None:
    at = name.find(EXPERTS)
    return None if at < 0 else name[: at + len(EXPERTS) - 1]


GROUPINGS: dict[str, Callable[[str], str | None]] = {"expert": per_expert, "layer": per_layer}


def check_plan(specs: list[ParamSpec], atomic_key, buckets) -> None:
    budget = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE
    spans = [s for b in buckets for s in b.spans]
    # Every parameter once, in order, nothing lost: payload bytes equal the spec total.
    assert [s.name for s in spans] == [p.name for p in specs]
    assert sum(b.payload_bytes for b in buckets) == sum(p.nbytes for p in specs)
    by_name = {p.name: p for p in specs}
    unit_bucket: dict[str, int] = {}
    for bucket in buckets:
        assert bucket.nbytes <= bucket.capacity
        assert bucket.oversize == (bucket.capacity > budget)
        if bucket.oversize:
            assert len(bucket.units) == 1
        end = 0
        for span in bucket.spans:
            spec = by_name[span.name]
            assert span.end - span.start == spec.nbytes
            assert span.start >= end and span.start % itemsize(spec.dtype) == 0
            end = span.end
            # No unit split: all members of a unit (same atomic key) land in one bucket.
            key = atomic_key(span.name) or span.name
            assert unit_bucket.setdefault(key, bucket.index) == bucket.index


@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
def test_plan_buckets_kimi_k2(benchmark, kimi_specs: list[ParamSpec], grouping: str) -> None:
    atomic_key = GROUPINGS[grouping]

    def plan():
        return plan_buckets(units_of(kimi_specs, atomic_key), DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE)

    buckets = benchmark(plan)
    check_plan(kimi_specs, atomic_key, buckets)
    units = units_of(kimi_specs, atomic_key)
    assert sum(len(b.units) for b in buckets) == len(units)
    benchmark.extra_info.update(
        params=len(kimi_specs),
        units=len(units),
        buckets=len(buckets),
        oversize_buckets=sum(b.oversize for b in buckets),
        total_bytes=sum(p.nbytes for p in kimi_specs),
    )
