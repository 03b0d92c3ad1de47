"""cached_kv_fresh: no trained token was computed on prompt KV older than the bound allows.

An engine's prefix cache (SGLang's radix cache) hands a request the prompt's
keys and values that an earlier request computed, under the weights of then:
SGLang reports only how many tokens it reused (``cached_tokens``), so the
response's ``weight_versions``, and with them the buffer's staleness filter,
never see those weights (miles #2782). The world records which weights they
were (``SampleGenerated.cached_versions``); this oracle holds them to the
bound ``bounded_staleness`` holds the spans to: for each trained group, the
version it was drained at minus the oldest weights behind any KV a sample
reused is at most ``max_weight_staleness``. A flush (every update but
in_place's) empties the cache, so the hazard is a cache that outlives updates:
in_place pauses, and prompts generated again (the ``retry`` handler).
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import GroupGot, GroupTrained, History, SampleGenerated
from miles_core.oracles.base import Violation, run_started, version_number

NAME = "cached_kv_fresh"


def cached_kv_fresh(history: History, bound: int | None = None) -> Violation | None:
    """Each trained group: current version at its drain - the oldest cached KV's <= bound."""
    if bound is None:
        started = run_started(history)
        bound = started[1].max_weight_staleness if started else None  # type: ignore[union-attr]
    if bound is None:
        return None
    oldest: dict[int, tuple[int, Indexed]] = {}  # group -> (oldest cached version, its sample)
    got: dict[int, Indexed] = {}
    for seq, e in select(history, SampleGenerated, GroupGot, GroupTrained):
        if isinstance(e, SampleGenerated):
            if e.cached_versions and not e.aborted:
                version = min(map(version_number, e.cached_versions))
                prev = oldest.get(e.group_id)
                if prev is None or version < prev[0]:
                    oldest[e.group_id] = (version, (seq, e))
        elif isinstance(e, GroupGot):
            got[e.group_id] = (seq, e)
        elif e.group_id in oldest and e.group_id in got:
            consumed = got[e.group_id]
            current = consumed[1].current_version  # type: ignore[union-attr]
            version, sample = oldest[e.group_id]
            if current is not None and current - version > bound:
                return Violation(
                    NAME,
                    f"group {e.group_id} trained at version {current} with a sample that "
                    f"reused prompt KV computed by version {version} from the prefix cache: "
                    f"{current - version} > bound {bound}, unseen by the staleness filter",
                    (sample, consumed, (seq, e)),
                )
    return None
