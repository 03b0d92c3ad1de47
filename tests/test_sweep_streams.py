"""A sweep's seeds stream (issue 52, item 4): ``--seeds 1e12`` ended in a MemoryError and
``1e9`` grew the driver to 3.1 GB, because the seed range was copied whole before the first
seed ran and the tally kept a hash per seed. Memory must not grow with the range: the
tasks come one at a time, and the tally keeps counts, the failures it shows and the
re-check sample's hashes only."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from sim.cli.sweep import _parser as sweep_parser
from sim.cli.sweep import _seeds
from sim.search import fanout
from sim.search.fanout import KEPT_FAILURES, Source, SweepRun, Tally, sweep, tasks_for
from sim.search.judge import SeedOutcome, SeedTask
from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS
from sim.search.sweep_report import findability, summary, text_lines

HUGE = 10**12
"""Seeds no machine could hold as a list (8 TB of references)."""


def _outcome(task: SeedTask, failed: bool) -> SeedOutcome:
    """What a worker sends back for ``task``, without running it."""
    return SeedOutcome(
        source=task.source,
        seed=task.seed,
        failed=("exactly_once",) if failed else (),
        oracles=("end_state", "exactly_once"),
        status="completed",
        hash=f"h{task.seed}",
        cells=(),
        replay=f"python -m sim run {task.source} --seed {task.seed}",
        seconds=0.0,
        aim=task.aim,
        failure="violation " * 50 if failed else "",
        scenario_toml="[loop]\n" * 50 if failed else "",
    )


def test_the_tasks_of_a_huge_seed_range_come_one_at_a_time() -> None:
    """The first 100 tasks of 10**12 seeds (two sources, aimed) cost what 100 tasks cost."""
    sources = [Source(SWARM), Source(SWARM_TOTAL_LOSS)]
    tracemalloc.start()
    try:
        aimer = fanout._Aimer(Tally())
        tasks = tasks_for(sources, range(HUGE), None, None, aimer)
        first = list(itertools.islice(tasks, 100))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [t.seed for t in first[:4]] == [0, 0, 1, 1]
    assert [t.source for t in first[:2]] == [SWARM, SWARM_TOTAL_LOSS]
    assert peak < 2 << 20, f"{peak} bytes for 100 tasks"


def _judged_here(
    stop_after: int, failing: Callable[[int], bool]
) -> Callable[[Iterator[list[SeedTask]], int, Callable[[SeedOutcome, str], None]], None]:
    """run_chunks without Ray: each task judged at once (``failing(seed)`` says how), and a
    Ctrl-C after ``stop_after`` outcomes, as a user stops an endless sweep."""
    done = itertools.count(1)

    def run_chunks(pending, workers, on_outcome) -> None:  # type: ignore[no-untyped-def]
        for chunk in pending:
            for task in chunk:
                on_outcome(_outcome(task, failing(task.seed)), "node")
                if next(done) >= stop_after:
                    raise KeyboardInterrupt

    return run_chunks


def test_a_sweep_of_a_huge_range_stopped_early_holds_a_bounded_tally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every seed fails (a planted bug can do that): 3 * KEPT_FAILURES of 10**12 seeds run,
    then Ctrl-C. The tally counts them all, keeps the lowest KEPT_FAILURES in full and the
    hash of the re-check sample only; its memory stays below a per-seed record's."""
    stop = 3 * KEPT_FAILURES
    monkeypatch.setattr(fanout, "run_chunks", _judged_here(stop, lambda seed: True))
    tracemalloc.start()
    try:
        run = sweep([Source(SWARM)], range(HUGE), workers=2, recheck=20, aim=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tally = run.tally
    assert run.interrupted and tally.seeds == stop and tally.failed == stop
    assert [o.seed for o in tally.failures] == list(range(KEPT_FAILURES))
    assert len(tally._failing) < 2 * KEPT_FAILURES
    assert len(tally.hashes) <= 20  # the sample's, not one per seed
    assert peak < 16 << 20, f"{peak} bytes"
    info = summary(run, workers=2, nodes=1, plant="any")
    assert info["failing_seeds"] == stop and len(info["failures"]) == KEPT_FAILURES
    lines = text_lines(info, tally)
    assert f"failing seeds: {stop}" in lines
    assert f"  ... {stop - 20} more; the JSON holds the lowest {KEPT_FAILURES}" in "\n".join(lines)
    found = findability(tally)
    assert found["caught"] == stop and found["rate"] == 1.0
    assert found["seeds_to_first_catch"] == 1


def test_findability_counts_failures_past_those_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """One seed in three fails: the rate and the first catch come from counts, not from the
    failures kept in full."""
    stop = 3 * KEPT_FAILURES
    monkeypatch.setattr(fanout, "run_chunks", _judged_here(stop, lambda seed: seed % 3 == 2))
    run = sweep([Source(SWARM)], range(HUGE), workers=2, recheck=0, aim=False)
    found = findability(run.tally)
    assert found["caught"] == KEPT_FAILURES and found["seeds_to_first_catch"] == 3
    assert found["rate"] == pytest.approx(1 / 3)


def test_a_sweep_that_ends_rechecks_its_sample_by_the_hashes_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The re-check still finds its first hashes: the sample's are the ones kept."""

    def run_chunks(pending, workers, on_outcome) -> None:  # type: ignore[no-untyped-def]
        for chunk in pending:
            for task in chunk:
                on_outcome(_outcome(task, False), "node")

    monkeypatch.setattr(fanout, "run_chunks", run_chunks)
    run = sweep([Source(SWARM)], range(200), workers=2, recheck=5, aim=False)
    assert run.ok and run.rechecked == 5 and run.nondeterministic == []
    assert sorted(seed for _, seed, _ in run.tally.hashes) == [0, 40, 80, 120, 160]
    assert isinstance(run, SweepRun)


@pytest.mark.parametrize(("written", "seeds"), [("1e12", HUGE), ("1000", 1000), ("2.5e3", 2500)])
def test_seeds_may_be_written_in_e_notation(written: str, seeds: int) -> None:
    assert _seeds(sweep_parser().parse_args(["--seeds", written])) == range(seeds)


@pytest.mark.parametrize("written", ["1.5", "nan", "inf", "1e999999999"])
def test_a_seed_count_that_is_no_whole_number_or_too_large_is_refused(
    written: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        sweep_parser().parse_args(["--seeds", written])
    assert exited.value.code == 2
    assert "argument --seeds" in capsys.readouterr().err
