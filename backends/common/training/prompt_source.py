"""The order prompts are handed out in, epoch by epoch, and the cursor that resumes it.

``PromptSource.take`` hands out prompts as miles' ``RolloutDataSource.get_samples``
(``miles/rollout/data_source.py``): an offset into the epoch's order; at the end of an
epoch the rest, then the next epoch's order from its start. With ``--rollout-shuffle``
epoch ``e``'s order is miles' ``Dataset.shuffle(e)`` (``miles/utils/data.py``): the
rows permuted by a generator seeded ``--rollout-seed + e`` (a ``random.Random`` of its
own here, where miles seeds the module's global one; the permutation is the same), so
the order is a function of the seed, and a cursor (epoch, offset) says where in it a
run stands. ``--num-epoch`` bounds what a run may take (miles derives ``num_rollout``
from it: ``num_epoch * len(data) // rollout_batch_size``); asking past the end raises
``DataExhaustedError``.

A save holds ``DataCursor.to_dict()`` (plain JSON, as miles' ``RolloutDataSource.save``
holds ``epoch_id`` and ``sample_offset``); ``PromptSource(..., cursor=...)`` continues
exactly where it stood, and refuses a cursor taken over other data, another seed or
another shuffle setting, naming the flag that differs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from backends.common.training.prompt_data import Prompt, fingerprint
from miles_core.errors import ConfigError, MilesCoreError, int_at_least


class DataExhaustedError(MilesCoreError):
    """A run asked for prompts past --num-epoch epochs of the data."""


@dataclass(frozen=True)
class DataCursor:
    """Where the next prompt comes from, and all that fixes the order: what a save holds."""

    epoch: int
    offset: int  # prompts of this epoch's order handed out (== size at an epoch's end)
    consumed: int  # prompts handed out in all: the next prompt's global index
    seed: int
    shuffle: bool
    size: int
    data: str  # fingerprint of the prompts (prompt_data.fingerprint)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Any) -> DataCursor:
        """The cursor a save holds; a dict of other keys or types is refused."""
        names = {f.name: f.type for f in fields(cls)}
        kinds = {"int": int, "bool": bool, "str": str}
        ok = isinstance(state, dict) and set(state) == set(names)
        ok = ok and all(
            type(state[name]) is kinds[kind]  # exact: a bool is not an int here
            for name, kind in names.items()
        )
        if not ok:
            raise ConfigError(
                "--load", f"the saved data cursor is malformed: {state!r}", "resume from a save"
            )
        cursor = cls(**state)
        if cursor.consumed != cursor.epoch * cursor.size + cursor.offset or not (
            0 <= cursor.offset <= cursor.size
        ):
            raise ConfigError(
                "--load",
                f"the saved data cursor {state} is inconsistent",
                "resume from another save",
            )
        return cursor


@dataclass(frozen=True)
class Drawn:
    """A prompt as handed out: its global index (0, 1, ... across epochs) and epoch."""

    index: int
    epoch: int
    prompt: Prompt


def epoch_order(size: int, epoch: int, seed: int, shuffle: bool) -> tuple[int, ...]:
    """Row indices in epoch ``epoch``'s order: miles' ``Dataset.shuffle(epoch)``."""
    order = list(range(size))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return tuple(order)


class PromptSource:
    """Hands out the next prompts with their global index; deterministic from the seed."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        *,
        shuffle: bool = False,
        seed: int = 42,
        num_epoch: int | None = None,
        cursor: DataCursor | None = None,
    ) -> None:
        if not prompts:
            raise ConfigError("--prompt-data", "no prompts", "pass a file with rows")
        if num_epoch is not None and not int_at_least(num_epoch, 1):
            raise ConfigError("--num-epoch", f"got {num_epoch!r}", "pass an integer >= 1")
        self.prompts = tuple(prompts)
        self.num_epoch = num_epoch
        start = DataCursor(0, 0, 0, seed, shuffle, len(self.prompts), fingerprint(self.prompts))
        if cursor is not None:
            _check_resume(cursor, start)
            start = cursor
        self._cursor = start
        self._order = epoch_order(start.size, start.epoch, seed, shuffle)

    @property
    def cursor(self) -> DataCursor:
        return self._cursor

    def remaining(self) -> int | None:
        """Prompts left before --num-epoch epochs are done; None without --num-epoch."""
        if self.num_epoch is None:
            return None
        return self.num_epoch * self._cursor.size - self._cursor.consumed

    def num_rollout(self, rollout_batch_size: int) -> int | None:
        """Rollouts --num-epoch allows, as miles computes it (the last partial one dropped)."""
        if self.num_epoch is None:
            return None
        return self.num_epoch * self._cursor.size // rollout_batch_size

    def take(self, count: int) -> list[Drawn]:
        """The next ``count`` prompts, across epoch ends; all or none (DataExhaustedError)."""
        if not int_at_least(count, 0):
            raise ValueError(f"take({count!r}): pass an integer >= 0")
        left = self.remaining()
        if left is not None and count > left:
            raise DataExhaustedError(
                f"--num-epoch {self.num_epoch}: {left} of {self.num_epoch * self._cursor.size} "
                f"prompts remain and {count} were asked for; raise --num-epoch to train longer"
            )
        drawn = []
        for _ in range(count):
            cursor = self._cursor
            if cursor.offset == cursor.size:  # miles turns the epoch when it needs a prompt
                cursor = _replace(cursor, epoch=cursor.epoch + 1, offset=0)
                self._order = epoch_order(cursor.size, cursor.epoch, cursor.seed, cursor.shuffle)
            row = self._order[cursor.offset]
            drawn.append(Drawn(cursor.consumed, cursor.epoch, self.prompts[row]))
            self._cursor = _replace(cursor, offset=cursor.offset + 1, consumed=cursor.consumed + 1)
        return drawn

    def state_dict(self) -> dict[str, Any]:
        return self._cursor.to_dict()


def _replace(cursor: DataCursor, **changes: int) -> DataCursor:
    return DataCursor(**{**asdict(cursor), **changes})


def _check_resume(saved: DataCursor, fresh: DataCursor) -> None:
    """A saved cursor continues this source only over the same data and order."""
    if (saved.data, saved.size) != (fresh.data, fresh.size):
        raise ConfigError(
            "--prompt-data",
            f"the save's data cursor was taken over other prompts ({saved.size} rows, "
            f"fingerprint {saved.data}; this file: {fresh.size} rows, {fresh.data})",
            "resume with the --prompt-data (and key flags) the run was saved with",
        )
    if saved.seed != fresh.seed:
        raise ConfigError(
            "--rollout-seed",
            f"the save was taken with seed {saved.seed}, this run has {fresh.seed}",
            f"resume with --rollout-seed {saved.seed}",
        )
    if saved.shuffle != fresh.shuffle:
        flag = "with" if saved.shuffle else "without"
        raise ConfigError(
            "--rollout-shuffle",
            f"the save was taken {flag} --rollout-shuffle",
            f"resume {flag} --rollout-shuffle",
        )
