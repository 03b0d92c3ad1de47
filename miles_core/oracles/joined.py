"""How an oracle of one run judges a joined history (a job killed whole, kill_job).

What one controller did is judged within its own segment: ``per_segment`` runs an oracle on
each segment as on a run of its own. Whether a prompt was trained exactly once, or a
recycled one generated again, is judged on the committed timeline (``on_timeline``). A
history without a kill is judged exactly as before. The split itself is
miles_core.segments'; this is the oracles' use of it (a verdict moved to the joined
history's positions, with a note of where it was found).
"""

from __future__ import annotations

from collections.abc import Callable

from miles_core.events import History
from miles_core.oracles.base import Violation
from miles_core.segments import killed, part, segments, timeline

Oracle = Callable[[History], Violation | None]


def _moved(violation: Violation, where: Callable[[int], int], note: str) -> Violation:
    evidence = tuple((where(seq), e) for seq, e in violation.evidence)
    return Violation(violation.oracle, f"{violation.message} ({note})", evidence)


def per_segment(oracle: Oracle) -> Oracle:
    """``oracle`` on each segment of a joined history as on a run of its own (unchanged on
    a history without a kill)."""

    def judged(history: History) -> Violation | None:
        if not killed(history):
            return oracle(history)
        for segment in segments(history):
            violation = oracle(part(history, segment))
            if violation is not None:
                return _moved(violation, segment.first.__add__, segment.label(history))
        return None

    judged.__name__ = getattr(oracle, "__name__", "oracle")
    judged.__doc__ = oracle.__doc__
    return judged


def on_timeline(oracle: Oracle) -> Oracle:
    """``oracle`` on the committed timeline of a joined history (unchanged without a kill)."""

    def judged(history: History) -> Violation | None:
        if not killed(history):
            return oracle(history)
        kept, seqs = timeline(history)
        violation = oracle(kept)
        if violation is None:
            return None
        return _moved(violation, seqs.__getitem__, "in the timeline the killed job committed")

    judged.__name__ = getattr(oracle, "__name__", "oracle")
    judged.__doc__ = oracle.__doc__
    return judged


__all__ = ["Oracle", "on_timeline", "per_segment"]
