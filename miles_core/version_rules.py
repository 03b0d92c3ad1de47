"""miles' weight-version hygiene (today's profile): what the rollout executor asserts.

miles (``miles/utils/weight_version.py`` at 3eacefd0) fails the run on two things:

- ``assert_samples_weight_version_sane``: every span of every sample of a batch must carry a
  version miles stamped: not SGLang's placeholder ``"default"`` (an engine whose weights were
  never updated) and matching ``[0-9]+`` (anything else was set from outside miles). Called on
  the trained batch (``RolloutExecutor.get`` / ``_get_rollout_data``);
- ``assert_weight_version_is_published``: the executor counts the rollouts it served since the
  driver last called ``set_weight_version``; more than
  ``max(_MIN_ROLLOUTS_WITHOUT_PUBLISHED_WEIGHT_VERSION = 3, --update-weights-interval + 1)``
  is an error (staleness accounting would be frozen). Counted and checked as each rollout is
  asked for (``get``).

Both are skipped under ``--debug-rollout-only``, ``--debug-skip-weight-update`` and LoRA.

Where the testbed differs: miles updates the engines once before the first rollout
(``train_async.py``: "always update weight first"), so its engines never serve ``"default"``;
here the first rollout is generated on the initial weights, which are the trainer's own
(``Updater.sync``: "its initial weights are the current ones"), reported as ``None``. So a
``None`` span stands for miles' first stamped version while its process was never stamped,
and breaks the rule only once that process was stamped (or an earlier span of the same
request had a number). A version that is no decimal never reaches a sample here: the router
cannot read it (``VersionOutOfSync``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from miles_core.errors import MilesCoreError

SGLANG_DEFAULT_WEIGHT_VERSION: Final = "default"
MIN_ROLLOUTS_WITHOUT_PUBLISHED_WEIGHT_VERSION: Final = 3
"""``_MIN_ROLLOUTS_WITHOUT_PUBLISHED_WEIGHT_VERSION`` (weight_version.py, 3eacefd0)."""
UPDATE_WEIGHTS_INTERVAL: Final = 1
"""miles' ``--update-weights-interval`` default; the testbed updates after every step."""


class WeightVersionError(MilesCoreError):
    """A rule of miles' weight-version hygiene broke (miles asserts: the run fails)."""


def max_rollouts_without_publish(update_weights_interval: int = UPDATE_WEIGHTS_INTERVAL) -> int:
    """``max_rollouts_without_published_weight_version``: max(3, interval + 1)."""
    return max(MIN_ROLLOUTS_WITHOUT_PUBLISHED_WEIGHT_VERSION, update_weights_interval + 1)


def default_span(reported: Sequence[int | None], stamped: int | None) -> str | None:
    """Why a completed request's spans break ``_assert_span_weight_version_sane``'s first
    rule, or None: a ``None`` ("default") span from a process that had been stamped (with
    ``stamped``) or after a numbered span of the same request."""
    floor = stamped
    for i, version in enumerate(reported):
        if version is None and floor is not None:
            return (
                f"span {i} was generated under weight version "
                f"{SGLANG_DEFAULT_WEIGHT_VERSION!r} (SGLang's placeholder for weights never "
                f"updated) after version {floor}"
            )
        if version is not None:
            floor = version
    return None


def span_error(where: str, why: str) -> WeightVersionError:
    """The error miles' assertion raises, in the testbed's words."""
    return WeightVersionError(
        f"{where}: {why}; miles asserts every trained span carries a numeric version it "
        "stamped (miles/utils/weight_version.py: assert_samples_weight_version_sane); "
        "--miles-profile aug2026 re-syncs the engine instead"
    )


def unpublished_error(rollouts: int, limit: int) -> WeightVersionError:
    """``assert_weight_version_is_published``'s failure."""
    return WeightVersionError(
        f"the rollout executor served {rollouts} rollouts without a published weight version "
        f"(at most {limit}: max({MIN_ROLLOUTS_WITHOUT_PUBLISHED_WEIGHT_VERSION}, "
        "--update-weights-interval + 1)); staleness accounting would be frozen while training "
        "advances (miles/utils/weight_version.py: assert_weight_version_is_published)"
    )


class PublishCounter:
    """The executor's ``_rollouts_since_weight_version_publish``: +1 per rollout asked for,
    back to 0 when a newer version is published (read from the ledger's current version)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max_rollouts_without_publish() if limit is None else limit
        self.since = 0
        self._seen: int | None = None

    def rollout(self, published: int | None) -> None:
        """A rollout is asked for while ``published`` is current; raises past the limit."""
        if published != self._seen:
            self._seen, self.since = published, 0
        self.since += 1
        if self.since > self.limit:
            raise unpublished_error(self.since, self.limit)
