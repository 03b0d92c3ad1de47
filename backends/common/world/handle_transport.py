"""Buckets by tensor handles in the Ray world: SGLang's /update_weights_from_tensor, miles'
colocated path (CUDA IPC on a GPU; a shared-memory file on CPU)."""

from __future__ import annotations

from collections.abc import Mapping

from backends.common.sglang import api
from backends.common.world.fanout import Fanout, version_field
from miles_core.backend import Delivery
from miles_core.transfer import Bucket


class HandleTransport(Fanout):
    """Buckets by tensor handles to engines on the trainer's own device (SGLang's
    /update_weights_from_tensor, miles' colocated path): the source rank packs each bucket
    into a shared buffer and sends its handle; each engine copies from it. CUDA IPC on a
    GPU; on CPU, a shared-memory file (torch's file_system strategy) stands in for it."""

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """No group: each bucket's handle goes to the processes it names (miles' colocated
        ``connect_rollout_engines`` maps ranks to engines, which this world does per bucket)."""

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        cluster = self.cluster
        cell = cluster.cells[source_cell]
        await self._checked(update_id, cell)
        started = cluster.rt.now()
        await self._cut(source_cell, bucket)
        shared = await self._all({"cell": cell.call("share_bucket", update_id, bucket)}, cell.index)
        handle, self.seconds = shared[0][0]  # the cell's rank 0 packed it
        send = api.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[handle], weight_version=version_field(version)
        )
        calls = {
            engine: cluster.engines[engine].request(
                incarnation, send.METHOD, send.ROUTE, api.body(send)
            )
            for engine, incarnation in sorted(engines.items())
        }
        await self._all(calls, source_cell)
        return await self._delivered(update_id, source_cell, bucket, engines, started)

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """p2p by handles: the bucket is packed once and its handle sent to every engine at
        once; one Delivery per engine."""
        started = self.cluster.rt.now()
        await self.send_bucket(update_id, source_cell, bucket, engines, version)
        seconds, checksum = self.cluster.rt.now() - started, self._checksums.get(update_id)
        return tuple(Delivery((e,), seconds, checksum) for e in sorted(engines))
