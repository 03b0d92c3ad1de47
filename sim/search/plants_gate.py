"""Planted bugs of the staleness gate (--staleness-policy gate_submission;
sim/search/plants.py's table holds them): each is caught by bounded_staleness, which under
the gate allows no group to be refused as stale.

- gate_off_by_one: the gate admits while accepted + running <= its limit, not < (AReaL's
  ``get_capacity() > 0``): one group more than the bound allows goes out per version, and
  the buffer finds it one version too old when the trainer takes it
  (scenarios/files/staleness_gate_submission.toml).
"""

from __future__ import annotations

from typing import Any

from miles_core.staleness_gate import SubmissionGate


def gate_off_by_one(mp: Any) -> None:
    def admits(self: SubmissionGate) -> bool:
        return self.accepted + self.running <= self.limit()

    mp.setattr(SubmissionGate, "admits", admits)


GATE_PLANTS = {
    "gate_off_by_one": (gate_off_by_one, "bounded_staleness"),
}
"""Plant name -> (the plant, the oracle that must catch it)."""
