"""The oracles: functions over one event history, from any world, that judge a run.

Each reads only the history, recomputes what it checks from what the world
reported (staleness from the samples' versions, an attempt's verdict from the
cells' own reports, a bucket's arrival from the transport), and returns the
first violation with the events that prove it, or None.

    end_state             the run ended as its scenario expects (completed, or failed with
                          a named error); a crash or a stall never passes
    monotonic_versions    versions never go backwards: published, per engine, at the consumer
    bounded_staleness     every trained group has 0 <= staleness <= bound; under
                          --staleness-policy gate_submission none is refused as stale
    cached_kv_fresh       no trained sample reused prompt KV (an engine's prefix cache) from
                          weights older than the staleness bound allows
    exactly_once          each prompt is trained at most once; at the end each drawn prompt
                          is trained, dropped or outstanding
    resume                a job killed whole goes on from its newest committed save (never a
                          torn one): versions go on from the save's without a gap or a repeat,
                          steps from the save's step, and every prompt is trained exactly once
                          across the kill (none trained before the save again, none pending in
                          it or trained only in the lost tail lost)
    recycled_regenerated  a refused group goes where the unused handler says (retry:
                          recycled, drop: dropped); a recycled prompt is generated again,
                          before any new prompt
    whole_groups          a trained group's samples all completed (one aborted or failed
                          sends the group to the unused handler, as miles' drain does)
    published_weights     every sample came from published, whole, current weights
    update_order          pause -> flush -> session -> buckets -> stamp -> close -> publish ->
                          resume, per engine process; every engine of a transfer plan received
                          every bucket
    requests_kept         an update pauses requests as its mode says: under retract and
                          in_place none is aborted, under retract none keeps old KV
    step_attempts         a step commits once, on its quorum, from an attempt no cell discarded
    placement             ranks and engines sit on the GPUs in the documented order: a node's
                          bundles together, nodes IPv4 then IPv6 then names, GPU ids ascending
    progress              after the last fault steps commit and engines catch up
    liveness              once every fault is healed (liveness mode), K steps commit and every
                          engine reaches the newest version within the configured bound
    fault_witness         every fault that fired took effect (one witness per fault kind)

A job killed whole (kill_job) leaves one history joined from its controllers' segments
(miles_core.segments; miles_core.oracles.joined): an oracle of one controller's doing
judges each segment as a run of its own; exactly_once and recycled_regenerated judge the
committed timeline (what the job kept: each segment up to the save its successor resumed
from); resume judges the joining; end_state, progress and fault_witness the whole, knowing
where the segments meet.
A history without a kill is judged exactly as it always was.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from miles_core.event_index import Indexed, forget
from miles_core.events import History
from miles_core.oracles.base import Violation
from miles_core.oracles.cached_kv import cached_kv_fresh
from miles_core.oracles.delivery import exactly_once, recycled_regenerated
from miles_core.oracles.end_state import end_state
from miles_core.oracles.groups import whole_groups
from miles_core.oracles.joined import on_timeline, per_segment
from miles_core.oracles.liveness import liveness
from miles_core.oracles.placement import placement
from miles_core.oracles.progress import progress
from miles_core.oracles.requests import requests_kept
from miles_core.oracles.resume import resume
from miles_core.oracles.staleness import bounded_staleness
from miles_core.oracles.training import step_attempts
from miles_core.oracles.updates import update_order
from miles_core.oracles.versions import monotonic_versions
from miles_core.oracles.weights import published_weights
from miles_core.oracles.witnesses import fault_witness, unfired_reason
from miles_core.segments import forget_segments
from miles_core.witness.idle import idle_faults

SAFETY: dict[str, Callable[[History], Violation | None]] = {
    "monotonic_versions": per_segment(monotonic_versions),
    "bounded_staleness": per_segment(bounded_staleness),
    "cached_kv_fresh": per_segment(cached_kv_fresh),
    "exactly_once": on_timeline(exactly_once),
    "resume": resume,
    "recycled_regenerated": on_timeline(recycled_regenerated),
    "whole_groups": per_segment(whole_groups),
    "published_weights": per_segment(published_weights),
    "update_order": per_segment(update_order),
    "requests_kept": per_segment(requests_kept),
    "step_attempts": per_segment(step_attempts),
    "placement": per_segment(placement),
}
"""The oracles that can judge a history before it ends (``--check-every``)."""

ORACLES = ("end_state", *SAFETY, "progress", "liveness", "fault_witness")

WHOLE_RUN = ("end_state", "progress", "liveness", "fault_witness")
"""The oracles that judge how a run ended. A run interrupted from outside (Ctrl-C) has no
ending of its own: only the SAFETY oracles judge it, on what it did before the interrupt."""


def check_all(history: History, progress_window: float) -> dict[str, Violation | None]:
    """Every oracle's verdict, by name (None means it passed)."""
    with _no_cyclic_gc():
        verdicts: dict[str, Violation | None] = {"end_state": end_state(history)}
        verdicts |= {name: oracle(history) for name, oracle in SAFETY.items()}
        verdicts["progress"] = progress(history, progress_window)
        verdicts["liveness"] = liveness(history)
        verdicts["fault_witness"] = fault_witness(history)
    forget_segments(history)
    forget(history)
    return verdicts


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while the oracles judge.

    They keep a few hundred thousand small objects (the pairs they cite, per-group
    and per-process state) and make no reference cycles; on a million-event history
    each full collection the collector starts rescans the whole history (about half
    a second, twice in a judgement), to free nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def verdict_lines(verdicts: dict[str, Violation | None]) -> list[str]:
    """One line per oracle (pass / FAIL), each failure's evidence indented under it: what
    every CLI prints, simulated or real."""
    lines = []
    for name, verdict in verdicts.items():
        lines.append(f"  oracle {name:20s} {'pass' if verdict is None else 'FAIL'}")
        if verdict is not None:
            lines.append("    " + str(verdict).replace("\n", "\n    "))
    return lines


__all__ = [
    "ORACLES",
    "SAFETY",
    "WHOLE_RUN",
    "Indexed",
    "Violation",
    "bounded_staleness",
    "cached_kv_fresh",
    "check_all",
    "end_state",
    "exactly_once",
    "fault_witness",
    "idle_faults",
    "liveness",
    "monotonic_versions",
    "placement",
    "progress",
    "published_weights",
    "recycled_regenerated",
    "requests_kept",
    "resume",
    "step_attempts",
    "unfired_reason",
    "update_order",
    "verdict_lines",
    "whole_groups",
]
