"""EngineTable.replaced: the first engine whose named process is no longer its process."""

from __future__ import annotations

import pytest

from miles_core.engines import EngineTable
from miles_core.errors import ConfigError


def test_replaced_names_the_first_engine_whose_process_changed() -> None:
    table = EngineTable(["engine-0", "engine-1", "engine-2"])
    assert table.replaced({"engine-0": 0, "engine-1": 0, "engine-2": 0}) is None
    table.failed("engine-1", 0, "killed")
    table.started("engine-1", 1, "restarted")
    table.started("engine-2", 1, "restarted")
    assert table.replaced({"engine-0": 0, "engine-1": 0, "engine-2": 0}) == "engine-1"
    assert table.replaced({"engine-2": 0, "engine-1": 0}) == "engine-2"  # in the given order
    assert table.replaced({"engine-1": 1, "engine-2": 1}) is None


def test_replaced_refuses_an_engine_it_does_not_know() -> None:
    table = EngineTable(["engine-0"])
    with pytest.raises(ConfigError, match="unknown engine 'engine-9'"):
        table.replaced({"engine-0": 0, "engine-9": 0})
