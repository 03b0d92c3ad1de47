"""Every named scenario and scenario file hashes at seeds 0-2 as recorded, under each miles
profile (scenarios/history_hashes.txt: aug2026, unchanged since before the profiles;
history_hashes_today.txt: today; scenarios/history_hashes.py says how a record is made and
when it is rewritten): a change that moves code changes no run."""

from __future__ import annotations

import pytest
from history_hashes import RECORDS, SEEDS, line, recorded, sources

RECORD = {
    profile: {" ".join(row.split()[:2]): row for row in recorded(profile)} for profile in RECORDS
}


@pytest.mark.parametrize("profile", RECORDS)
def test_the_record_covers_every_scenario_and_no_other(profile: str) -> None:
    expected = {f"{source} {seed}" for source in sources() for seed in SEEDS}
    assert set(RECORD[profile]) == expected, (
        "rewrite it: python scenarios/history_hashes.py --write"
    )


@pytest.mark.parametrize("profile", RECORDS)
@pytest.mark.parametrize("source", sources())
def test_runs_hash_as_recorded(source: str, profile: str) -> None:
    for seed in SEEDS:
        assert line(source, seed, profile) == RECORD[profile][f"{source} {seed}"], (
            f"python -m sim run {source} --seed {seed} --miles-profile {profile} changed its "
            "history; if it was meant to, rewrite the record: "
            "python scenarios/history_hashes.py --write"
        )
