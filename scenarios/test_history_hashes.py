"""Every named scenario and scenario file hashes at seeds 0-2 as recorded in
scenarios/history_hashes.txt (scenarios/history_hashes.py says how the record is made and
when it is rewritten): a change that moves code changes no run."""

from __future__ import annotations

import pytest
from history_hashes import SEEDS, line, recorded, sources

RECORD = {" ".join(row.split()[:2]): row for row in recorded()}


def test_the_record_covers_every_scenario_and_no_other() -> None:
    expected = {f"{source} {seed}" for source in sources() for seed in SEEDS}
    assert set(RECORD) == expected, "rewrite it: python scenarios/history_hashes.py --write"


@pytest.mark.parametrize("source", sources())
def test_runs_hash_as_recorded(source: str) -> None:
    for seed in SEEDS:
        assert line(source, seed) == RECORD[f"{source} {seed}"], (
            f"python -m sim run {source} --seed {seed} changed its history; if it was meant "
            "to, rewrite the record: python scenarios/history_hashes.py --write"
        )
