"""What any world's run result says of its verdict: whether Ctrl-C cut it or its judging
short, and whether every oracle passed. One definition for the simulator's result
(sim/run.py) and the real backends' (backends/common/run/result.py), so that "ok" cannot
mean two things."""

from __future__ import annotations

from typing import TYPE_CHECKING

from miles_core.kinds import RunStatus
from miles_core.report.caught import judged as against_expectation

if TYPE_CHECKING:
    from miles_core.loop import RunReport
    from miles_core.oracles import Violation
    from miles_core.scenario import Scenario


class JudgedRun:
    """Read by a result dataclass that holds ``scenario``, ``report``, ``verdicts`` and
    ``not_judged``."""

    scenario: Scenario
    report: RunReport
    verdicts: dict[str, Violation | None]
    not_judged: dict[str, str]

    @property
    def judged(self) -> dict[str, Violation | None]:
        """The verdicts against the scenario's ``expect.caught_by`` (miles_core/report/
        caught.py): None where each oracle did as expected."""
        return against_expectation(self.verdicts, self.scenario.expect.caught_by)

    @property
    def interrupted(self) -> bool:
        """Ctrl-C stopped the run, or cut short the judging of a run that ended by itself."""
        return self.report.status is RunStatus.INTERRUPTED or bool(self.not_judged)

    @property
    def ok(self) -> bool:
        """Every oracle passed, but the one ``expect.caught_by`` names, which failed (an
        interrupted run has not: some never judged it)."""
        return not self.interrupted and all(v is None for v in self.judged.values())
