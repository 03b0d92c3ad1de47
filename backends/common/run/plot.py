"""``--plot FILE``: a run's learning curve as a person reads it after the run: the mean
reward of each step's trained groups, their staleness, and the weight update's wire time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from backends.common.run.result import StepLine


def plot_steps(lines: Sequence[StepLine], path: Path, title: str) -> Path:
    """Three panels sharing the step axis; the file is written whole or not at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [line.step for line in lines]
    panels = (
        ("mean reward", [line.reward for line in lines]),
        ("staleness (versions)", [line.staleness for line in lines]),
        ("update wire time (ms)", [line.transfer_seconds * 1e3 for line in lines]),
    )
    figure, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(7, 7))
    for axis, (label, values) in zip(axes, panels, strict=True):
        axis.plot(steps, values, marker="o", markersize=3)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    figure.suptitle(title)
    figure.tight_layout()
    partial = path.with_name(path.name + ".partial")
    figure.savefig(partial, format="png")
    plt.close(figure)
    partial.replace(path)
    return path
