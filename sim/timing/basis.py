"""How each figure the timing model is compared with was obtained, and the headline counts.

A ratio of predicted to published is evidence only when the published figure did not shape
the prediction. So every compared figure carries one of four labels, decided where its row
is declared (sim/timing/anchors.py, speedup_anchors.py, recovery_anchors.py) and counted
here:

- **predicted**: no figure of its own fed the prediction, and no setting restated from it;
- **held out**: its ratio is the prediction of a fit that left the figure out (the fit's
  other rows and settings feed it);
- **fitted here**: a fit that saw the figure predicts it (its ratio says the model can
  hold it, not that it foresaw it);
- **restated**: a setting read from the figure itself, or from its own published breakdown,
  is part of the prediction.

A figure computed from others (a speedup from two steps; a throughput from the same run's
step) is listed with what it comes from and counted with them, once. Tolerances are
symmetric: a factor f meets ratios from 1/f to f (0.75 is a miss at 1.25: it is 1/1.33).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class Basis(enum.Enum):
    """How a compared figure was obtained; the order is the headline's (evidence first)."""

    HELD_OUT = "held out"
    PREDICTED = "predicted"
    FITTED = "fitted here"
    RESTATED = "restated"


TOLERANCES = (1.25, 1.5)
"""The factors the headlines count ratios within."""


def within(ratio: float, factor: float) -> bool:
    """``ratio`` lies from 1/factor to factor (the same distance either way, in log)."""
    return ratio > 0 and abs(math.log(ratio)) <= math.log(factor) + 1e-12


@dataclass(frozen=True)
class Compared:
    """One published figure set beside the model's, labelled."""

    figure: str
    section: str
    """Which table it is in (update, async vs sync, staleness, recovery)."""
    ratio: float
    """Predicted over published; for a held-out figure, the held-out prediction's."""
    basis: Basis
    why: str
    """What makes it that label: the fit that saw it, the setting restated, ..."""
    derived_from: str = ""
    """The figure it is computed from (counted there, not here); empty for a primary one."""


@dataclass(frozen=True)
class Tally:
    """A label's counts: primary figures, how many within each tolerance, the ratio range."""

    basis: Basis
    figures: int
    met: tuple[int, ...]
    """Within each of TOLERANCES, in order."""
    low: float
    high: float

    def line(self) -> str:
        if not self.figures:
            return f"{self.basis.value}: 0 figures"
        met = ", ".join(f"{n} within {f}x" for n, f in zip(self.met, TOLERANCES, strict=True))
        return (
            f"{self.basis.value}: {self.figures} figures, {met}, "
            f"ratios {self.low:.2f}-{self.high:.2f}"
        )


def tally(compared: Iterable[Compared]) -> list[Tally]:
    """Per label, in the headline's order, the primary figures' counts (a derived figure
    counts with its source)."""
    primary = [c for c in compared if not c.derived_from]
    out = []
    for basis in Basis:
        ratios = [c.ratio for c in primary if c.basis is basis]
        met = tuple(sum(within(r, f) for r in ratios) for f in TOLERANCES)
        out.append(Tally(basis, len(ratios), met, min(ratios, default=0), max(ratios, default=0)))
    return out


def headline(compared: Sequence[Compared]) -> str:
    """One line per label, evidence first: what docs, the README and the command lead with."""
    derived = sum(1 for c in compared if c.derived_from)
    lines = [t.line() for t in tally(compared)]
    lines.append(f"({derived} figures derived from these are listed and not counted again)")
    return "\n".join(lines)


__all__ = ["TOLERANCES", "Basis", "Compared", "Tally", "headline", "tally", "within"]
