"""Placement: the order of GPU bundles and the layout of roles over them.

Ray hands out a placement group's bundles in no useful order. miles sorts them
by (node address, GPU id) so that ranks that must share a node (a tensor-
parallel group, an engine) get neighbouring bundles. Its sort parsed dotted
quads and fell back to character codes for anything else, so IPv6 addresses
and unresolved hostnames interleaved with IPv4 ones in an arbitrary way. Here
the order is total and explicit:

1. IPv4 addresses, numerically (an IPv4-mapped IPv6 address counts as IPv4);
2. IPv6 addresses, numerically;
3. hostnames the injected resolver could not resolve, by name.

A hostname the resolver resolves sorts as its address. Within a node, bundles
go by GPU id; the bundle index breaks any remaining tie, so the result never
depends on the input order. The resolver is injected because this module does
no I/O: the Ray backends pass one backed by DNS (backends/common/session/ray_session.py's
dns_resolver), tests pass a dict.

The layout follows miles' ``create_placement_groups`` modes; where miles
resolved contradictory flags silently by precedence, this module refuses them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import ConfigError, LayoutError, int_at_least

Resolver = Callable[[str], str | None]
"""Maps a hostname to an IP address literal, or None when it cannot."""

TRAIN_ACTOR_GPU_FRACTION = 0.4
"""GPU share each train actor reserves inside its bundle (miles' num_gpus_per_actor)."""

ENGINE_ACTOR_GPU_FRACTION = 0.2
"""GPU share the engine coordinator actor reserves inside its first bundle."""

_IPV4, _IPV6, _UNRESOLVED = 0, 1, 2


def no_resolver(name: str) -> str | None:
    """The default resolver: resolves nothing, so hostnames sort after addresses."""
    del name
    return None


def dict_resolver(table: Mapping[str, str]) -> Resolver:
    """A resolver backed by a fixed table (tests, static clusters)."""
    return lambda name: table.get(name)


@dataclass(frozen=True)
class Bundle:
    """One GPU bundle of a placement group, as Ray reports it."""

    index: int
    """The bundle's index inside its placement group."""
    node: str
    """The node's address: IPv4, IPv6 (bracketed or not) or a hostname."""
    gpu_id: int
    """The GPU id on that node."""


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def node_sort_key(node: str, resolver: Resolver = no_resolver) -> tuple[int, int, str]:
    """The key that orders a node address: (family, numeric address, name).

    The name part is the unresolved hostname, or an IPv6 scope id (fe80::1%eth0
    and fe80::1%eth1 are different nodes), else empty.
    """
    address = _parse_ip(node)
    if address is None:
        resolved = resolver(node)
        if resolved is None:
            return (_UNRESOLVED, 0, node)
        address = _parse_ip(resolved)
        if address is None:
            raise ConfigError(
                "resolver",
                f"resolved hostname {node!r} to {resolved!r}, which is not an IP address",
                "return an IPv4/IPv6 literal, or None when the name cannot be resolved",
            )
    if isinstance(address, ipaddress.IPv4Address):
        return (_IPV4, int(address), "")
    return (_IPV6, int(address), f"%{address.scope_id}" if address.scope_id else "")


def bundle_sort_key(bundle: Bundle, resolver: Resolver = no_resolver) -> tuple:
    """Total order key of a bundle: node key, GPU id, then node text and index as tie-breaks."""
    return (*node_sort_key(bundle.node, resolver), bundle.gpu_id, bundle.node, bundle.index)


def order_bundles(
    bundles: Iterable[Bundle], resolver: Resolver = no_resolver
) -> tuple[Bundle, ...]:
    """Bundles in placement order; the order does not depend on the input order."""
    bundles = tuple(bundles)
    seen: set[int] = set()
    for bundle in bundles:
        if bundle.index in seen:
            raise ConfigError(
                "bundles", f"bundle index {bundle.index} appears twice", "pass each bundle once"
            )
        if bundle.index < 0 or bundle.gpu_id < 0:
            raise ConfigError(
                "bundles",
                f"bundle {bundle.index} has a negative index or gpu_id ({bundle.gpu_id})",
                "pass the bundle index and the GPU id Ray reports (both >= 0)",
            )
        seen.add(bundle.index)
    return tuple(sorted(bundles, key=lambda b: bundle_sort_key(b, resolver)))


class Mode(StrEnum):
    """The placement modes of miles."""

    DISAGGREGATED = "disaggregated"
    COLOCATE = "colocate"
    DEBUG_TRAIN_ONLY = "debug_train_only"
    DEBUG_ROLLOUT_ONLY = "debug_rollout_only"
    EXTERNAL_ROLLOUT = "external_rollout"


@dataclass(frozen=True)
class LayoutConfig:
    """The flags of miles that decide the layout (names as in miles' arguments)."""

    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 8
    rollout_num_gpus: int = 0
    rollout_num_gpus_per_engine: int = 1
    eval_num_gpus: int = 0
    colocate: bool = False
    debug_train_only: bool = False
    debug_rollout_only: bool = False
    rollout_external: bool = False
    use_critic: bool = False
    indep_dp: bool = False
    gpus_per_cell: int | None = None
    """GPUs of one independent-DP cell (TP x PP x CP); required with indep_dp."""

    def __post_init__(self) -> None:
        for name in (
            "actor_num_nodes",
            "actor_num_gpus_per_node",
            "rollout_num_gpus",
            "eval_num_gpus",
        ):
            value = getattr(self, name)
            if not int_at_least(value, 0):
                raise LayoutError(name, f"got {value!r}", "pass an integer >= 0")
        per_engine = self.rollout_num_gpus_per_engine
        if not int_at_least(per_engine, 1):
            raise LayoutError(
                "rollout_num_gpus_per_engine",
                f"got {self.rollout_num_gpus_per_engine}",
                "pass an integer >= 1",
            )
        if self.debug_train_only and self.debug_rollout_only:
            raise LayoutError(
                "debug_train_only/debug_rollout_only",
                "both are set",
                "choose at most one debug mode",
            )
        if self.colocate and (
            self.rollout_external or self.debug_train_only or self.debug_rollout_only
        ):
            raise LayoutError(
                "colocate",
                "colocate needs engines and a trainer on the same GPUs, but a debug "
                "or external-rollout flag is also set",
                "drop colocate or the other flag",
            )
        if self.use_critic and self.debug_rollout_only:
            raise LayoutError(
                "use_critic",
                "a critic needs the actor's GPUs, but debug_rollout_only has none",
                "drop use_critic or debug_rollout_only",
            )
        cell = self.gpus_per_cell
        if self.indep_dp and (cell is None or not int_at_least(cell, 1)):
            raise LayoutError(
                "gpus_per_cell",
                f"indep_dp is set but gpus_per_cell is {cell!r}",
                "pass the cell size (TP x PP x CP GPUs), an integer >= 1",
            )
        if not self.indep_dp and cell is not None:
            raise LayoutError(
                "gpus_per_cell",
                f"is {cell!r} but indep_dp is off, so the actor is one cell",
                "set indep_dp, or leave gpus_per_cell unset",
            )
        if self.debug_train_only and self.rollout_external:
            raise LayoutError(
                "debug_train_only/rollout_external",
                "both are set, but debug_train_only runs no rollout at all",
                "choose one of them",
            )
        if self.debug_train_only or self.rollout_external:
            unused = {
                "rollout_num_gpus": self.rollout_num_gpus,
                "eval_num_gpus": self.eval_num_gpus,
            }
            for name, value in unused.items():
                if value:
                    flag = "debug_train_only" if self.debug_train_only else "rollout_external"
                    raise LayoutError(
                        name,
                        f"is {value} but {flag} launches no engines, so those GPUs would be "
                        "reserved for nothing",
                        f"set {name}=0 or drop {flag}",
                    )

    @property
    def actor_gpus(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def mode(self) -> Mode:
        if self.debug_train_only:
            return Mode.DEBUG_TRAIN_ONLY
        if self.debug_rollout_only:
            return Mode.DEBUG_ROLLOUT_ONLY
        if self.rollout_external:
            return Mode.EXTERNAL_ROLLOUT
        if self.colocate:
            return Mode.COLOCATE
        return Mode.DISAGGREGATED


@dataclass(frozen=True)
class Span:
    """A contiguous run of positions in the ordered bundle list."""

    offset: int
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.count

    def positions(self) -> range:
        return range(self.offset, self.end)


@dataclass(frozen=True)
class Layout:
    """Which positions of the ordered bundle list each role uses."""

    mode: Mode
    total_gpus: int
    actor: Span
    critic: Span | None
    """The critic shares the actor's bundles (miles), so this equals actor when set."""
    rollout: Span
    eval: Span
    cells: tuple[Span, ...]
    rollout_engines: tuple[Span, ...]
    eval_engines: tuple[Span, ...]
    train_actor_gpu_fraction: float = TRAIN_ACTOR_GPU_FRACTION
    engine_actor_gpu_fraction: float = ENGINE_ACTOR_GPU_FRACTION

    def cell_of_rank(self, rank: int) -> int:
        """The independent-DP cell a train rank (position in the actor span) belongs to."""
        for index, cell in enumerate(self.cells):
            if cell.offset <= self.actor.offset + rank < cell.end:
                return index
        raise ConfigError(
            "rank",
            f"rank {rank} is outside the actor span {self.actor}",
            "pass 0 <= rank < actor GPUs",
        )


def _engines(span: Span, per_engine: int, field: str) -> tuple[Span, ...]:
    if span.count % per_engine:
        raise LayoutError(
            field,
            f"{span.count} GPUs are not divisible by rollout_num_gpus_per_engine={per_engine}",
            f"use a multiple of {per_engine} GPUs, or change the engine size",
        )
    return tuple(
        Span(span.offset + i * per_engine, per_engine) for i in range(span.count // per_engine)
    )


def _cells(config: LayoutConfig, actor: Span) -> tuple[Span, ...]:
    if actor.count == 0:
        return ()
    if not config.indep_dp:
        return (actor,)
    size = config.gpus_per_cell
    assert size is not None  # checked in LayoutConfig
    if actor.count % size:
        raise LayoutError(
            "gpus_per_cell",
            f"{actor.count} actor GPUs (actor_num_nodes={config.actor_num_nodes} x "
            f"actor_num_gpus_per_node={config.actor_num_gpus_per_node}) are not divisible "
            f"by the cell size {size}",
            "make the actor GPU count a multiple of TP x PP x CP",
        )
    return tuple(Span(actor.offset + i * size, size) for i in range(actor.count // size))


def _require(count: int, field: str, mode: Mode, what: str) -> None:
    if count == 0:
        raise LayoutError(field, f"0 GPUs, but mode {mode.value} needs {what}", f"set {field} > 0")


def compute_layout(config: LayoutConfig) -> Layout:
    """The layout for miles' modes; raises LayoutError naming the numbers when impossible."""
    mode = config.mode
    actor_gpus = config.actor_gpus
    rollout_gpus = config.rollout_num_gpus
    eval_gpus = config.eval_num_gpus
    actor_field = "actor_num_nodes x actor_num_gpus_per_node"
    if mode in (Mode.DEBUG_TRAIN_ONLY, Mode.EXTERNAL_ROLLOUT):
        _require(actor_gpus, actor_field, mode, "trainer GPUs")
        actor, rollout, evaluation = Span(0, actor_gpus), Span(actor_gpus, 0), Span(actor_gpus, 0)
    elif mode is Mode.DEBUG_ROLLOUT_ONLY:
        if not config.rollout_external:
            _require(rollout_gpus, "rollout_num_gpus", mode, "engine GPUs")
        actor = Span(0, 0)
        rollout = Span(0, rollout_gpus)
        evaluation = Span(rollout_gpus, eval_gpus)
    elif mode is Mode.COLOCATE:
        _require(actor_gpus, actor_field, mode, "trainer GPUs")
        _require(rollout_gpus, "rollout_num_gpus", mode, "engine GPUs")
        actor, rollout = Span(0, actor_gpus), Span(0, rollout_gpus)
        evaluation = Span(rollout_gpus, eval_gpus)
    else:
        _require(actor_gpus, actor_field, mode, "trainer GPUs")
        _require(rollout_gpus, "rollout_num_gpus", mode, "engine GPUs")
        actor = Span(0, actor_gpus)
        rollout = Span(actor_gpus, rollout_gpus)
        evaluation = Span(actor_gpus + rollout_gpus, eval_gpus)
    total = max(actor.end, rollout.end, evaluation.end)
    per_engine = config.rollout_num_gpus_per_engine
    return Layout(
        mode=mode,
        total_gpus=total,
        actor=actor,
        critic=actor if config.use_critic else None,
        rollout=rollout,
        eval=evaluation,
        cells=_cells(config, actor),
        rollout_engines=_engines(rollout, per_engine, "rollout_num_gpus"),
        eval_engines=_engines(evaluation, per_engine, "eval_num_gpus"),
    )


@dataclass(frozen=True)
class Placement:
    """A layout applied to ordered bundles: which bundle each actor lands on."""

    layout: Layout
    bundles: tuple[Bundle, ...]
    """The bundles in placement order."""
    sort_as: tuple[str, ...] = ()
    """The address each bundle's node sorted as: what the resolver gave for a hostname, else
    the node itself (recorded with the placement, for the placement oracle)."""

    def train_bundles(self) -> tuple[Bundle, ...]:
        """Bundle of each train rank (rank = position in the actor span)."""
        return tuple(self.bundles[i] for i in self.layout.actor.positions())

    def cell_bundles(self, cell: int) -> tuple[Bundle, ...]:
        return tuple(self.bundles[i] for i in self.layout.cells[cell].positions())

    def engine_bundles(self, engine: int, *, evaluation: bool = False) -> tuple[Bundle, ...]:
        spans = self.layout.eval_engines if evaluation else self.layout.rollout_engines
        return tuple(self.bundles[i] for i in spans[engine].positions())

    def split_engines(self) -> tuple[int, ...]:
        """Rollout engines whose GPUs span more than one node (a TP group split across nodes)."""
        return tuple(
            i
            for i in range(len(self.layout.rollout_engines))
            if len({b.node for b in self.engine_bundles(i)}) > 1
        )


def place(layout: Layout, bundles: Sequence[Bundle], resolver: Resolver = no_resolver) -> Placement:
    """Order the bundles and bind the layout to them; the counts must match."""
    if len(bundles) != layout.total_gpus:
        raise LayoutError(
            "bundles",
            f"got {len(bundles)} bundles but the {layout.mode.value} layout needs "
            f"{layout.total_gpus}",
            f"create the placement group with {layout.total_gpus} GPU bundles",
        )
    ordered = order_bundles(bundles, resolver)
    resolved = {b.node: _sort_address(b.node, resolver) for b in ordered}
    return Placement(layout, ordered, tuple(resolved[b.node] for b in ordered))


def _sort_address(node: str, resolver: Resolver) -> str:
    if _parse_ip(node) is not None:
        return node
    return resolver(node) or node
