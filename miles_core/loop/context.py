"""What the roles of one run share: the world, the flags, the history, the state machines.

The roles (producer, trainer, updater, engine supervisor, heartbeat monitor)
each own one job and talk through this context. It also supervises the run's
background tasks: an exception in a task nobody awaits (a group's generation,
a sync, the producer) is not lost. The first one is kept with its traceback and
ends the run, which reports it as its end state.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from miles_core.backend import Cluster
from miles_core.buffer import DataBuffer
from miles_core.cells import CellGroup
from miles_core.engines import EngineTable
from miles_core.events import CellStateChanged, EngineStateChanged, Event, History
from miles_core.filters import dynamic_filter
from miles_core.loop.config import LoopConfig
from miles_core.runtime import Cancelled, Runtime, Task
from miles_core.sync import Lock, Notifier
from miles_core.update_connections import UpdateConnections
from miles_core.versions import VersionLedger

T = TypeVar("T")


class RunContext:
    """The shared state of one run; each role holds a reference to it."""

    def __init__(
        self,
        rt: Runtime,
        cluster: Cluster,
        config: LoopConfig,
        history: History,
        ledger: VersionLedger,
    ) -> None:
        self.rt = rt
        self.cluster = cluster
        self.config = config
        self.history = history
        self.ledger = ledger
        self.cells = CellGroup(
            cluster.num_cells,
            cluster.gpus_per_cell,
            max_step_attempts=config.max_step_attempts,
            max_route_attempts=config.max_route_attempts,
        )
        self.engines = EngineTable(cluster.engine_ids)
        self.buffer = DataBuffer(
            config.buffer_config(), dynamic_filter(config.dynamic_sampling_filter, config)
        )
        self.connections = UpdateConnections()
        self.update_lock = Lock(rt, "the weights lock")
        """Held from a step's training to the end of its update, and by each sync: a sync
        sends the trainer's current weights, right only while they are the published ones."""
        self.engines_changed = Notifier(rt)
        self._monitor_paused = 0
        self.monitor_epoch = 0
        """How many times the engine health monitor was paused or resumed (``monitor_paused``
        going to or from 0): today's checker discards a probe across which it moved, as
        miles' ``SimpleHealthChecker`` compares ``ActiveAndEpoch``."""
        self.heartbeats_paused = 0
        """The trainer heartbeat checker is paused while this is > 0: while a refresh
        reconfigures the cells (miles' ``_paused_health_checkers`` around the cooperative
        prepare, miles/ray/train/group.py ``_refresh_cells``). A weight update does not
        pause it: miles' trainer checkers go on through one (their RPC has its own
        concurrency group, so a busy cell still answers)."""
        self.heartbeat_resumes = 0
        """How many of those pauses have ended: each one starts every cell's count of
        missed heartbeats afresh (``SimpleHealthChecker.resume``)."""
        self.stopping = False
        self.versions: list[int] = []
        self.crash: tuple[BaseException, str] | None = None
        """The first exception of a background task, and the task's name."""
        self.crashed = rt.signal()
        self.tasks: list[Task[Any]] = []
        """The run's background tasks (pruned of finished ones as it goes): all cancelled
        when the run ends, so nothing of a finished run acts on the world or records."""
        self._prune_at = 64

    @property
    def monitor_paused(self) -> int:
        """The engine health monitor is paused while this is > 0 (updates, syncs, heals), as
        miles pauses its rollout health monitor around a weight update."""
        return self._monitor_paused

    @monitor_paused.setter
    def monitor_paused(self, value: int) -> None:
        if bool(value) != bool(self._monitor_paused):
            self.monitor_epoch += 1
        self._monitor_paused = value

    def emit(self, event_type: type[Event], **fields: Any) -> None:
        self.history.append(event_type(t=self.rt.now(), **fields))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> Task[T | None]:
        """A background task: if it raises, the run ends with that exception."""
        task = self.rt.spawn(self._guarded(coro, name), name)
        if len(self.tasks) >= self._prune_at:
            self.tasks = [t for t in self.tasks if not t.done()]
            self._prune_at = max(64, 2 * len(self.tasks))
        self.tasks.append(task)
        return task

    def cancel_tasks(self, reason: str) -> None:
        for task in self.tasks:
            if not task.done():
                task.cancel(reason)
        self.tasks = []

    async def _guarded(self, coro: Coroutine[Any, Any, T], name: str) -> T | None:
        try:
            return await coro
        except Cancelled:
            raise
        except Exception as error:
            self.fail(error, f"task {name!r}")
            return None

    def fail(self, error: BaseException, where: str) -> None:
        """End the run with ``error`` (the first one wins): a task crashed, or a role found
        that the run cannot go on (every engine lost without fault tolerance)."""
        if self.crash is None and not self.stopping:
            self.crash = (error, where)
            self.crashed.set()

    def record_cells(self) -> None:
        for tr in self.cells.take_transitions():
            self.emit(CellStateChanged, cell=tr.cell, old=tr.old, new=tr.new, reason=tr.reason)

    def record_engines(self) -> None:
        changed = False
        for tr in self.engines.take_transitions():
            self.emit(
                EngineStateChanged,
                engine=tr.engine,
                old=tr.old,
                new=tr.new,
                incarnation=tr.incarnation,
                reason=tr.reason,
            )
            changed = True
        if changed:
            self.engines_changed.notify()
