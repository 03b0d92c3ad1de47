"""One path per output: two output flags on one file would overwrite each other.

``--trace out.json --metrics out.json`` writes the trace, then the metrics over it, and the
run says both were written; an output on the scenario file it reads destroys the input.
The CLIs check their output flags with ``check_distinct_paths`` before anything runs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from miles_core.errors import ConfigError


def _key(path: str | Path) -> tuple[str, tuple[int, int] | None]:
    """The resolved path, and the file's (device, inode) when it exists (a hard link or a
    symlink to the same file is the same file)."""
    resolved = Path(path).resolve()
    try:
        info = os.stat(resolved)
    except OSError:
        return str(resolved), None
    return str(resolved), (info.st_dev, info.st_ino)


def _shared_sink(path: str | Path) -> bool:
    """A device or a pipe (``/dev/null``): several outputs may go there on purpose."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_distinct_paths(
    outputs: Mapping[str, str | Path | None], inputs: Mapping[str, str | Path | None] = {}
) -> None:
    """Every output (flag -> path; None: not given) on a path of its own, none of them on an
    input's path; a ConfigError naming both flags otherwise."""
    taken: dict[object, str] = {}
    for flag, path in inputs.items():
        if path is not None:
            for key in _key(path):
                if key is not None:
                    taken.setdefault(key, flag)
    for flag, path in outputs.items():
        if path is None or str(path) == "" or _shared_sink(path):
            continue
        keys = [key for key in _key(path) if key is not None]
        other = next((taken[key] for key in keys if key in taken), None)
        if other is not None:
            read = other in inputs
            raise ConfigError(
                flag,
                f"{str(path)!r} is the path of {other} too: writing it would "
                + ("destroy the input it reads" if read else f"overwrite what {other} wrote"),
                f"give {flag} a path of its own",
            )
        for key in keys:
            taken[key] = flag
