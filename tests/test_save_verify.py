"""``--load`` of periodic saves verifies them before Ray starts (issue 52, item 6).

A committed save whose ``rank-0.pt`` was truncated or deleted, or whose ``state.json`` is not
JSON, failed 30-60 s after Ray started with torch.load's traceback. A save's tracker now
records each file's size and sha256; ``--load`` checks them before Ray, resumes from the
newest save that verifies and says which it skipped and why; when none verifies it exits 2
naming the directory. A save whose tracker predates the records (the step alone) still loads,
said to be unverified. No test here starts Ray: the run is replaced, and the restore's cells
are a stub that records what it was given.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.common.run import command as cli
from backends.common.run.restore import restore
from backends.common.run.saves import write_save
from backends.common.training.policy import PolicyConfig
from backends.cpu.__main__ import main as cpu_main
from miles_core.errors import ConfigError
from miles_core.saves import SaveState

STEPS = (0, 1, 2)


class Stopped(Exception):
    """Raised by the replaced run: the preflight let the command through."""


@pytest.fixture
def saves(tmp_path: Path) -> Path:
    """Three committed saves, rank 0 of step s holding w = s."""
    folder = tmp_path / "job"
    for step in STEPS:
        state = SaveState(step, step + 1, 4 * (step + 1), (), 7)
        write_save(folder, state, [{"w": torch.full((64,), float(step))}], PolicyConfig())
    return folder


def legacy(folder: Path) -> Path:
    """The saves as written before this change: the tracker holds the step alone."""
    for save in folder.glob("save-*"):
        (save / "committed").write_text(str(int(save.name.removeprefix("save-"))))
    return folder


def damage(folder: Path, how: str) -> None:
    """Damage the newest save after it committed."""
    newest = folder / f"save-{STEPS[-1]:06d}"
    rank = newest / "rank-0.pt"
    if how == "truncated":
        rank.write_bytes(rank.read_bytes()[: rank.stat().st_size // 2])
    elif how == "missing":
        rank.unlink()
    elif how == "state-not-json":
        (newest / "state.json").write_text("{this is not json")
    elif how == "flipped":  # same size, one bit changed in the data
        raw = bytearray(rank.read_bytes())
        raw[len(raw) // 2] ^= 1
        rank.write_bytes(bytes(raw))


def run(folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """``run --load DIR --save DIR --save-interval 1`` up to the point Ray would start;
    the command's stderr (the run must be reached: Stopped)."""
    monkeypatch.setattr(cli, "run_real", _stop)
    with pytest.raises(Stopped):
        cpu_main(["run", "--steps", "4", "--load", str(folder), "--save", str(folder),
                  "--save-interval", "1"])  # fmt: skip
    return capsys.readouterr().err


def _stop(*args: object, **kwargs: object) -> None:
    raise Stopped


def refused(folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> str:
    """Exit 2 before Ray, one error line, no traceback; the stderr text."""
    monkeypatch.setattr(cli, "run_real", lambda *a, **k: pytest.fail("the run (Ray) started"))
    with pytest.raises(SystemExit) as caught:
        cpu_main(["run", "--steps", "4", "--load", str(folder), "--save", str(folder),
                  "--save-interval", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    return err


class Cells:
    """The restore's cluster, Ray-less: what each rank was given."""

    gpus_per_cell = 1

    def __init__(self) -> None:
        self.given: list[Any] = []
        self.cells = {0: self}

    async def call_each(self, method: str, args: list[tuple[Any, ...]]) -> None:
        assert method == "set_state"
        self.given += [a[0] for a in args]


def restored(folder: Path) -> tuple[int | None, float]:
    """(the step the restore resumed from, the w it loaded into the cell)."""
    cells = Cells()
    _, resume = asyncio.run(restore(cells, folder, PolicyConfig()))  # type: ignore[arg-type]
    assert resume is not None and resume.state is not None
    return resume.state.step, float(cells.given[0]["w"][0])


def test_a_save_records_each_file_size_and_hash(saves: Path) -> None:
    import hashlib

    tracker = json.loads((saves / "save-000002" / "committed").read_text())
    assert tracker["step"] == 2 and set(tracker["files"]) == {"state.json", "rank-0.pt"}
    rank = saves / "save-000002" / "rank-0.pt"
    assert tracker["files"]["rank-0.pt"] == {
        "size": rank.stat().st_size,
        "sha256": hashlib.sha256(rank.read_bytes()).hexdigest(),
    }


def test_whole_saves_resume_from_the_newest_verified(
    saves: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: nothing skipped, the newest save said to be verified and restored."""
    err = run(saves, monkeypatch, capsys)
    assert "--load: resuming from save-000002 (step 2): its files' sizes and sha256 verified" in err
    assert "skipping" not in err
    assert restored(saves) == (2, 2.0)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("truncated", "rank-0.pt is {half} bytes, the tracker recorded {size}"),
        ("missing", "rank-0.pt is missing"),
        ("state-not-json", "state.json is 17 bytes, the tracker recorded"),
        ("flipped", "rank-0.pt's sha256 differs from the one the tracker recorded"),
    ],
)
def test_a_damaged_save_is_skipped_before_ray_for_the_newest_that_verifies(
    saves: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
    why: str,
) -> None:
    size = (saves / "save-000002" / "rank-0.pt").stat().st_size
    damage(saves, how)
    err = run(saves, monkeypatch, capsys)
    assert f"--load: skipping save-000002: {why.format(half=size // 2, size=size)}" in err, err
    assert "--load: resuming from save-000001 (step 1): its files' sizes and sha256" in err
    assert restored(saves) == (1, 1.0)  # the run, after Ray, loads the one that verified


def test_when_no_save_verifies_the_run_exits_2_naming_the_directory(
    saves: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for save in saves.glob("save-*"):
        (save / "rank-0.pt").write_bytes(b"")
    err = refused(saves, capsys, monkeypatch)
    assert f"--load: no save in {str(saves)!r} verifies (save-000002: rank-0.pt is 0 bytes" in err
    assert "save-000000: rank-0.pt is 0 bytes" in err and "start the job over" in err
    with pytest.raises(ConfigError, match="verifies"):
        restored(saves)


def test_saves_from_before_the_records_still_load_said_unverified(
    saves: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run(legacy(saves), monkeypatch, capsys)
    assert "--load: resuming from save-000002 (step 2): saved before saves recorded sizes" in err
    assert "could not be verified" in err
    assert restored(saves) == (2, 2.0)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("truncated", "rank-0.pt is not a whole torch save"),
        ("missing", "rank-0.pt is missing"),
        ("state-not-json", "state.json is not JSON"),
        ("flipped", "rank-0.pt is corrupt (its member"),
    ],
)
def test_an_old_damaged_save_is_skipped_too(
    saves: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
    why: str,
) -> None:
    damage(legacy(saves), how)
    err = run(saves, monkeypatch, capsys)
    assert f"--load: skipping save-000002: {why}" in err, err
    assert "--load: resuming from save-000001 (step 1): saved before" in err
    assert restored(saves) == (1, 1.0)


def test_a_torn_save_is_still_skipped_and_a_folder_of_none_starts_over(
    saves: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (saves / "save-000002" / "committed").unlink()
    err = run(saves, monkeypatch, capsys)
    assert "skipping save-000002: torn" in err and "resuming from save-000001" in err
    for save in saves.glob("save-*"):
        (save / "committed").unlink(missing_ok=True)
    assert "holds no committed save: starting over" in run(saves, monkeypatch, capsys)


def test_a_truncated_end_of_run_checkpoint_is_refused_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--save`` without an interval writes checkpoint.pt: a truncated one is refused too."""
    path = tmp_path / "checkpoint.pt"
    torch.save({"w": torch.zeros(256)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    monkeypatch.setattr(cli, "run_real", lambda *a, **k: pytest.fail("the run (Ray) started"))
    with pytest.raises(SystemExit) as caught:
        cpu_main(["run", "--steps", "1", "--load", str(tmp_path)])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "checkpoint.pt is not a whole torch save" in err, err


def settle(folder: Path) -> None:
    """Every file of the saves last written two seconds ago, as a save loaded later is."""
    import os
    import time

    then = time.time() - 2.0
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def test_a_settled_save_is_hashed_once_for_the_preflight_and_the_restore(
    saves: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--load hashed the chosen save twice (the preflight, then the run's restore: 0.6 s a
    GB each); a file rewritten since, even in place at its size, is hashed anew."""
    from backends.common.run import save_verify

    settle(saves)
    hashed: list[str] = []
    real = save_verify._hash
    monkeypatch.setattr(save_verify, "_hash", lambda path: hashed.append(path) or real(path))
    save_verify._settled_hash.cache_clear()
    save_verify.plan_load(saves)
    first = len(hashed)
    assert restored(saves) == (2, 2.0) and first > 0 and len(hashed) == first
    rank = saves / "save-000002" / "rank-0.pt"
    body = bytearray(rank.read_bytes())
    body[-40] ^= 0xFF  # a byte flipped in place, inside the zip's data: same size
    rank.write_bytes(bytes(body))
    plan = save_verify.plan_load(saves)
    assert plan.chosen is not None and plan.chosen.step == 1 and len(hashed) > first
