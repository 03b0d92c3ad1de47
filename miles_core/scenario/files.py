"""Scenario files on disk: the one place in miles_core that reads or writes a file.

A scenario is data a user writes; reading it is part of taking their input.
Everything else in miles_core stays free of I/O.
"""

from __future__ import annotations

from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.load import scenario_from_toml
from miles_core.scenario.model import Scenario


def load_scenario_file(path: Path | str) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            "scenario", f"file {str(path)!r} does not exist", "check the path"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            "scenario", f"cannot read {str(path)!r} ({error})", "check the file"
        ) from None
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
