"""Placement ordering of 10k bundles: IPv4, IPv6, resolved hostnames and unresolved names.

Timed: ``order_bundles`` with a ``dict_resolver``, on bundles in a shuffled order.
The input is 1,250 nodes of 8 GPUs: IPv4 literals, IPv6 literals (bare,
bracketed, IPv4-mapped, link-local with a scope id), hostnames the resolver
maps to IPv4 or IPv6 addresses, and hostnames it cannot resolve.
"""

from __future__ import annotations

import ipaddress
import random

from miles_core.placement import Bundle, dict_resolver, order_bundles

NODES, GPUS = 1250, 8


def make_cluster(seed: int = 0) -> tuple[list[Bundle], dict[str, str]]:
    rng = random.Random(seed)
    nodes: list[str] = []
    table: dict[str, str] = {}
    for n in range(NODES):
        kind = n % 8
        if kind in (0, 1):
            nodes.append(f"10.{n // 65536}.{(n // 256) % 256}.{n % 256}")
        elif kind == 2:
            nodes.append(f"2001:db8::{n:x}")
        elif kind == 3:
            nodes.append(f"[2001:db8:1::{n:x}]")
        elif kind == 4:
            nodes.append(f"::ffff:192.168.{(n // 256) % 256}.{n % 256}")
        elif kind == 5:
            nodes.append(f"fe80::{n % 7 + 1:x}%eth{n % 3}")
        elif kind == 6:
            name = f"gpu-node-{n:05d}.cluster.local"
            table[name] = f"172.16.{(n // 256) % 256}.{n % 256}" if n % 2 else f"fd00::{n:x}"
            nodes.append(name)
        else:
            nodes.append(f"unresolved-{rng.randrange(10**6):06d}-{n}")
    bundles = [
        Bundle(index=i * GPUS + g, node=node, gpu_id=g)
        for i, node in enumerate(nodes)
        for g in range(GPUS)
    ]
    rng.shuffle(bundles)
    return bundles, table


def expected_key(bundle: Bundle, table: dict[str, str]) -> tuple:
    """The documented order, computed independently of miles_core.placement."""
    text = table.get(bundle.node, bundle.node).strip("[]")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return (2, 0, bundle.node, bundle.gpu_id, bundle.node, bundle.index)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    family = 0 if address.version == 4 else 1
    scope = getattr(address, "scope_id", None) or ""
    return (family, int(address), scope, bundle.gpu_id, bundle.node, bundle.index)


def test_order_10k_bundles(benchmark) -> None:
    bundles, table = make_cluster()
    resolver = dict_resolver(table)
    assert len(bundles) == NODES * GPUS == 10_000

    ordered = benchmark(order_bundles, bundles, resolver)

    assert sorted(b.index for b in ordered) == list(range(len(bundles)))
    assert list(ordered) == sorted(bundles, key=lambda b: expected_key(b, table))
    # The order does not depend on the input order.
    assert order_bundles(list(reversed(bundles)), resolver) == ordered
    families = [expected_key(b, table)[0] for b in ordered]
    benchmark.extra_info.update(
        bundles=len(bundles),
        ipv4=families.count(0),
        ipv6=families.count(1),
        unresolved=families.count(2),
        resolved_hostnames=sum(b.node in table for b in ordered),
    )
