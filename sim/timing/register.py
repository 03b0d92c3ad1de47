"""The register of predictions (docs/predictions.md): published figures the model predicted
from a cluster file before the figure entered any fit, each with the value predicted, the
commit that predicted it, and the published value beside it. Its hit rate is the timing
model's headline; a prediction is never edited after it is registered.

``python -m sim predict --register`` reads the register's table, predicts each cluster file
again with today's model and prints both: a registered value that today's model no longer
gives is shown as moved (and a test fails until the register says since when), so the
register cannot drift silently.

Two kinds of row: R rows are weight-update times, each from a cluster file; D rows are decode
throughputs or run times, each a setup of ``sim/timing/decode_register.py`` predicted by the
engines' decode law. Each kind has its own hit rate (they test different models), and the
headline gives both and their total.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from sim.timing.basis import TOLERANCES, within

ROOT = Path(__file__).resolve().parents[2]
REGISTER = ROOT / "docs" / "predictions.md"
_ROW = re.compile(r"^\| (R\d+) \|")
_MOVED = re.compile(r"^\| (R\d+) moved \|")
_RANGE = re.compile(r"^([\d.]+)(?:-([\d.]+))? s$")
_DROW = re.compile(r"^\| (D\d+) \|")
_DMOVED = re.compile(r"^\| (D\d+) moved \|")
_VALUE = re.compile(r"^([\d,]+(?:\.\d+)?) (tok/s/GPU|tok/s|ms)$")


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


class _Rated(Protocol):
    @property
    def ratio(self) -> float: ...


def hit_rate(rows: Sequence[_Rated], label: str = "") -> str:
    """A hit-rate line: how many registered predictions meet each tolerance."""
    ratios = [r.ratio for r in rows]
    met = ", ".join(f"{sum(within(x, f) for x in ratios)} within {f}x" for f in TOLERANCES)
    return (
        f"{label}{len(rows)} registered predictions: {met}; ratios "
        f"{min(ratios, default=0):.2f}-{max(ratios, default=0):.2f}"
    )


@dataclass(frozen=True)
class DecodeRow:
    """One D row of the register: a decode figure, in its published unit."""

    key: str
    figure: str
    source: str
    setup: str
    """``decode_register.Figure.label`` of the setup that predicts it."""
    published: float
    unit: str
    predicted: float
    """What the decode law predicted when the row was registered, in ``unit``."""
    commit: str
    moved: tuple[tuple[str, float], ...] = ()

    @property
    def expected_today(self) -> float:
        return self.moved[-1][1] if self.moved else self.predicted

    @property
    def ratio(self) -> float:
        """Predicted over published: above 1 a throughput too high, or a run time too long."""
        return self.predicted / self.published


def _value(text: str, key: str) -> tuple[float, str]:
    match = _VALUE.match(text.strip())
    if match is None:
        raise ValueError(
            f"{REGISTER.name} {key}: {text!r} is not 'X tok/s/GPU', 'X tok/s' or 'X ms'"
        )
    return float(match.group(1).replace(",", "")), match.group(2)


def read_decode_register(path: Path = REGISTER) -> list[DecodeRow]:
    """The D rows: | key | figure | source | setup | published | predicted | commit | ...; and
    their moves, | D3 moved | commit | value | why |, in the order written."""
    rows, moves = [], {}
    lines = path.read_text().splitlines()
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if _DMOVED.match(line):
            moves.setdefault(cells[0].split()[0], []).append(
                (cells[1].strip("`"), _value(cells[2], cells[0])[0])
            )
    for line in lines:
        if not _DROW.match(line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key, figure, source, setup, published, predicted, commit = cells[:7]
        value, unit = _value(published, key)
        guess, guess_unit = _value(predicted, key)
        if guess_unit != unit:
            raise ValueError(
                f"{REGISTER.name} {key}: predicted in {guess_unit}, published in {unit}"
            )
        rows.append(
            DecodeRow(
                key,
                figure,
                source,
                setup.strip("`"),
                value,
                unit,
                guess,
                commit.strip("`"),
                tuple(moves.get(key, ())),
            )
        )
    return rows


def decode_today(row: DecodeRow) -> float:
    """The row's setup (sim/timing/decode_register.py), predicted by the decode law as it is
    now, in the row's unit."""
    from sim.timing.decode_register import predict, registered

    figures = registered()
    if row.key not in figures:
        raise KeyError(f"{row.key}: no such setup in sim/timing/decode_register.py")
    return predict(figures[row.key]).value


def decode_moved_since(row: DecodeRow, today: float) -> bool:
    """Today's law no longer gives what the register expects (its value or last move), to the
    one decimal written."""
    return abs(today - row.expected_today) > 0.05 + 1e-9 * row.expected_today


def headline(rows: Sequence[Registered], decode: Sequence[DecodeRow]) -> list[str]:
    """The register's bold headline lines (docs/predictions.md): each kind, then the total."""

    def line(label: str, part: Sequence[_Rated], ratios: bool = True) -> str:
        values = [r.ratio for r in part]
        met15 = sum(within(x, 1.5) for x in values)
        met125 = sum(within(x, 1.25) for x in values)
        text = f"**Hit rate, {label}: {met15} of {len(values)} within 1.5x, {met125} within 1.25x"
        return text + (f" (ratios {min(values):.2f}-{max(values):.2f}).**" if ratios else ".**")

    return [
        line(f"weight updates ({rows[0].key}-{rows[-1].key})", rows),
        line(f"decode ({decode[0].key}-{decode[-1].key})", decode),
        line("total", [*rows, *decode], ratios=False),
    ]


def register_json(path: Path = REGISTER) -> dict[str, Any]:
    """The register as data: each row with today's prediction, and the hit rate by factor."""
    rows, decode = read_register(path), read_decode_register(path)
    out = []
    for r in rows:
        today = predict_today(r)
        row = asdict(r) | {"ratio": r.ratio, "today": today}
        out.append(row | {"moved_today": moved_since(r, today)})
    decoded = []
    for d in decode:
        today = decode_today(d)
        row = asdict(d) | {"ratio": d.ratio, "today": today}
        decoded.append(row | {"moved_today": decode_moved_since(d, today)})

    def met(part: Sequence[_Rated]) -> dict[str, int]:
        return {str(f): sum(within(r.ratio, f) for r in part) for f in TOLERANCES}

    return {
        "rows": out,
        "registered": len(rows),
        "within": met(rows),
        "decode_rows": decoded,
        "decode_registered": len(decode),
        "decode_within": met(decode),
        "total_registered": len(rows) + len(decode),
        "total_within": met([*rows, *decode]),
    }


def _today(
    moves: Sequence[tuple[str, float]],
    moved: bool,
    today: float,
    published: float,
    form: str,
    unit: str,
) -> str:
    """A row's "today" column: the same as registered, its last recorded move, or MOVED (a
    change no row of the register records yet)."""
    if moved:
        return f"  MOVED: {today:{form}}{unit} today"
    if not moves:
        return "  same"
    commit, value = moves[-1]
    return f"  moved at {commit}: {value:{form}}{unit} ({value / published:.2f})"


def _print_decode(decode: Sequence[DecodeRow]) -> None:
    print(f"{'key':4s} {'setup':52s} {'published':>18s} {'registered':>18s} {'ratio':>6s} today")
    for d in decode:
        today = decode_today(d)
        moved = _today(d.moved, decode_moved_since(d, today), today, d.published, ".1f", "")
        print(
            f"{d.key:4s} {d.setup[:52]:52s} {f'{d.published:g} {d.unit}':>18s} "
            f"{f'{d.predicted:.1f} {d.unit}':>18s} {d.ratio:6.2f}{moved}"
        )


def print_register(path: Path = REGISTER) -> int:
    rows, decode = read_register(path), read_decode_register(path)
    print(f"{'key':4s} {'figure':58s} {'published':>12s} {'registered':>10s} {'ratio':>6s} today")
    for r in rows:
        low, high = r.published
        published = f"{low:g} s" if low == high else f"{low:g}-{high:g} s"
        today = predict_today(r)
        moved = _today(r.moved, moved_since(r, today), today, (low + high) / 2, ".3f", " s")
        print(
            f"{r.key:4s} {r.figure[:58]:58s} {published:>12s} {r.predicted:9.3f}s "
            f"{r.ratio:6.2f}{moved}"
        )
    print(hit_rate(rows, "weight updates (R rows): "))
    print()
    _print_decode(decode)
    print(hit_rate(decode, "decode (D rows): "))
    print(hit_rate([*rows, *decode], "total: "))
    return 0


__all__ = [
    "REGISTER",
    "DecodeRow",
    "Registered",
    "decode_moved_since",
    "decode_today",
    "headline",
    "hit_rate",
    "moved_since",
    "predict_today",
    "print_register",
    "read_decode_register",
    "read_register",
    "register_json",
]
