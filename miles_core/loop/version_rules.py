"""The loop's side of miles' weight-version hygiene (miles_core.version_rules), under today.

miles' rollout executor asserts (``miles/utils/weight_version.py`` at 3eacefd0), and an
assertion fails the run; under ``--miles-profile today`` the producer does the same with a
``WeightVersionError``:

- a completed request whose spans break ``assert_samples_weight_version_sane`` (a "default"
  span from a process already stamped; a version that is no decimal, which the router cannot
  read): the sample is recorded out of sync, then the run fails. miles checks the trained
  batch; here the answer is checked as it arrives, at most a rollout earlier (its group is
  the batch's or a later one's, unless a filter drops it);
- ``assert_weight_version_is_published``: each batch asked for (``Producer.drain``, miles'
  ``RolloutExecutor.get``) counts one rollout since the last publish; past
  max(3, --update-weights-interval + 1) the run fails.

``kv_namespace`` is miles' prefix-cache namespace of a train call (--namespaced-radix-cache),
which the producer stamps on each group as it is submitted.

Skipped under LoRA, as miles skips them (``is_lora_enabled``); under aug2026 (31f1ca9 has no
such checks) an untrusted answer re-syncs its engine (supervision.py ``out_of_sync``) and
nothing counts rollouts.
"""

from __future__ import annotations

from miles_core.backend import GenerateResult, VersionOutOfSync
from miles_core.loop.config import LoopConfig
from miles_core.version_rules import (
    PublishCounter,
    WeightVersionError,
    default_span,
    span_error,
)


def kv_namespace(rollout_id: int) -> str:
    """miles' ``compute_kv_cache_namespace``: ``train:{policy or -}:{rollout_id}`` (one
    policy here: ``-``), the prefix-cache namespace of one train call (base_types.py; miles'
    test expects ``"train:-:7"``)."""
    return f"train:-:{rollout_id}"


class VersionRules:
    """What the producer asks of miles' version rules; every method is a no-op when off."""

    def __init__(self, config: LoopConfig) -> None:
        self.on = config.today and config.lora_adapter is None
        self._published = PublishCounter()

    def spans(
        self, engine: str, incarnation: int, stamp: int | None, result: GenerateResult
    ) -> WeightVersionError | None:
        """The error a completed answer's spans earn, or None."""
        if not self.on:
            return None
        why = default_span(result.versions or (result.weight_version,), stamp)
        if why is None:
            return None
        return span_error(f"{engine} (process {incarnation}) answered a request", why)

    def unreadable(
        self, engine: str, incarnation: int, mismatch: VersionOutOfSync
    ) -> WeightVersionError | None:
        """The error an answer whose version the router could not read earns (miles' second
        rule: ``[0-9]+``), or None when off."""
        if not self.on:
            return None
        return span_error(f"{engine} (process {incarnation})", mismatch.reason)

    def rollout(self, published: int | None) -> None:
        """A batch is asked for while ``published`` is current; raises past the limit."""
        if self.on:
            self._published.rollout(published)
