"""The simulated world: miles_core driven in virtual time.

SimPy arrives with the simulator issue; until then ``python -m sim demo`` steps
the core state machines directly.
"""
