"""What one bucket of a weight update costs in the simulator, term by term.

Each term is its own function and says where it comes from. The terms follow miles'
bucketed update path (``miles/backends/megatron_utils/update_weight/``; the stages are
listed in ``docs/advanced/p2p-weight-transfer.md``, "Architecture"):

1. a fixed cost per update (``update_fixed_seconds``), charged on the first bucket; and the
   making of the cell's weight-update group where it connected afresh
   (``group_make_seconds``), charged on the first bucket over the new group;
2. on the source, per bucket: packing and the call (``bucket_fixed_seconds``), Megatron's
   TP/EP all-gather (``gather_bytes_per_second``) and the Megatron -> HF conversion
   (``convert_bytes_per_second``), each PP stage doing its own share at once (``gather_shares``:
   "Each pipeline-parallel stage updates its own weights independently");
3. the wire: a broadcast reaches every target GPU with the whole bucket, so the bucket
   takes one link's send, plus ``broadcast_hop_seconds`` for each doubling of its members
   (a broadcast over more GPUs is slower: checkpoint-engine's rows from 16 to 256 GPUs);
   p2p gives each engine a link of its own; many-source p2p (miles'
   RDMA path, Perplexity's static schedule) has every trainer GPU write its share, so the
   source side has one NIC per GPU and each target rank takes its shard, 1 /
   max(``engine_ep``, ``engine_tp``) of the bucket ("utilizes M // src_pp times more source
   transmission bandwidth", "each target rank receives sgl_ep times less data"; SGLang builds
   EP within TP, so a TP-only engine's rank takes 1 / TP as well). Before its writes, a p2p
   sender re-shards its stage's bucket into the layout of each engine rank it serves, one
   rank after another (miles @31f1ca96, ``UpdateWeightP2P._update_weight_implementation``:
   ``load_weights`` on the rank's CPU replica, a non-last rank's writes finished before the
   next load); every rank beyond the first costs ``reshard_bytes_per_second``, charged with
   the source's stages (the first is in every p2p update's fitted figures);
4. on the rollout side, per engine GPU: requantization (``quantize_bytes_per_second``, miles'
   Kimi-K2 ``post_load_weights``, about 884 ms) and the load (``load_bytes_per_second``).

Without ``pipelined_buckets`` the stages of a bucket follow one another (miles' broadcast
waits for the engines before the next gather); with it they overlap the next bucket's, so a
bucket costs its slowest stage and the update pays the others once (fill and drain).

Every term left at its default (0, False, 1) charges nothing: the simulator's old model, a
latency and a bandwidth per link, is what remains. The anchor presets set them to the
values fitted in sim/timing/anchors.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from miles_core.scenario.world import TimeModel


@dataclass(frozen=True)
class Route:
    """Where a bucket goes: what the wire's time depends on."""

    within_a_node: bool
    """Source and every target on one node: NVLink, else the inter-node link."""
    source_gpus: int
    engines: int
    gpus_per_engine: int


@dataclass(frozen=True)
class BucketCost:
    """One bucket's stages, in seconds."""

    prepare: float
    """On the source: packing, gather, conversion (and p2p's re-shard per target rank)."""
    wire: float
    land: float
    """On the rollout side: requantization and load."""

    def charged(self, pipelined: bool, first: bool) -> dict[str, float]:
        """What each stage adds to the update: every stage in turn, or (pipelined) only the
        slowest, the first bucket also paying the other stages once (filling the pipe and,
        as the same amount, draining it)."""
        stages = {"prepare": self.prepare, "wire": self.wire, "land": self.land}
        if not pipelined or first:
            return stages
        slowest = max(stages, key=stages.__getitem__)
        return {k: v if k == slowest else 0.0 for k, v in stages.items()}

    def seconds(self, pipelined: bool, first: bool) -> float:
        """The bucket's share of the update: the sum of what its stages add."""
        return sum(self.charged(pipelined, first).values())


def _per(rate: float, nbytes: float) -> float:
    return nbytes / rate if rate > 0 else 0.0


def update_fixed_seconds(t: TimeModel) -> float:
    """Per update: setup the bytes do not explain (fitted: the small-model rows)."""
    return t.update_fixed_seconds


def group_make_seconds(t: TimeModel, engines: int) -> float:
    """Making a weight-update group of ``engines`` engines and the source's rank (miles'
    ``connect_rollout_engines``: the trainer's rendezvous while every engine serves
    /init_weights_update_group), on its first bucket after a (re)connect. Fitted to the CPU
    backend's UpdateGroupMade events (sim/timing/run_fit.py)."""
    return t.group_make_seconds + t.group_make_seconds_per_engine * engines


def pack_seconds(t: TimeModel) -> float:
    """Per bucket: flattening it into the buffer and the call that sends it."""
    return t.bucket_fixed_seconds


def gather_seconds(t: TimeModel, nbytes: int) -> float:
    """TP/EP all-gather of the bucket, each PP stage gathering its share at once."""
    return _per(t.gather_bytes_per_second, nbytes / t.gather_shares)


def convert_seconds(t: TimeModel, nbytes: int) -> float:
    """Megatron -> HF names and layouts, per PP stage."""
    return _per(t.convert_bytes_per_second, nbytes / t.gather_shares)


def broadcast_hops(route: Route) -> float:
    """Doublings of a broadcast's members: log2 of its target GPUs and its source."""
    return math.log2(route.engines * route.gpus_per_engine + 1)


def wire_seconds(
    t: TimeModel, nbytes: int, route: Route, many_source: bool, broadcast: bool = False
) -> float:
    """The bucket on the wire to one engine (broadcast: to all, as slow as one link, and
    ``broadcast_hop_seconds`` more per doubling of its members)."""
    rate = t.nvlink_bytes_per_second if route.within_a_node else t.link_bytes_per_second
    if not many_source:
        hops = t.broadcast_hop_seconds * broadcast_hops(route) if broadcast else 0.0
        return t.link_latency_seconds + nbytes / rate + hops
    sent = route.engines * nbytes / (route.source_gpus * rate)  # every source NIC at once
    taken = nbytes / (max(t.engine_ep, t.engine_tp) * rate)  # each target rank its shard
    return t.link_latency_seconds + max(sent, taken)


def targets_per_sender(t: TimeModel, route: Route, many_source: bool) -> int:
    """Engine ranks one p2p sender re-shards for, in turn. miles' plan
    (``p2p_transfer_utils.py`` ``RemoteTransferPlan.plan_p2p``) spreads an engine's ranks
    round robin over a stage's senders (its trainer GPUs, ``world_size // pp_size``, each
    holding the stage's whole gathered bucket), then gives each further engine's rank to a
    sender already serving that rank: a sender serves ceil(gpus per engine / senders)
    ranks, one when the senders are at least an engine's GPUs. One source (not
    many-source) serves every rank."""
    senders = max(1, route.source_gpus // t.gather_shares) if many_source else 1
    return -(-route.gpus_per_engine // senders)


def reshard_seconds(t: TimeModel, nbytes: int, route: Route, many_source: bool) -> float:
    """A p2p sender's re-shard of its stage's share of the bucket into each engine rank it
    serves beyond the first, in turn (miles' ``load_weights`` on that rank's CPU replica,
    the previous rank's writes finished first). The first rank's re-shard is in what every
    p2p update pays, its fitted fixed cost and rates, so a sender of one rank pays nothing
    here; 0 where ``reshard_bytes_per_second`` is 0."""
    further = targets_per_sender(t, route, many_source) - 1
    return further * _per(t.reshard_bytes_per_second, nbytes / t.gather_shares)


def quantize_seconds(t: TimeModel, nbytes: int, gpus_per_engine: int) -> float:
    """Rollout-side requantization of each GPU's share of the bucket."""
    return _per(t.quantize_bytes_per_second, nbytes / gpus_per_engine)


def load_seconds(t: TimeModel, nbytes: int, gpus_per_engine: int) -> float:
    """The engine's load of each GPU's share into its model."""
    return _per(t.load_bytes_per_second, nbytes / gpus_per_engine)


def bucket_cost(
    t: TimeModel, nbytes: int, route: Route, p2p: bool, link_slowdown: float = 1.0
) -> BucketCost:
    """A bucket's stages; ``link_slowdown`` is a slow link's factor (the wire only)."""
    prepare = pack_seconds(t) + gather_seconds(t, nbytes) + convert_seconds(t, nbytes)
    if p2p:
        prepare += reshard_seconds(t, nbytes, route, t.many_source_p2p)
    wire = wire_seconds(t, nbytes, route, p2p and t.many_source_p2p, broadcast=not p2p)
    land = quantize_seconds(t, nbytes, route.gpus_per_engine)
    land += load_seconds(t, nbytes, route.gpus_per_engine)
    return BucketCost(prepare, wire * link_slowdown, land)


def bucket_seconds(
    t: TimeModel, nbytes: int, route: Route, p2p: bool, index: int, link_slowdown: float = 1.0
) -> float:
    """What bucket ``index`` of an update costs, its own stages only (the update's fixed
    cost, ``update_fixed_seconds``, is the source's before its first bucket: a transport
    measures a bucket's send without it)."""
    cost = bucket_cost(t, nbytes, route, p2p, link_slowdown)
    return cost.seconds(t.pipelined_buckets, first=index == 0)


__all__ = [
    "BucketCost",
    "Route",
    "broadcast_hops",
    "bucket_cost",
    "bucket_seconds",
    "convert_seconds",
    "gather_seconds",
    "group_make_seconds",
    "load_seconds",
    "pack_seconds",
    "quantize_seconds",
    "reshard_seconds",
    "targets_per_sender",
    "update_fixed_seconds",
    "wire_seconds",
]
