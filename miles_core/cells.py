"""Independent-DP cells (miles' --indep-dp): states, quorum, healing, retry and routing.

A cell is one full model replica (TP x PP x CP GPUs). Cells exchange gradients
with each other; when one dies the others go on, and a restarted cell is
healed from a checkpoint sent by the first alive cell. Decisions made here:

- ``refresh`` (start of every step attempt): the new quorum is pending + alive
  cells. If that differs from the last quorum, or a cell is pending, the group
  reconfigures under a new quorum id and plans one heal per pending cell,
  from the first alive cell (source and destination named by cell and by rank
  in the new quorum, and by the global ranks that exchange the checkpoint).
- ``finish_attempt``: each cell's outcome is errored (it raised), discarded
  (the cross-cell gradient exchange failed, so its step is invalid) or normal.
  Any discard, or no normal cell at all, retries the step; otherwise the step
  commits on the normal cells (an error after the exchange loses nothing).
- update_weights and save go to the first alive cell; a failure marks it
  errored and the next alive cell takes over, within a bounded number of tries.
- No alive cell: NoAliveCellError, never a hang.

The cell state machine is the transition table ``TRANSITIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import (
    ConfigError,
    NoAliveCellError,
    RetriesExhaustedError,
    TransitionError,
    int_at_least,
)


class CellState(StrEnum):
    PENDING = "pending"
    ALLOCATED_UNINITIALIZED = "allocated_uninitialized"
    ALIVE = "alive"
    ERRORED = "errored"
    STOPPED = "stopped"


class CellEvent(StrEnum):
    ALLOCATE = "allocate"
    """Resources granted and actors started for a pending cell."""
    INITIALIZED = "initialized"
    """The cell loaded its state (from a peer's checkpoint, or at launch)."""
    FAIL = "fail"
    """An exception, a dead actor, or missed heartbeats."""
    STOP = "stop"
    """Actors killed (after an error, or by the operator)."""
    RESTART = "restart"
    """Ask for the stopped cell to come back: it becomes pending."""


S, E = CellState, CellEvent
TRANSITIONS: Mapping[tuple[CellState, CellEvent], CellState] = {
    (S.PENDING, E.ALLOCATE): S.ALLOCATED_UNINITIALIZED,
    (S.PENDING, E.STOP): S.STOPPED,
    (S.ALLOCATED_UNINITIALIZED, E.INITIALIZED): S.ALIVE,
    (S.ALLOCATED_UNINITIALIZED, E.FAIL): S.ERRORED,
    (S.ALLOCATED_UNINITIALIZED, E.STOP): S.STOPPED,
    (S.ALIVE, E.FAIL): S.ERRORED,
    (S.ALIVE, E.STOP): S.STOPPED,
    (S.ERRORED, E.FAIL): S.ERRORED,
    (S.ERRORED, E.STOP): S.STOPPED,
    (S.STOPPED, E.RESTART): S.PENDING,
}
del S, E


class Outcome(StrEnum):
    NORMAL = "normal"
    DISCARDED = "discarded"
    ERRORED = "errored"


class Decision(StrEnum):
    COMMIT = "commit"
    RETRY = "retry"


@dataclass(frozen=True)
class Transition:
    cell: int
    old: CellState
    new: CellState
    event: CellEvent
    reason: str


@dataclass(frozen=True)
class Heal:
    """Send a checkpoint from ``src_cell`` to ``dst_cell``."""

    src_cell: int
    dst_cell: int
    src_alive_rank: int
    """The source's rank in the new quorum (miles' recv_ckpt_src_rank)."""
    dst_alive_rank: int
    src_ranks: tuple[int, ...]
    """Global train ranks of the source cell; rank i sends to dst_ranks[i]."""
    dst_ranks: tuple[int, ...]


@dataclass(frozen=True)
class RefreshPlan:
    reconfigure: bool
    quorum_id: int
    members: tuple[int, ...]
    """Cells of the quorum: the alive ones plus the ones being healed."""
    heals: tuple[Heal, ...]


@dataclass(frozen=True)
class Attempt:
    step: int
    attempt: int
    """1-based attempt number of this step."""
    quorum_id: int
    cells: tuple[int, ...]
    """The alive cells the step runs on."""


@dataclass(frozen=True)
class AttemptResult:
    attempt: Attempt
    decision: Decision
    normal: tuple[int, ...]
    discarded: tuple[int, ...]
    errored: tuple[int, ...]


class CellGroup:
    """The state of every cell and the quorum; emits Transitions for the event history."""

    def __init__(
        self,
        num_cells: int,
        gpus_per_cell: int,
        max_step_attempts: int = 30,
        max_route_attempts: int = 30,
        initial: CellState = CellState.ALIVE,
    ) -> None:
        for name, value in (
            ("num_cells", num_cells),
            ("gpus_per_cell", gpus_per_cell),
            ("max_step_attempts", max_step_attempts),
            ("max_route_attempts", max_route_attempts),
        ):
            if not int_at_least(value, 1):
                raise ConfigError(name, f"got {value!r}", "pass an integer >= 1")
        self.num_cells = num_cells
        self.gpus_per_cell = gpus_per_cell
        self.max_step_attempts = max_step_attempts
        self.max_route_attempts = max_route_attempts
        self._states = [initial] * num_cells
        self._alive = self._find_alive()
        """The alive cells, kept by ``apply`` (the heartbeat asks twice a round)."""
        self._quorum_id = 0
        self._members: tuple[int, ...] = self.alive()
        self._transitions: list[Transition] = []
        self._attempt: Attempt | None = None
        self._step_attempts: dict[int, int] = {}

    # -- state -------------------------------------------------------------

    def state(self, cell: int) -> CellState:
        self._check_cell(cell)
        return self._states[cell]

    def states(self) -> tuple[CellState, ...]:
        return tuple(self._states)

    def alive(self) -> tuple[int, ...]:
        return self._alive

    def _find_alive(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self._states) if s is CellState.ALIVE)

    def ranks(self, cell: int) -> tuple[int, ...]:
        """Global train ranks of a cell (cells are consecutive slices of the actor bundles)."""
        self._check_cell(cell)
        start = cell * self.gpus_per_cell
        return tuple(range(start, start + self.gpus_per_cell))

    @property
    def quorum_id(self) -> int:
        return self._quorum_id

    @property
    def members(self) -> tuple[int, ...]:
        return self._members

    def _check_cell(self, cell: int) -> None:
        if not 0 <= cell < self.num_cells:
            raise ConfigError(
                "cell", f"cell {cell} does not exist", f"pass 0 <= cell < {self.num_cells}"
            )

    def apply(self, cell: int, event: CellEvent, reason: str = "") -> CellState:
        """Move a cell through the transition table; anything else is a TransitionError."""
        old = self.state(cell)
        new = TRANSITIONS.get((old, event))
        if new is None:
            raise TransitionError(
                f"cell {cell}: event {event.value} is not allowed in state {old.value}"
            )
        self._states[cell] = new
        if (old is CellState.ALIVE) != (new is CellState.ALIVE):
            self._alive = self._find_alive()
        self._transitions.append(Transition(cell, old, new, event, reason))
        return new

    def take_transitions(self) -> tuple[Transition, ...]:
        """Transitions since the last call, for the event history."""
        taken, self._transitions = tuple(self._transitions), []
        return taken

    def mark_failed(self, cell: int, reason: str) -> None:
        """A failure was detected; a cell already errored or gone stays as it is."""
        if self.state(cell) in (
            CellState.ALIVE,
            CellState.ALLOCATED_UNINITIALIZED,
            CellState.ERRORED,
        ):
            self.apply(cell, CellEvent.FAIL, reason)

    def stop(self, cell: int, reason: str) -> None:
        if self.state(cell) is not CellState.STOPPED:
            self.apply(cell, CellEvent.STOP, reason)

    def restart(self, cell: int, reason: str) -> None:
        """Bring a dead or stopped cell back as pending; it is healed at the next refresh."""
        if self.state(cell) in (
            CellState.ALIVE,
            CellState.ALLOCATED_UNINITIALIZED,
            CellState.PENDING,
        ):
            raise TransitionError(
                f"cell {cell} is {self.state(cell).value}; only errored or stopped cells restart"
            )
        self.stop(cell, reason)
        self.apply(cell, CellEvent.RESTART, reason)

    # -- refresh and healing ----------------------------------------------

    def refresh(self) -> RefreshPlan:
        """Decide the quorum for the next attempt, and the heals it needs."""
        alive = self.alive()
        if not alive:
            raise NoAliveCellError(
                f"no trainer cell is alive (states: {self._describe()}); nothing can train or "
                "heal: restart the job from its last checkpoint"
            )
        joining = tuple(
            i
            for i, s in enumerate(self._states)
            if s in (CellState.PENDING, CellState.ALLOCATED_UNINITIALIZED)
        )
        members = tuple(sorted(alive + joining))
        if not joining and members == self._members:
            return RefreshPlan(False, self._quorum_id, members, ())
        self._quorum_id += 1
        self._members = members
        src = alive[0]
        heals = []
        for dst in joining:
            if self._states[dst] is CellState.PENDING:
                self.apply(dst, CellEvent.ALLOCATE, f"heal in quorum {self._quorum_id}")
            heals.append(
                Heal(
                    src_cell=src,
                    dst_cell=dst,
                    src_alive_rank=members.index(src),
                    dst_alive_rank=members.index(dst),
                    src_ranks=self.ranks(src),
                    dst_ranks=self.ranks(dst),
                )
            )
        return RefreshPlan(True, self._quorum_id, members, tuple(heals))

    def heal_done(self, cell: int) -> None:
        self.apply(cell, CellEvent.INITIALIZED, "healed from checkpoint")

    def heal_failed(self, cell: int, reason: str) -> None:
        self.apply(cell, CellEvent.FAIL, reason)

    # -- step attempts ----------------------------------------------------

    def begin_attempt(self, step: int) -> Attempt:
        """Start the next attempt of ``step`` on the alive cells (call refresh first)."""
        if self._attempt is not None:
            raise TransitionError(f"attempt {self._attempt} is still running; finish it first")
        alive = self.alive()
        if not alive:
            raise NoAliveCellError(
                f"step {step}: no trainer cell is alive (states: {self._describe()})"
            )
        number = self._step_attempts.get(step, 0) + 1
        if number > self.max_step_attempts:
            raise RetriesExhaustedError(
                f"step {step} failed {self.max_step_attempts} attempts; raise max_step_attempts "
                "or look at why the cells keep failing"
            )
        self._step_attempts[step] = number
        self._attempt = Attempt(step, number, self._quorum_id, alive)
        return self._attempt

    def finish_attempt(self, outcomes: Mapping[int, Outcome]) -> AttemptResult:
        """Classify the attempt: errored cells are marked failed; retry or commit."""
        attempt = self._attempt
        if attempt is None:
            raise TransitionError("finish_attempt without begin_attempt")
        if set(outcomes) != set(attempt.cells):
            raise TransitionError(
                f"step {attempt.step}: outcomes for cells {sorted(outcomes)} but the attempt ran "
                f"on {list(attempt.cells)}"
            )
        self._attempt = None
        by = {o: tuple(c for c in attempt.cells if Outcome(outcomes[c]) is o) for o in Outcome}
        for cell in by[Outcome.ERRORED]:
            self.mark_failed(cell, f"step {attempt.step} attempt {attempt.attempt} errored")
        retry = bool(by[Outcome.DISCARDED]) or not by[Outcome.NORMAL]
        decision = Decision.RETRY if retry else Decision.COMMIT
        if decision is Decision.COMMIT:
            self._step_attempts.pop(attempt.step, None)
        return AttemptResult(
            attempt, decision, by[Outcome.NORMAL], by[Outcome.DISCARDED], by[Outcome.ERRORED]
        )

    # -- routing ------------------------------------------------------------

    def first_alive(self, op: str) -> int:
        alive = self.alive()
        if not alive:
            raise NoAliveCellError(
                f"{op}: no trainer cell is alive (states: {self._describe()}); "
                "restart the job from its last checkpoint"
            )
        return alive[0]

    def routed(self, op: str) -> RoutedCall:
        """A call (update_weights, save) that runs on the first alive cell, with retry."""
        return RoutedCall(self, op)

    def _describe(self) -> str:
        return ", ".join(f"{i}={s.value}" for i, s in enumerate(self._states))


class RoutedCall:
    """One routed operation: each try goes to the first alive cell; failures fail over."""

    def __init__(self, group: CellGroup, op: str) -> None:
        self._group = group
        self.op = op
        self.tries = 0
        self.current: int | None = None

    def target(self) -> int:
        """The cell for the next try."""
        if self.tries >= self._group.max_route_attempts:
            raise RetriesExhaustedError(
                f"{self.op} failed on {self.tries} tries; raise max_route_attempts or look at "
                "why the cells keep failing"
            )
        self.current = self._group.first_alive(self.op)
        self.tries += 1
        return self.current

    def failed(self, reason: str) -> None:
        """The current try failed: its cell is marked failed and the next try fails over."""
        if self.current is None:
            raise TransitionError(f"{self.op}: failed() before target()")
        self._group.mark_failed(self.current, f"{self.op}: {reason}")
        self.current = None
