"""The 2-D toy's pictures: landscapes, client overlaps, trajectories, mutation regions and the
race of methods. Functions named ``draw_*`` draw on a given axes; ``plot_*`` return a new
Figure (no display, no saved files).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import SymLogNorm
from matplotlib.contour import ContourSet
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.patches import Circle, Polygon
from matplotlib.ticker import FixedLocator, FormatStrFormatter, MaxNLocator, SymmetricalLogLocator
from matplotlib.transforms import IdentityTransform

from flnotes.plots import line_style, plain_symlog_ticks
from flnotes.rng import seeded_numpy_global
from flnotes.toy.landscapes import grid, line_slice

# ---- 2-D toy landscapes ---------------------------------------------------------------------
LIMITS = ((-2.5, 2.5), (-2.2, 2.6))  # the (xlim, ylim) that frame fedmut-fig1's two basins
# FedMut Fig. 2's markers: global model, mutated (dispatched) models, local models.
GLOBAL_STYLE = {"color": "red", "marker": "o", "ms": 5, "lw": 1.5}
DISPATCHED_STYLE = {"marker": "s", "s": 28, "facecolors": "none", "edgecolors": "red", "lw": 1.2}
LOCAL_STYLE = {"marker": "*", "s": 60, "color": "tab:blue", "lw": 0}
# A figure's one legend, below its panels (inside one it covered where runs end and the
# mutants), on grey: the white flat-basin dashes show.
BELOW = {"loc": "lower center", "bbox_to_anchor": (0.5, 0.0), "facecolor": "0.75",
         "framealpha": 1.0, "fontsize": 8}


def _axes(ax, figsize=(5.0, 4.4)):
    """(figure, axes): the given axes' figure, or a new single-axes figure."""
    return (ax.figure, ax) if ax is not None else plt.subplots(figsize=figsize)


def draw_landscape(ax, fn, xlim=LIMITS[0], ylim=LIMITS[1], num: int = 121, levels: int = 25,
                   filled: bool = True, cmap: str = "viridis", colorbar: bool = False,
                   label: str = "loss", log: bool = False, linthresh: float = 0.1,
                   values=None, labels: bool = True):
    """Contours of a loss ``fn`` (points (..., 2) -> values) on an existing axes.

    ``label`` names the colour bar (the function need not be a loss); ``log`` spaces the
    colours on a symmetric-log scale, linear within +-``linthresh``. ``values``: the
    (X, Y, Z) of :func:`flnotes.toy.landscapes.grid` on this frame, if already computed.
    ``labels=False`` leaves the axes' labels as they are (a figure that sets its own).
    """
    gx, gy, z = (t.numpy() for t in (values if values is not None else grid(fn, xlim, ylim, num)))
    norm = None
    if log:
        # Levels evenly spaced on a symmetric-log colour scale: values that differ by orders
        # of magnitude (a flat basin's curvature next to a sharp one's) each get their own
        # colours; "symmetric" keeps the few zero or negative values (a curvature can be).
        norm = SymLogNorm(linthresh, vmin=float(z.min()), vmax=float(z.max()))
        levels = norm.inverse(np.linspace(0.0, 1.0, levels))
    if filled:
        cs = ax.contourf(gx, gy, z, levels=levels, cmap=cmap, norm=norm)
        ax.contour(gx, gy, z, levels=levels, colors="k", linewidths=0.3, alpha=0.4)
        if colorbar:
            bar = ax.figure.colorbar(cs, ax=ax, shrink=0.85, label=label)
            if log:  # ticks at 0, +-0.1, +-1, +-10 rather than at the uneven levels
                bar.set_ticks(SymmetricalLogLocator(linthresh=linthresh, base=10))
                bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    else:
        ax.contour(gx, gy, z, levels=levels, cmap=cmap, linewidths=0.8)
    ax.set(xlim=xlim, ylim=ylim, aspect="equal")
    if labels:
        ax.set(xlabel="x", ylabel="y")
    return ax


def colorbar_slot(fig, width: float = 1.05):
    """An axes for a colour bar in a slot ``width`` inches wide at the figure's right edge
    (the panels' right margin moves in to make room). Call it once the margins are set."""
    return fig.add_axes(colorbar_place(fig, width))


def colorbar_place(fig, width: float = 1.05) -> tuple[float, float, float, float]:
    """The place (left, bottom, width, height in figure fractions) of :func:`colorbar_slot`'s
    colour bar, the panels' right margin moved in to make room for it."""
    inch = 1.0 / fig.get_figwidth()
    right = 1.0 - width * inch
    fig.subplots_adjust(right=min(fig.subplotpars.right, right))
    pars = fig.subplotpars
    height = pars.top - pars.bottom
    return (right + 0.12 * inch, pars.bottom + 0.1 * height, 0.12 * inch, 0.8 * height)


def landscape_colorbar(ax, cax, label: str = "loss", bar=None):
    """The colour bar of the landscape's filled contours in ``ax``, with round ticks (not its
    levels), for every panel that shares its levels (colour carries a value, so it gets a scale).

    ``bar``: a colour bar already in ``cax``, moved to the contours' levels and returned
    (a figure that draws new landscapes keeps one bar: a new bar in a cleared ``cax`` kept
    every earlier bar and its contours alive through the axes' locator, and made the
    figure's draws walk a chain of them).
    """
    mappable = next(c for c in ax.collections if isinstance(c, ContourSet) and c.filled)
    if bar is None:
        bar = cax.figure.colorbar(mappable, cax=cax, label=label)
    else:
        # What a new bar takes from a ContourSet (update_normal keeps the old ones).
        bar.boundaries, bar.values = mappable.levels, mappable.cvalues
        bar.update_normal(mappable)  # resets the locator: set below
    bar.ax.yaxis.set_major_locator(MaxNLocator(5))
    return bar


@contextmanager
def _redrawn(drawn: list, axes):
    """Remove the artists in ``drawn`` (a figure's last drawing), then list in it what the
    ``with`` block adds to ``axes`` (nothing, if the block stops)."""
    for artist in drawn:
        artist.remove()
    drawn.clear()
    before = {ax: set(ax.get_children()) for ax in axes}
    yield
    drawn.extend(a for ax in axes for a in ax.get_children() if a not in before[ax])


def plot_landscape(fn, xlim=LIMITS[0], ylim=LIMITS[1], title: str | None = None, ax=None,
                   **kwargs) -> Figure:
    """A filled contour plot of a 2-D loss, with a colour bar."""
    fig, ax = _axes(ax)
    draw_landscape(ax, fn, xlim, ylim, colorbar=True, **kwargs)
    if title:
        ax.set_title(title)
    return fig


def plot_surface(fn, xlim=LIMITS[0], ylim=LIMITS[1], num: int = 81,
                 title: str | None = None) -> Figure:
    """A 3-D surface of a 2-D loss."""
    gx, gy, z = grid(fn, xlim, ylim, num)
    fig = plt.figure(figsize=(6, 4.5))
    ax = fig.add_subplot(projection="3d")
    ax.plot_surface(gx.numpy(), gy.numpy(), z.numpy(), cmap="viridis", linewidth=0,
                    antialiased=True)
    ax.set(xlabel="x", ylabel="y")
    ax.set_zlabel("loss", labelpad=12)  # the default pad puts it on the z tick labels
    ax.view_init(elev=35, azim=-60)
    if title:
        ax.set_title(title)
    return fig


def plot_slices(fns: Mapping[str, object], start, end, extend: float = 0.0,
                title: str | None = None, ax=None) -> Figure:
    """1-D slices of several losses along the segment start -> end, against the x coordinate.

    The horizontal axis is x when the segment is not vertical, else y.
    """
    fig, ax = _axes(ax, figsize=(6.4, 3.6))
    axis = 0 if float(end[0]) != float(start[0]) else 1
    for index, (label, fn) in enumerate(fns.items()):
        t, losses = line_slice(fn, start, end, extend=extend)
        coord = float(start[axis]) + t * (float(end[axis]) - float(start[axis]))
        # each line its own style and marker, not only its colour (line_style)
        ax.plot(coord.numpy(), losses.numpy(), label=label, ms=4,
                markevery=max(1, len(coord) // 10), **line_style(index))
    ax.set(xlabel="xy"[axis] + f"  (slice from {tuple(start)} to {tuple(end)})", ylabel="loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return fig


def mark_basins(ax, federation, flat: bool = True, sharp: bool = True) -> None:
    """Outline the flat basin (white dashed disc) and the sharp basins (orange discs).

    These are the discs that decide "flat" and "sharp" in every run's metrics (a final model
    inside the white one counts as flat); the circles carry legend labels that say so.
    """
    if flat:
        c = federation.flat_center.tolist()
        ax.add_patch(Circle(c, federation.flat_radius, fill=False, ls="--", color="white", lw=1.2,
                            label=f"flat basin (r = {federation.flat_radius:.2g})"))
    if sharp:
        for k, c in enumerate(federation.sharp_centers.tolist()):
            label = None if k else f"sharp basins (r = {federation.sharp_radius:.2g})"
            ax.add_patch(Circle(c, federation.sharp_radius, fill=False, ls="--", color="orange",
                                lw=1.0, label=label))


class ClientsFigure:
    """FedMut Fig. 1: each client's landscape, their mean with its basins, and where the
    clients' low-loss regions overlap. Built once for a number of clients (frames, ticks,
    labels); :meth:`set` draws a federation's landscapes into it, replacing the last ones,
    and ``moving`` lists what it drew (what an explorer redraws over the kept frames).

    ``most`` (at least ``clients``) builds panels for up to that many clients, of which
    :meth:`layout` shows any number as a figure built for it would: an explorer then moves
    to another number of clients without making new axes and their ticks (most of a new
    six-panel figure's first picture).
    """

    # Points per side of each landscape's grid: 81 draws the 3.3-inch panels as smoothly as
    # 121 and makes their contours in two thirds of the time (up to 18 contour sets).
    GRID = 81
    PANEL, WIDTH, HEIGHT = 3.3, 0.95, 3.4  # inches: a panel, the colour bar's slot, height
    MARGINS = {"left": 0.05, "right": 0.99, "bottom": 0.13, "top": 0.91, "wspace": 0.3}

    def __init__(self, clients: int, xlim=LIMITS[0], ylim=LIMITS[1],
                 pyplot: bool = True, most: int | None = None) -> None:
        self.clients, self.xlim, self.ylim = max(clients, 1), xlim, ylim
        self.most = max(self.clients, most or 0)
        n = self.most + 2

        self.fig, axes = new_figure(1, n, (self.PANEL * n + self.WIDTH, self.HEIGHT), pyplot)
        self.all_axes = list(axes[0])  # every client panel, then the global and overlap
        for k, ax in enumerate(self.all_axes):
            ax.set(xlim=xlim, ylim=ylim, aspect="equal", xlabel="x")
            # The panels share one frame: ticks at the whole numbers inside it, and y's
            # numbers on the first panel only (a six-panel figure's first draw is mostly
            # making and laying out tick labels).
            for axis, (lo, hi) in ((ax.xaxis, xlim), (ax.yaxis, ylim)):
                axis.set_major_locator(FixedLocator(range(math.ceil(lo), math.floor(hi) + 1)))
            if k == 0:
                ax.set_ylabel("y")
            else:
                ax.tick_params(labelleft=False)
            if k < self.most:
                ax.set_title(f"client {k}")
        self.all_axes[-2].set_title("global = mean of clients")
        # Fixed margins, not tight_layout: laying out every tick label cost two thirds of a
        # slider's redraw (benchmarks/widget_latency.py).
        self.fig.subplots_adjust(**self.MARGINS)
        self.cax = colorbar_slot(self.fig)
        self.colorbar = None  # made by the first set(), moved to each later one's levels
        self.drawn: list = []  # what set() drew, removed by the next set()
        self.moving: list = []
        self.axes = self.all_axes
        if self.clients < self.most:
            self.layout(self.clients)

    def layout(self, clients: int) -> None:
        """Show ``clients`` client panels (at most ``most``), the figure's width and every
        panel's place as in a figure built for that many; the next :meth:`set` draws them."""
        if not 1 <= clients <= self.most:
            raise ValueError(f"the figure has panels for 1 to {self.most} clients, not {clients}")
        self.clients = clients
        self.axes = [*self.all_axes[:clients], *self.all_axes[-2:]]
        n = len(self.axes)
        self.fig.set_size_inches(self.PANEL * n + self.WIDTH, self.HEIGHT)
        columns = GridSpec(1, n, figure=self.fig)
        for k, ax in enumerate(self.axes):
            ax.set_subplotspec(columns[k])
        for ax in self.all_axes:
            ax.set_visible(ax in self.axes)
        self.fig.subplots_adjust(**self.MARGINS)  # places the panels, as __init__ does
        self.cax.set_position(colorbar_place(self.fig))
        # Each square panel's box within its place: a full draw finds it, but a redraw of
        # a kept layout draws only the moving artists, into the boxes as last found.
        for ax in self.axes:
            ax.apply_aspect()

    def not_frames(self, axes=None) -> list:
        """Every artist :meth:`set` draws or redraws, in any layout (``moving`` lists those of
        ``axes``, the panels shown): a rendering of the frames alone, for another layout too,
        leaves these out. The frames go over the new contours, as in a full draw."""
        spines = [spine for ax in axes or self.all_axes for spine in ax.spines.values()]
        return [*self.drawn, *spines, self.all_axes[-1].title, self.cax]

    def set(self, federation, level: float = -0.5) -> Figure:
        """Draw ``federation`` (its first clients, as many as the panels) and the overlap of
        every client's region where its loss is below ``level``."""
        with _redrawn(self.drawn, self.axes):  # the last federation's drawing removed
            if federation.num_clients < self.clients:
                raise ValueError(f"the figure has {self.clients} client panels; the "
                                 f"federation has {federation.num_clients} clients")
            # Every client's loss on the grid in one call; the global loss is their mean.
            gx, gy, every = grid(federation.client_losses, self.xlim, self.ylim, self.GRID)
            zs = [*(every[..., k] for k in range(self.clients)), every.mean(-1)]
            fns = [*federation.clients[:self.clients], federation.global_loss]
            # One colour scale for every client and the mean, so that a colour is the same
            # loss in each panel.
            levels = np.linspace(min(float(z.min()) for z in zs),
                                 max(float(z.max()) for z in zs), 25)
            panels = [*self.axes[:self.clients], self.axes[-2]]
            for ax, fn, z in zip(panels, fns, zs, strict=True):
                draw_landscape(ax, fn, self.xlim, self.ylim, levels=levels, values=(gx, gy, z),
                               labels=False)
            mark_basins(self.axes[-2], federation)
            self.axes[-2].legend(fontsize=7, loc="lower right", facecolor="0.3",
                                 labelcolor="white", framealpha=0.6)
            colors = plt.get_cmap("tab10").colors
            ax = self.axes[-1]
            for k in range(federation.num_clients):
                z, color = every[..., k], colors[k % 10]
                ax.contourf(gx.numpy(), gy.numpy(), z.numpy(),
                            levels=[z.min().item() - 1, level], colors=[color], alpha=0.35)
                ax.contour(gx.numpy(), gy.numpy(), z.numpy(), levels=[level], colors=[color])
                ax.plot([], [], color=color, lw=6, alpha=0.5, label=f"client {k}")
            ax.set_title(f"overlap: loss < {level:.2f}")
            ax.legend(fontsize=7, loc="upper right")
        self.moving = self.not_frames(self.axes)
        self.colorbar = landscape_colorbar(self.axes[0], self.cax, bar=self.colorbar,
                                           label="loss (clients and global)")
        return self.fig


def plot_client_landscapes(federation, xlim=LIMITS[0], ylim=LIMITS[1], level: float = -0.5,
                           max_clients: int = 3) -> Figure:
    """FedMut Fig. 1: each client's landscape, then where their low-loss regions overlap.

    The last panel fills, per client, the region where its loss is below ``level``: the
    flat regions overlap, the sharp ones do not.
    """
    shown = min(len(federation.clients), max(max_clients, 1))
    return ClientsFigure(shown, xlim, ylim).set(federation, level)


def legend_entries(axes, visible_only: bool = False) -> dict:
    """{label: handle} of every labelled artist in ``axes``, each label once (first seen)."""
    entries = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if handle.get_visible() or not visible_only:
                entries.setdefault(text, handle)
    return entries


def new_figure(rows: int, columns: int, figsize, pyplot: bool = True, dpi: float = 100):
    """(figure, axes array (rows, columns)): through pyplot, so that a notebook cell shows it,
    or (``pyplot=False``) a figure pyplot never sees, for one an explorer keeps and redraws
    (at ``dpi``, the resolution of the explorers' first picture, whatever rcParams say)."""
    if pyplot:
        fig, axes = plt.subplots(rows, columns, figsize=figsize, squeeze=False)
    else:
        fig = Figure(figsize=figsize, dpi=dpi)
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, columns, squeeze=False)
    # Titles at the top of their axes (where matplotlib's automatic placement puts them when
    # no tick labels sit on top), placed once: the automatic placement measures every axis's
    # ticks at each draw, a third of a new six-panel figure's first draw. (A y given once
    # turns it off for the axes; not rc_context, which would also undo the inline backend's
    # interactive mode when the first figure of a kernel starts it.)
    for ax in axes.flat:
        ax.set_title("", y=1.0)
    return fig, axes


class TrajectoryArtists:
    """One run's trajectory on an axes: global path (red), start, final global model, each
    client's local move (white segments), dispatched models (red squares) and local models
    (blue stars). Created empty; :meth:`set` moves them to a run's points, so an explorer
    redraws a kept figure by moving these artists only.
    """

    def __init__(self, ax, clients: bool = True, label: str = "global model") -> None:
        self.path, = ax.plot([], [], label=label, zorder=4, **GLOBAL_STYLE)
        self.start, self.final = (
            ax.plot([], [], "o", color=color, ms=9, mec="white", zorder=5, label=text)[0]
            for color, text in (("red", "start"), ("tab:blue", "final global")))
        self.artists = [self.path, self.start, self.final]
        self.clients = clients
        if clients:
            # Each client's local move, dispatched -> local: one collection, not a line each.
            self.moves = ax.add_collection(LineCollection([], colors="white", linewidths=0.6,
                                                          alpha=0.7, zorder=2))
            self.dispatched = ax.scatter([], [], zorder=3, label="dispatched",
                                         **DISPATCHED_STYLE)
            self.local = ax.scatter([], [], zorder=3, label="local", **LOCAL_STYLE)
            self.artists = [self.moves, self.dispatched, self.local, *self.artists]

    def set(self, points: Mapping[str, object], rounds: int | None = None) -> None:
        """Show ``points`` (:func:`flnotes.toy.trajectory_points`), the first ``rounds``."""
        glob = points["global"][: None if rounds is None else rounds + 1].numpy()
        self.path.set_data(glob[:, 0], glob[:, 1])
        self.start.set_data(glob[:1, 0], glob[:1, 1])
        self.final.set_data(glob[-1:, 0], glob[-1:, 1])
        if self.clients:
            disp = points["dispatched"][:rounds].reshape(-1, 2).numpy()
            local = points["local"][:rounds].reshape(-1, 2).numpy()
            self.moves.set_segments(list(zip(disp, local, strict=True)))
            self.dispatched.set_offsets(disp)
            self.local.set_offsets(local)


class TrajectoryFigure:
    """One panel per run, each run's trajectory over the loss ``fn``; :meth:`set` shows new
    runs (and titles) in the same panels, changing the trajectory artists only, and
    :meth:`set_landscape` draws another loss into the same frames.

    ``moving`` lists the artists that :meth:`set` changes, ``layered`` those that
    :meth:`set_landscape` draws (contours, basins, the colour bar, and the frames that go
    over them): an explorer renders the frames once, each landscape onto them once, and
    each run onto that.
    """

    def __init__(self, fn, panels: int, federation=None, xlim=LIMITS[0], ylim=LIMITS[1],
                 clients: bool = True, legend: bool = True, pyplot: bool = True) -> None:
        self.fig, axes = new_figure(1, panels, (4.2 * panels + 0.95, 4.2), pyplot)
        self.axes = list(axes[0])
        self.xlim, self.ylim = xlim, ylim
        # Fixed margins, not tight_layout (whose tick layout costs a slider's redraw a fifth).
        self.fig.subplots_adjust(left=0.07, right=0.98, top=0.92, wspace=0.22,
                                 bottom=0.24 if legend else None)
        self.cax = colorbar_slot(self.fig)
        self.landscape: list = []  # what set_landscape drew
        self.colorbar = None
        self.set_landscape(fn, federation)
        self.tracks = [TrajectoryArtists(ax, clients=clients) for ax in self.axes]
        if legend:
            entries = legend_entries(self.axes)  # each entry once, for all panels
            self.fig.legend(entries.values(), entries.keys(), ncol=min(len(entries), 4), **BELOW)
        self.moving = [a for track in self.tracks for a in track.artists]
        self.moving += [ax.title for ax in self.axes]

    def set_landscape(self, fn, federation=None) -> Figure:
        """Draw the loss ``fn`` (and ``federation``'s basins) in place of the last one."""
        with _redrawn(self.landscape, self.axes):  # the last landscape's removed
            values = grid(fn, self.xlim, self.ylim, 121)  # one landscape for every panel
            for ax in self.axes:
                draw_landscape(ax, fn, self.xlim, self.ylim, values=values)
                if federation is not None:
                    mark_basins(ax, federation)
        # the same bar at the new levels: its ticks are kept, not made anew
        self.colorbar = landscape_colorbar(self.axes[0], self.cax, bar=self.colorbar)
        # The frames go over the contours, as in a full draw.
        spines = [spine for ax in self.axes for spine in ax.spines.values()]
        self.layered = [*self.landscape, *spines, self.cax]
        return self.fig

    def set(self, runs: Mapping[str, Mapping], rounds: int | None = None) -> Figure:
        """Show ``runs`` ({title: trajectory points}), one per panel, in order."""
        if len(runs) != len(self.axes):
            raise ValueError(f"{len(runs)} runs for {len(self.axes)} panels")
        for ax, track, (label, points) in zip(self.axes, self.tracks, runs.items(),
                                              strict=True):
            track.set(points, rounds)
            ax.set_title(label)
        return self.fig


def plot_trajectories(fn, runs: Mapping[str, Mapping], federation=None, xlim=LIMITS[0],
                      ylim=LIMITS[1], rounds: int | None = None, clients: bool = True,
                      legend: bool = True) -> Figure:
    """One panel per run: its trajectory drawn over the loss ``fn`` (e.g. the global loss)."""
    return TrajectoryFigure(fn, len(runs), federation, xlim, ylim, clients=clients,
                            legend=legend).set(runs, rounds)


REGION_STYLES = {  # the regions a mutation can reach (FedQP Fig. 1 shades them)
    "circle": {"color": "tab:red", "alpha": 0.18, "lw": 0,
               "label": "reach: disc of radius alpha |g|"},
    "fan": {"color": "gold", "alpha": 0.45, "lw": 0,
            "label": "fan: the disc projected (FedQP Fig. 1)"},
}


class MutantsFigure:
    """Mutation regions: per panel the global model, its update g (arrow) and the mutants
    around it, optionally over the shaded regions they can reach. :meth:`set` draws new
    mutants in the same panels; ``moving`` lists the artists it changes. :meth:`set_window`
    frames another square around the global model (its landscape drawn anew), as a figure
    built with that ``half_width`` would.
    """

    def __init__(self, fn, center, panels: int, half_width: float = 1.0,
                 pyplot: bool = True) -> None:
        cx, cy = float(center[0]), float(center[1])
        self.center, self.fn = (cx, cy), fn
        self.fig, axes = new_figure(1, panels, (3.6 * panels + 0.95, 4.3), pyplot)
        self.axes = list(axes[0])
        self.parts = []
        for ax in self.axes:
            regions = {name: ax.add_patch(Polygon([(cx, cy)], closed=True, zorder=2,
                                                  visible=False, **style))
                       for name, style in REGION_STYLES.items()}
            cloud = ax.scatter([], [], s=4, color="white", alpha=0.35, lw=0, zorder=2.5,
                               label="more draws of the same mutation")
            mutants = ax.scatter([], [], zorder=3, label="mutants", **DISPATCHED_STYLE)
            arrow = ax.annotate("", xy=(cx, cy), xytext=(cx, cy), zorder=3.5,
                                arrowprops={"arrowstyle": "->", "color": "black", "lw": 1.5})
            dot, = ax.plot(cx, cy, "o", color="red", ms=8, mec="white", zorder=4,
                           label="global model")
            self.parts.append({"regions": regions, "cloud": cloud, "mutants": mutants,
                               "arrow": arrow, "dot": dot})
        # Fixed margins (tight_layout would lay the figure out twice per redraw); the legend
        # goes below the panels, where it covers no mutant.
        self.fig.subplots_adjust(left=0.1 / panels + 0.04, right=0.98, top=0.92, bottom=0.27,
                                 wspace=0.3)
        self.cax = colorbar_slot(self.fig)
        self.colorbar = None
        self.landscape: list = []  # what set_window drew
        self.set_window(half_width)
        # The dot does not move, but it is drawn over what does (zorder 4).
        self.moving = [a for part in self.parts
                       for a in (*part["regions"].values(), part["cloud"], part["mutants"],
                                 part["arrow"], part["dot"])]
        self.moving += [ax.title for ax in self.axes]
        self.legend = None

    def set_window(self, half_width: float, landscape: bool = True) -> None:
        """Frame the square of half width ``half_width`` around the global model, its
        landscape and colour bar drawn in place of the last ones; ``landscape=False`` moves
        the frame only (what the moving artists need when the figure's rendering of that
        window is kept), the landscape staying that of ``landscape_width``."""
        cx, cy = self.center
        xlim, ylim = (cx - half_width, cx + half_width), (cy - half_width, cy + half_width)
        self.half_width = half_width
        for ax in self.axes:
            ax.set(xlim=xlim, ylim=ylim)
        if not landscape:
            return
        self.landscape_width = None  # none, if the drawing below stops
        with _redrawn(self.landscape, self.axes):  # the last window's removed
            for ax in self.axes:
                draw_landscape(ax, self.fn, xlim, ylim, num=81)
        for artist in self.landscape:
            if isinstance(artist, ContourSet) and not artist.filled:
                # Under the shaded regions (zorder 2, which contour lines share), whichever
                # window was drawn first.
                artist.set_zorder(1.5)
        self.colorbar = landscape_colorbar(self.axes[0], self.cax, label="global loss",
                                           bar=self.colorbar)
        self.landscape_width = half_width

    def set(self, update, panels: Mapping[str, object],
            clouds: Mapping[str, object] | None = None, arrow_scale: float = 1.0,
            regions: Mapping[str, Mapping[str, object]] | None = None) -> Figure:
        """``panels`` maps a title to the mutants (K, 2) a strategy sends; ``clouds`` the same
        titles to many more draws of the same mutation, which fill in its region; ``regions``
        the same titles to {"circle" | "fan": polygon (M, 2)} to shade."""
        cx, cy = self.center
        tip = (cx + arrow_scale * float(update[0]), cy + arrow_scale * float(update[1]))
        for ax, part, (title, mutants) in zip(self.axes, self.parts, panels.items(),
                                              strict=True):
            # Each place once: a marker drawn again on itself only darkens its antialiased
            # edge (eight sign mutants of the whole vector are two places).
            part["mutants"].set_offsets(np.unique(np.asarray(mutants, dtype=float), axis=0)
                                        .reshape(-1, 2))
            cloud = clouds.get(title) if clouds else None
            part["cloud"].set_offsets(np.empty((0, 2)) if cloud is None else cloud.numpy())
            shaded = (regions or {}).get(title, {})
            for name, patch in part["regions"].items():
                patch.set_visible(name in shaded)
                if name in shaded:
                    patch.set_xy(np.asarray(shaded[name], dtype=float))
            part["arrow"].xy = tip
            ax.set_title(title, fontsize=10)
        # One legend, below the panels, of every mark shown in any panel (a region shaded
        # in one panel only is named once); rebuilt, as the shaded regions change.
        entries = legend_entries(self.axes, visible_only=True)
        if self.legend is not None:
            self.legend.remove()
            self.moving.remove(self.legend)
        self.legend = self.fig.legend(entries.values(), entries.keys(), ncol=2, **BELOW)
        self.moving.append(self.legend)  # drawn over the mutants, as in a full draw
        return self.fig


def plot_mutants(fn, center, update, panels: Mapping[str, object],
                 clouds: Mapping[str, object] | None = None, half_width: float = 1.0,
                 arrow_scale: float = 1.0,
                 regions: Mapping[str, Mapping[str, object]] | None = None) -> Figure:
    """Mutation regions: per panel the global model, its update g and the mutants around it
    (``panels``, ``clouds`` and ``regions`` as :meth:`MutantsFigure.set` takes them)."""
    return MutantsFigure(fn, center, len(panels), half_width).set(
        update, panels, clouds, arrow_scale, regions)


def draw_off_frame(ax, points, colors, xlim, ylim) -> tuple[int, float]:
    """Points outside the frame as triangles on its edge, pointing the way they went.

    A run that drifts far out (FedQP's runaway) would otherwise just vanish from a plot
    framed on the basins. Returns how many points were off the frame and their median
    distance from the origin (NaN when none).
    """
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    lo, hi = np.array((xlim, ylim), dtype=float).T  # the frame's corners (x, y)
    off = ((pts < lo) | (pts > hi)).any(axis=1)
    if not off.any():
        return 0, float("nan")

    outside = pts[off]
    pad = 0.04 * (hi - lo)  # inset a little, so a triangle on the edge is drawn whole
    edges = np.clip(outside, lo + pad, hi - pad)
    towards = outside - (lo + hi) / 2  # from the frame's centre
    angles = np.degrees(np.arctan2(towards[:, 1], towards[:, 0]))
    # Marker (3, 0, a): a triangle pointing up, turned by a degrees; one collection with a
    # triangle per point (what scatter draws for one marker), not a scatter per point.
    markers = [MarkerStyle((3, 0, float(angle) - 90)) for angle in angles]
    paths = [marker.get_path().transformed(marker.get_transform()) for marker in markers]
    triangles = PathCollection(paths, sizes=[40], facecolors=list(np.asarray(colors,
                               dtype=object)[off]), edgecolors="k", linewidths=0.5,
                               offsets=edges, offset_transform=ax.transData, zorder=4)
    triangles.set_transform(IdentityTransform())
    ax.add_collection(triangles, autolim=False)
    return int(off.sum()), float(np.median(np.linalg.norm(outside, axis=1)))


def share_interval(successes: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a share (successes of runs): sensible at 0 and 1 too."""
    if runs <= 0:
        return float("nan"), float("nan")
    share = successes / runs
    centre = (share + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * (share * (1 - share) / runs + z * z / (4 * runs * runs)) ** 0.5 / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)


class EndpointsFigure:
    """Where each method's final global models ended (one dot per seed), one panel per method,
    over the landscape. Built once for a number of panels (landscapes, basins, legend, colour
    bar); :meth:`set` moves the dots, the edge triangles and the titles to a race's rows,
    and ``moving`` lists those artists (what an explorer redraws over the rest).
    """

    def __init__(self, fn, panels: int, federation=None, xlim=LIMITS[0], ylim=LIMITS[1],
                 columns: int = 4, interval: bool = False, pyplot: bool = True) -> None:
        self.xlim, self.ylim, self.interval = xlim, ylim, interval
        n_rows = -(-panels // columns)
        self.fig, axes = new_figure(n_rows, columns, (3.2 * columns + 0.95, 3.2 * n_rows + 0.9),
                                    pyplot)
        for ax in axes.flat[panels:]:
            ax.axis("off")
        self.axes = list(axes.flat[:panels])
        self.dots = []
        for ax in self.axes:
            draw_landscape(ax, fn, xlim, ylim, num=81)
            if federation is not None:
                mark_basins(ax, federation)
            # No ``c``: a scatter given ``c`` maps that array through its colour map at
            # every draw, over the face colours set() gives (every dot came out hollow).
            self.dots.append(ax.scatter([], [], s=10, lw=0.3, edgecolors="k", zorder=3))
        # What every mark means, once, below the panels.
        marks = [Line2D([], [], ls="", marker="o", ms=5, mfc=c, mec="k", mew=0.3, label=text)
                 for c, text in (("white", "final model in the flat basin"),
                                 ("red", "final model elsewhere"))]
        marks.append(Line2D([], [], ls="", marker=(3, 0, 0), ms=7, mfc="0.5", mec="k", mew=0.5,
                            label="beyond the map, pointing the way it went"))
        marks += self.axes[0].get_legend_handles_labels()[0]
        # Fixed margins in inches: two-line titles above each panel, the legend below them.
        w, h = self.fig.get_figwidth(), self.fig.get_figheight()
        top = 0.5 + (0.2 if interval else 0.0)  # room for the interval's line of the titles
        self.fig.subplots_adjust(left=0.55 / w, right=1 - 0.1 / w, top=1 - top / h,
                                 bottom=1.05 / h, wspace=0.3, hspace=0.45)
        self.fig.legend(handles=marks, ncol=3, **BELOW)
        landscape_colorbar(self.axes[0], colorbar_slot(self.fig), label="global loss")
        self.edges: list = []  # the last set's triangles
        self.moving = [*self.dots, *(ax.title for ax in self.axes)]

    def set(self, rows: Sequence[Mapping]) -> Figure:
        """Show ``rows`` (race rows: algorithm, x, y, accuracy), one method per panel, in the
        order of the methods' names."""
        algorithms = sorted({r["algorithm"] for r in rows})
        if len(algorithms) != len(self.axes):
            raise ValueError(f"{len(algorithms)} methods for {len(self.axes)} panels")
        with _redrawn(self.edges, self.axes):  # the last set's triangles removed
            for ax, dots, name in zip(self.axes, self.dots, algorithms, strict=True):
                pts = [(r["x"], r["y"]) for r in rows if r["algorithm"] == name]
                flat = [r["accuracy"] for r in rows if r["algorithm"] == name]
                colors = ["white" if f else "red" for f in flat]
                dots.set_offsets(np.asarray(pts, dtype=float).reshape(-1, 2))
                dots.set_facecolor(colors)
                off, distance = draw_off_frame(ax, pts, colors, self.xlim, self.ylim)
                title = f"{name}: {sum(flat) / max(len(flat), 1):.0%} flat"
                if self.interval:
                    lo, hi = share_interval(int(sum(bool(f) for f in flat)), len(flat))
                    title += f" of {len(flat)} seeds\n(95% interval {lo:.0%}-{hi:.0%})"
                if off:
                    title += f"\n{off} off the map (median |w| {distance:.1f})"
                ax.set_title(title, fontsize=10)
        self.moving = [*self.dots, *self.edges, *(ax.title for ax in self.axes)]
        return self.fig


def plot_endpoints(fn, rows: Sequence[Mapping], federation=None, xlim=LIMITS[0],
                   ylim=LIMITS[1], columns: int = 4, interval: bool = False) -> Figure:
    """Where each method's final global models ended (one dot per seed), one panel per method.

    White: in the flat basin; red: not. Models beyond the frame are triangles on its edge.
    A legend below the panels says so, and a colour bar gives the loss. ``interval`` adds
    each share's 95% interval over the seeds (Wilson's) to its panel's title.
    """
    return EndpointsFigure(fn, len({r["algorithm"] for r in rows}), federation, xlim, ylim,
                           columns, interval).set(rows)


def plot_race(rows: Sequence[Mapping]) -> Figure:
    """The race: share of runs ending flat (with a 95% interval), final loss and sharpness."""
    import pandas as pd  # lazy: only the race plot
    import seaborn as sns  # lazy: only the race plot

    frame = pd.DataFrame(list(rows))
    order = (frame.groupby("algorithm")["accuracy"].mean().sort_values(ascending=False).index
             .tolist())
    # One panel per row, sharing the method axis: with twenty methods side by side three
    # panels in a row leave no room for the names.
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 0.45 * len(order) + 2), 9.5), sharex=True)
    share = frame.groupby("algorithm")["accuracy"].agg(["mean", "count"]).loc[order]
    # Normal-approximation 95% interval of a proportion.
    err = 1.96 * (share["mean"] * (1 - share["mean"]) / share["count"]).pow(0.5)
    axes[0].bar(order, share["mean"], yerr=err, color="tab:green", alpha=0.8, capsize=3)
    axes[0].set_ylim(0, 1)
    # seaborn jitters the dots with numpy's global generator: seeded, the same rows give the
    # same picture every time (a stored notebook's figure changes only with its data)
    with seeded_numpy_global(0):
        for ax, metric in zip(axes[1:], ("loss", "sharpness"), strict=True):
            sns.stripplot(data=frame, x="algorithm", y=metric, order=order, ax=ax, size=3,
                          alpha=0.6, jitter=0.25)
    axes[1].set_yscale("symlog", linthresh=1.0)  # runs that drift far out have huge losses
    plain_symlog_ticks(axes[1], linthresh=1.0)  # its own ticks: -1 and 0 alone, as 10^0
    for ax, (ylabel, title) in zip(axes, [
            ("share ending flat",
             "share of runs ending in the flat basin (bars: 95% interval of the share)"),
            ("final loss (symlog)",
             "final global loss, one dot per run (the valley's floor: about -0.93)"),
            ("top Hessian eigenvalue", "sharpness at the final model (below 0: the loss bends "
             "down every way there: a slope, not a minimum)")], strict=True):
        ax.set(xlabel="", ylabel=ylabel)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=60)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def animate_paths(fn, paths: Mapping, federation=None, xlim=LIMITS[0], ylim=LIMITS[1],
                  fps: float = 4.0, dpi: int = 90) -> bytes:
    """An animated GIF of global models moving over the loss ``fn`` round by round: one line
    per method (``paths``: label -> (R+1, 2) points, round 0 first), growing a round a frame,
    with the basins outlined. GIF, so that a stored notebook plays it without a kernel (in
    JupyterLab, on GitHub) and a slide can show it. Returns the file's bytes (written
    through a temporary file: Pillow's writer saves to a path)."""
    fig, ax = plt.subplots(figsize=(5.2, 4.4), dpi=dpi)
    draw_landscape(ax, fn, xlim, ylim, num=81)
    if federation is not None:
        mark_basins(ax, federation)
    rounds = max(len(p) for p in paths.values()) - 1
    lines = {label: ax.plot([], [], lw=1.8, ms=5, label=label, markevery=[-1],
                            **line_style(k))[0] for k, label in enumerate(paths)}
    ax.legend(loc="upper right", fontsize=7)
    title = ax.set_title("")

    def frame(r: int):
        for label, points in paths.items():
            shown = points[: min(r, len(points) - 1) + 1]
            lines[label].set_data(shown[:, 0].tolist(), shown[:, 1].tolist())
        title.set_text(f"global model after round {r} of {rounds}")
        return [*lines.values(), title]

    # the last picture held a little longer: four repeats of the final frame
    movie = FuncAnimation(fig, frame, frames=[*range(rounds + 1), *[rounds] * 4], blit=False)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "paths.gif"
        movie.save(path, writer=PillowWriter(fps=fps))
        data = path.read_bytes()
    plt.close(fig)
    return data
