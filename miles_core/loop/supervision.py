"""The engine supervisor: which engine processes serve, and routing requests to them.

Where each decision is made:

- a request goes to the serving engine with the fewest requests in flight
  (ties broken by the "router" random stream), addressed to its current
  process (incarnation);
- a failed call takes that process out of rotation (DOWN); the failure of a
  process that was already replaced is stale news and changes nothing but this:
  a process out of rotation, for whatever reason, is also taken out of the
  world's router by its address (``_unroute``), and what it still serves is
  aborted. miles does it in ``SGLangEngine.shutdown``, called through the actor
  (since #100; before, the health monitor only ``ray.kill``-ed the actor), so a
  server whose actor is lost stays in the router, serving old weights to requests
  the control plane never sees go there: an orphan;
- a new process reported by the world serves at once only if no version was
  ever reserved (its initial weights are then the current ones); otherwise it
  waits out of rotation for a sync (``on_unsynced``) or the next update; under
  today's miles (``[miles] profile = "today"``) for the next full update only: no
  sync is asked (its cell is pending weights until ``mark_weights_ready``).
- a process that answers under a version the control plane cannot trust (one
  it cannot read, below its last stamp, or beyond any version issued: SGLang's
  /update_weight_version takes any string from anyone) is out of sync: out of
  rotation and re-synced to the published version (``out_of_sync``), never a
  crash of the run.

The states and their transitions are miles_core.engines' table.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable

from miles_core.engines import EngineState
from miles_core.errors import NoLiveEngineError
from miles_core.events import EngineExited, EngineStarted, OrphanRemoved
from miles_core.loop.context import RunContext


class EngineSupervisor:
    def __init__(self, ctx: RunContext, on_unsynced: Callable[[str], None]) -> None:
        self.ctx = ctx
        self.on_unsynced = on_unsynced
        self.load: dict[str, int] = dict.fromkeys(ctx.engines.ids, 0)
        """Requests in flight per engine (``acquire`` / ``release`` keep it)."""
        self._by_load: dict[int, list[int]] = {}
        """The serving engines by their load, each list sorted (engines by their rank, their
        place among the serving ids sorted): ``pick``'s candidates without a scan of every
        engine per request (256 engines, 512 requests a step), kept sorted by comparing
        ints, not ids."""
        self._indexed: tuple[str, ...] | None = None
        """The serving engines ``_by_load`` holds (rebuilt when the set changes)."""
        self._sorted: tuple[str, ...] = ()
        """Those engines sorted by id: a rank's engine."""
        self._rank: dict[str, int] = {}
        self._router = ctx.rt.rng("router")
        """The ties' stream, looked up once (the same object for the whole run: rt.rng)."""
        self._stamps: dict[str, tuple[int, int]] = {}
        """Engine -> (process, version) of the last stamp that process answered."""
        self._resumed: dict[str, tuple[int, int]] = {}
        """Engine -> (process, version) of the stamp it was last resumed with: what it holds
        from then on, and what its answers are checked against (``untrusted_version``)."""

    def serving(self) -> tuple[str, ...]:
        return self.ctx.engines.serving()

    async def pick(self) -> tuple[str, int]:
        """The engine (and its process) for the next request; waits while none serves."""
        ctx = self.ctx
        while not ctx.engines.serving():
            await ctx.engines_changed.wait()
        return self.pick_now()

    def pick_now(self) -> tuple[str, int]:
        """The serving engine with the fewest requests in flight, and its process; a tie is
        drawn from the "router" stream among the tied engines sorted by id. At least one
        engine must serve (``pick`` waits for one)."""
        ctx = self.ctx
        candidates = ctx.engines.serving()
        if candidates is not self._indexed:
            self._index(candidates)
        by_load = self._by_load
        engine = self._sorted[self._router.choice(by_load[min(by_load)])]
        return engine, ctx.engines.incarnation(engine)

    def acquire(self, engine: str) -> None:
        """A request was sent to ``engine``."""
        self._move(engine, 1)

    def release(self, engine: str) -> None:
        """A request to ``engine`` ended (answered or not)."""
        self._move(engine, -1)

    def _index(self, serving: tuple[str, ...]) -> None:
        by_load: dict[int, list[int]] = {}
        ordered = tuple(sorted(serving))
        for rank, engine in enumerate(ordered):
            by_load.setdefault(self.load[engine], []).append(rank)
        self._by_load, self._indexed, self._sorted = by_load, serving, ordered
        self._rank = {engine: rank for rank, engine in enumerate(ordered)}

    def _move(self, engine: str, delta: int) -> None:
        before = self.load[engine]
        self.load[engine] = after = before + delta
        rank = self._rank.get(engine)
        if rank is None:  # not serving
            return
        by_load = self._by_load
        old = by_load[before]
        if len(old) == 1:
            del by_load[before]
        else:
            del old[bisect_left(old, rank)]
        new = by_load.get(after)
        if new is None:
            by_load[after] = [rank]
        else:
            insort(new, rank)

    def failed(self, engine: str, incarnation: int, reason: str) -> None:
        """A call to that process failed: out of rotation, unless it was already replaced.

        Without fault tolerance nothing brings an engine back but an operator, so losing the
        last live one ends the run with a clear error instead of a stall, once a restart had
        its chance."""
        ctx = self.ctx
        self._unroute(engine, incarnation)
        if not ctx.engines.failed(engine, incarnation, reason):
            return
        ctx.record_engines()
        if not ctx.config.use_fault_tolerance and not ctx.engines.live():
            ctx.spawn(self._lost(engine, reason), "every-engine-lost")

    def _unroute(self, engine: str, incarnation: int) -> None:
        """That process is out of rotation: out of the router too, whatever became of its
        actor; the world says whether its server was still there."""
        if self.ctx.cluster.router.remove_worker(engine, incarnation):
            self.ctx.emit(OrphanRemoved, engine=engine, incarnation=incarnation)

    async def _lost(self, engine: str, reason: str) -> None:
        """Every engine is down and no recovery will come: end the run, unless a process the
        world restarts (an operator's) answers within the health check's timeout."""
        ctx = self.ctx
        patience = ctx.config.rollout_health_check_timeout
        await ctx.rt.sleep(patience)
        if not ctx.engines.live() and not ctx.stopping:
            ctx.fail(
                NoLiveEngineError(
                    f"every rollout engine is down (the last, {engine}: {reason}) and none came "
                    f"back within {patience:g}s; --use-fault-tolerance is off, so nothing "
                    "recovers them: enable it, or restart the job"
                ),
                "the engine supervisor",
            )

    def started(self, engine: str, incarnation: int, how: str) -> None:
        """The world reports a new process: it holds initial weights and no version."""
        ctx = self.ctx
        ctx.emit(EngineStarted, engine=engine, incarnation=incarnation, how=how)
        if not ctx.engines.started(engine, incarnation, f"new process: {how}"):
            return  # not newer than the process already known
        pristine = ctx.ledger.current is None and ctx.ledger.reservation is None
        if pristine:
            ctx.engines.synced(
                engine,
                incarnation,
                "no version was ever reserved: its initial weights are the current ones",
            )
        ctx.record_engines()
        if not pristine and not ctx.config.today:  # 31f1ca9: recover_updatable_engines
            self.on_unsynced(engine)
        # today's miles: pending weights, it joins the router only when the next full update
        # marks its weights ready (server_cell.py ServerCell.mark_weights_ready, b8afde1e)

    def exited(self, engine: str, incarnation: int, how: str) -> None:
        """The world reports that process gone: out of rotation (unless already replaced)."""
        self.ctx.emit(EngineExited, engine=engine, incarnation=incarnation, how=how)
        self.failed(engine, incarnation, f"process exited: {how}")

    def outdated(self, engine: str, reason: str) -> None:
        """The published version moved past this engine's weights (a resumed run)."""
        self.ctx.engines.outdated(engine, reason)
        self.ctx.record_engines()
        self.on_unsynced(engine)

    def record_stamp(self, engine: str, incarnation: int, version: int) -> None:
        """That process answered a stamp with ``version``; it holds it once resumed."""
        self._stamps[engine] = (incarnation, version)

    def stamp_of(self, engine: str, incarnation: int) -> int | None:
        """The version that process was stamped with before its last resume, or None (never
        stamped): an answer that arrives after that resume was generated after it (a paused
        engine generates nothing), so it reports that version or a newer one."""
        known = self._resumed.get(engine)
        return known[1] if known is not None and known[0] == incarnation else None

    def out_of_sync(self, engine: str, incarnation: int, reason: str) -> None:
        """That process answered under a version the control plane cannot trust: out of
        rotation, and re-synced (stamped with the published version again) before it serves,
        as a process a resumed run outdated is. Before any version was published there is
        nothing to stamp it with: it is failed, and fault tolerance replaces it. A process
        already replaced, down or waiting for its sync needs nothing more."""
        ctx = self.ctx
        table = ctx.engines
        if not table.current(engine, incarnation) or table.state(engine) is not EngineState.SERVING:
            return
        why = f"out of sync: {reason}"
        if ctx.ledger.current is None:
            self.failed(engine, incarnation, f"{why}; no version was published to re-stamp it")
        else:
            self.outdated(engine, f"{why}; re-synced before it serves again")

    def synced(self, engines: dict[str, int], reason: str) -> None:
        """These processes were stamped and resumed: they serve the published weights."""
        for engine, incarnation in engines.items():
            self.ctx.engines.synced(engine, incarnation, reason)
            stamp = self._stamps.get(engine)
            if stamp is not None and stamp[0] == incarnation:
                self._resumed[engine] = stamp
        self.ctx.record_engines()

    def unsynced(self, engine: str) -> bool:
        return self.ctx.engines.state(engine) is EngineState.UNSYNCED
