"""``[miles] profile`` / ``--miles-profile``: which miles the loop follows (miles_core.profile).

The profile's effects are tested where each behaviour is; here: how it is spelt, checked and
written, and that the default is today's miles."""

from __future__ import annotations

import pytest

from miles_core.errors import ConfigError
from miles_core.profile import DEFAULT_MILES_PROFILE, MilesProfile
from miles_core.scenario import scenario_from_toml
from miles_core.scenario.dump import scenario_to_toml

BASE = 'name = "p"\n[loop]\nsteps = 2\n'


def test_the_default_is_todays_miles() -> None:
    assert DEFAULT_MILES_PROFILE is MilesProfile.TODAY
    assert scenario_from_toml(BASE, "f.toml").loop.miles_profile is MilesProfile.TODAY


@pytest.mark.parametrize("profile", list(MilesProfile))
def test_miles_profile_is_read_and_written_back(profile: MilesProfile) -> None:
    scenario = scenario_from_toml(BASE + f'[miles]\nprofile = "{profile.value}"\n', "f.toml")
    assert scenario.loop.miles_profile is profile
    text = scenario_to_toml(scenario)
    assert (f'[miles]\nprofile = "{profile.value}"' in text) == (profile is not MilesProfile.TODAY)
    assert scenario_from_toml(text, "again.toml").loop.miles_profile is profile


def test_an_unknown_profile_names_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(BASE + '[miles]\nprofile = "may2026"\n', "f.toml")
    # named as the user wrote it, [miles].profile (it was [loop].miles_profile, a key not written)
    assert error.value.field == "[miles].profile" and "aug2026" in str(error.value)


def test_an_unknown_miles_key_is_refused() -> None:
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(BASE + '[miles]\nprofil = "today"\n', "f.toml")
    assert "[miles]" in str(error.value) and "profil" in str(error.value)


def test_the_profile_set_twice_is_refused() -> None:
    text = 'name = "p"\n[loop]\nsteps = 2\nmiles_profile = "today"\n[miles]\nprofile = "today"\n'
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(text, "f.toml")
    assert "[loop].miles_profile" in str(error.value)
