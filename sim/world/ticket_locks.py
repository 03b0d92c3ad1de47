"""Each simulated cell's weight-update ticket lock, under today's miles profile (the Ray
world's twin: backends/common/wire/ticket_lock.py in its trainer ranks).

miles holds ``StoreTicketLock`` (miles/utils/distributed_lock.py, 4d412b5a) around each
bucket's broadcast when ``pp.size > 1`` (protocols/broadcast.py ``send_bucket``, 069a4115);
the testbed has no pipeline stages, so a cell of several ranks stands for them here: every
rank draws a ticket for each bucket, in rank order (the real ranks race for theirs), rank 0's
part is the broadcast and the others' take no time. The store lives in rank 0's process, so
a new incarnation of the cell has a new lock. A holder that raises keeps the lock (fail
closed, no lease): rank 0's next broadcast waits for it, the engines wait in the collective
for rank 0, and at the collective's timeout the cell is named as the member that took no
part, as in the Ray world.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from miles_core.backend import EngineFailure
from miles_core.runtime import Cancelled
from miles_core.scenario.faults import LOCK_RAISED
from miles_core.ticket_lock import TicketLock
from sim.world.cells import SimCell
from sim.world.runtime import SimRuntime


class SimTicketLocks:
    """The cells' locks; ``on``: today's profile (sim/run.py sets it)."""

    def __init__(self, rt: SimRuntime, cells: Sequence[SimCell], ranks: int) -> None:
        self.rt = rt
        self.cells = cells
        self.ranks = ranks
        self.on = False
        self._locks: dict[int, tuple[int, TicketLock]] = {}

    def lock(self, cell: int) -> TicketLock | None:
        """The cell's lock for its current processes; None where miles takes none."""
        if not self.on or self.ranks < 2:
            return None
        incarnation = self.cells[cell].incarnation
        kept = self._locks.get(cell)
        if kept is None or kept[0] != incarnation:  # rank 0's store died with its process
            name = f"cell {cell}'s weight-update lock (process {incarnation})"
            kept = self._locks[cell] = (incarnation, TicketLock(self.rt, name))
        return kept[1]

    def raise_holding(self, cell: int, rank: int) -> None:
        """The fault's act: the rank draws a ticket and, once served, raises inside the lock
        and lives on (its ``__exit__`` does not release)."""
        lock = self.lock(cell)
        if lock is None:
            return
        ticket = lock.state.draw(rank)
        if lock.state.served(ticket):
            lock.fail_closed(ticket, f"RuntimeError: {LOCK_RAISED}")
        else:
            self.rt.spawn(self._raise_when_served(lock, ticket), f"lock-raise-{cell}-{rank}")

    async def _raise_when_served(self, lock: TicketLock, ticket: int) -> None:
        if await lock.acquire(ticket):
            lock.fail_closed(ticket, f"RuntimeError: {LOCK_RAISED}")

    async def send(
        self, cell: int, bucket: int, timeout: float, broadcast: Callable[[], Awaitable[float]]
    ) -> float:
        """``broadcast`` (rank 0's part) under the cell's lock, every rank taking its turn;
        a broadcast that raises keeps the lock, as miles' ``__exit__`` does."""
        lock = self.lock(cell)
        if lock is None:
            return await broadcast()
        source = self.cells[cell]
        tickets = [lock.state.draw(rank) for rank in range(self.ranks)]
        served = lock.state.served(tickets[0]) or await lock.acquire(
            tickets[0], self.rt.timer(timeout), source._death
        )
        if not served:
            if source.dead:
                raise source.failure(f"killed sending bucket {bucket}")
            raise source.failure(
                f"took no part in the broadcast of bucket {bucket}: the group waited "
                f"{timeout:g}s for it (rank 0 waited for {lock.wait_party()})"
            )
        try:
            stalled = await broadcast()
        except Cancelled:
            # the driver stopped waiting (it died, or gave the cell up): in miles the ranks
            # run their bucket loop inside one actor call (placement_group.update_weights,
            # 0167d10d) that the driver's end does not raise into, so no rank raised here
            self._release(lock, tickets)
            raise
        except EngineFailure:
            # a peer engine's death ends the broadcast on every rank; miles then kills the
            # cell whose actors raised (RayTrainCell._execute_raw, kill_on_failure: cell.py
            # 02db69f3), its rank 0's store and the lock with it, so its next update meets a
            # fresh lock. The testbed retries on the same cell: the fresh lock is the one
            # released here (failed closed, it stalled that retry for the collective timeout:
            # swarm seed 173 --aim kill_engine@during_recovery:bucket_last)
            self._release(lock, tickets)
            raise
        except BaseException as raised:
            lock.fail_closed(tickets[0], f"{type(raised).__name__}: {raised}")
            raise
        self._release(lock, tickets)
        return stalled

    @staticmethod
    def _release(lock: TicketLock, tickets: list[int]) -> None:
        for ticket in tickets:  # the other stages' parts take no time here
            lock.release(ticket)
