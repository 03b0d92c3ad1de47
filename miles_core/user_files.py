"""Files a user names on a command line: read only when regular, and only up to a bound.

A path can lead anywhere: /dev/zero (or a link to it) is read until memory runs out, a
FIFO waits forever for a writer, a directory or a 10 GB file is no scenario, bench JSON
or history. Every command that reads a file it was given goes through ``read_user_file``,
which opens without blocking and checks the kind and the size before a byte is read, and
again as it reads (a file may grow after its stat). The error names the flag as the user
wrote it, the path (and where a link leads) and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from miles_core.errors import ConfigError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
CHUNK = 1 << 20
JSON_BYTES = 64 * 2**20
"""A JSON or TOML file a command reads (a bench summary, a plan): a full bench's is ~0.2 MB."""
HISTORY_BYTES = 256 * 2**20
"""A history (JSONL): a 30-minute soak writes tens of MB; a history is parsed whole."""


def named(path: Path) -> str:
    """The path as the user wrote it, and where it leads when it is a link (a link to
    /dev/zero is named, not only the device)."""
    if not path.is_symlink():
        return repr(str(path))
    return f"{str(path)!r} (a link to {str(path.resolve())!r})"


def read_user_file(
    path: Path | str, field: str, max_bytes: int, expects: str, too_big_fix: str | None = None
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``; anything else is a
    ConfigError on ``field`` before a byte is read. ``expects`` says what the file should be
    ("a bench JSON file"), for the fix; ``too_big_fix`` says how to do without a larger one."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(field, f"file {named(path)} does not exist", "check the path") from None
    except OSError as error:
        raise ConfigError(field, f"cannot read {named(path)} ({error})", "check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((n for test, n in _KINDS if test(info.st_mode)), "something else")
            raise ConfigError(
                field,
                f"cannot read {named(path)}: it is {kind}, not a regular file",
                f"pass the path of {expects} (a pipe or a device is not read: write it to a "
                "file first)",
            )
        if info.st_size > max_bytes:
            raise too_big(path, field, max_bytes, expects, too_big_fix)
        chunks, size = [], 0
        while chunk := os.read(fd, CHUNK):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise too_big(path, field, max_bytes, expects, too_big_fix)
        return b"".join(chunks)
    except OSError as error:
        raise ConfigError(field, f"cannot read {named(path)} ({error})", "check the file") from None
    finally:
        os.close(fd)


def read_user_text(
    path: Path | str, field: str, max_bytes: int, expects: str, too_big_fix: str | None = None
) -> str:
    """``read_user_file`` as UTF-8 text; bytes that are not UTF-8 are a ConfigError too."""
    data = read_user_file(path, field, max_bytes, expects, too_big_fix)
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise ConfigError(
            field,
            f"cannot read {named(Path(path))}: it is not UTF-8 text ({error})",
            f"pass {expects}",
        ) from None


def too_big(
    path: Path, field: str, max_bytes: int, expects: str, fix: str | None = None
) -> ConfigError:
    return ConfigError(
        field,
        f"{named(path)} is more than {max_bytes} bytes ({max_bytes / 2**20:g} MiB), the most "
        f"{expects} may be here",
        fix or "check the path (this bound is fixed: it is checked before the file is read)",
    )


__all__ = ["named", "read_user_file", "read_user_text", "too_big"]
