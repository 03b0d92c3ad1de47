"""The scenario file of the scenario reference (docs/scenarios.md, linked from the README)
is one a user can copy: it loads as written and with its optional keys switched on, and its
comments name every fault kind, world key and preset; its table lists every [sim] key."""

from __future__ import annotations

import re
from pathlib import Path

from miles_core.kinds import FaultKind
from miles_core.scenario import scenario_from_toml
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS
from miles_core.scenario.presets import PRESETS
from miles_core.scenario.world import SHAPE_KEYS, TIME_KEYS

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


def _snippet() -> str:
    text = DOC.read_text()
    section = text[text.index("# Scenario files") :]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def test_the_readme_scenario_loads_as_written() -> None:
    scenario = scenario_from_toml(_snippet(), "docs/scenarios.md")
    assert scenario.name == "heal_twice" and scenario.world.num_cells == 3
    assert scenario.loop.steps == 10 and len(scenario.faults) == 1
    assert scenario.until_witnessed is None and scenario.max_seconds is None


def test_its_optional_keys_load_switched_on_and_name_every_preset() -> None:
    lines = _snippet().splitlines()
    on = [re.sub(r"^# (\w+ = )", r"\1", line) for line in lines]
    switched = [a for a, b in zip(lines, on, strict=True) if a != b]
    assert [s.split()[1] for s in switched] == [
        "preset",
        "progress_window",
        "max_seconds",
        "until_witnessed",
        "liveness",
    ]
    scenario = scenario_from_toml("\n".join(on), "docs/scenarios.md")
    assert scenario.preset == "small" and scenario.progress_window == 600.0
    assert scenario.max_seconds == 4000.0 and scenario.until_witnessed == 200
    assert scenario.liveness is not None and scenario.liveness.heal_step == 6
    named = " ".join(lines[lines.index(switched[0]) : lines.index(switched[1])])
    assert all(name in named for name in PRESETS if name not in ANCHOR_PRESETS)
    assert "--anchors" in named  # the published clusters: python -m sim predict --anchors


def test_it_names_every_fault_kind_and_world_key() -> None:
    words = set(re.findall(r"[a-z_0-9]+", _snippet()))
    assert {k.value for k in FaultKind} <= words
    assert words >= SHAPE_KEYS


def test_the_readme_lists_every_sim_key_with_its_default() -> None:
    text = DOC.read_text()
    rows = [r for r in text.splitlines() if r.startswith("| `") and "_" in r.split("|")[1]]
    listed: dict[str, str] = {}
    for row in rows:
        keys = re.findall(r"`(\w+)`", row.split("|")[1])
        defaults = [d.strip() for d in row.split("|")[2].split(",")]
        if set(keys) <= SHAPE_KEYS | TIME_KEYS and len(keys) == len(defaults):
            listed |= dict(zip(keys, defaults, strict=True))
    assert set(listed) == SHAPE_KEYS | TIME_KEYS
    small = PRESETS["small"]
    for key, written in listed.items():
        value = getattr(small.world if key in SHAPE_KEYS else small.timing, key)
        assert _default(written) == value, key


def _default(written: str) -> object:
    """A default as the table writes it: none, true, false, a number, else a word."""
    words = {"none": None, "false": False, "true": True}
    if written in words:
        return words[written]
    try:
        return float(written)
    except ValueError:
        return written
