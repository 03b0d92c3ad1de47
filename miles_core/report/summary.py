"""The end-of-run summary every CLI prints, simulated or real: what ran, how it ended, the
story, the faults, the verdicts. ``summary`` is the ``--json`` object; ``text_lines`` is
the same for a person."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from miles_core.events import (
    FaultInjected,
    FaultScheduled,
    FaultsHealed,
    FlushRefused,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    GroupTrained,
    History,
    LivenessArmed,
    RequestRetried,
    RunEnded,
    StepMetrics,
    TasksWaiting,
    UpdateBegan,
)
from miles_core.loop import RunReport
from miles_core.loop.config import FLAGS, MILES_BUGS
from miles_core.oracles import Violation, idle_faults, unfired_reason, verdict_lines
from miles_core.report.capacity import capacity_line, serving_capacity
from miles_core.report.story import step_stories, story_lines
from miles_core.report.waste import staleness_waste, waste_line
from miles_core.scenario import Scenario
from miles_core.segments import timeline

Clock = Literal["simulated", "wall"]
"""What a run's seconds are: the simulator's virtual time, or a real run's wall time."""


def world_and_flags(scenario: Scenario, history: History | None = None) -> dict[str, Any]:
    """The effective world and flags of a run (after --steps and the seed); the buckets per
    update as the run's updates had them, when it had any (a real model is not the
    scenario's)."""
    w, loop = scenario.world, scenario.loop
    began = next((e for e in history or () if isinstance(e, UpdateBegan)), None)
    return {
        "preset": scenario.preset,
        "cells": w.num_cells,
        "ranks_per_cell": w.gpus_per_cell,
        "engines": w.num_engines,
        "gpus_per_engine": w.gpus_per_engine,
        "mode": loop.mode,
        "miles_profile": loop.miles_profile.value,
        "steps": loop.steps,
        "rollout_batch_size": loop.rollout_batch_size,
        "n_samples_per_prompt": loop.n_samples_per_prompt,
        "max_weight_staleness": loop.max_weight_staleness,
        "unused_samples_handler": loop.unused_samples_handler.value,
        "staleness_policy": loop.staleness_policy.value,
        "transfer_mode": loop.transfer_mode.value,
        "buckets_per_update": began.n_buckets if began else scenario.n_buckets,
        "update_weight_buffer_size": loop.update_weight_buffer_size,
        "heartbeat_interval": loop.heartbeat_interval,
        "pause_generation_mode": loop.pause_generation_mode.value,
        "use_fault_tolerance": loop.use_fault_tolerance,
        "async_max_concurrent_samples": loop.async_max_concurrent_samples,
        "dynamic_sampling_filter": loop.dynamic_sampling_filter,
        "save_interval": loop.save_interval,
        "miles_bugs": [f for f in MILES_BUGS if getattr(loop, f)],
        "expect": scenario.expect.describe(),
    }


def step_metrics(history: History) -> list[dict[str, Any]]:
    """miles' rollout metrics, one row per committed step: {"step": k, name: value, ...}."""
    return [{"step": e.step, **dict(e.metrics)} for e in history if isinstance(e, StepMetrics)]


def faults_report(history: History) -> list[dict[str, Any]]:
    """Every scheduled fault: when it fired, or why it never did."""
    fired = {e.index: e for e in history if isinstance(e, FaultInjected)}
    healed = next((e for e in history if isinstance(e, FaultsHealed)), None)
    disarmed = set(healed.disarmed) if healed is not None else set()
    idle = idle_faults(history)
    out = []
    for e in history:
        if not isinstance(e, FaultScheduled):
            continue
        target = f"cell {e.cell}" if e.cell is not None else e.engine or "the world"
        row: dict[str, Any] = {"fault": e.fault.value, "target": target, "detail": e.detail}
        if e.index in fired:
            row["fired_at"] = fired[e.index].t
            if e.index in idle:
                row["idle"] = idle[e.index]
        elif e.index in disarmed:
            assert healed is not None
            row["never_fired"] = f"disarmed by the heal at t={healed.t:.6g}"
        else:
            row["never_fired"] = unfired_reason(e, history)
        out.append(row)
    return out


def liveness_report(history: History) -> dict[str, Any] | None:
    """Liveness mode: when the heal came and why, the deadline and how its bound was made."""
    healed = next((e for e in history if isinstance(e, FaultsHealed)), None)
    if healed is None:
        return None
    armed = next((e for e in history if isinstance(e, LivenessArmed)), None)
    why = (
        f"as step {healed.step} began"
        if healed.step is not None
        else "when no step had committed for the bound"
    )
    return {
        "healed_at": healed.t,
        "why": why,
        "deadline": armed.deadline if armed is not None else None,
        "steps": armed.steps if armed is not None else None,
        "bound": armed.bound if armed is not None else None,
    }


def waits_report(history: History) -> dict[str, Any] | None:
    """The wait-for graph recorded when the run stalled (None: it did not)."""
    waits = [e for e in history if isinstance(e, TasksWaiting)]
    if not waits:
        return None
    last = waits[-1]
    return {"reason": last.reason, "root": last.root, "waits": list(last.waits)}


UNVERSIONED = "none"
"""The staleness histogram's bucket for groups the trainer took before any version was
published: they have no staleness (the filter is off), which is not staleness 0."""


def staleness_histogram(history: History) -> dict[str, int]:
    """The staleness of each trained group, as the buffer judged it when the trainer took it:
    ``{"none": n, "0": n, "1": n, ...}`` (``none`` first, only when there are such groups);
    its counts add up to the groups trained."""
    taken: dict[int, int | None] = {}
    ages: Counter[int | None] = Counter()
    for e in history:  # in order: a killed job's next run counts its groups afresh
        if isinstance(e, GroupGot):
            taken[e.group_id] = e.staleness
        elif isinstance(e, GroupTrained):
            ages[taken.get(e.group_id)] += 1
    unversioned = ages.pop(None, 0)
    return ({UNVERSIONED: unversioned} if unversioned else {}) | {
        str(k): v for k, v in sorted(ages.items())
    }


def summary(
    scenario: Scenario,
    seed: int,
    history: History,
    report: RunReport,
    verdicts: dict[str, Violation | None],
    clock: Clock = "simulated",
) -> dict[str, Any]:
    """The --json object of a run; ``clock`` says what its seconds are: the simulator's
    virtual time, or the wall time of a real run."""
    kept, _ = timeline(history)  # a job killed whole: what it kept (its lost tails not)
    recycled = Counter(e.reason for e in kept if isinstance(e, GroupRecycled))
    dropped = Counter(e.reason for e in kept if isinstance(e, GroupDropped))
    end = next((e for e in history if isinstance(e, RunEnded)), None)
    return {
        "scenario": scenario.name,
        "seed": seed,
        "world": world_and_flags(scenario, history),
        "status": report.status.value,
        "reason": report.reason,
        "error": end.error if end else None,
        "traceback": report.traceback or None,
        "steps": report.steps_done,
        "final_version": report.versions[-1] if report.versions else None,
        "versions": report.versions,
        "seconds": history[len(history) - 1].t if len(history) else 0.0,
        "clock": clock,
        "groups_trained": sum(isinstance(e, GroupTrained) for e in kept),
        "groups_recycled": dict(sorted(recycled.items())),
        "groups_dropped": dict(sorted(dropped.items())),
        "requests_retried": sum(isinstance(e, RequestRetried) for e in history),
        "flushes_refused": sum(isinstance(e, FlushRefused) for e in history),
        "staleness_histogram": staleness_histogram(kept),
        "staleness_waste": staleness_waste(kept),
        "serving_capacity": serving_capacity(history),
        "faults": faults_report(history),
        "liveness": liveness_report(history),
        "waits": waits_report(history),
        "story": [s.to_dict() for s in step_stories(history)],
        "metrics": step_metrics(history),
        "oracles": {k: "pass" if v is None else "fail" for k, v in verdicts.items()},
        "violations": {k: str(v) for k, v in verdicts.items() if v is not None},
        "history_hash": history.hash(),
    }


def text_lines(
    info: dict[str, Any], history: History, verdicts: dict[str, Violation | None]
) -> list[str]:
    """The summary for a person: the world, the ending, the story, the faults, the verdicts."""
    w = info["world"]
    bound = w["max_weight_staleness"]
    done, asked = info["steps"], w["steps"]
    until = "liveness was met" if info.get("liveness") else "every fault was witnessed"
    steps = (
        f"{done} steps ({asked} asked, then until {until})"
        if done > asked
        else f"{done}/{asked} steps"
    )
    lines = [
        f"{info['scenario']} seed={info['seed']}: {steps}, "
        f"{info['status']} (expected: {w['expect']}), "
        f"{info['seconds']:.1f} s {info['clock']} time",
        f"  world: {w['cells']} cells x {w['ranks_per_cell']} rank(s), {w['engines']} engine(s) "
        f"x {w['gpus_per_engine']} GPU(s) (preset {w['preset']}), miles "
        f"{w.get('miles_profile', 'aug2026')}",
        f"  flags: {w['mode']}, batch {w['rollout_batch_size']} x {w['n_samples_per_prompt']} "
        f"samples, staleness bound {'off' if bound is None else bound}"
        + (
            f" ({w['staleness_policy']})"
            if w.get("staleness_policy", "drop_at_buffer") != "drop_at_buffer"
            else ""
        )
        + ", unused groups "
        f"{w['unused_samples_handler']}, {w['transfer_mode']} in {w['buckets_per_update']} "
        f"buckets, heartbeats {'off' if w['heartbeat_interval'] is None else 'on'}, pause "
        f"{w['pause_generation_mode']}, engine fault tolerance "
        f"{'on' if w['use_fault_tolerance'] else 'off'}"
        + (
            f", {w['async_max_concurrent_samples']} concurrent samples"
            if w["async_max_concurrent_samples"] is not None
            else ""
        )
        + (f", filter {w['dynamic_sampling_filter']}" if w["dynamic_sampling_filter"] else "")
        + (f", a save every {w['save_interval']} step(s)" if w.get("save_interval") else "")
        + "".join(f", {FLAGS[bug]}" for bug in w.get("miles_bugs", ())),
    ]
    if info["status"] != "completed":
        lines.append(f"  ended by: {info['reason']}")
    lines += story_lines(step_stories(history))
    if not info["faults"]:
        lines.append("  faults: none scheduled")
    for fault in info["faults"]:
        when = (
            f"fired at t={fault['fired_at']:.2f}"
            if "fired_at" in fault
            else f"never fired: {fault['never_fired']}"
        )
        if "idle" in fault:
            when += f"; its window met nothing to act on: {fault['idle']}"
        lines.append(f"  fault {fault['fault']} {fault['target']} ({fault['detail']}): {when}")
    live = info.get("liveness")
    if live is not None:
        lines.append(
            f"  liveness: every fault healed at t={live['healed_at']:.2f} ({live['why']}); "
            f"{live['steps']} steps and every engine current by t={live['deadline']:.2f} "
            f"(bound {live['bound']})"
            if live["deadline"] is not None
            else f"  liveness: every fault healed at t={live['healed_at']:.2f} ({live['why']})"
        )
    waits = info.get("waits")
    if waits is not None:
        lines.append(f"  wait-for graph when the run stopped: root {waits['root']}")
        lines += [f"    {line}" for line in waits["waits"]]
    lines.append(f"  version sequence: {info['versions']}")
    lines.append(
        f"  groups: {info['groups_trained']} trained, recycled {info['groups_recycled']}, "
        f"dropped {info['groups_dropped']}; staleness of trained groups "
        f"{info['staleness_histogram']}"
    )
    waste = waste_line(info["staleness_waste"]) if "staleness_waste" in info else None
    if waste is not None:
        lines.append(waste)
    capacity = capacity_line(info["serving_capacity"]) if "serving_capacity" in info else None
    if capacity is not None:
        lines.append(capacity)
    if info["requests_retried"] or info["flushes_refused"]:  # what a router outage cost
        lines.append(
            f"  retried: {info['requests_retried']} request tries the router failed, "
            f"{info['flushes_refused']} refused cache flushes"
        )
    lines += verdict_lines(verdicts)
    lines.append(f"  history hash: {info['history_hash']}")
    return lines
