"""The oracles' names, outside miles_core/oracles/ so that what a scenario says of them
(``expect = { caught_by = "published_weights" }``) can be checked by the side that runs,
which imports no oracle (tests/test_layout.py). ``miles_core.oracles.ORACLES`` is this
tuple (scenarios/test_swarm_field_bugs.py holds them equal)."""

from __future__ import annotations

ORACLE_NAMES = (
    "end_state",
    "monotonic_versions",
    "bounded_staleness",
    "cached_kv_fresh",
    "exactly_once",
    "resume",
    "recycled_regenerated",
    "whole_groups",
    "published_weights",
    "update_order",
    "requests_kept",
    "step_attempts",
    "placement",
    "progress",
    "liveness",
    "fault_witness",
)

CATCHERS = tuple(name for name in ORACLE_NAMES if name not in ("end_state", "fault_witness"))
"""The oracles a scenario may expect to catch its fault (``expect.caught_by``): not
end_state (how a run must end is ``expect.status`` / ``expect.error``), nor fault_witness
(a fault with no effect is the drawing's mistake, never a bug caught)."""
