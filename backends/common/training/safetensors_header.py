"""A ``*.safetensors`` file's header, read and checked without loading a tensor.

The format (https://github.com/huggingface/safetensors, "Format"): 8 bytes, a little-endian
u64 N; N bytes of JSON, ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}``; then the data, each tensor at ``[begin, end)`` of it. The
library's own ``safe_open`` refuses a bad file with a Rust error (a 27-line traceback at
``--hf-checkpoint``), and ``from_pretrained`` reads the config first, so a config that
disagrees with the weights allocates what the config says (16 TiB) before it finds out.
Here every check runs on the header alone, bounded (a header larger than ``MAX_HEADER`` or
than the file is refused before it is read), and each error names the file and the tensor.
Imports neither torch nor safetensors: a wrong checkpoint is refused in a second.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from miles_core.errors import ConfigError

FLAG = "--hf-checkpoint"
MAX_HEADER = 100 * 2**20
"""The largest header read (100 MiB): safetensors' own limit; a real one is a few MB."""
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
_REWRITE = "rewrite it with save_pretrained(dir, safe_serialization=True)"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header declares it: where its bytes lie in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    file: str = ""
    """The file that holds it (for the errors that compare it with config.json)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.numel * DTYPE_BITS[self.dtype] + 7) // 8


def _refuse(path: Path, problem: str) -> ConfigError:
    return ConfigError(FLAG, f"{path}: {problem}", _REWRITE)


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """The JSON header and the data section's length, the length bounded before the read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _refuse(path, f"is {size} bytes, too short for a safetensors header (8+)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER, size - 8):
            raise _refuse(
                path,
                f"declares a {length}-byte header, the file has {size - 8} bytes after the "
                f"length (limit {MAX_HEADER}): truncated or not safetensors",
            )
        return f.read(length), size - 8 - length


def _entry(path: Path, name: str, spec: object) -> TensorEntry:
    """One header entry, each field's type and value checked."""
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise _refuse(path, f"tensor {name!r} has no dtype/shape/data_offsets ({spec!r:.80})")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise _refuse(path, f"tensor {name!r} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise _refuse(path, f"tensor {name!r} has shape {shape!r:.80}, not a list of ints >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_count, offsets)):
        raise _refuse(path, f"tensor {name!r} has data_offsets {offsets!r:.80}")
    entry = TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1], str(path))
    if entry.end - entry.begin != entry.nbytes:
        raise _refuse(
            path,
            f"tensor {name!r} ({dtype}{list(entry.shape)}) needs {entry.nbytes} bytes, its "
            f"data_offsets {offsets} give {entry.end - entry.begin}",
        )
    return entry


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(path: Path, entries: list[TensorEntry], data: int) -> None:
    """The tensors tile the data section: no gap, no overlap, and the file holds it all
    (a truncated file ends before its last tensor does)."""
    at = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != at:
            what = "overlaps the tensor before it" if entry.begin < at else "leaves a gap"
            raise _refuse(path, f"tensor {entry.name!r} at byte {entry.begin} {what} (at {at})")
        at = entry.end
    if at > data:
        cut = min((e for e in entries if e.end > data), key=lambda e: e.begin)
        raise _refuse(
            path,
            f"truncated: tensor {cut.name!r} needs bytes {cut.begin}..{cut.end} of the data, "
            f"the file holds {data} (its tensors need {at})",
        )
    if at < data:
        raise _refuse(path, f"{data - at} bytes follow the last tensor: not a safetensors file")


def read_header(path: Path | str) -> tuple[TensorEntry, ...]:
    """Every tensor ``path`` declares, checked against the file's size; a ConfigError naming
    the file (and the tensor) otherwise. Reads the header only."""
    path = Path(path)
    raw, data = _header_bytes(path)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _refuse(path, f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise _refuse(path, f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise _refuse(path, "its __metadata__ is not an object")
    entries = [_entry(path, name, spec) for name, spec in header.items()]
    _check_layout(path, entries, data)
    return tuple(entries)


__all__ = ["DTYPE_BITS", "MAX_HEADER", "TensorEntry", "read_header"]
