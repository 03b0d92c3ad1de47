"""A trainer cell's weight-update ticket lock in the Ray world, under today's miles profile:
each rank's part of each bucket's send taken in the lock, the fault that raises holding it,
and the lock's state read back from the store for the driver (the simulator's twin:
sim/world/ticket_locks.py; the pure model: miles_core/ticket_lock.py).

miles holds ``StoreTicketLock`` (miles/utils/distributed_lock.py, 4d412b5a) around each
bucket's broadcast when ``pp.size > 1`` (protocols/broadcast.py ``send_bucket``, 069a4115:
lock -> broadcast -> clear -> unlock), over a ``TCPStore`` on rank 0
(``create_world_ticket_lock``). The testbed has no pipeline stages: a cell of several ranks
stands for them, and its lock lives in the cell's own rendezvous store (the world's
``TCPStore`` under the prefix of the cell's torch world, ``cell{i}.{incarnation}``), so a
new incarnation has a fresh lock, as miles' store dies with rank 0. Each rank draws its
ticket in rank order (a barrier of the cell between draws, so the tickets are the
simulator's), waits for its turn, and does its part: rank 0 broadcasts, the others have
nothing to send once the gather is done.

Two keys miles does not write are written beside its own, for the wait-for graph and the
failure's reason only: who drew each ticket, and what a holder raised (nothing reads them
to decide anything).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from backends.common.wire.ticket_lock import POLL_SECONDS, StoreTicketLock

LOCK = "weight-update-lock"
"""The lock's key prefix in the cell's store (miles: the ``prefix`` of its lock)."""


class RankTicketLock(StoreTicketLock):
    """One rank's ``StoreTicketLock`` over its cell's store that also writes which rank drew
    each ticket (``{LOCK}/drawn/{ticket}``) and what a holder raised (``{LOCK}/raised/
    {ticket}``); it acquires, fails closed and releases exactly as miles' lock does."""

    def __init__(self, store: Any, rank: int, poll_interval: float = POLL_SECONDS) -> None:
        super().__init__(store, LOCK, poll_interval)
        self.rank = rank

    def draw(self) -> int:
        ticket = super().draw()
        self._store.set(f"{LOCK}/drawn/{ticket}", str(self.rank))
        return ticket

    def failed(self, raised: BaseException) -> None:
        """What the holder raised, written down; the lock stays held (fail closed)."""
        if self.held is not None:
            reason = f"{type(raised).__name__}: {raised}".splitlines()[0][:300]
            self._store.set(f"{LOCK}/raised/{self.held}", reason)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.failed(exc)
        super().__exit__(exc_type, exc, tb)


def send_in_turn(
    store: Any, rank: int, ranks: int, barrier: Callable[[], None], part: Callable[[], float]
) -> float:
    """This rank's ``part`` of a bucket's send in the cell's lock; its result. Every rank
    draws in rank order (``barrier``: the cell's, between draws), then waits for its ticket;
    a part that raises keeps the lock (miles' ``__exit__``) and the exception goes on, but
    for a failed collective (below)."""
    lock = RankTicketLock(store, rank)
    ticket = None
    for turn in range(ranks):
        if turn == rank:
            ticket = lock.draw()
        if turn < ranks - 1:
            barrier()
    lock.acquire(ticket)
    try:
        result = part()
    except RuntimeError:
        # the collective failed (gloo raises RuntimeError when a peer engine died or hung):
        # miles then kills the cell whose actors raised (RayTrainCell._execute_raw,
        # kill_on_failure: cell.py 02db69f3), store and lock with it, so its next update
        # meets a fresh lock; the testbed retries on the same cell, so the fresh lock is this
        # one released, as the simulator does (sim/world/ticket_locks.py, EngineFailure)
        lock.release()
        raise
    except BaseException as raised:
        lock.failed(raised)
        raise
    lock.release()
    return result


def raise_holding(store: Any, rank: int, message: str) -> str:
    """The fault raise_holding_lock's act in the rank's process: take the lock (waiting for
    its turn), raise ``message`` inside it, and catch it here, so that it reaches no one who
    would kill the cell; the lock stays held. What was raised."""
    lock = RankTicketLock(store, rank)
    try:
        with lock:
            raise RuntimeError(message)
    except RuntimeError as raised:
        return f"{type(raised).__name__}: {raised}"


def _read(store: Any, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


def describe(store: Any, world: str, name: str) -> tuple[str, bool]:
    """The lock of the cell whose torch world is ``world``, read from the world's ``store``
    (the ranks' keys are under that prefix), as the wait-for graph names it: the ticket
    served, its rank, whether that rank raised holding it, and the tickets waiting (the
    simulator's words, miles_core/ticket_lock.py ``wait_party``, less the time of the raise);
    and whether rank 0 waits in it."""
    key = f"{world}/{LOCK}"
    drawn, serving = store.add(f"{key}/next", 0), store.add(f"{key}/serving", 0)
    ranks = {t: _read(store, f"{key}/drawn/{t}") or "?" for t in range(serving, drawn)}
    waiting = [(t, r) for t, r in ranks.items() if t > serving]
    listed = ", ".join(f"ticket {t} (rank {r})" for t, r in waiting) or "none"
    rank0 = any(r == "0" for _, r in waiting)
    if serving >= drawn:
        return f"{name}: free (serving ticket {serving}); waiting: {listed}", rank0
    raised = _read(store, f"{key}/raised/{serving}")
    holder = f"{name}: ticket {serving} held by rank {ranks[serving]}"
    if raised is not None:
        holder += f", which raised holding it and stays alive (fail closed, no lease: {raised})"
    return f"{holder}; waiting: {listed}", rank0


class LockWait:
    """A bucket's calls awaited while the cell's lock is taken: names the lock to the
    wait-for graph (miles_core/waits.py reads ``wait_party`` from the frames of a waiting
    task), as the simulator's ``TicketLock`` does."""

    def __init__(self, party: Callable[[], str]) -> None:
        self._party = party

    def wait_party(self) -> str:
        return self._party()

    async def wait(self, call: Any) -> Any:
        return await call
