"""Calibration recovers a known transfer model; predictions scale as the model says."""

from __future__ import annotations

import dataclasses

import pytest

from miles_core.errors import ConfigError
from miles_core.scenario import PRESETS, Preset
from sim.cli.predict import main as predict
from sim.timing.calibration import apply_fit, calibrate, least_squares, predict_update_seconds


def _timing(preset: Preset, **changes: float) -> Preset:
    return dataclasses.replace(preset, timing=dataclasses.replace(preset.timing, **changes))


MIB = 1024**2


def test_least_squares_recovers_latency_and_bandwidth_exactly() -> None:
    latency, bandwidth = 2e-3, 3e9
    points = [
        (s, n, latency * s + n / bandwidth)
        for s, n in ((1, 256 * MIB), (4, 256 * MIB), (64, 512 * MIB))
    ]
    fit = least_squares(points)
    assert fit.latency_seconds == pytest.approx(latency)
    assert fit.bytes_per_second == pytest.approx(bandwidth)
    assert not fit.clamped


def test_a_negative_latency_from_noise_is_clamped_and_bandwidth_refit() -> None:
    fit = least_squares([(1, 100, 1.0), (10, 100, 0.9)])
    assert fit.clamped and fit.latency_seconds == 0.0
    assert fit.bytes_per_second == pytest.approx(100 / 0.95)


def test_sends_proportional_to_bytes_cannot_be_split() -> None:
    with pytest.raises(ConfigError, match="cannot be told apart"):
        least_squares([(1, 10, 1.0), (2, 20, 2.0)])
    with pytest.raises(ConfigError, match="two bucket sizes") as one:
        least_squares([(1, 10, 1.0)])
    assert "--full" in one.value.fix  # a default bench run times one bucket size


def _bench_summary(latency: float, bandwidth: float, receivers: int) -> dict:
    """A bench JSON whose times follow the simulator's model exactly."""
    payload, results = 256 * MIB, []
    # p2p sends to every receiver at once: per bucket, one link's time, as a broadcast
    for mode in ("broadcast", "p2p"):
        for buckets, size in ((64, 4 * MIB), (16, 16 * MIB), (4, 64 * MIB)):
            t = latency * buckets + payload / bandwidth
            results.append(
                {
                    "mode": mode,
                    "method": "backend",
                    "bucket_bytes": size,
                    "buckets": buckets,
                    "seconds": {"median": t, "min": t, "max": t},
                }
            )
    return {"config": {"receivers": receivers}, "payload_bytes": payload, "results": results}


def test_calibration_from_bench_json_counts_sends_as_the_simulator_does() -> None:
    fits = calibrate(_bench_summary(5e-3, 2e9, receivers=2))
    for fit in fits.values():  # p2p sends every bucket to each receiver, all at once
        assert fit.latency_seconds == pytest.approx(5e-3)
        assert fit.bytes_per_second == pytest.approx(2e9)
    with pytest.raises(ConfigError, match="--method: 'v0' has no bucketed results"):
        calibrate(_bench_summary(5e-3, 2e9, 2), method="v0")


def test_a_prediction_is_latency_per_bucket_plus_bytes_over_the_link() -> None:
    kimi = PRESETS["kimi-k2-1t-fp8-256gpu"]
    got = predict_update_seconds(kimi, 512 * MIB)
    assert got["link"] == "link"  # trainer and engines on different nodes: InfiniBand
    t = kimi.timing
    expected = got["buckets"] * t.link_latency_seconds + got["bytes"] / t.link_bytes_per_second
    assert got["seconds"] == pytest.approx(expected)
    assert got["bytes"] == pytest.approx(kimi.world.param_bytes, rel=1e-3)


def test_predictions_scale_with_bytes_engines_and_bucket_count() -> None:
    base = _timing(PRESETS["qwen3-30b-a3b-4x8-h100"], link_latency_seconds=0.0)
    one = predict_update_seconds(base)["seconds"]
    world = dataclasses.replace(base.world, param_bytes=2 * base.world.param_bytes)
    double = dataclasses.replace(base, world=world)
    assert predict_update_seconds(double)["seconds"] == pytest.approx(2 * one, rel=1e-3)
    p2p = predict_update_seconds(base, mode="p2p")["seconds"]
    assert base.world.num_engines > 1
    assert p2p == pytest.approx(one)  # p2p: one link per engine, all at once
    slow = _timing(base, link_latency_seconds=0.01)
    small = predict_update_seconds(slow, 64 * MIB)
    big = predict_update_seconds(slow, 512 * MIB)
    assert small["seconds"] - big["seconds"] == pytest.approx(
        0.01 * (small["buckets"] - big["buckets"])
    )


def test_apply_fit_sets_the_fitted_link_kind_only() -> None:
    config = PRESETS["small"]
    fit = {"latency_seconds": 1e-3, "bytes_per_second": 5e9, "link": "nvlink"}
    applied = apply_fit(config, fit).timing
    assert (applied.link_latency_seconds, applied.nvlink_bytes_per_second) == (1e-3, 5e9)
    assert applied.link_bytes_per_second == config.timing.link_bytes_per_second


def test_predict_cli_names_the_bad_preset(capsys) -> None:
    with pytest.raises(SystemExit):
        predict(["gpt-5"])
    assert "preset: unknown preset 'gpt-5'" in capsys.readouterr().err
    assert predict(["kimi-k2-1t-fp8-256gpu"]) == 0
    assert "22." in capsys.readouterr().out
