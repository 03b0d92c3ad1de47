"""What any world's run result says of its verdict: whether Ctrl-C cut it or its judging
short, and whether every oracle passed. One definition for the simulator's result
(sim/run.py) and the real backends' (backends/common/run/result.py), so that "ok" cannot
mean two things."""

from __future__ import annotations

from typing import TYPE_CHECKING

from miles_core.kinds import RunStatus

if TYPE_CHECKING:
    from miles_core.loop import RunReport
    from miles_core.oracles import Violation


class JudgedRun:
    """Read by a result dataclass that holds ``report``, ``verdicts`` and ``not_judged``."""

    report: RunReport
    verdicts: dict[str, Violation | None]
    not_judged: dict[str, str]

    @property
    def interrupted(self) -> bool:
        """Ctrl-C stopped the run, or cut short the judging of a run that ended by itself."""
        return self.report.status is RunStatus.INTERRUPTED or bool(self.not_judged)

    @property
    def ok(self) -> bool:
        """Every oracle passed (an interrupted run has not: some never judged it)."""
        return not self.interrupted and all(v is None for v in self.verdicts.values())
