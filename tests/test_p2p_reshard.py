"""p2p's per-target re-shard and a target rank's TP share (issue 51, item 4; the register's
"many-source p2p: the target share ignores the engine's TP").

miles' p2p sender (``update_weight_from_distributed/p2p.py`` ``UpdateWeightP2P.
_update_weight_implementation`` @31f1ca96) loads each bucket into one CPU replica per
engine rank it serves, in turn, and waits for a rank's writes before the next load; its
plan (``p2p_transfer_utils.py`` ``RemoteTransferPlan.plan_p2p``) decides how many ranks
that is. sim/world/update_cost.py charges ``reshard_seconds`` for every rank beyond the
first, and bounds a target rank's share by its TP shard as well as its EP shard.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from miles_core.scenario import PRESETS, TimeModel
from miles_core.transfer import TransferMode
from sim.timing.anchor_report import predict_anchor
from sim.timing.anchors import ANCHORS, FIT_GROUPS
from sim.timing.calibration import predict_update_seconds
from sim.world.update_cost import (
    Route,
    bucket_cost,
    reshard_seconds,
    targets_per_sender,
    wire_seconds,
)

GB = 10**9
GLM5_RDMA = "miles GLM-5 744B 16+16 RDMA P2P"
QWEN235_RDMA = "miles Qwen3-235B-A22B 8+8 RDMA P2P"


def _ranks_per_sender(senders: int, engines: int, gpus_per_engine: int) -> int:
    """The most engine ranks one sender serves under miles' plan, restated from its
    docstring: the targets (engine, rank) in order go one to each sender; each further
    target goes to the least-loaded sender already serving its rank, else round robin."""
    targets = [(e, r) for e in range(engines) for r in range(gpus_per_engine)]
    served: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for source, (_, rank) in zip(range(senders), targets, strict=False):
        served[source][rank] += 1
    turn = 0
    for _, rank in targets[senders:]:
        counts = [served[s][rank] for s in range(senders)]
        if max(counts) > 0:
            source = min((c, s) for s, c in enumerate(counts) if c > 0)[1]
        else:
            source, turn = turn % senders, turn + 1
        served[source][rank] += 1
    return max(sum(1 for c in served[s].values() if c) for s in range(senders))


@pytest.mark.parametrize("senders", [1, 2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("engines,gpus_per_engine", [(1, 8), (2, 4), (2, 32), (2, 64), (8, 32)])
def test_a_sender_serves_as_many_ranks_as_miles_plan_gives_it(
    senders: int, engines: int, gpus_per_engine: int
) -> None:
    t = TimeModel(gather_shares=2, many_source_p2p=True)
    route = Route(False, 2 * senders, engines, gpus_per_engine)  # 2 stages of `senders`
    expected = _ranks_per_sender(senders, engines, gpus_per_engine)
    assert targets_per_sender(t, route, many_source=True) == expected


def test_the_reshard_scales_with_the_further_ranks_and_the_stages_share() -> None:
    """(ranks per sender - 1) x the stage's share of the bucket / the rate: engines of TP
    4, 8, 16 from 4 senders a stage are 1, 2, 4 ranks each: 0, 1 and 3 re-shards."""
    t = TimeModel(reshard_bytes_per_second=1 * GB, gather_shares=2, many_source_p2p=True)
    seconds = [
        reshard_seconds(t, 800 * 10**6, Route(False, 8, 2, tp), many_source=True)
        for tp in (4, 8, 16)
    ]
    assert seconds == pytest.approx([0.0, 0.4, 1.2])  # 400 MB a stage at 1 GB/s
    one_source = reshard_seconds(t, 800 * 10**6, Route(False, 8, 2, 4), many_source=False)
    assert one_source == pytest.approx(1.2)  # one source serves every rank of an engine
    p2p = bucket_cost(t, 800 * 10**6, Route(False, 8, 2, 16), p2p=True)
    broadcast = bucket_cost(t, 800 * 10**6, Route(False, 8, 2, 16), p2p=False)
    assert p2p.prepare - broadcast.prepare == pytest.approx(1.2)  # a p2p sender's only


def test_a_target_ranks_share_is_its_tp_shard_as_well_as_its_ep_shard() -> None:
    """64 source NICs, one engine of 8 GPUs: the target rank's share bounds the wire, 1/8
    of the bucket whether the engine shards it by TP or EP (1: the whole bucket)."""
    t = TimeModel(link_latency_seconds=0.0, link_bytes_per_second=1 * GB)
    route = Route(False, 64, 1, 8)
    nbytes = 800 * 10**6
    for ep, tp, seconds in ((1, 1, 0.8), (1, 8, 0.1), (8, 1, 0.1), (2, 8, 0.1), (8, 4, 0.1)):
        shards = dataclasses.replace(t, engine_ep=ep, engine_tp=tp)
        assert wire_seconds(shards, nbytes, route, many_source=True) == pytest.approx(seconds)
    # one source (not many-source) sends each engine the whole bucket: no share applies
    tp8 = dataclasses.replace(t, engine_tp=8)
    assert wire_seconds(tp8, nbytes, route, many_source=False) == pytest.approx(0.8)


def test_both_terms_charge_nothing_at_their_defaults() -> None:
    """engine_tp 1 and reshard_bytes_per_second 0 are the old model to the bit (so no
    history hash moves), however many ranks a sender serves."""
    assert (TimeModel().engine_tp, TimeModel().reshard_bytes_per_second) == (1, 0.0)
    t = TimeModel(many_source_p2p=True, engine_ep=4, link_latency_seconds=0.0)
    route = Route(False, 8, 2, 64)  # 64 ranks for each of 8 senders
    assert reshard_seconds(t, 1 << 30, route, many_source=True) == 0.0
    cost = bucket_cost(t, 1 << 30, route, p2p=True)
    sent, taken = 2 * (1 << 30) / (8 * 10e9), (1 << 30) / (4 * 10e9)
    assert (cost.prepare, cost.wire) == (0.0, max(sent, taken))


def test_miles_published_layouts_give_glm5_four_ranks_a_sender_and_qwen235b_two() -> None:
    """From the doc's Train and Inference Config: senders a stage = trainer GPUs / PP; an
    engine's ranks = its GPUs. Only these two rows pay the term."""
    expected = {"glm-4.7-flash": 1, "qwen3-30b": 1, "glm-4.5-air": 1, "qwen3-235b": 2}
    expected |= {"glm-5": 4, "kimi-k2": 1}
    for prefix, ranks in expected.items():
        preset = PRESETS[f"miles-{prefix}" + _suffix(prefix)]
        w, t = preset.world, preset.timing
        route = Route(False, w.gpus_per_cell, w.num_engines, w.gpus_per_engine)
        assert targets_per_sender(t, route, t.many_source_p2p) == ranks, prefix


def _suffix(prefix: str) -> str:
    clusters = {
        "glm-4.7-flash": "-1+1",
        "qwen3-30b": "-a3b-2+2",
        "glm-4.5-air": "-4+4",
        "qwen3-235b": "-a22b-8+8",
        "glm-5": "-16+16",
        "kimi-k2": "-32+32",
    }
    return clusters[prefix] + "-rdma"


def test_the_simulator_charges_a_reshard_rate_on_glm5() -> None:
    """Replayed through SimTransport with a rate set: 3 further ranks x GLM-5's 186 GB a
    stage at that rate, on top of the update without the term."""
    preset = PRESETS["miles-glm-5-16+16-rdma"]
    rate = 270e9
    with_rate = dataclasses.replace(
        preset, timing=dataclasses.replace(preset.timing, reshard_bytes_per_second=rate)
    )
    with_term = predict_update_seconds(with_rate, 1 << 30, TransferMode.P2P)["seconds"]
    without = predict_update_seconds(preset, 1 << 30, TransferMode.P2P)["seconds"]
    stage = preset.world.param_bytes / preset.timing.gather_shares
    assert with_term - without == pytest.approx(3 * stage / rate, rel=1e-6)


def test_no_reshard_rate_is_charged_and_glm5_stays_a_miss() -> None:
    """The anchors charge no re-shard rate (only GLM-5's own row asks for one): GLM-5 is
    0.52 held out and 0.60 in the fit, Qwen3-235B 1.21 held out."""
    assert all(p.timing.reshard_bytes_per_second == 0 for p in PRESETS.values())
    assert not any(p.field == "reshard_bytes_per_second" for g in FIT_GROUPS.values() for p in g)
    glm5 = predict_anchor(next(a for a in ANCHORS if a.row == GLM5_RDMA))
    assert glm5.held_out == pytest.approx(0.52, abs=0.01)
    assert glm5.ratio == pytest.approx(0.60, abs=0.01)
    qwen = predict_anchor(next(a for a in ANCHORS if a.row == QWEN235_RDMA))
    assert qwen.held_out == pytest.approx(1.21, abs=0.01)
