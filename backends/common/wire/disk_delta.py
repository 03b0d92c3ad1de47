"""disk-delta's files: the trainer's publish and an engine's local checkpoint, over real files.

Layout (miles: ``update_weight_from_distributed/delta.py`` ``_write_delta_files`` at
31f1ca9, ``protocols/delta.py`` at 0722a10d)::

    {root}/weight_v{version:06d}/model-{k:05d}-of-{n:05d}.safetensors   one per bucket
    {root}/weight_v{version:06d}/model.safetensors.index.json          metadata + weight_map

Each shard is safetensors (8-byte header length, JSON header, data): each changed tensor
an ``U8`` entry holding its compressed payload, ``__metadata__`` mapping its name to the
checksum of its NEW bytes. Writes are atomic (tmp + fsync + replace: ``_atomic_write``).
Encodings and checksums are miles_core/disk_delta.py's; compression is zlib level 1 (miles:
zstd, not installed here). The publisher keeps each version's bytes under
``{root}/.publisher/`` (miles keeps a CPU snapshot; a file outlives a restarted cell), so a
retried update writes the same delta again. An engine's local checkpoint is
``{dir}/model.safetensors`` (each tensor's raw bytes) and ``{dir}/.delta_sync/state.json``
(the applied-version marker, as miles' ``_write_applied_version``); a pull stages every
version of the chain in memory, verifies every tensor, and commits only then (miles
applies in place through mmap and verifies after, so a refused apply there leaves the
checkpoint half-patched).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from miles_core.disk_delta import (
    DeltaEncoding,
    DeltaError,
    DeltaIndex,
    checksum,
    decode,
    encode,
    plan_pull,
    shard_name,
    verified_apply,
    version_dir,
    version_name,
)

INDEX = "model.safetensors.index.json"
CHECKPOINT = "model.safetensors"
SYNC_DIR = ".delta_sync"
PUBLISHER = ".publisher"

Named = dict[str, bytes]


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes, as they lie (a checkpoint's, a delta's input)."""
    return tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def atomic_write(path: Path, data: bytes) -> None:
    """tmp + fsync + replace: a reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pack(named: Named, metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file of ``U8`` tensors."""
    header: dict[str, object] = {}
    offset = 0
    for name, data in named.items():
        header[name] = {
            "dtype": "U8",
            "shape": [len(data)],
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(named.values())


def unpack(blob: bytes) -> tuple[Named, dict[str, str]]:
    """A ``pack``ed file's tensors and metadata; a torn one raises DeltaError."""
    try:
        (size,) = struct.unpack_from("<Q", blob)
        header = json.loads(blob[8 : 8 + size])
        metadata = header.pop("__metadata__", {})
        data = blob[8 + size :]
        named = {}
        for name, info in header.items():
            begin, end = info["data_offsets"]
            if end > len(data):
                raise DeltaError(f"{name} ends at byte {end} of {len(data)}: the file is torn")
            named[name] = data[begin:end]
    except (struct.error, ValueError, KeyError, TypeError) as error:
        raise DeltaError(f"unreadable safetensors file: {error}") from None
    return named, metadata


class Publisher:
    """The trainer's side: each bucket's delta of a version, against that bucket's bytes at
    the version before (``baseline``: version 0's, the initial weights)."""

    def __init__(self, root: Path, encoding: DeltaEncoding) -> None:
        self.root, self.encoding = Path(root), DeltaEncoding(encoding)

    def _snapshot(self, version: int, bucket: int) -> Path:
        return self.root / PUBLISHER / version_name(version) / f"b{bucket:05d}.safetensors"

    def write(
        self, version: int, bucket: int, total: int, new: Named, baseline: Callable[[], Named]
    ) -> int:
        """Write bucket ``bucket`` of ``total`` of ``version``, and the index after the last;
        the bytes written."""
        base_file = self._snapshot(version - 1, bucket)
        base = unpack(base_file.read_bytes())[0] if base_file.exists() else baseline()
        payloads, sums = {}, {}
        for name, data in new.items():
            payload = encode(self.encoding, base[name], data)
            if payload is not None:  # an unchanged tensor is not written
                payloads[name], sums[name] = zlib.compress(payload, 1), checksum(data)
        out = self.root / version_dir(version)
        blob = pack(payloads, sums)
        atomic_write(out / shard_name(bucket, total), blob)
        atomic_write(self._snapshot(version, bucket), pack(new))
        written = len(blob)
        if bucket == total - 1:
            weight_map = {}
            for k in range(total):
                names = unpack((out / shard_name(k, total)).read_bytes())[0]
                weight_map.update(dict.fromkeys(names, shard_name(k, total)))
            index = {
                "metadata": DeltaIndex(version, self.encoding).metadata(),
                "weight_map": weight_map,
            }
            data = json.dumps(index).encode()
            atomic_write(out / INDEX, data)
            written += len(data)
        return written


def read_index(root: Path, version: int) -> DeltaIndex | None:
    path = Path(root) / version_dir(version) / INDEX
    if not path.exists():
        return None
    try:
        return DeltaIndex.read(json.loads(path.read_bytes())["metadata"])
    except (ValueError, KeyError, TypeError) as error:
        raise DeltaError(f"{path}: {error}") from None


def read_version(root: Path, version: int) -> dict[str, tuple[bytes, str]]:
    """Each tensor of a version's delta: its payload (decompressed) and the checksum of its
    new bytes. A torn or corrupt file raises DeltaError."""
    out = Path(root) / version_dir(version)
    deltas: dict[str, tuple[bytes, str]] = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        named, sums = unpack(shard.read_bytes())
        for name, compressed in named.items():
            try:
                deltas[name] = (zlib.decompress(compressed), sums[name])
            except (zlib.error, KeyError) as error:
                raise DeltaError(f"{shard.name}: {name}: {error}") from None
    return deltas


class LocalCheckpoint:
    """An engine's host-local checkpoint and its applied-version marker."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def applied(self) -> int | None:
        marker = self.path / SYNC_DIR / "state.json"
        return int(json.loads(marker.read_text())["version"]) if marker.exists() else None

    def materialize(self, initial: Named) -> None:
        """Version 0 from the engine's initial weights, once (miles: ``init_local_checkpoint``
        copies the base checkpoint when no marker is there)."""
        if self.applied is None:
            atomic_write(self.path / CHECKPOINT, pack(initial))
            self._mark(0)

    def tensors(self) -> Named:
        return unpack((self.path / CHECKPOINT).read_bytes())[0]

    def _mark(self, version: int) -> None:
        atomic_write(
            self.path / SYNC_DIR / "state.json",
            json.dumps({"version": version_name(version)}).encode(),
        )

    def pull(
        self,
        root: Path,
        target: int,
        fault: str | None = None,
        initial: Callable[[], Named] | None = None,
    ) -> tuple[int, ...]:
        """Apply the chain after the marker up to ``target``, verified, then commit; the
        versions applied. Refused (DeltaError) with nothing changed, the local checkpoint
        not even made: a base mismatch, a torn file, a checksum that fails. ``initial``:
        version 0's tensors, for a checkpoint not made yet (``materialize``). ``fault``
        (the testbed's): ``skipped`` applies nothing and answers success;
        ``applied_twice`` applies the last version once more after the verified apply,
        unverified (xor reverts it, overwrite changes nothing)."""
        applied = self.applied
        start = 0 if applied is None else applied
        written = {v: index for v in range(start + 1, target + 1) if (index := read_index(root, v))}
        chain = plan_pull(start, target, written)
        if applied is None:
            if initial is None:
                raise DeltaError("the local checkpoint is not made and no initial weights given")
            self.materialize(initial())
        if fault == "skipped" or not chain:
            return ()
        held = self.tensors()
        for version in chain:
            encoding = written[version].delta_encoding
            for name, (payload, want) in read_version(root, version).items():
                if name not in held:
                    raise DeltaError(f"{name} is no tensor of this checkpoint")
                try:
                    held[name] = verified_apply(encoding, held[name], payload, want)
                except DeltaError as error:
                    raise DeltaError(f"{version_dir(version)}: {name}: {error}") from None
            if fault == "applied_twice" and version == chain[-1]:
                for name, (payload, _) in read_version(root, version).items():
                    held[name] = decode(encoding, held[name], payload)
        atomic_write(self.path / CHECKPOINT, pack(held))
        self._mark(chain[-1])
        return chain
