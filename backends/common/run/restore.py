"""A real run's checkpoints at its start and end: ``--load`` of an end-of-run checkpoint
(the ledger goes on) or of a killed job's periodic saves (the newest committed one, its
pending prompts regenerated: miles_core.saves), and the end-of-run ``--save``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.common.run import checkpoint
from backends.common.run.save_verify import plan_load
from backends.common.run.saves import read_ranks
from backends.common.training.policy import AnyPolicy
from backends.common.world.cluster import RayCluster
from miles_core.backend import CellFailure
from miles_core.errors import ConfigError
from miles_core.loop import Orchestrator
from miles_core.saves import Resume


async def save_at_end(
    cluster: RayCluster, control: Orchestrator, to: Path, policy: AnyPolicy
) -> Path | None:
    """Save from the first alive cell that answers; None when no cell is left to save."""
    for cell in control.cells.alive():
        try:
            state = await cluster.cells[cell].call("get_state")
        except CellFailure:
            continue
        return checkpoint.save(to, state, control.ledger.snapshot(), policy)
    return None


async def restore(
    cluster: RayCluster, load_from: Path | None, policy: AnyPolicy
) -> tuple[Any, Resume | None]:
    """(ledger, None) for an end-of-run checkpoint (--load of a --save without an interval),
    (None, resume) for a killed job's directory of periodic saves: the newest committed
    save that verifies loaded into every cell (a torn or damaged one skipped: the preflight
    said which and why, and the files are verified again here, as they are read), or a
    fresh start when none committed."""
    if load_from is None or (load_from / checkpoint.FILE).is_file():
        return await _resume(cluster, load_from, policy), None
    resume = plan_load(load_from).resume
    if resume.state is not None:
        states = read_ranks(load_from, resume.state.step, policy)
        await _load_states(cluster, states)
    return None, resume


async def _resume(cluster: RayCluster, load_from: Path | None, policy: AnyPolicy) -> Any:
    """Load a checkpoint into every cell; its ledger (or None when not resuming)."""
    if load_from is None:
        return None
    states, ledger = checkpoint.load(load_from, policy)
    await _load_states(cluster, states)
    return ledger


async def _load_states(cluster: RayCluster, states: Sequence[Any]) -> None:
    """Every cell's ranks take the saved ranks' states (same cell size, checked)."""
    if len(states) != cluster.gpus_per_cell:
        raise ConfigError(
            "--load",
            f"the checkpoint holds {len(states)} ranks per cell, this run has "
            f"{cluster.gpus_per_cell}",
            "resume with the cell size the checkpoint was saved with",
        )
    args = [(state,) for state in states]
    await asyncio.gather(*(c.call_each("set_state", args) for c in cluster.cells.values()))
