"""The recovery-time rows of the anchors file (``../shared/research/anchors.md``, "Fault-recovery
time"), predicted: ``python -m sim predict --anchors`` prints them after the update rows.

Each published miles figure is the window of one of miles' periodic loops
(sim/timing/recovery_loops.py): the closed form gives the range over the fault's phase, and where
the simulator runs that loop the row's prediction is the mean of the simulated runs. The rows
of other systems name the mechanism the simulator does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.timing.anchors import Unpredicted
from sim.timing.basis import Basis, within
from sim.timing.recovery_loops import (
    CONTROLLER_DELAY,
    HEARTBEAT_REFUSED,
    HEARTBEAT_UNANSWERED,
    MILES_RETRY,
    ROUTER_EVICTION,
    LoopCheck,
    controller_runs,
    heartbeat_windows,
    retry_window,
)

MISS_FACTOR = 1.5
FT_README = "miles tests/e2e/ft/README.md @#2542"


@dataclass(frozen=True)
class RecoveryRow:
    row: str
    source: str
    published: tuple[float, float]
    """The published range (both ends equal for "about X")."""
    term: str
    """Which loop predicts it, with its settings."""
    predicted: tuple[float, float]
    """The closed form's window."""
    simulated: tuple[float, ...]
    """The windows of the simulated runs, one per phase; () where the simulator does not run
    that loop."""
    cause: str
    """For a miss: which term is off, and why (empty for a row that meets)."""
    restated: str = ""
    """The setting the published figure restates (its label is then "restated"); empty:
    predicted from miles' settings of other loops."""

    @property
    def predicted_mid(self) -> float:
        if self.simulated:
            return sum(self.simulated) / len(self.simulated)
        return sum(self.predicted) / 2

    @property
    def ratio(self) -> float:
        return self.predicted_mid / (sum(self.published) / 2)

    @property
    def meets(self) -> bool:
        return within(self.ratio, MISS_FACTOR)

    @property
    def basis(self) -> tuple[Basis, str]:
        if self.restated:
            return Basis.RESTATED, self.restated
        return Basis.PREDICTED, f"miles' settings of the loop: {self.term}"


RECOVERY_UNPREDICTED = (
    Unpredicted(
        "miles soak fault rates",
        "mean 120 s (trainer) / 240 s (rollout)",
        FT_README,
        "inputs, not outcomes: `sim plan` takes fault rates as its [faults] mean times",
    ),
    Unpredicted(
        "NeMo-RL: NCCL communicator shrink after losing a vLLM instance",
        "shrink 1.38-2.03 s; next refit 3.65-4.58 s",
        "NeMo-RL PR #3186",
        "no such term: miles makes the update group afresh when its engines change "
        "(miles_core/update_connections.py), it does not shrink one",
    ),
    Unpredicted(
        "verl: standby trainer pulls weights from rollout memory",
        "< 0.5 s",
        "verl PR #7910",
        "no standby trainer in miles or the simulator",
    ),
    Unpredicted(
        "piper: standby DP rank promotion",
        "about 4 s",
        "uw-syfi/piper PR #18",
        "no standby rank in miles or the simulator",
    ),
    Unpredicted(
        "torchft replica heal",
        "948 s",
        "meta-pytorch/torchft #329",
        "torchft's quorum and replica heal are not modelled (pre-training, another system)",
    ),
    Unpredicted(
        "RobustRL: ETTR under 10 % failure injection",
        "> 80 % vs 60 %",
        "arXiv 2512.22492",
        "the cluster's phases and what '10 % failure injection' injects are not published; "
        "`sim plan` computes ETTR for a cluster and fault rates one states",
    ),
    Unpredicted(
        "ByteRobust: pre-training ETTR",
        "97 %",
        "arXiv 2509.16293",
        "pre-training over 3 months, not an RL control plane",
    ),
    Unpredicted(
        "NeMo-RL: a replacement engine joins at the next refit",
        "semantics",
        "NeMo-RL PR #3613",
        "a semantics, not a time; miles (and the simulator) sync a restarted engine to the "
        "published weights as it starts (EngineState.UNSYNCED), not at the next refit",
    ),
)


def _miss_cause_heartbeat(published: float) -> str:
    worst = HEARTBEAT_UNANSWERED.window()[1]
    return (
        f"detection: even with every heartbeat unanswered the checker condemns a cell within "
        f"{worst:g} s, so the {published - worst:g} s more lie outside SimpleHealthChecker's "
        "loop (Ray's notice of the dead actor, or the control server's report); the README "
        "does not break the 95 s down, and no term was bent to it"
    )


def predict_recovery() -> list[RecoveryRow]:
    """Every recovery row the simulator has a loop for, closed form and simulated."""
    heartbeat = heartbeat_windows(HEARTBEAT_REFUSED)
    retry = retry_window()
    return [
        RecoveryRow(
            "miles: a dead engine evicted from the router",
            FT_README,
            (90.0, 120.0),
            "router health loop: 3 failed checks, 30 s apart (refused)",
            ROUTER_EVICTION.window(),
            (),
            "",
        ),
        RecoveryRow(
            "miles: a killed cell still shows Healthy",
            FT_README,
            (95.0, 95.0),
            "trainer heartbeat: 3 misses, 10 s apart (refused)",
            HEARTBEAT_REFUSED.window(),
            heartbeat,
            _miss_cause_heartbeat(95.0),
        ),
        RecoveryRow(
            "miles: the heal waits suspended",
            FT_README,
            (10.0, 10.0),
            "mini FT controller: suspend, sleep the resume delay (10 s), resume",
            (CONTROLLER_DELAY, CONTROLLER_DELAY),
            tuple(suspended for _, suspended in controller_runs()),
            "",
            "the figure is the controller's resume delay, a setting (10 s)",
        ),
        RecoveryRow(
            "miles: the generation retry gives up",
            FT_README,
            (60.0, 60.0),
            "_post: 60 tries, 1 s apart, refused",
            MILES_RETRY.window(),
            (retry,),
            "",
            "the figure is the retry loop's settings multiplied out (60 tries, 1 s apart)",
        ),
    ]


def print_recovery(rows: Sequence[RecoveryRow]) -> None:
    print("\nrecovery times (closed form [best, worst phase]; simulated: one run per phase):")
    print(f"{'row':44s} {'published':>11s} {'closed form':>12s} {'simulated':>22s} {'ratio':>5s}")
    for r in rows:
        published = (
            f"{r.published[0]:g} s"
            if r.published[0] == r.published[1]
            else f"{r.published[0]:g}-{r.published[1]:g} s"
        )
        form = f"[{r.predicted[0]:g}, {r.predicted[1]:g}] s"
        simulated = "-" if not r.simulated else " ".join(f"{s:g}" for s in r.simulated)
        verdict = "meets" if r.meets else f"MISS: {r.cause}"
        print(
            f"{r.row:44s} {published:>11s} {form:>12s} {simulated:>22s} {r.ratio:5.2f}  {verdict}"
        )
        print(f"{'':44s} {r.term}")
    print(
        "ratio: the simulated mean (the closed form's middle where not simulated) over the "
        f"published middle; sources: {FT_README}"
    )


def print_loop_checks(checks: Sequence[LoopCheck]) -> None:
    print("\nthe simulator's loops against their closed forms (one run per phase):")
    for c in checks:
        simulated = " ".join(f"{s:g}" for s in c.simulated)
        verdict = "inside" if c.inside else "OUTSIDE"
        low, high = c.closed_form
        print(f"  {c.loop:54s} [{low:g}, {high:g}] s: {simulated}  {verdict}")


def print_unpredicted() -> None:
    print(f"\nrecovery rows not predicted ({len(RECOVERY_UNPREDICTED)}):")
    for u in RECOVERY_UNPREDICTED:
        print(f"  {u.row} ({u.published}; {u.source}): {u.why}")
