"""The decode law, its prior, its fit to published figures and the held-out passes
(sim/timing/decode_law.py, decode_figures.py, decode_report.py; issue 51, item 3)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.timing.basis import Basis, tally
from sim.timing.decode_figures import (
    A100,
    FIGURES,
    H100,
    LLAMA2_7B,
    LLAMA2_70B,
    Metric,
    usable,
)
from sim.timing.decode_law import (
    ALLREDUCE_SECONDS,
    LAUNCH_SECONDS_PER_LAYER,
    DecodeLaw,
    Deployment,
    Efficiency,
    Observation,
    fit,
    law,
    prefill_seconds,
    serving_itl_features,
    static_run_features,
)
from sim.timing.decode_report import (
    a100_to_h100,
    compared_rows,
    counts,
    in_fit,
    leave_family_out,
    prior,
    report,
)

ROOT = Path(__file__).resolve().parents[1]
KNOWN = Efficiency(weights=1.3, launch=2.0, compute=1.7, kv=1.2, prefill=1.5)


@given(
    st.floats(1e-4, 0.05),
    st.floats(1e-7, 1e-3),
    st.floats(1e-10, 1e-6),
    st.integers(1, 8192),
)
def test_throughput_rises_with_the_batch_and_flattens(
    fixed: float, per_request: float, per_kv: float, context: int
) -> None:
    lw = DecodeLaw(fixed, per_request, per_kv)
    rates = [lw.tokens_per_second(2**k, context) for k in range(13)]
    assert all(b > a for a, b in itertools.pairwise(rates))
    gains = [b / a for a, b in itertools.pairwise(rates)]
    assert all(g2 <= g1 + 1e-12 for g1, g2 in itertools.pairwise(gains))
    ceiling = 1 / (per_request + per_kv * context)
    assert rates[-1] < ceiling


def test_a_step_is_the_three_terms_and_no_running_request_makes_no_token() -> None:
    lw = DecodeLaw(0.01, 0.001, 1e-6)
    assert lw.step_seconds(4, 1000) == pytest.approx(0.01 + 0.004 + 0.001)
    assert lw.tokens_per_second(4, 250) == pytest.approx(4 / 0.015)
    assert lw.tokens_per_second(0, 250) == 0.0


def test_the_prior_reads_the_weights_and_the_kv_once_a_step() -> None:
    d7 = Deployment(LLAMA2_7B, H100, 1, 1, 1)
    assert law(d7).fixed == pytest.approx(
        LLAMA2_7B.params / 3.35e12 + 32 * LAUNCH_SECONDS_PER_LAYER
    )
    assert law(d7).per_kv_token == pytest.approx(2 * 32 * 32 * 128 / 3.35e12)
    d70 = Deployment(LLAMA2_70B, A100, 4, 2, 2)
    assert law(d70).per_kv_token == pytest.approx(2 * 80 * 8 * 128 * 2 / 4 / 2.039e12)
    assert law(d70).per_request == pytest.approx(2 * LLAMA2_70B.params / 4 / 312e12)
    tp_floor = 80 * (LAUNCH_SECONDS_PER_LAYER + 2 * ALLREDUCE_SECONDS)
    assert law(d70).fixed == pytest.approx(LLAMA2_70B.params * 2 / 4 / 2.039e12 + tp_floor)


def test_the_llama_parameter_counts_are_the_published_ones() -> None:
    """Meta's counts: 6,738,415,616 and 68,976,648,192 (computed from the configs, norms in)."""
    assert LLAMA2_7B.params == 6_738_415_616
    assert LLAMA2_70B.params == 68_976_648_192


def test_a_static_run_is_its_prefill_then_its_decode_steps() -> None:
    d = Deployment(LLAMA2_70B, H100, 4, 1, 1)
    batch, prompt, output = 48, 300, 40
    lw = law(d, KNOWN)
    steps = sum(lw.step_seconds(batch, batch * (prompt + k)) for k in range(1, output))
    run = batch * prefill_seconds(d, prompt, KNOWN) + steps
    features = static_run_features(d, batch, prompt, output)
    assert features @ KNOWN.vector() == pytest.approx(run)


def test_a_lone_serving_request_waits_on_no_one_elses_prefill() -> None:
    d = Deployment(LLAMA2_7B, H100, 1, 1, 1)
    features = serving_itl_features(d, 1, 5000, 500)
    assert features[-1] == 0
    assert features @ KNOWN.vector() == pytest.approx(law(d, KNOWN).step_seconds(1, 5000 + 250))


def _synthetic(eff: Efficiency) -> list[Observation]:
    return [Observation(f.name, f.features(), float(f.features() @ eff.vector())) for f in usable()]


def test_the_fit_recovers_known_efficiencies_from_synthetic_rows() -> None:
    exact = fit(_synthetic(KNOWN), ridge=0.0)
    assert exact.vector() == pytest.approx(KNOWN.vector(), rel=1e-6)
    pulled = fit(_synthetic(KNOWN))
    strong = [0, 2, 3, 4]  # the launch floor is a small share of every row: the pull shows there
    assert pulled.vector()[strong] == pytest.approx(KNOWN.vector()[strong], rel=0.05)
    for o in _synthetic(KNOWN):
        assert o.features @ pulled.vector() == pytest.approx(o.seconds, rel=0.05)


def test_the_fit_holds_an_efficiency_at_zero_rather_than_below() -> None:
    """Times shorter than the launch floor alone would explain (a launch efficiency of -1)."""
    obs = [
        Observation(o.name, o.features, o.seconds - 2.0 * o.features[1])
        for o in _synthetic(Efficiency(launch=1.0))
    ]
    held = fit(obs, ridge=0.0)
    assert held.launch == 0.0
    assert min(held.vector()) >= 0.0


def test_a_held_out_figure_never_enters_its_own_fit() -> None:
    family = {f.name: f.source.family for f in usable()}
    held = leave_family_out(usable())
    assert [p.figure.name for p in held] == [f.name for f in usable()]
    for p in held:
        assert p.figure.name not in p.fitted_on
        assert p.fitted_on == {n for n, fam in family.items() if fam != p.figure.source.family}


def test_a_held_out_prediction_does_not_move_with_its_own_figure() -> None:
    figures = list(usable())
    i = next(i for i, f in enumerate(figures) if f.source.family == "NIM")
    changed = [*figures[:i], dataclasses.replace(figures[i], value=figures[i].value * 10)]
    changed += figures[i + 1 :]
    before = leave_family_out(figures)[i].seconds
    assert leave_family_out(changed)[i].seconds == before
    assert in_fit(changed)[i].seconds != in_fit(figures)[i].seconds


def test_the_cross_gpu_split_fits_on_a100_and_predicts_only_h100() -> None:
    names = {f.name: f.deployment.gpu for f in usable()}
    split = a100_to_h100(usable())
    assert split
    assert all(p.figure.deployment.gpu == H100 for p in split)
    assert all(names[n] == A100 for n in split[0].fitted_on)


def test_a_batch_the_kv_cache_cannot_hold_is_left_out() -> None:
    """LMDeploy's 13B batch 64 at 128/2048 waited 7.8 s on average for its first token; NIM's
    70B at 100 concurrent requests waited 8.0 s (its 50 waited 0.83 s)."""
    by_name = {
        (f.source.family, f.deployment.model.name, f.batch, f.prompt, f.output): f for f in FIGURES
    }
    assert not by_name[("LMDeploy", "Llama-2-13B", 64, 128, 2048)].usable
    assert not by_name[("NIM", "Llama-3.3-70B", 100, 5000, 500)].usable
    assert by_name[("NIM", "Llama-3.3-70B", 50, 5000, 500)].usable
    assert len(usable()) < len(FIGURES)


def test_a_per_gpu_figure_counts_every_gpu_of_the_run() -> None:
    f = next(f for f in usable() if f.metric is Metric.TOKENS_PER_SECOND_PER_GPU)
    f = dataclasses.replace(f, deployment=dataclasses.replace(f.deployment, tp=4))
    assert f.seconds == pytest.approx(f.batch * f.output / (f.value * 4))


def test_the_ledger_rows_count_each_figure_once_by_its_held_out_ratio() -> None:
    rows = compared_rows()
    primary = [r for r in rows if not r.derived_from]
    assert len(primary) == len(usable())
    assert {r.basis for r in primary} == {Basis.HELD_OUT}
    held = counts(leave_family_out(usable()))
    t = next(t for t in tally(rows) if t.basis is Basis.HELD_OUT)
    assert (t.figures, t.met) == (held.figures, held.met)
    assert next(t for t in tally(rows) if t.basis is Basis.FITTED).figures == 0


def _printed(text: str, label: str) -> tuple[int, ...]:
    line = next(x for x in text.splitlines() if x.startswith(label))
    return tuple(int(n) for n in re.findall(r"(\d+) (?:figures|within)", line))


@pytest.mark.parametrize(
    ("label", "predictions"),
    [
        ("held out (leave one source family out)", leave_family_out),
        ("held out (fit on A100, predict H100)", a100_to_h100),
        ("predicted (prior, no fit)", prior),
        ("fitted here", in_fit),
    ],
)
def test_the_printed_counts_are_the_computed_ones(label, predictions) -> None:
    c = counts(predictions(usable()))
    assert _printed(report(), label) == (c.figures, *c.met)


def test_each_printed_held_out_ratio_is_its_prediction() -> None:
    text = report()
    for p in leave_family_out(usable()):
        f = p.figure
        row = f"{f.deployment.label:36s}{f.batch:6d}{f'{f.prompt}/{f.output}':>10s}{f.value:11g}"
        line = next(x for x in text.splitlines() if row in x)
        assert float(line[len("TRT0.6.1 ") + len(row) :].split()[1]) == round(p.ratio, 2)


def test_the_doc_quotes_the_command_exactly() -> None:
    doc = (ROOT / "docs" / "decode-law.md").read_text()
    blocks = re.findall(r"```text\n(.*?)```", doc, flags=re.S)
    assert report() + "\n" in blocks


def test_every_figure_names_its_source_and_a_positive_value() -> None:
    for f in FIGURES:
        assert f.source.url.startswith("https://")
        assert f.value > 0 and f.batch >= 1 and f.output > 1
        assert math.isfinite(f.seconds)
