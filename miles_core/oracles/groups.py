"""Only whole groups are trained: no trained group holds a sample whose generation ended
without completing.

miles' fully-async data buffer hands a group with an ABORTED sample to the unused
handler before its dynamic filter or capacity (miles/rollout/fully_async_data_buffer.py,
``DefaultDataBuffer.put``, moved there from ``FullyAsyncRolloutFn._drain`` by miles
#2030; miles #2800), and the sync loops can drop such a group with the
``check_no_aborted`` filter. Training one would count a truncated response, scored as
if it had finished, in its group's advantage. Here the buffer refuses the group and the
unused handler recycles or drops its prompt.

The oracle reads each generate call as the producer recorded it (SampleGenerated, with
the outcome the world gave: aborted, the engine failed, the router failed) and each
committed group (GroupTrained): a trained group must have a call that completed, and
none that did not.
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import GroupTrained, History, SampleGenerated
from miles_core.kinds import SampleOutcome
from miles_core.oracles.base import Violation

NAME = "whole_groups"


def whole_groups(history: History) -> Violation | None:
    """Every trained group's generate calls all completed (and it had at least one)."""
    completed = SampleOutcome.COMPLETED
    cut: dict[int, Indexed] = {}  # group -> its first call that did not complete
    generated: set[int] = set()  # groups with a call that completed
    for seq, e in select(history, SampleGenerated):  # most of a history: kept lean
        if e.outcome is completed:
            generated.add(e.group_id)
        elif e.group_id not in cut:
            cut[e.group_id] = (seq, e)
    for seq, e in select(history, GroupTrained):
        ended = cut.get(e.group_id)
        if ended is not None:
            sample = ended[1]
            return Violation(
                NAME,
                f"group {e.group_id} was trained in step {e.step} although its sample "
                f"{sample.sample} ended {sample.outcome.value}: a group with a sample that did "
                "not complete goes to the unused handler, not to training",
                (ended, (seq, e)),
            )
        if e.group_id not in generated:
            return Violation(
                NAME,
                f"group {e.group_id} was trained in step {e.step} but none of its samples was "
                "generated",
                ((seq, e),),
            )
    return None
