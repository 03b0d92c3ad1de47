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
from backends.bench.methods import BUCKETED, P2P_ONLY, WRITES_WEIGHTS  # noqa: E402
from backends.bench.report import TIE, markdown, summarize, table  # noqa: E402
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
    # the flag follows the ratios; the ceiling's own ways are at most the ceiling
    flagged = {(r["mode"], r["method"], r["bucket_bytes"]) for r in summary["above_ceiling"]}
    for row in summary["results"]:
        key = (row["mode"], row["method"], row["bucket_bytes"])
        beaten = row["ratio_to_ceiling"] > 1 + TIE and row["method"] != "memcpy"
        assert (key in flagged) == beaten
        if row["method"] in CEILINGS:
            assert 0 < row["ratio_to_ceiling"] <= 1.0


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
            _trials("shm", 100, [2.0, 0.25, 1.0]),
            _trials("v0", 100, [4.0, 2.0, 3.0]),
            _trials("flat-bcast", 200, [1.0, 1.0, 4.0]),
            _trials("shm", 200, [0.5, 2.0, 2.0]),
            _trials("backend", 200, [1.25, 2.0, 4.0], weights_bitwise_equal=check),
            _trials("inflight", 200, [0.4, 1.0, 2.0], weights_bitwise_equal=True),
            _trials("backend-shm", 200, [0.625, 1.25, 2.5], weights_bitwise_equal=True),
            _trials("memcpy", None, [0.1, 0.2, 0.1]),
        ],
    }


def test_the_ceiling_is_the_fastest_way_in_each_repeat_and_ratios_pair_with_it() -> None:
    summary = summarize(_raw(), {"default_bucket": 200, "receivers": 1})
    rows = {(r["method"], r["bucket_bytes"]): r for r in summary["results"]}
    # per repeat, the faster of flat-bcast and shm: 1, .25, 1 and .5, 1, 2 -> median 1 s
    assert summary["ceiling_gbps"]["broadcast"] == pytest.approx(1.0)
    assert summary["ceiling_set_by"]["broadcast"] == {"shm": 4, "flat-bcast": 2}
    v0 = rows[("v0", 100)]
    assert v0["seconds"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert v0["gbps"] == pytest.approx({"median": 1 / 3, "min": 0.25, "max": 0.5})
    # each repeat against the ceiling of the same repeat and block: 1/4, .25/2, 1/3
    assert v0["ratio_to_ceiling"] == pytest.approx(0.25)
    # against the wire alone (flat-bcast): 1/4, .5/2, 2/3
    assert v0["ratio_to_wire"] == pytest.approx(0.25)
    assert v0["buckets"] == 4
    # .5/1.25, 1/2, 2/4: a slow repeat slows both, and the pair still says 0.5
    assert rows[("backend", 200)]["ratio_to_ceiling"] == pytest.approx(0.5)
    assert rows[("backend", 200)]["ratio_to_wire"] == pytest.approx(0.8)
    for way in ("flat-bcast", "shm"):
        for bucket in (100, 200):
            assert rows[(way, bucket)]["ratio_to_ceiling"] <= 1.0
    default = summary["default_bucket"]
    assert default["real_backend_ratio_to_ceiling"] == {"broadcast": pytest.approx(0.5)}
    assert default["v0_ratio_to_ceiling"] == {"broadcast": None}  # not measured at 200
    assert summary["all_weights_bitwise_equal"] is True
    text = table(summary | {"config": {"receivers": 1, "backend": "gloo"}})
    assert "CPU backend 0.50x of the ceiling, 0.80x of the wire" in text
    # .5/.625, 1/1.25, 2/2.5: the CPU backend's shm wire, named beside the gloo one
    assert default["real_backend_shm_ratio_to_ceiling"] == {"broadcast": pytest.approx(0.8)}
    assert "with --wire shm 0.80x of the ceiling" in text


def test_a_method_above_the_ceiling_is_flagged_as_a_bug_in_the_ceiling() -> None:
    summary = summarize(_raw(), {"default_bucket": 200, "receivers": 1})
    # inflight: .5/.4, 1/1, 2/2 -> 1.0 (not above); make it beat the ceiling in two repeats
    raw = _raw()
    raw["trials"][6]["seconds"] = [0.4, 0.5, 2.0]
    above = summarize(raw, {"default_bucket": 200})
    assert not summary["above_ceiling"]
    assert above["above_ceiling"] == [
        {
            "mode": "broadcast",
            "method": "inflight",
            "bucket_bytes": 200,
            "ratio_to_ceiling": pytest.approx(1.25),
        }
    ]
    text = table(above | {"config": {"receivers": 1, "backend": "gloo"}})
    assert "ABOVE CEILING" in text and "1 figure(s) ABOVE THE CEILING" in text
    assert "**ABOVE CEILING" in markdown(above)
    # memcpy moves nothing between processes: a bound, shown but never flagged
    memcpy = next(r for r in above["results"] if r["method"] == "memcpy")
    assert memcpy["ratio_to_ceiling"] > 1 and not memcpy["above_ceiling"]
    assert "ABOVE" not in markdown(summary)
    # within TIE of the ceiling is a tie, marked and not flagged: .5/.49, 1/.98, 2/1.96
    raw["trials"][6]["seconds"] = [0.49, 0.98, 1.96]
    tie = summarize(raw, {"default_bucket": 200})
    row = next(r for r in tie["results"] if r["method"] == "inflight")
    assert row["ratio_to_ceiling"] == pytest.approx(1 / 0.98) and not tie["above_ceiling"]
    line = next(x for x in markdown(tie).splitlines() if "| inflight |" in x)
    assert "**1.02x**" in line and line.endswith("tie |") and "ABOVE" not in line
    assert "no figure above its ceiling" in table(
        tie | {"config": {"receivers": 1, "backend": "gloo"}}
    )


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
