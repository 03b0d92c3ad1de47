"""resume: a job killed whole goes on from its newest committed save, versions and prompts
exactly once across the kill.

Judged on the joined history of every controller of the job (miles_core.segments):

- the save: each restart after a kill loads the newest save committed by then (SaveBegan,
  then SaveCommitted, replayed as the storage held them: a save begun again is torn until
  it commits), never a torn one and never an older one; with none committed it starts over;
- the versions: in the committed timeline (each segment up to the moment its successor's
  save was taken, then that successor) the published versions go 1, 2, 3, ... with no gap
  and no repeat; a resume restores the version its save was taken at, so the next one
  published is that + 1 (those the lost tail published are discarded with it);
- the steps: the committed steps go 0, 1, 2, ...; a resume goes on at the save's step + 1;
- the prompts: none trained before the save a job resumed from is drawn or trained again
  after the resume (the data cursor was restored); every prompt pending in that save
  (drawn, neither trained nor dropped when it was taken) or trained only in the lost tail
  ends trained, dropped or outstanding (the save's queued and recycled groups were
  restored); the prompts the timeline drew are 0, 1, 2, ... with none skipped.

A driver hot restart (DriverAdopted, a JobResumed of the processes kept) resumes from the
state the trainer held, not from a save: miles_core.oracles.adoption judges what it adopted.

A history without JobResumed passes (a run that was never killed: exactly_once judges it).
"""

from __future__ import annotations

from collections.abc import Callable

from miles_core.event_index import Indexed, select
from miles_core.events import (
    DriverAdopted,
    GroupDropped,
    GroupTrained,
    History,
    JobKilled,
    JobResumed,
    LedgerRestored,
    PromptDrawn,
    RunEnded,
    SaveBegan,
    SaveCommitted,
    StepCommitted,
    VersionPublished,
)
from miles_core.oracles.adoption import adopted
from miles_core.oracles.base import Violation
from miles_core.segments import timeline

NAME = "resume"

Cite = Callable[[Indexed], Indexed]
"""A timeline event's (seq, event) as the joined history numbers it."""


def resume(history: History) -> Violation | None:
    if not select(history, JobResumed):
        return None
    kept, seqs = timeline(history)

    def at(pair: Indexed) -> Indexed:  # a timeline event, where it is in the joined history
        return (seqs[pair[0]] if seqs else pair[0], pair[1])

    return (
        _saves(history)
        or adopted(history)
        or _versions(kept, at)
        or _steps(kept, at)
        or _prompts(history, kept, seqs, at)
    )


def _saves(history: History) -> Violation | None:
    """Each restart after a kill loaded the newest save committed by then."""
    stored: dict[int, tuple[bool, Indexed]] = {}
    kill: Indexed | None = None
    for seq, e in select(history, SaveBegan, SaveCommitted, JobKilled, JobResumed):
        if isinstance(e, SaveBegan):
            stored[e.step] = (False, (seq, e))
        elif isinstance(e, SaveCommitted):
            stored[e.step] = (True, (seq, e))
        elif isinstance(e, JobKilled):
            kill = (seq, e)
        elif isinstance(e, DriverAdopted):
            continue  # a hot restart adopts what the trainer held, not a save (adoption.py)
        elif isinstance(e, JobResumed) and kill is not None:
            newest = max((s for s, (ok, _) in stored.items() if ok), default=None)
            if e.save_step != newest:
                return _wrong_save(e, (seq, e), newest, stored, kill)
    return None


def _wrong_save(
    e: JobResumed,
    resumed: Indexed,
    newest: int | None,
    stored: dict[int, tuple[bool, Indexed]],
    kill: Indexed,
) -> Violation:
    step = e.save_step
    should = (
        "none had committed, so the job should have started over"
        if newest is None
        else f"the newest committed save was that of step {newest}"
    )
    if step is None:
        assert newest is not None
        what = f"the job started over after the kill at t={kill[1].t:g}, though {should}"
        return Violation(NAME, what, (stored[newest][1], resumed))
    if step not in stored:
        what = f"the job resumed from a save of step {step}, which was never begun; {should}"
        return Violation(NAME, what, (kill, resumed))
    committed, where = stored[step]
    if not committed:
        what = (
            f"the job resumed from the save of step {step}, which the kill at t={kill[1].t:g} "
            f"tore: it began at t={where[1].t:g} and never committed (a torn save must never "
            f"be read); {should}"
        )
        return Violation(NAME, what, (where, kill, resumed))
    what = f"the job resumed from the save of step {step}, though {should}"
    return Violation(
        NAME, what, (where, stored[newest][1] if newest is not None else kill, resumed)
    )


def _versions(kept: History, cite: Cite) -> Violation | None:
    """Published versions go up by one, on from what each resume restored."""
    current: Indexed | None = None
    resumed: Indexed | None = None
    for seq, e in select(kept, VersionPublished, JobResumed, LedgerRestored):
        if isinstance(e, JobResumed | LedgerRestored):
            if isinstance(e, JobResumed):
                resumed = (seq, e)
            had = current[1].version if current is not None else None  # type: ignore[union-attr]
            if current is not None and e.version != had:
                what = "resume" if isinstance(e, JobResumed) else "restored ledger"
                return Violation(
                    NAME,
                    f"the {what} holds version {e.version}, but the timeline it continues had "
                    f"published version {had} when its save was taken",
                    (cite(current), cite((seq, e))),
                )
            if e.version is not None:
                current = (seq, e)
            continue
        assert isinstance(e, VersionPublished)
        had = current[1].version if current is not None else 0  # type: ignore[union-attr]
        if e.version != (had or 0) + 1:
            return Violation(
                NAME, _version_jump(e.version, had, resumed), _cited(cite, current, (seq, e))
            )
        current = (seq, e)
    return None


def _version_jump(version: int, had: int | None, resumed: Indexed | None) -> str:
    had = had or 0
    kind = (
        f"a repeat of version {version}"
        if version <= had
        else f"a gap: version {had + 1} is missing"
    )
    text = f"version {version} was published after version {had}: {kind}"
    if resumed is not None:
        e = resumed[1]
        assert isinstance(e, JobResumed)
        text += (
            f" (the job resumed from the save of step {e.save_step} at version {e.version}: "
            f"the next is {(e.version or 0) + 1}; what the lost tail published is discarded)"
        )
    return text


def _cited(cite: Cite, *pairs: Indexed | None) -> tuple[Indexed, ...]:
    return tuple(cite(p) for p in pairs if p is not None)


def _steps(kept: History, at: Cite) -> Violation | None:
    """Committed steps go 0, 1, 2, ...; a resume goes on at its save's step + 1."""
    expected = 0
    last: Indexed | None = None
    for seq, e in select(kept, StepCommitted, JobResumed):
        if isinstance(e, JobResumed):
            if last is not None and e.next_step != expected:
                return Violation(
                    NAME,
                    f"the job resumed at step {e.next_step}, but the timeline it continues had "
                    f"committed steps 0..{expected - 1}",
                    _cited(at, last, (seq, e)),
                )
            expected = e.next_step
            continue
        assert isinstance(e, StepCommitted)
        if e.step != expected:
            return Violation(
                NAME,
                f"step {e.step} committed where step {expected} was next in the timeline the "
                "job committed",
                _cited(at, last, (seq, e)),
            )
        expected, last = expected + 1, (seq, e)
    return None


def _prompts(history: History, kept: History, seqs: list[int], at: Cite) -> Violation | None:
    """Across each resume: nothing trained before its save comes again; what its save held
    pending, and what only the lost tail trained, is not lost; no prompt is skipped."""
    drawn: dict[int, Indexed] = {}
    trained: dict[int, Indexed] = {}
    dropped: set[int] = set()
    pending: dict[int, Indexed] = {}  # prompt -> the resume whose save held it pending
    resumed: Indexed | None = None
    floor = 0  # a history that begins at a resume (a --load) draws from its save's cursor
    kinds = (PromptDrawn, GroupTrained, GroupDropped, JobResumed, RunEnded)
    for seq, e in select(kept, *kinds):
        if isinstance(e, JobResumed):
            resumed = (seq, e)
            held = set(drawn) - set(trained) - dropped
            if not drawn:  # its save was taken in a history not joined to this one
                held, floor = set(e.pending), e.cursor
            pending |= dict.fromkeys(sorted(held), resumed)
        elif isinstance(e, PromptDrawn):
            first = drawn.get(e.prompt_id)
            if first is not None and resumed is not None and first[0] < resumed[0]:
                return Violation(
                    NAME,
                    _drawn_again(e.prompt_id, first, trained, resumed),
                    _cited(at, first, resumed, (seq, e)),
                )
            drawn[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupTrained):
            first = trained.get(e.prompt_id)
            if first is not None and resumed is not None and first[0] < resumed[0]:
                return Violation(
                    NAME, _trained_again(first, resumed, e), _cited(at, first, resumed, (seq, e))
                )
            trained[e.prompt_id] = (seq, e)
        elif isinstance(e, GroupDropped):
            dropped.add(e.prompt_id)
        elif isinstance(e, RunEnded):
            fated = set(trained) | dropped | set(e.outstanding_prompts)
            tail = _lost_tail(history, set(seqs)) if seqs else {}
            lost = _lost(drawn, fated, pending, tail, (seq, e), at)
            return lost or _skipped(drawn, floor, tail, at)
    return None


def _step(pair: Indexed) -> int:
    """The step of a GroupTrained (or StepCommitted) pair."""
    return pair[1].step  # type: ignore[attr-defined,no-any-return]


def _drawn_again(prompt: int, first: Indexed, trained: dict[int, Indexed], resumed: Indexed) -> str:
    e = resumed[1]
    assert isinstance(e, JobResumed)
    fate = trained.get(prompt)
    was = f", trained at step {_step(fate)}" if fate is not None else ""
    return (
        f"prompt {prompt} was drawn again after the job resumed from the save of step "
        f"{e.save_step} (first drawn at t={first[1].t:g}{was}, before that save): the resume "
        f"did not restore the data cursor (the save holds {e.cursor}), so the prompts before "
        "it come again"
    )


def _trained_again(first: Indexed, resumed: Indexed, e: GroupTrained) -> str:
    r = resumed[1]
    assert isinstance(r, JobResumed)
    return (
        f"prompt {e.prompt_id} was trained at step {_step(first)} before the save of step "
        f"{r.save_step} the job resumed from, and again at step {e.step} after the resume: "
        "trained twice across the kill"
    )


def _lost_tail(history: History, kept: set[int]) -> dict[int, Indexed]:
    """The prompts trained in a lost tail (a committed step the kill discarded)."""
    return {
        e.prompt_id: (seq, e)  # type: ignore[attr-defined]
        for seq, e in select(history, GroupTrained)
        if seq not in kept
    }


def _lost(
    drawn: dict[int, Indexed],
    fated: set[int],
    pending: dict[int, Indexed],
    tail: dict[int, Indexed],
    ended: Indexed,
    at: Cite,
) -> Violation | None:
    for prompt in sorted(set(pending) | (set(tail) & set(drawn))):
        if prompt in fated:
            continue
        if prompt in pending:
            resumed = pending[prompt][1]
            assert isinstance(resumed, JobResumed)
            first = drawn.get(prompt)
            when = f"drawn at t={first[1].t:g}, " if first is not None else ""
            why = (
                f"was pending in the save of step {resumed.save_step} ({when}neither trained "
                "nor dropped when it was taken)"
            )
            fix = "were the save's queued and recycled groups restored?"
            evidence = _cited(at, first, pending[prompt], ended)
        else:
            step = _step(tail[prompt])
            why = f"was trained only in the lost tail (step {step}, discarded by the kill)"
            fix = "was it taken for trained?"
            evidence = (tail[prompt], *_cited(at, ended))
        return Violation(
            NAME,
            f"prompt {prompt} {why} and was never trained after the resume, nor dropped, nor "
            f"outstanding at the end: lost across the kill ({fix})",
            evidence,
        )
    return None


def _skipped(
    drawn: dict[int, Indexed], floor: int, tail: dict[int, Indexed], at: Cite
) -> Violation | None:
    """The timeline draws prompts in order from ``floor`` (the cursor): one never drawn
    below the last drawn was skipped by a resume, lost."""
    gaps = sorted(set(range(floor, max(drawn, default=-1) + 1)) - set(drawn))
    if not gaps:
        return None
    prompt = gaps[0]
    where = ""
    if prompt in tail:
        where = f" (it was trained only in the lost tail, at step {_step(tail[prompt])})"
    later = min(p for p in drawn if p > prompt)
    return Violation(
        NAME,
        f"prompt {prompt} was never drawn in the timeline the job committed, though prompt "
        f"{later} was{where}: the resume skipped it, so it is lost",
        _cited(at, drawn[later]),
    )
