"""Every scenario file in scenarios/files loads and ends as it says, every oracle passing,
under two seeds (a file is documentation a user copies: one that no longer runs is a bug)."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_core.scenario import load_scenario_file
from sim.run import run_scenario

FILES = sorted((Path(__file__).resolve().parent / "files").glob("*.toml"))


def test_there_are_files() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_scenario_file_ends_as_it_expects(path: Path, seed: int) -> None:
    scenario = load_scenario_file(path)
    result = run_scenario(scenario, seed)
    replay = f"python -m sim run {path.relative_to(path.parents[2])} --seed {seed}"
    assert result.ok, f"{result.failures()}\nreplay: {replay}"
    assert result.report.status is scenario.expect.status
