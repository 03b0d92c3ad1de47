"""The six oracles of north-star, as functions over one event history.

Each oracle reads only the history (simulated or real), recomputes what it
checks from first principles (staleness from the samples' versions, not from
what the buffer reported) and returns the first violation, with the events
that prove it, or None.

1. monotonic_versions   versions never go backwards: at the rollout manager
                        (published), per engine (stamps, samples), at the consumer
2. bounded_staleness    every trained group has 0 <= staleness <= bound
3. exactly_once         each prompt is trained in at most one committed step;
                        at the end each drawn prompt is trained, dropped or outstanding
4. published_weights   no sample from unpublished weights; no engine serves a
                        mix of two versions, stale weights after an update, or
                        unsynced weights after a restart; a recorded checksum
                        of an engine's weights equals the trainer's
5. progress             after the last fault, steps commit and live engines
                        reach the newest version within a bounded time
6. failover_witness     each injected cell/engine fault really took effect
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from miles_core.events import (
    BucketSent,
    CellStateChanged,
    EnginesResumed,
    EngineStamped,
    EngineStateChanged,
    Event,
    FaultInjected,
    FaultKind,
    FaultScheduled,
    GroupDropped,
    GroupGot,
    GroupTrained,
    HealEnded,
    History,
    LedgerRestored,
    PromptDrawn,
    QuorumChanged,
    RunEnded,
    RunStarted,
    RunStatus,
    SampleGenerated,
    StepCommitted,
    UpdateBegan,
    VersionPublished,
    WeightsChecked,
)
from miles_core.versions import INITIAL_WEIGHTS_VERSION

Indexed = tuple[int, Event]


@dataclass(frozen=True)
class Violation:
    oracle: str
    message: str
    evidence: tuple[Indexed, ...] = field(default=())
    """(seq, event) pairs that prove the violation, in history order."""

    def __str__(self) -> str:
        lines = [f"[{self.oracle}] {self.message}"]
        lines += [f"  #{seq} t={event.t}: {event}" for seq, event in self.evidence]
        return "\n".join(lines)


def _v(version: int | None) -> int:
    return INITIAL_WEIGHTS_VERSION if version is None else version


def _run_started(history: History) -> Indexed | None:
    return next(((s, e) for s, e in history.indexed() if isinstance(e, RunStarted)), None)


# -- 1 -----------------------------------------------------------------------


def monotonic_versions(history: History) -> Violation | None:
    """Published versions strictly increase; per engine stamps and samples, and the
    consumer's version, never decrease."""
    name = "monotonic_versions"
    last_published: Indexed | None = None
    last_stamp: dict[str, Indexed] = {}
    last_sample: dict[str, Indexed] = {}
    last_got: Indexed | None = None
    for seq, e in history.indexed():
        if isinstance(e, VersionPublished):
            if last_published is not None and e.version <= last_published[1].version:
                return Violation(
                    name,
                    f"published version went from {last_published[1].version} to {e.version} "
                    f"(updater cell {e.updater})",
                    (last_published, (seq, e)),
                )
            last_published = (seq, e)
        elif isinstance(e, LedgerRestored):  # a resumed run continues its checkpoint's sequence
            last_published = (seq, e)
        elif isinstance(e, EngineStamped):
            prev = last_stamp.get(e.engine)
            if prev is not None and e.version < prev[1].version:
                return Violation(
                    name,
                    f"engine {e.engine} stamped {e.version} after {prev[1].version}",
                    (prev, (seq, e)),
                )
            last_stamp[e.engine] = (seq, e)
        elif isinstance(e, SampleGenerated) and not e.aborted:
            prev = last_sample.get(e.engine)
            if prev is not None and _v(e.version) < _v(prev[1].version):
                return Violation(
                    name,
                    f"engine {e.engine} generated under version {e.version} after "
                    f"{prev[1].version}",
                    (prev, (seq, e)),
                )
            last_sample[e.engine] = (seq, e)
        elif isinstance(e, GroupGot) and e.current_version is not None:
            if last_got is not None and e.current_version < last_got[1].current_version:
                return Violation(
                    name,
                    f"the consumer's version went from {last_got[1].current_version} to "
                    f"{e.current_version}",
                    (last_got, (seq, e)),
                )
            last_got = (seq, e)
    return None


# -- 2 -----------------------------------------------------------------------


def bounded_staleness(history: History, bound: int | None = None) -> Violation | None:
    """Each trained group: 0 <= current version at consumption - oldest sample version <= bound.

    The bound defaults to RunStarted.max_weight_staleness; staleness is recomputed
    from the group's SampleGenerated events and must match what the buffer reported.
    """
    name = "bounded_staleness"
    if bound is None:
        started = _run_started(history)
        bound = started[1].max_weight_staleness if started else None
    oldest: dict[int, Indexed] = {}
    got: dict[int, Indexed] = {}
    for seq, e in history.indexed():
        if isinstance(e, SampleGenerated):
            prev = oldest.get(e.group_id)
            if prev is None or _v(e.version) < _v(prev[1].version):
                oldest[e.group_id] = (seq, e)
        elif isinstance(e, GroupGot):
            got[e.group_id] = (seq, e)
        elif isinstance(e, GroupTrained):
            consumed = got.get(e.group_id)
            if consumed is None:
                return Violation(
                    name,
                    f"group {e.group_id} was trained but never got from the buffer",
                    ((seq, e),),
                )
            current = consumed[1].current_version
            if current is None:
                continue  # before the first update the filter is off
            sample = oldest.get(e.group_id)
            if sample is None:
                return Violation(
                    name,
                    f"group {e.group_id} was trained but has no generated sample",
                    (consumed, (seq, e)),
                )
            age = current - _v(sample[1].version)
            evidence = (sample, consumed, (seq, e))
            if consumed[1].staleness is not None and consumed[1].staleness != age:
                return Violation(
                    name,
                    f"group {e.group_id}: the buffer reported staleness {consumed[1].staleness} "
                    f"but its samples give {current} - {_v(sample[1].version)} = {age}",
                    evidence,
                )
            if age < 0:
                return Violation(
                    name,
                    f"group {e.group_id} trained with negative staleness {age}: a sample of "
                    f"version {sample[1].version} consumed at version {current}",
                    evidence,
                )
            if bound is not None and age > bound:
                return Violation(
                    name,
                    f"group {e.group_id} trained with staleness {age} > bound {bound}",
                    evidence,
                )
    return None


# -- 3 -----------------------------------------------------------------------


def exactly_once(history: History) -> Violation | None:
    """A prompt is trained in at most one committed step, never both trained and dropped;
    at RunEnded each drawn prompt is trained, dropped or outstanding, exactly one of them."""
    name = "exactly_once"
    drawn: dict[int, Indexed] = {}
    trained: dict[int, Indexed] = {}
    dropped: dict[int, Indexed] = {}
    ended: Indexed | None = None
    for seq, e in history.indexed():
        if isinstance(e, PromptDrawn):
            if e.prompt_id in drawn:
                return Violation(
                    name,
                    f"prompt {e.prompt_id} drawn twice from the dataset",
                    (drawn[e.prompt_id], (seq, e)),
                )
            drawn[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupTrained):
            if e.prompt_id not in drawn:
                return Violation(name, f"prompt {e.prompt_id} trained but never drawn", ((seq, e),))
            if e.prompt_id in trained:
                first = trained[e.prompt_id]
                return Violation(
                    name,
                    f"prompt {e.prompt_id} trained twice (steps {first[1].step} and {e.step})",
                    (first, (seq, e)),
                )
            if e.prompt_id in dropped:
                return Violation(
                    name,
                    f"prompt {e.prompt_id} trained after it was dropped",
                    (dropped[e.prompt_id], (seq, e)),
                )
            trained[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupDropped):
            if e.prompt_id in trained:
                return Violation(
                    name,
                    f"prompt {e.prompt_id} dropped after it was trained",
                    (trained[e.prompt_id], (seq, e)),
                )
            if e.prompt_id in dropped:
                return Violation(
                    name, f"prompt {e.prompt_id} dropped twice", (dropped[e.prompt_id], (seq, e))
                )
            if not e.reason:
                return Violation(
                    name, f"prompt {e.prompt_id} dropped without a reason", ((seq, e),)
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
            return Violation(name, f"prompt {prompt} {why} at the end of the run", tuple(evidence))
    unknown = outstanding - set(drawn)
    if unknown:
        return Violation(
            name, f"prompts {sorted(unknown)} reported outstanding but never drawn", (ended,)
        )
    return None


# -- 4 -----------------------------------------------------------------------


@dataclass
class _EngineWeights:
    version: int | None = None
    stamp: Indexed | None = None
    partial: Indexed | None = None
    """The first bucket of an update this engine has not completed."""
    buckets: set[int] = field(default_factory=set)
    unsynced: Indexed | None = None
    """The restart after which the engine has not yet received the published weights."""


def published_weights(history: History) -> Violation | None:
    """No sample from weights never published; no engine serving mixed, stale or
    unsynced weights."""
    name = "published_weights"
    published: dict[int, Indexed] = {}
    latest_published: Indexed | None = None
    completed: Indexed | None = None  # the resume of the newest completed publishing update
    updates: dict[int, Indexed] = {}
    engines: dict[str, _EngineWeights] = {}

    def engine(e: str) -> _EngineWeights:
        state = engines.get(e)
        if state is None:
            state = engines[e] = _EngineWeights()
        return state

    for seq, e in history.indexed():
        if isinstance(e, SampleGenerated):  # the commonest event: tested first
            if not e.aborted:
                violation = _sample_weights(name, seq, e, engine(e.engine), published)
                if violation is not None:
                    return violation
                if completed is not None:
                    newest = updates[completed[1].update_id][1].version
                    if _v(e.version) < newest:
                        return Violation(
                            name,
                            f"engine {e.engine} served version {e.version} after the update "
                            f"to {newest} completed",
                            (completed, (seq, e)),
                        )
        elif isinstance(e, UpdateBegan):
            updates[e.update_id] = (seq, e)
        elif isinstance(e, (VersionPublished, LedgerRestored)):
            published[e.version] = (seq, e)
            latest_published = (seq, e)
        elif isinstance(e, BucketSent):
            for eng in e.engines:
                state = engine(eng)
                if state.partial is None or state.partial[1].update_id != e.update_id:
                    state.partial, state.buckets = (seq, e), set()
                state.buckets.add(e.bucket)
        elif isinstance(e, EngineStamped):
            state = engine(e.engine)
            began = updates.get(e.update_id)
            n = began[1].n_buckets if began else None
            got = (
                state.buckets
                if state.partial and state.partial[1].update_id == e.update_id
                else set()
            )
            if n is None or len(got) != n:
                return Violation(
                    name,
                    f"engine {e.engine} stamped version {e.version} after receiving "
                    f"{len(got)} of {n} buckets of update {e.update_id}",
                    tuple(x for x in (began, state.partial, (seq, e)) if x),
                )
            engines[e.engine] = _EngineWeights(version=e.version, stamp=(seq, e))
        elif isinstance(e, EnginesResumed):
            for eng in e.engines:
                state = engine(eng)
                if state.partial is not None:
                    return Violation(
                        name,
                        f"engine {eng} resumed holding part of update "
                        f"{state.partial[1].update_id} (a mix of two versions)",
                        (state.partial, (seq, e)),
                    )
            began = updates.get(e.update_id)
            if began and began[1].publishes and began[1].version in published:
                completed = (seq, e)
        elif isinstance(e, EngineStateChanged):
            if e.up:  # a fresh process: initial weights until the published ones arrive
                unsynced = (seq, e) if latest_published is not None else None
                engines[e.engine] = _EngineWeights(unsynced=unsynced)
        elif isinstance(e, WeightsChecked) and e.checksum != e.trainer_checksum:
            return Violation(
                name,
                f"engine {e.engine}'s weights at version {e.version} differ from the "
                f"trainer's (checksum {e.checksum} != {e.trainer_checksum})",
                tuple(x for x in (engine(e.engine).stamp, (seq, e)) if x),
            )
    return None


def _sample_weights(
    name: str,
    seq: int,
    e: SampleGenerated,
    state: _EngineWeights,
    published: dict[int, Indexed],
) -> Violation | None:
    """What is wrong with the weights a non-aborted sample came from, if anything."""
    if e.version is not None and e.version not in published:
        return Violation(
            name,
            f"engine {e.engine} generated under version {e.version}, which was never "
            "published (or not yet)",
            tuple(x for x in (state.stamp, (seq, e)) if x),
        )
    if state.partial is not None:
        return Violation(
            name,
            f"engine {e.engine} generated while holding part of update "
            f"{state.partial[1].update_id} (mixed weights)",
            (state.partial, (seq, e)),
        )
    if state.unsynced is not None:
        return Violation(
            name,
            f"engine {e.engine} generated after a restart before it received the published weights",
            (state.unsynced, (seq, e)),
        )
    if e.version != state.version:
        return Violation(
            name,
            f"engine {e.engine} reported version {e.version} but was stamped {state.version}",
            tuple(x for x in (state.stamp, (seq, e)) if x),
        )
    return None


# -- 5 -----------------------------------------------------------------------


def progress(history: History, window: float) -> Violation | None:
    """After the last fault, no span longer than ``window`` passes without a step
    commit (until the end of the history), and every live engine reaches the newest
    published version within ``window`` of its publication.

    A run that ended with a clear error (RunStatus.FAILED) is not a hang; a
    STALLED run is always a violation. Only spans the run actually lasted are judged.
    """
    name = "progress"
    if window <= 0:
        raise ValueError(f"window must be > 0 seconds, got {window}")
    if not len(history):
        return None
    # one pass picks out the few events this oracle reads
    started: Indexed | None = None
    ended: Indexed | None = None
    last_fault: Indexed | None = None
    all_commits: list[Indexed] = []
    publications: list[Indexed] = []
    engine_events: list[Indexed] = []
    for seq, e in history.indexed():
        if isinstance(e, StepCommitted):
            all_commits.append((seq, e))
        elif isinstance(e, EngineStateChanged | EngineStamped):
            engine_events.append((seq, e))
        elif isinstance(e, VersionPublished):
            publications.append((seq, e))
        elif isinstance(e, FaultInjected):
            last_fault = (seq, e)
        elif isinstance(e, RunStarted):
            started = started or (seq, e)
        elif isinstance(e, RunEnded):
            ended = ended or (seq, e)
    if ended is not None and ended[1].status is RunStatus.STALLED:
        return Violation(name, f"the run stalled: {ended[1].reason}", (ended,))
    if ended is not None and ended[1].status is RunStatus.FAILED:
        return None
    last: Indexed = (len(history) - 1, history[-1])
    end_t = last[1].t
    since: Indexed = last_fault or (0, history[0])
    commits = [(s, e) for s, e in all_commits if e.t > since[1].t]
    marks = [since, *commits, last]
    for before, after in itertools.pairwise(marks):
        if after[1].t - before[1].t > window:
            what = "the last fault" if before is last_fault else "the start"
            if isinstance(before[1], StepCommitted):
                what = f"step {before[1].step} committed"
            return Violation(
                name,
                f"no step committed for {after[1].t - before[1].t:g}s (> window {window:g}s) "
                f"after {what} at t={before[1].t:g}",
                (before, after),
            )
    if not publications:
        return None
    newest = publications[-1]
    live: dict[str, float] = {}
    stamped: dict[str, float] = {}
    if started:
        live = {eng: started[1].t for eng in started[1].engines}
    for _, e in engine_events:
        if isinstance(e, EngineStateChanged):
            if e.up:
                live[e.engine] = e.t
            else:
                live.pop(e.engine, None)
                stamped.pop(e.engine, None)
        elif e.version == newest[1].version:
            stamped[e.engine] = e.t
    for eng, up_since in sorted(live.items()):
        due = max(newest[1].t, up_since) + window
        if eng not in stamped and end_t > due:
            return Violation(
                name,
                f"live engine {eng} did not reach version {newest[1].version} within {window}s",
                (newest, last),
            )
    return None


# -- 6 -----------------------------------------------------------------------


def failover_witness(history: History) -> Violation | None:
    """Each cell kill/stop shrank a later quorum; each cell start was healed into one;
    each engine kill took the engine down; each restart brought it up and synced it.
    In a run that completed, every scheduled fault fired (a fault that never fired
    tested nothing)."""
    scheduled: list[Indexed] = []
    fired: list[Indexed] = []
    ended: Indexed | None = None
    published = False
    for seq, e in history.indexed():
        if isinstance(e, FaultScheduled):
            scheduled.append((seq, e))
        elif isinstance(e, FaultInjected):
            fired.append((seq, e))
        elif isinstance(e, VersionPublished):
            published = True
        elif isinstance(e, RunEnded):
            ended = ended or (seq, e)
    if ended is not None and ended[1].status is RunStatus.COMPLETED:
        remaining = [(e.fault, e.cell, e.engine, e.detail) for _, e in fired]
        for seq, e in scheduled:
            key = (e.fault, e.cell, e.engine, e.detail)
            if key in remaining:
                remaining.remove(key)
                continue
            return Violation(
                "failover_witness",
                f"scheduled fault {e.fault.value} ({e.detail}) never fired: the run did not "
                "reach its point; make the run longer or move the fault",
                ((seq, e), ended),
            )
    events = list(history.indexed()) if fired else []
    for seq, e in fired:
        missing = _missing_witness(e, events[seq + 1 :], published)
        if missing is not None:
            return Violation(
                "failover_witness",
                f"fault {e.fault.value} had no observable effect: {missing}",
                ((seq, e),),
            )
    return None


def _missing_witness(fault: FaultInjected, after: list[Indexed], published: bool) -> str | None:
    """What the fault should have caused and did not; None when it is witnessed."""
    cell, engine = fault.cell, fault.engine
    if fault.fault in (FaultKind.KILL_CELL, FaultKind.STOP_CELL):
        # the control plane noticed (the cell failed), and acted on it: a later quorum
        # left the cell out, or the cell was healed back, or - with no cell left to
        # form a quorum - the run stopped with its clear error
        failed = _first(
            after,
            lambda x: isinstance(x, CellStateChanged) and x.cell == cell and x.new == "errored",
        )
        if failed is None:
            return f"cell {cell} was never marked failed"
        later = [p for p in after if p[0] > failed[0]]
        if _first(later, lambda x: isinstance(x, QuorumChanged) and cell not in x.members):
            return None
        if _first(later, lambda x: isinstance(x, HealEnded) and x.dst_cell == cell and x.ok):
            return None
        if _first(later, lambda x: isinstance(x, RunEnded) and x.status is RunStatus.FAILED):
            return None
        return f"cell {cell} failed but no later quorum excluded it and it was not healed"
    if fault.fault is FaultKind.START_CELL:
        healed = _first(after, lambda x: isinstance(x, HealEnded) and x.dst_cell == cell and x.ok)
        grown = _first(after, lambda x: isinstance(x, QuorumChanged) and cell in x.members)
        return None if healed and grown else f"cell {cell} was not healed into a quorum"
    if fault.fault is FaultKind.KILL_ENGINE:
        if _first(
            after, lambda x: isinstance(x, EngineStateChanged) and x.engine == engine and not x.up
        ):
            return None
        return f"engine {engine} never went down"
    if fault.fault is FaultKind.RESTART_ENGINE:
        up = _first(
            after, lambda x: isinstance(x, EngineStateChanged) and x.engine == engine and x.up
        )
        if up is None:
            return f"engine {engine} never came back up"
        later = [p for p in after if p[0] > up[0]]
        if published and not _first(
            later, lambda x: isinstance(x, EngineStamped) and x.engine == engine
        ):
            return f"engine {engine} came back up but was never synced to the published weights"
    return None


def _first(events: list[Indexed], predicate: Callable[[Event], bool]) -> Indexed | None:
    return next(((s, x) for s, x in events if predicate(x)), None)


# -- all of them ---------------------------------------------------------------

ORACLES = (
    "monotonic_versions",
    "bounded_staleness",
    "exactly_once",
    "published_weights",
    "progress",
    "failover_witness",
)


def verdict_lines(verdicts: dict[str, Violation | None]) -> list[str]:
    """One line per oracle (pass / FAIL), each failure's evidence indented under it: what
    every CLI prints, simulated or real."""
    lines = []
    for name, verdict in verdicts.items():
        lines.append(f"  oracle {name:20s} {'pass' if verdict is None else 'FAIL'}")
        if verdict is not None:
            lines.append("    " + str(verdict).replace("\n", "\n    "))
    return lines


def check_all(history: History, progress_window: float) -> dict[str, Violation | None]:
    """Every oracle's verdict, by name (None means it passed)."""
    return {
        "monotonic_versions": monotonic_versions(history),
        "bounded_staleness": bounded_staleness(history),
        "exactly_once": exactly_once(history),
        "published_weights": published_weights(history),
        "progress": progress(history, progress_window),
        "failover_witness": failover_witness(history),
    }
