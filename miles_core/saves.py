"""Periodic saves and the resume of a job killed as a whole: what a save holds, when one is due,
and which save a resumed job continues from.

miles saves after a rollout's train step when ``should_run_periodic_action(rollout_id,
--save-interval, ..., num_rollout)`` says so (miles/utils/misc.py: every ``interval``
rollouts, and at the last one), in train_async.py ``train``: the actor's and critic's
``save_model`` and the rollout manager's ``save`` (miles/ray/rollout/rollout_manager.py), whose
data source keeps its cursor (``RolloutDataSource.save``: epoch_id, sample_offset,
sample_group_index; miles/rollout/data_source.py). A resume (``--load``) starts at
``start_rollout_id`` = the saved rollout + 1 (miles/backends/fsdp_utils/checkpoint.py ``load``:
``next_rollout_id``), and a checkpoint counts only once its tracker file names it
(``latest_checkpointed_iteration.txt``, written after every other file of the save).

What differs here, on purpose:

- a save runs after the step's weight update, not between the train step and it (miles'
  place, which is why miles' resume begins with an update, "so that sglang has the loaded
  weights"): then the saved ledger version names exactly the saved weights, and a resumed
  run syncs its engines to that version before they serve (the path a ``--load`` of the
  ledger already takes) and publishes version + 1 after its first step;
- the save holds the ledger (miles' updater counts versions from 0 again on a resume);
- the save holds every prompt drawn and neither trained nor dropped: the buffer's queued
  groups, the recycled ones awaiting regeneration, the ones generating. miles saves only the
  cursor, so those prompts are skipped by its resume. Here they are generated again, first,
  as recycled prompts are (``RolloutDataSourceWithBuffer.get_samples`` takes its buffer
  first): a queued group's samples came from weights the resumed run may not hold, and
  regenerating keeps a save independent of what an engine answered (token ids, log-probs);
- a torn save (begun, never committed) is never read: the newest committed one is, or none
  (a fresh start).

The core keeps no random state of its own: the one seed (``SaveState.seed``) names the whole
seed tree, from which a world draws its streams again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from miles_core.errors import ConfigError, int_at_least
from miles_core.versions import LedgerSnapshot


@dataclass(frozen=True)
class SaveState:
    """Everything the control plane needs to continue a run (a world adds its weights and
    optimizer): miles' ``rollout_id``, the ledger, the data cursor and the prompts to redo."""

    step: int
    """The last step trained and published (miles' rollout_id): the run goes on at step + 1."""
    version: int | None
    """The ledger's published version (LedgerSnapshot.version) when the save began."""
    cursor: int
    """The next new prompt's id: prompts below it were drawn (miles' sample_group_index)."""
    pending: tuple[int, ...]
    """Prompts drawn, neither trained nor dropped (queued, recycled, generating), sorted: a
    resumed run generates them again before it draws a new one."""
    seed: int
    """The run's root seed: the seed tree a resumed world draws its streams from."""

    def __post_init__(self) -> None:
        if not int_at_least(self.step, 0) or not int_at_least(self.cursor, 0):
            raise ConfigError(
                "save", f"step {self.step!r}, cursor {self.cursor!r}", "pass ints >= 0"
            )
        if self.version is not None and not int_at_least(self.version, 1):
            raise ConfigError("save.version", f"got {self.version!r}", "pass None or an int >= 1")
        pending = tuple(self.pending)
        if list(pending) != sorted(set(pending)) or any(p >= self.cursor for p in pending):
            raise ConfigError(
                "save.pending",
                f"{pending!r} with cursor {self.cursor}",
                "pass distinct prompt ids below the cursor, sorted",
            )
        object.__setattr__(self, "pending", pending)

    @property
    def next_step(self) -> int:
        return self.step + 1

    @property
    def ledger(self) -> LedgerSnapshot:
        return LedgerSnapshot(self.version)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, as a world writes it beside its weights."""
        return asdict(self) | {"pending": list(self.pending)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SaveState:
        """A save read back; a file of other keys is refused, naming them."""
        names = {"step", "version", "cursor", "pending", "seed"}
        if not isinstance(data, Mapping) or set(data) != names:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError("--load", f"the save holds {got}", f"a save holds {sorted(names)}")
        return cls(**{**data, "pending": tuple(data["pending"])})


@dataclass(frozen=True)
class StoredSave:
    """A save as a world's storage lists it: committed once every byte was written."""

    state: SaveState
    committed: bool


@dataclass(frozen=True)
class Resume:
    """Where a resumed job continues: the newest committed save, or a fresh start."""

    state: SaveState | None
    """None: no save had committed, so the job starts over from step 0."""
    torn: tuple[int, ...] = ()
    """The steps of the saves found begun and never committed (torn by the kill): skipped."""

    @property
    def next_step(self) -> int:
        return 0 if self.state is None else self.state.next_step


def save_due(step: int, interval: int, steps: int) -> bool:
    """Whether a save follows step ``step`` (from 0) of a run of ``steps``: every ``interval``
    steps and after the last one, none with interval 0 (miles' ``should_run_periodic_action``
    with ``--save-interval``; a run past its steps, until a fault is witnessed, saves on the
    interval only)."""
    if interval <= 0:
        return False
    return (step + 1) % interval == 0 or step == steps - 1


def choose_save(saves: Iterable[StoredSave]) -> Resume:
    """The save a killed job resumes from: the newest committed one (a torn save, begun and
    never committed, is skipped and named), or none."""
    listed = sorted(saves, key=lambda s: s.state.step)
    committed = [s for s in listed if s.committed]
    torn = tuple(s.state.step for s in listed if not s.committed)
    return Resume(committed[-1].state if committed else None, torn)


__all__ = ["Resume", "SaveState", "StoredSave", "choose_save", "save_due"]
