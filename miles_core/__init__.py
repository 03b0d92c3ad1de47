"""miles_core: the control logic of asynchronous RL post-training, pure.

Every module here is a sans-IO state machine or a pure function: no simpy,
ray, torch, sglang or megatron, no wall clock, no global random state, no I/O.
The simulator (sim/) and the real backends (backends/) drive these same
objects and feed the same event history to the same oracles.
"""

__version__ = "0.1.0"
