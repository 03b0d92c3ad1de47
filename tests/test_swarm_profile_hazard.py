"""The swarm draws aug2026 for worlds whose time-drawn cell losses strike every cell
(sim/search/swarm_profile.py): under today's miles, seed 636's aborted update stops every
participant and its retry waits 26 s for the controller to heal them one at a time, so the
step that would heal the restarted cell comes after the drawn stop of the only live cell.
"""

from __future__ import annotations

import dataclasses

from miles_core.kinds import RunStatus
from miles_core.profile import MilesProfile
from sim.run import run_scenario
from sim.search.swarm import swarm_scenario
from sim.search.swarm_profile import every_cell_struck_at_times


def test_seed_636_runs_aug2026_and_today_would_lose_every_cell() -> None:
    scenario = swarm_scenario(636)
    assert every_cell_struck_at_times(scenario.loop, scenario.world.num_cells, scenario.faults)
    assert scenario.loop.miles_profile is MilesProfile.AUG2026
    assert run_scenario(scenario, 636).ok
    today = dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, miles_profile=MilesProfile.TODAY)
    )
    ended = run_scenario(today, 636).history[-1]
    assert ended.status is RunStatus.FAILED and ended.error == "NoAliveCellError"


def test_without_fault_tolerance_or_with_a_cell_spared_the_draw_is_kept() -> None:
    scenario = swarm_scenario(636)
    loop, cells = scenario.loop, scenario.world.num_cells
    no_ft = dataclasses.replace(loop, use_fault_tolerance=False)
    assert not every_cell_struck_at_times(no_ft, cells, scenario.faults)
    assert not every_cell_struck_at_times(loop, cells + 1, scenario.faults)
