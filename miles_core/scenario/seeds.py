"""Seeds: every stream of randomness in a run is derived from one root seed and a name."""

from __future__ import annotations

import hashlib


def derive_seed(root: int, stream: str) -> int:
    """A 64-bit seed for ``stream``, stable across processes and Python versions.

    Streams are independent of each other and of PYTHONHASHSEED, so adding a stream
    never shifts another one's draws.
    """
    digest = hashlib.sha256(f"{root}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
