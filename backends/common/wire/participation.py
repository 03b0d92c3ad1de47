"""Who took part in each broadcast of a weight-update group, counted in the world's store.

A collective completes for nobody until every member takes part: a member that hung
(alive, answering nothing) or was cut off stalls every other member until the
group's timeout, and then each of them fails with the same timeout, which names no
one. So every member counts, in the group's own store, the broadcasts it entered,
before it enters one (``arrive``), and the transport, when a bucket's broadcast is
still stalled at the timeout, reads the counts (``absent``): a member short of the
bucket's number never took part in it, and is the one to blame. A member that died
is found otherwise and at once (its connections close; Ray reports the actor).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

KEY: Final = "taking-part"
"""Counts broadcasts entered."""
JOINED: Final = "joined"
"""Counts joins begun (one per group: the group's rendezvous)."""


def arrive(store: Any, rank: int, key: str = KEY) -> int:
    """Count one collective entered by ``rank`` in the group whose (prefix) store this is;
    the count so far."""
    return int(store.add(f"{key}/{rank}", 1))


def absent(store: Any, group: str, ranks: Iterable[int], number: int, key: str = KEY) -> list[int]:
    """The ranks of ``group`` that did not enter its ``number``-th collective of the kind
    ``key`` counts (0-based), read from the world's own store (the one every group's prefix
    store wraps)."""
    return [r for r in ranks if int(store.add(f"{group}/{key}/{r}", 0)) <= number]
