"""Each fault kind's witness: what its effect looks like in a history, as the world (not
the injector) reports it.

One witness per kind, each read from what the world and the control plane
recorded after the fault fired:

    kill_cell, stop_cell, the cell was marked failed, and then left out of a quorum,
    kill_rank, fail_rank  healed back, or the run stopped with its clear error
    start_cell            the world reported the cell's new processes, which were healed
                          into a quorum
    kill_engine           the world saw the process die, or the engine left rotation
    hang_engine           the engine left rotation (a health check or a call timed out)
    hang_call             the engine left rotation (the unanswered call timed out)
    poison_prompt         a request sent once it fired was refused by its engine
    orphan_engine         the world reported the actor's exit, and its server was found
                          still serving: the control plane's removal found it in the
                          router, or it answered a request after the exit; with fault
                          tolerance a later process served (an engine with no live
                          process then had nothing to orphan)
    restart_engine        the world reported a new process, which came to serve
    slow_start            a start of the engine begun in the window (a restart or a
                          recovery) answered no sooner than the seconds added
    slow_cell             the cell's steps begun in the window took longer than its
                          other steps, by at least half the slowdown
    slow_link             buckets sent in the window took longer per byte than the
                          others of the same route (sender, engines), by at least half
                          the slowdown
    partition             no bucket whose send began in the window arrived before the
                          window closed, and one began in it, or an update failed on a
                          collective the cut stalled past its timeout
    delay_router          requests sent in the window spent at least half the delay
                          outside the engine (the router's own time)
    fail_router           a request sent in the window failed at the router (a try that
                          was retried, or a request's last)
    drop_heartbeat        a heartbeat sent to the cell in the window was missed
    lying_engine          a checksum the world read off the engine's own weights after it
                          fired differed from the trainer's (its process was stamped
                          with a version whose weights it did not load)
    kill_job              the world saw every process of the job die (JobKilled), and a new
                          controller resumed it (JobResumed)
    restart_driver        the world saw the driver die alone (DriverRestarted), and a new
                          driver adopted the live processes (DriverAdopted)
    raise_holding_lock    an update the cell sent aborted on a broadcast that waited out its
                          timeout (the lock its rank kept), or the run stalled

A witness says what it misses, or None once it saw the effect. A window fault that
nothing it acts on passed through is idle (miles_core.witness.idle) and has nothing to
witness once closed. miles_core/fault_kinds.py names each kind's witness in its row;
``unwitnessed`` asks it; the fault_witness oracle (miles_core.oracles.witnesses)
judges a run with these, and a run with until_witnessed (miles_core.stopping) goes on
while one still misses, which is why they sit outside the oracles.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Callable

from miles_core.cells import CellState
from miles_core.engines import EngineState
from miles_core.event_index import Indexed
from miles_core.events import (
    BucketReceived,
    CellStarted,
    CellStateChanged,
    DriverAdopted,
    DriverRestarted,
    EngineExited,
    EngineRecoveryAsked,
    EngineStarted,
    EngineStateChanged,
    Event,
    FaultInjected,
    HealEnded,
    JobKilled,
    JobResumed,
    OrphanRemoved,
    QuorumChanged,
    RunEnded,
    WeightsChecked,
)
from miles_core.kinds import FaultKind, RunStatus, SampleOutcome
from miles_core.witness.delta import delta_pulled, delta_refused
from miles_core.witness.idle import idle_reason
from miles_core.witness.index import (
    WitnessIndex,
    bucket_sends_in,
    cut_met_something,
    requests_in,
    retries_in,
    start_begins,
    steps_in,
    window,
)

Witness = Callable[[FaultInjected, int, WitnessIndex], "str | None"]
"""A kind's witness: what its effect misses after the fault fired at ``seq``; None once seen."""


# -- one witness per kind ----------------------------------------------------------------


def _first(events: list[Indexed], predicate: Callable[[Event], bool]) -> Indexed | None:
    return next(((s, x) for s, x in events if predicate(x)), None)


def cell_killed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    cell, after = fault.cell, index.after(seq)
    failed = _first(
        after,
        lambda x: isinstance(x, CellStateChanged) and x.cell == cell and x.new is CellState.ERRORED,
    )
    if failed is None:
        return f"cell {cell} was never marked failed"
    later = [p for p in after if p[0] > failed[0]]
    if _first(later, lambda x: isinstance(x, QuorumChanged) and cell not in x.members):
        return None
    if _first(later, lambda x: isinstance(x, HealEnded) and x.dst_cell == cell and x.ok):
        return None
    if _first(later, lambda x: isinstance(x, RunEnded) and x.status is RunStatus.FAILED):
        return None
    return f"cell {cell} failed but no later quorum excluded it and it was not healed"


def cell_started(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    cell, after = fault.cell, index.after(seq)
    up = _first(after, lambda x: isinstance(x, CellStarted) and x.cell == cell)
    if up is None:
        return f"the world never reported new processes for cell {cell}"
    later = [p for p in after if p[0] > up[0]]
    healed = _first(later, lambda x: isinstance(x, HealEnded) and x.dst_cell == cell and x.ok)
    grown = _first(later, lambda x: isinstance(x, QuorumChanged) and cell in x.members)
    return (
        None if healed and grown else f"cell {cell}'s new processes were not healed into a quorum"
    )


def _exited_before(engine: str | None, seq: int, index: WitnessIndex) -> bool:
    """The engine's process had exited, and none started since, when the fault fired at
    ``seq``: a kill then acts on nothing (the world kills only a live process). Today's FT
    controller suspends (kills) the engines an aborted update window stopped and resumes
    them ``--mini-ft-controller-resume-delay`` later (mini_ft_controller.py, see
    docs/miles-today-reading.md), so a kill drawn for that stretch finds no process."""
    for _, x in reversed(index.events[: bisect_left(index.events, seq, key=lambda p: p[0])]):
        if isinstance(x, EngineStarted | EngineExited) and x.engine == engine:
            return isinstance(x, EngineExited)
    return False


def engine_killed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """The world saw the process die, or the engine left rotation (its calls failed); or it
    had no process to kill."""
    engine = fault.engine
    if _exited_before(engine, seq, index):
        return None

    def gone(x: Event) -> bool:
        if isinstance(x, EngineExited):
            return x.engine == engine
        return (
            isinstance(x, EngineStateChanged) and x.engine == engine and x.new is EngineState.DOWN
        )

    return (
        None if _first(index.after(seq), gone) else f"engine {engine} never died nor left rotation"
    )


def engine_hung(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """Something noticed: the engine left rotation (a health check or a call timed out)."""
    engine = fault.engine
    down = _first(
        index.after(seq),
        lambda x: (
            isinstance(x, EngineStateChanged) and x.engine == engine and x.new is EngineState.DOWN
        ),
    )
    return None if down else f"nothing noticed that engine {engine} stopped answering"


def engine_orphaned(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    engine, after = fault.engine, index.after(seq)
    exited = _first(after, lambda x: isinstance(x, EngineExited) and x.engine == engine)
    if exited is None:
        if _has_process(engine, seq, index):
            return f"the world never reported engine {engine}'s actor lost"
        return None  # no process to orphan
    incarnation, since = exited[1].incarnation, exited[1].t  # type: ignore[union-attr]
    removed = _first(
        after,
        lambda x: (
            isinstance(x, OrphanRemoved) and x.engine == engine and x.incarnation == incarnation
        ),
    )
    served = any(
        s.engine == engine and s.incarnation == incarnation and s.t > since and not s.aborted
        for s in index.samples
    )
    if removed is None and not served:
        return (
            f"engine {engine}'s process {incarnation} exited and left no server behind: none "
            "was found in the router, none answered after the exit"
        )
    if index.started is not None and index.started.fault_tolerance:
        return _engine_served_again(engine, incarnation, exited[0], index)
    return None


def _engine_served_again(
    engine: str | None, incarnation: int, since: int, index: WitnessIndex
) -> str | None:
    """Fault tolerance brought a later process of the engine to serve."""
    if _served_from(engine, incarnation + 1, since, index):
        return None
    return f"fault tolerance never brought engine {engine} back after process {incarnation}"


def _served_from(engine: str | None, incarnation: int, since: int, index: WitnessIndex) -> bool:
    """After event ``since``, process ``incarnation`` of the engine, or one that replaced it
    in turn, came to serve; or another fault struck the engine, whose own witness judges
    what became of it."""
    serving = _first(
        [p for p in index.events if p[0] > since],
        lambda x: (
            isinstance(x, EngineStateChanged)
            and x.engine == engine
            and x.incarnation >= incarnation
            and x.new is EngineState.SERVING
        ),
    )
    return serving is not None or _struck_again(engine, since, index)


def _has_process(engine: str | None, seq: int, index: WitnessIndex) -> bool:
    """Whether the world had reported a process of the engine started, and not its exit,
    before event ``seq``."""
    started = exited = -1
    for s, e in index.events:
        if s >= seq:
            break
        if isinstance(e, EngineStarted) and e.engine == engine:
            started = max(started, e.incarnation)
        elif isinstance(e, EngineExited) and e.engine == engine:
            exited = max(exited, e.incarnation)
    return started > exited


def prompt_refused(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """A request sent once it fired was refused by its engine (the over-long prompt)."""
    del seq
    if any(s.outcome is SampleOutcome.REFUSED and s.sent >= fault.t for s in index.samples):
        return None
    return "no request sent after it fired was refused as over-long"


def engine_restarted(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    engine, after = fault.engine, index.after(seq)
    up = _first(after, lambda x: isinstance(x, EngineStarted) and x.engine == engine)
    if up is None:
        return f"the world never reported a new process for engine {engine}"
    incarnation = up[1].incarnation  # type: ignore[union-attr]
    if not _served_from(engine, incarnation, up[0], index):
        return f"engine {engine}'s new process {incarnation} (or a later one) never came to serve"
    return None


def start_slowed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """A start begun in the window (a restart_engine fault or a recovery the control plane
    asked) answered no sooner than ``seconds`` after it began: the one that came up is
    the latest begun before it. Passed when another fault struck the engine after the
    first such start (that fault's witness judges what became of it), when the run
    ended before that start could answer, or when a restart_engine fault's start was
    replaced by a recovery the health monitor asked for, not knowing of it."""
    engine, seconds = fault.engine, fault.seconds or 0.0
    begins = start_begins(engine, index)
    start, end = window(fault)
    inside = [(s, t) for s, t in begins if start <= t < end]
    if not inside:
        return f"no start of engine {engine} began in the window"
    for _, e in index.after(seq):
        if isinstance(e, EngineStarted) and e.engine == engine:
            began = max((t for _, t in begins if t <= e.t), default=None)
            if began is not None and start <= began < end and e.t - began >= seconds - 1e-9:
                return None
    first_seq, first_t = inside[0]
    ended = index.ended[1].t if index.ended is not None else None
    if _struck_again(engine, first_seq, index) or (ended is not None and ended < first_t + seconds):
        return None
    if _restart_replaced_by_recovery(engine, first_seq, index):
        return None
    return (
        f"none of the {len(inside)} start(s) of engine {engine} begun in the window answered "
        f"after the {seconds:g} s it takes (each was replaced before it could)"
    )


def _restart_replaced_by_recovery(engine: str | None, since: int, index: WitnessIndex) -> bool:
    """The start begun at ``since`` was a restart_engine fault's (the control plane did not
    ask for it, and saw only the old process exit), and a recovery the health monitor
    asked replaced it: the monitor could not know of that start (miles' would restart a
    dead actor too). Replacing a start the monitor itself asked for is what must not
    happen, and is not excused."""
    fault = any(
        seq == since and e.fault is FaultKind.RESTART_ENGINE  # type: ignore[union-attr]
        for seq, e in index.fired
    )
    return fault and any(
        seq > since and isinstance(e, EngineRecoveryAsked) and e.engine == engine
        for seq, e in index.events
    )


def _struck_again(engine: str | None, since: int, index: WitnessIndex) -> bool:
    """Another fault struck the engine after its new process started (a kill before it was
    synced, say): that fault's own witness judges what became of it."""
    return any(seq > since and e.engine == engine for seq, e in index.fired)  # type: ignore[union-attr]


def _inside(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(start <= t < end for start, end in windows)


def _slower(inside: list[float], outside: list[float], factor: float, what: str) -> str | None:
    """``what`` names the things timed, in the plural ("steps of cell 0")."""
    if not inside:
        return f"no {what} began during the window, so there was nothing to slow"
    if not outside:
        return f"no {what} outside the window to compare with"
    ratio = statistics.median(inside) / statistics.median(outside)
    wanted = 1 + (factor - 1) / 2
    if ratio < wanted:
        return (
            f"{what} in the window took {ratio:.2f}x the others, not the >= {wanted:.2f}x "
            f"that a {factor:g}x slowdown shows"
        )
    return None


def cell_slowed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    del seq
    windows = index.windows(FaultKind.SLOW_CELL, fault.cell)
    began = index.attempts
    mine = [r for r in index.trained if r.cell == fault.cell and (r.step, r.attempt) in began]
    in_window = steps_in(fault, index)
    inside = [r.seconds for r in in_window]
    outside = [r.seconds for r in mine if not _inside(began[(r.step, r.attempt)], windows)]
    if not outside:  # the cell was slow all along: compare with its peers in the same attempts
        keys = {(r.step, r.attempt) for r in in_window}
        outside = [
            r.seconds for r in index.trained if r.cell != fault.cell and (r.step, r.attempt) in keys
        ]
    return _slower(inside, outside, fault.factor or 1.0, f"steps of cell {fault.cell}")


def link_slowed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """Time per byte in the window against the same route's outside it (the engines, and
    whether the sender sits on their node by the world's placement: within a node a bucket
    moves ten times faster than between nodes, so a failover to a cell beside the engines
    must not read as a link that was not slowed, nor one away from them as a slowdown;
    seed 3322's only sends from the cell beside its engine were in the window). A send whose
    route sent nothing outside the window has no baseline: with the placement known it is
    not judged (against sends of the other kind of link a 64x slowdown read as 13x), and a
    window with no judged send passes; without it, every send outside is the baseline."""
    del seq
    # a send a partition held is no baseline either (seed 8707: a stalled send of the same
    # route, outside the window, made the others look 26x slower than they were)
    windows = index.windows(FaultKind.SLOW_LINK) + index.windows(FaultKind.PARTITION)

    def route(b: BucketReceived) -> tuple[object, tuple[str, ...]]:
        cell = index.updaters.get(b.update_id)
        local = index.within_a_node(cell, b.engines)
        return (cell if local is None else local, b.engines)

    baseline: dict[tuple[object, tuple[str, ...]], list[float]] = {}
    for b in index.buckets:
        if not _inside(b.t - b.seconds, windows):
            baseline.setdefault(route(b), []).append(b.seconds / max(1, b.nbytes))
    sends = bucket_sends_in(fault, index)
    same = [b for b in sends if route(b) in baseline]
    if same:  # each send against its own route's median: ratios, compared with 1
        inside = [b.seconds / max(1, b.nbytes) / statistics.median(baseline[route(b)])
                  for b in same]  # fmt: skip
        return _slower(inside, [1.0], fault.factor or 1.0, "bucket sends")
    if sends and baseline and index.placement is not None:
        return None  # sends outside the window, none of these routes: no comparison
    inside = [b.seconds / max(1, b.nbytes) for b in sends]
    outside = [x for per_route in baseline.values() for x in per_route]
    return _slower(inside, outside, fault.factor or 1.0, "bucket sends")


CUT_TOLERANCE = 0.05
"""Seconds a bucket may arrive before the cut's recorded end: a real world's fault is
recorded a moment before its window is set (the simulator's at the same instant)."""


def link_cut(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """Nothing crossed the cut: every bucket whose send began in the window arrived once it
    had closed (a send waits for the link, or fails at the group's timeout: cut_sends_in)."""
    del seq
    _, end = window(fault)
    early = [b for b in bucket_sends_in(fault, index) if b.t < end - CUT_TOLERANCE]
    if early:
        b = early[0]
        return (
            f"bucket {b.bucket} of update {b.update_id} went through the cut link: its send "
            f"began at t={b.t - b.seconds:.4g} and arrived at t={b.t:.4g}, before the cut "
            f"ended at t={end:.4g}"
        )
    return None if cut_met_something(fault, index) else "no bucket send began in it"


def router_delayed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    del seq
    start = fault.t
    delay = fault.seconds or 0.0
    sent = requests_in(fault, index)
    overheads = [  # time outside the engine, where it is known (a router failure: all of it)
        (s.sent, (s.t - s.sent) - (s.engine_seconds or 0.0))
        for s in sent
        if s.engine_seconds is not None or s.outcome is SampleOutcome.ROUTER_FAILED
    ]
    if not any(overhead >= delay / 2 for _, overhead in overheads):
        if not any(at > start for at, _ in overheads):
            return None  # only requests sent as it opened, which may have left before it did
        return f"no request sent during the window spent ~{delay:g}s in the router"
    # a request sent at the very instant the window opened may have left just before it did;
    # any sent later must have been delayed
    quick = [overhead for at, overhead in overheads if at > start and overhead < delay / 2]
    if quick:
        return f"a request sent during the window spent only {quick[0]:.3g}s in the router"
    return None


def router_failed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """A try sent in the window failed at the router: retried later (RequestRetried), or the
    request's last (a sample that failed there)."""
    del seq
    if retries_in(fault, index):
        return None
    sent = requests_in(fault, index)
    if any(s.outcome is SampleOutcome.ROUTER_FAILED for s in sent):
        return None
    # as for a delay: a request sent at the very instant the window opened may have left
    # just before the fault fired (the history's order at one instant); any later must fail
    later = [s for s in sent if s.sent > fault.t]
    if not later:
        return None
    return f"none of the {len(later)} request(s) sent during the window failed at the router"


def job_killed(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """The world saw every process of the job die, and a new controller resumed it."""
    del fault
    after = index.after(seq)
    died = _first(after, lambda x: isinstance(x, JobKilled))
    if died is None:
        return "the world never reported the job's processes dead"
    if _first([p for p in after if p[0] > died[0]], lambda x: isinstance(x, JobResumed)):
        return None
    return "the job was killed but never resumed (no new controller started)"


def driver_restarted(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """The world saw the driver die alone, and a new driver adopted the live processes."""
    del fault
    after = index.after(seq)
    died = _first(after, lambda x: isinstance(x, DriverRestarted))
    if died is None:
        return "the world never reported the driver dead"
    if _first([p for p in after if p[0] > died[0]], lambda x: isinstance(x, DriverAdopted)):
        return None
    return "the driver died but no new driver adopted the live processes"


def heartbeat_dropped(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    del seq
    start, end = window(fault)
    if any(m.cell == fault.cell and start <= m.sent < end for m in index.misses):
        return None
    return f"no heartbeat sent to cell {fault.cell} during the window was missed"


def engine_lied(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    engine = fault.engine
    checks = [
        e for _, e in index.after(seq) if isinstance(e, WeightsChecked) and e.engine == engine
    ]
    if any(c.checksum != c.trainer_checksum for c in checks):
        return None
    if checks:
        return f"engine {engine}'s weights matched the trainer's at every check after it lied"
    return f"no update checked engine {engine}'s weights after it lied"


def lock_kept(fault: FaultInjected, seq: int, index: WitnessIndex) -> str | None:
    """The lock its rank kept held a later broadcast of the cell: an update the cell sent
    aborted on a broadcast that waited out its timeout, or the run stalled."""
    source = f"cell-{fault.cell}"
    if any(
        a.t >= fault.t and a.component == source and "took no part in the broadcast" in a.reason
        for a in index.aborted
    ):
        return None
    if index.ended is not None and index.ended[1].status is RunStatus.STALLED:
        return None
    return f"no broadcast of cell {fault.cell} waited for the lock its rank kept"


WITNESSES: dict[FaultKind, Witness] = {
    FaultKind.KILL_CELL: cell_killed,
    FaultKind.KILL_RANK: cell_killed,
    FaultKind.FAIL_RANK: cell_killed,
    FaultKind.STOP_CELL: cell_killed,
    FaultKind.START_CELL: cell_started,
    FaultKind.KILL_ENGINE: engine_killed,
    FaultKind.RESTART_ENGINE: engine_restarted,
    FaultKind.HANG_ENGINE: engine_hung,
    FaultKind.HANG_CALL: engine_hung,
    FaultKind.ORPHAN_ENGINE: engine_orphaned,
    FaultKind.POISON_PROMPT: prompt_refused,
    FaultKind.SLOW_START: start_slowed,
    FaultKind.SLOW_CELL: cell_slowed,
    FaultKind.SLOW_LINK: link_slowed,
    FaultKind.PARTITION: link_cut,
    FaultKind.DELAY_ROUTER: router_delayed,
    FaultKind.FAIL_ROUTER: router_failed,
    FaultKind.DROP_HEARTBEAT: heartbeat_dropped,
    FaultKind.LYING_ENGINE: engine_lied,
    FaultKind.DELTA_APPLIED_TWICE: delta_pulled,
    FaultKind.DELTA_SKIPPED: delta_pulled,
    FaultKind.DELTA_TORN: delta_refused,
    FaultKind.KILL_JOB: job_killed,
    FaultKind.RESTART_DRIVER: driver_restarted,
    FaultKind.RAISE_HOLDING_LOCK: lock_kept,
}
"""Per kind, its witness: the dispatch ``unwitnessed`` reads (the control side's stopping
check asks it too, so it sits below the scenario layer, apart from miles_core/fault_kinds.py,
whose rows name the same functions: tests/test_fault_kinds.py holds the two equal)."""


def unwitnessed(
    fault: FaultInjected, seq: int, index: WitnessIndex, now: float | None = None
) -> str | None:
    """What the fault's witness misses; None when it saw the effect, or when the fault's
    window is idle (nothing it acts on passed through) and closed by ``now`` (an open one
    may still meet something: a run with until_witnessed waits for it)."""
    if idle_reason(fault, index) is not None and (now is None or window(fault)[1] <= now):
        return None
    missing = WITNESSES[fault.fault](fault, seq, index)
    if missing is not None and index.cut_by_heal(fault):
        return None  # liveness mode's heal closed its window early: its effect had no time
    return missing


__all__ = ["CUT_TOLERANCE", "WITNESSES", "Witness", "unwitnessed"]
