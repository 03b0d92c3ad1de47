"""The Ray world as a hot-restarted driver finds it (miles_core.loop.adopt.DriverHost).

miles restarts its orchestration script while the trainers and engines stay up
(miles/utils/hot_restart.py at 14aca060: ``trainer_init_or_load_state``,
``init_or_reset_inference_controller``; the other line, index id 68796729424:
``init_or_resume_inference_controller`` closes a stale window with
``is_update_weights_window_open`` -> ``abort_update_weights`` before ``abort_all``).
Here the new driver learns the world from the processes themselves:

- the trainer: each rank holds, in its own process, the control plane's state at the last
  published version and its share of model and optimizer then (``hold``, taken at each
  VersionPublished: the sink of miles_core.loop.adopt.StateHold); the new driver reads it
  (``held``) and rolls every live cell back to it (``load_held``: miles' ``load_state``);
  a cell that holds another version (started after it) is given a held cell's state;
- each engine: its process (the slot's incarnation), its version (``/model_info``'s
  ``weight_version``, what miles' ``get_weight_version`` reads), paused and session state
  (``/server_info``'s ``internal_states``); ``abort_all`` is SGLang's ``/abort_request``
  with ``abort_all`` on every engine that answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, Protocol

from backends.common.world.cell import RayCell
from backends.common.world.engine_slot import EngineHandle, RayEngine
from backends.common.world.transport import CollectiveTransport
from miles_core.backend import ComponentFailure, WorldObserver
from miles_core.loop.adopt import EngineView
from miles_core.saves import SaveState


class RayCluster(Protocol):
    """What of the Ray world (cluster.py's RayCluster) a new driver reads."""

    cells: dict[int, RayCell]
    engines: dict[str, RayEngine]
    engine_ids: tuple[str, ...]

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None: ...
    def engine(self, engine_id: str, incarnation: int) -> EngineHandle: ...


PROBE_SECONDS = 5.0
"""How long the new driver waits for an engine's answer before it counts it as unknown (a
hung process answers nothing; it is left to the new driver's supervision)."""


def hold_sink(cluster: RayCluster) -> Any:
    """What StateHold hands each published version's state to: every live rank keeps it,
    with its share of the weights as they are at the publish. The call is submitted at
    once, and the cell's next train waits for it (RayCell.train: the ranks' calls may run
    side by side); a rank that died meanwhile holds nothing, and the new driver finds the
    state in another cell."""

    def sink(state: SaveState) -> None:
        for cell in cluster.cells.values():
            cell.holding = [r.hold.remote(state) for r in cell.ranks]

    return sink


async def held_state(cluster: RayCluster) -> SaveState | None:
    """The newest state any live cell's first rank holds (None: nothing published)."""
    found: list[SaveState] = []
    for cell in cluster.cells.values():
        with contextlib.suppress(ComponentFailure):
            if cell.ranks:
                state = (await cell.call("held"))[0]
                if state is not None:
                    found.append(state)
    return max(found, key=lambda s: s.version, default=None)


async def roll_back(cluster: RayCluster, state: SaveState) -> tuple[int, ...]:
    """Every live cell's model and optimizer as held at ``state.version``; a cell holding
    another version is given a rolled-back cell's (the heal's copy). The cells rolled back."""
    done: list[int] = []
    lacking: list[int] = []
    for index, cell in cluster.cells.items():
        with contextlib.suppress(ComponentFailure):
            if cell.ranks:
                sums = await cell.call("load_held", state.version)
                (done if None not in sums else lacking).append(index)
    for index in lacking if done else ():
        source, cell = cluster.cells[done[0]], cluster.cells[index]
        with contextlib.suppress(ComponentFailure):
            states = await source.call("get_state")
            await cell.call_each("set_state", [(s,) for s in states])
    return tuple(done)


async def fresh_transport(cluster: Any) -> None:
    """The dead driver's weight-update groups destroyed (as miles'
    ``disconnect_rollout_engines_from_distributed``) and a new transport for the new one:
    its update ids start again, and a group name made from them must not meet an old one."""
    old = cluster.transport
    if not isinstance(old, CollectiveTransport):
        return
    for index in cluster.cells:
        await old.connect(0, index, {})
    await asyncio.gather(*old._destroying, return_exceptions=True)
    cluster.transport = type(old)(cluster)


class RayDriverHost:
    """miles_core.loop.adopt.DriverHost over the Ray world; ``found`` asks the engines."""

    def __init__(
        self, cluster: RayCluster, held: SaveState | None, views: tuple[EngineView, ...]
    ) -> None:
        self.cluster, self.held, self.views = cluster, held, views

    @classmethod
    async def found(cls, cluster: RayCluster, held: SaveState | None) -> RayDriverHost:
        views = await asyncio.gather(*(_view(cluster, e) for e in cluster.engine_ids))
        return cls(cluster, held, tuple(views))

    def held_state(self) -> SaveState | None:
        return self.held

    def engine_views(self) -> tuple[EngineView, ...]:
        return self.views

    async def abort_all(self) -> int:
        """SGLang's /abort_request (abort_all) on every live engine: how many it was running."""
        counts = await asyncio.gather(*(_abort_all(self.cluster, v) for v in self.views))
        return sum(counts)

    def engine(self, engine_id: str, incarnation: int) -> EngineHandle:
        return self.cluster.engine(engine_id, incarnation)


async def _ask(cluster: RayCluster, engine: str, incarnation: int, path: str) -> dict[str, Any]:
    slot = cluster.engines[engine]
    return await slot.request(incarnation, "GET", path, seconds=PROBE_SECONDS)


async def _view(cluster: RayCluster, engine_id: str) -> EngineView:
    """The engine as its process reports itself; alive: a process the slot holds that
    Ray has not reported dead (what it answers, or not, is as found)."""
    slot = cluster.engines[engine_id]
    incarnation = slot.incarnation
    alive = slot.actor is not None and not slot.gone
    if not alive:
        return EngineView(engine_id, incarnation, False, None, False, False)
    try:
        info = await _ask(cluster, engine_id, incarnation, "/server_info")
        model = await _ask(cluster, engine_id, incarnation, "/model_info")
    except ComponentFailure:  # alive and not answering: found as it is
        return EngineView(engine_id, incarnation, True, None, False, False)
    state = info["internal_states"][0]
    version = str(model["weight_version"])
    return EngineView(
        engine_id,
        incarnation,
        True,
        int(version) if version.isdigit() else None,  # "default": none stamped
        bool(state["paused"]),
        bool(state.get("testbed_session_open", False)),
    )


async def _abort_all(cluster: RayCluster, view: EngineView) -> int:
    if not view.alive:
        return 0
    slot = cluster.engines[view.engine]
    try:
        info = await _ask(cluster, view.engine, view.incarnation, "/server_info")
        body = {"abort_all": True}
        await slot.request(view.incarnation, "POST", "/abort_request", body, seconds=PROBE_SECONDS)
    except ComponentFailure:
        return 0
    return int(info["internal_states"][0]["running_requests"])


def report_restarted(cluster: RayCluster, observer: WorldObserver) -> None:
    """A new driver attaches: the processes that replaced the first ones before it did are
    reported now, as a controller finds its actors (sim.world.cluster's
    ``_report_restarted``): an engine's first process gone, the one serving now; a cell's
    new processes (a dead cell is found by its calls, as ever)."""
    how = "while the driver restarted"
    for index, cell in cluster.cells.items():
        if cell.incarnation > 0 and cell.ranks:
            observer.cell_started(index, cell.incarnation, f"processes started {how}")
    for engine_id, slot in cluster.engines.items():
        alive = slot.actor is not None and not slot.gone
        if not alive or slot.incarnation > 0:
            observer.engine_exited(engine_id, 0, f"died {how}")
        if slot.incarnation > 0 and alive:
            observer.engine_started(engine_id, slot.incarnation, f"process restarted {how}")


__all__ = [
    "RayDriverHost",
    "fresh_transport",
    "held_state",
    "hold_sink",
    "report_restarted",
    "roll_back",
]
