"""The wait-for graph: who waits on whom when a run stops moving.

A hang with no error is the commonest complaint about async RL stacks (an update
that never returns, a lock never released), and a run that only ends STALLED says
nothing about where. When a run stalls or misses its liveness bound, the runtime
lists every task of the control plane and what it awaits; this module turns that into
a graph and finds its root: the cycle, or the party (an engine that never answers, a
collective missing a member) that every other wait leads to.

It reads coroutines as Python keeps them (each coroutine's ``cr_await`` is the one it
awaits, down to the runtime's own awaitable), so the same code serves the simulator's
tasks and asyncio's. A world names the party behind a wait by giving the object that
waits a ``wait_party()`` method (the simulator's engines and cells do); failing that, a
local variable called ``engine`` or ``cell`` in the innermost frame names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from types import FrameType
from typing import Any

PACKAGES = ("miles_core", "sim", "backends")
"""Frames from these packages are the control plane's and its worlds'; others (asyncio,
ray, simpy) are plumbing and are left out of the description."""
SHOWN_FRAMES = 3
"""The innermost frames of the project shown for each task."""


@dataclass(frozen=True)
class TaskWait:
    """One task that has not finished, and what it awaits."""

    task: str
    where: tuple[str, ...]
    """The project's frames it is suspended in, outermost first: ``Class.method (path:line)``."""
    awaits: str
    """What the innermost awaits, as the runtime sees it (a task, a timer, a signal)."""
    on_tasks: tuple[str, ...] = ()
    """The tasks whose end it awaits (edges of the graph)."""
    party: str | None = None
    """The world's part behind the wait, when one is named (``engine-1 process 2, hung``)."""
    since: float | None = None
    """When it began this wait (None: the runtime does not know)."""

    def line(self) -> str:
        since = "" if self.since is None else f" since t={self.since:.6g}"
        where = " <- ".join(reversed(self.where[-SHOWN_FRAMES:])) or "?"
        party = f" [{self.party}]" if self.party else ""
        return f"{self.task}{since}: awaits {self.awaits}{party} in {where}"


def await_frames(coro: Any) -> list[FrameType]:
    """The frames of a suspended coroutine and of what it awaits, outermost first."""
    frames: list[FrameType] = []
    seen: set[int] = set()
    while coro is not None and id(coro) not in seen:
        seen.add(id(coro))
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None and (not frames or frames[-1] is not frame):
            frames.append(frame)
        inner = getattr(coro, "cr_await", None)
        if inner is None:
            inner = getattr(coro, "gi_yieldfrom", None)
        if inner is None:
            inner = getattr(coro, "_coro", None)  # a wrapper that keeps the coroutine
        coro = inner
    return frames


def _ours(frame: FrameType) -> bool:
    parts = PurePath(frame.f_code.co_filename).parts
    return any(p in PACKAGES for p in parts[-4:-1])


def describe_frames(frames: Sequence[FrameType]) -> tuple[str, ...]:
    """``Class.method (package/module.py:line)`` for each of the project's frames."""
    out = []
    for frame in frames:
        if not _ours(frame):
            continue
        parts = PurePath(frame.f_code.co_filename).parts
        start = max(i for i, p in enumerate(parts) if p in PACKAGES)
        path = "/".join(parts[start:])
        out.append(f"{frame.f_code.co_qualname} ({path}:{frame.f_lineno})")
    return tuple(out)


def party_of(frames: Sequence[FrameType]) -> str | None:
    """The party named by the innermost frame whose object names one (``wait_party``); else
    an ``engine`` variable of the innermost frame of the project that is not the runtime's."""
    for frame in reversed(frames):
        hook = getattr(frame.f_locals.get("self"), "wait_party", None)
        if callable(hook):
            return str(hook())
    inner = [f for f in frames if _ours(f) and not f.f_code.co_filename.endswith("runtime.py")]
    if inner:
        for name in ("engine", "engine_id"):
            value = inner[-1].f_locals.get(name)
            if isinstance(value, str):
                return value
    return None


@dataclass(frozen=True)
class WaitGraph:
    """Every waiting task of a run at one moment, and the root of their waits."""

    waits: tuple[TaskWait, ...]

    def lines(self) -> tuple[str, ...]:
        return tuple(w.line() for w in sorted(self.waits, key=_order))

    def root(self, start: str = "loop") -> str:
        """Follow the first task edge from ``start`` (the run's main task; else the task
        waiting longest) until a task waits on no task (the root: what it waits on) or a
        task is met again (a cycle, which nothing from outside will break)."""
        by_name = {w.task: w for w in self.waits}
        if not by_name:
            return "no task is waiting"
        current = by_name.get(start) or min(self.waits, key=_order)
        path = [current.task]
        while current.on_tasks:
            follow = next((t for t in current.on_tasks if t in by_name), None)
            if follow is None:
                break
            if follow in path:
                cycle = [*path[path.index(follow) :], follow]
                return "a cycle: " + " -> ".join(f"'{t}'" for t in cycle)
            current = by_name[follow]
            path.append(follow)
        chain = " -> ".join(f"'{t}'" for t in path)
        party = f" on {current.party}" if current.party else ""
        since = "" if current.since is None else f" since t={current.since:.6g}"
        return f"{chain}: waits{party} ({current.awaits}){since}"

    def parties(self) -> tuple[str, ...]:
        return tuple(sorted({w.party for w in self.waits if w.party}))


def _order(wait: TaskWait) -> tuple[float, str]:
    return (wait.since if wait.since is not None else float("inf"), wait.task)


def graph_of(waits: Iterable[TaskWait]) -> WaitGraph:
    return WaitGraph(tuple(waits))
