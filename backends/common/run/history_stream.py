"""``--history FILE`` as the run goes: each event a JSON line, flushed when it is recorded, so
a job killed as a whole (SIGKILL: no code of its runs after) leaves every event it recorded
before the kill, which ``python -m sim judge-joined`` joins to the resumed run's history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from miles_core.errors import ConfigError
from miles_core.events import Event


class HistoryStream:
    """An observer of the run's history that appends every event to ``path``."""

    def __init__(self, path: Path) -> None:
        try:
            self._file: IO[str] | None = path.open("w", encoding="utf-8")
        except OSError as error:
            raise ConfigError(
                "--history",
                f"cannot write {str(path)!r} ({error.strerror})",
                "pick a writable path",
            ) from None

    def __call__(self, event: Event) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event.to_dict(), sort_keys=True) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
