"""The async-vs-sync plans' generation is predicted, not set on a row
(sim/timing/anchor_generation.py): each plan file carries the decode law and KV pool derived
from its model, its GPU and the efficiencies fitted to published engine figures, and the
ledger labels what that law now predicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import GroupStarted, StepBegan, StepCommitted
from sim.timing.anchor_generation import (
    AREAL_SERVING,
    LAW_KEYS,
    QWEN25_MATH_7B,
    R1_DISTILL_QWEN_1_5B,
    SERVINGS,
    engine_efficiency,
)
from sim.timing.anchor_report import predict_all
from sim.timing.basis import Basis
from sim.timing.decode_figures import FIGURES
from sim.timing.decode_law import law
from sim.timing.ledger import ledger
from sim.timing.plan_file import load_plan, points
from sim.timing.recovery_anchors import predict_recovery
from sim.timing.speedup_anchors import (
    AREAL,
    AREAL_STALENESS,
    COMPARISONS,
    ROOT,
    SpeedupPrediction,
    StalenessPrediction,
    steady_generation,
)


@pytest.mark.parametrize("serving", SERVINGS, ids=lambda s: Path(s.plan).stem)
def test_each_plans_decode_law_is_the_one_the_engine_figures_give(serving) -> None:  # type: ignore[no-untyped-def]
    """Nobody re-tunes the law to a row: the plan's three figures are the law of its
    deployment at the efficiencies fitted to the engine figures, its KV pool the model's."""
    plan = load_plan(str(ROOT / serving.plan))
    timing, work, model = (plan.tables[k] for k in ("timing", "workload", "model"))
    derived = law(serving.deployment, engine_efficiency())
    figures = (derived.fixed, derived.per_request, derived.per_kv_token)
    for key, value in zip(LAW_KEYS, figures, strict=True):
        assert timing[key] == pytest.approx(value, rel=1e-3), key
    for key, value in serving.timing_keys().items():
        assert timing[key] == value, key  # the byte counts whole, the law to 4 digits
    assert "decode_seconds_per_token" not in work and "concurrency_slowdown" not in work
    assert model["gpus_per_engine"] == serving.deployment.tp
    assert model["param_bytes"] == pytest.approx(
        serving.deployment.weight_bytes_per_gpu * serving.deployment.tp, rel=0.01
    )


def test_the_architectures_give_the_published_parameter_counts() -> None:
    assert R1_DISTILL_QWEN_1_5B.params == pytest.approx(1.777e9, rel=1e-3)
    assert QWEN25_MATH_7B.params == pytest.approx(7.616e9, rel=1e-3)
    assert QWEN25_MATH_7B.kv_values_per_token * 2 == 57344  # 28 x 4 x 128 x 2 x 2 bytes


def test_no_rl_anchor_model_is_among_the_engine_figures() -> None:
    fitted = {f.deployment.model.name for f in FIGURES}
    assert not fitted & {s.deployment.model.name for s in SERVINGS}


def test_the_kv_pool_caps_each_engine_as_the_docs_say() -> None:
    """AReaL: (80 GiB x 0.9 - 3.55 GB) / 28,672 B = 2.57 M tokens, 92 requests of 256 +
    27,648; verl at TP 4: (96 GiB x 0.8 - 3.81 GB) / 14,336 B = 5.49 M tokens, 189 of 256 +
    28,672."""
    caps = {Path(s.plan).stem: s.running_cap() for s in SERVINGS}
    assert caps["areal-1.5b-128-h800"] == (2572378, 92)
    assert caps["verl-7b-128-h20"] == (5486576, 189)


def _ledger_of(speedups: list[SpeedupPrediction]):  # type: ignore[no-untyped-def]
    curve = [StalenessPrediction(eta, tps, tps, ()) for eta, tps in AREAL_STALENESS]
    return ledger(predict_all(), speedups, curve, {32: 1.0}, predict_recovery())


def test_the_ledger_labels_what_the_law_now_predicts() -> None:
    """AReaL's sync step: predicted (its mean length comes from the async step and Fig. 5c,
    not from it); verl's sync steps restate their training phase; each colocated
    generation phase is predicted and counted once."""
    speedups = [
        SpeedupPrediction(
            c.row,
            c.plan,
            c.sync_step,
            c.async_step,
            c.sync_step,
            c.async_step,
            c.source,
            (),
            None if c.sync_generation is None else c.sync_generation * 1.1,
            c.sync_generation,
        )
        for c in COMPARISONS
    ]
    figures = {c.figure: c for c in _ledger_of(speedups)}
    areal = next(c for c in COMPARISONS if c.source == AREAL)
    assert figures[f"{areal.row}: sync step"].basis is Basis.PREDICTED
    assert areal.sync_basis[0] is Basis.PREDICTED
    generation = [c for name, c in figures.items() if name.endswith(": sync generation")]
    assert len(generation) == 3
    assert all(c.basis is Basis.PREDICTED and not c.derived_from for c in generation)
    assert all(c.ratio == pytest.approx(1.1) for c in generation)
    verl = [c for c in COMPARISONS if c.source != AREAL]
    assert all(figures[f"{c.row}: sync step"].basis is Basis.RESTATED for c in verl)
    sync = [c for n, c in figures.items() if n.endswith((": sync step", ": sync generation"))]
    assert len(sync) == 7 and not any(c.basis is Basis.FITTED for c in sync)


def test_a_sync_runs_generation_spans_from_its_first_group_to_its_step() -> None:
    history = []
    for step, (start, began, done) in enumerate([(0, 50, 60), (61, 101, 111), (112, 172, 182)]):
        history += [
            GroupStarted(t=start, group_id=step, prompt_id=step),
            GroupStarted(t=start + 1, group_id=10 + step, prompt_id=step),
            StepBegan(t=began, step=step),
            StepCommitted(t=done, step=step, attempt=1, n_groups=2),
        ]
    assert steady_generation(history, skip=0) == pytest.approx((40 + 60) / 2)
    assert steady_generation(history, skip=1) == pytest.approx(60)
    with pytest.raises(ValueError, match="4 generated"):
        steady_generation(history, skip=2)


def _plan(tmp_path: Path, timing: str, workload: str = "response_tokens_max = 1024.0") -> str:
    path = tmp_path / "p.toml"
    path.write_text(
        f"""
[cluster]
gpus = 16
[model]
param_bytes = 1e9
gpus_per_cell = 4
gpus_per_engine = 2
train_seconds_per_sample = 0.5
[workload]
rollout_batch_size = 8
n_samples_per_prompt = 2
{workload}
[timing]
{timing}
[search]
rollout_share = [0.5]
"""
    )
    return str(path)


POOL = "engine_gpu_memory_bytes = 80e9\nkv_bytes_per_token = 131072.0\n"


def test_a_plan_gives_the_law_and_the_kv_pool_in_timing(tmp_path: Path) -> None:
    """The pool reads [workload] response_tokens_max: the two sections are checked together."""
    law_keys = "decode_step_fixed_seconds = 0.005\ndecode_step_seconds_per_request = 1e-5\n"
    path = _plan(tmp_path, POOL + law_keys + "model_weight_bytes_per_gpu = 8e9")
    timing = next(p.scenario for p in points(load_plan(path)) if p.scenario).timing
    assert timing.batch_law() and timing.running_cap() == (80e9 * 0.88 - 8e9) // 131072 // 1280


@pytest.mark.parametrize(
    ("timing", "workload", "named", "says"),
    [
        (POOL, "", r"\[timing\]\.engine_gpu_memory_bytes", "response_tokens_max"),
        (
            "engine_gpu_memory_bytes = 80e9",
            "response_tokens_max = 1024.0",
            r"\[timing\]\.engine_gpu_memory_bytes",
            "kv_bytes_per_token",
        ),
        (
            "decode_step_fixed_seconds = -0.01",
            "",
            r"\[timing\]\.decode_step_fixed_seconds",
            "got -0.01",
        ),
        (POOL, "response_tokens_max = -5.0", r"\[workload\]\.response_tokens_max", "got -5.0"),
    ],
)
def test_a_bad_generation_key_is_named_where_the_plan_has_it(
    tmp_path: Path, timing: str, workload: str, named: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=named) as error:
        load_plan(_plan(tmp_path, timing, workload))
    assert says in str(error.value)


def test_areals_plan_is_the_one_the_serving_names() -> None:
    assert AREAL_SERVING.plan in {c.plan for c in COMPARISONS if c.source == AREAL}
