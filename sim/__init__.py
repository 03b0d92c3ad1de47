"""The simulator: miles_core's loop driven in SimPy virtual time, with faults: its world
(world/), seeds and what they find (search/), the time model and planner (timing/), one
module per command (cli/), one run (run.py) and the scenarios it runs (scenarios.py).

``python -m sim list`` names the scenarios; ``python -m sim run NAME --seed N`` replays one.
"""
