"""Prompts are delivered exactly once, and a recycled prompt is generated again.

exactly_once: a prompt is drawn from the dataset once, trained in at most one
committed step, never both trained and dropped (and never dropped without a
reason); at the end each drawn prompt is trained, dropped or outstanding
(queued, generating, or awaiting regeneration), exactly one of them.

recycled_regenerated: a group the buffer refuses (aborted or stale) goes where
``--async-unused-samples-handler`` says: recycled under retry, dropped under drop
(the dynamic filter drops whatever the handler, and so does the buffer a group
one of whose requests an engine refused, an over-long prompt, which is never
recycled: miles' ``DefaultDataBuffer.put`` and
``get`` hand aborted and stale groups to the one handler,
miles/rollout/fully_async_data_buffer.py). A recycled group puts its
prompt back for regeneration, and recycled prompts go before new ones (miles'
``RolloutDataSourceWithBuffer.get_samples`` takes its buffer first,
miles/rollout/data_source.py). So no new prompt is drawn while a recycled one
waits, every group starts from a prompt just drawn or one awaiting
regeneration, and the end of the run lists exactly the recycled prompts still
waiting.
"""

from __future__ import annotations

from miles_core.buffer import Reason, UnusedHandler
from miles_core.event_index import Indexed, select
from miles_core.events import (
    GroupDropped,
    GroupRecycled,
    GroupStarted,
    GroupTrained,
    History,
    JobResumed,
    PromptDrawn,
    RunEnded,
    RunStarted,
    SampleGenerated,
)
from miles_core.kinds import SampleOutcome
from miles_core.oracles.base import Violation

NAME = "exactly_once"
RECYCLED = "recycled_regenerated"


def exactly_once(history: History) -> Violation | None:
    """A prompt is trained in at most one committed step, never both trained and dropped;
    at RunEnded each drawn prompt is trained, dropped or outstanding, exactly one of them.
    A resumed job's pending prompts (JobResumed) count as drawn, before its history began."""
    drawn: dict[int, Indexed] = {}
    trained: dict[int, Indexed] = {}
    dropped: dict[int, Indexed] = {}
    ended: Indexed | None = None
    for seq, e in select(history, PromptDrawn, GroupTrained, GroupDropped, RunEnded, JobResumed):
        if isinstance(e, JobResumed):  # drawn before the save it loaded, to be trained here
            for prompt in e.pending:  # (a resumed run judged on its own history)
                drawn.setdefault(prompt, (seq, e))
        elif isinstance(e, PromptDrawn):
            if e.prompt_id in drawn:
                return Violation(
                    NAME,
                    f"prompt {e.prompt_id} drawn twice from the dataset",
                    (drawn[e.prompt_id], (seq, e)),
                )
            drawn[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupTrained):
            if e.prompt_id not in drawn:
                return Violation(NAME, f"prompt {e.prompt_id} trained but never drawn", ((seq, e),))
            if e.prompt_id in trained:
                first = trained[e.prompt_id]
                return Violation(
                    NAME,
                    f"prompt {e.prompt_id} trained twice (steps {first[1].step} and {e.step})",
                    (first, (seq, e)),
                )
            if e.prompt_id in dropped:
                return Violation(
                    NAME,
                    f"prompt {e.prompt_id} trained after it was dropped",
                    (dropped[e.prompt_id], (seq, e)),
                )
            trained[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupDropped):
            if e.prompt_id in trained:
                return Violation(
                    NAME,
                    f"prompt {e.prompt_id} dropped after it was trained",
                    (trained[e.prompt_id], (seq, e)),
                )
            if e.prompt_id in dropped:
                return Violation(
                    NAME, f"prompt {e.prompt_id} dropped twice", (dropped[e.prompt_id], (seq, e))
                )
            if not e.reason:
                return Violation(
                    NAME, f"prompt {e.prompt_id} dropped without a reason", ((seq, e),)
                )
            dropped[e.prompt_id] = (seq, e)
        elif isinstance(e, RunEnded):
            ended = (seq, e)
    if ended is None:
        return None
    outstanding = set(ended[1].outstanding_prompts)
    for prompt, where in drawn.items():
        fates = [
            fate
            for fate, hit in (
                ("trained", prompt in trained),
                ("dropped", prompt in dropped),
                ("outstanding", prompt in outstanding),
            )
            if hit
        ]
        if len(fates) != 1:
            why = (
                "was lost: neither trained, dropped nor outstanding"
                if not fates
                else f"is {' and '.join(fates)}"
            )
            evidence = [where] + [d[prompt] for d in (trained, dropped) if prompt in d] + [ended]
            return Violation(NAME, f"prompt {prompt} {why} at the end of the run", tuple(evidence))
    unknown = outstanding - set(drawn)
    if unknown:
        return Violation(
            NAME, f"prompts {sorted(unknown)} reported outstanding but never drawn", (ended,)
        )
    return None


def recycled_regenerated(history: History) -> Violation | None:
    """Refused groups go where the unused handler says; recycled prompts are generated
    again, before any new prompt is drawn."""
    fresh: dict[int, Indexed] = {}  # drawn, no group started yet
    waiting: dict[int, Indexed] = {}  # recycled, no group started since
    refused: dict[int, Indexed] = {}  # groups an engine refused a request of
    handler: UnusedHandler | None = None
    kinds = (RunStarted, GroupRecycled, GroupDropped, PromptDrawn, GroupStarted, RunEnded)
    for seq, e in select(history, *kinds, SampleGenerated, JobResumed):
        if isinstance(e, JobResumed):  # a killed job's restart regenerates its save's pending
            waiting = dict.fromkeys(e.pending, (seq, e))  # prompts first, as recycled ones
            fresh, refused = {}, {}  # group ids count afresh
        elif isinstance(e, SampleGenerated):
            if e.outcome is SampleOutcome.REFUSED:
                refused.setdefault(e.group_id, (seq, e))
        elif isinstance(e, RunStarted):
            handler = e.unused_samples_handler
        elif isinstance(e, GroupDropped):
            if e.group_id in refused:
                continue  # dropped under either handler: a retry would be refused again
            if handler is UnusedHandler.RETRY and not _filtered(e.reason):
                return Violation(
                    RECYCLED,
                    f"group {e.group_id} (prompt {e.prompt_id}) was dropped ({e.reason}), but "
                    "--async-unused-samples-handler is retry: only the dynamic filter drops",
                    ((seq, e),),
                )
        elif isinstance(e, GroupRecycled):
            if e.group_id in refused:
                return Violation(
                    RECYCLED,
                    f"group {e.group_id} (prompt {e.prompt_id}) was recycled, but an engine "
                    "refused one of its requests: generated again, it is refused again",
                    (refused[e.group_id], (seq, e)),
                )
            if handler is UnusedHandler.DROP:
                return Violation(
                    RECYCLED,
                    f"group {e.group_id} (prompt {e.prompt_id}) was recycled ({e.reason}), but "
                    "--async-unused-samples-handler is drop",
                    ((seq, e),),
                )
            waiting[e.prompt_id] = (seq, e)
        elif isinstance(e, PromptDrawn):
            if waiting:
                prompt, since = next(iter(waiting.items()))
                return Violation(
                    RECYCLED,
                    f"prompt {e.prompt_id} was drawn while recycled prompt {prompt} waited for "
                    f"regeneration since t={since[1].t:g}: recycled prompts go first",
                    (since, (seq, e)),
                )
            fresh[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupStarted):
            if fresh.pop(e.prompt_id, None) is None and waiting.pop(e.prompt_id, None) is None:
                return Violation(
                    RECYCLED,
                    f"group {e.group_id} started for prompt {e.prompt_id}, which was neither "
                    "just drawn nor awaiting regeneration (a prompt generated twice at once?)",
                    ((seq, e),),
                )
        elif isinstance(e, RunEnded):
            stated = set(e.awaiting_regeneration)
            lost = sorted(set(waiting) - stated)
            if lost:
                return Violation(
                    RECYCLED,
                    f"prompt {lost[0]} was recycled but never generated again, and the end of "
                    "the run does not list it as awaiting regeneration",
                    (waiting[lost[0]], (seq, e)),
                )
            extra = sorted(stated - set(waiting))
            if extra:
                return Violation(
                    RECYCLED,
                    f"the end of the run lists prompt {extra[0]} as awaiting regeneration, but "
                    "it was not recycled, or was generated again since",
                    ((seq, e),),
                )
    return None


def _filtered(reason: str) -> bool:
    """The dynamic filter's drop (``dynamic_filter`` or ``dynamic_filter:<its reason>``)."""
    return reason.partition(":")[0] == Reason.DYNAMIC_FILTER
