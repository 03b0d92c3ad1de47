"""The engine's decode law, a prior for it from the model and the GPU, and a least-squares fit
of the prior's efficiencies to published figures (issue 51, item 3).

One decode step of the running batch takes ``fixed + per_request * running + per_kv_token *
kv_tokens`` seconds (the three TimeModel fields ``decode_step_*``); each running request gains
a token per step, so the engine makes ``running / step`` tokens a second.

Why each term, at full efficiency (``prior_terms``):

- ``fixed``: every step reads every weight once, whatever the batch (weight bytes per GPU over
  HBM bandwidth), plus a floor of kernel launches and, under tensor parallelism, two
  all-reduces per layer;
- ``per_request``: each running request's token costs ``2 * params / TP`` FLOPs at the GPU's
  dense peak (what makes large batches compute-bound);
- ``per_kv_token``: attention reads each running request's keys and values once a step (KV
  bytes per token per GPU over HBM bandwidth).

Engines reach a fraction of these peaks, so the fit scales each term by an efficiency (1 is
the prior; 2 is half the peak) shared by every model and GPU; with the prefill term (which a
published throughput also pays) there are five (``Efficiency``). They are found by weighted
least squares on relative time error, pulled weakly towards the prior (``RIDGE``) so that a
term the training figures do not constrain stays near its physics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

import numpy as np

LAUNCH_SECONDS_PER_LAYER = 10e-6
"""Prior: a layer's half-dozen kernel launches and their gaps (about 10 us under CUDA graphs)."""
ALLREDUCE_SECONDS = 10e-6
"""Prior: one small NVLink all-reduce; a tensor-parallel layer does two a step."""
KV_FRACTION = 0.85
"""Of the memory the weights leave, what the KV cache may fill: engines give it about 90% of
what weights and their activation workspace leave. A figure whose batch needs more cannot have
had its whole batch running, so it is not a figure of the law at that batch."""
RIDGE = 0.05
"""Pull of each efficiency towards 1, against a total data weight of one per source (chosen
before any held-out ratio was computed; not tuned on them)."""


@dataclass(frozen=True)
class DecodeLaw:
    """One decode step of the running batch; the simulator's three ``decode_step_*`` fields."""

    fixed: float
    """Seconds per step whatever the batch."""
    per_request: float
    """Seconds per running request per step."""
    per_kv_token: float
    """Seconds per context token held by the running requests, per step."""

    def step_seconds(self, running: int, kv_tokens: float) -> float:
        return self.fixed + self.per_request * running + self.per_kv_token * kv_tokens

    def tokens_per_second(self, running: int, context: float) -> float:
        """Engine throughput with ``running`` requests of ``context`` tokens each."""
        if running <= 0:
            return 0.0
        return running / self.step_seconds(running, running * context)


@dataclass(frozen=True)
class Model:
    """What the prior needs of a dense transformer."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    query_heads: int | None = None
    """None: as many as KV heads (multi-head attention)."""

    @property
    def kv_group(self) -> int:
        """Query heads per KV head (1 for MHA; 8 for Llama-2-70B's GQA)."""
        return (self.query_heads or self.kv_heads) // self.kv_heads

    @property
    def kv_values_per_token(self) -> int:
        """Keys and values a token leaves in the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet peaks (dense, no sparsity)."""

    name: str
    memory_bytes: float
    hbm_bytes_per_second: float
    flops_16: float
    flops_8: float | None = None
    """FP8 tensor-core peak; None where the GPU has none."""


@dataclass(frozen=True)
class Deployment:
    """A model served on ``tp`` GPUs of one kind, with its weight and KV-cache element sizes."""

    model: Model
    gpu: Gpu
    tp: int
    weight_bytes: int
    """Bytes per parameter (1 for FP8, 2 for FP16/BF16)."""
    kv_bytes: int

    @property
    def label(self) -> str:
        dtype = "FP8" if self.weight_bytes == 1 else "FP16"
        return f"{self.model.name} {self.gpu.name} TP{self.tp} {dtype}"

    @property
    def flops(self) -> float:
        """The dense peak the weights' type runs at."""
        if self.weight_bytes == 1 and self.gpu.flops_8 is not None:
            return self.gpu.flops_8
        return self.gpu.flops_16

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.params * self.weight_bytes / self.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """Per GPU: KV heads split over the TP ranks (replicated once TP exceeds them)."""
        shards = min(self.tp, self.model.kv_heads)
        return self.model.kv_values_per_token * self.kv_bytes / shards

    def holds(self, requests: int, tokens_each: int) -> bool:
        """Whether ``requests`` of ``tokens_each`` fit the KV cache at once (``KV_FRACTION``)."""
        free = KV_FRACTION * (self.gpu.memory_bytes - self.weight_bytes_per_gpu)
        return requests * tokens_each * self.kv_bytes_per_token <= free


@dataclass(frozen=True)
class Terms:
    """The prior's seconds at full efficiency, per GPU of the deployment."""

    weights: float
    """Per step: the weights read once."""
    launch: float
    """Per step: the launch and all-reduce floor."""
    compute: float
    """Per running request per step."""
    kv: float
    """Per KV token per step."""
    prefill: float
    """Per prompt token, its matmuls."""
    prefill_attention: float
    """Per prompt token per token of its prompt (causal attention's FLOPs grow with length)."""


def prior_terms(d: Deployment) -> Terms:
    bandwidth, flops = d.gpu.hbm_bytes_per_second, d.flops
    per_layer = LAUNCH_SECONDS_PER_LAYER + (2 * ALLREDUCE_SECONDS if d.tp > 1 else 0.0)
    matmul = 2 * d.model.params / d.tp / flops
    return Terms(
        weights=d.weight_bytes_per_gpu / bandwidth,
        launch=d.model.layers * per_layer,
        compute=matmul,
        kv=d.kv_bytes_per_token / bandwidth,
        prefill=matmul,
        prefill_attention=2 * d.model.layers * d.model.hidden / d.tp / flops,
    )


@dataclass(frozen=True)
class Efficiency:
    """Each prior term's multiplier: 1 is the datasheet peak, 2 half of it."""

    weights: float = 1.0
    launch: float = 1.0
    compute: float = 1.0
    kv: float = 1.0
    prefill: float = 1.0

    def vector(self) -> np.ndarray:
        return np.array(astuple(self), dtype=float)


PRIOR = Efficiency()
NAMES = ("weights", "launch", "compute", "kv", "prefill")


def law(d: Deployment, eff: Efficiency = PRIOR) -> DecodeLaw:
    """The decode law of ``d`` at efficiencies ``eff``."""
    t = prior_terms(d)
    return DecodeLaw(
        fixed=eff.weights * t.weights + eff.launch * t.launch,
        per_request=eff.compute * t.compute,
        per_kv_token=eff.kv * t.kv,
    )


def prefill_seconds(d: Deployment, prompt: int, eff: Efficiency = PRIOR) -> float:
    """Seconds to prefill one prompt of ``prompt`` tokens."""
    t = prior_terms(d)
    return eff.prefill * prompt * (t.prefill + t.prefill_attention * prompt)


def static_run_features(d: Deployment, batch: int, prompt: int, output: int) -> np.ndarray:
    """A static batch's run time as ``features @ efficiencies``: ``batch`` prompts prefilled
    (making each request's first token), then ``output - 1`` decode steps of the whole batch,
    its contexts growing from ``prompt + 1``."""
    t, steps = prior_terms(d), output - 1
    kv_tokens = batch * (steps * prompt + output * steps / 2)
    prefill = batch * prompt * (t.prefill + t.prefill_attention * prompt)
    return np.array(
        [steps * t.weights, steps * t.launch, steps * batch * t.compute, kv_tokens * t.kv, prefill]
    )


def serving_itl_features(d: Deployment, concurrency: int, prompt: int, output: int) -> np.ndarray:
    """A closed-loop server's inter-token latency as ``features @ efficiencies``: a step of all
    ``concurrency`` requests at their mean context, plus the prefills of the other requests
    (each arriving as one finishes) that stall it, spread over a request's decode steps."""
    t = prior_terms(d)
    stalls = (concurrency - 1) * prompt * (t.prefill + t.prefill_attention * prompt) / (output - 1)
    kv_tokens = concurrency * (prompt + output / 2)
    return np.array([t.weights, t.launch, concurrency * t.compute, kv_tokens * t.kv, stalls])


@dataclass(frozen=True)
class Observation:
    """One published figure as the fit sees it: seconds = features @ efficiencies."""

    name: str
    features: np.ndarray
    seconds: float
    weight: float = 1.0


def fit(observations: Sequence[Observation], ridge: float = RIDGE) -> Efficiency:
    """Efficiencies minimising the weighted squared relative time error plus ``ridge`` times
    each efficiency's squared distance from 1; one that would go negative is held at 0."""
    if not observations:
        return PRIOR
    a = np.array([o.features / o.seconds for o in observations])
    w = np.sqrt(np.array([o.weight for o in observations]))
    rows, target = a * w[:, None], w.copy()
    free = list(range(len(NAMES)))
    coef = np.zeros(len(NAMES))
    while free:
        lhs = np.vstack([rows[:, free], np.sqrt(ridge) * np.eye(len(free))])
        rhs = np.concatenate([target, np.sqrt(ridge) * np.ones(len(free))])
        solved = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        if (solved >= 0).all():
            coef[free] = solved
            break
        free = [j for j, c in zip(free, solved, strict=True) if c >= 0]
    return Efficiency(*(float(c) for c in coef))


__all__ = [
    "KV_FRACTION",
    "NAMES",
    "PRIOR",
    "RIDGE",
    "DecodeLaw",
    "Deployment",
    "Efficiency",
    "Gpu",
    "Model",
    "Observation",
    "Terms",
    "fit",
    "law",
    "prefill_seconds",
    "prior_terms",
    "serving_itl_features",
    "static_run_features",
]
