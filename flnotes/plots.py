"""Plots shared by every part of the library: learning curves of runs, the style that tells
methods apart, and tick labels a reader can read on log axes.

Pure functions: data in, matplotlib Figure out (no display, no saved files). The toy's
pictures live in :mod:`flnotes.toy.plots`, the loss surfaces' in :mod:`flnotes.flatness.plots`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, LogLocator, MaxNLocator, NullFormatter

# Okabe and Ito's colour-blind-safe palette (yellow last: it is faint on white). One in
# twelve men cannot tell red from green, so a method is never told apart by its colour
# alone: each line also gets its own line style and marker (line_style).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#000000",
           "#f0e442")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def line_style(index: int) -> dict:
    """Colour, line style and marker of the ``index``-th line of a plot: no two of the first
    40 lines share all three, and any two of the first 10 differ in marker."""
    return {"color": PALETTE[index % len(PALETTE)],
            "linestyle": LINESTYLES[index % len(LINESTYLES)],
            "marker": MARKERS[index % len(MARKERS)]}


def markevery(points: int, most: int = 12):
    """A ``markevery`` that puts at most about ``most`` markers on a line of ``points``:
    enough to tell the lines apart, few enough not to hide them."""
    return max(1, math.ceil(points / most))


def _plain(value: float, _position=None) -> str:
    """A tick label as a plain number: 0.5, 2, 1000, 1e+06 (never 10^0 or 1.1x10^0)."""
    return f"{value:g}"


class _ReadableLogLocator(Locator):
    """Major ticks of a log axis: within one decade (a loss between 1.0 and 1.5), evenly
    spaced round numbers as on a linear axis; over more, 1, 2 and 5 times each power of ten
    (or the powers alone when those are too many)."""

    def __init__(self, most: int = 8) -> None:
        self.most = most
        self._linear = MaxNLocator(most, steps=[1, 2, 2.5, 5, 10])

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self._linear.set_axis(axis)

    def __call__(self):
        return self.tick_values(*self.axis.get_view_interval())  # tick_values sorts the two

    def tick_values(self, vmin, vmax):
        lo, hi = sorted((vmin, vmax))
        if lo <= 0 or hi <= 0:
            return LogLocator(10).tick_values(max(lo, 1e-300), max(hi, 1e-300))
        if hi / lo < 10:
            return [t for t in self._linear.tick_values(lo, hi) if t > 0]
        for subs in ((1.0, 2.0, 5.0), (1.0,)):
            ticks = LogLocator(10, subs=subs, numticks=1000).tick_values(lo, hi)
            shown = [t for t in ticks if lo <= t <= hi]
            if len(shown) <= self.most:
                return ticks
        return LogLocator(10, numticks=self.most).tick_values(lo, hi)


def plain_log_ticks(ax, axis: str = "y", most: int = 8) -> None:
    """Give a log axis of ``ax`` ticks a reader reads at a glance: plain decimals, enough of
    them over a narrow range (matplotlib's own labels a loss between 1.0 and 1.5 only by
    its minor ticks, as "1.1x10^0"), no labels on the minor ticks."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(_ReadableLogLocator(most))
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(NullFormatter())


class _SymlogLocator(Locator):
    """Major ticks of a symmetric-log axis: evenly spaced inside the linear range
    (-linthresh, linthresh) and 1, 2, 5 times the powers of ten beyond it, thinned until at
    most ``most`` lie in view (matplotlib's own gives -1 and 0 alone to losses in [-1, 1])."""

    def __init__(self, linthresh: float, most: int = 10) -> None:
        self.linthresh, self.most = linthresh, most

    def __call__(self):
        return self.tick_values(*self.axis.get_view_interval())  # tick_values sorts the two

    def tick_values(self, vmin, vmax):
        lo, hi = sorted((vmin, vmax))
        t = self.linthresh
        top = max(abs(lo), abs(hi), t)
        decades = range(math.floor(math.log10(t)), math.ceil(math.log10(top)) + 1)
        ticks = []
        for steps, subs in ((8, (1, 2, 5)), (4, (1, 2, 5)), (4, (1,)), (2, (1,)), (1, (1,))):
            inner = [t * k / steps for k in range(-steps, steps + 1)]
            outer = [s * 10.0 ** d for d in decades for s in subs if s * 10.0 ** d > t]
            ticks = sorted({*inner, *outer, *(-v for v in outer)})
            if len([v for v in ticks if lo <= v <= hi]) <= self.most:
                break
        return ticks


def plain_symlog_ticks(ax, linthresh: float, axis: str = "y", most: int = 10) -> None:
    """Give a symmetric-log axis (linear within +-``linthresh``) enough plain-decimal ticks."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(_SymlogLocator(linthresh, most))
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(NullFormatter())


def plot_learning_curves(histories: Mapping[str, object] | Sequence[object],
                         metric: str = "accuracy", title: str | None = None) -> Figure:
    """Metric per round for one or more runs, one line each (label: name or algorithm), each
    in its own colour, line style and marker (:func:`line_style`)."""
    if not isinstance(histories, Mapping):
        histories = {h.config["algorithm"]: h for h in histories}
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, (label, h) in enumerate(histories.items()):
        values = h.metric(metric)
        ax.plot(h.rounds_of(metric), values, ms=4, label=label,
                markevery=markevery(len(values)), **line_style(index))
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no round 2.5
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
