"""The output files a user asks a CLI for (a trace, metrics): checked before the run starts,
written after. Besides scenario files, the only place in miles_core that touches files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
