"""The transfer bench: its receivers end bitwise equal, and its summary computes what it says."""

from __future__ import annotations

import argparse
import math

import pytest

torch = pytest.importorskip("torch")

from backends.bench.__main__ import _parser, config_from_args, run  # noqa: E402
from backends.bench.methods import BUCKETED, WRITES_WEIGHTS  # noqa: E402
from backends.bench.report import summarize, table  # noqa: E402
from backends.bench.state import bench_units, moe_specs, uniform_specs  # noqa: E402
from backends.bench.worker import BenchConfig, module_of  # noqa: E402
from miles_core.errors import ConfigError  # noqa: E402

KIB = 1024


def test_every_method_leaves_every_receiver_bitwise_equal_in_both_modes() -> None:
    """Three real processes over gloo on loopback, 1 MiB of Qwen3-MoE-shaped tensors."""
    cfg = BenchConfig(
        size_bytes=1024 * KIB,
        receivers=2,
        bucket_sizes=(64 * KIB, 512 * KIB),
        default_bucket=512 * KIB,
        repeats=1,
        warmup=1,
        progress=False,
    )
    raw = run(cfg)
    checked = {(t["mode"], t["method"], t["bucket_bytes"]) for t in raw["trials"]}
    expected = {(m, k, b) for m in cfg.modes for k in BUCKETED for b in cfg.bucket_sizes}
    expected |= {(m, "naive", None) for m in cfg.modes}
    assert expected <= checked
    for trial in raw["trials"]:
        if trial["method"] in WRITES_WEIGHTS:
            assert trial["weights_bitwise_equal"] is True, trial
        else:
            assert trial["weights_bitwise_equal"] is None
    assert summarize(raw, cfg.as_json())["all_weights_bitwise_equal"]


def _raw(check: bool = True) -> dict:
    """Two blocks (buckets of 100 and 200 bytes), three repeats; default bucket 200."""
    trial = {"mode": "broadcast", "weights_bitwise_equal": None}
    return {
        "payload_bytes": 10**9,
        "tensors": 3,
        "buckets": {"100": 4, "200": 2},
        "trials": [
            {**trial, "method": "flat", "bucket_bytes": 100, "seconds": [1.0, 0.5, 2.0]},
            {**trial, "method": "v0", "bucket_bytes": 100, "seconds": [4.0, 2.0, 3.0]},
            {**trial, "method": "flat", "bucket_bytes": 200, "seconds": [1.0, 1.0, 4.0]},
            {
                **trial,
                "method": "backend",
                "bucket_bytes": 200,
                "seconds": [1.25, 2.0, 4.0],
                "weights_bitwise_equal": check,
            },
            {**trial, "method": "memcpy", "bucket_bytes": None, "seconds": [0.1, 0.2, 0.1]},
        ],
    }


def test_summary_rates_and_side_by_side_ratios_follow_from_the_timings() -> None:
    summary = summarize(_raw(), {"default_bucket": 200, "receivers": 1})
    rows = {(r["method"], r["bucket_bytes"]): r for r in summary["results"]}
    # the ceiling shown is the median of every flat trial: 0.5, 1, 1, 1, 2, 4 -> 1 s
    assert summary["ceiling_gbps"]["broadcast"] == pytest.approx(1.0)
    v0 = rows[("v0", 100)]
    assert v0["seconds"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert v0["gbps"] == pytest.approx({"median": 1 / 3, "min": 0.25, "max": 0.5})
    # each repeat against the flat trial of the same repeat and block: 1/4, .5/2, 2/3
    assert v0["ratio_to_flat"] == pytest.approx(0.25)
    assert v0["buckets"] == 4
    # 1/1.25, 1/2, 4/4: a slow repeat slows both, and the pair still says 0.8
    assert rows[("backend", 200)]["ratio_to_flat"] == pytest.approx(0.8)
    assert rows[("memcpy", None)]["ratio_to_flat"] == pytest.approx(10.0)  # default block
    default = summary["default_bucket"]
    assert default["real_backend_ratio_to_flat"] == {"broadcast": pytest.approx(0.8)}
    assert default["v0_ratio_to_flat"] == {"broadcast": None}  # v0 was not measured at 200
    assert summary["all_weights_bitwise_equal"] is True
    assert "0.80x flat" in table(summary | {"config": {"receivers": 1, "backend": "gloo"}})


def test_one_failed_check_fails_the_summary_and_a_missing_ceiling_is_an_error() -> None:
    failed = summarize(_raw(check=False), {"default_bucket": 200})
    assert failed["all_weights_bitwise_equal"] is False
    raw = _raw()
    raw["trials"] = [t for t in raw["trials"] if t["method"] != "flat"]
    with pytest.raises(ConfigError, match="no flat trials"):
        summarize(raw, {"default_bucket": 200})


def test_the_moe_mix_is_shaped_like_qwen3_and_fits_its_budget() -> None:
    for budget in (1 << 20, 64 << 20, 256 << 20):
        specs = moe_specs(budget)
        total = sum(s.nbytes for s in specs)
        assert total <= budget
        assert total > budget // 2  # scaled to fit, not shrunk to nothing
        names = {s.name for s in specs}
        assert "model.layers.0.mlp.experts.1.down_proj.weight" in names
        assert {s.dtype for s in specs} == {"bfloat16", "float32"}  # the fp32 router
    units = bench_units("qwen3-30b-a3b", 1 << 20)
    assert any(u.name.endswith(".qkv") and len(u.params) == 3 for u in units)
    assert math.isclose(sum(s.nbytes for s in uniform_specs(1 << 20, 4)), 1 << 20)


def test_module_of_names_its_parameters_as_the_specs_do() -> None:
    specs = moe_specs(1 << 20)
    model = module_of(specs, torch.device("cpu"))
    got = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]
    assert got == [(s.name, s.shape, getattr(torch, s.dtype)) for s in specs]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--default-bucket-mib", "32"], "--default-bucket-mib"),
        (["--bucket-mib", "4,x"], "--bucket-mib"),
        (["--modes", "broadcast,rdma"], "--modes"),
        (["--receivers", "0"], "--receivers"),
        (["--mix", "llama"], "--mix"),
        (["--backend", "nccl"], "--backend"),
    ],
)
def test_bad_flags_are_errors_that_name_the_flag(argv: list[str], field: str) -> None:
    args: argparse.Namespace = _parser().parse_args(["transfer", *argv])
    with pytest.raises(ConfigError) as error:
        config_from_args(args, cuda=False)
    assert error.value.field == field
