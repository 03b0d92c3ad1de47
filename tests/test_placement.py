"""Placement: bundle order (IPv4, IPv6, hostnames) and the layout of roles over bundles."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.errors import ConfigError, LayoutError
from miles_core.placement import (
    ENGINE_ACTOR_GPU_FRACTION,
    TRAIN_ACTOR_GPU_FRACTION,
    Bundle,
    LayoutConfig,
    Mode,
    Span,
    bundle_sort_key,
    compute_layout,
    dict_resolver,
    order_bundles,
    place,
)


def nodes_in_order(bundles: tuple[Bundle, ...]) -> list[str]:
    """The node of each bundle, consecutive repeats collapsed."""
    out: list[str] = []
    for b in bundles:
        if not out or out[-1] != b.node:
            out.append(b.node)
    return out


def one_per_node(nodes: list[str]) -> list[Bundle]:
    return [Bundle(index=i, node=n, gpu_id=0) for i, n in enumerate(nodes)]


# --------------------------------------------------------------------------- order_bundles


def test_ipv4_sorts_numerically_not_by_string() -> None:
    nodes = ["10.0.0.10", "10.0.0.2", "9.255.255.255", "10.0.1.1", "10.0.0.9"]
    assert sorted(nodes)[:2] == ["10.0.0.10", "10.0.0.2"]  # what string order would do
    ordered = order_bundles(one_per_node(nodes))
    assert [b.node for b in ordered] == [
        "9.255.255.255",
        "10.0.0.2",
        "10.0.0.9",
        "10.0.0.10",
        "10.0.1.1",
    ]


def test_ipv4_before_ipv6_and_ipv6_numerically() -> None:
    # "::1" is numerically 1, far below any IPv4 address as an integer, but IPv4 comes first.
    nodes = ["fe80::1", "::1", "255.255.255.255", "2001:db8::10", "2001:db8::2", "0.0.0.1"]
    ordered = order_bundles(one_per_node(nodes))
    assert [b.node for b in ordered] == [
        "0.0.0.1",
        "255.255.255.255",
        "::1",
        "2001:db8::2",
        "2001:db8::10",
        "fe80::1",
    ]


def test_bracketed_ipv6_sorts_as_the_bare_address() -> None:
    bare = order_bundles(one_per_node(["2001:db8::3", "::1", "10.0.0.1", "2001:db8::a"]))
    bracketed = order_bundles(one_per_node(["[2001:db8::3]", "[::1]", "10.0.0.1", "[2001:db8::a]"]))
    strip = str.maketrans("", "", "[]")
    assert [b.node for b in bare] == [b.node.translate(strip) for b in bracketed]
    assert [b.node for b in bracketed] == ["10.0.0.1", "[::1]", "[2001:db8::3]", "[2001:db8::a]"]


def test_bracketed_and_bare_forms_are_one_node_ordered_by_gpu() -> None:
    bundles = [
        Bundle(0, "[::1]", 3),
        Bundle(1, "::1", 1),
        Bundle(2, "[::1]", 0),
        Bundle(3, "::1", 2),
        Bundle(4, "::2", 0),
    ]
    ordered = order_bundles(bundles)
    assert [b.gpu_id for b in ordered[:4]] == [0, 1, 2, 3]
    assert ordered[4].node == "::2"


def test_ipv4_mapped_ipv6_sorts_as_ipv4() -> None:
    nodes = ["::1", "::ffff:10.0.0.5", "10.0.0.7", "10.0.0.3"]
    ordered = order_bundles(one_per_node(nodes))
    # The mapped address is 10.0.0.5: between 10.0.0.3 and 10.0.0.7, and before any IPv6.
    assert [b.node for b in ordered] == ["10.0.0.3", "::ffff:10.0.0.5", "10.0.0.7", "::1"]


def test_resolved_hostnames_sort_as_their_address() -> None:
    resolver = dict_resolver({"gpu-a": "10.0.0.20", "gpu-b": "10.0.0.3", "gpu-c": "::5"})
    nodes = ["gpu-a", "10.0.0.10", "gpu-c", "gpu-b", "::1"]
    ordered = order_bundles(one_per_node(nodes), resolver)
    assert [b.node for b in ordered] == ["gpu-b", "10.0.0.10", "gpu-a", "::1", "gpu-c"]
    # Without the resolver they are unresolved names and go last, by name.
    assert [b.node for b in order_bundles(one_per_node(nodes))] == [
        "10.0.0.10",
        "::1",
        "gpu-a",
        "gpu-b",
        "gpu-c",
    ]


def test_unresolved_hostnames_go_after_every_address_by_name() -> None:
    resolver = dict_resolver({"known": "192.168.0.1"})
    nodes = ["zeta", "ffff::1", "alpha", "known", "1.2.3.4", "mid"]
    ordered = order_bundles(one_per_node(nodes), resolver)
    assert [b.node for b in ordered] == ["1.2.3.4", "known", "ffff::1", "alpha", "mid", "zeta"]


def test_within_a_node_bundles_go_by_gpu_id_numerically() -> None:
    gpus = [10, 2, 1, 0, 11, 3]
    bundles = [Bundle(i, "10.0.0.1", g) for i, g in enumerate(gpus)]
    bundles += [Bundle(100 + i, "10.0.0.2", g) for i, g in enumerate([9, 10, 2])]
    ordered = order_bundles(bundles)
    assert [(b.node, b.gpu_id) for b in ordered] == [
        ("10.0.0.1", 0),
        ("10.0.0.1", 1),
        ("10.0.0.1", 2),
        ("10.0.0.1", 3),
        ("10.0.0.1", 10),
        ("10.0.0.1", 11),
        ("10.0.0.2", 2),
        ("10.0.0.2", 9),
        ("10.0.0.2", 10),
    ]


def test_same_node_and_gpu_ties_break_by_bundle_index() -> None:
    bundles = [Bundle(7, "10.0.0.1", 0), Bundle(3, "10.0.0.1", 0), Bundle(5, "10.0.0.1", 0)]
    assert [b.index for b in order_bundles(bundles)] == [3, 5, 7]


def test_resolver_returning_a_non_ip_raises_naming_resolver() -> None:
    resolver = dict_resolver({"gpu-a": "not-an-ip"})
    with pytest.raises(ConfigError, match=r"^resolver: .*'gpu-a'.*'not-an-ip'") as info:
        order_bundles(one_per_node(["10.0.0.1", "gpu-a"]), resolver)
    assert info.value.field == "resolver"


def test_duplicate_bundle_index_raises() -> None:
    bundles = [Bundle(0, "10.0.0.1", 0), Bundle(1, "10.0.0.1", 1), Bundle(1, "10.0.0.2", 0)]
    with pytest.raises(ConfigError, match=r"^bundles: bundle index 1 appears twice"):
        order_bundles(bundles)


@pytest.mark.parametrize(("index", "gpu_id"), [(-1, 0), (0, -2)])
def test_negative_index_or_gpu_id_raises(index: int, gpu_id: int) -> None:
    with pytest.raises(ConfigError, match=rf"^bundles: bundle {index} .*negative.*\({gpu_id}\)"):
        order_bundles([Bundle(index, "10.0.0.1", gpu_id)])


# --------------------------------------------------------------------------- properties

_MAPPED_PREFIX = 0xFFFF  # ::ffff:0:0/96 holds the IPv4-mapped addresses


@st.composite
def node_forms(draw: st.DrawFn) -> tuple[tuple[int, int, str], list[str], dict[str, str]]:
    """A node identity (family, number, name) and some textual forms that all denote it.

    family 0 = IPv4, 1 = IPv6, 2 = an unresolved hostname (number 0). The forms
    include bracketed IPv6, IPv4-mapped IPv6 and hostnames the resolver table maps.
    """
    family = draw(st.sampled_from([0, 1, 2]))
    table: dict[str, str] = {}
    if family == 0:
        value = draw(st.integers(0, 2**32 - 1))
        text = str(ipaddress.IPv4Address(value))
        forms = [text, f"::ffff:{text}", f"[::ffff:{text}]"]
        identity = (0, value, "")
    elif family == 1:
        value = draw(st.integers(0, 2**128 - 1).filter(lambda v: v >> 32 != _MAPPED_PREFIX))
        text = str(ipaddress.IPv6Address(value))
        forms = [text, f"[{text}]", ipaddress.IPv6Address(value).exploded]
        identity = (1, value, "")
    else:
        name = draw(st.from_regex(r"u-[a-z0-9]{1,6}", fullmatch=True))
        return (2, 0, name), [name], table
    alias = f"h-{family}-{value:x}"
    table[alias] = draw(st.sampled_from(forms))
    return identity, [*forms, alias], table


@st.composite
def bundle_sets(draw: st.DrawFn, *, aliases: bool) -> tuple[list[Bundle], dict, dict]:
    """Bundles over a few distinct nodes; with aliases, one node may be written several ways.

    Returns the bundles, the resolver table and each node string's identity.
    """
    identities: dict[str, tuple[int, int, str]] = {}
    table: dict[str, str] = {}
    choices: list[str] = []
    seen: set[tuple[int, int, str]] = set()
    for identity, forms, aliases_table in draw(st.lists(node_forms(), min_size=1, max_size=6)):
        if identity in seen:
            continue
        seen.add(identity)
        table.update(aliases_table)
        used = forms if aliases else [draw(st.sampled_from(forms))]
        for form in used:
            identities[form] = identity
            choices.append(form)
    size = draw(st.integers(1, 24))
    indices = draw(st.lists(st.integers(0, 10_000), min_size=size, max_size=size, unique=True))
    bundles = [
        Bundle(index, draw(st.sampled_from(choices)), draw(st.integers(0, 16))) for index in indices
    ]
    return bundles, table, identities


@settings(max_examples=200, deadline=None)
@given(data=st.data(), case=bundle_sets(aliases=True))
def test_order_is_total_deterministic_and_independent_of_input_order(
    data: st.DataObject, case: tuple[list[Bundle], dict, dict]
) -> None:
    bundles, table, identities = case
    resolver = dict_resolver(table)
    ordered = order_bundles(bundles, resolver)
    # A permutation of the input.
    assert sorted(ordered, key=lambda b: b.index) == sorted(bundles, key=lambda b: b.index)
    # Total: distinct bundles never compare equal.
    keys = [bundle_sort_key(b, resolver) for b in bundles]
    assert len(set(keys)) == len(bundles)
    # Deterministic and independent of the input order.
    assert order_bundles(bundles, resolver) == ordered
    shuffled = data.draw(st.permutations(bundles))
    assert order_bundles(shuffled, resolver) == ordered
    assert order_bundles(reversed(bundles), resolver) == ordered
    # Node identities never go backwards; within a node, GPU ids never go backwards.
    seq = [(identities[b.node], b.gpu_id) for b in ordered]
    assert seq == sorted(seq)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), case=bundle_sets(aliases=False))
def test_distinct_nodes_are_contiguous_and_match_the_model(
    data: st.DataObject, case: tuple[list[Bundle], dict, dict]
) -> None:
    bundles, table, identities = case
    resolver = dict_resolver(table)
    ordered = order_bundles(data.draw(st.permutations(bundles)), resolver)
    # Model: IPv4 by number, then IPv6 by number, then unresolved by name; GPU id; index.
    expected = sorted(bundles, key=lambda b: (identities[b.node], b.gpu_id, b.index))
    assert ordered == tuple(expected)
    positions: dict[str, list[int]] = defaultdict(list)
    for position, b in enumerate(ordered):
        positions[b.node].append(position)
    for node, where in positions.items():
        assert where == list(range(where[0], where[0] + len(where))), node


# --------------------------------------------------------------------------- compute_layout


def test_disaggregated_places_actor_then_rollout_then_eval() -> None:
    config = LayoutConfig(
        actor_num_nodes=2,
        actor_num_gpus_per_node=4,
        rollout_num_gpus=4,
        rollout_num_gpus_per_engine=2,
        eval_num_gpus=2,
    )
    layout = compute_layout(config)
    assert layout.mode is Mode.DISAGGREGATED
    assert layout.actor == Span(0, 8)
    assert layout.rollout == Span(8, 4)
    assert layout.eval == Span(12, 2)
    assert layout.total_gpus == 8 + 4 + 2
    assert layout.critic is None
    assert layout.cells == (Span(0, 8),)
    assert layout.rollout_engines == (Span(8, 2), Span(10, 2))
    assert layout.eval_engines == (Span(12, 2),)


@pytest.mark.parametrize(
    ("actor_gpus", "rollout", "evaluation", "total"),
    [(8, 4, 2, 8), (4, 4, 2, 6), (8, 8, 0, 8), (2, 8, 4, 12)],
)
def test_colocate_shares_gpus_from_offset_zero(
    actor_gpus: int, rollout: int, evaluation: int, total: int
) -> None:
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=actor_gpus,
            rollout_num_gpus=rollout,
            eval_num_gpus=evaluation,
            rollout_num_gpus_per_engine=2,
            colocate=True,
        )
    )
    assert layout.mode is Mode.COLOCATE
    assert layout.actor == Span(0, actor_gpus)
    assert layout.rollout == Span(0, rollout)
    assert layout.eval == Span(rollout, evaluation)
    assert layout.total_gpus == total == max(actor_gpus, rollout + evaluation)
    assert layout.rollout_engines == tuple(Span(i, 2) for i in range(0, rollout, 2))


def test_debug_train_only_has_no_engines() -> None:
    layout = compute_layout(
        LayoutConfig(actor_num_nodes=2, actor_num_gpus_per_node=4, debug_train_only=True)
    )
    assert layout.mode is Mode.DEBUG_TRAIN_ONLY
    assert layout.actor == Span(0, 8)
    assert layout.rollout.count == 0 and layout.eval.count == 0
    assert layout.rollout_engines == () and layout.eval_engines == ()
    assert layout.total_gpus == 8


def test_debug_rollout_only_has_no_trainer() -> None:
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=2,
            actor_num_gpus_per_node=8,
            rollout_num_gpus=6,
            rollout_num_gpus_per_engine=3,
            eval_num_gpus=3,
            debug_rollout_only=True,
        )
    )
    assert layout.mode is Mode.DEBUG_ROLLOUT_ONLY
    assert layout.actor.count == 0 and layout.cells == ()
    assert layout.rollout == Span(0, 6)
    assert layout.eval == Span(6, 3)
    assert layout.rollout_engines == (Span(0, 3), Span(3, 3))
    assert layout.eval_engines == (Span(6, 3),)
    assert layout.total_gpus == 9


def test_debug_rollout_only_with_external_rollout_needs_no_gpus() -> None:
    layout = compute_layout(
        LayoutConfig(rollout_num_gpus=0, debug_rollout_only=True, rollout_external=True)
    )
    assert layout.total_gpus == 0
    assert layout.rollout.count == layout.eval.count == layout.actor.count == 0
    assert place(layout, []).bundles == ()


def test_external_rollout_leaves_the_rollout_span_empty() -> None:
    layout = compute_layout(
        LayoutConfig(actor_num_nodes=1, actor_num_gpus_per_node=4, rollout_external=True)
    )
    assert layout.mode is Mode.EXTERNAL_ROLLOUT
    assert layout.actor == Span(0, 4)
    assert layout.rollout.count == 0
    assert layout.rollout_engines == ()
    assert layout.total_gpus == 4


@pytest.mark.parametrize(
    "flags",
    [{}, {"colocate": True}, {"debug_train_only": True}, {"rollout_external": True}],
)
def test_critic_shares_the_actor_span(flags: dict[str, bool]) -> None:
    engines = 0 if flags.get("debug_train_only") or flags.get("rollout_external") else 4
    config = LayoutConfig(
        actor_num_nodes=2,
        actor_num_gpus_per_node=4,
        rollout_num_gpus=engines,
        use_critic=True,
        **flags,
    )
    layout = compute_layout(config)
    assert layout.critic == layout.actor == Span(0, 8)
    without = compute_layout(replace(config, use_critic=False))
    assert without.critic is None
    assert without.total_gpus == layout.total_gpus  # the critic adds no GPUs


def test_indep_dp_cells_are_sliced_from_the_actor_span() -> None:
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=2,
            actor_num_gpus_per_node=8,
            rollout_num_gpus=8,
            indep_dp=True,
            gpus_per_cell=4,
        )
    )
    assert layout.cells == (Span(0, 4), Span(4, 4), Span(8, 4), Span(12, 4))
    assert [layout.cell_of_rank(r) for r in range(16)] == [r // 4 for r in range(16)]
    for bad in (-1, 16):
        with pytest.raises(ConfigError, match=rf"^rank: rank {bad} is outside the actor span"):
            layout.cell_of_rank(bad)


def test_without_indep_dp_the_whole_actor_is_one_cell() -> None:
    layout = compute_layout(
        LayoutConfig(actor_num_nodes=1, actor_num_gpus_per_node=8, rollout_num_gpus=2)
    )
    assert layout.cells == (layout.actor,)
    assert {layout.cell_of_rank(r) for r in range(8)} == {0}


def test_engines_are_chunks_of_rollout_num_gpus_per_engine() -> None:
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=4,
            rollout_num_gpus=12,
            rollout_num_gpus_per_engine=4,
            eval_num_gpus=8,
        )
    )
    assert layout.rollout_engines == (Span(4, 4), Span(8, 4), Span(12, 4))
    assert layout.eval_engines == (Span(16, 4), Span(20, 4))
    covered = [p for e in layout.rollout_engines for p in e.positions()]
    assert covered == list(layout.rollout.positions())


def test_gpu_fractions() -> None:
    layout = compute_layout(LayoutConfig(rollout_num_gpus=1))
    assert TRAIN_ACTOR_GPU_FRACTION == 0.4
    assert ENGINE_ACTOR_GPU_FRACTION == 0.2
    assert layout.train_actor_gpu_fraction == 0.4
    assert layout.engine_actor_gpu_fraction == 0.2


# --------------------------------------------------------------------------- invalid layouts


def test_actor_gpus_not_divisible_by_cell_size() -> None:
    config = LayoutConfig(
        actor_num_nodes=3,
        actor_num_gpus_per_node=4,
        rollout_num_gpus=2,
        indep_dp=True,
        gpus_per_cell=5,
    )
    with pytest.raises(
        LayoutError,
        match=r"^gpus_per_cell: 12 actor GPUs \(actor_num_nodes=3 x actor_num_gpus_per_node=4\)"
        r" are not divisible by the cell size 5",
    ):
        compute_layout(config)


def test_rollout_gpus_not_divisible_by_engine_size() -> None:
    config = LayoutConfig(rollout_num_gpus=6, rollout_num_gpus_per_engine=4)
    with pytest.raises(
        LayoutError,
        match=r"^rollout_num_gpus: 6 GPUs are not divisible by rollout_num_gpus_per_engine=4",
    ):
        compute_layout(config)


def test_eval_gpus_not_divisible_by_engine_size() -> None:
    config = LayoutConfig(rollout_num_gpus=4, rollout_num_gpus_per_engine=2, eval_num_gpus=3)
    with pytest.raises(
        LayoutError,
        match=r"^eval_num_gpus: 3 GPUs are not divisible by rollout_num_gpus_per_engine=2",
    ):
        compute_layout(config)


@pytest.mark.parametrize(
    ("config", "field", "mode"),
    [
        (LayoutConfig(rollout_num_gpus=0), "rollout_num_gpus", "disaggregated"),
        (
            LayoutConfig(actor_num_nodes=0, rollout_num_gpus=4),
            "actor_num_nodes x actor_num_gpus_per_node",
            "disaggregated",
        ),
        (
            LayoutConfig(actor_num_gpus_per_node=0, rollout_num_gpus=4, colocate=True),
            "actor_num_nodes x actor_num_gpus_per_node",
            "colocate",
        ),
        (LayoutConfig(rollout_num_gpus=0, colocate=True), "rollout_num_gpus", "colocate"),
        (
            LayoutConfig(actor_num_nodes=0, debug_train_only=True),
            "actor_num_nodes x actor_num_gpus_per_node",
            "debug_train_only",
        ),
        (
            LayoutConfig(rollout_num_gpus=0, debug_rollout_only=True),
            "rollout_num_gpus",
            "debug_rollout_only",
        ),
        (
            LayoutConfig(actor_num_nodes=0, rollout_external=True),
            "actor_num_nodes x actor_num_gpus_per_node",
            "external_rollout",
        ),
    ],
)
def test_zero_gpus_where_the_mode_needs_them(config: LayoutConfig, field: str, mode: str) -> None:
    with pytest.raises(LayoutError, match=rf"^{re.escape(field)}: 0 GPUs, but mode {mode} needs"):
        compute_layout(config)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (
            {"debug_train_only": True, "debug_rollout_only": True},
            "debug_train_only/debug_rollout_only",
        ),
        ({"colocate": True, "rollout_external": True}, "colocate"),
        ({"colocate": True, "debug_train_only": True}, "colocate"),
        ({"colocate": True, "debug_rollout_only": True}, "colocate"),
        ({"use_critic": True, "debug_rollout_only": True}, "use_critic"),
    ],
)
def test_contradictory_flags_are_refused(flags: dict[str, bool], field: str) -> None:
    with pytest.raises(LayoutError, match=rf"^{re.escape(field)}: ") as info:
        LayoutConfig(rollout_num_gpus=4, **flags)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("flags", "field", "message"),
    [
        ({"debug_train_only": True, "rollout_num_gpus": 4}, "rollout_num_gpus", "is 4 but"),
        ({"rollout_external": True, "eval_num_gpus": 2}, "eval_num_gpus", "is 2 but"),
        (
            {"debug_train_only": True, "rollout_external": True},
            "debug_train_only/rollout_external",
            "both",
        ),
        ({"gpus_per_cell": 4}, "gpus_per_cell", "indep_dp is off"),
    ],
)
def test_flags_that_miles_would_ignore_are_refused(flags, field: str, message: str) -> None:
    """Counts a mode would silently reserve for nothing are errors, not coerced away."""
    with pytest.raises(LayoutError, match=rf"^{re.escape(field)}: .*{message}"):
        LayoutConfig(**flags)


@pytest.mark.parametrize(
    ("field", "value"), [("gpus_per_cell", 4.0), ("rollout_num_gpus_per_engine", True)]
)
def test_non_integer_sizes_are_refused(field: str, value: object) -> None:
    with pytest.raises(LayoutError, match=rf"^{field}: "):
        LayoutConfig(indep_dp=True, **{"gpus_per_cell": 4, field: value})


def test_ipv6_scope_ids_are_different_nodes() -> None:
    bundles = [
        Bundle(0, "fe80::1%eth1", 0),
        Bundle(1, "fe80::1%eth0", 1),
        Bundle(2, "fe80::1%eth0", 0),
    ]
    ordered = order_bundles(bundles)
    assert [b.index for b in ordered] == [2, 1, 0]  # eth0's GPUs together, then eth1


@pytest.mark.parametrize(
    "field", ["actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus", "eval_num_gpus"]
)
@pytest.mark.parametrize("value", [-1, -8, True])
def test_negative_or_non_integer_counts_are_refused(field: str, value: object) -> None:
    with pytest.raises(LayoutError, match=rf"^{field}: got {value!r}; pass an integer >= 0"):
        LayoutConfig(**{field: value})


def test_engine_size_below_one_is_refused() -> None:
    with pytest.raises(LayoutError, match=r"^rollout_num_gpus_per_engine: got 0; .*>= 1"):
        LayoutConfig(rollout_num_gpus=4, rollout_num_gpus_per_engine=0)


@pytest.mark.parametrize("size", [None, 0, -4])
def test_indep_dp_needs_a_cell_size(size: int | None) -> None:
    with pytest.raises(
        LayoutError, match=rf"^gpus_per_cell: indep_dp is set but gpus_per_cell is {size!r}"
    ):
        LayoutConfig(rollout_num_gpus=4, indep_dp=True, gpus_per_cell=size)


# --------------------------------------------------------------------------- place


def two_node_bundles(gpus_per_node: dict[str, int]) -> list[Bundle]:
    """Bundles for each node's GPUs, handed out in a scrambled order like Ray does."""
    bundles = [(node, gpu) for node, count in gpus_per_node.items() for gpu in range(count)]
    bundles = bundles[::-1][1::2] + bundles[::-1][0::2]
    return [Bundle(i, node, gpu) for i, (node, gpu) in enumerate(bundles)]


def test_place_rejects_the_wrong_number_of_bundles() -> None:
    layout = compute_layout(
        LayoutConfig(actor_num_gpus_per_node=4, rollout_num_gpus=4, eval_num_gpus=2)
    )
    bundles = two_node_bundles({"10.0.0.1": 8, "10.0.0.2": 5})
    with pytest.raises(
        LayoutError, match=r"^bundles: got 13 bundles but the disaggregated layout needs 10"
    ):
        place(layout, bundles)


def test_place_binds_roles_to_bundles_in_placement_order() -> None:
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=8,
            rollout_num_gpus=4,
            rollout_num_gpus_per_engine=2,
            eval_num_gpus=2,
            indep_dp=True,
            gpus_per_cell=4,
        )
    )
    # 10.0.0.10 sorts after 10.0.0.9 numerically; the trainer is on 10.0.0.9.
    bundles = two_node_bundles({"10.0.0.10": 6, "10.0.0.9": 8})
    placement = place(layout, bundles)
    by_gpu = {(b.node, b.gpu_id): b for b in bundles}
    expect = [by_gpu["10.0.0.9", g] for g in range(8)] + [by_gpu["10.0.0.10", g] for g in range(6)]
    assert placement.bundles == tuple(expect)
    assert placement.train_bundles() == tuple(expect[:8])
    assert placement.cell_bundles(0) == tuple(expect[0:4])
    assert placement.cell_bundles(1) == tuple(expect[4:8])
    assert placement.engine_bundles(0) == tuple(expect[8:10])
    assert placement.engine_bundles(1) == tuple(expect[10:12])
    assert placement.engine_bundles(0, evaluation=True) == tuple(expect[12:14])
    assert placement.split_engines() == ()


def test_split_engines_finds_an_engine_across_two_nodes() -> None:
    bundles = two_node_bundles({"10.0.0.1": 4, "10.0.0.2": 4})
    # Actor on positions 0-1 (node .1), engines of 2: (2,3) on .1, (4,5) and (6,7) on .2.
    aligned = compute_layout(
        LayoutConfig(actor_num_gpus_per_node=2, rollout_num_gpus=6, rollout_num_gpus_per_engine=2)
    )
    assert place(aligned, bundles).split_engines() == ()
    # Actor on positions 0-1, engines of 3: (2,3,4) crosses from .1 to .2, (5,6,7) is on .2.
    split = compute_layout(
        LayoutConfig(actor_num_gpus_per_node=2, rollout_num_gpus=6, rollout_num_gpus_per_engine=3)
    )
    placement = place(split, bundles)
    assert placement.split_engines() == (0,)
    assert {b.node for b in placement.engine_bundles(0)} == {"10.0.0.1", "10.0.0.2"}
    assert {b.node for b in placement.engine_bundles(1)} == {"10.0.0.2"}


def test_place_uses_the_resolver() -> None:
    layout = compute_layout(
        LayoutConfig(actor_num_gpus_per_node=2, rollout_num_gpus=2, rollout_num_gpus_per_engine=2)
    )
    bundles = two_node_bundles({"trainer-host": 2, "10.0.0.1": 2})
    # Unresolved, the hostname goes last: the engine lands on it.
    assert {b.node for b in place(layout, bundles).train_bundles()} == {"10.0.0.1"}
    # Resolved below 10.0.0.1, it comes first: the trainer lands on it.
    resolver = dict_resolver({"trainer-host": "10.0.0.0"})
    placement = place(layout, bundles, resolver)
    assert {b.node for b in placement.train_bundles()} == {"trainer-host"}
    assert {b.node for b in placement.engine_bundles(0)} == {"10.0.0.1"}
