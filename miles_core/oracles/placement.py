"""placement: the world put ranks and engines on its GPUs in the documented order.

Ray hands out a placement group's bundles in no useful order; miles sorts them
(``sort_key`` in its placement code) so that the ranks that must share a node,
a cell's tensor-parallel group or an engine's GPUs, get neighbouring bundles.
What this oracle holds the world's own report (PlacementMade) to, re-derived
here from the addresses rather than taken from miles_core.placement, so that a
mistake there is caught, not repeated:

- a node's bundles are one run of positions (never interleaved with another
  node's: an interleaving splits a TP group or an engine across nodes);
- the runs go IPv4 nodes first, numerically, then IPv6 nodes, numerically (a
  scope id after the address), then names that did not resolve, by name;
- within a node, GPU ids ascend (two Ray nodes of one host share its address, and
  their GPU ids then come in pairs: the rule cannot tell them apart);
- a cell's or an engine's positions are contiguous, no two cells (or two
  engines) overlap, and no bundle carries more than its whole GPU (the train
  actor's and the engine coordinator's fractions together, when colocated).
"""

from __future__ import annotations

import ipaddress
import itertools

from miles_core.event_index import select
from miles_core.events import History, PlacementMade
from miles_core.oracles.base import Violation

NAME = "placement"


def order_key(address: str) -> tuple[int, int, str]:
    """IPv4 (an IPv4-mapped IPv6 counts as IPv4), then IPv6, then names."""
    text = address.strip().removeprefix("[").removesuffix("]")
    try:
        parsed = ipaddress.ip_address(text)
    except ValueError:
        return (2, 0, address)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    if isinstance(parsed, ipaddress.IPv4Address):
        return (0, int(parsed), "")
    return (1, int(parsed), parsed.scope_id or "")


def _runs(nodes: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(node, first position, end) for each run of equal nodes, in position order."""
    runs: list[tuple[str, int, int]] = []
    for position, node in enumerate(nodes):
        if runs and runs[-1][0] == node:
            runs[-1] = (node, runs[-1][1], position + 1)
        else:
            runs.append((node, position, position + 1))
    return runs


def judge_placement(e: PlacementMade) -> str | None:
    """What is wrong with one placement (None: nothing)."""
    runs = _runs(e.nodes)
    seen: dict[str, tuple[int, int]] = {}
    for node, first, end in runs:
        if node in seen:
            a, b = seen[node]
            return (
                f"node {node} holds positions {a}-{b - 1} and {first}-{end - 1}, with another "
                "node's between: its GPUs are interleaved, so a group that needs one node "
                "may be split across two"
            )
        seen[node] = (first, end)
        gpus = e.gpus[first:end]
        if list(gpus) != sorted(gpus):  # a tie: two Ray nodes behind one address (one host)
            return f"node {node}'s GPU ids go {list(gpus)} at positions {first}-{end - 1}"
    keys = [(order_key(e.sort_as[first]), node) for node, first, _ in runs]
    for (key_a, a), (key_b, b) in itertools.pairwise(keys):
        if key_b < key_a:
            return (
                f"node {b} (sorts as {e.sort_as[e.nodes.index(b)]}) comes after node {a} "
                f"(sorts as {e.sort_as[e.nodes.index(a)]}): nodes go IPv4 numerically, "
                "then IPv6, then unresolved names"
            )
    return _roles(e)


def _roles(e: PlacementMade) -> str | None:
    """Contiguous, non-overlapping spans; no bundle over its whole GPU."""
    load: dict[int, float] = {}
    for kind, spans, fraction in (
        ("cell", e.cells, e.train_fraction),
        ("engine", e.engines, e.engine_fraction),
    ):
        owner: dict[int, str] = {}  # a colocated layout shares bundles between the two kinds
        for index, positions in enumerate(spans):
            if list(positions) != list(range(positions[0], positions[0] + len(positions))):
                return f"{kind} {index} holds positions {list(positions)}, not a contiguous run"
            for p in positions:
                if p in owner:
                    return f"position {p} is given to {owner[p]} and to {kind} {index}"
                owner[p] = f"{kind} {index}"
            first = positions[0]  # an engine's coordinator sits on its first bundle
            for p in positions if kind == "cell" else (first,):
                load[p] = load.get(p, 0.0) + fraction
    over = [p for p, total in load.items() if total > 1.0]
    if over:
        return f"bundle at position {over[0]} carries {load[over[0]]:g} of its one GPU"
    return None


def placement(history: History) -> Violation | None:
    """Every placement the world reported keeps the documented order and layout."""
    for seq, e in select(history, PlacementMade):
        assert isinstance(e, PlacementMade)
        problem = judge_placement(e)
        if problem is not None:
            return Violation(NAME, problem, ((seq, e),))
    return None


__all__ = ["NAME", "judge_placement", "order_key", "placement"]
