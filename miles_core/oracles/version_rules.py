"""weight_versions_sane: miles' weight-version hygiene, judged from any history.

miles fails a run (``miles/utils/weight_version.py`` at 3eacefd0) when a trained sample has a
span under SGLang's ``"default"`` version (an engine never updated) or a non-numeric one
(``assert_samples_weight_version_sane``), and when more than max(3, --update-weights-interval
+ 1) rollouts go by without a published version (``assert_weight_version_is_published``).
This oracle holds a history to the same rules, in the testbed's terms (miles_core.version_rules):
a trained sample's ``None`` span counts as "default" once its process was stamped (before,
it is the trainer's initial weights, which miles stamps by its first update); a rollout is a
committed step. A non-numeric version never reaches a history (the router cannot read it).
Not among the SAFETY oracles: the loop raises under ``--miles-profile today``; this judges a
history made either way (tests/test_version_rules.py).
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import (
    EngineStamped,
    GroupTrained,
    History,
    SampleGenerated,
    StepCommitted,
    VersionPublished,
)
from miles_core.oracles.base import Violation
from miles_core.version_rules import default_span, max_rollouts_without_publish

NAME = "weight_versions_sane"


def weight_versions_sane(history: History, limit: int | None = None) -> Violation | None:
    """The first trained sample with a "default" span, or the first step committed more than
    ``limit`` steps after the last publish; None when neither."""
    return _spans(history) or _published(history, limit or max_rollouts_without_publish())


def _spans(history: History) -> Violation | None:
    stamps: dict[tuple[str, int], list[tuple[float, int]]] = {}
    suspect: dict[int, tuple[Indexed, str]] = {}  # group -> its first sample breaking a rule
    for seq, e in select(history, EngineStamped, SampleGenerated, GroupTrained):
        if isinstance(e, EngineStamped):
            stamps.setdefault((e.engine, e.incarnation), []).append((e.t, e.version))
        elif isinstance(e, SampleGenerated):
            if e.aborted or e.group_id in suspect:
                continue
            before = [v for t, v in stamps.get((e.engine, e.incarnation), ()) if t <= e.sent]
            why = default_span(e.all_versions, before[-1] if before else None)
            if why is not None:
                suspect[e.group_id] = ((seq, e), why)
        elif e.group_id in suspect:
            sample, why = suspect[e.group_id]
            return Violation(
                NAME,
                f"group {e.group_id} was trained (step {e.step}) with a sample whose {why}: "
                "miles' assert_samples_weight_version_sane fails the run",
                (sample, (seq, e)),
            )
    return None


def _published(history: History, limit: int) -> Violation | None:
    since: list[Indexed] = []
    for seq, e in select(history, StepCommitted, VersionPublished):
        if isinstance(e, VersionPublished):
            since = []
            continue
        since.append((seq, e))
        if len(since) > limit:
            return Violation(
                NAME,
                f"step {e.step} committed as the {len(since)}th rollout without a published "
                f"weight version (at most {limit}): miles' assert_weight_version_is_published "
                "fails the run",
                (since[0], since[-1]),
            )
    return None
