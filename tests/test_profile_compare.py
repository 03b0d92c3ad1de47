"""sim/timing/profile_compare.py: the fault-by-fault comparison of the two miles profiles, and
the window bug it found (a replacement reported while today's update window waited)."""

from __future__ import annotations

from miles_core.events import UpdateAborted, UpdateGroupConnected
from miles_core.profile import MilesProfile
from sim.run import run_scenario
from sim.timing.profile_compare import CASES, lost_engine_seconds, recovery_seconds, scenario

HUNG = CASES[1]


def test_a_replacement_reported_while_the_window_waits_is_connected_not_failed() -> None:
    """At production-64x256 the hung engine's new process is reported while today's window
    waits for it; the update must make its group anew for it. Reading miles' has_new_engines
    before the wait kept the old group, failed the cell ("names engine-1's process 0") and
    stopped all 256 engines: 689,180 engine-seconds lost instead of 183."""
    result = run_scenario(scenario("production-64x256", HUNG, MilesProfile.TODAY), 0)
    assert result.ok, result.failures()
    aborted = [e for e in result.history if isinstance(e, UpdateAborted)]
    assert not [e for e in aborted if "replaced since the group was made" in e.reason], aborted
    reasons = {e.reason for e in result.history if isinstance(e, UpdateGroupConnected)}
    assert "new_engines" in reasons
    lost = lost_engine_seconds(result.history, HUNG)
    recovered = recovery_seconds(result.history, HUNG)
    assert recovered is not None and lost < 1_000


def test_a_killed_engine_is_lost_from_the_fault_until_it_serves_again() -> None:
    case = CASES[0]
    result = run_scenario(scenario("small", case, MilesProfile.AUG2026), 0)
    recovered = recovery_seconds(result.history, case)
    assert recovered is not None and recovered > 0
    # one engine out of rotation from the fault until it served again, nothing else lost
    assert abs(lost_engine_seconds(result.history, case) - recovered) < 1e-6
