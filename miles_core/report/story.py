"""What happened in a run, step by step, read from its history (no trace needed).

For each training step: its attempts and their verdicts, the quorum it
committed on, the heals before it, the weight updates after it (who published
which version, which were aborted and why, which synced restarted engines),
the faults that fired and the engines that changed state meanwhile. Each item
carries ``t``, when it was settled (a fault fired, an attempt's verdict, a heal's
end, an update's publish, abort or resume, an engine's move); the text form
prints a step's lines in that order (ties in history order), only for the steps
where something other than a first-try commit and publish happened, and folds the
rest into ranges.

An update is named the same everywhere (here, the trace, the engines' state
lines): ``update N`` by its id, with the version it carries, ``update 3 (v4)``,
or ``update 5 (sync to v4)`` for a sync of restarted engines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from miles_core.cells import Decision
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    DriverAdopted,
    DriverRestarted,
    EnginesResumed,
    EngineStateChanged,
    Event,
    FaultInjected,
    HealBegan,
    HealEnded,
    History,
    JobKilled,
    JobResumed,
    StepBegan,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)


def update_name(update_id: int, version: int, publishes: bool = True) -> str:
    """``update 3 (v4)``; ``update 5 (sync to v4)`` for a sync that publishes nothing."""
    return f"update {update_id} ({'v' if publishes else 'sync to v'}{version})"


@dataclass
class Placed:
    """One line of a step's story: its kind (the StepStory list it is in), the item, and
    the time and history position of the event that settled it, which order the lines."""

    kind: str
    item: dict[str, Any]
    t: float
    index: int

    def settle(self, e: Event, index: int) -> None:
        self.t, self.index, self.item["t"] = e.t, index, e.t


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
    job: list[dict[str, Any]] = field(default_factory=list)
    """The whole job killed (kill_job) and resumed: from which save, at which step."""
    timeline: list[Placed] = field(default_factory=list, repr=False, compare=False)
    """Every item above, with where it goes in time (not part of ``to_dict``)."""

    @property
    def plain(self) -> bool:
        """A first-try commit and one publishing update, nothing else."""
        return (
            len(self.attempts) == 1
            and not (self.heals or self.faults or self.engines or self.job)
            and [u["outcome"] for u in self.updates] == ["published"]
        )

    def in_time_order(self) -> list[Placed]:
        """The lines by the time they were settled, ties in history order."""
        return sorted(self.timeline, key=lambda p: (p.t, p.index))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "timeline"}


_UpdateEvent = UpdateBegan | VersionPublished | UpdateAborted | EnginesResumed


def _target(e: FaultInjected) -> str:
    return f"cell {e.cell}" if e.cell is not None else e.engine or "the world"


class _Teller:
    """Reads the history once, event by event, into step stories."""

    def __init__(self) -> None:
        self.stories = [StepStory(None)]
        self.updates: dict[int, Placed] = {}
        """Every update by id: one may end after the next step began."""

    def place(self, kind: str, item: dict[str, Any], e: Event, index: int) -> Placed:
        story = self.stories[-1]
        item["t"] = e.t
        getattr(story, kind).append(item)
        story.timeline.append(Placed(kind, item, e.t, index))
        return story.timeline[-1]

    def last(self, kind: str, **match: Any) -> Placed | None:
        """The current story's latest item of a kind (with these values)."""
        return next(
            (
                p
                for p in reversed(self.stories[-1].timeline)
                if p.kind == kind and all(p.item[k] == v for k, v in match.items())
            ),
            None,
        )

    def add(self, e: Event, index: int) -> None:
        if isinstance(e, StepBegan):
            self.stories.append(StepStory(e.step))
        elif isinstance(e, AttemptBegan):
            self.place("attempts", {"attempt": e.attempt, "cells": list(e.cells)}, e, index)
        elif isinstance(e, AttemptEnded):
            self.attempt_ended(e, index)
        elif isinstance(e, HealBegan):
            self.place("heals", {"src": e.src_cell, "dst": e.dst_cell, "ok": None}, e, index)
        elif isinstance(e, HealEnded) and (heal := self.last("heals", dst=e.dst_cell, ok=None)):
            heal.item["ok"] = e.ok
            heal.settle(e, index)
        elif isinstance(e, _UpdateEvent):
            self.update(e, index)
        elif isinstance(e, FaultInjected):
            fault = {"fault": e.fault.value, "target": _target(e), "detail": e.detail}
            self.place("faults", fault, e, index)
        elif isinstance(e, EngineStateChanged):
            engine = {"engine": e.engine, "old": e.old.value, "new": e.new.value}
            self.place("engines", engine | {"reason": e.reason}, e, index)
        elif isinstance(e, JobKilled | JobResumed):
            self.job(e, index)

    def job(self, e: JobKilled | JobResumed, index: int) -> None:
        """The job killed whole, or its restart (updates count afresh in the new job)."""
        if isinstance(e, DriverRestarted | DriverAdopted):
            self.driver(e, index)
            return
        if isinstance(e, JobKilled):
            self.updates = {}
            text = f"the job was killed whole ({e.reason}): every process died"
            self.place("job", {"event": "killed", "text": text}, e, index)
            return
        save = "scratch (no save had committed)"
        if e.save_step is not None:
            save = f"the save of step {e.save_step} (v{e.version})"
        torn = f", skipping the torn save(s) of step {list(e.torn)}" if e.torn else ""
        text = f"the job resumed from {save} at step {e.next_step}{torn}"
        self.place("job", {"event": "resumed", "text": text}, e, index)

    def driver(self, e: DriverRestarted | DriverAdopted, index: int) -> None:
        """A driver hot restart: the driver died alone, and a new one adopted the world."""
        self.updates = {}
        if isinstance(e, DriverRestarted):
            text = f"the driver died alone ({e.reason}): cells, engines and router stayed up"
            self.place("job", {"event": "killed", "text": text}, e, index)
            return
        held = "nothing held (no version published)"
        if e.save_step is not None:
            held = f"the state the trainer held at step {e.save_step} (v{e.version})"
        found = f"closed {list(e.closed)}, resumed {list(e.resumed)}, aborted {e.aborted}"
        text = f"a new driver adopted the world from {held} at step {e.next_step}: {found}"
        self.place("job", {"event": "resumed", "text": text}, e, index)

    def attempt_ended(self, e: AttemptEnded, index: int) -> None:
        attempt = self.last("attempts")
        if attempt is None:
            return
        attempt.item |= {
            "decision": e.decision.value,
            "normal": list(e.normal),
            "discarded": list(e.discarded),
            "errored": list(e.errored),
        }
        attempt.settle(e, index)
        if e.decision is Decision.COMMIT:
            self.stories[-1].quorum = list(attempt.item["cells"])

    def update(self, e: _UpdateEvent, index: int) -> None:
        """An update begins, publishes, aborts, or (a sync) resumes its engines."""
        if isinstance(e, UpdateBegan):
            update = {
                "update": e.update_id,
                "version": e.version,
                "updater": e.updater,
                "engines": list(e.engines),
                "publishes": e.publishes,
                "outcome": "running" if e.publishes else "sync",
            }
            self.updates[e.update_id] = self.place("updates", update, e, index)
            return
        placed = self.updates.get(e.update_id)
        if placed is None:
            return
        if isinstance(e, VersionPublished):
            placed.item["outcome"] = "published"
        elif isinstance(e, UpdateAborted):
            placed.item |= {
                "outcome": "aborted",
                "cause": e.cause.value,
                "component": e.component,
                "reason": e.reason,
            }
        elif placed.item["outcome"] != "sync":  # a sync is settled when its engines resume
            return
        placed.settle(e, index)


def step_stories(history: History) -> list[StepStory]:
    """One story per step begun (and one for what came before the first)."""
    teller = _Teller()
    for index, e in enumerate(history):
        teller.add(e, index)
    stories = teller.stories
    if not stories[0].timeline:
        stories = stories[1:]
    return stories


def _attempt_words(a: dict[str, Any]) -> str:
    words = f"try {a['attempt']} on {a['cells']}: {a.get('decision', 'unfinished')}"
    extra = [f"{k} {a[k]}" for k in ("discarded", "errored") if a.get(k)]
    return words + (f" ({', '.join(extra)})" if extra else "")


def _update_words(u: dict[str, Any]) -> str:
    sync = not u["publishes"]
    head = f"{update_name(u['update'], u['version'], u['publishes'])} by cell {u['updater']}"
    if sync:
        head += f" for {u['engines']}"
    if u["outcome"] == "aborted":
        return f"{head} aborted: {u['component']} failed ({u['reason']})"
    return head if sync else f"{head}: {u['outcome']}"


def _line(placed: Placed) -> str:
    """The text of one story line."""
    item = placed.item
    if placed.kind == "faults":
        return f"fault {item['fault']} {item['target']} at t={item['t']:.2f} ({item['detail']})"
    if placed.kind == "heals":
        result = "ok" if item["ok"] else ("failed" if item["ok"] is False else "unfinished")
        return f"heal cell {item['src']} -> cell {item['dst']}: {result}"
    if placed.kind == "attempts":
        return _attempt_words(item)
    if placed.kind == "updates":
        return _update_words(item)
    if placed.kind == "job":
        return str(item["text"])
    return f"{item['engine']}: {item['old']} -> {item['new']} ({item['reason']})"


def story_lines(stories: list[StepStory]) -> list[str]:
    """The text form: eventful steps in full, in time order, plain ones folded into ranges."""
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
        lines.append(f"  {'before step 0' if story.step is None else f'step {story.step}'}:")
        lines += [f"    {_line(placed)}" for placed in story.in_time_order()]
    flush()
    return lines
