"""Seeds fanned out as Ray tasks: a verdict per oracle, failing seeds, coverage, determinism.

    python -m sim sweep [--seeds N | --seed-range A:B] [--scenario swarm|NAME|FILE ...]
                        [--address RAY_ADDRESS] [--workers K] [--json] [--out DIR]

The driver keeps counts, never histories: a worker judges a chunk of seeds
(sim/search/judge.py) and sends back one small outcome per seed. The swarm's seeds
are aimed, a share of them, at the coverage map's cells still empty (sim/search/aim.py):
which seeds are aimed depends on what the chunks before found, and each aimed
seed's replay line carries its aim, so every failing run still replays from
one line. At the end a sample of seeds is run again, in other tasks, and must
give the same history hash. Ctrl-C cancels the tasks, reports what finished,
and shuts Ray down (a local Ray lives in its own temporary directory).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from miles_core.coverage import CoverageCell, reachable
from miles_core.scenario import Scenario
from sim.search.aim import AIMABLE
from sim.search.judge import SeedOutcome, SeedTask, judge_many
from sim.search.swarm import SWARM

CHUNK = 8
"""Seeds per task: a seed takes tens of milliseconds, a task's round trip a few."""
AIM_SHARE = 2
"""One seed in AIM_SHARE of the swarm's is aimed while reachable cells are empty."""
AIM_TRIES = 25
"""Aimed seeds a cell gets before it is left to chance (a phase too short to land in)."""
KEPT_FAILURES = 1000
"""Failing seeds a sweep keeps in full (their scenario, violations and replay line): the
lowest by (source, seed, aim), whatever order they came back in; past them it counts. A
sweep of any length holds a bounded tally (a planted bug can fail every seed)."""


@dataclass(frozen=True)
class Source:
    """One ``--scenario`` as the user wrote it, loaded (None for the swarm: drawn by seed)."""

    text: str
    scenario: Scenario | None = None


@dataclass
class Tally:
    """What a sweep found so far: counts per oracle and per map cell, the failing seeds (the
    first KEPT_FAILURES in full, then a count). Its size is bounded whatever the seed count:
    it keeps no per-seed record but the failures it shows and the re-check sample's hashes."""

    oracles: dict[str, list[int]] = field(default_factory=dict)
    """oracle -> [passed, failed]."""
    coverage: dict[CoverageCell, int] = field(default_factory=dict)
    """cell -> seeds that hit it."""
    failed: int = 0
    """Seeds that failed, all of them (``failures`` keeps the first KEPT_FAILURES)."""
    lowest_failing_seed: int | None = None
    hashes: dict[tuple[str, int, str], str] = field(default_factory=dict)
    """(source, seed, aim) -> history hash, of the seeds ``recheck`` names only."""
    recheck: set[tuple[str, int, str]] = field(default_factory=set)
    """The seeds to be run again, whose hash is kept for the determinism re-check."""
    seeds: int = 0
    per_node: dict[str, int] = field(default_factory=dict)
    """Ray node id -> seeds judged there."""
    aimed: int = 0
    aimed_hit: int = 0
    aims_missed: dict[CoverageCell, int] = field(default_factory=dict)
    """cell -> aimed seeds that missed it."""
    idle: dict[str, int] = field(default_factory=dict)
    """fault kind -> windows that met nothing to act on (passed, but witnessed nothing)."""
    probes: dict[str, int] = field(default_factory=dict)
    """probe -> seeds that hit it."""
    caught: dict[str, int] = field(default_factory=dict)
    """oracle -> seeds whose field bug it caught, as their ``expect.caught_by`` asks
    (passing seeds: sim/search/swarm_field_bugs.py)."""
    lowest_seed: int | None = None
    """The lowest seed judged: where a findability count starts."""
    _failing: list[SeedOutcome] = field(default_factory=list)
    """Failing outcomes, cut to the lowest KEPT_FAILURES each time it holds twice as many."""

    def add(self, outcome: SeedOutcome, node: str) -> None:
        self.seeds += 1
        if self.lowest_seed is None or outcome.seed < self.lowest_seed:
            self.lowest_seed = outcome.seed
        self.per_node[node] = self.per_node.get(node, 0) + 1
        for oracle in outcome.oracles:
            self.oracles.setdefault(oracle, [0, 0])[oracle in outcome.failed] += 1
        for cell in set(outcome.cells):
            self.coverage[cell] = self.coverage.get(cell, 0) + 1
        for kind in outcome.idle:
            self.idle[kind] = self.idle.get(kind, 0) + 1
        for probe in outcome.probes:
            self.probes[probe] = self.probes.get(probe, 0) + 1
        for oracle in outcome.caught:
            self.caught[oracle] = self.caught.get(oracle, 0) + 1
        if outcome.aim is not None:
            self.aimed += 1
            hit = outcome.aim in outcome.cells
            self.aimed_hit += hit
            if not hit:
                self.aims_missed[outcome.aim] = self.aims_missed.get(outcome.aim, 0) + 1
        if not outcome.ok:
            self._add_failure(outcome)
        key = _key(outcome.source, outcome.seed, outcome.aim)
        if key in self.recheck:
            self.hashes[key] = outcome.hash

    def _add_failure(self, outcome: SeedOutcome) -> None:
        self.failed += 1
        if self.lowest_failing_seed is None or outcome.seed < self.lowest_failing_seed:
            self.lowest_failing_seed = outcome.seed
        self._failing.append(outcome)
        if len(self._failing) >= 2 * KEPT_FAILURES:
            self._failing = self.failures

    @property
    def failures(self) -> list[SeedOutcome]:
        """The failing seeds kept in full: the lowest KEPT_FAILURES, in that order."""
        return sorted(self._failing, key=_order)[:KEPT_FAILURES]

    def empty_aimable(self) -> list[CoverageCell]:
        """Reachable cells the swarm can aim at that no seed has hit yet and that fewer than
        AIM_TRIES aimed seeds have missed, in map order."""
        cells = [CoverageCell(k, h, p) for (k, h) in AIMABLE for p in sorted(reachable(k, h))]
        return [
            c for c in cells if c not in self.coverage and self.aims_missed.get(c, 0) < AIM_TRIES
        ]


def _key(source: str, seed: int, aim: CoverageCell | None) -> tuple[str, int, str]:
    return (source, seed, "" if aim is None else aim.key())


def _order(outcome: SeedOutcome) -> tuple[str, int, str]:
    return _key(outcome.source, outcome.seed, outcome.aim)


@dataclass
class _Aimer:
    """Hands out aims at empty cells, round robin, to a share of the swarm's seeds."""

    tally: Tally
    turn: int = 0

    def aim(self, source: Source, index: int) -> CoverageCell | None:
        if source.text != SWARM or index % AIM_SHARE != AIM_SHARE - 1:
            return None
        empty = self.tally.empty_aimable()
        if not empty:
            return None
        self.turn += 1
        return empty[self.turn % len(empty)]


def tasks_for(
    sources: Sequence[Source],
    seeds: Sequence[int],
    steps: int | None,
    plant: str | None,
    aimer: _Aimer | None,
    liveness: bool = False,
) -> Iterator[SeedTask]:
    """Every seed of every source, aimed (or not) as it is handed out. Lazy: a seed is made
    when it is taken (``itertools.product`` would first copy the whole range into a tuple)."""
    index = 0
    for seed in seeds:
        for source in sources:
            aim = aimer.aim(source, index) if aimer is not None else None
            yield SeedTask(source.text, seed, source.scenario, steps, aim, plant, liveness)
            index += 1


def chunks(tasks: Iterator[SeedTask], size: int = CHUNK) -> Iterator[list[SeedTask]]:
    while chunk := list(itertools.islice(tasks, size)):
        yield chunk


@dataclass
class SweepRun:
    """One sweep's execution: what it ran and how it ended."""

    tally: Tally
    wall_seconds: float = 0.0
    interrupted: bool = False
    rechecked: int = 0
    nondeterministic: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.tally.failed and not self.nondeterministic and not self.interrupted


def _judged_on_node(tasks: list[SeedTask]) -> tuple[str, list[SeedOutcome]]:
    """A chunk judged in a Ray worker, with the node it ran on."""
    import ray

    return ray.get_runtime_context().get_node_id(), judge_many(tasks)


def run_chunks(
    pending: Iterator[list[SeedTask]],
    workers: int,
    on_outcome: Callable[[SeedOutcome, str], None],
) -> None:
    """Keep ``2 * workers`` chunks in flight on Ray; each outcome (and the node that judged
    it) as its chunk returns. On Ctrl-C or a worker's error the chunks in flight are left to
    the session's shutdown, which ends them: force-cancelling them here was followed, twice
    in CI, by a crash of Ray's core worker in CompletePendingTask (exit 1, not 130)."""
    import ray

    remote = ray.remote(num_cpus=1, max_retries=0)(_judged_on_node)
    in_flight: list[ray.ObjectRef] = []
    while True:
        while len(in_flight) < 2 * workers and (chunk := next(pending, None)) is not None:
            in_flight.append(remote.remote(chunk))
        if not in_flight:
            return
        done, in_flight = ray.wait(in_flight, num_returns=1)
        node, outcomes = ray.get(done[0])
        for outcome in outcomes:
            on_outcome(outcome, node)


def sweep(
    sources: Sequence[Source],
    seeds: Sequence[int],
    *,
    workers: int,
    steps: int | None = None,
    plant: str | None = None,
    recheck: int = 20,
    aim: bool = True,
    liveness: bool = False,
    on_outcome: Callable[[SeedOutcome], None] = lambda outcome: None,
) -> SweepRun:
    """Judge every seed of every source on Ray (a session must be open), then run a sample
    of them again and compare hashes. Ctrl-C ends it early with what finished."""
    run = SweepRun(Tally())
    total = len(seeds) * len(sources)
    stride = max(1, total // recheck) if recheck > 0 else 0
    sample: list[SeedTask] = []

    def handed_out() -> Iterator[SeedTask]:
        aimer = _Aimer(run.tally) if aim else None
        for i, task in enumerate(tasks_for(sources, seeds, steps, plant, aimer, liveness)):
            if stride and i % stride == 0 and len(sample) < recheck:
                sample.append(task)
                run.tally.recheck.add(_key(task.source, task.seed, task.aim))
            yield task

    def judged(outcome: SeedOutcome, node: str) -> None:
        run.tally.add(outcome, node)
        on_outcome(outcome)

    started = time.perf_counter()
    try:
        run_chunks(chunks(handed_out()), workers, judged)
        run_chunks(chunks(iter(sample[::-1]), 1), workers, lambda o, node: _compare(run, o))
    except KeyboardInterrupt:
        run.interrupted = True
    run.wall_seconds = time.perf_counter() - started
    return run


def _compare(run: SweepRun, again: SeedOutcome) -> None:
    """A seed judged a second time must give the hash it gave the first time."""
    run.rechecked += 1
    first = run.tally.hashes[_key(again.source, again.seed, again.aim)]
    if again.hash != first:
        run.nondeterministic.append(f"{again.replay}: hash {first} then {again.hash}")


__all__ = ["Source", "SweepRun", "Tally", "sweep"]
