"""The swarm's field bugs (sim/search/swarm_field_bugs.py): a seed that draws one names the
oracle that must catch it (``expect.caught_by``), and passes only when that oracle failed
and every other passed; with the oracle patched out, the same seed fails, the miss named.
And the mechanism itself: ``expect.caught_by`` checked, written, judged, and the exit code
of ``python -m sim run`` with it."""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.fault_kinds import TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.oracles import SAFETY
from miles_core.scenario import Expect, load_scenario_file
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.load import scenario_from_toml
from sim.run import run_scenario
from sim.search.fanout import Tally
from sim.search.judge import SeedTask, judge
from sim.search.swarm import swarm_scenario
from sim.search.swarm_field_bugs import KINDS

FIELD_BUGS = Path(__file__).resolve().parent / "files" / "field_bugs"


def _first_seed(kind: FaultKind, caught_by: str | None = "any") -> int:
    for seed in range(400):
        scenario = swarm_scenario(seed)
        expected = caught_by == "any" or scenario.expect.caught_by == caught_by
        if expected and any(f.kind is kind for f in scenario.faults):
            return seed
    raise AssertionError(f"no seed of 400 drew {kind.value}")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_a_seed_that_draws_the_kind_passes_as_its_expectation_says(kind: FaultKind) -> None:
    seed = _first_seed(kind)
    expect = swarm_scenario(seed).expect
    outcome = judge(SeedTask("swarm", seed))
    assert outcome.ok, outcome.failure
    assert outcome.caught == (() if expect.caught_by is None else (expect.caught_by,))


def test_the_field_bug_seeds_are_caught_by_their_oracle_alone() -> None:
    """The lying engine's seed: published_weights failed (the catch), every other passed."""
    seed = _first_seed(FaultKind.LYING_ENGINE, "published_weights")
    result = run_scenario(swarm_scenario(seed), seed)
    assert {k for k, v in result.verdicts.items() if v is not None} == {"published_weights"}
    assert result.ok and result.failures() == ""


@pytest.mark.parametrize("kind", [FaultKind.LYING_ENGINE, FaultKind.DELTA_SKIPPED])
def test_with_the_oracle_patched_out_the_seed_fails_naming_the_miss(
    kind: FaultKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted miss: published_weights passes everything; the seed must fail."""
    seed = _first_seed(kind, "published_weights")
    monkeypatch.setitem(SAFETY, "published_weights", lambda history: None)
    outcome = judge(SeedTask("swarm", seed))
    assert not outcome.ok and "published_weights" in outcome.failed
    assert "expects it to catch its fault" in outcome.failure
    assert outcome.caught == ()
    assert f"python -m sim run swarm --seed {seed}" in outcome.replay


def test_a_seed_that_draws_no_field_bug_expects_nothing() -> None:
    assert all(swarm_scenario(seed).expect == Expect() for seed in range(3))


def test_the_sweep_counts_a_catch_as_passing_and_a_miss_as_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = _first_seed(FaultKind.LYING_ENGINE, "published_weights")
    tally = Tally()
    tally.add(judge(SeedTask("swarm", seed)), "node")
    assert (tally.failed, tally.caught) == (0, {"published_weights": 1})
    assert tally.oracles["published_weights"] == [1, 0]
    monkeypatch.setitem(SAFETY, "published_weights", lambda history: None)
    tally.add(judge(SeedTask("swarm", seed)), "node")
    assert tally.failed == 1 and tally.failures[0].seed == seed


def test_an_unknown_oracle_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"expect\.caught_by.*'bogus'.*published_weights"):
        Expect(caught_by="bogus")
    with pytest.raises(ConfigError, match=r"expect\.caught_by"):
        Expect(caught_by="end_state")  # how a run ends is expect.status's


def _lying(caught_by: str) -> str:
    text = (FIELD_BUGS / "lying_engine.toml").read_text()
    return text.replace(
        'name = "lying_engine"\n',
        f'name = "lying_engine"\nexpect = {{ caught_by = "{caught_by}" }}\n',
    )


def test_caught_by_is_read_and_written_back() -> None:
    scenario = scenario_from_toml(_lying("published_weights"), "lying", "lying")
    assert scenario.expect.caught_by == "published_weights"
    assert 'expect = { caught_by = "published_weights" }' in scenario_to_toml(scenario)


@pytest.mark.parametrize(("caught_by", "code"), [("published_weights", 0), ("exactly_once", 1)])
def test_the_exit_code_of_sim_run_with_caught_by(caught_by: str, code: int, tmp_path: Path) -> None:
    from sim.__main__ import main

    path = tmp_path / "lying.toml"
    path.write_text(_lying(caught_by))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["run", str(path), "--seed", "0"]) == code
    if code == 0:
        assert "published_weights caught the fault" in out.getvalue()
    else:
        assert "[exactly_once] passed, but the scenario expects it" in out.getvalue()
        assert "replay: python -m sim run" in err.getvalue()


def test_without_caught_by_the_same_file_fails() -> None:
    scenario = load_scenario_file(FIELD_BUGS / "lying_engine.toml")
    assert not run_scenario(scenario, 0).ok
    caught = dataclasses.replace(scenario, expect=Expect(caught_by="published_weights"))
    assert run_scenario(caught, 0).ok


def test_the_oracle_names_are_the_oracles() -> None:
    from miles_core.oracle_names import ORACLE_NAMES
    from miles_core.oracles import ORACLES

    assert ORACLE_NAMES == ORACLES


def test_a_lying_engine_is_never_drawn_beside_a_cell_killed_after_a_bucket() -> None:
    """Seed 2807 drew one: the window the cell's death aborted stopped the lying process
    before any check read it (fault_witness: no effect), so caught_by could not be met."""
    drew = 0
    for seed in range(3000):
        faults = swarm_scenario(seed).faults
        if any(f.kind is FaultKind.LYING_ENGINE for f in faults):
            drew += 1
            aborts = [f for f in faults if f.kind in TAKES_A_CELL_DOWN]
            assert all(f.point is not FaultPoint.AFTER_BUCKET for f in aborts), seed
    assert drew >= 40  # 42 of these 3,000 seeds draw one
    assert judge(SeedTask("swarm", 2807)).ok
