"""What a simulated engine's weights hold, as a content id the world reads off them.

The simulator moves no bytes; under the ``today`` profile it keeps, per engine process,
the version each bucket it loaded came from, and answers a stamp with the id of that
content, the updater comparing it with the id of what the trainer sent (WeightsChecked),
as the Ray world compares sha256 checksums of real tensors (backends/common/engine/
updates.py ``weights_checksum``). An engine that answers a load without loading
(the lying_engine fault, tokenspeed #1373) keeps its old id, and the weights oracle
catches it from the id, not from the fault. A process that loaded buckets of two
versions answers ``mixed``; whether it loaded every bucket of an update is the
BucketReceived rule's to judge (the world here knows no bucket count).
"""

from __future__ import annotations

from collections.abc import Mapping

INITIAL = "sim:initial"
"""A new process's weights: its checkpoint's, before any update loaded it."""


def sent(version: int) -> str:
    """The id of the weights an update to ``version`` sends (the trainer's, whole)."""
    return f"sim:v{version}"


def held(loaded: Mapping[int, int]) -> str:
    """The id of what a process holds: bucket index -> the version it was loaded from."""
    versions = set(loaded.values())
    if not versions:
        return INITIAL
    if len(versions) == 1:
        return sent(versions.pop())
    return "sim:mixed:" + ",".join(f"{b}={v}" for b, v in sorted(loaded.items()))
