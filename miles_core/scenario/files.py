"""Scenario files on disk: with miles_core.user_files (which reads any file a user names),
the one place in miles_core that reads or writes a file.

A scenario is data a user writes; reading it is part of taking their input.
Everything else in miles_core stays free of I/O.
"""

from __future__ import annotations

from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.limits import MAX_FILE_BYTES
from miles_core.scenario.load import scenario_from_toml
from miles_core.scenario.model import Scenario
from miles_core.user_files import read_user_text

TOO_BIG_FIX = (
    "check the path (the library's largest scenario is about 1 KB); a scenario that large is "
    "built in Python (scenario_from_mapping), which reads no file (this bound is fixed: it "
    "is checked before the file is read)"
)


def load_scenario_file(path: Path | str) -> Scenario:
    """A scenario file: a regular file of at most MAX_FILE_BYTES, read as UTF-8 TOML
    (miles_core.user_files: /dev/zero or a FIFO is refused before a byte is read)."""
    path = Path(path)
    text = read_user_text(path, "scenario", MAX_FILE_BYTES, "a scenario .toml file", TOO_BIG_FIX)
    return scenario_from_toml(text, str(path), default_name=path.stem)


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
