"""requests_kept: an update treats the requests in flight the way its pause mode says.

Under retract and in_place (miles' defaults for fully-async runs) no request is
aborted by an update: it is paused and continues on the new weights. A request
only ends aborted by a fault (its engine died, the router failed it), which
the engine does not answer with ``finish_reason: abort``. A client that
updates the version without ``abort_all_requests: false`` aborts them all
(SGLang's default; miles #2589, #2296), and this oracle says so. Under
retract a resumed request's KV is recomputed, so it never keeps old keys and
values; under abort no request lives across an update at all. A request the
control plane aborted on an orphan's server as it removed it from the router
(OrphanRemoved: the actor was gone, the server still serving) was ended by
the fault's consequence, not by an update. A pause that asked to abort the requests
declared below a version (EnginesPausedAbortingBelow: --pause-abort-below-start-weight-version,
sglang #34185) may end those of its engines' requests in flight that were sent while a
version below it was the published one (what the producer declares,
miles_core/pause_filter.py); any other it ends is still a violation.
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import (
    EnginesPaused,
    EnginesPausedAbortingBelow,
    History,
    OrphanRemoved,
    RunStarted,
    SampleGenerated,
    VersionPublished,
)
from miles_core.kinds import PauseMode, SampleOutcome
from miles_core.oracles.base import Violation

NAME = "requests_kept"


def requests_kept(history: History) -> Violation | None:
    mode = PauseMode.RETRACT
    pauses: list[Indexed] = []  # every pause, in order; searched by engine only on a violation
    orphans: set[tuple[str, int]] = set()  # processes removed from the router as orphans
    below: list[EnginesPausedAbortingBelow] = []  # pauses that aborted declared-stale requests
    published: list[tuple[float, int]] = []  # (t, version) of each publication, in order
    kinds = (RunStarted, EnginesPaused, SampleGenerated, OrphanRemoved, VersionPublished)
    for seq, e in select(history, *kinds):
        if isinstance(e, SampleGenerated):
            aborted = e.outcome is SampleOutcome.ABORTED
            if not aborted and not e.kept_kv and mode is not PauseMode.ABORT:
                continue  # nothing _judge could find (most samples: asked before the call)
            if aborted and orphans and (e.engine, e.incarnation) in orphans:
                continue  # aborted as its orphan server was removed
            if aborted and below and _declared_stale(e, below, published):
                continue  # aborted by a pause as declared too stale to train on
            problem = _judge(mode, e)
            if problem is not None:
                during = [
                    p
                    for p in pauses
                    if e.engine in p[1].engines and e.sent <= p[1].t <= e.t  # type: ignore[attr-defined]
                ]
                return Violation(NAME, problem, (*during[-1:], (seq, e)))
        elif isinstance(e, RunStarted):
            mode = e.pause_mode
        elif isinstance(e, EnginesPaused):
            pauses.append((seq, e))
            if isinstance(e, EnginesPausedAbortingBelow):
                below.append(e)
        elif isinstance(e, OrphanRemoved):
            orphans.add((e.engine, e.incarnation))
        elif isinstance(e, VersionPublished):
            published.append((e.t, e.version))
    return None


def _declared_stale(
    e: SampleGenerated,
    below: list[EnginesPausedAbortingBelow],
    published: list[tuple[float, int]],
) -> bool:
    """Whether a pause on its process while it was in flight asked to abort it: the version
    published before it was sent (0 before any; one published at the very instant it was
    sent may have come after it) below that pause's threshold."""
    declared = next((v for t, v in reversed(published) if t < e.sent), 0)
    return any(
        e.sent <= p.t <= e.t
        and (e.engine, e.incarnation) in zip(p.engines, p.incarnations, strict=True)
        and declared < p.abort_below
        for p in below
    )


def _judge(mode: PauseMode, e: SampleGenerated) -> str | None:
    if mode is not PauseMode.ABORT and e.outcome is SampleOutcome.ABORTED:
        return (
            f"{_where(e)} was aborted under pause mode {mode.value}: an update must pause it, "
            "not end it (a version update without abort_all_requests: false aborts everything)"
        )
    if mode is PauseMode.RETRACT and e.kept_kv:
        return f"{_where(e)} kept KV across an update under retract, which recomputes it"
    if mode is PauseMode.ABORT and len(set(e.all_versions)) > 1 and not e.aborted:
        return f"{_where(e)} lived across an update under abort (versions {list(e.all_versions)})"
    return None


def _where(e: SampleGenerated) -> str:
    """The request, as a message names it (built only for a violation: one a sample costs)."""
    return f"engine {e.engine}'s request for group {e.group_id} (sample {e.sample})"
