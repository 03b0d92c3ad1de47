"""Scenario files on disk: the one place in miles_core that reads or writes a file.

A scenario is data a user writes; reading it is part of taking their input.
Everything else in miles_core stays free of I/O.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.limits import MAX_FILE_BYTES
from miles_core.scenario.load import scenario_from_toml
from miles_core.scenario.model import Scenario

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def load_scenario_file(path: Path | str) -> Scenario:
    """A scenario file: a regular file of at most MAX_FILE_BYTES, read as UTF-8 TOML."""
    path = Path(path)
    try:
        data = _read_regular(path)
        text = data.decode()
    except FileNotFoundError:
        raise ConfigError(
            "scenario", f"file {str(path)!r} does not exist", "check the path"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            "scenario", f"cannot read {str(path)!r} ({error})", "check the file"
        ) from None
    return scenario_from_toml(text, str(path), default_name=path.stem)


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file no larger than MAX_FILE_BYTES. Opened without blocking
    and checked before a byte is read: /dev/zero would be read until memory ran out, and
    a FIFO would wait forever for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "something else")
            raise ConfigError(
                "scenario",
                f"cannot read {_named(path)}: it is {kind}, not a regular file",
                "pass the path of a .toml file (a pipe or a device is not read: write its "
                "scenario to a file first)",
            )
        if info.st_size > MAX_FILE_BYTES:
            raise _too_big(path)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # again as read: a file may grow after its stat
                raise _too_big(path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _named(path: Path) -> str:
    """The path as the user wrote it, and where it leads when it is a link (a link to
    /dev/zero is named, not only the device)."""
    if not path.is_symlink():
        return repr(str(path))
    return f"{str(path)!r} (a link to {str(path.resolve())!r})"


def _too_big(path: Path) -> ConfigError:
    return ConfigError(
        "scenario",
        f"{str(path)!r} is more than {MAX_FILE_BYTES} bytes (16 MiB), the most a scenario "
        "file may be (the library's largest is about 1 KB)",
        "check the path; a scenario that large is built in Python (scenario_from_mapping), "
        "which reads no file (this bound is fixed: it is checked before the file is read)",
    )


def save_scenario_file(path: Path | str, scenario: Scenario) -> Path:
    path = Path(path)
    text = scenario_to_toml(scenario)
    try:
        path.write_text(text)
    except OSError as error:
        raise ConfigError(
            "--save-scenario", f"cannot write {str(path)!r} ({error})", "pick a writable path"
        ) from None
    return path
