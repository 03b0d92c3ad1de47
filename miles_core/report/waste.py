"""What each staleness policy wasted, read from the history (so every world reports it
the same way): the summary's ``staleness_waste``.

- drop_at_buffer (miles): groups generated and then refused as stale by the buffer
  (dropped or recycled), with their completed samples and the engine seconds those took
  (the engines' own account, SampleGenerated.engine_seconds; a response's token count
  is not in the history).
- gate_submission (AReaL): the seconds the producer was held at the gate with room for a
  group (GateHeld .. GateReleased; a hold still open when the history ends counts up to
  its last event) and the groups that waited there.

Both sets are reported for every run; the policy is the one the history shows (a
GateArmed event: gate_submission). Names follow miles' rollout/fully_async/ prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from miles_core.buffer import METRIC_PREFIX, Reason
from miles_core.events import (
    Event,
    GateArmed,
    GateHeld,
    GateReleased,
    GroupDropped,
    GroupRecycled,
    SampleGenerated,
)
from miles_core.kinds import SampleOutcome
from miles_core.staleness_gate import StalenessPolicy

STALE_GROUPS = f"{METRIC_PREFIX}stale_groups_wasted"
STALE_SAMPLES = f"{METRIC_PREFIX}stale_samples_wasted"
STALE_ENGINE_SECONDS = f"{METRIC_PREFIX}stale_engine_seconds_wasted"
GATE_HELD_SECONDS = f"{METRIC_PREFIX}gate_held_seconds"
GATE_HELD_GROUPS = f"{METRIC_PREFIX}gate_held_groups"


def staleness_waste(history: Iterable[Event]) -> dict[str, Any]:
    """{"policy": ..., and each waste figure under its metric name}."""
    events = list(history)
    stale = {
        e.group_id
        for e in events
        if isinstance(e, GroupDropped | GroupRecycled) and e.reason.split(":")[0] == Reason.STALE
    }
    samples, engine_seconds = 0, 0.0
    held, groups, held_since, gated = 0.0, 0, None, False
    for e in events:
        if isinstance(e, SampleGenerated):
            if e.group_id in stale and e.outcome is SampleOutcome.COMPLETED:
                samples += 1
                engine_seconds += e.engine_seconds or 0.0
        elif isinstance(e, GateArmed):
            gated = True
        elif isinstance(e, GateHeld):
            held_since = e.t
        elif isinstance(e, GateReleased):
            held += e.t - e.held_since
            groups += e.groups
            held_since = None
    if held_since is not None and events:  # held to the end of the history
        held += events[-1].t - held_since
    policy = StalenessPolicy.GATE_SUBMISSION if gated else StalenessPolicy.DROP_AT_BUFFER
    return {
        "policy": policy.value,
        STALE_GROUPS: len(stale),
        STALE_SAMPLES: samples,
        STALE_ENGINE_SECONDS: round(engine_seconds, 6),
        GATE_HELD_SECONDS: round(held, 6),
        GATE_HELD_GROUPS: groups,
    }


def waste_line(waste: dict[str, Any]) -> str | None:
    """The summary's line for a person; None when the run wasted nothing to staleness."""
    if waste["policy"] == StalenessPolicy.GATE_SUBMISSION:
        return (
            f"  staleness waste (gate_submission): producer held {waste[GATE_HELD_SECONDS]:.1f} s "
            f"at the gate, {waste[GATE_HELD_GROUPS]} groups waited; "
            f"{waste[STALE_GROUPS]} groups refused as stale"
        )
    if not waste[STALE_GROUPS]:
        return None
    return (
        f"  staleness waste (drop_at_buffer): {waste[STALE_GROUPS]} groups generated then "
        f"refused as stale ({waste[STALE_SAMPLES]} samples, "
        f"{waste[STALE_ENGINE_SECONDS]:.1f} request-s on the engines)"
    )
