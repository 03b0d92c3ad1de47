"""The real backends order bundles from what Ray reports, resolving hostnames (miles'
placement_group.sort_key uses gethostbyname). No Ray session: ``where`` and the node
addresses below are what ``placed_bundles`` reads from Ray, in the forms Ray registers
(NodeManagerAddress is an IPv4 or IPv6 literal, or a hostname with --node-ip-address)."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("ray", reason="the Ray backends need the cpu extra (see the README)")

from backends.common.session.ray_session import bundles_from_ray, dns_resolver
from miles_core.placement import LayoutConfig, compute_layout, dict_resolver, place

LAYOUT = compute_layout(
    LayoutConfig(
        actor_num_nodes=1,
        actor_num_gpus_per_node=2,
        rollout_num_gpus=2,
        rollout_num_gpus_per_engine=1,
        indep_dp=True,
        gpus_per_cell=1,
    )
)


def _nodes(placement) -> list[tuple[str, int]]:
    return [(b.node, b.gpu_id) for b in placement.bundles]


def test_hostnames_are_resolved_and_sort_among_addresses() -> None:
    # Ray handed the bundles out in this order; node ids map to registered addresses
    where = [("n-b", 1), ("n-a", 0), ("n-b", 0), ("n-a", 1)]
    addresses = {"n-a": "worker-2.cluster", "n-b": "10.0.0.9"}
    table = dict_resolver({"worker-2.cluster": "10.0.0.10"})
    placement = place(LAYOUT, bundles_from_ray(where, addresses), table)
    # 10.0.0.9 < 10.0.0.10 numerically, with the hostname in its address's place
    assert _nodes(placement) == [
        ("10.0.0.9", 0),
        ("10.0.0.9", 1),
        ("worker-2.cluster", 0),
        ("worker-2.cluster", 1),
    ]
    # the same bundles without a resolver: the hostname goes after every address
    unresolved = place(LAYOUT, bundles_from_ray(where, addresses))
    assert _nodes(unresolved)[0] == ("10.0.0.9", 0)
    # and with the resolver saying 10.0.0.1, the hostname's node comes first
    first = place(
        LAYOUT, bundles_from_ray(where, addresses), dict_resolver({"worker-2.cluster": "10.0.0.1"})
    )
    assert _nodes(first)[0] == ("worker-2.cluster", 0)


def test_ipv6_nodes_as_ray_registers_them() -> None:
    where = [("v6-b", 0), ("v4", 0), ("v6-a", 0), ("v6-a", 1)]
    addresses = {"v6-a": "[fd00::2]", "v6-b": "fd00::10", "v4": "192.168.0.7"}
    placement = place(LAYOUT, bundles_from_ray(where, addresses))
    assert _nodes(placement) == [
        ("192.168.0.7", 0),  # IPv4 first
        ("[fd00::2]", 0),  # then IPv6 numerically, bracketed or not
        ("[fd00::2]", 1),
        ("fd00::10", 0),
    ]


def test_a_node_ray_does_not_know_keeps_its_id() -> None:
    bundles = bundles_from_ray([("unknown-node", 3)], {})
    assert bundles[0].node == "unknown-node" and bundles[0].gpu_id == 3


def test_the_dns_resolver_resolves_like_gethostbyname_and_says_none_otherwise() -> None:
    assert dns_resolver("localhost") == socket.gethostbyname("localhost")
    assert dns_resolver("no-such-host.invalid") is None  # RFC 2606: never resolves
