"""The simulated world: miles_core's loop driven in SimPy virtual time, with faults.

``python -m sim list`` names the scenarios; ``python -m sim run NAME --seed N`` replays one.
"""
