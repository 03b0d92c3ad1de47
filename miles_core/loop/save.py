"""The saver: a periodic save after a step's weight update, from the first alive cell.

miles saves in train_async.py ``train`` after a rollout's train step, when
``should_run_periodic_action(rollout_id, --save-interval, ...)`` says so: the actor's
``save_model`` and the rollout manager's ``save`` (its data source's cursor). Here the save
follows the step's weight update instead (miles_core.saves says why: the saved version then
names the saved weights). Where each decision is made:

- what a save holds is taken as it begins (SaveBegan): the ledger's published version, the
  data cursor and the prompts still to train (Producer.saved);
- it is written by the first alive cell's processes (their weights and optimizer), as
  update_weights is run there; a cell that dies while writing is failed and stopped, and the
  save starts again from the next alive cell (no alive cell: NoAliveCellError);
- it counts once the world's storage says every byte was written (SaveCommitted); one a kill
  tears is never read (miles_core.saves.choose_save).
"""

from __future__ import annotations

from miles_core.backend import CellFailure, CheckpointStore
from miles_core.errors import ConfigError
from miles_core.events import JobResumed, SaveBegan, SaveCommitted
from miles_core.loop.adopt import Adoption, adopted_event
from miles_core.loop.context import RunContext
from miles_core.loop.producer import Producer
from miles_core.loop.train import Trainer
from miles_core.saves import Resume, SaveState, save_due


class Saver:
    def __init__(self, ctx: RunContext, producer: Producer, trainer: Trainer) -> None:
        self.ctx = ctx
        self.producer = producer
        self.trainer = trainer
        store: CheckpointStore | None = getattr(ctx.cluster, "checkpoints", None)
        if ctx.config.save_interval and store is None:
            raise ConfigError(
                "--save-interval",
                f"is {ctx.config.save_interval}, but this world keeps no periodic saves yet",
                "leave it out (the CPU backend saves once at the end with --save), or run the "
                "scenario in the simulator",
            )
        self.store = store

    def due(self, step: int) -> bool:
        config = self.ctx.config
        return save_due(step, config.save_interval, config.steps)

    def state(self, step: int) -> SaveState:
        """What a save after step ``step`` holds, now."""
        cursor, pending = self.producer.saved()
        return SaveState(step, self.ctx.ledger.current, cursor, pending, self.ctx.config.seed)

    async def save(self, step: int) -> None:
        """Save after step ``step``: from the first alive cell, failing over, until committed."""
        ctx, store = self.ctx, self.store
        assert store is not None, "a save is due only with --save-interval, checked at start"
        state = self.state(step)
        ctx.emit(
            SaveBegan, step=step, version=state.version, cursor=state.cursor, pending=state.pending
        )
        call = ctx.cells.routed("save")
        while True:
            cell = call.target()
            try:
                await store.write(cell, state)
            except CellFailure as failure:
                call.failed(failure.reason)
                self.trainer.cell_failed(cell, f"died writing the save of step {step}")
                continue
            ctx.emit(SaveCommitted, step=step, cell=cell)
            return

    def resumed(self, resume: Resume) -> None:
        """Record what this restart of a killed job loaded and restored (JobResumed)."""
        state = resume.state
        cursor, pending = self.producer.saved() if state is None else (state.cursor, state.pending)
        if isinstance(resume, Adoption):  # a driver hot restart: its processes kept
            adopted_event(self.ctx, resume, cursor, pending)
            return
        self.ctx.emit(
            JobResumed,
            save_step=None if state is None else state.step,
            version=None if state is None else state.version,
            next_step=resume.next_step,
            cursor=cursor,
            pending=pending,
            torn=resume.torn,
        )
