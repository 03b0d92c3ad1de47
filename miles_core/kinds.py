"""The small enums that events, faults and oracles share; each names one kind of fact.

They live apart from the modules that use them so that the event history
(miles_core.events) can be typed without importing the loop or the scenario
layer. The cell and engine states live with their transition tables
(miles_core.cells, miles_core.engines).
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """How a run ended. Which ending is *good* is the scenario's expectation (Expect)."""

    COMPLETED = "completed"
    FAILED = "failed"
    """Stopped with a named miles_core error (e.g. no cell alive): not a hang."""
    STALLED = "stalled"
    """Nothing could make progress (deadlock, livelock, horizon or timeout)."""
    CRASHED = "crashed"
    """An exception the control plane does not raise on purpose (a bug): never a pass."""
    INTERRUPTED = "interrupted"
    """Stopped from outside (Ctrl-C) before it ended by itself: no verdict on the control plane.
    The safety oracles judge what it did; how it would have ended, nobody knows."""


class PauseMode(StrEnum):
    """--pause-generation-mode: what an engine does with requests in flight during an update."""

    ABORT = "abort"
    """In-flight requests end, aborted; their groups go to the unused handler."""
    RETRACT = "retract"
    """Running requests go back to the waiting queue, their KV freed; after the update they
    continue on the new weights, the KV recomputed (prefill of the tokens so far)."""
    IN_PLACE = "in_place"
    """Requests freeze and continue on their old KV cache: later tokens come from the new
    weights attending to keys and values the old weights computed."""


class SubmissionGranularity(StrEnum):
    """--rollout-submission-granularity: what frees the producer's room for a new group."""

    GROUP = "group"
    """A group's room frees when the whole group returns."""
    SAMPLE = "sample"
    """Each finished sample frees its own room; a new group goes out once n samples have
    finished, whichever groups they came from (miles' default under --fully-async)."""


class FaultKind(StrEnum):
    KILL_CELL = "kill_cell"
    KILL_RANK = "kill_rank"
    FAIL_RANK = "fail_rank"
    STOP_CELL = "stop_cell"
    START_CELL = "start_cell"
    SLOW_CELL = "slow_cell"
    KILL_ENGINE = "kill_engine"
    RESTART_ENGINE = "restart_engine"
    HANG_ENGINE = "hang_engine"
    HANG_CALL = "hang_call"
    ORPHAN_ENGINE = "orphan_engine"
    POISON_PROMPT = "poison_prompt"
    SLOW_START = "slow_start"
    SLOW_LINK = "slow_link"
    PARTITION = "partition"
    DELAY_ROUTER = "delay_router"
    FAIL_ROUTER = "fail_router"
    DROP_HEARTBEAT = "drop_heartbeat"
    LYING_ENGINE = "lying_engine"
    DELTA_APPLIED_TWICE = "delta_applied_twice"
    """disk-delta: the engine's next pull applies its version's delta a second time."""
    DELTA_SKIPPED = "delta_skipped"
    """disk-delta: the engine's next pull answers success and applies nothing."""
    DELTA_TORN = "delta_torn"
    """disk-delta: the next version's delta file is torn (truncated) after it is written."""
    KILL_JOB = "kill_job"
    """Every process of the run dies at once (cells, engines, router, the controller): the
    job restarts from its last committed save (miles_core.saves)."""
    RESTART_DRIVER = "restart_driver"
    """The driver alone dies, its cells and engines up: a new driver adopts them (a hot
    restart, miles/utils/hot_restart.py; miles_core.loop.adopt)."""
    RAISE_HOLDING_LOCK = "raise_holding_lock"
    """A rank raises inside the cell's weight-update ticket lock and lives on: the lock stays
    held (miles' ``StoreTicketLock.__exit__`` fails closed, no lease), today's profile only."""


class FaultPoint(StrEnum):
    """A named place in a world's code where a scheduled fault may strike."""

    BEFORE_ALLREDUCE = "before_allreduce"
    """A cell has done its forward/backward of step ``step`` and not yet exchanged."""
    AFTER_BUCKET = "after_bucket"
    """Bucket ``bucket`` of a weight update (or sync) has just reached its engines."""
    DURING_HEAL = "during_heal"
    """A heal has started: a checkpoint is on its way from one cell to another."""
    MID_GENERATION = "mid_generation"
    """An engine is halfway through a generate request."""
    STEP_BEGIN = "step_begin"
    """Training step ``step`` begins (its batch is drained)."""
    DURING_RECOVERY = "during_recovery"
    """A new process for an engine is starting (a recovery or a restart), not yet serving."""
    DURING_SAVE = "during_save"
    """A periodic save is half written (begun after step ``k``, not yet committed)."""


class SampleOutcome(StrEnum):
    """How one generate call ended, as the control plane saw it."""

    COMPLETED = "completed"
    ABORTED = "aborted"
    """The engine answered with finish_reason abort (a pause or an abort request)."""
    ENGINE_FAILED = "engine_failed"
    """The engine died or could not be reached during the call."""
    ROUTER_FAILED = "router_failed"
    """The router could not deliver the request; the engine behind it may be fine."""
    REFUSED = "refused"
    """The engine refused the request itself (a 400: an input longer than its context); the
    engine is fine, the request is not, and sending it again changes nothing."""
    OUT_OF_SYNC = "out_of_sync"
    """The engine answered under a weight version the control plane cannot trust (unreadable,
    below the one it stamped on that process, or beyond any version issued): the sample is
    not used, and the engine leaves rotation until it is re-synced."""


class PutFate(StrEnum):
    """What the buffer did with a group put into it (recycled/dropped are their own events)."""

    QUEUED = "queued"
    BLOCKED = "blocked"


class AbortCause(StrEnum):
    """Why a weight update (or sync) stopped before it finished."""

    CELL = "cell"
    """The updating cell failed: another alive cell retries with the same version."""
    ENGINE = "engine"
    """An engine of the update failed: the update is retried without it."""


class EngineHealth(StrEnum):
    """An engine's health as today's rollout health checker publishes it (miles'
    ``TriState`` of ``SimpleHealthChecker.status``, miles/utils/ft_utils/health_checker.py):
    it only sets it; the mini FT controller acts on it."""

    HEALTHY = "healthy"
    """Its last counted check passed (TriState.TRUE)."""
    UNHEALTHY = "unhealthy"
    """``--rollout-health-check-failure-threshold`` checks in a row failed (TriState.FALSE)."""
    UNKNOWN = "unknown"
    """Not checked since it became checkable, or not checkable now: no process, starting,
    or the checker paused for an update (TriState.UNKNOWN)."""
