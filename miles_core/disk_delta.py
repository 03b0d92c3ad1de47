"""disk-delta weight transfer, the pure part: encodings, checksums, the index's metadata, and
the version chain of an engine's local checkpoint as a model.

miles (``--update-weight-transfer-mode disk-delta``, in both profiles: at 31f1ca9 it is
``update_weight_from_distributed/delta.py`` ``UpdateWeightFromDiskDelta``, later
``protocols/delta.py``; docs/miles-today-reading.md section 6): the trainer diffs each
tensor's bytes against its snapshot of the previous sync and writes only the changed
ones, ``{delta_dir}/weight_v{version:06d}/model-{offset:05d}-of-{total:05d}.safetensors``
plus ``model.safetensors.index.json`` whose metadata names ``version``, ``base_version``
(= version - 1), ``delta_encoding``, ``compression_format`` and ``checksum_format``
(``protocols/delta.py``: ``_diff_and_compress``, ``_collect``, ``_write_delta_files`` at
0722a10d). Each engine then applies the versions after its local checkpoint's
applied-version marker, in order, checking each tensor's checksum of the NEW bytes, and
loads the checkpoint from disk (``_reload_engines``; the engine side, ``apply_deltas`` /
``_apply_version``, was read only in an index copy, id 55226596590, since moved into
SGLang's ``sglang.srt.weight_sync.local_checkpoint``, not read).

- ``xor``: the payload is ``new ^ old``; applying it is an involution (twice reverts);
- ``overwrite``: count (u4 LE), byte positions (u4 LE each), the new bytes at them
  (``miles/utils/disk_delta.py: overwrite_encode`` at 0b5686f8): idempotent.

Both are byte-level, dtype-blind. Here the checksum is blake2b-128 (hashlib; miles'
default is xxh3-128, and xxhash is not installed) and the compression zlib level 1 (miles:
zstd level 1; zstandard is not installed), both named in the index as miles names its own.
Verifying the NEW bytes after an apply does catch a second xor apply that goes through the
verifying path: every tensor in a delta changed (unchanged ones are not written), so the
second apply gives the base's bytes, whose checksum differs (``verified_apply``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import ConfigError


class DeltaEncoding(StrEnum):
    """--update-weight-delta-encoding (miles' default: xor)."""

    XOR = "xor"
    OVERWRITE = "overwrite"


CHECKSUM_FORMAT = "blake2b-128"
"""What the per-tensor checksums are (miles: ``--update-weight-delta-checksum``, xxh3-128)."""
COMPRESSION_FORMAT = "zlib"
"""How each payload is compressed, level 1 (miles: zstd level 1)."""


class DeltaError(ValueError):
    """A delta that cannot be applied as it stands: torn, the wrong size, another base."""


def checksum(data: bytes) -> str:
    """The checksum of one tensor's bytes (``miles/utils/disk_delta.py: checksum``)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def xor_bytes(a: bytes, b: bytes) -> bytes:
    """``a ^ b`` byte for byte (equal lengths), in one big-int operation."""
    if len(a) != len(b):
        raise DeltaError(f"xor of {len(a)} bytes with {len(b)}: a tensor's size is fixed")
    x = int.from_bytes(a, "little") ^ int.from_bytes(b, "little")
    return x.to_bytes(len(a), "little")


def encode(encoding: DeltaEncoding, old: bytes, new: bytes) -> bytes | None:
    """The payload that takes ``old`` to ``new``; None when nothing changed (miles writes no
    entry for an unchanged tensor)."""
    diff = xor_bytes(new, old)
    if not any(diff):
        return None
    if DeltaEncoding(encoding) is DeltaEncoding.XOR:
        return diff
    positions = [i for i, byte in enumerate(diff) if byte]
    head = struct.pack(f"<I{len(positions)}I", len(positions), *positions)
    return head + bytes(new[i] for i in positions)


def decode(encoding: DeltaEncoding, base: bytes, payload: bytes) -> bytes:
    """``base`` with the payload applied (no check of what comes out: ``verified_apply``).
    A payload that does not fit the base (torn, truncated) raises DeltaError."""
    if DeltaEncoding(encoding) is DeltaEncoding.XOR:
        return xor_bytes(base, payload)
    if len(payload) < 4:
        raise DeltaError(f"overwrite payload of {len(payload)} bytes has no count")
    (count,) = struct.unpack_from("<I", payload)
    if len(payload) != 4 + 5 * count:
        raise DeltaError(f"overwrite payload of {len(payload)} bytes for {count} positions")
    positions = struct.unpack_from(f"<{count}I", payload, 4)
    values = payload[4 + 4 * count :]
    out = bytearray(base)
    for position, value in zip(positions, values, strict=True):
        if position >= len(out):
            raise DeltaError(f"position {position} is past the tensor's {len(out)} bytes")
        out[position] = value
    return bytes(out)


def verified_apply(encoding: DeltaEncoding, base: bytes, payload: bytes, want: str) -> bytes:
    """Apply and check the NEW bytes' checksum, as the engine does for each tensor; a
    mismatch raises DeltaError (miles: "checksum mismatch ... after applying")."""
    out = decode(encoding, base, payload)
    if checksum(out) != want:
        raise DeltaError(f"checksum mismatch after applying: {checksum(out)} != {want}")
    return out


@dataclass(frozen=True)
class DeltaIndex:
    """``model.safetensors.index.json``'s metadata for one version (``_write_delta_files``)."""

    version: int
    delta_encoding: DeltaEncoding
    compression_format: str = COMPRESSION_FORMAT
    checksum_format: str = CHECKSUM_FORMAT

    @property
    def base_version(self) -> int:
        return self.version - 1

    def metadata(self) -> dict[str, str]:
        return {
            "version": version_name(self.version),
            "base_version": version_name(self.base_version),
            "delta_encoding": self.delta_encoding.value,
            "compression_format": self.compression_format,
            "checksum_format": self.checksum_format,
        }

    @classmethod
    def read(cls, metadata: Mapping[str, object]) -> DeltaIndex:
        """The index as written, checked: a version whose base is not version - 1, or an
        encoding, compression or checksum this side cannot read, raises DeltaError."""
        try:
            version, base = int(str(metadata["version"])), int(str(metadata["base_version"]))
            encoding = DeltaEncoding(str(metadata["delta_encoding"]))
            compression, checks = metadata["compression_format"], metadata["checksum_format"]
        except (KeyError, ValueError) as error:
            raise DeltaError(f"unreadable delta index metadata: {error}") from None
        if base != version - 1:
            raise DeltaError(f"version {version} builds on {base}, not on {version - 1}")
        if compression != COMPRESSION_FORMAT or checks != CHECKSUM_FORMAT:
            raise DeltaError(f"unsupported compression {compression!r} or checksum {checks!r}")
        return cls(version, encoding)


def version_name(version: int) -> str:
    """miles' spelling of a version in the index and the marker: six digits."""
    return f"{version:06d}"


def version_dir(version: int) -> str:
    return f"weight_v{version:06d}"


def shard_name(offset: int, total: int) -> str:
    return f"model-{offset:05d}-of-{total:05d}.safetensors"


def check_transfer(mode: str, encoding: object, lora: bool = False) -> DeltaEncoding:
    """--update-weight-delta-encoding checked, and disk-delta refused with a LoRA adapter, as
    miles refuses it (``UpdateWeightFromDiskDelta.__init__``: "LoRA weight sync is not
    supported for disk-delta weight transfer", 31f1ca9). Both profiles take disk-delta: miles
    at 31f1ca9 has it (``miles/utils/arguments.py``: ``choices=["broadcast", "p2p",
    "disk-delta"]``; ``update_weight_from_distributed/delta.py``), the same protocol as
    ``protocols/delta.py`` at 0722a10d."""
    try:
        chosen = DeltaEncoding(encoding)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError(
            "update_weight_delta_encoding", f"got {encoding!r}", "choose xor or overwrite"
        ) from None
    if mode == "disk-delta" and lora:
        raise ConfigError(
            "--update-weight-transfer-mode",
            "disk-delta does not sync a LoRA adapter (miles: 'LoRA weight sync is not "
            "supported for disk-delta weight transfer')",
            "use broadcast or p2p with --lora-adapter",
        )
    return chosen


def plan_pull(applied: int, target: int, written: Mapping[int, DeltaIndex]) -> tuple[int, ...]:
    """The versions an engine at ``applied`` applies, in order, to reach ``target``
    (``apply_deltas``: from the marker + 1 on; none when it is there already). Refused
    before anything changes (DeltaError): a target behind the checkpoint, a version of the
    chain not written, or one that builds on another base."""
    if target < applied:
        raise DeltaError(
            f"base_version mismatch: the local checkpoint is at {applied}, past {target}"
        )
    chain = tuple(range(applied + 1, target + 1))
    for version in chain:
        index = written.get(version)
        if index is None:
            raise DeltaError(f"base_version mismatch: no delta for version {version} to apply")
        if index.version != version or index.base_version != version - 1:
            raise DeltaError(
                f"base_version mismatch: {version_dir(version)} builds on {index.base_version}, "
                f"the checkpoint is at {version - 1}"
            )
    return chain
