"""Every file a command reads is refused before a byte is read when it is not a regular file
or is past its bound: /dev/zero (or a link to it) was read until memory ran out by `sim
calibrate`, `sim plan`, `calibrate --history` and `sim bench --baseline`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError
from miles_core.scenario.files import load_scenario_file
from miles_core.user_files import HISTORY_BYTES, JSON_BYTES, read_user_file
from sim.cli.bench import read_baseline
from sim.cli.calibrate import load_json
from sim.cli.judge_joined import read_history as read_joined
from sim.timing.plan_file import load_plan
from sim.timing.run_fit import read_history as read_fitted

READERS: list[tuple[str, Callable[[Path], Any], str, int]] = [
    ("sim calibrate BENCH", lambda p: load_json(str(p), "bench JSON"), "bench JSON", JSON_BYTES),
    ("sim bench --baseline", read_baseline, "--baseline", JSON_BYTES),
    ("sim judge-joined", lambda p: read_joined(p, "histories"), "histories", HISTORY_BYTES),
    ("sim calibrate --history", lambda p: read_fitted(str(p)), "--history", HISTORY_BYTES),
    ("sim plan FILE", lambda p: load_plan(str(p)), "plan", JSON_BYTES),
    ("sim run FILE.toml", load_scenario_file, "scenario", 16 * 2**20),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "read", "field", "bound"), READERS, ids=[r[0] for r in READERS]
)
def test_a_link_to_a_device_is_refused_naming_the_flag_and_where_it_leads(
    command: str, read: Callable[[Path], Any], field: str, bound: int, tmp_path: Path
) -> None:
    link = tmp_path / "input"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError) as refused:
        read(link)
    assert refused.value.field == field
    assert "(a link to '/dev/zero'): it is a character device, not a regular file" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("command", "read", "field", "bound"), READERS, ids=[r[0] for r in READERS]
)
def test_a_file_past_its_bound_is_refused_before_it_is_read(
    command: str, read: Callable[[Path], Any], field: str, bound: int, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:  # sparse: the holes cost no disk, and no byte is read
        f.truncate(bound + 1)
    with pytest.raises(ConfigError) as refused:
        read(big)
    assert refused.value.field == field and f"more than {bound} bytes" in refused.value.problem


def test_a_missing_file_a_directory_and_a_fifo_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_user_file(tmp_path / "nope", "--x", 10, "a file")
    with pytest.raises(ConfigError, match="it is a directory, not a regular file"):
        read_user_file(tmp_path, "--x", 10, "a file")
    fifo = tmp_path / "fifo"
    import os

    os.mkfifo(fifo)  # opened without blocking: no writer needed to be refused
    with pytest.raises(ConfigError, match="a FIFO"):
        read_user_file(fifo, "--x", 10, "a file")
    ok = tmp_path / "ok"
    ok.write_bytes(b"12345")
    assert read_user_file(ok, "--x", 5, "a file") == b"12345"
    ok.write_bytes(b"123456")
    with pytest.raises(ConfigError, match="more than 5 bytes"):
        read_user_file(ok, "--x", 5, "a file")
