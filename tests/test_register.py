"""The register of predictions (docs/predictions.md; issue 51, item 6): its rows parse, each
cluster file predicts today what was registered, and its headline and verdicts are what
its rows give."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.timing.basis import within
from sim.timing.register import (
    REGISTER,
    ROOT,
    Registered,
    hit_rate,
    moved_since,
    predict_today,
    read_register,
)

ROWS = read_register()


def test_the_register_holds_at_least_six_predictions_each_with_its_file_and_commit() -> None:
    assert len(ROWS) >= 6 and len({r.key for r in ROWS}) == len(ROWS)
    for r in ROWS:
        assert (ROOT / r.cluster).is_file(), r.key
        assert re.fullmatch(r"[0-9a-f]{7,40}", r.commit), r.key
        assert r.published[0] <= r.published[1] and r.predicted > 0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_a_registered_prediction_is_what_its_cluster_file_predicts_today(row: Registered):
    today = predict_today(row)
    assert not moved_since(row, today), (
        f"{row.key}: the model now predicts {today:.3f} s for {row.cluster}, the register "
        f"expects {row.expected_today:.3f} s; keep the registered value and add a "
        f"'| {row.key} moved | commit | {today:.3f} s | why |' row"
    )


def test_a_moved_row_keeps_its_registered_value_and_counts_by_it(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "| R1 | f | s | `c.toml` | 2 s | 1.0 s | `abc1234` | 0.50 | MISS |\n"
        "| R1 moved | `def5678` | 1.9 s | a term refitted |\n"
    )
    (row,) = read_register(page)
    assert (row.predicted, row.expected_today, row.ratio) == (1.0, 1.9, 0.5)
    assert row.moved == (("def5678", 1.9),)
    assert not moved_since(row, 1.9) and moved_since(row, 1.0)


def test_each_rows_ratio_and_verdict_are_its_figures() -> None:
    text = REGISTER.read_text()
    for r in ROWS:
        line = next(x for x in text.splitlines() if x.startswith(f"| {r.key} |"))
        ratio, verdict = [c.strip() for c in line.strip().strip("|").split("|")][7:9]
        assert ratio == f"{r.ratio:.2f}", r.key
        assert (verdict == "meets 1.5x") == within(r.ratio, 1.5), r.key


def test_the_headline_is_the_rows_hit_rate() -> None:
    ratios = [r.ratio for r in ROWS]
    met15 = sum(within(x, 1.5) for x in ratios)
    met125 = sum(within(x, 1.25) for x in ratios)
    headline = (
        f"**Hit rate, weight updates ({ROWS[0].key}-{ROWS[-1].key}): {met15} of {len(ROWS)} "
        f"within 1.5x, {met125} within 1.25x (ratios {min(ratios):.2f}-{max(ratios):.2f}).**"
    )
    assert headline in REGISTER.read_text()
    assert f"{met15} within 1.5x" in hit_rate(ROWS)


def test_a_row_that_is_not_a_time_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "p.md"
    bad.write_text("| R1 | f | s | `c.toml` | about 3 s | 1.0 s | `abc1234` | 1 | x |\n")
    with pytest.raises(ValueError, match="R1: 'about 3 s'"):
        read_register(bad)


def test_the_register_flag_goes_alone() -> None:
    from sim.cli.predict import main

    with pytest.raises(SystemExit) as stop:
        main(["--register", "--anchors"])
    assert stop.value.code == 2


def test_the_register_as_json_gives_every_row_and_the_hit_rate(capsys) -> None:
    from sim.cli.predict import main

    assert main(["--register", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in data["rows"]] == [r.key for r in ROWS]
    assert data["within"]["1.5"] == sum(within(r.ratio, 1.5) for r in ROWS)
    assert not any(r["moved_today"] for r in data["rows"])
