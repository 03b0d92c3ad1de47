"""Where a simulated cluster's GPUs sit: bundles handed out as Ray would (in a seeded random
order, on nodes named in the scenario's style), then ordered and laid out by
miles_core.placement like miles' disaggregated mode with independent-DP cells.
"""

from __future__ import annotations

import random

from miles_core.placement import Bundle, LayoutConfig, Placement, compute_layout, place
from miles_core.scenario import WorldShape


def place_world(world: WorldShape, rng: random.Random, style: str = "ipv4") -> Placement:
    """The cluster's GPUs as Ray would hand them out, placed by miles_core.placement."""
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=world.num_cells * world.gpus_per_cell,
            rollout_num_gpus=world.num_engines * world.gpus_per_engine,
            rollout_num_gpus_per_engine=world.gpus_per_engine,
            indep_dp=True,
            gpus_per_cell=world.gpus_per_cell,
        )
    )
    per_node = world.gpus_per_node
    nodes = node_names(-(-layout.total_gpus // per_node), style, rng)
    bundles = [
        Bundle(index=i, node=nodes[i // per_node], gpu_id=i % per_node)
        for i in range(layout.total_gpus)
    ]
    rng.shuffle(bundles)  # Ray's bundle order carries no meaning; the ordering restores one
    return place(layout, bundles)


def node_names(count: int, style: str, rng: random.Random) -> list[str]:
    """``count`` distinct node names drawn in ``style`` (TimeModel.node_addresses), random so
    that their text order and their numeric order differ (10.2.x.x before 10.10.x.x)."""
    names: list[str] = []
    while len(names) < count:
        way = style if style != "mixed" else ("ipv4", "ipv6", "hostnames")[len(names) % 3]
        if way == "ipv4":
            name = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        elif way == "ipv6":
            name = f"fd00::{rng.randrange(1, 2 ** rng.choice([4, 8, 12, 16])):x}"
        else:
            name = f"node-{rng.randrange(1, 1000)}"
        if name not in names:
            names.append(name)
    return names
