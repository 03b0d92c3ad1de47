"""What a user's mistake in an input file gets told (issue 52, item 10): a misspelled fault
``kind`` the kind it most likely meant, as a misspelled key already got; a link to a device
(/dev/zero, /dev/null) the file named, where it leads, and that it is no regular file,
before a byte is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.scenario import load_scenario_file, scenario_from_toml
from sim.cli.judge_joined import read_history


def test_a_misspelled_fault_kind_gets_the_kind_it_meant() -> None:
    text = '[[faults]]\nkind = "kil_cell"\ncell = 0\nat = 1.0\n'
    with pytest.raises(ConfigError) as refused:
        scenario_from_toml(text, "s.toml")
    assert refused.value.field == "faults[0].kind"
    assert refused.value.fix.startswith("'kil_cell' may be kill_cell; use one of [")


def test_a_fault_kind_like_none_gets_only_the_list() -> None:
    with pytest.raises(ConfigError) as refused:
        scenario_from_toml('[[faults]]\nkind = "meteor"\ncell = 0\nat = 1.0\n', "s.toml")
    assert refused.value.fix.startswith("use one of [")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_scenario_that_links_to_a_device_is_named_with_where_it_leads(
    device: str, tmp_path: Path
) -> None:
    link = tmp_path / "scenario.toml"
    link.symlink_to(device)
    with pytest.raises(ConfigError) as refused:
        load_scenario_file(link)
    assert str(refused.value).startswith(
        f"scenario: cannot read '{link}' (a link to '{device}'): it is a character device, "
        "not a regular file"
    )


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_history_that_links_to_a_device_is_refused_before_it_is_read(
    device: str, tmp_path: Path
) -> None:
    """/dev/zero was read until memory ran out (a MemoryError traceback)."""
    link = tmp_path / "a.jsonl"
    link.symlink_to(device)
    with pytest.raises(ConfigError) as refused:
        read_history(link, "histories")
    assert str(refused.value).startswith(
        f"histories: cannot read '{link}' (a link to '{device}'): it is a character device, "
        "not a regular file"
    )
