"""A figure's ratio to the ceiling: paired with it repeat by repeat, with an interval, and a
ceiling that gains any way shown to be faster than it.

The ceiling of a block (a mode and a bucket size) is its fastest way: the one
of the ceiling's ways with the least median time over the block's repeats.
Within a block every repeat runs each method next to a way of the ceiling
(worker.interleave), and a figure's ratio is the median over repeats of that
way's time / the figure's time in the same repeat, with a distribution-free
interval for that median (order statistics, ``COVERAGE``): load that drifts over
a run slows a method and its ceiling alike and cancels in the pair.

One trial against one trial: the bench before this divided by the fastest of
seven ways in each repeat, a minimum over seven draws against one, which moves
with the machine's load (the more noise, the luckier the best of seven), so
three runs under load read 0.59x, 0.76x and 0.88x of the wire for the same code.

Noise cannot put a method above the ceiling: a median above 1.0 whose interval
reaches down to 1.0 is a tie. A method whose whole interval lies above 1.0 is a
real faster way of moving the bytes, and the ceiling gains it (it joins the
ceiling's ways in that block, and every ratio of the block is read again), so a
ceiling is never a figure that a method beats. ``memcpy`` moves nothing between
processes: a bound, never gained.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from backends.bench.ceiling import CEILINGS
from miles_core.errors import ConfigError

Key = tuple[str, str, int | None]
COVERAGE = 0.9
"""The least probability that a figure's interval holds its true median ratio."""
BOUNDS = frozenset(("memcpy",))


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The order statistics (k, n-1-k), 0-based, with the largest k whose interval covers
    the median with probability >= COVERAGE; the whole range when n is too small for any."""
    ordered = sorted(values)
    n = len(ordered)
    k = 0
    while k + 1 < n - 1 - k and _coverage(n, k + 1) >= COVERAGE:
        k += 1
    return ordered[k], ordered[n - 1 - k]


def _coverage(n: int, k: int) -> float:
    """P(the k-th and (n-1-k)-th of n sorted draws hold the median) = 1 - 2 P(Bin(n,.5) < k+1)."""
    below = sum(math.comb(n, i) for i in range(k + 1))
    return 1.0 - 2.0 * below / 2**n


class Ceilings:
    """Per block, the fastest of the ceiling's ways (and of any method it gained)."""

    def __init__(self, pooled: Mapping[Key, list[float]], default: int) -> None:
        self.pooled = pooled
        self.default = default
        self.gained: dict[tuple[str, int], list[str]] = {}
        """(mode, bucket) -> methods the ceiling gained there, a faster way it missed."""

    def ways(self, mode: str, bucket: int) -> list[str]:
        return [*CEILINGS, *self.gained.get((mode, bucket), [])]

    def fastest(self, mode: str, bucket: int | None, ways: Sequence[str] | None = None) -> str:
        """The block's way with the least median time (the first of equals)."""
        bucket = self.default if bucket is None else bucket
        ways = self.ways(mode, bucket) if ways is None else ways
        found = [w for w in ways if (mode, w, bucket) in self.pooled]
        if not found:
            raise ConfigError(
                "trials",
                f"{mode} bucket {bucket} has no ceiling trial",
                "measure the ceiling's ways in every block",
            )
        return min(found, key=lambda w: statistics.median(self.pooled[(mode, w, bucket)]))

    def block(
        self, mode: str, bucket: int | None, ways: Sequence[str] | None = None
    ) -> list[float]:
        """Each repeat's time of the block's fastest way."""
        way = self.fastest(mode, bucket, ways)
        return self.pooled[(mode, way, self.default if bucket is None else bucket)]

    def paired(self, key: Key, values: Sequence[float], ways: Sequence[str] | None = None):
        """Each repeat's ceiling time over the figure's time in that repeat."""
        ceiling = self.block(key[0], key[2], ways)
        if len(ceiling) != len(values):
            raise ConfigError("trials", f"{key} has no ceiling trial per repeat", "rerun the bench")
        return [c / t for c, t in zip(ceiling, values, strict=True)]

    def ratio(self, key: Key, values: Sequence[float], ways: Sequence[str] | None = None) -> float:
        return statistics.median(self.paired(key, values, ways))

    def gain_faster_ways(self) -> list[dict[str, object]]:
        """Every method whose whole interval is above the ceiling joins it in its block; what
        each measured against the ceiling before (one pass: a gained way only lowers the
        others' ratios)."""
        gained = []
        for key, values in self.pooled.items():
            mode, method, bucket = key
            if method in CEILINGS or method in BOUNDS or bucket is None:
                continue
            pairs = self.paired(key, values)
            low, high = median_interval(pairs)
            if low > 1.0:
                gained.append(
                    {
                        "mode": mode,
                        "method": method,
                        "bucket_bytes": bucket,
                        "ratio_before": statistics.median(pairs),
                        "interval_before": [low, high],
                    }
                )
        for g in gained:
            self.gained.setdefault((g["mode"], g["bucket_bytes"]), []).append(g["method"])
        return gained

    def set_by(self, mode: str) -> dict[str, int]:
        """How many of the mode's blocks each way was the ceiling of."""
        blocks = sorted({k[2] for k in self.pooled if k[0] == mode and k[1] in CEILINGS})
        return dict(Counter(self.fastest(mode, b) for b in blocks).most_common())
