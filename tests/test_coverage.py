"""The fault-coverage map: the phase each fault struck in, read from the history alone,
and aimed swarm seeds that put a fault in the cell they name."""

from __future__ import annotations

import pytest

from miles_core.cells import Outcome
from miles_core.coverage import PHASES, CoverageCell, coverage_cells, phase_windows, reachable
from miles_core.errors import ConfigError
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    BucketReceived,
    CellTrained,
    EnginesResumed,
    Event,
    FaultInjected,
    HealBegan,
    HealEnded,
    UpdateBegan,
    UpdateSessionOpened,
)
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.scenario import SCENARIOS, TimeModel
from miles_core.weight_update import UpdateKind
from sim.run import run_scenario
from sim.search.aim import AIMABLE, parse_aim
from sim.search.swarm import AIMED_PAUSE_REPLY_SECONDS, swarm_scenario

ENGINES = ("engine-0",)


def _fault(t: float, point: FaultPoint | None = None, index: int = 0) -> FaultInjected:
    return FaultInjected(
        t=t, index=index, fault=FaultKind.KILL_ENGINE, engine="engine-0", point=point
    )


def _bucket(t: float, bucket: int, n: int = 3) -> BucketReceived:
    return BucketReceived(
        t=t,
        update_id=1,
        bucket=bucket,
        n_buckets=n,
        engines=ENGINES,
        incarnations=(0,),
        nbytes=1,
        seconds=0.1,
    )


def _phases(events: list[Event], buckets: tuple[int | None, ...] = ()) -> list[str]:
    return [c.phase for c in coverage_cells(events, buckets)]


def test_the_phase_is_what_was_under_way_when_the_fault_struck() -> None:
    attempt = AttemptBegan(t=1, step=0, attempt=0, quorum_id=0, cells=(0, 1))
    trained = CellTrained(
        t=2, cell=0, step=0, attempt=0, outcome=Outcome.NORMAL, exchange=(0, 1), seconds=1.0
    )
    ended = AttemptEnded(
        t=3, step=0, attempt=0, decision=attempt_decision(), normal=(0, 1), discarded=(), errored=()
    )
    update = UpdateBegan(
        t=4, update_id=1, version=1, updater=0, kind=UpdateKind.FULL, n_buckets=3, engines=ENGINES
    )
    session = UpdateSessionOpened(t=5, update_id=1, engines=ENGINES, incarnations=(0,))
    resumed = EnginesResumed(t=9, update_id=1, engines=ENGINES, incarnations=(0,))
    heal = HealBegan(t=10, quorum_id=1, src_cell=0, dst_cell=1, src_ranks=(0,), dst_ranks=(1,))
    healed = HealEnded(t=11, dst_cell=1, ok=True)
    history = [
        _fault(0.5), attempt, _fault(1.5), trained, _fault(2.5), ended, update, _fault(4.5),
        session, _fault(5.5), _bucket(6, 0), _fault(6.5), _bucket(7, 1), _fault(7.5),
        _bucket(8, 2), _fault(8.5), resumed, heal, _fault(10.5), healed, _fault(11.5),
    ]  # fmt: skip
    assert _phases(history) == [
        "generating", "training", "allreduce", "paused", "bucket_first", "bucket_middle",
        "bucket_last", "stamping", "healing", "generating",
    ]  # fmt: skip
    assert phase_windows(history, "bucket_middle") == [(6, 7)]
    assert phase_windows(history, "healing") == [(10, 11)]


def attempt_decision():
    from miles_core.cells import Decision

    return Decision.COMMIT


def test_a_point_names_its_phase() -> None:
    """after_bucket k strikes as bucket k arrives (before it is recorded): the last bucket is
    the window before the stamp; before_allreduce and during_heal are their phases."""
    update = UpdateBegan(t=1, update_id=1, version=1, updater=0, kind=UpdateKind.FULL,
                         n_buckets=3, engines=ENGINES)  # fmt: skip
    last = _fault(2, FaultPoint.AFTER_BUCKET, index=0)
    first = _fault(2, FaultPoint.AFTER_BUCKET, index=1)
    assert _phases([update, last, first], buckets=(2, 0)) == ["stamping", "bucket_first"]
    assert _phases([_fault(1, FaultPoint.BEFORE_ALLREDUCE)]) == ["allreduce"]
    assert _phases([_fault(1, FaultPoint.DURING_HEAL)]) == ["healing"]


@pytest.mark.parametrize(
    ("name", "cell"),
    [
        ("cell_crash_before_allreduce", "kill_cell@before_allreduce:allreduce"),
        ("restart_before_stamp", "restart_engine@after_bucket:stamping"),
    ],
)
def test_named_scenarios_land_in_their_cells(name: str, cell: str) -> None:
    scenario = SCENARIOS[name]
    result = run_scenario(scenario, 0)
    buckets = [getattr(f.when, "bucket", None) for f in scenario.faults]
    assert cell in {c.key() for c in coverage_cells(result.history, buckets)}


POINT_AIMS = [
    f"{kind}@{how}:{phase}"
    for (kind, how) in AIMABLE
    if how in ("before_allreduce", "after_bucket", "during_heal")
    for phase in sorted(reachable(kind, how))
] + [
    "kill_cell@at_time:bucket_last",
    "restart_engine@at_time:bucket_middle",
    "kill_engine@at_time:allreduce",
    "hang_engine@step_begin:generating",
    "kill_engine@during_recovery:training",
    "fail_router@step_begin:generating",
    # windows that control calls' round trips open (the swarm draws control_reply_seconds)
    "kill_engine@at_time:paused",
    # a request must get halfway inside the pause's round trip: the aim tries its candidate
    # (span, engine) pairs with the kill (0 of 40 seeds hit without that, 3 of 40 with it),
    # with a longer round trip (below)
    "kill_engine@mid_generation:paused",
    # and inside a heal, or an exchange held up by a cell that died: the aim also tries
    # heals at up to 4 steps (seeds 0-39 hit 2 and 3 times with one, 5 and 9 with four)
    "kill_engine@mid_generation:healing",
    "kill_engine@mid_generation:allreduce",
    "restart_engine@at_time:stamping",
    "start_cell@at_time:stamping",
    # a heal made for the aim: a cell killed and started again, the fault during its heal
    "kill_cell@at_time:healing",
    "start_cell@at_time:healing",
    # a recovery made by a restart at a time inside the phase
    "kill_engine@during_recovery:bucket_middle",
    "kill_engine@during_recovery:stamping",
]


@pytest.mark.parametrize("aim", POINT_AIMS)
def test_an_aimed_seed_hits_its_cell_and_passes(aim: str) -> None:
    """Within a few seeds the aimed cell is hit, and every aimed run passes every oracle
    (the aimed fault replaces its family's draws, so the budget still holds)."""
    cell = parse_aim(aim)
    hits = 0
    for seed in range(6):
        scenario = swarm_scenario(seed, aim=cell)
        result = run_scenario(scenario, seed)
        replay = f"python -m sim run swarm --seed {seed} --aim {aim}"
        assert result.ok, f"{result.failures()}\nreplay: {replay}"
        buckets = [getattr(f.when, "bucket", None) for f in scenario.faults]
        hits += cell in coverage_cells(result.history, buckets)
    assert hits > 0


def test_aims_the_swarm_cannot_draw_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--aim.*KIND@HOW:PHASE"):
        parse_aim("start_cell@during_heal:healing")
    with pytest.raises(ConfigError, match="--aim"):
        parse_aim("kill_cell@at_time:lunch")
    assert parse_aim("kill_cell@at_time:healing") == CoverageCell("kill_cell", "at_time", "healing")


def test_mid_generation_cannot_reach_phases_where_no_request_decodes() -> None:
    """Engines are paused from before the first bucket until the resume: no request gets
    halfway then. A restart, and so a recovery, can come at any time."""
    mid = reachable("kill_engine", "mid_generation")
    assert mid.isdisjoint({"bucket_first", "bucket_middle", "bucket_last", "stamping"})
    assert {"generating", "training", "paused", "healing"} <= mid
    assert reachable("kill_engine", "during_recovery") == frozenset(PHASES)


@pytest.mark.parametrize("aim", ["kill_cell@at_time:healing", "start_cell@at_time:healing"])
def test_a_heal_made_for_the_aim_is_struck_even_past_the_fault_phase(aim: str) -> None:
    """The heal the aim makes comes at a drawn step, and slow steps put it past the fault
    phase (seeds 0, 5, 8, 10, 11 and 14 of these): the time is drawn inside it all the
    same, not anywhere in the fault phase, where seed 22's kill struck before the
    allreduce that the heal's own kill was waiting for (fault_witness failed)."""
    cell = parse_aim(aim)
    for seed in (0, 5, 8, 10, 11, 14, 22):
        result = run_scenario(swarm_scenario(seed, aim=cell), seed)
        replay = f"python -m sim run swarm --seed {seed} --aim {aim}"
        assert result.ok, f"{result.failures()}\nreplay: {replay}"
        assert cell in coverage_cells(result.history), replay


def test_a_kill_aimed_mid_generation_in_a_heal_gets_a_heal_as_long_as_a_request() -> None:
    """A request of about 2.5 s must get halfway inside the heal: a heal of 0.1 s (the
    swarm's checkpoint rate) let 1 of seeds 0-11 hit; one of AIMED_HEAL_SECONDS, 6."""
    cell = parse_aim("kill_engine@mid_generation:healing")
    hits = 0
    for seed in range(12):
        scenario = swarm_scenario(seed, aim=cell)
        assert scenario.timing.checkpoint_bytes_per_second < TimeModel.checkpoint_bytes_per_second
        result = run_scenario(scenario, seed)
        assert result.ok, f"{result.failures()}\nreplay: python -m sim run swarm --seed {seed}"
        hits += cell in coverage_cells(result.history)
    assert hits >= 4
    other = swarm_scenario(0, aim=parse_aim("kill_cell@at_time:healing"))
    assert other.timing.checkpoint_bytes_per_second == TimeModel.checkpoint_bytes_per_second


def test_a_kill_aimed_mid_generation_in_a_pause_gets_a_longer_round_trip() -> None:
    """A request must get halfway inside the pause's round trip: at the swarm's longest
    reply (0.05 s) 1 of seeds 0-15 hit; at AIMED_PAUSE_REPLY_SECONDS, 5."""
    cell = parse_aim("kill_engine@mid_generation:paused")
    hits = 0
    for seed in range(16):
        scenario = swarm_scenario(seed, aim=cell)
        assert scenario.timing.control_reply_seconds == AIMED_PAUSE_REPLY_SECONDS
        result = run_scenario(scenario, seed)
        assert result.ok, f"{result.failures()}\nreplay: python -m sim run swarm --seed {seed}"
        hits += cell in coverage_cells(result.history)
    assert hits >= 3


@pytest.mark.parametrize(
    "aim", ["kill_engine@mid_generation:allreduce", "kill_engine@mid_generation:healing"]
)
def test_a_heal_made_for_a_mid_generation_kill_replaces_every_cell_fault_drawn(aim: str) -> None:
    """The heal's setup replaces every swarm fault that takes a cell down or starts it:
    seed 79 drew a rank kill of cell 1 at step 1, seed 90 lost heartbeats of cell 1 at
    step 1; the setup dropped their starts, so its own kill of cell 1 at step 4 met a cell
    already down and never fired."""
    for seed, kind in ((79, FaultKind.KILL_RANK), (90, FaultKind.DROP_HEARTBEAT)):
        scenario = swarm_scenario(seed, aim=parse_aim(aim))
        assert kind not in {f.kind for f in scenario.faults}
        result = run_scenario(scenario, seed)
        replay = f"python -m sim run swarm --seed {seed} --aim {aim}"
        assert result.ok, f"{result.failures()}\nreplay: {replay}"
