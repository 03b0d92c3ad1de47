"""The update path's cost model (sim/world/update_cost.py), its fit to the published rows
(sim/timing/anchors.py) and the table of predictions (sim/timing/anchor_report.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    BucketReceived,
    History,
    UpdateBegan,
    UpdateGroupConnected,
    UpdateGroupMade,
    VersionPublished,
)
from miles_core.scenario import PRESETS, SCENARIOS, Scenario, TimeModel
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, SYSTEM_MODES, SYSTEMS
from miles_core.transfer import TransferMode
from miles_core.update_connections import ConnectReason
from sim.run import run_scenario
from sim.timing.anchor_report import predict_all
from sim.timing.anchors import ANCHORS, FIT_GROUPS, fit_group, group_of, update_terms
from sim.timing.calibration import predict_update_seconds
from sim.world.update_cost import BucketCost, Route, bucket_cost, bucket_seconds, wire_seconds

MB = 10**6
REMOTE = Route(within_a_node=False, source_gpus=8, engines=4, gpus_per_engine=4)


def test_the_default_terms_are_the_old_model_a_latency_and_a_rate_per_link() -> None:
    """Every new term at its default charges nothing, to the bit, so no seed's history
    changes: a bucket costs latency + bytes / rate of its link, times a slow link's factor."""
    t = TimeModel()
    local = dataclasses.replace(REMOTE, within_a_node=True)
    for route, rate in ((REMOTE, t.link_bytes_per_second), (local, t.nvlink_bytes_per_second)):
        for index in (0, 3):
            for p2p in (False, True):
                old = (t.link_latency_seconds + 64 * MB / rate) * 2.5
                assert bucket_seconds(t, 64 * MB, route, p2p, index, 2.5) == old


def test_each_term_is_charged_on_its_side_and_split_as_its_source_says() -> None:
    t = TimeModel(
        gather_bytes_per_second=1e9,
        convert_bytes_per_second=2e9,
        quantize_bytes_per_second=1e9,
        load_bytes_per_second=4e9,
        bucket_fixed_seconds=0.01,
        gather_shares=2,
        link_latency_seconds=0.0,
    )
    cost = bucket_cost(t, 400 * MB, REMOTE, p2p=False)
    assert cost.prepare == pytest.approx(0.01 + 0.2 + 0.1)  # each PP stage gathers half
    assert cost.wire == pytest.approx(400 * MB / t.link_bytes_per_second)
    assert cost.land == pytest.approx(0.1 + 0.025)  # each of the engine's 4 GPUs a quarter


def test_many_source_p2p_is_bound_by_the_sources_nics_or_a_target_ranks_shard() -> None:
    """miles' RDMA path: every trainer GPU sends (source side: engines x bytes over the
    trainer's GPUs' NICs), each target rank takes 1 / engine_ep of the bucket."""
    t = TimeModel(link_latency_seconds=0.0, link_bytes_per_second=1e9, engine_ep=2)
    one_link = wire_seconds(t, 800 * MB, REMOTE, many_source=False)
    assert one_link == pytest.approx(0.8)
    # 4 engines x 800 MB over 8 source NICs = 0.4 s; a rank's shard 400 MB = 0.4 s
    assert wire_seconds(t, 800 * MB, REMOTE, many_source=True) == pytest.approx(0.4)
    few_sources = dataclasses.replace(REMOTE, source_gpus=2)  # 1.6 s on the source side
    assert wire_seconds(t, 800 * MB, few_sources, many_source=True) == pytest.approx(1.6)
    shards = dataclasses.replace(t, engine_ep=8)  # 0.1 s a rank, the sources 0.4 s
    assert wire_seconds(shards, 800 * MB, REMOTE, many_source=True) == pytest.approx(0.4)


def test_pipelined_buckets_cost_their_slowest_stage_and_the_first_fills_the_pipe() -> None:
    cost = BucketCost(prepare=1.0, wire=3.0, land=0.5)
    assert cost.seconds(pipelined=False, first=False) == 4.5
    assert cost.seconds(pipelined=True, first=False) == 3.0
    assert cost.seconds(pipelined=True, first=True) == 4.5
    # the update's fixed cost is its source's before bucket 0, not part of a bucket's send
    t = TimeModel(update_fixed_seconds=2.0)
    assert bucket_seconds(t, 64 * MB, REMOTE, False, 0) == bucket_seconds(
        t, 64 * MB, REMOTE, False, 1
    )


@pytest.mark.parametrize("name", sorted(ANCHOR_PRESETS))
def test_the_simulators_update_takes_what_the_terms_add_up_to(name: str) -> None:
    """The prediction is the simulator's clock (an update replayed through SimTransport),
    and the fit's terms are the same functions: the two agree on every anchor preset."""
    system = ANCHOR_PRESETS[name][1]
    mode = SYSTEM_MODES[system]
    replayed = predict_update_seconds(PRESETS[name], 1 << 30, mode)["seconds"]
    assert replayed == pytest.approx(sum(update_terms(PRESETS[name], system, 1 << 30).values()))


@pytest.mark.parametrize("group", sorted(FIT_GROUPS))
def test_the_systems_table_is_the_fit_of_the_published_rows(group: str) -> None:
    """The figures stated in SYSTEMS are what the fit gives (rounded): change a row or a
    term and this says which figure to restate."""
    figures = fit_group(group)
    for p in FIT_GROUPS[group]:
        for system in p.systems:
            stated = getattr(SYSTEMS[system], p.field)
            assert stated == pytest.approx(figures[p.name], rel=5e-3), (system, p.field)


def test_a_fit_without_a_row_keeps_fixed_costs_at_zero_or_more() -> None:
    """Left out, some rows let the free fit go negative: it is held at 0, the rest refitted."""
    for a in ANCHORS:
        group = group_of(a)
        if a.fitted and group is not None:
            figures = fit_group(group, leave_out=a.row)
            assert all(v >= 0 for v in figures.values()), a.row


def test_every_published_row_is_predicted_within_its_factor_or_names_the_term_that_is_off() -> None:
    predictions = predict_all()
    assert len(predictions) == len(ANCHORS)
    for p in predictions:
        assert (p.held_out is None) == (not next(a for a in ANCHORS if a.row == p.row).fitted)
        counted = p.ratio if p.held_out is None else p.held_out  # a fitted row: its held-out
        assert p.meets == (1 / 1.5 <= counted <= 1.5)
        assert p.meets or "would have to be" in p.off, p.row
    assert sum(p.meets for p in predictions) >= 22  # at this commit: all but GLM-5's two
    # and GLM-4.7-Flash's RDMA row (docs/timing.md says why)


def test_predict_names_what_is_missing_or_doubled() -> None:
    run = [sys.executable, "-m", "sim", "predict"]
    missing = subprocess.run(run, capture_output=True, text=True)
    assert missing.returncode == 2 and "preset" in missing.stderr and "--anchors" in missing.stderr
    both = subprocess.run([*run, "small", "--anchors"], capture_output=True, text=True)
    assert both.returncode == 2 and "not both" in both.stderr
    mode = subprocess.run(
        [*run, "miles-kimi-k2-32+32-rdma", "--json"], capture_output=True, text=True
    )
    assert json.loads(mode.stdout)["mode"] == "p2p"  # an anchor preset sends as its system


@pytest.mark.parametrize("field", ["many_source_p2p", "pipelined_buckets"])
def test_a_switch_of_the_update_path_takes_true_or_false_only(field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}.*true or false"):
        TimeModel(**{field: 1})


@pytest.mark.parametrize("field", ["gather_shares", "engine_ep"])
def test_a_count_of_the_update_path_takes_a_positive_integer(field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}.*integer >= 1"):
        TimeModel(**{field: 1.5})


def _made_afresh(scenario: Scenario, fixed: float, per_engine: float) -> History:
    timing = dataclasses.replace(
        scenario.timing, group_make_seconds=fixed, group_make_seconds_per_engine=per_engine
    )
    result = run_scenario(dataclasses.replace(scenario, timing=timing), 0)
    assert result.ok
    return result.history


def _update_spans(history: History) -> dict[int, float]:
    began = {e.update_id: e.t for e in history if isinstance(e, UpdateBegan)}
    return {
        e.update_id: e.t - began[e.update_id] for e in history if isinstance(e, VersionPublished)
    }


@pytest.mark.parametrize(("mode", "groups"), [(TransferMode.BROADCAST, 1), (TransferMode.P2P, 2)])
def test_a_group_made_afresh_costs_its_term_on_its_first_bucket_and_is_recorded(
    mode: TransferMode, groups: int
) -> None:
    """engine_restart: the first update and the one after engine-0's new process connect
    (miles' has_new_engines) make the updater's group, the others keep it. Each of those two
    takes exactly the term longer (broadcast: one group of both engines; p2p: a pair group
    per engine, made in turn) and records what it charged; at 0 nothing is recorded, so the
    histories made before the term are as they were."""
    scenario = dataclasses.replace(
        SCENARIOS["engine_restart"],
        loop=dataclasses.replace(SCENARIOS["engine_restart"].loop, transfer_mode=mode),
    )
    free, charged = _made_afresh(scenario, 0.0, 0.0), _made_afresh(scenario, 2.0, 0.5)
    assert not [e for e in free if isinstance(e, UpdateGroupMade)]
    connects = {e.update_id: e.reason for e in charged if isinstance(e, UpdateGroupConnected)}
    assert sorted(connects.values()) == [ConnectReason.FIRST, ConnectReason.NEW_ENGINES]
    made = [e for e in charged if isinstance(e, UpdateGroupMade)]
    per_group = 2.0 + 0.5 * (2 // groups)  # the fixed cost, and each engine in the group
    assert [(e.update_id, e.seconds) for e in made] == [
        (u, per_group) for u in sorted(connects) for _ in range(groups)
    ]
    renewed = {
        (engine, process)
        for e in made
        if connects[e.update_id] == ConnectReason.NEW_ENGINES
        for engine, process in zip(e.engines, e.incarnations, strict=True)
    }
    assert renewed == {("engine-0", 1), ("engine-1", 0)}  # engine-0's new process in it
    before, after = _update_spans(free), _update_spans(charged)
    assert before.keys() == after.keys() and len(before) > len(connects)
    for update, span in after.items():
        extra = groups * per_group if update in connects else 0.0
        assert span - before[update] == pytest.approx(extra, abs=1e-9), update
    # the bucket's own send does not include it
    sent = lambda h: [e.seconds for e in h if isinstance(e, BucketReceived)]  # noqa: E731
    assert sent(charged) == sent(free)


def test_a_broadcast_over_more_gpus_pays_its_hop_term_per_doubling_and_p2p_does_not() -> None:
    t = TimeModel(link_bytes_per_second=1e9, broadcast_hop_seconds=0.01)
    small, large = Route(False, 8, 1, 15), Route(False, 8, 16, 16)  # 16 and 257 members
    base = 1e9 / 1e9 + t.link_latency_seconds
    assert wire_seconds(t, 10**9, small, False, broadcast=True) == pytest.approx(base + 0.04)
    assert wire_seconds(t, 10**9, large, False, broadcast=True) == pytest.approx(
        base + 0.01 * math.log2(257)
    )
    assert wire_seconds(t, 10**9, large, False) == pytest.approx(base)  # p2p: one link each
    off = TimeModel(link_bytes_per_second=1e9)
    assert wire_seconds(off, 10**9, large, False, broadcast=True) == pytest.approx(base)
