"""The published weight-update figures (``../shared/research/anchors.md``), the fit of the
update path's terms to them, and the table of predicted against published.

Every row with a published setup names its preset (miles_core/scenario/anchor_presets.py);
its prediction is the simulator's own: ``predict_update_seconds`` replays the update
through SimTransport. The fit solves, per group of systems that share terms, a weighted
least squares (relative error) of the rows: each term is linear in the row's time when the
rates are fitted as seconds per byte (sim/world/update_cost.py: fixed + bytes gathered / gather
rate + bytes on the wire / link rate, the rest a constant), so its coefficients are the
cost functions' own figures at a rate of one byte per second. Rows the fit used are also
predicted leaving each one out (``held_out``), so no row is only judged by a fit that saw it.
A row off by more than MISS_FACTOR names the term that would have to change, and by how
much, to meet it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.scenario import PRESETS, Preset
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, SYSTEM_MODES, SYSTEMS
from miles_core.scenario.world import TimeModel
from miles_core.transfer import plan_buckets
from sim.timing.basis import Basis
from sim.timing.cluster_setup import cluster_terms
from sim.world.update_cost import Route, broadcast_hops, gather_seconds, wire_seconds

GIB = 1 << 30
MISS_FACTOR = 1.5
"""A prediction within this factor of the published figure (either way) meets it."""
MILES_P2P = "miles docs/advanced/p2p-weight-transfer.md @31f1ca96, Profiling Results"
CKPT = "MoonshotAI/checkpoint-engine README (benchmark table)"


@dataclass(frozen=True)
class Anchor:
    """A published update time and the preset that models its setup."""

    row: str
    preset: str
    published_seconds: float
    source: str
    bucket_bytes: int = GIB
    fitted: bool = True
    """Among the rows the fit uses (False: predicted only)."""
    restated: str = ""
    """A setting read from this row's own published breakdown that its prediction charges
    (its label is then "restated", sim/timing/basis.py); empty when none."""
    note: str = ""
    """What the published setup leaves out that the row's reader must know."""


@dataclass(frozen=True)
class Unpredicted:
    """A published row the model does not predict, and why."""

    row: str
    published: str
    source: str
    why: str


def _miles(
    model: str, cluster: str, nccl_ms: float, rdma_ms: float, restated: str = ""
) -> list[Anchor]:
    return [
        Anchor(
            f"miles {model} NCCL", f"miles-{cluster}-nccl", nccl_ms / 1e3, MILES_P2P, **_r(restated)
        ),
        Anchor(
            f"miles {model} RDMA P2P",
            f"miles-{cluster}-rdma",
            rdma_ms / 1e3,
            MILES_P2P,
            **_r(restated),
        ),
    ]


def _r(restated: str) -> dict[str, str]:
    return {"restated": restated} if restated else {}


def _ckpt(
    model: str, cluster: str, broadcast: float, p2p: float, p2p_note: str = ""
) -> list[Anchor]:
    return [
        Anchor(
            f"checkpoint-engine {model} broadcast",
            f"checkpoint-engine-{cluster}-broadcast",
            broadcast,
            CKPT,
        ),
        Anchor(
            f"checkpoint-engine {model} p2p",
            f"checkpoint-engine-{cluster}-p2p",
            p2p,
            CKPT,
            note=p2p_note,
        ),
    ]


KIMI_REQUANTIZE = (
    "the rollout side's requantization, 0.884 s, read from this row's own breakdown "
    "(miles' doc: the 7,227 ms include about 884 ms of post_load_weights)"
)
AT_MOST_16 = "the README's P2P column updates at most 16 GPUs of the 256"


ANCHORS: tuple[Anchor, ...] = (
    *_miles("GLM-4.7-Flash 1+1 nodes", "glm-4.7-flash-1+1", 2508.6, 4229.0),
    *_miles("Qwen3-30B-A3B 2+2", "qwen3-30b-a3b-2+2", 2670.0, 2160.2),
    *_miles("GLM-4.5-Air 4+4", "glm-4.5-air-4+4", 5001.1, 2637.2),
    *_miles("Qwen3-235B-A22B 8+8", "qwen3-235b-a22b-8+8", 10753.6, 3162.0),
    *_miles("GLM-5 744B 16+16", "glm-5-16+16", 58301.5, 8479.7),
    *_miles("Kimi-K2 1T 32+32", "kimi-k2-32+32", 53279.1, 7227.3, KIMI_REQUANTIZE),
    *_ckpt("GLM-4.5-Air 8xH800", "glm-4.5-air-8xh800", 3.47, 4.12),
    *_ckpt("Qwen3-235B 8xH800", "qwen3-235b-a22b-8xh800", 6.22, 7.10),
    *_ckpt("DeepSeek-V3.1 FP8 16xH20", "deepseek-v3.1-fp8-16xh20", 10.19, 11.80),
    *_ckpt("Kimi-K2 FP8 16xH20", "kimi-k2-fp8-16xh20", 14.36, 17.49),
    # TP16 on 256 H20 (corrected 12-06: 11.33 s is DeepSeek-V3.1's broadcast, not Kimi-K2's)
    *_ckpt("DeepSeek-V3.1 FP8 256xH20", "deepseek-v3.1-fp8-256xh20", 11.33, 11.81, AT_MOST_16),
    *_ckpt("Kimi-K2 FP8 256xH20", "kimi-k2-fp8-256xh20", 16.04, 16.75, AT_MOST_16),
    Anchor(
        "Perplexity Kimi-K2 256 BF16 -> 128 FP8 GPUs, RDMA",
        "perplexity-kimi-k2-fp8-256+128",
        1.3,
        "Perplexity Research blog, weight transfer in under 2 seconds (S)",
        fitted=False,
    ),
)

UNPREDICTED: tuple[Unpredicted, ...] = (
    Unpredicted(
        "miles GLM-5 4-layer, 1 node",
        "732.2 / 1,260.8 ms",
        MILES_P2P,
        "the 4-layer model's size is not published",
    ),
    Unpredicted(
        "miles Moonlight-16B, 1 node", "1,482.0 / 1,073.3 ms", "miles PR #976", "layout not given"
    ),
    Unpredicted(
        "verl + checkpoint-engine 7B / 30B-A3B / 235B",
        "0.12->0.02 / 15.76->4.38 / 58.57->23.70 s",
        "verl (anchors.md)",
        "cluster not published (the 7B figure is ~760 GB/s, not physical)",
    ),
    Unpredicted(
        "NeMo-RL NIXL vs NCCL, DeepSeek-V3", "9.25 / 14.21 s", "NeMo-RL", "cluster not published"
    ),
    Unpredicted("slime GLM-4.5 bf16 / fp8", "48 / 100 s", "slime", "cluster not published"),
    Unpredicted(
        "checkpoint-engine Kimi-K2, thousands of GPUs", "about 20 s", CKPT, "cluster not given"
    ),
    Unpredicted("Awex Ring-1T", "5-10 s", "Awex blog (S)", "cluster not published"),
    Unpredicted(
        "vLLM Qwen3-235B 8xH100 FSDP2 -> 8xH100 NIXL",
        "3.2-3.3 s",
        "vllm-project/vllm PR #43375",
        "vLLM's NIXL path is not one of the modelled systems (its terms are not fitted)",
    ),
    Unpredicted(
        "NeMo-RL MXFP8 refit, B200", "18.40->7.26 s; 9.67->2.98 s", "NeMo-RL PR #3294", "GPUs?"
    ),
    Unpredicted(
        "NeMo-RL 30B-A3B refit, 32-1,024 GPUs", "2.06-2.63 s", "NeMo-RL PR #3186", "per-size GPUs?"
    ),
    Unpredicted("AReaL awex vs RDT", "118 / 307 ms", "AReaL PR #1305", "model size not given"),
    Unpredicted(
        "slime direct iterator, Qwen3.6-35B",
        "58 min -> 270 s",
        "training-gym #94-#97",
        "a pathology (25 s per 512 MB chunk): bucket_fixed_seconds = 25 would state it, not "
        "predict it",
    ),
    Unpredicted("marin pause rework", "6.216 -> 1.211 s", "marin #8955", "cluster not published"),
    Unpredicted(
        "async vs sync: AReaL 7B-32B, verl fully_async 30B-A3B / ReTool, verl "
        "one_step_off, NeMo-RL, StreamRL, Laminar, ROLL Flash, RollPacker, APRIL, Seer, "
        "miles #1723, OrchestrRL",
        "57.7->25.4 h, 1.72x, 1.60x, +23-40 %, 192->152 s, ...",
        "anchors.md, Async vs sync",
        "each needs a plan file of its cluster, whose generation and training figures the "
        "anchors do not give (verl's 7B table does, for three sizes, and AReaL's 1.5B with "
        "Fig. 5c: the async-vs-sync table below)",
    ),
    Unpredicted(
        "quality vs staleness (AReaL Table 2, tinker-cookbook #822); verl's step at "
        "staleness 0-0.3; AReaL's throughput at eta 16 and unbounded",
        "AIME24 42.0-36.9; 231.34-146.11 s; 382.4 / 396.8 k tok/s",
        "anchors.md",
        "quality is not modelled; verl's threshold is a share of a batch generated ahead, "
        "which a bound in versions does not express; eta 16 and unbounded need runs long "
        "enough to fill their pipeline (AReaL's eta 0-8: the staleness table below)",
    ),
    Unpredicted(
        "bad cases: 70B over gloo, 8B, 200+ per-param RPCs",
        "3 min; 5-6 s; >120 s",
        "vllm #5723, open-instruct #1535",
        "pathologies outside the bucketed path",
    ),
)


@dataclass(frozen=True)
class Param:
    """One fitted figure: a field of one or more systems (a rate is fitted as its inverse)."""

    name: str
    field: str
    systems: tuple[str, ...]

    @property
    def is_rate(self) -> bool:
        return self.field.endswith("bytes_per_second")

    def value(self) -> float:
        """Its value in the systems' table (they agree: a test holds them to it)."""
        return getattr(SYSTEMS[self.systems[0]], self.field)


MILES_SYSTEMS = ("miles-nccl", "miles-rdma", "perplexity-rdma")
FIT_GROUPS: Mapping[str, tuple[Param, ...]] = {
    "miles": (
        Param("fixed per update, NCCL", "update_fixed_seconds", ("miles-nccl",)),
        Param("fixed per update, RDMA", "update_fixed_seconds", ("miles-rdma",)),
        Param("gather + convert", "gather_bytes_per_second", MILES_SYSTEMS),
        Param("inter-node link per GPU", "link_bytes_per_second", MILES_SYSTEMS),
    ),
    "checkpoint-engine-broadcast": (
        Param("fixed per update", "update_fixed_seconds", ("checkpoint-engine-broadcast",)),
        Param("per-GPU rate", "link_bytes_per_second", ("checkpoint-engine-broadcast",)),
        Param("per bucket per doubling", "broadcast_hop_seconds", ("checkpoint-engine-broadcast",)),
    ),
    "checkpoint-engine-p2p": (
        Param("fixed per update", "update_fixed_seconds", ("checkpoint-engine-p2p",)),
        Param("per-GPU rate", "link_bytes_per_second", ("checkpoint-engine-p2p",)),
    ),
}
"""Groups of systems fitted together, and the figures each fit sets."""


def basis_of(anchor: Anchor) -> tuple[Basis, str]:
    """The row's label (sim/timing/basis.py) and why: a fitted row is judged by the fit that
    left it out; a restated setting outranks both."""
    if anchor.restated:
        return Basis.RESTATED, anchor.restated
    group = group_of(anchor)
    if anchor.fitted and group is not None:
        rows = sum(1 for a in ANCHORS if a.fitted and group_of(a) == group)
        unknowns = len(FIT_GROUPS[group])
        return Basis.HELD_OUT, (
            f"the {group} fit without this row ({rows - 1} rows, {unknowns} unknowns)"
        )
    return Basis.PREDICTED, "no figure of its own in any fit: the fitted systems' rates"


def system_of(anchor: Anchor) -> str:
    return ANCHOR_PRESETS[anchor.preset][1]


def group_of(anchor: Anchor) -> str | None:
    system = system_of(anchor)
    return next((g for g, ps in FIT_GROUPS.items() if any(system in p.systems for p in ps)), None)


def _route(preset: Preset) -> Route:
    w = preset.world  # the anchor presets place trainer and engines on separate nodes
    return Route(False, w.gpus_per_cell, w.num_engines, w.gpus_per_engine)


def update_terms(preset: Preset, system: str, bucket_bytes: int) -> dict[str, float]:
    """The update's seconds by term, summed over its buckets (the simulator's own functions:
    sim/world/update_cost.py), at the preset's figures, in the system's mode."""
    return cluster_terms(preset, SYSTEM_MODES[system], bucket_bytes)


@functools.cache
def _coefficients(anchor: Anchor, params: tuple[Param, ...]) -> tuple[tuple[float, ...], float]:
    """The row's time as constant + sum(coefficient x fitted figure): each coefficient is the
    term's seconds at one byte per second (a fixed cost's, 1), the constant the rest."""
    preset, system = PRESETS[anchor.preset], system_of(anchor)
    t, route = preset.timing, _route(preset)
    p2p, many = SYSTEM_MODES[system] == "p2p", t.many_source_p2p
    buckets = plan_buckets(preset.world.units(), anchor.bucket_bytes)
    staged = [k for k, v in update_terms(preset, system, anchor.bucket_bytes).items() if v > 0]
    if t.pipelined_buckets and len(set(staged) - {"fixed"}) > 1:  # max() of stages: not linear
        raise ArithmeticError(f"{anchor.row}: a pipelined system fits one stage at the most")
    unit = dataclasses.replace(t, gather_bytes_per_second=1.0, link_bytes_per_second=1.0)
    unit = dataclasses.replace(unit, link_latency_seconds=0.0)
    row = []
    for p in params:
        if system not in p.systems:
            row.append(0.0)
        elif p.field == "update_fixed_seconds":
            row.append(1.0)
        elif p.field == "gather_bytes_per_second":
            row.append(sum(gather_seconds(unit, b.nbytes) for b in buckets))
        elif p.field == "broadcast_hop_seconds":
            row.append(0.0 if p2p else len(buckets) * broadcast_hops(route))
        else:
            row.append(sum(wire_seconds(unit, b.nbytes, route, p2p and many) for b in buckets))
    current = [1.0 / p.value() if p.is_rate else p.value() for p in params]
    total = sum(update_terms(preset, system, anchor.bucket_bytes).values())
    return tuple(row), total - sum(c * v for c, v in zip(row, current, strict=True))


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a few unknowns)."""
    n = len(rhs)
    a = [[*r, v] for r, v in zip(matrix, rhs, strict=True)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda k: abs(a[k][c]))
        a[c], a[pivot] = a[pivot], a[c]
        if a[c][c] == 0:
            raise ArithmeticError("the rows do not determine every term")
        for k in range(n):
            if k != c:
                f = a[k][c] / a[c][c]
                a[k] = [x - f * y for x, y in zip(a[k], a[c], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit_group(group: str, leave_out: str | None = None) -> dict[str, float]:
    """The group's figures that best meet its rows (relative least squares), as the
    systems' fields take them (rates in bytes per second)."""
    params = FIT_GROUPS[group]
    rows = [a for a in ANCHORS if a.fitted and group_of(a) == group and a.row != leave_out]
    xs, ys = [], []
    for a in rows:
        coef, const = _coefficients(a, params)
        w = 1.0 / a.published_seconds
        xs.append([c * w for c in coef])
        ys.append((a.published_seconds - const) * w)
    free = list(range(len(params)))
    while True:  # a fixed cost that comes out negative is held at 0 and the rest refitted
        normal = [[sum(x[i] * x[j] for x in xs) for j in free] for i in free]
        rhs = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in free]
        solved = dict(zip(free, _solve(normal, rhs), strict=True))
        negative = [i for i, v in solved.items() if v < 0 and not params[i].is_rate]
        if not negative:
            break
        free.remove(negative[0])
    if any(v <= 0 for v in solved.values()):
        raise ArithmeticError(f"{group}: a rate came out negative (the rows contradict the model)")
    figures = [solved.get(i, 0.0) for i in range(len(params))]
    return {p.name: (1.0 / v if p.is_rate else v) for p, v in zip(params, figures, strict=True)}


def refitted(preset: Preset, system: str, group: str, figures: Mapping[str, float]) -> Preset:
    """The preset with a fit's figures in place of the table's."""
    timing: TimeModel = preset.timing
    for p in FIT_GROUPS[group]:
        if system in p.systems:
            timing = dataclasses.replace(timing, **{p.field: figures[p.name]})
    return dataclasses.replace(preset, timing=timing)


__all__ = [
    "ANCHORS",
    "FIT_GROUPS",
    "MISS_FACTOR",
    "UNPREDICTED",
    "Anchor",
    "Unpredicted",
    "basis_of",
    "fit_group",
    "refitted",
    "update_terms",
]
