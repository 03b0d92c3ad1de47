"""miles' FIFO ticket lock over a store, as a state machine: who holds it, who waits, and the
holder that raised and kept it.

miles (``miles/utils/distributed_lock.py``: ``StoreTicketLock``, sii-avalanche ``4d412b5a``;
radixark's copy not stored, inferred identical): ``acquire`` draws ``ticket = add(next, 1) - 1``
and polls ``add(serving, 0)`` until it equals the ticket; ``release`` adds 1 to ``serving``.
``__exit__`` releases only when no exception left the block ("Failing closed: the failed
holder's remote work may outlive the exception"), and there is no lease: a holder that raises
and lives on keeps the lock, and every ticket behind it waits for ever. ``protocols/
broadcast.py`` (``UpdateWeightFromDistributed.__init__``, ``send_bucket``, ``069a4115``) holds
it around each bucket when ``pp.size > 1``: lock -> broadcast -> clear -> unlock.

``TicketLockState`` is the pure machine (tested alone); ``TicketLock`` waits on it with a
Runtime and names the holder to the wait-for graph (``wait_party``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from miles_core.runtime import Runtime, Signal
from miles_core.sync import Notifier


@dataclass(frozen=True)
class FailedHolder:
    """The holder that raised inside the lock and kept it (fail closed)."""

    rank: int
    ticket: int
    reason: str
    t: float


@dataclass
class TicketLockState:
    """``next`` and ``serving`` as the store keeps them, and who drew each ticket."""

    next: int = 0
    serving: int = 0
    drawn: dict[int, int] = field(default_factory=dict)
    """Ticket -> the rank that drew it (until served and released)."""
    failed: FailedHolder | None = None

    def draw(self, rank: int) -> int:
        """``store.add(next, 1) - 1``: the rank's ticket, in the order drawn."""
        ticket, self.next = self.next, self.next + 1
        self.drawn[ticket] = rank
        return ticket

    def served(self, ticket: int) -> bool:
        """Whether ``ticket`` holds the lock (``add(serving, 0) == ticket``)."""
        return self.serving == ticket

    def release(self, ticket: int) -> None:
        """``store.add(serving, 1)`` by the holder (miles asserts it holds a ticket)."""
        if not self.served(ticket):
            raise AssertionError(f"ticket {ticket} released while {self.serving} is served")
        del self.drawn[ticket]
        self.serving += 1

    def fail_closed(self, ticket: int, reason: str, t: float) -> None:
        """The holder raised in the block: ``__exit__`` does not release; nothing expires."""
        if not self.served(ticket):
            raise AssertionError(f"ticket {ticket} raised while {self.serving} is served")
        self.failed = FailedHolder(self.drawn[ticket], ticket, reason, t)

    @property
    def holder(self) -> int | None:
        """The rank whose ticket is served, if one drew it."""
        return self.drawn.get(self.serving)

    @property
    def waiting(self) -> tuple[tuple[int, int], ...]:
        """(ticket, rank) of every ticket drawn and not yet served, in FIFO order."""
        return tuple((t, r) for t, r in sorted(self.drawn.items()) if t > self.serving)


class TicketLock:
    """A ``TicketLockState`` that coroutines wait on (one per cell's ranks, per incarnation:
    the store lives in rank 0's process and dies with it)."""

    def __init__(self, rt: Runtime, name: str) -> None:
        self._rt = rt
        self.name = name
        self.state = TicketLockState()
        self._changed = Notifier(rt)
        self._since = 0.0

    async def acquire(self, ticket: int, *give_up: Signal) -> bool:
        """Wait until ``ticket`` is served (True), or until one of ``give_up`` fires (False:
        a timeout, the process's death). With no ``give_up`` a failed holder is waited on
        for ever, as miles' poll loop does."""
        state = self.state
        while not state.served(ticket):
            if await self._rt.wait_any([self._changed.wait(), *give_up]) > 0:
                return False
        self._since = self._rt.now()
        return True

    def release(self, ticket: int) -> None:
        self.state.release(ticket)
        self._changed.notify()

    def fail_closed(self, ticket: int, reason: str) -> None:
        self.state.fail_closed(ticket, reason, self._rt.now())

    def wait_party(self) -> str:
        """How the wait-for graph names what a task blocked in ``acquire`` waits on: the
        ticket served, its rank, and whether that rank raised holding it."""
        state = self.state
        waiting = ", ".join(f"ticket {t} (rank {r})" for t, r in state.waiting) or "none"
        failed = state.failed
        if failed is not None and failed.ticket == state.serving:
            return (
                f"{self.name}: ticket {failed.ticket} held by rank {failed.rank}, which raised "
                f"holding it at t={failed.t:.6g} and stays alive (fail closed, no lease: "
                f"{failed.reason}); waiting: {waiting}"
            )
        holder = state.holder
        if holder is None:
            return f"{self.name}: free (serving ticket {state.serving}); waiting: {waiting}"
        return (
            f"{self.name}: ticket {state.serving} held by rank {holder} since "
            f"t={self._since:.6g}; waiting: {waiting}"
        )
