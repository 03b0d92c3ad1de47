"""Which periodic save ``--load DIR`` resumes from, each checked before Ray starts.

A save (backends/common/run/saves.py) is committed once its tracker is written, last. The
tracker records each file the save wrote, with its size and sha256, so a save damaged after
it committed (a file truncated, deleted or rewritten; state.json not JSON) is found here,
before Ray starts, instead of 30-60 s into the run by ``torch.load``'s traceback. The
newest save that verifies is the one resumed; each newer one is skipped and named, with
why. A tracker written before sizes and hashes were recorded holds only the step: such a
save still loads (nothing saved is lost), checked as far as its files allow (state.json
parses, each rank file is a whole zip whose CRCs match) and said to be unverified.

Imports neither Ray nor torch: the check runs in the ``run`` command's preflight.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.saves import Resume, SaveState

STATE, TRACKER = "state.json", "committed"
SAVE_NAME = re.compile(r"^save-(\d+)$")
_FIX = (
    "restore the damaged files from a copy, or move the save-* folders away to start the job over"
)


class _Damaged(Exception):
    """Why one save cannot be loaded (a sentence, naming the file)."""


@dataclass(frozen=True)
class SaveCheck:
    """One committed save as checked: loadable (``problem`` None) or not, and why."""

    folder: Path
    step: int
    problem: str | None
    verified: bool
    """Its files' sizes and sha256 matched its tracker (False: a save from before the tracker
    recorded them, loaded unverified)."""
    state: SaveState | None = None


@dataclass(frozen=True)
class LoadPlan:
    """What ``--load DIR`` of periodic saves resumes from, and what it skips."""

    directory: Path
    chosen: SaveCheck | None
    """The newest committed save that verifies; None: none committed, the job starts over."""
    skipped: tuple[SaveCheck, ...]
    """Committed saves newer than ``chosen`` that did not verify, newest first."""
    torn: tuple[int, ...]
    """Steps of saves begun and never committed (no tracker: the kill tore them)."""

    @property
    def resume(self) -> Resume:
        return Resume(None if self.chosen is None else self.chosen.state, self.torn)

    def lines(self) -> list[str]:
        """What the user is told before the run starts."""
        out = [f"--load: skipping {s.folder.name}: {s.problem}" for s in self.skipped]
        out += [f"--load: skipping save-{t:06d}: torn (begun, never committed)" for t in self.torn]
        if self.chosen is None:
            return [*out, f"--load: {str(self.directory)!r} holds no committed save: starting over"]
        how = (
            "its files' sizes and sha256 verified"
            if self.chosen.verified
            else "saved before saves recorded sizes and hashes, so it could not be verified; "
            "its state.json parses and its rank files are whole (their zip CRCs match)"
        )
        chosen = self.chosen.folder.name
        return [*out, f"--load: resuming from {chosen} (step {self.chosen.step}): {how}"]


def file_record(path: Path) -> dict[str, Any]:
    """What a tracker records of one file: its size and sha256."""
    stat = path.stat()
    if time.time() - stat.st_mtime_ns / 1e9 < SETTLED_S:  # may change within one clock tick
        digest = _hash(str(path))
    else:
        digest = _settled_hash(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return {"size": stat.st_size, "sha256": digest}


SETTLED_S = 1.0
"""A file last written this long ago is hashed once per version (path, inode, size, mtime):
any later write stamps a later mtime, as the file system's clock (a tick of a few ms) has
moved on. ``--load`` verifies a save in the preflight and again as the run restores it, at
0.6 s a GB each; a file written within the last second is hashed each time."""


def _hash(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.lru_cache(maxsize=1024)
def _settled_hash(path: str, inode: int, size: int, mtime_ns: int) -> str:
    return _hash(path)


def tracker_text(folder: Path, step: int, names: list[str]) -> str:
    """The tracker of the save in ``folder``: its step and every file's record."""
    return json.dumps({"step": step, "files": {n: file_record(folder / n) for n in names}})


def _recorded(folder: Path, step: int) -> dict[str, dict[str, Any]] | None:
    """The tracker's records by file name; None for a tracker from before they were kept."""
    text = (folder / TRACKER).read_bytes().decode("utf-8", "replace").strip()
    if text.isdigit():  # the old tracker: the step alone
        found: Any = int(text)
        records = None
    else:
        try:
            body = json.loads(text)
            found, records = body["step"], body["files"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise _Damaged(
                f"its tracker {TRACKER!r} is neither a step nor JSON of its files"
            ) from None
    if found != step:
        raise _Damaged(f"its tracker names step {found!r}, the folder step {step}")
    if records is not None and not (
        isinstance(records, dict) and all(isinstance(r, dict) for r in records.values())
    ):
        raise _Damaged(f"its tracker {TRACKER!r} holds no file records")
    return records


def _check_record(path: Path, record: dict[str, Any]) -> None:
    if not path.is_file():
        raise _Damaged(f"{path.name} is missing")
    size = path.stat().st_size
    if size != record.get("size"):
        raise _Damaged(f"{path.name} is {size} bytes, the tracker recorded {record.get('size')}")
    if file_record(path)["sha256"] != record.get("sha256"):
        raise _Damaged(f"{path.name}'s sha256 differs from the one the tracker recorded")


def _state(folder: Path) -> tuple[SaveState, int]:
    """state.json's SaveState and rank count."""
    path = folder / STATE
    if not path.is_file():
        raise _Damaged(f"{STATE} is missing")
    try:
        body = json.loads(path.read_bytes())
        state, ranks = SaveState.from_dict(body["state"]), body["ranks"]
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _Damaged(f"{STATE} is not JSON ({error})") from None
    except (KeyError, TypeError, ConfigError) as error:
        raise _Damaged(f"{STATE} is not a save's state ({error})") from None
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise _Damaged(f"{STATE} says ranks={ranks!r}")
    return state, ranks


def zip_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole torch save (torch.save writes a zip: a truncated one has
    no central directory, a damaged one fails a member's CRC), or None."""
    if not path.is_file():
        return f"{path.name} is missing"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"{path.name} is not a whole torch save ({error})"
    return None if bad is None else f"{path.name} is corrupt (its member {bad} fails its CRC)"


def _check(folder: Path, step: int) -> SaveCheck:
    records = _recorded(folder, step)
    if records is not None:
        for name, record in sorted(records.items()):
            _check_record(folder / name, record)
    state, ranks = _state(folder)
    names = [f"rank-{r}.pt" for r in range(ranks)]
    if records is None:
        for problem in filter(None, (zip_problem(folder / name) for name in names)):
            raise _Damaged(problem)
    elif set(records) != {STATE, *names}:
        raise _Damaged(f"its tracker records {sorted(records)}, {STATE} says {ranks} rank(s)")
    return SaveCheck(folder, step, None, records is not None, state)


def check_save(folder: Path, step: int) -> SaveCheck:
    """One committed save, checked: its problem, or its state."""
    try:
        return _check(folder, step)
    except _Damaged as damage:
        return SaveCheck(folder, step, str(damage), False)
    except OSError as error:
        return SaveCheck(folder, step, f"cannot be read ({error})", False)


def _folders(directory: Path) -> list[tuple[int, Path]]:
    """Every save folder that holds anything (a state or a tracker), newest first."""
    found = []
    for folder in directory.iterdir() if directory.is_dir() else ():
        match = SAVE_NAME.match(folder.name)
        if match and any((folder / name).exists() for name in (STATE, TRACKER)):
            found.append((int(match.group(1)), folder))
    return sorted(found, reverse=True)


def plan_load(directory: Path) -> LoadPlan:
    """The newest committed save that verifies (newer ones skipped, with why), or none when
    none committed; a ConfigError naming the directory when saves committed and none
    verifies (a fresh start would silently lose them)."""
    folders = _folders(directory)
    torn = tuple(sorted(step for step, f in folders if not (f / TRACKER).is_file()))
    skipped: list[SaveCheck] = []
    for step, folder in folders:
        if step in torn:
            continue
        check = check_save(folder, step)
        if check.problem is None:
            return LoadPlan(directory, check, tuple(skipped), torn)
        skipped.append(check)
    if skipped:
        why = "; ".join(f"{s.folder.name}: {s.problem}" for s in skipped)
        raise ConfigError("--load", f"no save in {str(directory)!r} verifies ({why})", _FIX)
    return LoadPlan(directory, None, (), torn)


__all__ = [
    "LoadPlan",
    "SaveCheck",
    "check_save",
    "file_record",
    "plan_load",
    "tracker_text",
    "zip_problem",
]
