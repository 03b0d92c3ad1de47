"""The placement oracle: it holds any world's reported placement to the documented order,
re-derived from the addresses (so a mistake in miles_core.placement is caught, not
repeated), and the planted placement bugs fail it in the simulator's runs."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_core.events import PlacementMade
from miles_core.oracles.placement import judge_placement
from miles_core.placement import Bundle, LayoutConfig, compute_layout, place
from miles_core.scenario.library import SCENARIOS
from miles_core.scenario.world import NODE_ADDRESSES, TimeModel, WorldShape
from sim.run import run_scenario
from sim.search.plants import planted
from sim.world.placement import node_names


def _made(**changes: object) -> PlacementMade:
    good = PlacementMade(
        t=0.0,
        nodes=("10.0.0.9", "10.0.0.9", "10.0.0.10", "10.0.0.10"),
        sort_as=("10.0.0.9", "10.0.0.9", "10.0.0.10", "10.0.0.10"),
        gpus=(0, 1, 0, 1),
        cells=((0,), (1,)),
        engines=((2, 3),),
        train_fraction=0.4,
        engine_fraction=0.2,
    )
    return dataclasses.replace(good, **changes)


def test_a_placement_in_the_documented_order_passes() -> None:
    assert judge_placement(_made()) is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"nodes": ("a", "b", "a", "b"), "sort_as": ("a", "b", "a", "b")}, "interleaved"),
        (  # text order: 10.0.0.10 before 10.0.0.9
            {
                "nodes": ("10.0.0.10", "10.0.0.10", "10.0.0.9", "10.0.0.9"),
                "sort_as": ("10.0.0.10", "10.0.0.10", "10.0.0.9", "10.0.0.9"),
            },
            "comes after",
        ),
        (  # an unresolved name before an address
            {
                "nodes": ("n", "n", "fd00::1", "fd00::1"),
                "sort_as": ("n", "n", "fd00::1", "fd00::1"),
            },
            "comes after",
        ),
        ({"gpus": (1, 0, 0, 1)}, "GPU ids go [1, 0]"),
        ({"engines": ((3, 2),)}, "not a contiguous run"),
        ({"cells": ((0,), (0,))}, "given to cell 0 and to cell 1"),
        ({"train_fraction": 0.9, "engine_fraction": 0.2, "engines": ((0, 1),)}, "carries 1.1"),
    ],
)
def test_each_broken_rule_is_named(changes: dict[str, object], words: str) -> None:
    problem = judge_placement(_made(**changes))
    assert problem is not None and words in problem


@given(
    st.sampled_from(NODE_ADDRESSES),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from([1, 2, 8]),
    st.integers(0, 2**32),
)
def test_whatever_order_ray_hands_bundles_out_the_placement_passes(
    style: str, cells: int, engines: int, per_node: int, seed: int
) -> None:
    rng = random.Random(seed)
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=cells,
            rollout_num_gpus=engines,
            rollout_num_gpus_per_engine=1,
            indep_dp=True,
            gpus_per_cell=1,
        )
    )
    nodes = node_names(-(-layout.total_gpus // per_node), style, rng)
    bundles = [Bundle(i, nodes[i // per_node], i % per_node) for i in range(layout.total_gpus)]
    rng.shuffle(bundles)
    placement = place(layout, bundles)
    made = _made(
        nodes=tuple(b.node for b in placement.bundles),
        sort_as=placement.sort_as,
        gpus=tuple(b.gpu_id for b in placement.bundles),
        cells=tuple(tuple(s.positions()) for s in layout.cells),
        engines=tuple(tuple(s.positions()) for s in layout.rollout_engines),
    )
    assert judge_placement(made) is None


@pytest.mark.parametrize(
    ("plant", "per_node"), [("placement_sorted_as_text", 1), ("placement_gpu_major", 2)]
)
def test_a_planted_placement_bug_fails_the_oracle_in_a_run(plant: str, per_node: int) -> None:
    world = WorldShape(num_cells=3, num_engines=3, gpus_per_node=per_node)
    scenario = dataclasses.replace(
        SCENARIOS["no_failure"], world=world, timing=TimeModel(node_addresses="ipv6")
    )
    caught = 0
    for seed in range(12):
        assert run_scenario(scenario, seed).verdicts["placement"] is None
        with planted(plant):
            caught += run_scenario(scenario, seed).verdicts["placement"] is not None
    assert caught > 0
