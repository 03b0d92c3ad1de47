"""Fit the simulator's time model to a real run's history, and check it on another run.

    python -m backends.cpu run --scenario scenarios/timing/fit.toml --history fit.jsonl
    python -m backends.cpu run --scenario scenarios/timing/check.toml --history check.jsonl
    python -m sim calibrate --history fit.jsonl --scenario scenarios/timing/fit.toml \\
        --check check.jsonl --check-scenario scenarios/timing/check.toml [--out timing.json]

The history is what the world measured (events record what happened): each cell's
forward/backward (CellTrained.seconds), each bucket's send (BucketReceived.seconds and
bytes), each update from its start to its publication, each engine restart from the fault
to the new process answering, each request from its send to its answer, and each
weight-update group the world made as a cell (re)connected (UpdateGroupMade.seconds, where
the history has any: ``group_make_seconds`` and, where groups of several sizes were made,
``group_make_seconds_per_engine``; an update's time beyond its sends leaves them out, as the
simulator charges them apart from ``update_fixed_seconds``). Every TimeModel
figure the run shows is fitted from them (``fit_timing``, which says how for each); the
rest keep the scenario's. The check runs the *other* scenario in the simulator with the
fitted figures and the same seed, and sets the figures its history shows (``figures``)
beside the real run's: step time, update time, restart-to-serving.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from miles_core.errors import ConfigError
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    BucketReceived,
    CellTrained,
    EngineStarted,
    FaultInjected,
    History,
    ModelDescribed,
    SampleGenerated,
    StepCommitted,
    UpdateBegan,
    UpdateGroupMade,
    VersionPublished,
)
from miles_core.kinds import FaultKind
from miles_core.scenario import Scenario, TimeModel
from miles_core.user_files import HISTORY_BYTES, read_user_text
from sim.timing.basis import within

TARGET = 1.25
"""The check's target: each figure within a factor of 1.25 of the real run's, either way
(0.8 to 1.25: sim/timing/basis.py)."""
FITTED_FIELDS = (
    "train_step_seconds",
    "train_jitter",
    "allreduce_seconds",
    "link_latency_seconds",
    "link_bytes_per_second",
    "nvlink_bytes_per_second",
    "update_fixed_seconds",
    "group_make_seconds",
    "group_make_seconds_per_engine",
    "engine_start_seconds",
    "decode_seconds_per_token",
    "prefill_seconds_per_token",
    "response_tokens_sigma",
    "concurrency_slowdown",
)


@dataclass(frozen=True)
class RunFigures:
    """What a history shows of time (None: the run had none of it)."""

    step_seconds: float | None
    """Mean time from one step's commit to the next."""
    update_seconds: float | None
    """Mean publishing update, from its start to its version's publication."""
    restart_to_serving: float | None
    """Mean time from an engine restart's fault to the new process answering."""


def read_history(path: str, flag: str = "--history") -> History:
    text = read_user_text(path, flag, HISTORY_BYTES, "a file --history wrote")
    lines = text.splitlines()
    try:
        return History.from_dicts(json.loads(line) for line in lines if line.strip())
    except (json.JSONDecodeError, TypeError) as error:
        raise ConfigError(
            flag, f"{path} is not a history ({error})", "pass --history's file"
        ) from None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def update_spans(history: History) -> dict[int, tuple[float, float]]:
    """Each publishing update's (start, publication)."""
    began = {e.update_id: e.t for e in _of(history, UpdateBegan) if e.publishes}
    return {e.update_id: (began[e.update_id], e.t) for e in _of(history, VersionPublished)}


def restarts(history: History) -> list[float]:
    """Each restart_engine fault's time to its engine's next process answering."""
    out = []
    started = _of(history, EngineStarted)
    for fault in _of(history, FaultInjected):
        if fault.fault is FaultKind.RESTART_ENGINE:
            later = [e.t for e in started if e.engine == fault.engine and e.t >= fault.t]
            if later:
                out.append(min(later) - fault.t)
    return out


def figures(history: History) -> RunFigures:
    commits = sorted(e.t for e in _of(history, StepCommitted))
    steps = [b - a for a, b in itertools.pairwise(commits)]
    updates = [b - a for a, b in update_spans(history).values()]
    return RunFigures(_mean(steps), _mean(updates), _mean(restarts(history)))


def _bucket_fit(histories: Sequence[History]) -> tuple[float, float, int]:
    """(latency, bytes per second, sends) of the bucket sends: least squares of the median
    seconds of each size a run sent (a median: a send the collector or the scheduler held
    up is one of many) against its bytes when the sizes differ, else all of it as
    bandwidth."""
    from sim.timing.calibration import least_squares

    by_size: dict[tuple[int, int], list[float]] = defaultdict(list)
    for i, history in enumerate(histories):
        for b in _of(history, BucketReceived):
            if b.seconds > 0:
                by_size[(i, b.nbytes)].append(b.seconds)
    sends = sum(len(v) for v in by_size.values())
    points = [(1, n, statistics.median(v)) for (_, n), v in sorted(by_size.items())]
    if len({n for _, n, _ in points}) > 1:
        try:
            fit = least_squares(points)
        except ConfigError:
            fit = None
        if fit is not None and not fit.clamped:
            return fit.latency_seconds, fit.bytes_per_second, sends
    # no slope to see (a send's time does not grow with its bytes here, or one size only):
    # the better of all latency (at a rate too high to matter) and all bandwidth
    seconds = [t for _, _, t in points]
    latency = statistics.fmean(seconds)
    rate = sum(n for _, n, _ in points) / sum(seconds)
    all_latency = sum((t - latency) ** 2 for t in seconds)
    all_bandwidth = sum((t - n / rate) ** 2 for _, n, t in points)
    if all_latency < all_bandwidth:
        return latency, 1e15, sends
    return 0.0, rate, sends


def _update_overheads(history: History) -> list[float]:
    """Each publishing update's time beyond its buckets' sends and the making of its
    groups: the pause and the other control calls, the gather before each send."""
    sent: dict[int, float] = defaultdict(float)
    for b in _of(history, BucketReceived):
        sent[b.update_id] += b.seconds
    for g in _of(history, UpdateGroupMade):
        sent[g.update_id] += g.seconds
    return [end - start - sent[u] for u, (start, end) in update_spans(history).items()]


def _group_fit(made: Sequence[UpdateGroupMade]) -> tuple[float, float, str]:
    """(fixed, per engine, how) of the groups' making: least squares of the median seconds
    of each group size against its engines where the sizes differ (a median: one making the
    scheduler held up is one of several), else the median of all as the fixed cost."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for g in made:
        by_size[len(g.engines)].append(g.seconds)
    points = [(n, statistics.median(v)) for n, v in sorted(by_size.items())]
    if len(points) > 1:
        mean_n = statistics.fmean(n for n, _ in points)
        mean_t = statistics.fmean(t for _, t in points)
        sxx = sum((n - mean_n) ** 2 for n, _ in points)
        slope = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in points) / sxx)
        fixed = max(0.0, mean_t - slope * mean_n)
        return fixed, slope, f"{len(made)} groups made, median seconds against engines"
    how = f"median of {len(made)} groups made (one size: no per-engine cost to see)"
    return statistics.median(g.seconds for g in made), 0.0, how


def _attempt_overheads(histories: Sequence[History]) -> list[float]:
    """Each attempt's time beyond its slowest cell's forward/backward: the exchange (and
    the rest of the attempt's bookkeeping)."""
    spans = []
    for history in histories:
        began = {(e.step, e.attempt): e.t for e in _of(history, AttemptBegan)}
        slowest: dict[tuple[int, int], float] = defaultdict(float)
        for e in _of(history, CellTrained):
            key = (e.step, e.attempt)
            slowest[key] = max(slowest[key], e.seconds)
        spans += [
            e.t - began[(e.step, e.attempt)] - slowest[(e.step, e.attempt)]
            for e in _of(history, AttemptEnded)
            if (e.step, e.attempt) in began and (e.step, e.attempt) in slowest
        ]
    return spans or [1e-3]


def _requests(history: History) -> list[SampleGenerated]:
    return [e for e in _of(history, SampleGenerated) if not e.aborted and e.t > e.sent]


def _in_flight(requests: list[SampleGenerated]) -> float:
    """Mean requests in flight on a request's engine while it ran (itself included)."""
    by_engine: dict[str, list[SampleGenerated]] = defaultdict(list)
    for r in requests:
        by_engine[r.engine].append(r)
    counts = []
    for r in requests:
        others = by_engine[r.engine]
        counts.append(sum(1 for o in others if o.sent < r.t and o.t > r.sent))
    return statistics.fmean(counts) if counts else 1.0


def fit_timing(
    histories: Sequence[History], scenario: Scenario
) -> tuple[TimeModel, dict[str, str]]:
    """The scenario's time model with every figure the histories show fitted (pooled over
    them), and how."""
    base, how = scenario.timing, {}
    fitted: dict[str, float] = {}
    trained = [e.seconds for h in histories for e in _of(h, CellTrained)]
    if trained:
        mean = statistics.fmean(trained)
        fitted["train_step_seconds"] = mean
        fitted["train_jitter"] = min(0.5, (max(trained) - min(trained)) / (2 * mean))
        how["train_step_seconds"] = f"mean of {len(trained)} cells' forward/backward"
        how["train_jitter"] = "their spread, as a fraction of the mean (at most 0.5)"
        fitted["allreduce_seconds"] = max(1e-3, statistics.fmean(_attempt_overheads(histories)))
        how["allreduce_seconds"] = "mean attempt span beyond its slowest forward/backward"
    if any(_of(h, BucketReceived) for h in histories):
        latency, rate, sends = _bucket_fit(histories)
        fitted |= {"link_latency_seconds": latency, "link_bytes_per_second": rate}
        fitted["nvlink_bytes_per_second"] = rate  # one machine: one wire
        how["link_bytes_per_second"] = f"{sends} bucket sends, median seconds against bytes"
        how["link_latency_seconds"] = how["nvlink_bytes_per_second"] = "the same fit"
        fixed = [x for h in histories for x in _update_overheads(h)]
        if fixed:
            fitted["update_fixed_seconds"] = max(0.0, statistics.median(fixed))
            how["update_fixed_seconds"] = f"median of {len(fixed)} updates' time beyond sends"
    made = [g for h in histories for g in _of(h, UpdateGroupMade)]
    if made:
        group_fixed, per_engine, how["group_make_seconds"] = _group_fit(made)
        fitted |= {"group_make_seconds": group_fixed, "group_make_seconds_per_engine": per_engine}
        how["group_make_seconds_per_engine"] = "the same fit"
    started = [x for h in histories for x in restarts(h)]
    if started:
        fitted["engine_start_seconds"] = statistics.fmean(started)
        how["engine_start_seconds"] = f"{len(started)} restarts, fault to answering"
    fitted |= _generation_fit(histories, base, how)
    return dataclasses.replace(base, **fitted), how


def _generation_fit(
    histories: Sequence[History], base: TimeModel, how: dict[str, str]
) -> dict[str, float]:
    """A request's time, as the simulator draws it: a lognormal response length (mean
    response_tokens_mean) times the token time, slowed by concurrency_slowdown per request
    in flight on its engine."""
    requests = [r for h in histories for r in _requests(h)]
    if len(requests) < 2:
        return {}
    durations = [r.t - r.sent for r in requests]
    logs = [math.log(d) for d in durations]
    crowd = statistics.fmean(_in_flight(_requests(h)) for h in histories if _requests(h))
    per_token = statistics.fmean(durations) / (
        base.response_tokens_mean * (1 + base.concurrency_slowdown * crowd)
    )
    how["response_tokens_sigma"] = "spread of the requests' log time"
    how["prefill_seconds_per_token"] = "the scenario's ratio to the token time, kept"
    how["decode_seconds_per_token"] = (
        f"{len(requests)} requests' mean time at {crowd:.1f} in flight"
    )
    return {
        "response_tokens_sigma": min(1.5, max(0.05, statistics.pstdev(logs))),
        "decode_seconds_per_token": per_token,
        # a retracted request's recompute: no history tells it apart from decoding
        "prefill_seconds_per_token": per_token
        * base.prefill_seconds_per_token
        / base.decode_seconds_per_token,
    }


def model_units(history: History) -> tuple[int, ...] | None:
    """The world's model as its updates send it (ModelDescribed): a real world's model is its
    own, not the scenario's."""
    described = _of(history, ModelDescribed)
    return described[0].unit_bytes if described else None


def check(
    scenario: Scenario, timing: TimeModel, seed: int, units: tuple[int, ...] | None
) -> History:
    """The scenario in the simulator with the fitted figures and the fitted run's model
    (``units``), cut into buckets as a real world cuts it: as many as the scenario's own
    model takes, of equal budget (backends/common/world/cluster.py ``buffer_size_for``)."""
    from sim.run import run_scenario

    if units:
        budget = math.ceil(sum(units) / max(1, scenario.n_buckets))
        world = dataclasses.replace(scenario.world, unit_bytes=units, param_bytes=sum(units))
        loop = dataclasses.replace(scenario.loop, update_weight_buffer_size=budget)
        scenario = dataclasses.replace(scenario, world=world, loop=loop)
    return run_scenario(dataclasses.replace(scenario, timing=timing), seed).history


def compare(real: RunFigures, predicted: RunFigures) -> list[dict[str, Any]]:
    rows = []
    for name in ("step_seconds", "update_seconds", "restart_to_serving"):
        r, p = getattr(real, name), getattr(predicted, name)
        ratio = p / r if r and p is not None else (1.0 if r == p == 0 else None)
        met = ratio is not None and within(ratio, TARGET)
        rows.append({"figure": name, "real": r, "predicted": p, "ratio": ratio, "within": met})
    return rows


def timing_json(
    timing: TimeModel, how: Mapping[str, str], units: tuple[int, ...] | None
) -> dict[str, Any]:
    return {
        "timing": {k: getattr(timing, k) for k in FITTED_FIELDS},
        "how": dict(how),
        "model_unit_bytes": list(units or ()),
    }


__all__ = [
    "RunFigures",
    "check",
    "compare",
    "figures",
    "fit_timing",
    "model_units",
    "read_history",
    "timing_json",
]
