"""--staleness-policy gate_submission in the loop: the producer asks AReaL's gate
(miles_core.staleness_gate) before it submits a group, and its holds are recorded.

The gate's counts follow the producer: a group submitted runs; the buffer's put queues
it (accepted) or refuses it (rejected); a drain that begins takes up the next step's
batch (the consumer's version). The producer is held while it has room for a group and
the gate refuses one; each hold is a GateHeld .. GateReleased span in the history, and
the time held and the groups that waited are the policy's waste, in the step's metrics
under miles' prefix (rollout/fully_async/gate_held_seconds, .../gate_held_groups).
"""

from __future__ import annotations

from miles_core.buffer import METRIC_PREFIX
from miles_core.events import GateArmed, GateHeld, GateReleased
from miles_core.loop.context import RunContext
from miles_core.staleness_gate import SubmissionGate

HELD_SECONDS = f"{METRIC_PREFIX}gate_held_seconds"
HELD_GROUPS = f"{METRIC_PREFIX}gate_held_groups"


class ProducerGate:
    """The gate, its counts, and the producer's holds at it."""

    def __init__(self, ctx: RunContext) -> None:
        config = ctx.config
        assert config.max_weight_staleness is not None  # LoopConfig refuses a gate without
        self.ctx = ctx
        self.gate = SubmissionGate(config.max_weight_staleness, config.rollout_batch_size)
        self._drains = 0
        self._held_since: float | None = None
        self._window_start = ctx.rt.now()
        self._window_held = 0.0
        self._window_groups = 0

    def armed(self) -> None:
        gate = self.gate
        self.ctx.emit(GateArmed, max_staleness=gate.max_staleness, batch_size=gate.batch_size)

    def admits(self) -> bool:
        return self.gate.admits()

    def submitted(self, group_id: int) -> None:
        self.gate.submitted(group_id)

    def resolved(self, group_id: int, queued: bool) -> None:
        """The group's put ended: queued for training, or refused (aborted, filtered)."""
        if queued:
            self.gate.accepted_group(group_id)
        else:
            self.gate.rejected(group_id)

    def refused_at_get(self) -> None:
        self.gate.refused_after_acceptance()

    def drain_began(self) -> None:
        """The trainer takes up its next batch: the consumer's version is that step's."""
        self.gate.consumer_at(self._drains)
        self._drains += 1

    def pass_ended(self, started: int, room_left: bool) -> None:
        """The producer filled what it could: ``started`` groups went out, and it still had
        room for one (``room_left``) only if the gate refused it."""
        ctx = self.ctx
        now = ctx.rt.now()
        if self._held_since is not None and (started or not room_left):
            held_since, self._held_since = self._held_since, None
            self._window_held += now - max(held_since, self._window_start)
            self._window_groups += started
            ctx.emit(GateReleased, held_since=held_since, groups=started)
        if room_left and self._held_since is None:
            self._held_since = now
            gate = self.gate
            ctx.emit(
                GateHeld,
                version=gate.gate_version,
                accepted=gate.accepted,
                running=gate.running,
                limit=gate.limit(),
            )

    def metrics(self) -> dict[str, float]:
        """This step's waste at the gate (the window since the last call, as miles' buffer
        metrics): seconds held, an open hold up to now included, and groups that waited."""
        now = self.ctx.rt.now()
        held = self._window_held
        if self._held_since is not None:
            held += now - max(self._held_since, self._window_start)
        result = {HELD_SECONDS: held, HELD_GROUPS: self._window_groups}
        self._window_start, self._window_held, self._window_groups = now, 0.0, 0
        return result
