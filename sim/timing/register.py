"""The register of predictions (docs/predictions.md): published figures the model predicted
from a cluster file before the figure entered any fit, each with the value predicted, the
commit that predicted it, and the published value beside it. Its hit rate is the timing
model's headline; a prediction is never edited after it is registered.

``python -m sim predict --register`` reads the register's table, predicts each cluster file
again with today's model and prints both: a registered value that today's model no longer
gives is shown as moved (and a test fails until the register says since when), so the
register cannot drift silently.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim.timing.basis import TOLERANCES, within

ROOT = Path(__file__).resolve().parents[2]
REGISTER = ROOT / "docs" / "predictions.md"
_ROW = re.compile(r"^\| (R\d+) \|")
_MOVED = re.compile(r"^\| (R\d+) moved \|")
_RANGE = re.compile(r"^([\d.]+)(?:-([\d.]+))? s$")


@dataclass(frozen=True)
class Registered:
    """One row of the register."""

    key: str
    figure: str
    source: str
    cluster: str
    """The cluster file, relative to the repository."""
    published: tuple[float, float]
    """The published value or range, seconds."""
    predicted: float
    """What the model predicted when the row was registered, seconds."""
    commit: str
    moved: tuple[tuple[str, float], ...] = ()
    """(commit, seconds): each later model that predicts the file otherwise, in order (the
    register's "Moved since registered" table). The hit rate stays the registered one's."""

    @property
    def expected_today(self) -> float:
        """What today's model should give: the last move's value, else the registered one."""
        return self.moved[-1][1] if self.moved else self.predicted

    @property
    def ratio(self) -> float:
        """The registered prediction over the published value (a range's middle)."""
        return self.predicted / (sum(self.published) / 2)


def _seconds(text: str, key: str) -> tuple[float, float]:
    match = _RANGE.match(text.strip())
    if match is None:
        raise ValueError(f"{REGISTER.name} {key}: {text!r} is not 'X s' or 'X-Y s'")
    low = float(match.group(1))
    return low, float(match.group(2) or low)


def read_register(path: Path = REGISTER) -> list[Registered]:
    """The register's rows: | key | figure | source | cluster file | published | predicted |
    commit | (further columns are derived and ignored)."""
    rows, moves = [], _moves(path)
    for line in path.read_text().splitlines():
        if not _ROW.match(line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key, figure, source, cluster, published, predicted, commit = cells[:7]
        rows.append(
            Registered(
                key,
                figure,
                source,
                cluster.strip("`"),
                _seconds(published, key),
                _seconds(predicted, key)[0],
                commit.strip("`"),
                tuple(moves.get(key, ())),
            )
        )
    return rows


def _moves(path: Path) -> dict[str, list[tuple[str, float]]]:
    """The "moved" rows: | R9 moved | commit | seconds | why |, in the order written."""
    moves: dict[str, list[tuple[str, float]]] = {}
    for line in path.read_text().splitlines():
        match = _MOVED.match(line)
        if match is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            seconds = _seconds(cells[2], cells[0])[0]
            moves.setdefault(match.group(1), []).append((cells[1].strip("`"), seconds))
    return moves


def predict_today(row: Registered) -> float:
    """The row's cluster file, predicted by the model as it is now."""
    from sim.timing.cluster_file import load_cluster
    from sim.timing.cluster_setup import cluster_setup, predict_cluster

    return predict_cluster(cluster_setup(load_cluster(str(ROOT / row.cluster))))["seconds"]


def moved_since(row: Registered, today: float) -> bool:
    """Today's model no longer gives what the register expects of it (the registered value,
    or its last move), to the 3 decimals written."""
    expected = row.expected_today
    return abs(today - expected) > 5e-4 + 1e-3 * expected


def hit_rate(rows: list[Registered]) -> str:
    """The register's headline: how many registered predictions meet each tolerance."""
    ratios = [r.ratio for r in rows]
    met = ", ".join(f"{sum(within(x, f) for x in ratios)} within {f}x" for f in TOLERANCES)
    return (
        f"{len(rows)} registered predictions: {met}; ratios "
        f"{min(ratios, default=0):.2f}-{max(ratios, default=0):.2f}"
    )


def register_json(path: Path = REGISTER) -> dict[str, Any]:
    """The register as data: each row with today's prediction, and the hit rate by factor."""
    rows = read_register(path)
    out = []
    for r in rows:
        today = predict_today(r)
        row = asdict(r) | {"ratio": r.ratio, "today": today}
        out.append(row | {"moved_today": moved_since(r, today)})
    met = {str(f): sum(within(r.ratio, f) for r in rows) for f in TOLERANCES}
    return {"rows": out, "registered": len(rows), "within": met}


def print_register(path: Path = REGISTER) -> int:
    rows = read_register(path)
    print(f"{'key':4s} {'figure':58s} {'published':>12s} {'registered':>10s} {'ratio':>6s} today")
    for r in rows:
        low, high = r.published
        published = f"{low:g} s" if low == high else f"{low:g}-{high:g} s"
        today = predict_today(r)
        moved = "  same" if not moved_since(r, today) else f"  MOVED: {today:.3f} s today"
        if r.moved and not moved_since(r, today):
            commit, seconds = r.moved[-1]
            moved = f"  moved at {commit}: {seconds:.3f} s ({seconds / (low + high) * 2:.2f})"
        print(
            f"{r.key:4s} {r.figure[:58]:58s} {published:>12s} {r.predicted:9.3f}s "
            f"{r.ratio:6.2f}{moved}"
        )
    print(hit_rate(rows))
    return 0


__all__ = [
    "REGISTER",
    "Registered",
    "hit_rate",
    "moved_since",
    "predict_today",
    "print_register",
    "read_register",
    "register_json",
]
