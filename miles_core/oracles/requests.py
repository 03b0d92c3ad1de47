"""requests_kept: an update treats the requests in flight the way its pause mode says.

Under retract and in_place (miles' defaults for fully-async runs) no request is
aborted by an update: it is paused and continues on the new weights. A request
only ends aborted by a fault (its engine died, the router failed it), which
the engine does not answer with ``finish_reason: abort``. A client that
updates the version without ``abort_all_requests: false`` aborts them all
(SGLang's default; miles #2589, #2296), and this oracle says so. Under
retract a resumed request's KV is recomputed, so it never keeps old keys and
values; under abort no request lives across an update at all.
"""

from __future__ import annotations

from miles_core.events import EnginesPaused, History, RunStarted, SampleGenerated
from miles_core.kinds import PauseMode, SampleOutcome
from miles_core.oracles.base import Indexed, Violation, select

NAME = "requests_kept"


def requests_kept(history: History) -> Violation | None:
    mode = PauseMode.RETRACT
    pauses: dict[str, list[Indexed]] = {}  # engine -> its pauses, in order
    for seq, e in select(history, RunStarted, EnginesPaused, SampleGenerated):
        if isinstance(e, RunStarted):
            mode = e.pause_mode
        elif isinstance(e, EnginesPaused):
            for engine in e.engines:
                pauses.setdefault(engine, []).append((seq, e))
        elif isinstance(e, SampleGenerated):
            problem = _judge(mode, e)
            if problem is not None:
                during = [p for p in pauses.get(e.engine, ()) if e.sent <= p[1].t <= e.t]
                return Violation(NAME, problem, (*during[-1:], (seq, e)))
    return None


def _judge(mode: PauseMode, e: SampleGenerated) -> str | None:
    where = f"engine {e.engine}'s request for group {e.group_id} (sample {e.sample})"
    if mode is not PauseMode.ABORT and e.outcome is SampleOutcome.ABORTED:
        return (
            f"{where} was aborted under pause mode {mode.value}: an update must pause it, not "
            "end it (a version update without abort_all_requests: false aborts everything)"
        )
    if mode is PauseMode.RETRACT and e.kept_kv:
        return f"{where} kept KV across an update under retract, which recomputes it"
    if mode is PauseMode.ABORT and len(set(e.all_versions)) > 1 and not e.aborted:
        return f"{where} lived across an update under abort (versions {list(e.all_versions)})"
    return None
