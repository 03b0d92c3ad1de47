"""``python -m sim predict --decode``: the decode law fitted to published engine figures
(sim/timing/decode_figures.py), and each figure predicted by a fit that never saw it.

Four passes over the usable figures, each a fit of the five efficiencies
(sim/timing/decode_law.py) and a ratio of predicted to published per figure:

- **held out** (counted): each source family left out in turn, its figures predicted by the
  fit on the others (both TensorRT-LLM releases go out together, so neither informs the other);
- **A100 -> H100** (a second held-out split, listed): the fit on the A100 figures predicts the
  H100 ones, another GPU and another weight type;
- **prior** (listed): efficiencies of 1, no figure fitted (the datasheet roofline);
- **fitted here** (listed beside each held-out ratio): the fit on every figure.

``compared_rows`` gives the ledger's rows (sim/timing/basis.py): the held-out ratio is the
figure's; the in-fit ratio is derived from it and not counted again.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from sim.timing.basis import TOLERANCES, Basis, Compared, within
from sim.timing.decode_figures import A100 as A100_GPU
from sim.timing.decode_figures import FIGURES, SOURCES, DecodeFigure, usable
from sim.timing.decode_law import NAMES, PRIOR, Deployment, Efficiency, Observation, fit, law

HELD_OUT_WHY = "the decode law's efficiencies fitted to the other source families' figures"
CONTEXTS = 2048
"""The context the printed laws' throughputs are given at."""
RUNNING = (1, 64, 256)


def observations(figures: Sequence[DecodeFigure]) -> list[Observation]:
    """Each source family weighs one in total, whatever its number of rows."""
    per_family = Counter(f.source.family for f in figures)
    return [
        Observation(f.name, f.features(), f.seconds, 1 / per_family[f.source.family])
        for f in figures
    ]


@dataclass(frozen=True)
class Prediction:
    """One figure as a fit predicted it, with the figures that fit saw."""

    figure: DecodeFigure
    seconds: float
    fitted_on: frozenset[str]
    efficiency: Efficiency

    @property
    def ratio(self) -> float:
        return self.figure.ratio(self.seconds)

    @property
    def predicted(self) -> float:
        """In the published metric."""
        return self.figure.value * self.ratio


def predict(figure: DecodeFigure, eff: Efficiency, fitted_on: frozenset[str]) -> Prediction:
    return Prediction(figure, float(figure.features() @ eff.vector()), fitted_on, eff)


def held_out(
    figures: Sequence[DecodeFigure], group: Callable[[DecodeFigure], Hashable]
) -> list[Prediction]:
    """Each group's figures predicted by the fit on every figure outside the group."""
    out: dict[str, Prediction] = {}
    for key in dict.fromkeys(group(f) for f in figures):
        train = [f for f in figures if group(f) != key]
        eff = fit(observations(train))
        seen = frozenset(f.name for f in train)
        for f in figures:
            if group(f) == key:
                out[f.name] = predict(f, eff, seen)
    return [out[f.name] for f in figures]


def leave_family_out(figures: Sequence[DecodeFigure]) -> list[Prediction]:
    return held_out(figures, lambda f: f.source.family)


def a100_to_h100(figures: Sequence[DecodeFigure]) -> list[Prediction]:
    """The H100 figures, predicted by the fit on the A100 ones."""
    train = [f for f in figures if f.deployment.gpu == A100_GPU]
    eff, seen = fit(observations(train)), frozenset(f.name for f in train)
    return [predict(f, eff, seen) for f in figures if f.deployment.gpu != A100_GPU]


@functools.cache
def full_fit() -> Efficiency:
    """The five efficiencies fitted to every usable figure, each source family weighing one
    (the "all figures" fit): the law the anchors' generation and the register's decode rows
    are derived from."""
    return fit(observations(usable()))


def in_fit(figures: Sequence[DecodeFigure]) -> list[Prediction]:
    eff, seen = fit(observations(figures)), frozenset(f.name for f in figures)
    return [predict(f, eff, seen) for f in figures]


def prior(figures: Sequence[DecodeFigure]) -> list[Prediction]:
    return [predict(f, PRIOR, frozenset()) for f in figures]


@dataclass(frozen=True)
class Counts:
    figures: int
    met: tuple[int, ...]
    """Within each of basis.TOLERANCES."""
    low: float
    high: float

    def line(self) -> str:
        met = ", ".join(f"{n} within {t}x" for n, t in zip(self.met, TOLERANCES, strict=True))
        return f"{self.figures} figures, {met}, ratios {self.low:.2f}-{self.high:.2f}"


def counts(predictions: Sequence[Prediction]) -> Counts:
    ratios = [p.ratio for p in predictions]
    met = tuple(sum(within(r, t) for r in ratios) for t in TOLERANCES)
    return Counts(len(ratios), met, min(ratios, default=0.0), max(ratios, default=0.0))


def compared_rows(figures: Sequence[DecodeFigure] | None = None) -> list[Compared]:
    """The ledger's rows: each figure by its held-out ratio; its in-fit ratio derived from it."""
    figures = usable() if figures is None else figures
    fitted = {p.figure.name: p for p in in_fit(figures)}
    out = []
    for p in leave_family_out(figures):
        name = p.figure.name
        out.append(Compared(name, "decode", p.ratio, Basis.HELD_OUT, HELD_OUT_WHY))
        why = "the decode law fitted to every figure, this one in it"
        out.append(Compared(name, "decode", fitted[name].ratio, Basis.FITTED, why, name))
    return out


def _efficiency_table(figures: Sequence[DecodeFigure]) -> list[str]:
    rows = [("prior (datasheet peaks)", PRIOR), ("all figures", fit(observations(figures)))]
    for family in dict.fromkeys(s.family for s in SOURCES):
        train = [f for f in figures if f.source.family != family]
        rows.append((f"without {family}", fit(observations(train))))
    a100 = [f for f in figures if f.deployment.gpu == A100_GPU]
    rows.append(("A100 figures only", fit(observations(a100))))
    head = f"{'fit':28s}" + "".join(f"{n:>9s}" for n in NAMES)
    return [head, *(f"{k:28s}" + "".join(f"{v:9.2f}" for v in e.vector()) for k, e in rows)]


def _law_table(figures: Sequence[DecodeFigure], eff: Efficiency) -> list[str]:
    deployments: dict[str, Deployment] = {f.deployment.label: f.deployment for f in figures}
    head = f"{'deployment':36s}{'fixed ms':>9s}{'/req us':>9s}{'/kv ns':>8s}" + "".join(
        f"{'tok/s@' + str(r):>11s}" for r in RUNNING
    )
    lines = [head]
    for label, d in deployments.items():
        lw = law(d, eff)
        rates = "".join(f"{lw.tokens_per_second(r, CONTEXTS):11.0f}" for r in RUNNING)
        lines.append(
            f"{label:36s}{lw.fixed * 1e3:9.2f}{lw.per_request * 1e6:9.1f}"
            f"{lw.per_kv_token * 1e9:8.2f}{rates}"
        )
    return lines


def _number(x: float) -> str:
    """Like the published figures: whole above 1,000, four significant digits below."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.4g}"


def _figure_table(
    held: Sequence[Prediction],
    split: Sequence[Prediction],
    fitted: Sequence[Prediction],
    roof: Sequence[Prediction],
) -> list[str]:
    by_split = {p.figure.name: p.ratio for p in split}
    head = (
        f"{'source':8s} {'deployment':36s}{'batch':>6s}{'in/out':>10s}{'published':>11s}"
        f"{'held out':>10s}{'ratio':>7s}{'A100>H100':>10s}{'in fit':>7s}{'prior':>7s}"
    )
    lines = [head]
    for h, fi, ro in zip(held, fitted, roof, strict=True):
        f = h.figure
        short = {"TensorRT-LLM": "TRT", "LMDeploy": "LMD", "NIM": "NIM"}[f.source.family]
        tag = f"{short}{f.source.key.split(' v')[-1] if short == 'TRT' else ''}"
        split_ratio = by_split.get(f.name)
        split_text = f"{split_ratio:10.2f}" if split_ratio is not None else f"{'-':>10s}"
        lines.append(
            f"{tag:8s} {f.deployment.label:36s}{f.batch:6d}{f'{f.prompt}/{f.output}':>10s}"
            f"{f.value:11g}{_number(h.predicted):>10s}{h.ratio:7.2f}{split_text}"
            f"{fi.ratio:7.2f}{ro.ratio:7.2f}"
        )
    return lines


def per_query_head(predictions: Sequence[Prediction]) -> list[tuple[Prediction, float]]:
    """A diagnostic, not counted: the TensorRT-LLM GQA rows' in-fit ratios again, with attention
    reading each KV head once per query head (``kv_group`` times), as an attention kernel that
    does not share a KV head among its query heads does."""
    out = []
    for p in predictions:
        f = p.figure
        group = f.deployment.model.kv_group
        if f.source.family == "TensorRT-LLM" and group > 1:
            x = f.features()
            x[3] *= group
            out.append((p, f.ratio(float(x @ p.efficiency.vector()))))
    return out


def _per_query_head_table(fitted: Sequence[Prediction]) -> list[str]:
    lines = [
        f"{'source':8s} {'deployment':36s}{'batch':>6s}{'in/out':>10s}{'in fit':>7s}{'x group':>8s}"
    ]
    for p, ratio in per_query_head(fitted):
        f = p.figure
        tag = f"TRT{f.source.key.split(' v')[-1]}"
        lines.append(
            f"{tag:8s} {f.deployment.label:36s}{f.batch:6d}{f'{f.prompt}/{f.output}':>10s}"
            f"{p.ratio:7.2f}{ratio:8.2f}"
        )
    return lines


def report() -> str:
    """Everything the command prints (docs/decode-law.md quotes it whole)."""
    figures = usable()
    held, split = leave_family_out(figures), a100_to_h100(figures)
    fitted, roof = in_fit(figures), prior(figures)
    left = len(FIGURES) - len(figures)
    lines = [
        "Decode law: step = fixed + per_request * running + per_kv_token * kv_tokens",
        f"Figures: {len(FIGURES)} transcribed from {len(SOURCES)} sources "
        f"({len(dict.fromkeys(s.family for s in SOURCES))} families), {len(figures)} used; "
        f"{left} left out (their batch cannot hold its KV cache at once)",
        "",
        "Efficiencies (1 = the datasheet peak, 2 = half of it):",
        *_efficiency_table(figures),
        "",
        f"Fitted law per deployment (all figures; tok/s at {CONTEXTS}-token contexts):",
        *_law_table(figures, fitted[0].efficiency),
        "",
        "Each figure, predicted over published (published metric: tok/s, tok/s/GPU or ITL ms;",
        "'held out' = the fit on the other source families, the ratio counted):",
        *_figure_table(held, split, fitted, roof),
        "",
        f"held out (leave one source family out): {counts(held).line()}",
        f"held out (fit on A100, predict H100), listed: {counts(split).line()}",
        f"predicted (prior, no fit), listed: {counts(roof).line()}",
        f"fitted here (every figure in the fit), listed: {counts(fitted).line()}",
        "",
        "Diagnostic, not counted: TensorRT-LLM's GQA rows in the full fit, then with each KV head",
        "read once per query head (x group: 8 for Llama-2-70B, 29 for Falcon-180B):",
        *_per_query_head_table(fitted),
    ]
    return "\n".join(lines)


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()


__all__ = [
    "Counts",
    "Prediction",
    "a100_to_h100",
    "compared_rows",
    "counts",
    "held_out",
    "in_fit",
    "leave_family_out",
    "main",
    "observations",
    "per_query_head",
    "prior",
    "report",
]
