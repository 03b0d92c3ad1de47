"""What the ``run`` command checks on this machine before Ray starts: the folders it reads
and writes (and, in backends/common/session/address.py, that the cluster it is told to join
answers).

Each of these used to fail only after Ray had started (``--load /nonexistent``: exit 2
after 23 s) or at the end of the run (``--save`` into a folder that cannot be made), or
with Ray's own output (``--address`` to a host nobody answers at: 72 lines, three
tracebacks). Imports neither Ray nor torch, so a wrong command fails in a second.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from backends.common.run.save_verify import LoadPlan, plan_load, zip_problem
from miles_core.errors import ConfigError

CHECKPOINT_FILE = "checkpoint.pt"
"""The file ``--save`` writes in its folder and ``--load`` reads
(backends.common.run.checkpoint)."""


def check_load(folder: str, periodic: bool = False) -> Path:
    """``--load DIR``: a folder holding a checkpoint that ``--save`` wrote, or (``periodic``:
    with --save-interval) a killed job's folder of periodic saves, whatever it holds (no
    committed save: the job starts over). An end-of-run checkpoint must be a whole torch
    save (a truncated one failed in ``torch.load`` after Ray started); periodic saves are
    verified by ``load_plan``."""
    path = Path(folder)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ConfigError("--load", f"{folder!r} {what}", "pass a directory written by --save")
    checkpoint = path / CHECKPOINT_FILE
    if not checkpoint.is_file() and not periodic:
        raise ConfigError(
            "--load",
            f"{folder!r} holds no {CHECKPOINT_FILE}",
            "pass a directory written by --save, or add --save-interval to resume a job's "
            "periodic saves",
        )
    problem = zip_problem(checkpoint) if checkpoint.is_file() else None
    if problem is not None:
        raise ConfigError(
            "--load", f"{str(checkpoint)!r}: {problem}", "pass a checkpoint --save wrote whole"
        )
    return path


def load_plan(load: Path | None, periodic: bool) -> LoadPlan | None:
    """The periodic save ``--load`` resumes from, every newer one that does not verify
    skipped (a ConfigError when saves committed and none verifies); None when --load reads
    an end-of-run checkpoint, or is not given."""
    if load is None or not periodic or (load / CHECKPOINT_FILE).is_file():
        return None
    return plan_load(load)


def check_save(folder: str) -> Path:
    """``--save DIR``: a folder that exists and takes a file, or one that can be made (the
    checkpoint is written at the end of the run: a path that fails then loses the run)."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ConfigError("--save", f"{folder!r} is a file", "pass a directory (made if missing)")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError("--save", f"{str(existing)!r} is a file", "fix the path")
    try:  # os.access says yes to root on /proc; making a file is the only sure test
        with tempfile.TemporaryDirectory(dir=existing, prefix=".save-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            "--save",
            f"cannot make {folder!r}: {error.strerror or error} in {str(existing)!r}",
            "pick a writable directory",
        ) from None
    return path


def check_folders(
    load: str | None, save: str | None, periodic: bool = False
) -> tuple[Path | None, Path | None]:
    """``--load`` and ``--save`` checked (either may be None: not given)."""
    return (
        check_load(load, periodic) if load is not None else None,
        check_save(save) if save is not None else None,
    )
