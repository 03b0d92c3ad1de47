"""The planner's split search, the published configuration's landing, and the sensitivity
table (sim/timing/plan_split.py, plan_published.py, plan_landing.py, sensitivity.py,
sim/cli/plan.py --sensitivity), on plans small enough to run here in a second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from sim.timing.plan_file import load_plan, points
from sim.timing.plan_landing import landing, point_split_label, published_point
from sim.timing.planner import judge_here
from sim.timing.sensitivity import BASE, SensitivityRow, table_lines, variants

ROOT = Path(__file__).resolve().parent.parent
SPLITS = """
name = "splits"
steps = 4
[cluster]
gpus = 12
[model]
param_bytes = 1e9
gpus_per_cell = 2
gpus_per_engine = 4
train_seconds_per_sample = 0.2
[workload]
rollout_batch_size = 4
n_samples_per_prompt = 2
[search]
trainer_gpus = {step = 2}
mode = ["fully_async", "sync"]
[published]
trainer_gpus = 8
mode = "fully_async"
"""
TUNED = """
name = "tuned"
steps = 6
[cluster]
gpus = 8
[model]
param_bytes = 1e9
gpus_per_cell = 2
gpus_per_engine = 2
train_seconds_per_sample = 0.2
[workload]
rollout_batch_size = 4
n_samples_per_prompt = 4
response_tokens_mean = 64.0
response_tokens_sigma = 0.3
decode_seconds_per_token = 0.02
[search]
trainer_gpus = {step = 2}
[published]
trainer_gpus = 4
[sensitivity]
assumed = ["workload.decode_seconds_per_token"]
"""
"""Three splits (2:6, 4:4, 6:2) where the decode figure's x1.5 moves the best split."""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return str(path)


def test_the_split_search_expands_to_every_step_and_runs_the_splits_that_exist(
    tmp_path: Path,
) -> None:
    plan = load_plan(_write(tmp_path, SPLITS))
    assert plan.tables["search"]["trainer_gpus"] == [8, 2, 4, 6, 10]  # the published first
    pts = points(plan)
    ran = {
        p.settings["trainer_gpus"]: p for p in pts if p.scenario and p.settings["mode"] != "sync"
    }
    assert sorted(ran) == [4, 8]  # whole cells of 2 that leave whole engines of 4
    assert {t: point_split_label(p) for t, p in ran.items()} == {4: "4:8", 8: "8:4"}
    world = ran[8].scenario.world  # type: ignore[union-attr]
    assert (world.num_cells, world.num_engines) == (4, 1)
    skipped = [p for p in pts if p.settings["mode"] == "fully_async" and p.scenario is None]
    assert sorted(p.settings["trainer_gpus"] for p in skipped) == [2, 6, 10]
    assert all("not whole engines of 4" in p.why for p in skipped)
    (sync,) = [p for p in pts if p.scenario and p.settings["mode"] == "sync"]
    assert sync.settings["trainer_gpus"] == 8  # the sync point runs once, at the published split


def test_a_list_of_counts_and_bucket_sizes_are_searched(tmp_path: Path) -> None:
    text = SPLITS.replace("{step = 2}", "[4, 8]").replace(
        "[search]", "[search]\nupdate_weight_buffer_mib = [256, 1024]"
    )
    pts = [p for p in points(load_plan(_write(tmp_path, text))) if p.scenario]
    assert len(pts) == 2 * 2 + 2  # two splits x two buckets, and sync's one per bucket
    sizes = {p.scenario.loop.update_weight_buffer_size for p in pts}  # type: ignore[union-attr]
    assert sizes == {256 << 20, 1024 << 20}


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("{step = 3}", "[search].trainer_gpus"),  # 3, 6, 9: none is a split of 12
        ("{step = 0}", "[search].trainer_gpus.step"),
        ("{step = 12}", "[search].trainer_gpus.step"),
        ("{step = 2.5}", "[search].trainer_gpus.step"),
        ("{from = 8, to = 4, step = 2}", "[search].trainer_gpus.to"),
        ("{stride = 2}", "[search].trainer_gpus"),
        ("[4, 0]", "[search].trainer_gpus"),
        ("{step = 2}\nrollout_share = [0.5]", "[search]"),
    ],
)
def test_an_impossible_split_search_is_refused_naming_the_key(
    tmp_path: Path, edit: str, field: str
) -> None:
    text = SPLITS.replace("{step = 2}", edit)
    with pytest.raises(ConfigError) as caught:
        load_plan(_write(tmp_path, text))
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("trainer_gpus = 8\n", "trainer_gpus = 6\n"), "[published].trainer_gpus"),
        (('mode = "fully_async"', 'mode = "one_step_off"'), "[published].mode"),
        (('mode = "fully_async"', "layers = 3"), "[published]"),
        (("[published]", '[sensitivity]\nassumed = ["model.gpus_per_cell"]\n[published]'), "a"),
        (("[published]", '[sensitivity]\nassumed = ["model.layers"]\n[published]'), "a"),
        (("[published]", '[sensitivity]\nassumed = ["cluster.gpus"]\n[published]'), "a"),
        (("[published]", "[sensitivity]\nfactors = [1.0]\n[published]"), "f"),
        (("[published]", "[sensitivity]\nfactors = [-0.5]\n[published]"), "f"),
    ],
)
def test_a_bad_published_or_sensitivity_table_is_named(
    tmp_path: Path, edit: tuple[str, str], field: str
) -> None:
    field = {"a": "[sensitivity].assumed", "f": "[sensitivity].factors"}.get(field, field)
    with pytest.raises(ConfigError) as caught:
        load_plan(_write(tmp_path, SPLITS.replace(*edit)))
    assert caught.value.field == field


def test_a_published_table_that_names_several_points_is_refused(tmp_path: Path) -> None:
    text = SPLITS.replace("[search]", "[search]\nmax_weight_staleness = [1, 2]")
    plan = load_plan(_write(tmp_path, text))
    with pytest.raises(ConfigError, match="max_weight_staleness") as caught:
        published_point(plan, points(plan))
    assert caught.value.field == "[published]"


def test_the_published_points_landing_is_its_rank_front_and_gap(tmp_path: Path) -> None:
    plan = load_plan(_write(tmp_path, TUNED))
    results = judge_here(plan, points(plan))
    land = landing(plan, results)
    assert land is not None and land.label == "4:4 fully_async bound 1"
    ok = sorted((r for r in results if r.ok), key=lambda r: -r.throughput)
    mine = next(r for r in results if r.point.index == land.published)
    assert land.tokens_per_second == mine.throughput and land.on_front == mine.on_front
    assert land.rank == 1 + sum(r.throughput > mine.throughput for r in ok) and land.of == 3
    assert land.best == ok[0].point.index
    assert land.gap == pytest.approx(mine.throughput / ok[0].throughput - 1)
    assert land.best_split == point_split_label(ok[0].point) and land.split_of == 3


def test_the_sensitivity_table_moves_each_assumed_input_both_ways(tmp_path: Path) -> None:
    plan = load_plan(_write(tmp_path, TUNED))
    moved = variants(plan)
    assert [(v.name, v.factor) for v in moved] == [
        (BASE, 1.0),
        ("workload.decode_seconds_per_token", 0.5),
        ("workload.decode_seconds_per_token", 1.5),
    ]
    decode = [v.plan.tables["workload"]["decode_seconds_per_token"] for v in moved]
    assert decode == pytest.approx([0.02, 0.01, 0.03])
    assert plan.tables["workload"]["decode_seconds_per_token"] == 0.02  # the plan is not moved
    rows = [
        SensitivityRow(
            v.name, v.factor, v.value, landing(v.plan, judge_here(v.plan, points(v.plan)))
        )
        for v in moved
    ]
    best = [r.landing.best_split for r in rows if r.landing]
    assert best[0] == "6:2" and "4:4" in best[1:]  # slower decoding wants more engines
    again = landing(moved[2].plan, judge_here(moved[2].plan, points(moved[2].plan)))
    assert again == rows[2].landing  # the same seeds: the same table
    lines = table_lines(rows)
    assert len(lines) == 1 + 3 and sum("decode_seconds_per_token" in x for x in lines) == 2


def test_plan_sensitivity_end_to_end_prints_the_landing_and_the_table(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            *(sys.executable, "-m", "sim", "plan", _write(tmp_path, TUNED), "--sensitivity"),
            *("--workers", "2", "--json", "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(run.stdout)
    assert [r["input"] for r in data["sensitivity"]] == [BASE] + 2 * [
        "workload.decode_seconds_per_token"
    ]
    assert data["landing"]["label"] == "4:4 fully_async bound 1"
    (mine,) = [r for r in data["points"] if r["published"]]
    assert mine["split"] == "4:4" and mine["point"] == data["landing"]["published"]
    assert (tmp_path / "out" / "sensitivity.json").is_file()


def test_a_sensitivity_without_a_published_configuration_stops_before_running(
    tmp_path: Path,
) -> None:
    text = TUNED.replace("[published]\ntrainer_gpus = 4\n", "")
    run = subprocess.run(
        [sys.executable, "-m", "sim", "plan", _write(tmp_path, text), "--sensitivity"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 2 and "[published]" in run.stderr and "Ray" not in run.stderr


def test_verls_plan_searches_the_split_and_runs_64_64_where_predict_reads_it() -> None:
    """The 128-GPU verl plan offers every split in steps of 16; the first fully_async point at
    each bound (what sim predict --anchors runs) is still the published 64:64."""
    plan = load_plan(str(ROOT / "plans" / "verl-7b-128-h20.toml"))
    assert plan.tables["search"]["trainer_gpus"] == [64, 16, 32, 48, 80, 96, 112]
    pts = points(plan)
    pub = published_point(plan, pts)
    assert pub is not None and point_split_label(pub) == "64:64"
    for bound in (1, 2):
        first = next(
            p
            for p in pts
            if p.scenario
            and p.settings["mode"] == "fully_async"
            and p.settings["max_weight_staleness"] == bound
        )
        assert point_split_label(first) == "64:64"
    splits = {point_split_label(p) for p in pts if p.scenario}
    assert splits == {"colocated 128", *(f"{t}:{128 - t}" for t in range(16, 128, 16))}
