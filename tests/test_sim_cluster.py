"""The simulated cluster's placement and link model."""

from __future__ import annotations

import dataclasses

from miles_core.events import UpdateBegan, VersionPublished
from miles_core.scenario import PRESETS, SCENARIOS, TimeModel
from sim.run import run_scenario
from sim.world.cluster import SimCluster
from sim.world.runtime import SimRuntime


def test_cells_and_engines_are_placed_by_miles_core_whatever_order_ray_gives() -> None:
    config = PRESETS["production-30b-moe"].world
    placements = [SimCluster(SimRuntime(seed), config).placement for seed in range(3)]
    # each seed names its nodes and shuffles Ray's order its own way; the ordering undoes the
    # shuffle: node by node (in order of first use), GPU ids ascending, whatever the names
    shapes = set()
    for p in placements:
        first_use = list(dict.fromkeys(b.node for b in p.bundles))
        shapes.add(tuple((first_use.index(b.node), b.gpu_id) for b in p.bundles))
    assert len(shapes) == 1
    (shape,) = shapes
    assert list(shape) == sorted(shape)
    cluster = SimCluster(SimRuntime(0), config)
    assert all(len(nodes) == 1 for nodes in cluster.cell_nodes)  # a cell of 8 on one node
    assert len({next(iter(n)) for n in cluster.cell_nodes}) == 8
    assert all(len(nodes) == 1 for nodes in cluster.engine_nodes.values())  # TP=4 not split
    assert not set().union(*cluster.cell_nodes) & set().union(*cluster.engine_nodes.values())


def _update_seconds(gpus_per_node: int) -> float:
    base = SCENARIOS["no_failure"]
    scenario = dataclasses.replace(
        base, world=dataclasses.replace(base.world, gpus_per_node=gpus_per_node)
    )
    history = run_scenario(scenario, 0).history
    begun = next(e for e in history if isinstance(e, UpdateBegan))
    done = next(e for e in history if isinstance(e, VersionPublished))
    return done.t - begun.t


def test_weights_cross_nodes_slower_than_within_one() -> None:
    c = TimeModel()
    bucket = SCENARIOS["no_failure"].loop.update_weight_buffer_size  # 4 full buckets
    remote = c.link_latency_seconds + bucket / c.link_bytes_per_second
    local = c.link_latency_seconds + bucket / c.nvlink_bytes_per_second
    ratio = _update_seconds(gpus_per_node=1) / _update_seconds(gpus_per_node=8)
    assert abs(ratio - remote / local) < 0.01 * remote / local
