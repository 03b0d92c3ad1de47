"""The two staleness policies, and AReaL's submission gate as pure logic.

``--staleness-policy`` says where a bound on staleness (--max-weight-staleness) is
enforced:

- ``drop_at_buffer`` (miles, the default): the producer generates freely and the data
  buffer refuses a group older than the bound when the trainer takes it
  (``miles_core.buffer.DataBuffer.get``, miles' ``fully_async_data_buffer.py``). The
  waste is what was generated and then dropped or recycled as stale.
- ``gate_submission`` (AReaL): a group is submitted only while the data it would join
  cannot be trained beyond the bound, so nothing has to be dropped for staleness; the
  waste is the time the producer is held at the gate (engines idle).

AReaL's gate is ``StalenessManager.get_capacity`` (areal/core/staleness_manager.py,
inclusionAI/AReaL at 08911ddf), which ``BatchTaskDispatcher._commit_loop`` /
``_get_next_task_for_submission`` (areal/core/workflow_executor.py) consults before each
submission: a new rollout goes out while

    accepted + running < (max_staleness + version + 1) * consumer_batch_size

with ``accepted`` and ``running`` its ``RolloutStat`` counts (``on_rollout_submitted``:
running + 1; ``on_rollout_accepted``: running - 1, accepted + 1;
``on_rollout_rejected``: running - 1) and ``max_staleness`` its
``max_head_offpolicyness``. Here a rollout is a prompt group and the consumer batch is
--rollout-batch-size groups. Why the formula holds the bound: the trainer takes groups
in the order they were accepted, B to a batch, and batch k is trained at version k, so
the group accepted i-th (from 0) is trained at version floor(i / B); one admitted at
version v has i < (max_staleness + v + 1) * B, hence staleness <= max_staleness.

Two choices of ours, each so that the bound is exact in this loop:

- ``version`` is the consumer's: the step whose batch the trainer is taking (AReaL's
  trainer version, set once per step). It is the ledger's published version in a run
  whose every update published; fed the ledger instead, an update that failed to publish
  would leave the gate shut for good once the steps got ``max_staleness`` ahead of it.
- the version in the formula is that of the *oldest group still running* (the current
  one when none runs). With AReaL's current version, a group admitted after the version
  advanced can finish first and be accepted ahead of one still running from an older
  version, pushing it a batch later, past the bound: AReaL's ``wait_results`` orders by
  submission only the results already back. Counted from the oldest running group, every
  running group keeps ``accepted + running`` below its own limit, so each is accepted
  within it whatever order they finish in.
"""

from __future__ import annotations

from enum import StrEnum

from miles_core.errors import ConfigError, int_at_least


class StalenessPolicy(StrEnum):
    """--staleness-policy: where the staleness bound is enforced."""

    DROP_AT_BUFFER = "drop_at_buffer"
    """miles: generate freely; the buffer drops (or recycles) a group beyond the bound."""
    GATE_SUBMISSION = "gate_submission"
    """AReaL: submit a group only while it cannot be trained beyond the bound."""


DEFAULT_STALENESS_POLICY = StalenessPolicy.DROP_AT_BUFFER
"""miles' behaviour, so every run that does not name a policy is unchanged."""


def gate_limit(max_staleness: int, version: int, batch_size: int) -> int:
    """AReaL's ``(ofp + current_version + 1) * consumer_bs``: the groups that may ever have
    been admitted (accepted or running) by the time the consumer is at ``version``."""
    return (max_staleness + version + 1) * batch_size


class SubmissionGate:
    """AReaL's ``StalenessManager`` for prompt groups: its counts, and whether one more
    group may be submitted now."""

    def __init__(self, max_staleness: int, batch_size: int) -> None:
        if not int_at_least(max_staleness, 0):
            raise ConfigError(
                "--max-weight-staleness",
                f"got {max_staleness!r}",
                "pass an integer >= 0: --staleness-policy gate_submission needs a bound",
            )
        if not int_at_least(batch_size, 1):
            raise ConfigError("--rollout-batch-size", f"got {batch_size!r}", "pass >= 1")
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.accepted = 0
        """Groups the buffer took, less those it later refused (each holds a batch slot)."""
        self._running: dict[int, int] = {}
        """Groups submitted and not yet accepted or rejected -> the version they went out at."""
        self.version = 0
        """The consumer's version: the step whose batch the trainer is taking."""

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def gate_version(self) -> int:
        """The version the limit is counted from: the oldest running group's, or the
        consumer's when none runs (see the module's docstring for why not always the
        consumer's)."""
        return min(self._running.values(), default=self.version)

    def limit(self) -> int:
        return gate_limit(self.max_staleness, self.gate_version, self.batch_size)

    def admits(self) -> bool:
        """Whether one more group may be submitted now (AReaL: ``get_capacity() > 0``)."""
        return self.accepted + self.running < self.limit()

    def submitted(self, group_id: int) -> None:
        """``on_rollout_submitted``: the group runs from now, at the consumer's version."""
        self._running[group_id] = self.version

    def accepted_group(self, group_id: int) -> None:
        """``on_rollout_accepted``: the buffer queued it for training."""
        if self._running.pop(group_id, None) is not None:
            self.accepted += 1

    def rejected(self, group_id: int) -> None:
        """``on_rollout_rejected``: it ended without a place in a batch (aborted, refused,
        filtered); its room is free again."""
        self._running.pop(group_id, None)

    def refused_after_acceptance(self) -> None:
        """The buffer refused a group it had queued (stale at the get: never under a sound
        gate): it takes no batch slot, so later groups are trained a slot earlier."""
        self.accepted = max(0, self.accepted - 1)

    def consumer_at(self, version: int) -> None:
        """The consumer took up the batch of step ``version``; it never goes back."""
        self.version = max(self.version, version)
