"""The transfer bench: its receivers end bitwise equal, its summary computes what it says, its
ceiling is the fastest way measured, and its backend method is the backend's own send."""

from __future__ import annotations

import argparse
import math

import pytest

torch = pytest.importorskip("torch")

from backends.bench.__main__ import _parser, config_from_args, run  # noqa: E402
from backends.bench.backend_path import TrainerSide  # noqa: E402
from backends.bench.ceiling import CEILINGS  # noqa: E402
from backends.bench.methods import BUCKETED, P2P_ONLY, REFERENCES, WRITES_WEIGHTS  # noqa: E402
from backends.bench.report import markdown, summarize, table  # noqa: E402
from backends.bench.state import bench_units, moe_specs, uniform_specs  # noqa: E402
from backends.bench.worker import BenchConfig, module_of  # noqa: E402
from backends.common.wire.buckets import BucketViews, payload_of  # noqa: E402
from miles_core.errors import ConfigError  # noqa: E402
from miles_core.transfer import plan_buckets  # noqa: E402

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
        methods=BUCKETED,
        references=REFERENCES,
    )
    raw = run(cfg)
    measured = {(t["mode"], t["method"], t["bucket_bytes"]) for t in raw["trials"]}
    expected = {
        (m, k, b)
        for m in cfg.modes
        for k in (*BUCKETED, *CEILINGS)
        for b in cfg.bucket_sizes
        if m == "p2p" or k not in P2P_ONLY
    }
    expected |= {(m, k, None) for m in cfg.modes for k in ("naive", "memcpy")}
    assert measured == expected
    for trial in raw["trials"]:
        if trial["method"] in WRITES_WEIGHTS:
            assert trial["weights_bitwise_equal"] is True, trial
        else:
            assert trial["weights_bitwise_equal"] is None
    summary = summarize(raw, cfg.as_json())
    assert summary["all_weights_bitwise_equal"]
    # the ceiling's own ways (and any it gained) are at most the ceiling; nothing else is
    # above it but a tie (one repeat: its interval is the one ratio, so no tie here either)
    gained = {(g["mode"], g["method"], g["bucket_bytes"]) for g in summary["ceiling_gained"]}
    for row in summary["results"]:
        key = (row["mode"], row["method"], row["bucket_bytes"])
        assert row["gained_by_ceiling"] == (key in gained)
        if row["method"] in CEILINGS or key in gained:
            assert 0 < row["ratio_to_ceiling"] <= 1.0
        elif row["method"] != "memcpy":
            assert row["ratio_to_ceiling"] <= 1.0 or row["tie"], row


def _trials(method: str, bucket: int | None, seconds: list[float], **extra) -> dict:
    return {
        "mode": "broadcast",
        "method": method,
        "bucket_bytes": bucket,
        "seconds": seconds,
        "weights_bitwise_equal": None,
        **extra,
    }


def _raw(check: bool = True) -> dict:
    """Two blocks (buckets of 100 and 200 bytes), three repeats; default bucket 200."""
    return {
        "payload_bytes": 10**9,
        "tensors": 3,
        "buckets": {"100": 4, "200": 2},
        "trials": [
            _trials("flat-bcast", 100, [1.0, 0.5, 2.0]),
            _trials("shm", 100, [0.8, 0.25, 0.9]),
            _trials("v0", 100, [4.0, 2.0, 3.0]),
            _trials("flat-bcast", 200, [1.0, 1.0, 4.0]),
            _trials("shm", 200, [0.5, 2.0, 2.0]),
            _trials("backend", 200, [1.25, 2.0, 4.0], weights_bitwise_equal=check),
            _trials("inflight", 200, [2.0, 2.0, 8.0], weights_bitwise_equal=True),
            _trials("backend-shm", 200, [1.25, 1.25, 5.0], weights_bitwise_equal=True),
            _trials("memcpy", None, [0.1, 0.2, 0.1]),
        ],
    }


def test_the_ceiling_is_the_blocks_fastest_way_and_ratios_pair_with_it() -> None:
    summary = summarize(_raw(), {"default_bucket": 200, "receivers": 1})
    rows = {(r["method"], r["bucket_bytes"]): r for r in summary["results"]}
    # bucket 100: shm (median .8 s) beats flat-bcast (1 s); bucket 200: flat-bcast (1 s)
    # beats shm (2 s), though shm was faster in one repeat: a way, not a best of draws
    assert summary["ceiling_set_by"]["broadcast"] == {"shm": 1, "flat-bcast": 1}
    # the median of .8, .25, .9 and 1, 1, 4
    assert summary["ceiling_gbps"]["broadcast"] == pytest.approx(1 / 0.95)
    v0 = rows[("v0", 100)]
    assert v0["seconds"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert v0["gbps"] == pytest.approx({"median": 1 / 3, "min": 0.25, "max": 0.5})
    # each repeat against shm's trial of the same repeat: .8/4, .25/2, .9/3
    assert v0["ratio_to_ceiling"] == pytest.approx(0.2)
    # against the wire alone (flat-bcast): 1/4, .5/2, 2/3
    assert v0["ratio_to_wire"] == pytest.approx(0.25)
    assert v0["buckets"] == 4
    # 1/1.25, 1/2, 4/4: a slow repeat slows both, and the pair still says 0.8; the fastest
    # of the ways in each repeat (.5, 1, 2) would have said 0.5, a best of two against one
    backend = rows[("backend", 200)]
    assert backend["ratio_to_ceiling"] == pytest.approx(0.8)
    assert backend["ratio_to_wire"] == pytest.approx(0.8)
    assert backend["ratio_interval"] == [pytest.approx(0.5), pytest.approx(1.0)]
    assert rows[("flat-bcast", 200)]["ratio_to_ceiling"] == pytest.approx(1.0)
    assert rows[("shm", 100)]["ratio_to_ceiling"] == pytest.approx(1.0)
    default = summary["default_bucket"]
    assert default["real_backend_ratio_to_ceiling"] == {"broadcast": pytest.approx(0.8)}
    assert default["v0_ratio_to_ceiling"] == {"broadcast": None}  # not measured at 200
    assert summary["all_weights_bitwise_equal"] is True
    text = table(summary | {"config": {"receivers": 1, "backend": "gloo"}})
    # each with its interval (three repeats: the range of the pairs)
    assert "CPU backend 0.80x [0.50-1.00] of the ceiling, 0.80x [0.50-1.00] of the wire" in text
    # 1/1.25, 1/1.25, 4/5: the CPU backend's shm wire, named beside the gloo one
    assert default["real_backend_shm_ratio_to_ceiling"] == {"broadcast": pytest.approx(0.8)}
    assert "with --wire shm 0.80x of the ceiling" in text
    # the machine's load beside the figures; a warning only when other work held every core
    config = {"config": {"receivers": 1, "backend": "gloo"}}
    quiet = {"machine": {"cores": 2, "load_before": 0.4, "load_after": 1.9}}
    busy = {"machine": {"cores": 2, "load_before": 2.5, "load_after": 4.0}}
    assert "load average 0.4 before the run" in table(summary | config | quiet)
    assert "other work was running" not in table(summary | config | quiet)
    assert "other work was running" in table(summary | config | busy)


def test_a_way_faster_in_every_repeat_joins_the_ceiling_and_noise_is_a_tie() -> None:
    summary = summarize(_raw(), {"default_bucket": 200, "receivers": 1})
    assert not summary["ceiling_gained"]
    # inflight faster than the ceiling's way in all three repeats: 1/.8, 1/.8, 4/3.2
    raw = _raw()
    raw["trials"][6]["seconds"] = [0.8, 0.8, 3.2]
    faster = summarize(raw, {"default_bucket": 200})
    assert faster["ceiling_gained"] == [
        {
            "mode": "broadcast",
            "method": "inflight",
            "bucket_bytes": 200,
            "ratio_before": pytest.approx(1.25),
            "interval_before": [pytest.approx(1.25), pytest.approx(1.25)],
        }
    ]
    rows = {r["method"]: r for r in faster["results"] if r["bucket_bytes"] == 200}
    # the ceiling now is inflight's time in each repeat: no figure is above it
    assert rows["inflight"]["ratio_to_ceiling"] == pytest.approx(1.0)
    assert rows["inflight"]["gained_by_ceiling"] and not rows["inflight"]["tie"]
    assert rows["backend"]["ratio_to_ceiling"] == pytest.approx(0.64)  # .8/1.25, .8/2, 3.2/4
    # shm: 1/.5 in one repeat, .8/2 in another: above 1.0 only within its interval, a tie
    assert all(r["ratio_to_ceiling"] <= 1.0 or r["tie"] for r in rows.values())
    assert rows["shm"]["tie"]
    assert faster["ceiling_set_by"]["broadcast"] == {"shm": 1, "inflight": 1}
    text = table(faster | {"config": {"receivers": 1, "backend": "gloo"}})
    assert "the ceiling gained broadcast inflight at" in text and "(1.25x of the" in text
    assert "ABOVE" not in text and "faster way: the ceiling gained it" in text
    assert "**faster way: the ceiling gained it**" in markdown(faster)
    # memcpy moves nothing between processes: a bound, never gained
    memcpy = next(r for r in faster["results"] if r["method"] == "memcpy")
    assert memcpy["ratio_to_ceiling"] > 1 and not memcpy["gained_by_ceiling"]
    # faster in two repeats of three: 1/.8, 1/.8, 4/4.4 -> median 1.25 over an interval
    # reaching .91: a tie, marked and not gained, and the ceiling stays its own ways
    raw["trials"][6]["seconds"] = [0.8, 0.8, 4.4]
    tie = summarize(raw, {"default_bucket": 200})
    row = next(r for r in tie["results"] if r["method"] == "inflight")
    assert row["ratio_to_ceiling"] == pytest.approx(1.25) and row["tie"]
    assert row["ratio_interval"] == [pytest.approx(4 / 4.4), pytest.approx(1.25)]
    assert not tie["ceiling_gained"] and not row["gained_by_ceiling"]
    line = next(x for x in markdown(tie).splitlines() if "| inflight |" in x)
    assert "**1.25x**" in line and line.endswith("tie |")
    assert "no figure above its ceiling" in table(
        tie | {"config": {"receivers": 1, "backend": "gloo"}}
    )


def test_the_interval_of_a_median_covers_it_as_often_as_it_says() -> None:
    from backends.bench.ratios import COVERAGE, median_interval

    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for less than the range
    ten = [float(v) for v in range(10)]
    assert median_interval(ten) == (1.0, 8.0)  # k=2 would cover 0.89 < 0.9
    # by simulation: draws of a known median fall inside as often as COVERAGE says
    import random

    rng = random.Random(0)
    inside = 0
    for _ in range(2000):
        low, high = median_interval([rng.gauss(0.0, 1.0) for _ in range(15)])
        inside += low <= 0.0 <= high
    assert inside / 2000 >= COVERAGE - 0.02


def test_one_failed_check_fails_the_summary_and_a_missing_ceiling_is_an_error() -> None:
    failed = summarize(_raw(check=False), {"default_bucket": 200})
    assert failed["all_weights_bitwise_equal"] is False
    raw = _raw()
    raw["trials"] = [t for t in raw["trials"] if t["method"] not in CEILINGS]
    with pytest.raises(ConfigError, match="no ceiling"):
        summarize(raw, {"default_bucket": 200})


class _Work:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait(self) -> None:
        self.log.append(f"wait {self.name}")


class _Group:
    """Records the broadcasts it is asked for, and when each is waited for."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.sent: list[torch.Tensor] = []

    def broadcast(self, tensors: list, options) -> _Work:
        self.log.append(f"send {self.name}")
        self.sent.append(tensors[0])
        return _Work(self.log, self.name)


def test_the_trainer_sends_a_bucket_to_every_p2p_engine_before_waiting_for_one() -> None:
    """The bench's sender is the trainer's own send_bucket: with one pair group per engine
    it starts every broadcast, then waits for all, from the bucket's view buffer."""
    model = module_of(moe_specs(1 << 20), torch.device("cpu"))
    bucket = plan_buckets(bench_units("qwen3-30b-a3b", 1 << 20), 64 * KIB)[1]
    log: list[str] = []
    groups = {n: _Group(log, n) for n in ("e1", "e2", "e3")}
    side = TrainerSide(torch.device("cpu"), BucketViews(model), dict(groups))
    side.send(["e1", "e2", "e3"], bucket)
    assert log == ["send e1", "send e2", "send e3", "wait e1", "wait e2", "wait e3"]
    buffer = side._views.buffer_for(*payload_of(bucket))
    assert all(g.sent == [buffer] for g in groups.values())  # the weights' own bytes
    side.send("e2", bucket)  # one name, as the transport's broadcast call passes it
    assert log[-2:] == ["send e2", "wait e2"]
    assert [b.data_ptr() for b in groups["e2"].sent] == [buffer.data_ptr()] * 2


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
        (["--receivers", "100000"], "--receivers"),
        (["--size-mib", "100000000"], "--size-mib"),
        (["--bucket-mib", "512", "--default-bucket-mib", "512"], "--bucket-mib"),
        (["--methods", "backend,teleport"], "--methods"),
        (["--mix", "llama"], "--mix"),
        (["--backend", "nccl"], "--backend"),
    ],
)
def test_bad_flags_are_errors_that_name_the_flag(argv: list[str], field: str) -> None:
    args: argparse.Namespace = _parser().parse_args(["transfer", *argv])
    with pytest.raises(ConfigError) as error:
        config_from_args(args, cuda=False)
    assert error.value.field == field


def test_the_methods_rank_has_all_a_ceiling_reads() -> None:
    """The ceiling knows the rank only as ``CeilingRank`` (it imports nothing of the
    methods): every member it names is one of ``Rank``'s, so a rename on either side fails
    here, not in a bench run."""
    import dataclasses

    from backends.bench.ceiling import CeilingRank
    from backends.bench.methods import Rank

    fields = {f.name: f.type for f in dataclasses.fields(Rank)}
    for name, hint in CeilingRank.__annotations__.items():
        assert fields.get(name) == hint, (name, fields.get(name), hint)
    assert isinstance(Rank.is_source, property) and isinstance(CeilingRank.is_source, property)
