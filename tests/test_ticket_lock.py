"""miles' FIFO ticket lock (miles/utils/distributed_lock.py, 4d412b5a): the pure model
(miles_core/ticket_lock.py) and the real one over a TCPStore (backends/common/wire/
ticket_lock.py): FIFO order, fail closed, no lease."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from backends.common.wire.ticket_lock import StoreTicketLock, lock_state
from miles_core.ticket_lock import TicketLockState

# -- the pure model ------------------------------------------------------------------


def test_tickets_are_served_in_the_order_drawn() -> None:
    lock = TicketLockState()
    a, b, c = lock.draw(0), lock.draw(1), lock.draw(2)
    assert (lock.served(a), lock.served(b), lock.holder) == (True, False, 0)
    lock.release(a)
    assert lock.served(b) and lock.holder == 1 and lock.waiting == ((c, 2),)
    with pytest.raises(AssertionError):
        lock.release(c)  # not its turn


def test_a_holder_that_raised_keeps_the_lock_for_ever() -> None:
    lock = TicketLockState()
    a = lock.draw(1)
    b = lock.draw(0)
    lock.fail_closed(a, "RuntimeError: boom", 3.0)
    assert lock.failed is not None and (lock.failed.rank, lock.failed.ticket) == (1, a)
    assert not lock.served(b) and lock.holder == 1 and lock.waiting == ((b, 0),)


# -- the real lock over a TCPStore ------------------------------------------------------


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _client(store: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", store.port, is_master=False)


def test_the_store_lock_serves_threads_in_ticket_order(store: dist.TCPStore) -> None:
    first = StoreTicketLock(_client(store), "t", poll_interval=0.001)
    first.acquire()  # ticket 0 held: the others queue behind it in the order they draw
    order: list[int] = []
    threads = []
    for i in range(1, 4):
        lock = StoreTicketLock(_client(store), "t", poll_interval=0.001)

        def run(lock: StoreTicketLock = lock, i: int = i) -> None:
            with lock:
                order.append(i)

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        while lock_state(store, "t")[0] < i + 1:  # its ticket drawn before the next starts
            time.sleep(0.001)
    assert order == []
    first.release()
    for t in threads:
        t.join(timeout=10)
    assert order == [1, 2, 3]
    assert lock_state(store, "t") == (4, 4)


def test_a_store_lock_holder_that_raises_keeps_it_and_nothing_expires(
    store: dist.TCPStore,
) -> None:
    holder = StoreTicketLock(_client(store), "t", poll_interval=0.001)
    with pytest.raises(RuntimeError), holder:
        raise RuntimeError("raised holding it")
    assert holder.held == 0 and lock_state(store, "t") == (1, 0)
    waiter = StoreTicketLock(_client(store), "t", poll_interval=0.001)
    got = threading.Event()
    t = threading.Thread(target=lambda: (waiter.acquire(), got.set()), daemon=True)
    t.start()
    assert not got.wait(0.5)  # no lease: the queue stays blocked
    assert lock_state(store, "t") == (2, 0)
    holder.release()  # only the holder can let it go (miles: nobody does)
    assert got.wait(5)
    waiter.release()
    t.join(timeout=5)
