"""The async-vs-sync anchors the simulator predicts by running both modes: verl's fully-async
7B table (volcengine/verl ``docs/advance/fully_async.md`` @2147009, "Asynchronous Training on
7B Model", H20, Qwen2.5-Math-7B, 512 prompts x 16, responses up to 28K).

Each size has a plan file (``plans/verl-7b-{gpus}-h20.toml``); its colocated ``sync`` point
and its ``fully_async`` point at a bound of one version are run for a few steps, and the
steady step (between the first and the last commit, so the pipeline's fill is left out)
is set beside the published step of each mode and their ratio, the speedup.

What the plan files take from the table, and what they do not (docs/timing.md):

- the dedicated trainer's step: a law ``a + b / GPUs`` fitted here to the fully-async rows'
  update_actor (one law for all three sizes; ``held_out`` refits it without the row);
- the colocated training: each colocated row's old_log_prob + update_actor, an input;
- the generation: nothing of the table. The engines' decode law and KV pool are derived from
  the model, the GPU and published engine figures (sim/timing/anchor_generation.py), so each
  colocated row's "gen" column is a figure the runs predict (``SYNC_GENERATION``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from miles_core.events import GroupStarted, StepBegan, StepCommitted
from sim.timing.basis import Basis
from sim.timing.plan_file import load_plan, points

ROOT = Path(__file__).resolve().parents[2]
VERL = "volcengine/verl docs/advance/fully_async.md @2147009"
SAMPLES = 512 * 16
"""verl's batch: 512 prompts, 16 responses each."""
GPUS_PER_REPLICA = 8


@dataclass(frozen=True)
class VerlRow:
    """One size of verl's table: the colocated run on ``gpus`` and the fully-async run on
    ``gpus // 2`` : ``gpus // 2`` (seconds per step, as published)."""

    gpus: int
    sync_step: float
    sync_gen: float
    sync_old_log_prob: float
    sync_update_actor: float
    async_step: float
    async_update_actor: float

    @property
    def trainer_gpus(self) -> int:
        return self.gpus // 2

    @property
    def colocated_train(self) -> float:
        """The colocated step's training phase: old log-probs recomputed, then the update."""
        return self.sync_old_log_prob + self.sync_update_actor

    @property
    def plan_file(self) -> Path:
        return ROOT / "plans" / f"verl-7b-{self.gpus}-h20.toml"


VERL_7B: tuple[VerlRow, ...] = (
    VerlRow(32, 790.10, 357.41, 107.71, 313.81, 294.77, 269.80),
    VerlRow(64, 365.28, 150.72, 70.26, 133.41, 189.26, 156.98),
    VerlRow(128, 356.30, 177.85, 53.92, 113.81, 150.63, 113.16),
)


@dataclass(frozen=True)
class TrainLaw:
    """A dedicated trainer's step on n GPUs: ``per_step + gpu_seconds / n``."""

    per_step: float
    gpu_seconds: float

    def seconds(self, gpus: int) -> float:
        return self.per_step + self.gpu_seconds / gpus

    def plan_figures(self) -> dict[str, float]:
        """The plan's [model] figures for replicas of 8 GPUs and verl's batch."""
        return {
            "train_seconds_per_step": self.per_step,
            "train_seconds_per_sample": self.gpu_seconds / (GPUS_PER_REPLICA * SAMPLES),
        }


def fit_train_law(rows: Sequence[VerlRow], leave_out: int | None = None) -> TrainLaw:
    """Least squares of the relative error of ``a + b / n`` over the rows' async update_actor
    (two unknowns, closed form); ``leave_out``: without the row of that many GPUs."""
    used = [r for r in rows if r.gpus != leave_out]
    if len(used) < 2:
        raise ValueError("the law has two unknowns: fit it on two rows or more")
    # each row: a / t + b / (n t) = 1, weighted so that every row's relative error counts
    xs = [(1 / r.async_update_actor, 1 / (r.trainer_gpus * r.async_update_actor)) for r in used]
    s11 = sum(x * x for x, _ in xs)
    s12 = sum(x * y for x, y in xs)
    s22 = sum(y * y for _, y in xs)
    r1, r2 = sum(x for x, _ in xs), sum(y for _, y in xs)
    det = s11 * s22 - s12 * s12
    return TrainLaw((r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det)


def colocated_per_sample(row: VerlRow) -> float:
    """The plan's colocated figure: the row's training phase for a replica's share."""
    return row.colocated_train * (row.gpus // GPUS_PER_REPLICA) / SAMPLES


@dataclass(frozen=True)
class Comparison:
    """A published async-vs-sync comparison the simulator runs: the plan file's colocated
    ``sync`` point and its ``fully_async`` point at ``bound`` (seconds per step)."""

    row: str
    plan: str
    sync_step: float
    async_step: float
    bound: int
    source: str
    sync_basis: tuple[Basis, str]
    """How the sync step's prediction was obtained (sim/timing/basis.py), and why."""
    async_basis: tuple[Basis, str]
    sync_generation: float | None = None
    """The published generation phase of the sync step, where the source gives it."""


SYNC_GENERATION = (
    Basis.PREDICTED,
    "the engines' decode law and KV pool derived from the model, the GPU and published "
    "engine figures (sim/timing/anchor_generation.py), and the plan's assumed response "
    "lengths: nothing of this row's",
)
"""How a colocated row's generation phase is obtained."""


TRAIN_LAW_SAW = (
    Basis.FITTED,
    "the trainer's law a + b / GPUs was fitted with this row's update_actor; the generation "
    "is predicted (the decode law from engine figures, no RL row)",
)


def _verl_sync_basis(row: VerlRow) -> tuple[Basis, str]:
    """Every size alike: the generation is predicted; the training phase is the row's own."""
    return Basis.RESTATED, (
        f"the colocated training phase ({row.colocated_train:.2f} s of {row.sync_step:.2f}) "
        "is this row's own old_log_prob + update_actor"
    )


AREAL = "AReaL arXiv 2505.24298, Table 1 and Fig. 5c"
AREAL_TOKENS_PER_STEP = 8192 * 9669
"""A step's generated tokens, as plans/areal-1.5b-128-h800.toml derives its mean length."""
AREAL_STALENESS: tuple[tuple[int, float], ...] = (
    (0, 128.7e3),
    (1, 269.3e3),
    (2, 356.6e3),
    (4, 356.6e3),
    (8, 371.7e3),
)
"""Fig. 5c: generation throughput (tokens/s) at each eta (16 and unbounded: 382.4 and
396.8 k, which a run of a few steps cannot tell from 8)."""

COMPARISONS: tuple[Comparison, ...] = (
    *(
        Comparison(
            f"verl 7B colocated {r.gpus} vs {r.trainer_gpus}:{r.trainer_gpus}",
            str(r.plan_file.relative_to(ROOT)),
            r.sync_step,
            r.async_step,
            1,
            VERL,
            _verl_sync_basis(r),
            TRAIN_LAW_SAW,
            r.sync_gen,
        )
        for r in VERL_7B
    ),
    Comparison(
        "AReaL 1.5B sync 128 vs 96:32, eta 8",
        "plans/areal-1.5b-128-h800.toml",
        41.0 * 3600 / 250,
        14.8 * 3600 / 250,
        8,
        AREAL,
        (
            Basis.PREDICTED,
            "the decode law from engine figures (no RL row); training from verl's law scaled; "
            "the mean length from the async step and Fig. 5c, not from this step",
        ),
        (
            Basis.RESTATED,
            "the mean response length is Fig. 5c's eta-8 throughput times this step "
            "(371.7 k tokens/s x 213.1 s / 8,192)",
        ),
    ),
)
AREAL_DERIVED_ETA = 8
"""Fig. 5c's throughput at this eta is the async step's run read as tokens per second: the
same figure, counted with the step."""


def staleness_basis(eta: int) -> tuple[Basis, str]:
    """How Fig. 5c's throughput at ``eta`` is obtained (sim/timing/basis.py), and why."""
    if eta == AREAL_DERIVED_ETA:
        return Basis.RESTATED, "the async step's own run, read as tokens per second"
    return Basis.PREDICTED, (
        "the decode law from engine figures and the plan's mean length (from eta 8): "
        "nothing of this eta's"
    )


SKIP_COMMITS = 3
"""Steps left out of a steady step: the pipeline's fill (a fully-async run's first steps
train what the producer generated before the first commit, and come fast)."""


def steady_step(history: Sequence[object], skip: int = SKIP_COMMITS) -> float:
    """Seconds per step between the commit after the first ``skip`` and the last."""
    commits = [e.t for e in history if isinstance(e, StepCommitted)][skip:]
    if len(commits) < 2:
        raise ValueError(f"a steady step needs {skip + 2} committed steps")
    return (commits[-1] - commits[0]) / (len(commits) - 1)


def steady_generation(history: Sequence[object], skip: int = SKIP_COMMITS) -> float:
    """A sync run's generation phase, averaged over the steps ``steady_step`` spans: from the
    first group started after the previous commit to the step's start (train.py generates
    the whole batch, then trains it)."""
    spans: list[float] = []
    began: float | None = None
    for e in history:
        if isinstance(e, GroupStarted) and began is None:
            began = e.t
        elif isinstance(e, StepBegan) and began is not None:
            spans.append(e.t - began)
        elif isinstance(e, StepCommitted):
            began = None
    steady = spans[skip + 1 :]
    if not steady:
        raise ValueError(f"a steady generation needs {skip + 2} generated steps")
    return sum(steady) / len(steady)


@dataclass(frozen=True)
class ModeRun:
    """One point of a plan run to its steady step, and the oracles it failed."""

    plan: str
    mode: str
    bound: int
    step: float
    failed: tuple[str, ...]
    generation: float = 0.0
    """A sync run's steady generation phase (0 for the other modes)."""


def run_mode(plan: str, mode: str, bound: int, seed: int = 0, steps: int | None = None) -> ModeRun:
    """The plan's point of ``mode`` (sync: its only point; else at ``bound``), run for the
    plan's steps (or ``steps``)."""
    from sim.run import run_scenario

    for point in points(load_plan(str(ROOT / plan))):
        if point.scenario is None or point.settings["mode"] != mode:
            continue
        if mode != "sync" and point.settings["max_weight_staleness"] != bound:
            continue
        result = run_scenario(point.scenario, seed, steps)
        failed = tuple(name for name, v in result.verdicts.items() if v)
        history = list(result.history)
        generation = steady_generation(history) if mode == "sync" else 0.0
        return ModeRun(plan, mode, bound, steady_step(history), failed, generation)
    raise ValueError(f"{plan} has no {mode} point at bound {bound}")


def runs_needed() -> list[tuple[str, str, int]]:
    """Every (plan, mode, bound) the comparisons and AReaL's staleness curve run."""
    needed = []
    for c in COMPARISONS:
        needed += [(c.plan, "sync", 0), (c.plan, "fully_async", c.bound)]
    needed += [("plans/areal-1.5b-128-h800.toml", "fully_async", eta) for eta, _ in AREAL_STALENESS]
    return list(dict.fromkeys(needed))


def run_all(workers: int | None = None) -> dict[tuple[str, str, int], ModeRun]:
    """Every run needed, in parallel processes (each is a deterministic simulation)."""
    needed = runs_needed()
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        done = list(pool.map(run_mode, *zip(*needed, strict=True)))
    return {(r.plan, r.mode, 0 if r.mode == "sync" else r.bound): r for r in done}


@dataclass(frozen=True)
class SpeedupPrediction:
    row: str
    plan: str
    sync_step: float
    async_step: float
    published_sync_step: float
    published_async_step: float
    source: str
    failed: tuple[str, ...]
    """Oracles that failed either run (a prediction from a failed run is not one)."""
    sync_generation: float | None = None
    published_sync_generation: float | None = None
    """The sync step's generation phase, predicted and published (None: not published)."""

    @property
    def speedup(self) -> float:
        return self.sync_step / self.async_step

    @property
    def published_speedup(self) -> float:
        return self.published_sync_step / self.published_async_step

    @property
    def ratios(self) -> dict[str, float]:
        return {
            "sync step": self.sync_step / self.published_sync_step,
            "async step": self.async_step / self.published_async_step,
            "speedup": self.speedup / self.published_speedup,
        }


def speedups(runs: Mapping[tuple[str, str, int], ModeRun]) -> list[SpeedupPrediction]:
    out = []
    for c in COMPARISONS:
        sync, fast = runs[(c.plan, "sync", 0)], runs[(c.plan, "fully_async", c.bound)]
        failed = tuple(f"sync: {n}" for n in sync.failed) + tuple(
            f"fully_async: {n}" for n in fast.failed
        )
        out.append(
            SpeedupPrediction(
                c.row,
                c.plan,
                sync.step,
                fast.step,
                c.sync_step,
                c.async_step,
                c.source,
                failed,
                sync.generation if c.sync_generation is not None else None,
                c.sync_generation,
            )
        )
    return out


@dataclass(frozen=True)
class StalenessPrediction:
    eta: int
    published_tokens_per_second: float
    tokens_per_second: float
    failed: tuple[str, ...]

    @property
    def ratio(self) -> float:
        return self.tokens_per_second / self.published_tokens_per_second


def areal_staleness(runs: Mapping[tuple[str, str, int], ModeRun]) -> list[StalenessPrediction]:
    """Fig. 5c: the fully-async point's throughput at each eta."""
    plan = "plans/areal-1.5b-128-h800.toml"
    return [
        StalenessPrediction(
            eta,
            published,
            AREAL_TOKENS_PER_STEP / runs[(plan, "fully_async", eta)].step,
            runs[(plan, "fully_async", eta)].failed,
        )
        for eta, published in AREAL_STALENESS
    ]


def train_held_out() -> dict[int, float]:
    """Per verl size: the async trainer's step by a law fitted without that row, over the
    published update_actor."""
    return {
        r.gpus: fit_train_law(VERL_7B, leave_out=r.gpus).seconds(r.trainer_gpus)
        / r.async_update_actor
        for r in VERL_7B
    }


__all__ = [
    "AREAL",
    "AREAL_DERIVED_ETA",
    "COMPARISONS",
    "SYNC_GENERATION",
    "VERL",
    "VERL_7B",
    "Comparison",
    "ModeRun",
    "SpeedupPrediction",
    "StalenessPrediction",
    "TrainLaw",
    "VerlRow",
    "areal_staleness",
    "colocated_per_sample",
    "fit_train_law",
    "run_all",
    "run_mode",
    "speedups",
    "staleness_basis",
    "steady_generation",
    "steady_step",
    "train_held_out",
]
