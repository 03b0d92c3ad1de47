"""disk-delta in the simulator: each bucket's delta file written by the updating cell, and on
the last one every engine pulls the version onto its local checkpoint and loads it.

No bytes move; what is kept is the bookkeeping the Ray world keeps over real files
(backends/common/wire/disk_delta.py), with miles_core/disk_delta.py's chain: each
version written (its index), whether its file is torn, and per engine its local
checkpoint: the applied-version marker and the version whose bytes it holds. An apply
onto the bytes of its base gives the version (xor and overwrite alike); onto its own
version, overwrite gives it again and xor its base (an involution); onto anything else
its checksum fails and the engine refuses the pull, nothing changed (the Ray world's
engine stages and verifies before it commits). A torn file fails the checksum too.
The engine loads what its checkpoint holds: the stamp's content id (contents.py) is
that version's, so the weights oracle reads a skipped or reverted apply off it.

Cost (the transport cost model): the source writes the payload bytes at
DISK_WRITE_BYTES_PER_S; each engine reads the chain's payloads and the whole model at
DISK_READ_BYTES_PER_S, at once with the others; the source waits for the slowest.
Payloads assume every byte of every tensor changed (an optimizer step moves every
weight's low bytes): xor is the tensor's size, overwrite five bytes per byte changed
plus a count (miles compresses each with zstd; not modelled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.backend import Delivery, EngineFailure
from miles_core.disk_delta import DeltaEncoding, DeltaError, DeltaIndex, plan_pull
from miles_core.loop.config import LoopConfig
from miles_core.transfer import Bucket, plan_buckets
from sim.world.contents import sent
from sim.world.transport import SimTransport, TransportCluster

DISK_WRITE_BYTES_PER_S = 2e9
"""The shared delta directory's write rate (a parallel file system, one writer)."""
DISK_READ_BYTES_PER_S = 4e9
"""A host's read rate of the delta files and of its local checkpoint."""


def payload_bytes(encoding: DeltaEncoding, bucket: Bucket) -> int:
    """The bytes of a bucket's delta file, every byte changed."""
    if encoding is DeltaEncoding.XOR:
        return bucket.payload_bytes
    return 5 * bucket.payload_bytes + 4 * len(bucket.spans)


@dataclass
class LocalCheckpoint:
    """One engine's host-local checkpoint (it outlives the engine's processes)."""

    applied: int = 0
    """The applied-version marker (miles: ``.delta_sync/state.json``)."""
    holds: int = 0
    """The version whose bytes it holds."""


class SimDeltaTransport(SimTransport):
    def __init__(
        self, cluster: TransportCluster, encoding: DeltaEncoding, buckets: tuple[Bucket, ...]
    ) -> None:
        super().__init__(cluster)
        self.encoding = DeltaEncoding(encoding)
        self.buckets = buckets
        self.written: dict[int, DeltaIndex] = {}
        self.torn: set[int] = set()
        self.checkpoints: dict[str, LocalCheckpoint] = {}
        self.tear_next = False
        """The delta_torn fault: the next version written is torn."""
        self.twice: set[str] = set()
        """The delta_applied_twice fault: these engines' next pull applies its last version
        a second time, after the verified apply (unverified)."""
        self.skip: set[str] = set()
        """The delta_skipped fault: these engines' next pull answers success, applying none."""

    def _check_group(self, source_cell: int, engines: Mapping[str, int]) -> None:
        """disk-delta has no group: the files are there for whoever pulls them."""

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        assert version is not None  # the updater sends every bucket with its version
        last = bucket.index == len(self.buckets) - 1
        write = payload_bytes(self.encoding, bucket) / DISK_WRITE_BYTES_PER_S
        pull = self._pull_seconds(engines, version) if last else 0.0
        stalled = await self._send(
            source_cell, bucket, engines, self._setup_seconds(bucket) + write + pull
        )
        if bucket.index == 0:
            self.torn.discard(version)  # written afresh (a retry of an update rewrites it)
        if last:
            self.written[version] = DeltaIndex(version, self.encoding)
            if self.tear_next:
                self.tear_next = False
                self.torn.add(version)
            self._pull_all(engines, version)
        checksum = sent(version) if self.cluster.reads_weights else None
        return Delivery(tuple(engines), stalled + write + pull, checksum)

    def _pull_seconds(self, engines: Mapping[str, int], version: int) -> float:
        model = sum(b.payload_bytes for b in self.buckets)
        delta = sum(payload_bytes(self.encoding, b) for b in self.buckets)
        behind = max((version - self._checkpoint(e).applied for e in engines), default=0)
        return (max(behind, 0) * delta + model) / DISK_READ_BYTES_PER_S

    def _checkpoint(self, engine: str) -> LocalCheckpoint:
        return self.checkpoints.setdefault(engine, LocalCheckpoint())

    def _pull_all(self, engines: Mapping[str, int], version: int) -> None:
        """/pull_weights then /update_weights_from_disk on each engine; the first refusal
        fails the send naming its engine (the others' pulls stand)."""
        refused: list[EngineFailure] = []
        for engine in engines:
            try:
                self._pull(engine, version)
            except DeltaError as error:
                refused.append(EngineFailure(engine, f"/pull_weights refused: {error}"))
                continue
            held = self._checkpoint(engine).holds
            process = self.cluster.engines[engine]
            for bucket in self.buckets:  # loaded from disk, whole (a lying engine loads none)
                process.load_bucket(bucket.index, held)
        if refused:
            raise refused[0]

    def _pull(self, engine: str, version: int) -> None:
        local = self._checkpoint(engine)
        chain = plan_pull(local.applied, version, self.written)
        if engine in self.skip:  # answers success, its marker and bytes as they were
            self.skip.discard(engine)
            return
        holds = local.holds
        for v in chain:  # staged: nothing is committed unless every version verifies
            if v in self.torn or holds != v - 1:
                why = "torn delta file" if v in self.torn else f"bytes of {holds}, not {v - 1}"
                raise DeltaError(f"checksum mismatch applying version {v} ({why})")
            holds = v
        local.applied, local.holds = max(local.applied, version), holds
        if engine in self.twice and chain:
            self.twice.discard(engine)
            if self.encoding is DeltaEncoding.XOR:  # an involution: back to the base's bytes
                local.holds = chain[-1] - 1


def arm_delta_fault(transport: object, kind: str, engine: str | None) -> None:
    """A disk-delta fault fired: the transport's next pull or write does it."""
    assert isinstance(transport, SimDeltaTransport), "delta faults need disk-delta (checked)"
    if kind == "delta_torn":
        transport.tear_next = True
    elif kind == "delta_applied_twice":
        assert engine is not None
        transport.twice.add(engine)
    else:
        assert engine is not None
        transport.skip.add(engine)


def delta_transport(cluster: TransportCluster, loop: LoopConfig) -> SimDeltaTransport:
    """disk-delta's transport for a run of ``loop`` (its buckets as the updater plans them;
    the config refuses disk-delta with a LoRA adapter)."""
    cluster.reads_weights = True  # WeightsChecked under both profiles: disk-delta runs are new
    units = cluster.units  # type: ignore[attr-defined]
    buckets = plan_buckets(units, loop.update_weight_buffer_size)
    return SimDeltaTransport(cluster, loop.update_weight_delta_encoding, buckets)
