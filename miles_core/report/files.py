"""The output a user asks a CLI for: files (a trace, metrics) checked before the run starts
and written after, and stdout, which may close early (``| head``). Besides scenario files,
the only place in miles_core that touches files."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from miles_core.ctrl_c import INTERRUPTED_EXIT, ctrl_c_counted, exit_code
from miles_core.errors import ConfigError


def check_writable(path: str | Path, flag: str) -> Path:
    """The path, once it is sure a file can be written there (nothing is created yet); else a
    ConfigError naming ``flag``."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(flag, f"{str(path)!r} is a directory", "pass a file path")
    parent = path.parent
    if not parent.exists():
        raise ConfigError(flag, f"the directory {str(parent)!r} does not exist", "create it first")
    if not parent.is_dir():
        raise ConfigError(flag, f"{str(parent)!r} is a file, not a directory", "fix the path")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise ConfigError(flag, f"{str(target)!r} is not writable", "pick a writable path")
    return path


def write_json(path: Path, data: Any, flag: str) -> None:
    try:
        path.write_text(json.dumps(data))
    except OSError as error:
        raise ConfigError(
            flag, f"cannot write {str(path)!r} ({error.strerror})", "pick a writable path"
        ) from None


def write_json_lines(path: Path, rows: list[dict[str, Any]], flag: str) -> None:
    """One JSON object per line (``--metrics``: one line per step)."""
    try:
        path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    except OSError as error:
        raise ConfigError(
            flag, f"cannot write {str(path)!r} ({error.strerror})", "pick a writable path"
        ) from None


SIGPIPE_EXIT = 141
"""What a shell reports for a process a closed pipe stopped (128 + SIGPIPE)."""


def run_cli(main: Callable[[], int]) -> int:
    """``main``'s exit code, for a command's ``sys.exit``. A reader that went away early
    (``| head``) ends the output quietly, as Unix tools do, instead of with a BrokenPipeError
    traceback; a Ctrl-C that ``main`` left to it (one before a run began, or a second one)
    ends it with one line and 130, as a shell reports a Ctrl-C, instead of a
    KeyboardInterrupt traceback. Ctrl-C raises it again from here (``main`` handles it):
    before, while the command imported, it ended the process at once (miles_core/ctrl_c.py)."""
    with ctrl_c_counted():
        try:
            code = exit_code(main())
            sys.stdout.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's final flush goes here
            os.dup2(devnull, sys.stdout.fileno())
            code = SIGPIPE_EXIT
        except KeyboardInterrupt:
            print("\ninterrupted (Ctrl-C)", file=sys.stderr)
            code = INTERRUPTED_EXIT
    # the process ends: what it made dies with it. Collected at exit instead, a long
    # simulated run's objects (cycles of tasks and events) took 0.7 s after the last line
    gc.freeze()
    return code


def exit_cli(main: Callable[[], int]) -> NoReturn:
    """End the process with ``run_cli(main)``'s code; after a Ctrl-C at once, the output
    flushed (``os._exit``): the interpreter's own teardown took 1.5 to 7 s after a real run
    (torch's, transformers' and Ray's modules, none of it Python), past the 2 s a Ctrl-C
    may take. Whatever the command started is stopped by then (Ray shut down)."""
    code = run_cli(main)
    if code == INTERRUPTED_EXIT:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)
