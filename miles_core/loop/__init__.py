"""The fully-async loop, split by role; ``Orchestrator`` runs it over one world.

config.py       LoopConfig: the flags, with miles' names, checked once
context.py      what the roles share; background tasks whose crash ends the run
supervision.py  engine processes: which serve, routing, failures, new processes
producer.py     prompts -> groups -> buffer; recycling; draining a batch
gate.py         AReaL's staleness gate in the producer (--staleness-policy gate_submission)
train.py        a step's attempts on the quorum; heals; cell failures
heartbeat.py    miles' trainer heartbeat checker
update.py       the weight-update sequence, failover, syncs
run.py          Orchestrator: wires the roles, owns the end state
"""

from miles_core.loop.config import FLAGS, MODES, LoopConfig
from miles_core.loop.run import Orchestrator, RunReport

__all__ = ["FLAGS", "MODES", "LoopConfig", "Orchestrator", "RunReport"]
