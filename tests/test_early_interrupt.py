"""Ctrl-C in a command's first instants (issue 52, item 8): while it imports torch, Ray or
transformers, before its own handling is set up, it exits 130 with no traceback (it printed
a 42-line KeyboardInterrupt traceback and exited 1). And a wrong flag is said before those
imports (item 10: it took 4 to 5 s).

The Ctrl-C is sent when the command has imported its first module of this tree (``-X
importtime`` says so on stderr), the moment the heavy imports begin."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from miles_core.ctrl_c import INTERRUPTED_EXIT

pytestmark = pytest.mark.usefixtures("ctrl_c_as_in_a_terminal")

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["sim", "run", "swarm", "--steps", "3000"],
    ["backends.cpu", "run", "--steps", "1"],
    ["backends.gpu", "run", "--device", "cpu", "--steps", "1"],
    ["backends.tasks", "make", "--out", "{tmp}/task"],
]


def _own_import(line: str) -> bool:
    """An import-time line of a module of this tree, past the package and miles_core.ctrl_c
    (which a command imports first, to set up its Ctrl-C)."""
    name = line.rsplit("|", 1)[-1].strip()
    return name.startswith("miles_core.") and name != "miles_core.ctrl_c"


def _ctrl_c_at_first_import(argv: list[str], seconds: float = 60) -> tuple[int, str]:
    """The command's exit code and stderr after a Ctrl-C sent as its first own import
    finished (its process group, as a terminal sends it)."""
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for raw in iter(process.stderr.readline, b""):
            lines.append(raw.decode(errors="replace"))
            if lines[-1].startswith("import time:") and _own_import(lines[-1]):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(seconds), "".join(lines)[-2000:]
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=seconds)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=5)
    said = [line for line in lines if not line.startswith("import time:")]
    return process.returncode, "".join(said)


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_ctrl_c_while_a_command_imports_exits_130_without_a_traceback(
    argv: list[str], tmp_path: Path
) -> None:
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    code, err = _ctrl_c_at_first_import(argv)
    assert code == INTERRUPTED_EXIT, f"exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "interrupted" in err, err[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        ["backends.cpu", "run", "--no-such-flag"],
        ["backends.gpu", "run", "--no-such-flag"],
        ["sim", "run", "--no-such-flag"],
        ["backends.tasks", "make", "--out", "x", "--no-such-flag"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_wrong_flag_is_said_before_the_heavy_imports(argv: list[str]) -> None:
    """Exit 2 naming the flag, with neither torch nor Ray imported (they take seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert not {"torch", "ray", "transformers"} & imported, f"{seconds:.1f} s"
