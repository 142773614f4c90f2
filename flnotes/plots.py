"""Plots shared by every part of the library: learning curves of runs.

Pure functions: data in, matplotlib Figure out (no display, no saved files). The toy's
pictures live in :mod:`flnotes.toy.plots`, the loss surfaces' in :mod:`flnotes.flatness.plots`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_learning_curves(
    histories: Mapping[str, object] | Sequence[object], metric: str = "accuracy",
    title: str | None = None,
) -> Figure:
    """Metric per round for one or more runs, one line each (label: name or algorithm)."""
    if not isinstance(histories, Mapping):
        histories = {h.config["algorithm"]: h for h in histories}
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, h in histories.items():
        ax.plot(h.rounds_of(metric), h.metric(metric), marker="o", ms=3, label=label)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no round 2.5
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
