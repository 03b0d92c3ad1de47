"""disk-delta in the Ray world: real files in a temp directory of the run, written by the
updating cell's rank 0 and pulled by each engine server (backends/common/wire/disk_delta.py).

miles' sequence (``update_weight_from_distributed/delta.py`` ``UpdateWeightFromDiskDelta``
at 31f1ca9; ``protocols/delta.py`` ``_reload_engines`` at 0722a10d): the source ranks write
the version's delta files and the index, then rank 0 calls ``pull_weights(version)`` on
every engine (each applies the chain onto its local checkpoint, checksum-verified), pauses
them, flushes unless in_place, calls ``update_weights_from_disk(model_path=local
checkpoint, weight_version=str(version))`` and continues. Here each bucket is one shard
file (``model-{k}-of-{n}``), and the pulls and loads come with the last bucket, inside the
update's pause and session (miles pulls before its pause, opens no session; the update
plan here keeps one sequence for every transfer mode). Each engine has a local checkpoint
of its own (``local/{engine}``: every engine of this world shares one host; miles has one
per host) that outlives its processes. A refused pull fails the update naming its engine
("/pull_weights refused: ...", the witness's words).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path

from backends.common.engine.delta_routes import DELTA_ROOT_PREFIX
from backends.common.world.fanout import Fanout, TransportCluster
from miles_core.backend import Delivery, EngineFailure
from miles_core.disk_delta import DeltaEncoding, shard_name, version_dir
from miles_core.loop.config import LoopConfig
from miles_core.transfer import Bucket, plan_buckets
from miles_core.witness.delta import PULL_REFUSED


class DiskDeltaTransport(Fanout):
    def __init__(
        self, cluster: TransportCluster, encoding: DeltaEncoding, buckets: tuple[Bucket, ...]
    ) -> None:
        super().__init__(cluster)
        self.encoding, self.total = DeltaEncoding(encoding), len(buckets)
        self.root = Path(tempfile.mkdtemp(prefix=DELTA_ROOT_PREFIX))
        """The run's delta directory (and the engines' local checkpoints), removed with it."""
        weakref.finalize(self, shutil.rmtree, self.root, True)
        self.tear_next = False
        """The delta_torn fault: the next version's last shard is truncated once written."""

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """No group: the files are there for whoever pulls them."""

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        assert version is not None  # the updater sends every bucket with its version
        cluster = self.cluster
        cell = cluster.cells[source_cell]
        await self._checked(update_id, cell)
        started = cluster.rt.now()
        await self._cut(source_cell, bucket)
        args = (str(self.root), self.encoding.value, version, bucket, self.total)
        wrote = await self._all({"cell": cell.call("write_delta", *args)}, cell.index)
        self.seconds = wrote[0][0][1]  # the cell's rank 0
        if bucket.index == self.total - 1:
            if self.tear_next:
                self.tear_next = False
                shard = self.root / version_dir(version) / shard_name(bucket.index, self.total)
                shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
            pulls = {e: self._pull(e, i, version) for e, i in sorted(engines.items())}
            await self._all(pulls, cell.index)
        return await self._delivered(update_id, source_cell, bucket, engines, started)

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """Written once for every engine (plan_transfer plans disk-delta as a broadcast)."""
        sent = await self.send_bucket(update_id, source_cell, bucket, engines, version)
        return tuple(Delivery((e,), sent.seconds, sent.trainer_checksum) for e in sent.engines)

    async def _pull(self, engine: str, incarnation: int, version: int) -> None:
        """/pull_weights, then /update_weights_from_disk, on that process."""
        slot = self.cluster.engines[engine]
        local = str(self.root / "local" / engine)
        pull = {
            "local_checkpoint_dir": local,
            "source_dir": str(self.root),
            "target_version": version,
        }
        try:
            await slot.request(incarnation, "POST", "/pull_weights", pull)
        except EngineFailure as failure:
            if " answered 409: " not in failure.reason:
                raise
            raise EngineFailure(engine, f"{PULL_REFUSED}: {failure.reason}") from None
        load = {"model_path": local, "weight_version": str(version)}
        await slot.request(incarnation, "POST", "/update_weights_from_disk", load)


def delta_transport(cluster: TransportCluster, loop: LoopConfig) -> DiskDeltaTransport:
    """disk-delta's transport for a run of ``loop`` (its buckets as the updater plans them:
    the config refuses disk-delta with a LoRA adapter)."""
    units = cluster.units  # type: ignore[attr-defined]
    buckets = plan_buckets(units, loop.update_weight_buffer_size)
    return DiskDeltaTransport(cluster, loop.update_weight_delta_encoding, buckets)
