"""monotonic_versions: weight versions never go backwards.

At the rollout manager (published versions strictly increase, and a resumed
run continues its checkpoint's sequence), per engine process (its stamps never
decrease, and no stamp is below the version already published), per engine
(the versions samples report never decrease) and at the consumer (the version
it drains at never decreases). This is what catches the per-cell counter of the
seed report on PR #2244: a survivor of a failover restarting from its own count.

Stamps are judged per process, against the published version, not per engine
id: an update that stamped a process and then aborted published nothing, and a
new process of that engine is rightly synced to the published version, below
the aborted stamp (seen with control replies as slow as the health timeout).
A new process synced to a version older than the published one is still caught.
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import (
    EngineStamped,
    GroupGot,
    History,
    LedgerRestored,
    SampleGenerated,
    VersionPublished,
)
from miles_core.oracles.base import Violation, version_number

NAME = "monotonic_versions"


def monotonic_versions(history: History) -> Violation | None:
    """Published versions strictly increase; per process stamps, per engine samples, and
    the consumer's version never decrease; no stamp is below the published version."""
    last_published: Indexed | None = None
    last_stamp: dict[tuple[str, int], Indexed] = {}
    last_sample: dict[str, tuple[int, int, SampleGenerated]] = {}  # engine -> (number, seq, e)
    last_got: Indexed | None = None
    kinds = (VersionPublished, LedgerRestored, EngineStamped, SampleGenerated, GroupGot)
    for seq, e in select(history, *kinds):
        # the most common events first: samples, then stamps
        if isinstance(e, SampleGenerated):
            if e.aborted:
                continue
            number = version_number(e.version)
            prev = last_sample.get(e.engine)
            if prev is not None and number < prev[0]:
                return Violation(
                    NAME,
                    f"engine {e.engine} generated under version {e.version} after "
                    f"{prev[2].version}",
                    ((prev[1], prev[2]), (seq, e)),
                )
            last_sample[e.engine] = (number, seq, e)
        elif isinstance(e, EngineStamped):
            prev = last_stamp.get((e.engine, e.incarnation))
            if prev is not None and e.version < prev[1].version:
                return Violation(
                    NAME,
                    f"engine {e.engine} stamped {e.version} after {prev[1].version}",
                    (prev, (seq, e)),
                )
            if last_published is not None and e.version < last_published[1].version:
                return Violation(
                    NAME,
                    f"engine {e.engine} (process {e.incarnation}) stamped {e.version}, below "
                    f"the published version {last_published[1].version}",
                    (last_published, (seq, e)),
                )
            last_stamp[(e.engine, e.incarnation)] = (seq, e)
        elif isinstance(e, VersionPublished):
            if last_published is not None and e.version <= last_published[1].version:
                return Violation(
                    NAME,
                    f"published version went from {last_published[1].version} to {e.version} "
                    f"(updater cell {e.updater})",
                    (last_published, (seq, e)),
                )
            last_published = (seq, e)
        elif isinstance(e, LedgerRestored):  # a resumed run continues its checkpoint's sequence
            last_published = (seq, e)
        elif isinstance(e, GroupGot) and e.current_version is not None:
            if last_got is not None and e.current_version < last_got[1].current_version:
                return Violation(
                    NAME,
                    f"the consumer's version went from {last_got[1].current_version} to "
                    f"{e.current_version}",
                    (last_got, (seq, e)),
                )
            last_got = (seq, e)
    return None
