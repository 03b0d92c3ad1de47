"""Liveness mode: faults for a span, then everything healed; the run must then make progress.

TigerBeetle's simulator asks this of every cluster it breaks: once the faults stop and the
broken parts are repaired, does the system recover by itself, within a bound? Here the
heal comes as step ``heal_step`` begins (a step, not a time: the real worlds' clocks
include start-up, so a step means the same moment in every world). The fault schedule
then disarms every fault that has not fired, and the world restarts every engine process
that is dead or hung, ends every impairment and starts every dead cell. From that moment
the run must commit ``steps`` more steps and bring every engine to the newest version
within the bound below, which is computed from the configuration alone (so it is the same
in every world that runs the scenario, and printed with the verdict).

The bound is generous on purpose (``slack`` times the nominal time): a liveness failure
must mean a hang, never a slow seed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from miles_core.errors import ConfigError
from miles_core.kinds import FaultPoint
from miles_core.loop.config import LoopConfig
from miles_core.scenario.world import TimeModel, WorldShape

P99_Z = 2.33
"""A lognormal response's 99th percentile is exp(mu + 2.33 sigma)."""


@dataclass(frozen=True)
class Liveness:
    """``liveness = { heal_step = 6, steps = 3 }`` in a scenario file."""

    heal_step: int
    """Every fault is healed as this step (counted from 0) begins."""
    steps: int = 3
    """Steps that must commit after the heal, within the bound."""
    slack: float = 3.0
    """The bound is this many times the nominal time of what must happen after the heal."""
    heal_point: FaultPoint = FaultPoint.STEP_BEGIN
    """Where the heal strikes once step ``heal_step`` has begun: as it begins, or
    ``after_bucket``: as the first bucket of an update (or an engine's sync) arrives from
    then on, so the heal meets an update in flight (restarting a hung engine of it)."""

    def __post_init__(self) -> None:
        for name, low in (("heal_step", 0), ("steps", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"liveness.{name}", f"got {value!r}", f"pass an integer >= {low}")
        slack = self.slack
        if not (isinstance(slack, int | float) and not isinstance(slack, bool)) or not (
            math.isfinite(slack) and slack >= 1
        ):
            raise ConfigError("liveness.slack", f"got {slack!r}", "pass a finite number >= 1")
        if self.heal_point not in HEAL_POINTS:
            raise ConfigError(
                "liveness.heal_point",
                f"got {self.heal_point!r}",
                f"pass one of {', '.join(p.value for p in HEAL_POINTS)}",
            )


HEAL_POINTS = (FaultPoint.STEP_BEGIN, FaultPoint.AFTER_BUCKET)
"""Where a heal may strike: points every world fires whatever the scenario's faults."""


@dataclass(frozen=True)
class LivenessBound:
    """The bound and the terms it is made of (seconds), to print beside the verdict."""

    terms: tuple[tuple[str, float], ...]
    slack: float

    @property
    def seconds(self) -> float:
        return self.slack * sum(seconds for _, seconds in self.terms)

    def describe(self) -> str:
        terms = " + ".join(f"{name} {seconds:.3g} s" for name, seconds in self.terms)
        return f"{self.seconds:.1f} s = {self.slack:g} x ({terms})"


@dataclass(frozen=True)
class LengthQuantiles:
    """A response length distribution's p50, p99 and max tokens (max: inf with no cap)."""

    p50: float
    p99: float
    max: float


def response_tokens_quantile(timing: TimeModel, q: float) -> float:
    """The ``q`` quantile of a response's length as the simulator draws it: lognormal (mean
    response_tokens_mean, sigma response_tokens_sigma) cut at response_tokens_max, with
    response_tokens_max_fraction of responses run to response_tokens_max."""
    if not 0 < q < 1:
        raise ValueError(f"a quantile is in (0, 1), got {q!r}")
    cap = timing.response_tokens_max or math.inf
    lognormal = 1 - timing.response_tokens_max_fraction  # the share drawn from the lognormal
    if q >= lognormal:
        return cap
    sigma = timing.response_tokens_sigma
    mu = math.log(timing.response_tokens_mean) - sigma**2 / 2
    return min(cap, math.exp(mu + sigma * statistics.NormalDist().inv_cdf(q / lognormal)))


def response_length_quantiles(timing: TimeModel) -> LengthQuantiles:
    """p50, p99 and max of a response's length (docs/generation.md states them)."""
    return LengthQuantiles(
        response_tokens_quantile(timing, 0.5),
        response_tokens_quantile(timing, 0.99),
        timing.response_tokens_max or math.inf,
    )


def _p99_tokens(timing: TimeModel) -> float:
    """A response's p99 length: P99_Z's lognormal p99 (kept as it was, so bounds stay put),
    or the exact quantile once a share of responses runs to the cap."""
    if timing.response_tokens_max_fraction:
        return response_tokens_quantile(timing, 0.99)
    sigma = timing.response_tokens_sigma
    p99_tokens = timing.response_tokens_mean * math.exp(P99_Z * sigma - sigma**2 / 2)
    if timing.response_tokens_max:  # the engines stop a response there
        p99_tokens = min(p99_tokens, timing.response_tokens_max)
    return p99_tokens


def _engine_rollout(timing: TimeModel, per_engine: int, token_floor: float) -> float:
    """One engine's share of a step's batch with the generation model switched on (a cap on
    running requests, the decode law, every prefill charged): the requests run in waves of
    at most the cap, each as long as a p99 request with the wave's batch decoding beside it
    and its prefill. FIFO admission ends request j by (floor((j - 1) / cap) + 1) of those,
    so ceil(per_engine / cap) waves bound the share."""
    p99 = _p99_tokens(timing)
    cap = timing.running_cap() or per_engine
    running = min(cap, per_engine)
    waves = math.ceil(per_engine / running)
    if timing.batch_law():
        longest = timing.response_tokens_max or p99
        step = (
            timing.decode_step_fixed_seconds
            + timing.decode_step_seconds_per_request * running
            + timing.decode_step_seconds_per_kv_token * running * (timing.prompt_tokens + longest)
        )
        wave = p99 * max(step, token_floor)
    else:
        token = max(timing.decode_seconds_per_token, token_floor)
        wave = p99 * token * (1 + timing.concurrency_slowdown * running)
    if timing.charge_every_prefill:
        wave += timing.prompt_tokens * timing.prefill_seconds_per_token
    return waves * wave


def step_parts(world: WorldShape, timing: TimeModel, loop: LoopConfig) -> dict[str, float]:
    """One step's nominal parts: its batch generated (p99 lengths, the engines' concurrency
    or the generation model's waves, the dynamic filter's refills), trained, exchanged, and
    the weights sent and stamped."""
    p99_tokens = _p99_tokens(timing)
    samples = loop.rollout_batch_size * loop.n_samples_per_prompt
    per_engine = math.ceil(samples / world.num_engines)
    if timing.running_cap() or timing.batch_law() or timing.charge_every_prefill:
        rollout = _engine_rollout(timing, per_engine, world.engine_token_seconds)
    else:  # today's law, as it always was
        decode = p99_tokens * max(timing.decode_seconds_per_token, world.engine_token_seconds)
        rollout = decode * (1 + timing.concurrency_slowdown * per_engine)
    if loop.dynamic_sampling_filter is not None:
        rollout *= 4  # 0/1 rewards: a group is kept about half the time, often less
    prefill = (timing.prompt_tokens + p99_tokens) * timing.prefill_seconds_per_token
    wire = world.param_bytes / min(timing.link_bytes_per_second, timing.nvlink_bytes_per_second)
    calls = 8 * timing.control_reply_seconds + 16 * timing.link_latency_seconds
    return {
        "rollout": rollout + prefill,
        "train": (timing.train_step_seconds + timing.train_fixed_seconds)
        * (1 + timing.train_jitter)
        + timing.allreduce_seconds,
        "update": wire * max(1, world.num_engines) + calls,
    }


def liveness_bound(
    world: WorldShape,
    timing: TimeModel,
    loop: LoopConfig,
    liveness: Liveness,
    slow_start: float = 0.0,
) -> LivenessBound:
    """How long the healed run may take to commit ``liveness.steps`` steps and bring every
    engine to the newest version: detection (a heartbeat's misses, a health check's
    interval and timeout), an engine's start (plus ``slow_start``, the longest a slow_start
    fault adds: a start begun before the heal keeps its pace), a heal's checkpoint per
    cell, the first sync of each restarted engine, and the steps themselves (plus one, for
    the step in flight)."""
    terms: list[tuple[str, float]] = []
    if loop.heartbeat_interval is not None:
        detect = loop.heartbeat_interval * loop.heartbeat_failure_threshold
        terms.append(("heartbeat detection", detect + loop.heartbeat_timeout))
    if loop.use_fault_tolerance:
        health = loop.rollout_health_check_interval + loop.rollout_health_check_timeout
        terms.append(("health detection", health))
    terms.append(("engine start", timing.engine_start_seconds))
    if slow_start:
        terms.append(("slow start", slow_start))
    checkpoint = 3 * world.param_bytes / timing.checkpoint_bytes_per_second
    terms.append((f"heal {world.num_cells} cell(s)", checkpoint * world.num_cells))
    step = step_parts(world, timing, loop)
    terms.append(("sync restarted engines", step["update"]))
    for part, seconds in step.items():
        terms.append((f"{liveness.steps + 1} x {part}", (liveness.steps + 1) * seconds))
    return LivenessBound(tuple(terms), liveness.slack)
