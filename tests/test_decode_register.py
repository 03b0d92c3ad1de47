"""The register's decode rows (docs/predictions.md, "Decode throughput";
sim/timing/decode_register.py): they parse, each setup is the one the register names, the law
predicts today what was registered, the headline and printed hit rates are the rows', and no
registered figure's setup is one the law was fitted to."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.timing.basis import within
from sim.timing.decode_figures import FIGURES, H100, usable
from sim.timing.decode_register import (
    H200,
    LLAMA3_70B,
    LLAMA31_8B,
    MISTRAL_7B,
    TRANSCRIBED,
    Excluded,
    Figure,
    efficiency,
    excluded,
    predict,
    registered,
)
from sim.timing.decode_report import in_fit
from sim.timing.register import (
    REGISTER,
    DecodeRow,
    decode_moved_since,
    decode_today,
    headline,
    hit_rate,
    read_decode_register,
    read_register,
)

ROWS = read_decode_register()
FIGURES_NOW = registered()


def _cells(key: str) -> list[str]:
    line = next(x for x in REGISTER.read_text().splitlines() if x.startswith(f"| {key} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_decode_rows_parse_one_per_registered_setup_in_order() -> None:
    assert len(ROWS) >= 12
    assert [r.key for r in ROWS] == [f"D{i}" for i in range(1, len(ROWS) + 1)]
    assert [r.key for r in ROWS] == list(FIGURES_NOW)
    for r in ROWS:
        f = FIGURES_NOW[r.key]
        assert r.setup == f.label, r.key
        assert r.source == f.source.key, r.key
        assert (r.published, r.unit) == (f.value, f.unit.value), r.key
        assert r.commit == "PENDING" or re.fullmatch(r"[0-9a-f]{7,40}", r.commit), r.key


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_a_registered_decode_prediction_is_what_the_law_gives_today(row: DecodeRow) -> None:
    today = decode_today(row)
    assert not decode_moved_since(row, today), (
        f"{row.key}: the decode law now predicts {today:.1f} {row.unit} for {row.setup}, the "
        f"register expects {row.expected_today:.1f}; keep the registered value and add a "
        f"'| {row.key} moved | commit | {today:,.1f} {row.unit} | why |' row"
    )


def test_a_moved_decode_row_keeps_its_registered_value_and_counts_by_it(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "| D1 | t | s | `x` | 1,000 tok/s | 1,500.0 tok/s | PENDING | 1.50 | meets 1.5x |\n"
        "| D1 moved | `def5678` | 1,100.0 tok/s | a term added |\n"
    )
    (row,) = read_decode_register(page)
    assert (row.published, row.predicted, row.expected_today, row.ratio) == (1000, 1500, 1100, 1.5)
    assert row.moved == (("def5678", 1100.0),)
    assert not decode_moved_since(row, 1100.0) and decode_moved_since(row, 1500.0)


def test_a_decode_row_in_no_unit_or_two_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "p.md"
    bad.write_text("| D1 | t | s | `x` | about 3 tok/s | 3.0 tok/s | PENDING | 1 | x |\n")
    with pytest.raises(ValueError, match="D1: 'about 3 tok/s'"):
        read_decode_register(bad)
    bad.write_text("| D1 | t | s | `x` | 3 tok/s | 3.0 ms | PENDING | 1 | x |\n")
    with pytest.raises(ValueError, match="D1: predicted in ms, published in tok/s"):
        read_decode_register(bad)


def test_each_decode_rows_ratio_and_verdict_are_its_figures() -> None:
    for r in ROWS:
        ratio, verdict = _cells(r.key)[7:9]
        assert ratio == f"{r.ratio:.2f}", r.key
        expected = (
            "meets 1.25x"
            if within(r.ratio, 1.25)
            else "meets 1.5x"
            if within(r.ratio, 1.5)
            else "MISS"
        )
        assert verdict == expected, r.key


def test_the_headline_gives_each_kind_and_the_total() -> None:
    updates, text = read_register(), REGISTER.read_text()
    ratios = [r.ratio for r in ROWS]
    decode = (
        f"**Hit rate, decode (D1-D{len(ROWS)}): {sum(within(x, 1.5) for x in ratios)} of "
        f"{len(ROWS)} within 1.5x, {sum(within(x, 1.25) for x in ratios)} within 1.25x "
        f"(ratios {min(ratios):.2f}-{max(ratios):.2f}).**"
    )
    both = [r.ratio for r in updates] + ratios
    total = (
        f"**Hit rate, total: {sum(within(x, 1.5) for x in both)} of {len(both)} within 1.5x, "
        f"{sum(within(x, 1.25) for x in both)} within 1.25x.**"
    )
    assert decode in text and total in text
    assert headline(updates, ROWS)[1:] == [decode, total]
    assert all(line in text for line in headline(updates, ROWS))


def test_the_printed_and_json_hit_rates_are_the_rows(capsys) -> None:
    from sim.cli.predict import main

    updates = read_register()
    assert main(["--register"]) == 0
    printed = capsys.readouterr().out.splitlines()
    ratios = [r.ratio for r in ROWS]
    line = (
        f"decode (D rows): {len(ROWS)} registered predictions: "
        f"{sum(within(x, 1.25) for x in ratios)} within 1.25x, "
        f"{sum(within(x, 1.5) for x in ratios)} within 1.5x; "
        f"ratios {min(ratios):.2f}-{max(ratios):.2f}"
    )
    assert line in printed
    assert hit_rate([*updates, *ROWS], "total: ") in printed
    assert sum(x.startswith("D") and x.endswith("same") for x in printed) == len(ROWS)

    assert main(["--register", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["key"] for d in data["decode_rows"]] == [r.key for r in ROWS]
    assert data["decode_within"]["1.5"] == sum(within(x, 1.5) for x in ratios)
    assert data["total_registered"] == len(updates) + len(ROWS)
    assert not any(d["moved_today"] for d in data["decode_rows"])


def test_no_registered_setup_is_one_the_law_was_fitted_to() -> None:
    fitted = {(f.deployment, f.batch, f.prompt, f.output) for f in FIGURES}
    assert not fitted & {f.setup for f in FIGURES_NOW.values()}
    names = {f.name for f in FIGURES}
    assert not names & {f.label for f in FIGURES_NOW.values()}


def test_the_law_that_predicts_is_the_committed_fit_on_every_usable_figure() -> None:
    assert efficiency() == in_fit(usable())[0].efficiency


def test_the_rules_leave_out_what_the_register_says() -> None:
    reasons = [excluded(f) for f in TRANSCRIBED]
    assert len(TRANSCRIBED) == 78 and len(FIGURES_NOW) == 78 - 34
    assert {e: reasons.count(e) for e in Excluded} == {
        Excluded.PREFILL: 18,
        Excluded.IN_FIT: 14,
        Excluded.SUPERSEDED: 1,
        Excluded.KV: 1,
    }
    for f, reason in zip(TRANSCRIBED, reasons, strict=True):
        if f.output < f.prompt:
            assert reason is Excluded.PREFILL
        if reason is None:
            assert f.deployment.holds(f.batch, f.prompt + f.output)


def test_a_figure_of_a_setup_the_fit_holds_is_never_registered() -> None:
    fitted = usable()[0]
    twin = Figure(
        TRANSCRIBED[0].source,
        "t",
        fitted.deployment,
        fitted.batch,
        fitted.prompt,
        fitted.output,
        1.0,
        TRANSCRIBED[0].unit,
    )
    assert excluded(twin) is Excluded.IN_FIT


def test_the_added_gpu_and_models_are_their_sources() -> None:
    assert (H200.hbm_bytes_per_second, H200.memory_bytes / 2**30) == (4.8e12, 141)
    assert (H200.flops_16, H200.flops_8) == (H100.flops_16, H100.flops_8)
    assert MISTRAL_7B.params == 7_241_732_096
    assert LLAMA31_8B.params == 8_030_261_248
    assert LLAMA3_70B.params == 70_553_706_496
    assert (MISTRAL_7B.kv_group, LLAMA31_8B.kv_group, LLAMA3_70B.kv_group) == (4, 4, 8)


@pytest.mark.parametrize("figure", list(FIGURES_NOW.values())[::11], ids=lambda f: f.label)
def test_a_prediction_is_the_run_time_in_the_published_unit(figure: Figure) -> None:
    p = predict(figure)
    assert figure.value_of(figure.seconds) == pytest.approx(figure.value)
    assert p.value == pytest.approx(figure.value_of(p.seconds))
    assert p.ratio == pytest.approx(p.value / figure.value)
