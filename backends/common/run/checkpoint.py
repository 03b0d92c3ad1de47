"""Checkpoints of a real run: the first alive cell's model and optimizer, and the ledger.

The ledger travels with the weights so that a resumed run continues the version
sequence (north star: the version is saved with every checkpoint), and the
engines of the resumed run are synced to that version before they serve.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from backends.common.run.preflight import CHECKPOINT_FILE
from backends.common.training.policy import AnyPolicy
from miles_core.errors import ConfigError
from miles_core.versions import LedgerSnapshot, VersionLedger

FILE = CHECKPOINT_FILE  # one name: --load is checked for it before Ray starts (preflight)


def save(directory: Path, state: dict[str, Any], ledger: LedgerSnapshot, policy: AnyPolicy) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    torch.save(
        {
            "state": state,
            "weights_version": ledger.version,
            "policy": dataclasses.asdict(policy),
        },
        path,
    )
    return path


def load(directory: Path, policy: AnyPolicy) -> tuple[dict[str, Any], VersionLedger]:
    path = directory / FILE
    if not path.exists():
        raise ConfigError("--load", f"{path} does not exist", "pass a directory written by --save")
    data = torch.load(path, weights_only=False)
    if data["policy"] != dataclasses.asdict(policy):
        raise ConfigError(
            "--load",
            f"the checkpoint's policy {data['policy']} differs from this run's",
            "resume with the policy settings the checkpoint was saved with",
        )
    ledger = VersionLedger()
    ledger.restore(LedgerSnapshot(data["weights_version"]))
    return data["state"], ledger
