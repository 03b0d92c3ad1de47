"""A real run's periodic saves (``--save DIR --save-interval N``): the CheckpointStore the
loop writes through (miles_core.saves), kept in DIR so that a job killed as a whole (every
process, SIGKILL) resumes from it with ``--load DIR``.

One directory per save, ``DIR/save-STEP``, written in an order a kill cannot fool:

1. ``state.json``: what the control plane restores (the step, the ledger's version, the
   data cursor, the prompts still to train, the seed) and the policy it trained, written
   whole (a temporary file renamed over it);
2. ``rank-R.pt``: each rank of the writing cell's model and optimizer, each written whole;
3. ``committed``: the tracker, written last (miles counts a checkpoint once
   ``latest_checkpointed_iteration.txt`` names it, written after every other file): the
   step and each file's size and sha256, so ``--load`` verifies a save before Ray starts
   and skips one damaged after it committed (backends/common/run/save_verify.py).

A directory without ``committed`` is a save the kill tore: listed as such, never read.
The files are written off the event loop (a thread), so the run's other work goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from backends.common.run.save_verify import STATE, TRACKER, tracker_text
from backends.common.training.policy import AnyPolicy
from miles_core.errors import ConfigError
from miles_core.saves import SaveState, StoredSave

if TYPE_CHECKING:
    from backends.common.world.cluster import RayCluster

_NAME = re.compile(r"^save-(\d+)$")


def _write_whole(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename: the file is whole or absent, and on disk (fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)


def _policy_dict(policy: AnyPolicy) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(policy), default=str))


def write_save(
    directory: Path, state: SaveState, ranks: list[dict[str, Any]], policy: AnyPolicy
) -> Path:
    """The save of ``state`` with the ranks' states, committed last."""
    folder = directory / f"save-{state.step:06d}"
    if folder.exists():  # a save of this step torn earlier, or an older run's: replaced
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    body = {"state": state.to_dict(), "policy": _policy_dict(policy), "ranks": len(ranks)}
    _write_whole(folder / STATE, lambda p: p.write_text(json.dumps(body)))
    names = [STATE]
    for r, rank_state in enumerate(ranks):
        names.append(f"rank-{r}.pt")
        _write_whole(folder / names[-1], lambda p, s=rank_state: torch.save(s, p))
    tracker = tracker_text(folder, state.step, names)
    _write_whole(folder / TRACKER, lambda p: p.write_text(tracker))
    return folder


def list_saves(directory: Path) -> tuple[StoredSave, ...]:
    """Every save in ``directory`` whose state was written, committed or torn (one whose
    state.json never landed was killed before it held anything, and is not a save; one whose
    state.json does not parse is left out: ``save_verify.plan_load`` names it)."""
    out = []
    for folder in sorted(directory.iterdir()) if directory.is_dir() else ():
        if _NAME.match(folder.name) is None or not (folder / STATE).is_file():
            continue
        try:
            body = json.loads((folder / STATE).read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        out.append(StoredSave(SaveState.from_dict(body["state"]), (folder / TRACKER).is_file()))
    return tuple(out)


def read_ranks(directory: Path, step: int, policy: AnyPolicy) -> list[dict[str, Any]]:
    """The ranks' states of the committed save of ``step``, checked against this run."""
    folder = directory / f"save-{step:06d}"
    body = json.loads((folder / STATE).read_text())
    if body["policy"] != _policy_dict(policy):
        raise ConfigError(
            "--load",
            f"{folder} was saved by the policy {body['policy']}, this run has another",
            "resume with the flags the job was started with",
        )
    return [torch.load(folder / f"rank-{r}.pt", weights_only=False) for r in range(body["ranks"])]


class RayCheckpoints:
    """The Ray world's CheckpointStore over ``directory``."""

    def __init__(self, cluster: RayCluster, directory: Path, policy: AnyPolicy) -> None:
        self.cluster = cluster
        self.directory = directory
        self.policy = policy

    async def write(self, cell: int, state: SaveState) -> None:
        """The cell's ranks give their states (CellFailure if one dies), then the files."""
        ranks = await self.cluster.cells[cell].call("get_state")
        await asyncio.to_thread(write_save, self.directory, state, ranks, self.policy)

    def saves(self) -> tuple[StoredSave, ...]:
        return list_saves(self.directory)
