"""run_scenario's housekeeping: what it changes in the process, it puts back."""

from __future__ import annotations

import gc

from sim.run import run_scenario
from sim.scenarios import SCENARIOS


def test_a_run_leaves_the_garbage_collector_as_it_found_it() -> None:
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert run_scenario(SCENARIOS["no_failure"], 0, 1).ok
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
