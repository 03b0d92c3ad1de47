"""miles' FIFO ticket lock over a torch.distributed store, as miles has it
(miles/utils/distributed_lock.py ``StoreTicketLock``, sii-avalanche 4d412b5a; radixark's copy
inferred identical), for the trainer ranks of a cell of several ranks under today's profile
(protocols/broadcast.py ``send_bucket``, 069a4115: lock -> broadcast -> clear -> unlock).

``{prefix}/next`` hands out tickets (``add(next, 1) - 1``), ``{prefix}/serving`` says whose
turn it is; ``__exit__`` releases only when nothing was raised in the block ("Failing closed:
the failed holder's remote work may outlive the exception"), and there is no lease: an
abandoned ticket blocks the queue for ever. The pure model is miles_core/ticket_lock.py.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

POLL_SECONDS = 0.01
"""miles' ``poll_interval`` default."""


class StoreTicketLock:
    """FIFO mutual exclusion over ``store`` (any torch.distributed Store: TCPStore, or a
    PrefixStore over one). Not reentrant."""

    def __init__(self, store: Any, prefix: str, poll_interval: float = POLL_SECONDS) -> None:
        self._store = store
        self.next_key = f"{prefix}/next"
        self.serving_key = f"{prefix}/serving"
        self._poll = poll_interval
        self.held: int | None = None
        """The ticket this process holds (None: not held)."""

    def __enter__(self) -> StoreTicketLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:  # fail closed: a holder that raised keeps the lock
            self.release()

    def draw(self) -> int:
        """``add(next, 1) - 1``: this process's place in the queue."""
        return int(self._store.add(self.next_key, 1)) - 1

    def acquire(self, ticket: int | None = None) -> int:
        """Draw a ticket (or take ``ticket``, drawn before) and wait, polling, until it is
        served; the ticket."""
        assert self.held is None, f"lock is already held with ticket {self.held}"
        ticket = self.draw() if ticket is None else ticket
        while self._store.add(self.serving_key, 0) != ticket:
            time.sleep(self._poll)
        self.held = ticket
        return ticket

    def release(self) -> None:
        assert self.held is not None, f"lock {self.serving_key} is not held, cannot release"
        self.held = None
        self._store.add(self.serving_key, 1)


def lock_state(store: Any, prefix: str) -> tuple[int, int]:
    """(next, serving) as the store holds them: tickets drawn, and the one served."""
    return store.add(f"{prefix}/next", 0), store.add(f"{prefix}/serving", 0)
