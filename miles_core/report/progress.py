"""The run commands' step bar: the asked steps, and past them the steps a run takes on
until its faults are witnessed (a scenario's until_witnessed), which tqdm would show as
an overrun bar ("42/8")."""

from __future__ import annotations

from typing import Any

PAST_ASKED = "past the asked steps, until every fault is witnessed"


def count_step(bar: Any) -> None:
    """One committed step on a tqdm bar; a step past its total grows the total and says why."""
    if not bar.disable and bar.n >= bar.total:
        bar.total = bar.n + 1
        bar.set_description(PAST_ASKED)
    bar.update(1)
