"""Figures for :mod:`flnotes.flatness.surfaces`: slices, contour planes, surfaces and
interpolation paths.

Pure functions: results in, matplotlib Figure out. Models compared side by side share one
colour scale (contour levels), so "wider basin" is read off the same contour lines; the scale
follows the typical model, so one diverged model cannot flatten the others' panels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from flnotes.plots import line_style


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def plot_slices(slices: Mapping[str, dict], title: str | None = None) -> Figure:
    """Loss and accuracy along a 1-D filter-normalised slice, one line per model."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (name, sl) in enumerate(slices.items()):  # colour, dash and marker per model
        for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
            ax.plot(_np(sl["alphas"]), _np(sl[metric]), ms=3, label=name, **line_style(i))
    axes[0].set_yscale("log")  # losses of different models differ by orders of magnitude
    for ax, label in zip(axes, ("loss", "accuracy"), strict=True):
        ax.set(xlabel="step along the direction (a)", ylabel=label)
        ax.axvline(0.0, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title or "1-D slices, L(w + a d)")
    fig.tight_layout()
    return fig


def _typical_high(arrays: list[np.ndarray], q: float = 98) -> float:
    """The median over models of each one's q-th percentile: one outlier model (a diverging
    run) then saturates its own panel instead of flattening everybody else's."""
    return float(np.median([np.nanpercentile(a, q) for a in arrays]))


def _surface_values(plane: dict, metric: str, relative: bool) -> np.ndarray:
    """The plane's values, minus the centre's when ``relative`` (odd num: centre at num//2)."""
    values = _np(plane[metric]).astype(float)
    if relative:
        values = values - values[len(values) // 2, len(values) // 2]
    return values


def contour_levels(arrays: list[np.ndarray], num: int = 15) -> np.ndarray:
    """Shared contour levels: geometric steps for positive data, linear otherwise."""
    finite = np.concatenate([a[np.isfinite(a)].ravel() for a in arrays])
    high = _typical_high(arrays)
    positive = finite[finite > 0]
    if len(positive) and positive.min() < high:  # losses or loss increases: geometric steps
        low = max(float(np.percentile(positive, 2)), high * 1e-3)
        return np.geomspace(low, high, num)
    return np.linspace(float(finite.min()), max(high, float(finite.min()) + 1e-9), num)


def plot_planes(planes: Mapping[str, dict], metric: str = "loss", relative: bool = True,
                num_levels: int = 15, title: str | None = None) -> Figure:
    """Contour plot of each model's 2-D plane, one panel per model, shared levels.

    ``relative=True`` draws L(w + a d1 + b d2) - L(w), so basins of models with different
    losses are compared by their width: the same contour means the same loss increase.
    """
    arrays = [_surface_values(p, metric, relative) for p in planes.values()]
    levels = contour_levels(arrays, num_levels)
    n = len(planes)
    # Wide enough gaps between panels that the tick labels of one do not run into the next.
    fig, axes = plt.subplots(1, n, figsize=(3.9 * n + 1.0, 3.8), squeeze=False,
                             gridspec_kw={"wspace": 0.35})
    mappable = None
    for ax, (name, plane), z in zip(axes[0], planes.items(), arrays, strict=True):
        aa, bb = np.meshgrid(_np(plane["alphas"]), _np(plane["betas"]))
        mappable = ax.contourf(aa, bb, z, levels=levels, cmap="viridis", extend="both")
        ax.contour(aa, bb, z, levels=levels, colors="white", linewidths=0.4)
        ax.plot(0, 0, "r*", ms=10)
        ax.set(title=name, xlabel="a (direction 1)", aspect="equal")
        ax.locator_params(nbins=5)  # few ticks: short labels
    axes[0][0].set_ylabel("b (direction 2)")
    label = f"{metric} - {metric} at the model" if relative else metric
    fig.colorbar(mappable, ax=list(axes[0]), label=label, shrink=0.9, format="%.2g")
    fig.suptitle(title or f"{label} on a filter-normalised plane (red star: the model)")
    return fig


def surface_windows(arrays: list[np.ndarray]) -> tuple[list[float], float]:
    """(floor per model, shared height) of the z windows of :func:`plot_surfaces`.

    Each window starts at its own model's lowest value and all are as tall as the typical
    model's rise above its floor (98th percentile): a model with a higher loss is then not
    pushed out of everybody's window, and equal heights in two panels mean equal rises.
    """
    floors = [float(np.nanmin(a)) for a in arrays]
    height = _typical_high([a - floor for a, floor in zip(arrays, floors, strict=True)])
    return floors, max(height, 1e-9)


def plot_surfaces(planes: Mapping[str, dict], metric: str = "loss", relative: bool = False,
                  title: str | None = None) -> Figure:
    """3-D surface of each model's plane, as in Li et al.'s figures, on z windows of one height.

    See :func:`surface_windows`. Values above a window are cut away rather than clipped onto
    its ceiling: clipping turned a sharp model, whose whole plane rises past the ceiling,
    into a flat plane, while a cut leaves a narrow bowl whose walls leave the window early.
    """
    arrays = [_surface_values(p, metric, relative) for p in planes.values()]
    floors, height = surface_windows(arrays)
    n = len(planes)
    fig = plt.figure(figsize=(4.2 * n, 3.8))
    for k, ((name, plane), z, floor) in enumerate(
            zip(planes.items(), arrays, floors, strict=True), start=1):
        ax = fig.add_subplot(1, n, k, projection="3d")
        aa, bb = np.meshgrid(_np(plane["alphas"]), _np(plane["betas"]))
        top = floor + height
        # NaN above the window: matplotlib leaves those points out of the surface.
        ax.plot_surface(aa, bb, np.where(z <= top, z, np.nan), cmap="viridis", vmin=floor,
                        vmax=top, linewidth=0)
        ax.set_zlim(floor, top)
        ax.set(title=name, xlabel="a", ylabel="b")
    fig.suptitle(title or f"{metric} surfaces: every z window {height:.3g} tall from the model's "
                          "lowest point; higher values cut away")
    fig.tight_layout()
    return fig


def plot_interpolation(paths: Mapping[str, dict], labels: Sequence[str] = ("A", "B"),
                       title: str | None = None) -> Figure:
    """Loss and accuracy along (1 - t) A + t B for one or more pairs (t = 0: A, t = 1: B)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (name, path) in enumerate(paths.items()):  # colour, dash and marker per pair
        for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
            ax.plot(_np(path["t"]), _np(path[metric]), ms=3, label=name, **line_style(i))
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for t, label in ((0.0, labels[0]), (1.0, labels[1])):
            ax.axvline(t, color="grey", lw=0.8, ls=":")
            ax.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"),
                        ha="center", va="bottom")
        ax.set(xlabel="t", ylabel=metric)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend()
    fig.suptitle(title or "linear interpolation (1 - t) A + t B", y=1.02)
    fig.tight_layout()
    return fig
