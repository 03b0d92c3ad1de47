"""step_attempts: each step commits once, on its quorum, from an attempt no cell discarded.

Judged from what the cells reported (CellTrained), not from the verdict the
control plane recorded:

- an attempt runs on exactly the current quorum (the alive cells after the
  refresh and its heals), and every cell exchanges gradients with exactly the
  attempt's cells (a dead cell kept in the exchange group would hang or void
  it);
- the attempt's verdict matches the reports: cells that reported normal,
  discarded, or nothing (errored); it commits only when no cell discarded and
  some cell finished normally;
- a step commits once, from such an attempt, in step order;
- a cell whose processes the world replaced (CellStarted: its trained state went
  with the old ones) joins an attempt only once a heal into it ended well, and a
  heal's source is a member of its quorum holding trained state: neither the cell
  being healed nor another cell with new processes not yet healed (miles'
  ``recv_ckpt_src_rank`` names an alive cell's rank; a checkpoint from a fresh cell
  would hand the joining one initial weights, and the next exchange would average
  gradients of different models).
"""

from __future__ import annotations

from miles_core.cells import Decision, Outcome
from miles_core.event_index import Indexed, select
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    CellStarted,
    CellTrained,
    HealBegan,
    HealEnded,
    History,
    JobResumed,
    QuorumChanged,
    RunStarted,
    StepCommitted,
)
from miles_core.oracles.base import Violation

NAME = "step_attempts"

Key = tuple[int, int]


def step_attempts(history: History) -> Violation | None:
    return _attempts(history) or _heals(history)


def _attempts(history: History) -> Violation | None:
    quorum: tuple[int, ...] | None = None
    began: dict[Key, Indexed] = {}
    reports: dict[Key, dict[int, Indexed]] = {}
    ended: dict[Key, Indexed] = {}
    committed: dict[int, Indexed] = {}
    first = 0  # a resumed job's run begins at its save's step + 1
    kinds = (RunStarted, QuorumChanged, AttemptBegan, CellTrained, AttemptEnded, StepCommitted)
    for seq, e in select(history, *kinds, JobResumed):
        if isinstance(e, JobResumed):
            first = e.next_step
        elif isinstance(e, RunStarted):
            quorum = tuple(range(e.num_cells))
        elif isinstance(e, QuorumChanged):
            quorum = e.members
        elif isinstance(e, AttemptBegan):
            if quorum is not None and e.cells != quorum:
                return Violation(
                    NAME,
                    f"attempt {e.attempt} of step {e.step} ran on cells {list(e.cells)}, but the "
                    f"quorum is {list(quorum)}",
                    ((seq, e),),
                )
            began[(e.step, e.attempt)] = (seq, e)
            reports[(e.step, e.attempt)] = {}
        elif isinstance(e, CellTrained):
            violation = _report(began, reports, seq, e)
            if violation is not None:
                return violation
        elif isinstance(e, AttemptEnded):
            violation = _verdict(began, reports, seq, e)
            if violation is not None:
                return violation
            ended[(e.step, e.attempt)] = (seq, e)
        elif isinstance(e, StepCommitted):
            violation = _commit(reports, ended, committed, seq, e, first)
            if violation is not None:
                return violation
            committed[e.step] = (seq, e)
    return None


def _report(
    began: dict[Key, Indexed], reports: dict[Key, dict[int, Indexed]], seq: int, e: CellTrained
) -> Violation | None:
    key = (e.step, e.attempt)
    attempt = began.get(key)
    if attempt is None:
        return Violation(NAME, f"cell {e.cell} reported an attempt that never began", ((seq, e),))
    cells = attempt[1].cells  # type: ignore[union-attr]
    if e.cell not in cells:
        return Violation(
            NAME,
            f"cell {e.cell} trained in attempt {e.attempt} of step {e.step}, which ran on "
            f"{list(cells)}",
            (attempt, (seq, e)),
        )
    if e.exchange != cells:
        return Violation(
            NAME,
            f"cell {e.cell} exchanged gradients with cells {list(e.exchange)}, but attempt "
            f"{e.attempt} of step {e.step} ran on {list(cells)}",
            (attempt, (seq, e)),
        )
    reports[key][e.cell] = (seq, e)
    return None


def _verdict(
    began: dict[Key, Indexed], reports: dict[Key, dict[int, Indexed]], seq: int, e: AttemptEnded
) -> Violation | None:
    key = (e.step, e.attempt)
    attempt = began.get(key)
    if attempt is None:
        return Violation(
            NAME, f"attempt {e.attempt} of step {e.step} ended but never began", ((seq, e),)
        )
    cells = attempt[1].cells  # type: ignore[union-attr]
    got = reports[key]
    by = {
        o: tuple(c for c in cells if c in got and got[c][1].outcome is o)  # type: ignore[union-attr]
        for o in (Outcome.NORMAL, Outcome.DISCARDED)
    }
    errored = tuple(c for c in cells if c not in got)
    if (e.normal, e.discarded, e.errored) != (by[Outcome.NORMAL], by[Outcome.DISCARDED], errored):
        return Violation(
            NAME,
            f"attempt {e.attempt} of step {e.step}: the verdict lists normal {list(e.normal)}, "
            f"discarded {list(e.discarded)}, errored {list(e.errored)}, but the cells reported "
            f"normal {list(by[Outcome.NORMAL])}, discarded {list(by[Outcome.DISCARDED])} and "
            f"nothing from {list(errored)}",
            (attempt, *sorted(got.values()), (seq, e)),
        )
    commit = not by[Outcome.DISCARDED] and bool(by[Outcome.NORMAL])
    if (e.decision is Decision.COMMIT) != commit:
        why = "a cell discarded it" if by[Outcome.DISCARDED] else "no cell finished normally"
        if commit:
            why = "every cell that finished did so normally"
        return Violation(
            NAME,
            f"attempt {e.attempt} of step {e.step} was decided {e.decision.value}, but {why}",
            (attempt, *sorted(got.values()), (seq, e)),
        )
    return None


def _commit(
    reports: dict[Key, dict[int, Indexed]],
    ended: dict[Key, Indexed],
    committed: dict[int, Indexed],
    seq: int,
    e: StepCommitted,
    first: int = 0,
) -> Violation | None:
    key = (e.step, e.attempt)
    if e.step in committed:
        return Violation(NAME, f"step {e.step} committed twice", (committed[e.step], (seq, e)))
    if e.step != first + len(committed):
        after = f"{len(committed)} steps" + (f" from step {first}" if first else "")
        return Violation(NAME, f"step {e.step} committed after {after}", ((seq, e),))
    verdict = ended.get(key)
    if verdict is None or verdict[1].decision is not Decision.COMMIT:  # type: ignore[union-attr]
        return Violation(
            NAME,
            f"step {e.step} committed attempt {e.attempt}, which was not decided commit",
            tuple(x for x in (verdict, (seq, e)) if x),
        )
    discarded = [r for r in reports.get(key, {}).values() if r[1].outcome is Outcome.DISCARDED]  # type: ignore[union-attr]
    if discarded:
        return Violation(
            NAME,
            f"step {e.step} committed attempt {e.attempt} though cell "
            f"{discarded[0][1].cell} discarded it (its gradient exchange failed)",  # type: ignore[union-attr]
            (discarded[0], (seq, e)),
        )
    return None


def _heals(history: History) -> Violation | None:
    """New processes are healed before they train, from a cell that holds trained state."""
    fresh: dict[int, Indexed] = {}  # cell -> its CellStarted, until a heal into it ended well
    healing: dict[int, Indexed] = {}  # dst cell -> the HealBegan under way
    quorum: tuple[int, ...] = ()
    kinds = (RunStarted, QuorumChanged, CellStarted, HealBegan, HealEnded, AttemptBegan)
    for seq, e in select(history, *kinds):
        if isinstance(e, RunStarted):
            quorum = tuple(range(e.num_cells))
        elif isinstance(e, QuorumChanged):
            quorum = e.members
        elif isinstance(e, CellStarted):
            fresh[e.cell] = (seq, e)
        elif isinstance(e, HealBegan):
            src = e.src_cell
            why = None
            if src == e.dst_cell:
                why = "itself"
            elif src not in quorum:
                why = f"cell {src}, which is not in quorum {list(quorum)}"
            elif src in fresh:
                why = f"cell {src}, whose new processes were never healed: no trained state"
            if why is not None:
                evidence = [fresh[src]] if src in fresh and src != e.dst_cell else []
                return Violation(
                    NAME, f"cell {e.dst_cell} was healed from {why}", (*evidence, (seq, e))
                )
            healing[e.dst_cell] = (seq, e)
        elif isinstance(e, HealEnded):
            if healing.pop(e.dst_cell, None) is not None and e.ok:
                fresh.pop(e.dst_cell, None)
        elif isinstance(e, AttemptBegan):
            unhealed = [c for c in e.cells if c in fresh]
            if unhealed:
                cell = unhealed[0]
                return Violation(
                    NAME,
                    f"cell {cell} trained in attempt {e.attempt} of step {e.step} with new "
                    "processes no heal reached: it trains from initial weights",
                    (fresh[cell], (seq, e)),
                )
    return None
