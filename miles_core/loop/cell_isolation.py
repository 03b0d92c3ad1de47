"""Today's per-cell isolation of a weight update, and its two deadlines (the ``today`` profile).

Today's miles bounds every client call of an update to a rollout cell by
--update-weight-engine-request-timeout (300 s): ``_RolloutCellUpdater.submit_client_call``
wraps each in ``asyncio.wait_for``, and any exception (a failure, an error answer, the
deadline) marks that cell errored, "can no longer be updated"; its later calls return None at
once (weight_update/rollout_cell_updater.py, 3eacefd0; the cell-session line,
``_PerCellEngineSession._call``, cell_session.py 2209c9c0). The update goes on with the other
cells and reports the failed ones (updater.py ``WeightUpdateReport(failed_cell_ids)``,
2209c9c0). On the trainer side ``TrainerController.update_weights`` gives one trainer cell's
update --update-weights-timeout (600 s), after which that cell is given up and the update
fails over (``_execute_first_alive(..., timeout=args.update_weights_timeout)``).

Here an engine is a rollout cell. A given-up process: an ``EngineGivenUp`` event, out of
rotation (the router too), no further call of this update (so no stamp: it cannot serve the
new version's number on old weights), and, under --use-fault-tolerance, replaced now, as
today's errored cells are terminated and brought back (README id 68994028458:
``_terminate_errored_cell``); its new process is synced before it serves. Without fault
tolerance it stays down, as an errored cell does with no controller.

What is modelled of the trainer ranks' agreement (``InferenceCellHealth.synchronize``,
inference_cell_health.py 4730153b, all-gathers each rank's errored cells): here the control
plane makes each call once, for every rank, so the errored set is one decision, the one every
rank would agree on; a rank that saw an engine fail where another did not is not modelled.

Kept as miles has it: LoRA updates are not isolated ("per-inference-cell failure isolation is
not supported for LoRA weight sync", ``WeightUpdater._build_cell_session``, 2209c9c0), and a
bucket's transfer is not a control call: a member failing it fails the attempt, as before; a
flush refused on all --flush-cache-max-retries still ends the run (FlushTimeoutError: each
refusal is an answer, and whether today's session catches miles' TimeoutError was not read). If
every engine of an update was given up before it published, the update fails as an engine
failure did (nothing is left to publish to).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from miles_core.backend import CellFailure, EngineFailure, SessionAlreadyOpen
from miles_core.events import EngineGivenUp
from miles_core.loop.context import RunContext
from miles_core.loop.engine_calls import EngineCall
from miles_core.loop.supervision import EngineSupervisor

Answered = Callable[[str, "str | None"], None]
"""As miles_core.loop.update.Answered: told each engine that answered, and its answer."""


class CellIsolation:
    """The today profile's engine-request deadline and give-up, and the trainer cell's
    update deadline, for one Updater."""

    def __init__(
        self,
        ctx: RunContext,
        engines: EngineSupervisor,
        replace: Callable[[str, int, str], None],
    ) -> None:
        self.ctx = ctx
        self.engines = engines
        self.replace = replace
        self.given_up: dict[tuple[str, int], str] = {}
        """Every process given up, and why: an errored process stays errored (its calls return
        at once) until it is replaced; its successor is another key."""
        self.update_id = -1
        self.cell = -1
        """The update attempt being made, and its cell (``begin``)."""

    @property
    def active(self) -> bool:
        """Whether engine calls are isolated: the today profile, but not for LoRA."""
        config = self.ctx.config
        return config.today and config.lora_adapter is None

    def begin(self, update_id: int, cell: int) -> None:
        self.update_id, self.cell = update_id, cell

    async def call(
        self, engine: str, incarnation: int, call: EngineCall, answered: Answered
    ) -> None:
        """One control call within --update-weight-engine-request-timeout; a failure or no
        answer gives up that engine (``give_up``) instead of failing the update. A refusal
        (RequestRefused: /flush_cache while requests hold KV) is for the caller to retry."""
        if (engine, incarnation) in self.given_up:
            return  # miles: an errored cell's later calls return None at once
        ctx = self.ctx
        if not ctx.engines.current(engine, incarnation):
            self.give_up(engine, incarnation, call.name, "its process was replaced")
            return
        timeout = ctx.config.update_weight_engine_request_timeout
        try:
            task = ctx.rt.spawn(
                call.make(ctx.cluster.engine(engine, incarnation)),
                f"{call.name}-{engine}.{incarnation}",
            )
            try:
                if await ctx.rt.wait_any([task, ctx.rt.timer(timeout)]) == 1:
                    task.cancel(f"{call.name} outlived its deadline")
                    reason = (
                        f"no answer to {call.name} within {timeout:g}s "
                        "(--update-weight-engine-request-timeout)"
                    )
                    self.give_up(engine, incarnation, call.name, reason)
                    return
            except BaseException:  # the update was cancelled: its call must not go on
                task.cancel(f"the update's {call.name} was cancelled")
                raise
            answer = await task
        except EngineFailure as failure:
            self.give_up(engine, incarnation, call.name, failure.reason)
            return
        except SessionAlreadyOpen:
            answer = None  # an aborted attempt of this update left it open: load into it
        answered(engine, answer)

    def give_up(self, engine: str, incarnation: int, call: str, reason: str) -> None:
        """That process can no longer be updated: recorded, out of rotation, its cell's
        group remade at the next connect (a member is lost), and replaced under fault
        tolerance."""
        if (engine, incarnation) in self.given_up:
            return
        ctx = self.ctx
        self.given_up[(engine, incarnation)] = reason
        ctx.emit(
            EngineGivenUp,
            update_id=self.update_id,
            engine=engine,
            incarnation=incarnation,
            call=call,
            reason=reason,
        )
        ctx.connections.member_failed(self.cell)
        self.engines.failed(engine, incarnation, f"{reason} (given up by the update)")
        if ctx.config.use_fault_tolerance and ctx.engines.current(engine, incarnation):
            self.replace(engine, incarnation, reason)

    def left(self, targets: dict[str, int]) -> dict[str, int]:
        """The targets not given up (the same mapping when none was)."""
        given_up = self.given_up
        if not given_up or not any(p in given_up for p in targets.items()):
            return targets
        return {e: i for e, i in targets.items() if (e, i) not in given_up}

    def not_replaced(self, targets: dict[str, int]) -> dict[str, int]:
        """Before a bucket goes: a process replaced since the update began is given up (it
        holds none of the earlier buckets), and the bucket goes to the others."""
        targets = self.left(targets)
        while (gone := self.ctx.engines.replaced(targets)) is not None:
            self.give_up(gone, targets[gone], "send_bucket", "its process was replaced")
            targets = self.left(targets)
        return targets

    def check_some_left(self, targets: dict[str, int]) -> None:
        """Every engine of the update given up: it fails as an engine failure (nothing to
        publish to), and the retry finds the engines still live."""
        if targets and not self.left(targets):
            engine, incarnation = next(reversed(targets.items()))
            raise EngineFailure(engine, self.given_up[(engine, incarnation)])

    async def bounded(
        self, attempt: Coroutine[Any, Any, None], cell: int, published: Callable[[], bool]
    ) -> None:
        """One trainer cell's update within --update-weights-timeout: past it, unless it has
        published (done is done), the attempt is cancelled and the cell fails (CellFailure),
        so the update fails over to the next alive cell."""
        ctx = self.ctx
        timeout = ctx.config.update_weights_timeout
        task = ctx.rt.spawn(attempt, f"update_weights-cell-{cell}")
        try:
            if await ctx.rt.wait_any([task, ctx.rt.timer(timeout)]) == 1 and not published():
                task.cancel(f"update_weights outlived {timeout:g}s")
                raise CellFailure(
                    cell,
                    f"its update_weights did not finish within {timeout:g}s "
                    "(--update-weights-timeout)",
                )
        except CellFailure:
            raise
        except BaseException:
            task.cancel("the update was cancelled")
            raise
        await task
