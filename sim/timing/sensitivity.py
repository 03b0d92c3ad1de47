"""Which assumed input makes the model prefer a configuration other than the published one:
the plan's search rerun with each input its ``[sensitivity] assumed`` lists multiplied by
each factor (x0.5 and x1.5 unless the plan says), and for each the best point and where the
published configuration lands (sim/timing/plan_published.py for the table,
sim/timing/plan_landing.py for the landing). Inputs not listed are the published ones and
stay put. Every rerun draws its faults from the same seeds, so the table is reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.timing.plan_file import Plan
from sim.timing.plan_landing import Landing
from sim.timing.plan_published import check_sensitivity

BASE = "(as planned)"
"""The row of the plan itself."""


@dataclass(frozen=True)
class Variant:
    """The plan with one assumed input moved (``name`` BASE, factor 1: the plan as is)."""

    name: str
    factor: float
    value: float
    plan: Plan


def moved(plan: Plan, name: str, factor: float) -> Plan:
    """The plan with ``section.key`` multiplied by ``factor``."""
    section, _, key = name.partition(".")
    table = {**plan.tables[section], key: plan.tables[section][key] * factor}
    return dataclasses.replace(plan, tables={**plan.tables, section: table})


def variants(plan: Plan) -> list[Variant]:
    """The plan as is, then each assumed input at each factor, in the plan's order."""
    assumed, factors = check_sensitivity(plan.tables)
    out = [Variant(BASE, 1.0, 0.0, plan)]
    for name in assumed:
        section, _, key = name.partition(".")
        for f in factors:
            out.append(Variant(name, f, plan.tables[section][key] * f, moved(plan, name, f)))
    return out


@dataclass(frozen=True)
class SensitivityRow:
    """One variant's answer: its best point and the published configuration's landing."""

    name: str
    factor: float
    value: float
    landing: Landing | None

    def as_json(self) -> dict[str, Any]:
        land = self.landing
        return {
            "input": self.name,
            "factor": self.factor,
            "value": self.value,
            "landing": dataclasses.asdict(land) if land else None,
            "gap": land.gap if land else None,
        }


def table_lines(rows: Sequence[SensitivityRow]) -> list[str]:
    """The table as the command prints it: per input and factor, the best point, its tokens
    per second, and the published configuration's rank, front and gap to the best, and the
    best split at the published mode and bound."""
    head = (
        f"{'input':34s} {'x':>4s} {'value':>9s}  {'best point':26s} {'tokens/s':>10s} "
        f"{'pub rank':>8s} {'front':>5s} {'pub gap':>7s}  best split at published"
    )
    lines = [head]
    for r in rows:
        land = r.landing
        value = "" if r.name == BASE else f"{r.value:.4g}"
        if land is None:
            lines.append(f"{r.name:34s} {r.factor:4.2g} {value:>9s}  no point passed")
            continue
        rank = f"{land.rank}/{land.of}" if land.rank else "FAIL"
        lines.append(
            f"{r.name:34s} {r.factor:4.2g} {value:>9s}  {land.best_label:26s} "
            f"{land.best_tokens_per_second:10.1f} {rank:>8s} "
            f"{'yes' if land.on_front else 'no':>5s} {land.gap:7.1%}  {land.best_split} "
            f"({land.split_rank}/{land.split_of})"
        )
    return lines


__all__ = ["BASE", "SensitivityRow", "Variant", "moved", "table_lines", "variants"]
