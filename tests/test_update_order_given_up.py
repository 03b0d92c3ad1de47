"""update_order and an engine given up after its stamp (today's per-cell isolation).

Swarm seed 0 aimed at kill_engine@during_recovery:stamping (tests/test_coverage.py) under
today: engine-1 is stamped with v1, then its process is killed; the update's end_update finds
the process replaced and gives it up (EngineGivenUp, miles' errored cell: cell_session.py
``_PerCellEngineSession._call``, 2209c9c0), so its session never closes, and v1 is published
to engine-0 alone. The given-up process is out of rotation and the router: the publish is
safe, and the oracle must accept it; without the give-up the same history is a violation.
"""

from __future__ import annotations

from miles_core.events import EngineGivenUp, EngineStamped, History, UpdateSessionClosed
from miles_core.oracles.updates import update_order
from miles_core.profile import MilesProfile
from sim.run import run_scenario
from sim.search.aim import parse_aim
from sim.search.swarm import swarm_scenario


def test_a_publish_after_a_stamped_engine_was_given_up_is_in_order() -> None:
    scenario = swarm_scenario(0, aim=parse_aim("kill_engine@during_recovery:stamping"))
    assert scenario.loop.miles_profile is MilesProfile.TODAY
    history = run_scenario(scenario, 0).history
    given = [e for e in history if isinstance(e, EngineGivenUp) and e.call == "end_update"]
    assert given, "the seed no longer gives a stamped engine up at end_update"
    g = given[0]
    ours = [e for e in history if getattr(e, "update_id", None) == g.update_id]
    stamped = {(e.engine, e.incarnation) for e in ours if isinstance(e, EngineStamped)}
    closed = {
        process
        for e in ours
        if isinstance(e, UpdateSessionClosed)
        for process in zip(e.engines, e.incarnations, strict=True)
    }
    assert (g.engine, g.incarnation) in stamped - closed
    assert update_order(history) is None, update_order(history)
    without = History([e for e in history if e is not g])
    violation = update_order(without)
    assert violation is not None and "session closed" in violation.message, violation
