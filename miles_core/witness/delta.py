"""The disk-delta faults' witnesses (miles_core/disk_delta.py): what each one's effect looks
like in a history, read by witness/effects.py's WITNESSES.

    delta_applied_twice   an update checked the engine's weights after it fired (a pull
    delta_skipped         came through the armed engine and its load was read); whether
                          they matched the trainer's is published_weights' to judge
                          (xor's second apply reverts them, overwrite's changes nothing)
    delta_torn            an update aborted on an engine's /pull_weights refusal (its
                          checksum caught the torn file)
"""

from __future__ import annotations

from miles_core.events import FaultInjected, WeightsChecked
from miles_core.witness.index import WitnessIndex

PULL_REFUSED = "/pull_weights refused"
"""How both worlds word an engine's refusal of a pull (the update's abort reason)."""


def delta_pulled(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    engine = fault.engine
    if any(isinstance(e, WeightsChecked) and e.engine == engine for _, e in index.after(seq)):
        return None
    return f"no update checked engine {engine}'s weights after its pull was armed"


def delta_refused(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    del seq
    if any(a.t >= fault.t and PULL_REFUSED in a.reason for a in index.aborted):
        return None
    return "no update aborted on a refused /pull_weights after the delta file was torn"
