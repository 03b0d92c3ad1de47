"""``python -m backends.cpu soak --minutes N --seed S [--out FILE.json]``: training on the real
CPU backend (the stack ``run`` uses: Ray, torch FSDP2 trainers, HTTP engines, gloo) for about
N minutes, with faults drawn from the seed (draw.py), the history judged as it goes
(tracker.py), every process of the session sampled (sample.py), one line per fault and a
summary (report.py). Exit 1 when an oracle fails or a process outlives Ray, with the replay
line; 2 on a wrong flag.

One long run with its faults scheduled through it, not consecutive runs of one fault each:
the loop takes any number of steps and a fault schedule, and a leak shows only in processes
that live on: consecutive runs would start every actor afresh (tens of seconds of torch
imports each) and reset what the soak is there to watch. The run's length is minutes turned
into steps at this machine's pace (draw.SECONDS_PER_STEP): a slower machine soaks longer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

from backends.common.run.ray_run import TRAIN, layout_of, run_in_ray
from backends.common.session.process_tree import alive
from backends.common.session.ray_session import ray_session, session_processes
from backends.cpu.soak.draw import SECONDS_PER_STEP, Shape, draw_motifs, schedule, steps_for
from backends.cpu.soak.held import bytes_per_event
from backends.cpu.soak.report import Verdict, growths, history_growth, summary_lines, to_json
from backends.cpu.soak.sample import PROC, Sampler
from backends.cpu.soak.tracker import Tracker
from miles_core.errors import ConfigError
from miles_core.scenario import Scenario

MAX_MINUTES = 24 * 60.0
LEFT_GRACE_S = 5.0
"""How long processes get to end after Ray shut down before they count as left."""


def soak_scenario(minutes: float, seed: int) -> Scenario:
    """TRAIN's world with fault tolerance (hangs and orphans are undone by its health checks),
    heartbeats detected in 15 s, a 15 s collective timeout, and the drawn faults.

    Under the today profile an engine is healed by the mini FT controller (poll and resume
    delay 2 s here, as the health checks are 2 s: miles' 10 s defaults would outlast an engine
    motif's 40 s of settling), and a hang met by an update (steps of 0.3 s: nearly always; the
    checker is paused by it, as miles' ``start_update_weights`` pauses it) is given up by the
    update's --update-weight-engine-request-timeout, 10 s here rather than miles' 300 s
    (docs/miles.md, "the rollout side's health"). aug2026 reads neither."""
    steps = steps_for(minutes)
    motifs = draw_motifs(seed, steps, Shape(TRAIN.world.num_cells, TRAIN.world.num_engines))
    loop = dataclasses.replace(
        TRAIN.loop,
        steps=steps,
        use_fault_tolerance=True,
        rollout_health_check_interval=2.0,
        rollout_health_check_timeout=5.0,
        heartbeat_failure_threshold=2,
        update_weight_collective_timeout=15.0,
        update_weight_engine_request_timeout=10.0,
        mini_ft_controller_poll_interval=2.0,
        mini_ft_controller_resume_delay=2.0,
    )
    extra = math.ceil(120.0 / SECONDS_PER_STEP)  # two minutes for the last recovery
    return dataclasses.replace(
        TRAIN,
        name="soak",
        description=f"soak: {len(motifs)} drawn fault forms over {steps} steps",
        loop=loop,
        faults=schedule(motifs),
        until_witnessed=steps + extra,
    )


def replay(minutes: float, seed: int) -> str:
    return f"python -m backends.cpu soak --minutes {minutes:g} --seed {seed}"


def _title(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80]


def _left(seen: set) -> tuple[str, ...]:  # type: ignore[type-arg]
    deadline = time.monotonic() + LEFT_GRACE_S
    left = {p for p in seen if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if alive(p)}
    return tuple(f"pid {p.pid}: {_title(p.pid)}" for p in sorted(left, key=lambda p: p.pid))


def run_soak(args: argparse.Namespace) -> int:
    if not 0 < args.minutes <= MAX_MINUTES:
        raise ConfigError("--minutes", f"got {args.minutes:g}", f"pass 0 < N <= {MAX_MINUTES:g}")
    if not args.sample_seconds > 0:
        raise ConfigError("--sample-seconds", f"got {args.sample_seconds:g}", "pass seconds > 0")
    scenario = soak_scenario(args.minutes, args.seed)
    steps = scenario.loop.steps
    print(f"soak: seed {args.seed}, {steps} steps, {len(scenario.faults)} faults drawn")
    tracker = Tracker(say=lambda text: print(text, flush=True))
    sampler = Sampler(session_processes, args.sample_seconds, lambda: len(tracker.history))
    began = time.monotonic()
    timeout = max(600.0, 10 * args.minutes * 60.0)
    with ray_session(layout_of(scenario).total_gpus, show_start=True):
        sampler.start()
        try:
            result = run_in_ray(
                scenario, args.seed, timeout=timeout, observers=[tracker], history=tracker.history
            )
        finally:
            samples = sampler.stop()
    left = _left(sampler.seen)
    minutes = (time.monotonic() - began) / 60.0
    running_from = sampler.since_start(tracker.first_step_at or began)
    indexed = tracker.indexed_per_event  # the run's judging at the end dropped the index
    per_event = bytes_per_event(list(tracker.history)) + indexed
    verdict = Verdict(
        faults=tuple(tracker.finish()),
        oracles={name: None if v is None else str(v) for name, v in result.verdicts.items()},
        failures_as_it_went=tuple(tracker.failures),
        left=left,
        growth=growths(samples, running_from),
        status=result.report.status.value,
        history=history_growth(samples, per_event, running_from),
        bytes_per_event=per_event,
        indexed_per_event=indexed,
    )
    print("\n".join(summary_lines(verdict, minutes, result.report.steps_done)))
    print(f"  samples: {len(samples)}, judged as it went: {tracker.judged} time(s)")
    if args.out is not None:
        data = to_json(verdict, minutes, result.report.steps_done, args.seed)
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if not verdict.ok:
        print(f"replay: {replay(args.minutes, args.seed)}", file=sys.stderr)
    return verdict.exit_code
