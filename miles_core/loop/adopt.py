"""A driver hot restart: what the trainer holds for a new driver, and how one adopts the world.

miles restarts the orchestration script while its trainers and engines stay up
(miles/utils/hot_restart.py at 14aca060, PRs #2963, #3011, #3014, #3018, #3061, #3068,
#3069): the new script finds the workers initialized and takes them over instead of
creating them. For the trainers, ``wait_trainers_idle`` then ``trainer_init_or_load_state``:
``load_state()`` returns the rollout ids to start at (the other line, index id 68796729424,
``init_or_resume_trainer``: "roll it back to its checkpoint"). For the inference side,
``init_or_reset_inference_controller`` / ``init_or_resume_inference_controller``:
``wait_idle``, close a stale update window (``is_update_weights_window_open`` ->
``abort_update_weights``), then ``abort_all`` of every generation the previous script left
in flight (its samples "may reach this run" only where a cell refused). What the dead
script held in memory (the rollout buffer, the data it had drawn) is lost with it.

Here, the same, with every choice explicit:

- the trainer holds, in memory, the control plane's state as of its last *published*
  version (``StateHold``: the step trained, the version, the data cursor and the prompts
  drawn and not yet trained, taken at the VersionPublished, as a save would hold them);
  the new driver rolls it back there (miles' ``load_state``), so a step trained and not
  yet published when the driver died is trained again, once, and no version is published
  twice: the next one is the held one + 1;
- the buffer's groups, the groups generating and every request's bookkeeping are lost
  (as in miles); their prompts, drawn after the held state or pending in it, are drawn
  again from the held cursor and pending list;
- from the world the new driver learns each engine's process (incarnation, found by the
  world's reports as a restarted job's controller finds them), its stamped version, and a
  weight-update window left open: an open session is ended, requests in flight are aborted
  (``abort_all``), a paused engine resumed; every engine is then synced to the held version
  before it serves (the path a resumed job takes), since a window the driver died in may
  have loaded part of a newer, unpublished version into it.

DriverAdopted records what the new driver found and did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from miles_core.backend import ComponentFailure, RequestRefused
from miles_core.events import DriverAdopted, Event, StepCommitted, VersionPublished
from miles_core.runtime import Runtime
from miles_core.saves import Resume, SaveState

if TYPE_CHECKING:
    from miles_core.loop.context import RunContext
    from miles_core.loop.producer import Producer


DRIVER_RESTART_SECONDS = 10.0
"""From the driver's death to the new one adopting the processes: a new script starts (miles
polls its workers every 5 s in ``wait_until_worker_not_initialized``). Both worlds wait it."""

TAKE_OVER_SECONDS = 300.0
"""The most a new driver waits for one engine's answer while taking it over (miles'
``INFERENCE_TAKE_OVER_TIMEOUT_SECONDS``, the take-over line at index id 68796729424: cells
that do not answer are logged and left). Without it a hung engine held the adoption for
ever (swarm seed 2580)."""


@dataclass(frozen=True)
class EngineView:
    """One engine slot as the world reports it to a new driver."""

    engine: str
    incarnation: int
    alive: bool
    version: int | None
    paused: bool
    session_open: bool


class DriverHost(Protocol):
    """What a world offers a new driver: the trainer's held state and its live engines."""

    def held_state(self) -> SaveState | None: ...

    def engine_views(self) -> tuple[EngineView, ...]: ...

    async def abort_all(self) -> int:
        """Abort every request in flight on every live engine; how many were."""
        ...

    def engine(self, engine_id: str, incarnation: int) -> Any:
        """That process's control calls (miles_core.backend.RolloutEngine)."""
        ...


@dataclass(frozen=True)
class Adoption(Resume):
    """A hot restart's resume: the held state (``state``) and what the new driver found."""

    engines: tuple[str, ...] = ()
    incarnations: tuple[int, ...] = ()
    stamped: tuple[int | None, ...] = ()
    closed: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    aborted: int = 0


async def adopt(host: DriverHost, rt: Runtime) -> Adoption:
    """Take the live engines over (miles' ``init_or_resume_inference_controller``): end
    every update session left open, abort every request in flight, resume what is paused;
    an engine that does not answer within ``TAKE_OVER_SECONDS`` is left as it is."""
    views = tuple(v for v in host.engine_views() if v.alive)
    closed = [v.engine for v in views if v.session_open and await _call(host, rt, v, "end_update")]
    aborted = await host.abort_all()
    resumed = [v.engine for v in views if v.paused and await _call(host, rt, v, "resume")]
    return Adoption(
        host.held_state(),
        engines=tuple(v.engine for v in views),
        incarnations=tuple(v.incarnation for v in views),
        stamped=tuple(v.version for v in views),
        closed=tuple(closed),
        resumed=tuple(resumed),
        aborted=aborted,
    )


async def _call(host: DriverHost, rt: Runtime, view: EngineView, call: str) -> bool:
    """One control call; an engine that fails it, or does not answer within
    ``TAKE_OVER_SECONDS``, is left to the new driver's supervision."""
    made = getattr(host.engine(view.engine, view.incarnation), call)()
    task = rt.spawn(made, f"take-over-{call}-{view.engine}")
    try:
        if await rt.wait_any([task, rt.timer(TAKE_OVER_SECONDS)]) == 1:
            task.cancel(f"no answer to {call} within {TAKE_OVER_SECONDS:g}s of the take-over")
            return False
        await task
    except (ComponentFailure, RequestRefused):
        return False
    return True


def adopted_event(
    ctx: RunContext, adoption: Adoption, cursor: int, pending: tuple[int, ...]
) -> None:
    """Record the adoption (DriverAdopted): the state rolled back to and what was found."""
    state = adoption.state
    ctx.emit(
        DriverAdopted,
        save_step=None if state is None else state.step,
        version=None if state is None else state.version,
        next_step=adoption.next_step,
        cursor=cursor,
        pending=pending,
        engines=adoption.engines,
        incarnations=adoption.incarnations,
        stamped=adoption.stamped,
        closed=adoption.closed,
        resumed=adoption.resumed,
        aborted=adoption.aborted,
    )


class StateHold:
    """The trainer's in-memory state for a hot restart, handed to the world (``sink``) as
    each version is published: the step that version holds, the version, the data cursor
    and the prompts still to train (miles' ``load_state`` returns the rollout id to go on
    at). Silent: it records nothing, so a run's history is the same with it."""

    def __init__(
        self, ctx: RunContext, producer: Producer, sink: Callable[[SaveState], None]
    ) -> None:
        self.ctx, self.producer, self.sink = ctx, producer, sink
        self.step: int | None = None
        ctx.history.observe(self._seen)

    def _seen(self, event: Event) -> None:
        if self.ctx.stopping:  # a dead driver holds nothing (and a finished run)
            return
        if isinstance(event, StepCommitted):
            self.step = event.step
        elif isinstance(event, VersionPublished) and self.step is not None:
            cursor, pending = self.producer.saved()
            self.sink(SaveState(self.step, event.version, cursor, pending, self.ctx.config.seed))


__all__ = [
    "DRIVER_RESTART_SECONDS",
    "Adoption",
    "DriverHost",
    "EngineView",
    "StateHold",
    "adopt",
    "adopted_event",
]
