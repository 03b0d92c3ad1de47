"""What happened in a run, step by step, read from its history (no trace needed).

For each training step: its attempts and their verdicts, the quorum it
committed on, the heals before it, the weight updates after it (who published
which version, which were aborted and why, which synced restarted engines),
the faults that fired and the engines that changed state meanwhile. The text
form prints only the steps where something other than a first-try commit and
publish happened, and folds the rest into ranges.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from miles_core.cells import Decision
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    EngineStateChanged,
    Event,
    FaultInjected,
    HealBegan,
    HealEnded,
    History,
    StepBegan,
    StepCommitted,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)


@dataclass
class StepStory:
    step: int | None
    """None: what happened before the first step."""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    quorum: list[int] = field(default_factory=list)
    heals: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def plain(self) -> bool:
        """A first-try commit and one publishing update, nothing else."""
        return (
            len(self.attempts) == 1
            and not (self.heals or self.faults or self.engines)
            and [u["outcome"] for u in self.updates] == ["published"]
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _target(e: FaultInjected) -> str:
    return f"cell {e.cell}" if e.cell is not None else e.engine or "the world"


def _record(story: StepStory, e: Event, updates: dict[int, dict[str, Any]]) -> None:
    if isinstance(e, AttemptBegan):
        story.attempts.append({"attempt": e.attempt, "cells": list(e.cells)})
    elif isinstance(e, AttemptEnded) and story.attempts:
        story.attempts[-1] |= {
            "decision": e.decision.value,
            "normal": list(e.normal),
            "discarded": list(e.discarded),
            "errored": list(e.errored),
        }
        if e.decision is Decision.COMMIT:
            story.quorum = list(story.attempts[-1]["cells"])
    elif isinstance(e, HealBegan):
        story.heals.append({"src": e.src_cell, "dst": e.dst_cell, "ok": None})
    elif isinstance(e, HealEnded) and story.heals:
        story.heals[-1]["ok"] = e.ok
    elif isinstance(e, UpdateBegan):
        update = {
            "update": e.update_id,
            "version": e.version,
            "updater": e.updater,
            "engines": list(e.engines),
            "outcome": "running" if e.publishes else "sync",
        }
        updates[e.update_id] = update
        story.updates.append(update)
    elif isinstance(e, VersionPublished) and e.update_id in updates:
        updates[e.update_id]["outcome"] = "published"
    elif isinstance(e, UpdateAborted) and e.update_id in updates:
        updates[e.update_id] |= {
            "outcome": "aborted",
            "cause": e.cause.value,
            "component": e.component,
            "reason": e.reason,
        }
    elif isinstance(e, FaultInjected):
        story.faults.append(
            {"t": e.t, "fault": e.fault.value, "target": _target(e), "detail": e.detail}
        )
    elif isinstance(e, EngineStateChanged):
        story.engines.append(
            {"engine": e.engine, "old": e.old.value, "new": e.new.value, "reason": e.reason}
        )


def step_stories(history: History) -> list[StepStory]:
    """One story per step begun (and one for what came before the first)."""
    stories = [StepStory(None)]
    updates: dict[int, dict[str, Any]] = {}
    for e in history:
        if isinstance(e, StepBegan):
            stories.append(StepStory(e.step))
        elif not isinstance(e, StepCommitted):
            _record(stories[-1], e, updates)
    if not any((stories[0].faults, stories[0].engines, stories[0].updates, stories[0].heals)):
        stories = stories[1:]
    return stories


def _attempt_words(a: dict[str, Any]) -> str:
    words = f"try {a['attempt']} on {a['cells']}: {a.get('decision', 'unfinished')}"
    extra = [f"{k} {a[k]}" for k in ("discarded", "errored") if a.get(k)]
    return words + (f" ({', '.join(extra)})" if extra else "")


def _update_words(u: dict[str, Any]) -> str:
    head = f"update v{u['version']} by cell {u['updater']}"
    if u["outcome"] == "aborted":
        return f"{head} aborted: {u['component']} failed ({u['reason']})"
    if u["outcome"] == "sync":
        return f"sync of {u['engines']} to v{u['version']} by cell {u['updater']}"
    return f"{head}: {u['outcome']}"


def story_lines(stories: list[StepStory]) -> list[str]:
    """The text form: eventful steps in full, plain ones folded into ranges."""
    lines: list[str] = []
    plain: list[int] = []

    def flush() -> None:
        if plain:
            if len(plain) == 1:
                lines.append(f"  step {plain[0]}: committed at the first try, published a version")
            else:
                lines.append(
                    f"  steps {plain[0]}-{plain[-1]}: committed at the first try, each published "
                    "a version"
                )
            plain.clear()

    for story in stories:
        if story.step is not None and story.plain:
            plain.append(story.step)
            continue
        flush()
        title = "before step 0" if story.step is None else f"step {story.step}"
        lines.append(f"  {title}:")
        for fault in story.faults:
            lines.append(
                f"    fault {fault['fault']} {fault['target']} at t={fault['t']:.2f} "
                f"({fault['detail']})"
            )
        for heal in story.heals:
            result = "ok" if heal["ok"] else "failed"
            lines.append(f"    heal cell {heal['src']} -> cell {heal['dst']}: {result}")
        lines += [f"    {_attempt_words(a)}" for a in story.attempts]
        lines += [f"    {_update_words(u)}" for u in story.updates]
        for eng in story.engines:
            lines.append(f"    {eng['engine']}: {eng['old']} -> {eng['new']} ({eng['reason']})")
    flush()
    return lines
