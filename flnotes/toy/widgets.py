"""ipywidgets explorers: sliders that redraw the toy pictures of :mod:`flnotes.plots`.

An :class:`Explorer` pairs a pure ``draw(**values) -> Figure`` function with one control
per argument. Displayed in a notebook it first shows the default figure, an image widget
with the PNG beside it in the same output (a headless papermill/nbval run, the shipped
copies and GitHub keep the PNG; JupyterLab shows the widget, in a reloaded page too, and in
a reopened copy once its kernel is up), and then the controls; moving a control redraws
that image in place. The first
picture of a setting and every later redraw of it are the same image (titles, legends and
labels included): a :class:`Scene`'s kept figure is checked against a fresh full draw.

An explorer's notebook cell imports what it needs and takes the parameters cell's values
through :func:`cell_values`, so "run this cell" works on a fresh kernel too;
``notebooks/refresh_outputs.py`` stores its controls as one plain sentence (the shipped
copies hold no widget state). A copy the student saves keeps the controls' state (flnotes
turns on JupyterLab's "Save Widget State Automatically": ``jupyter-config/``), so reopened it
shows them as saved, not "Error displaying widget: model not found".
``explorer.png(**values)`` is exactly what a move computes (draw, then one PNG rendering),
without any browser: the tests and ``benchmarks/widget_latency.py`` call it.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import html
import inspect
import io
import math
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from functools import lru_cache, partial

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython import get_ipython
from IPython.display import HTML, display
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image as PILImage

from flnotes.algorithms import algorithm_names, readers, settings_of
from flnotes.engine.stops import Stopped, stop_when
from flnotes.toy import kept_race, mutation_points, mutation_regions, plots, race, run_toy
from flnotes.toy.experiments import stack_trains, warm_up
from flnotes.toy.landscapes import flat_and_sharp, flat_and_sharp_minima, make_federation


class Explorer:
    """A drawing function and its controls; displays a static figure plus live sliders.

    ``idle(values) -> {control: reason}`` names the controls that do nothing for the current
    values (alpha under FedAvg, ...): they are disabled with the one-line reason beside them,
    so every control either changes the picture or says why not. ``note(values) -> str`` is
    a line shown above the controls, right under the figure, about what the figure shows
    (a method that draws FedAvg's path on the toy, a widened window); ``follow(name,
    values) -> {control: value}`` moves other controls with one (a method's own alpha when
    the method changes), in the same redraw. A redraw shows "drawing..." beside the control
    that moved, where the student is looking, while it runs. ``preview(values) ->
    (overrides, line) | None`` names a quicker picture to show first when the whole one
    takes long (a race's first seeds), with a line saying what it shows; the whole picture
    replaces it in the same redraw. With ``prepare(values)`` as well (what the whole picture
    computes, leaving the drawing quick: a race's rows), a move made in the page computes it
    in a worker thread after the quick picture, so the kernel answers the next move at once;
    that move stops the stale work at its next round (:func:`flnotes.engine.stops.stop_when`)
    and the whole picture shows when it is ready, unless a newer move owns the figure. A move
    made by code (``set`` in a cell, the tests, the benchmark) draws the whole picture
    before it returns, as a cell's output must.
    """

    def __init__(self, draw: Callable[..., Figure], controls: Mapping[str, W.ValueWidget],
                 title: str = "", idle: Callable[[dict], Mapping[str, str]] | None = None,
                 scene: Scene | None = None, note: Callable[[dict], str] | None = None,
                 follow: Callable[[str, dict], Mapping] | None = None,
                 preview: Callable[[dict], tuple[dict, str] | None] | None = None,
                 prepare: Callable[[dict], object] | None = None) -> None:
        _settle_garbage_collector()
        _stop_other_workers(None)  # a cell run again: its old explorer's race is not wanted
        self.draw, self.preview, self.prepare = draw, preview, prepare
        self.moves = 0  # redraws asked for so far: a worker's result for an older one is stale
        self._worker: tuple[threading.Thread, threading.Event] | None = None
        self.last_preview: bytes | None = None  # the quick picture the last redraw showed
        self.scene = scene  # if given, redraws move its kept figure's artists (see Scene)
        self.controls = dict(controls)
        self.idle, self.note_of, self.follow = idle, note, follow
        self.reasons = {n: W.HTML("", layout=W.Layout(margin="0 0 0 8px")) for n in self.controls}
        self.busy = {name: W.HTML("", layout=W.Layout(margin="0 0 0 4px", min_width="70px"))
                     for name in self.controls}
        self.note = W.HTML("")
        self.box = W.VBox([*([W.HTML(f"<b>{title}</b>")] if title else []), self.note,
                           *(W.HBox([control, self.busy[name], self.reasons[name]])
                             for name, control in self.controls.items())])
        # The figure: an image widget, so that every page showing the notebook follows the
        # redraws (a reloaded page or a second tab too; an updated display output reaches
        # only the page that first showed it)
        self.image = W.Image(format="png")
        self._quiet = False  # True while follow() moves controls: one redraw, not several
        self.last_png: bytes | None = None  # the image the last redraw showed
        self.update_idle()
        self.update_note()
        for control in self.controls.values():
            control.observe(self.refresh, names="value")

    @property
    def status(self) -> str:
        """The busy notes now shown ('' when no redraw runs)."""
        return "".join(b.value for b in self.busy.values())

    def update_note(self) -> str:
        """Show the line about the current figure (``note``); return it."""
        text = self.note_of(self.values()) if self.note_of else ""
        self.note.value = f"<span style='color:#a33'>{text}</span>" if text else ""
        return text

    def update_idle(self) -> dict[str, str]:
        """Disable the controls that do nothing now and show why; return them."""
        idle = dict(self.idle(self.values())) if self.idle else {}
        for name, control in self.controls.items():
            control.disabled = name in idle
            self.reasons[name].value = (f"<i style='color:#666'>{idle[name]}</i>"
                                        if name in idle else "")
        return idle

    def values(self) -> dict:
        """The controls' current values, by argument name."""
        return {name: c.value for name, c in self.controls.items()}

    def figure(self, **overrides) -> Figure:
        """The figure for the current values, with some of them overridden."""
        return self.draw(**{**self.values(), **overrides})

    def set(self, **values) -> None:
        """Move controls programmatically (each move redraws, as a slider drag would)."""
        for name, value in values.items():
            self.controls[name].value = value

    def png(self, **overrides) -> bytes:
        """What one redraw computes: the figure for the current values (some overridden),
        rendered to PNG once."""
        if self.scene is not None:
            return self.scene.png({**self.values(), **overrides})
        fig = self.figure(**overrides)
        try:
            return figure_png(fig)
        finally:
            plt.close(fig)

    def refresh(self, change=None) -> bytes | None:
        """Redraw for the current values; update the displayed image if there is one."""
        if self._quiet:
            return None
        self.moves += 1
        self.stop_background()  # its picture would be stale: this move owns the figure now
        _stop_other_workers(self)  # one race at a time in a kernel: this move's goes first
        moved = next((n for n, c in self.controls.items()
                      if change is not None and c is getattr(change, "owner", None)), None)
        if moved is not None and self.follow is not None:
            self._quiet = True
            try:
                for name, value in self.follow(moved, self.values()).items():
                    self.controls[name].value = value
            finally:
                self._quiet = False
        self.update_idle()
        busy = self.busy[moved] if moved is not None else None
        if busy is not None:  # sent at once: the browser shows it beside the control
            busy.value = "<i style='color:#a33'>drawing...</i>"
        in_background = False
        try:
            self.last_preview = None
            first = self.preview(self.values()) if self.preview is not None else None
            if first is not None:  # a quick picture now, the whole one when it is ready
                overrides, line = first
                self.last_preview = self.png(**overrides)
                self.note.value = f"<span style='color:#a33'>{line}</span>"
                self.image.value = self.last_preview
                loop = self._page_move_loop() if self.prepare is not None else None
                if loop is not None:  # the rest in a worker; this move's answer is given
                    self._start_background(loop, busy)
                    in_background = True
                    return self.last_preview
            png = self.png()
        except BaseException:  # an error or an interrupt: no preview left standing as if
            self._take_preview_down()  # the rest were still running
            raise
        finally:
            if busy is not None and not in_background:
                busy.value = ""
        self._show(png)
        return png

    def _show(self, png: bytes) -> None:
        """Show the whole picture of the current values, with its line."""
        self.update_note()
        self.last_png = self.image.value = png

    def _take_preview_down(self, reason: str = "") -> None:
        """After a failed or interrupted redraw: the last whole picture again, and
        ``reason`` (or the figure's own line) instead of "the others are running"."""
        if self.last_preview is None:
            return
        self.update_note()
        if reason:
            self.note.value = f"<span style='color:#a33'>{html.escape(reason)}</span>"
        if self.last_png is not None:
            self.image.value = self.last_png

    @staticmethod
    def _page_move_loop():
        """The kernel's event loop if this redraw answers a move made in the page (a widget's
        comm message to a running kernel), else None: code's moves draw synchronously."""
        if threading.current_thread() is not threading.main_thread():
            return None
        kernel = getattr(get_ipython(), "kernel", None)
        get_parent = getattr(kernel, "get_parent", None)
        if get_parent is None:
            return None
        header = (get_parent("shell") or {}).get("header") or {}
        return getattr(kernel, "io_loop", None) if header.get("msg_type") == "comm_msg" else None

    def _start_background(self, loop, busy) -> None:
        """``prepare`` the current values in a worker thread; the kernel's ``loop`` then
        draws them (quick now) on the main thread, where matplotlib and the widgets live."""
        values, move, stop = self.values(), self.moves, threading.Event()

        def work() -> None:
            error = None
            try:
                with stop_when(stop):
                    self.prepare(values)
            except Stopped:
                return  # a newer move stopped it and owns the figure
            except BaseException as err:  # shown under the figure, not lost in a log
                error = err
            with contextlib.suppress(RuntimeError):  # the kernel's loop closed: shut down
                loop.add_callback(self._finish_background, move, busy, error)

        thread = threading.Thread(target=work, name="flnotes explorer", daemon=True)
        thread.start()
        self._worker = (thread, stop)
        _WORKING.add(self)

    def _finish_background(self, move: int, busy, error: BaseException | None) -> None:
        """On the main thread, when the worker of redraw ``move`` is done: its whole picture
        (or the last one and a line saying why not), unless a newer move owns the figure."""
        if move != self.moves:
            return
        self._worker = None
        _WORKING.discard(self)
        try:
            if error is None:
                png = self.png()
        except Exception as err:
            error = err
        finally:
            if busy is not None:
                busy.value = ""
        if error is not None:
            self._take_preview_down(f"the whole picture failed: {type(error).__name__}: "
                                    f"{error}".split("\n")[0])
            return
        self._show(png)

    def stop_background(self, reason: str = "") -> None:
        """Stop a worker still computing an earlier move's whole picture (it stops at its
        next round) and wait for it; its "drawing..." note goes too. With a ``reason``, the
        last whole picture shows again, with the reason as its line."""
        _WORKING.discard(self)
        if self._worker is None:
            return
        thread, stop = self._worker
        self._worker = None
        stop.set()
        try:
            thread.join()
        finally:  # an interrupt during the join leaves no "drawing..." standing
            for note in self.busy.values():
                note.value = ""
        if reason:
            self._take_preview_down(reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a worker computing the whole picture; True once none runs. (Its picture
        then still waits for the kernel's loop: it shows once the running cell ends.)"""
        worker = self._worker
        if worker is not None:
            worker[0].join(timeout)
        return worker is None or not worker[0].is_alive()

    def _ipython_display_(self) -> None:
        fig = self.figure()
        # The image widget, with the picture as a plain PNG beside it in the same output
        # (smallest PNG: it is what the notebook stores): a viewer without widgets (GitHub,
        # a headless run's copy, the shipped notebooks: notebooks/refresh_outputs.py keeps
        # it alone) shows that, JupyterLab the widget that every redraw updates.
        png = self.image.value = figure_png(fig, compress=9)
        plt.close(fig)
        bundle = self.image._repr_mimebundle_()
        bundle.update({"image/png": base64.b64encode(png).decode("ascii"),
                       "text/plain": "<the figure; its controls are below>"})
        display(bundle, raw=True)
        display(HTML("<small><i>The controls below are live while this notebook's kernel "
                     "runs. Reopened later, a saved copy shows them as they were saved: run "
                     "this cell to move them again (it runs alone, on a fresh kernel too)."
                     "</i></small>"))
        # The controls, with a text fallback in place of ipywidgets' "VBox(children=...)"
        # for any viewer that cannot draw them; notebooks/refresh_outputs.py stores this
        # sentence in their place.
        bundle = self.box._repr_mimebundle_()
        bundle["text/plain"] = controls_sentence(self.controls)
        display(bundle, raw=True)
        if self.scene is not None:
            # The scene's kept figure, built now while the cell finishes (the picture above
            # is already sent): else the student's first move built it, 0.2-0.3 s on top of
            # the redraw (later moves 0.1 s).
            self.scene.png(self.values())


# Explorers whose worker thread is computing a whole picture. One race runs at a time in a
# kernel (flnotes.toy.race holds a lock), so a move, or a new explorer, stops the others':
# it would otherwise wait for them.
_WORKING: weakref.WeakSet = weakref.WeakSet()


def _stop_other_workers(mover: Explorer | None) -> None:
    for other in list(_WORKING):
        if other is not mover:
            other.stop_background("stopped: another explorer in this kernel moved (or was "
                                  "shown); move a control to see the whole picture")


_GC_SETTLED = False


def _settle_garbage_collector() -> None:
    """Once per kernel, at the first explorer: collect reference cycles, then freeze what is
    alive (``gc.freeze``). With torch, matplotlib and pandas loaded, each full collection of
    Python's oldest generation scans every live object (0.15-0.25 s on a 2-core CPU) and
    used to land inside a redraw now and then (the benchmark's slow tail); after the freeze
    it scans only what was made since. The cost: an object alive at that moment that later
    becomes garbage *in a cycle* is not collected (freed by reference counting otherwise);
    garbage that exists then is collected first."""
    global _GC_SETTLED
    if not _GC_SETTLED:
        _GC_SETTLED = True
        gc.collect()
        gc.freeze()


def controls_sentence(controls: Mapping[str, W.ValueWidget]) -> str:
    """The plain sentence that stands for an explorer's controls where they cannot be drawn
    (a stored copy, GitHub): which controls, and that running the cell brings them."""
    names = ", ".join(c.description or n for n, c in controls.items())
    return (f"{len(controls)} controls ({names}) appear here when this cell runs: "
            "run this cell to use them.")


def cell_values(namespace: Mapping, **defaults) -> dict:
    """{name: the notebook's value of ``name``}, each from ``namespace`` (a cell's
    ``globals()``) where the parameters cell has run, else its default: an explorer's cell
    then runs alone on a fresh kernel with the values written in it."""
    return {name: namespace.get(name, default) for name, default in defaults.items()}


PNG_DPI = 100  # the notebooks' inline figures' resolution (kept figures are drawn at it too)


def figure_png(fig: Figure, compress: int = 1) -> bytes:
    """``fig`` as PNG bytes, rendered once as laid out (the explorers' figures fix their own
    margins; the inline backend's bbox_inches="tight" would lay them out a second time).
    ``compress`` is zlib's level: 1 for a redraw (encoding at the default 6 costs a redraw
    about 30 ms more), 9 for the image the notebook stores."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, pil_kwargs={"compress_level": compress})
    return buffer.getvalue()


class Scene:
    """A drawing an explorer keeps between redraws, for moves that change a few artists.

    A subclass says what needs a new figure (``key``: another number of panels, a new
    window), draws one (``build``: an object with ``fig`` and ``moving``, the artists that
    ``update`` changes) and moves its artists to new values (``update``). A redraw on the
    same key restores the figure's rendered background (every artist but the moving ones,
    rendered once) and draws only the moving artists onto it: the contours, ticks and
    labels are not drawn again. The last few keys' figures are kept, so moving back to a
    setting seen before (2 clients, 3, 2 again) builds nothing.

    A scene may also keep a *layer* in its figure (``layer``: what it shows, such as the
    client shift of the landscape; ``relayer`` draws another into the figure, listing its
    artists in ``drawing.layered``): the frames (axes, ticks, labels, legend) are rendered
    once per figure, each layer onto them once, and the moving artists onto that, so a new
    landscape neither builds a figure nor renders its ticks again.
    ``figure(**values)`` is the same drawing as an ordinary, fully drawn pyplot figure.
    """

    KEPT = 4  # figures kept, one per key
    KEPT_LAYERS = 4  # rendered layers kept per figure

    def __init__(self) -> None:
        self._kept: dict = {}  # key -> _Kept, oldest first
        # A figure that several keys share (laid out or framed anew for each), for a scene
        # that keeps one (the client and mutation explorers), else None.
        self._panels = None

    def key(self, values: dict):  # pragma: no cover - every scene defines these three
        raise NotImplementedError

    def build(self, values: dict, pyplot: bool):  # pragma: no cover
        raise NotImplementedError

    def update(self, drawing, values: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def layer(self, values: dict):
        """What the figure's layer shows for ``values`` (None: this scene has no layer)."""
        return None

    def relayer(self, drawing, values: dict) -> None:  # pragma: no cover - layered scenes
        raise NotImplementedError

    def forget(self) -> None:
        """Drop every kept figure (the next picture builds its figure anew)."""
        self._kept.clear()
        self._panels = None

    def figure(self, **values) -> Figure:
        """A new, fully drawn figure for ``values`` (the static picture a cell shows)."""
        drawing = self.build(values, pyplot=True)
        self.update(drawing, values)
        return drawing.fig

    def png(self, values: dict) -> bytes:
        """The PNG for ``values``: the kept figure, its moving artists redrawn. A redraw
        stopped midway (an error, Ctrl-C) may leave a figure half drawn: every kept one is
        dropped, and the next picture builds its figure anew."""
        try:
            return self._png(values)
        except BaseException:
            self.forget()
            raise

    def _png(self, values: dict) -> bytes:
        key, layer = self.key(values), self.layer(values)
        kept = self._kept.pop(key, None)
        if kept is None:  # build draws the layer of ``values``
            kept = _Kept(self.build(values, pyplot=False), layer)
        drawing = kept.drawing
        if layer not in kept.backgrounds and layer != kept.shown:
            # Only to render it: a layer rendered before is restored, whatever the figure's
            # layer artists show (they are never drawn over a restored background).
            self.relayer(drawing, values)
            kept.shown = layer
        self.update(drawing, values)
        if layer not in kept.backgrounds:
            kept.backgrounds[layer] = self._render_layer(kept)
            while len(kept.backgrounds) > self.KEPT_LAYERS:
                del kept.backgrounds[next(iter(kept.backgrounds))]
        background = kept.backgrounds.pop(layer)
        kept.backgrounds[layer] = background  # now the newest
        self._kept[key] = kept  # now the newest
        while len(self._kept) > self.KEPT:
            del self._kept[next(iter(self._kept))]
        fig = drawing.fig
        _paint(fig, background, drawing.moving)
        buffer = io.BytesIO()
        PILImage.fromarray(np.asarray(fig.canvas.buffer_rgba())).save(
            buffer, format="png", compress_level=1)
        return buffer.getvalue()

    @classmethod
    def _render_layer(cls, kept: _Kept):
        """Everything but the moving artists, rendered: the frames once per figure (without
        the layer), then the layer's artists onto them."""
        drawing = kept.drawing
        layered = list(getattr(drawing, "layered", ()))
        if not layered:
            return cls._render_background(drawing, drawing.moving)
        if kept.frames is None:
            kept.frames = cls._render_background(drawing, [*drawing.moving, *layered])
        _paint(drawing.fig, kept.frames, layered)
        return drawing.fig.canvas.copy_from_bbox(drawing.fig.bbox)

    @staticmethod
    def _render_background(drawing, hidden: list):
        """Render everything but the ``hidden`` artists; their visibility and places kept.

        A full draw also places some moving artists: an axes places its title by the title's
        extent, and a hidden title has none, so the draw used to move a hidden title off the
        figure (the first picture of every new figure lost its titles until the next move
        set them again). Their places before the draw are put back after it.
        """
        shown = [artist.get_visible() for artist in hidden]
        placed = [(artist, artist.get_position()) for artist in hidden
                  if isinstance(artist, Text)]
        try:
            for artist in hidden:
                artist.set_visible(False)
            drawing.fig.canvas.draw()
            return drawing.fig.canvas.copy_from_bbox(drawing.fig.bbox)
        finally:  # an interrupted render too: a kept figure must not lose its artists
            for artist, visible in zip(hidden, shown, strict=True):
                artist.set_visible(visible)
            for artist, position in placed:
                artist.set_position(position)


def _paint(fig: Figure, background, artists) -> None:
    """Restore ``background`` on ``fig``'s canvas and draw the visible ``artists`` onto it,
    in the order a full draw paints them: by zorder, ties in their own order."""
    fig.canvas.restore_region(background)
    for artist in sorted(artists, key=lambda a: a.get_zorder()):
        if artist.get_visible():
            fig.draw_artist(artist)


class _Kept:
    """A scene's kept figure: its drawing, the layer it shows, its rendered frames and
    backgrounds (one per layer, oldest first)."""

    def __init__(self, drawing, shown) -> None:
        self.drawing, self.shown = drawing, shown
        self.frames = None
        self.backgrounds: dict = {}


# The reference every explorer compares a method with (its panel, its side of the race).
BASELINE = "fedavg"


def reads(method: str, *settings: str) -> bool:
    """True when ``method`` declares every one of ``settings`` (so a slider for them applies)."""
    return set(settings) <= set(settings_of(method))


def renamed_note(method: str, old: str) -> str:
    """' (fedup's own alpha is fedup_alpha, ...)' when the method once called a setting
    ``old`` (its declaration's old_names), else ''."""
    for setting in settings_of(method).values():
        if old in setting.old_names:
            return f" (its own {old}, {setting.name}, is another setting: {setting.help})"
    return ""


def readers_text(setting: str) -> str:
    """'fedmut, fedqp': the methods that read a setting, for a disabled control's reason."""
    return ", ".join(readers(setting))


def _slider(value: float, lo: float, hi: float, step: float, description: str) -> W.FloatSlider:
    return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=description,
                         continuous_update=False, style={"description_width": "initial"})


# ---- the explorers ---------------------------------------------------------------------------
class MutationScene(Scene):
    """FedMut's mutants next to FedQP's around one model: the landscape is drawn once per
    zoom; a move redraws the mutants, their cloud, the shaded regions and the arrow.

    The window is the given half width (else 1), widened in steps of 0.5 when what the
    panels draw (mutants, their cloud, the regions, the arrow's tip) would leave it: at a
    large alpha nothing leaves the picture unseen.
    """

    STEP = 0.5  # the window widens in these steps (each width is one kept figure)

    def __init__(self, center=(0.0, 1.1), update=(0.12, 0.08),
                 half_width: float | None = None) -> None:
        super().__init__()
        self.center, self.update_ = tuple(center), tuple(update)
        self.half_width = half_width

    def base(self) -> float:
        """The window's half width when everything fits in it."""
        return float(self.half_width or 1.0)

    def half(self, values: dict) -> float:
        """The zoom: the base half width, widened to frame everything the panels draw."""
        panels, clouds, scale, regions = self.panels(values)
        reach = [abs(scale * u) for u in self.update_]
        for points in [*panels.values(), *clouds.values(),
                       *(r for shaded in regions.values() for r in shaded.values())]:
            if len(points):
                moved = points.double() - points.new_tensor(self.center).double()
                reach.append(float(moved.abs().max()))
        needed = 1.08 * max(reach)  # a margin: a marker on the edge is drawn whole
        if needed <= self.base():
            return self.base()
        return self.base() + self.STEP * math.ceil((needed - self.base()) / self.STEP)

    def panels(self, values: dict):
        return _mutation_panels(
            self.center, self.update_, float(values["alpha"]), float(values["beta"]),
            float(values["qp_prob"]), values["kind"], bool(values["layerwise"]),
            int(values["num_models"]), int(values.get("seed", 0)))

    def key(self, values: dict):
        return self.half(values)

    def build(self, values: dict, pyplot: bool):
        if not pyplot and self._panels is not None:
            # One figure for every window: a wider one draws its landscape, not new axes
            # (alpha 8's first picture 0.21 s as a new figure).
            return self._panels
        fed = make_federation("fedmut-fig1")
        drawing = plots.MutantsFigure(fed.global_loss, self.center, 2,
                                      half_width=self.half(values), pyplot=pyplot)
        if not pyplot:
            self._panels = drawing
        return drawing

    def update(self, drawing, values: dict) -> None:
        half = self.half(values)
        if drawing.half_width != half:  # the shared figure, last framing another window
            # The frame only: its landscape is drawn when a rendering of it is needed
            # (_render_layer), not when a kept one is restored.
            drawing.set_window(half, landscape=False)
        drawing.set(self.update_, *self.panels(values))

    def _render_layer(self, kept):
        drawing = kept.drawing
        if drawing.landscape_width != drawing.half_width:
            drawing.set_window(drawing.half_width)
        return super()._render_layer(kept)

    def note(self, values: dict) -> str:
        """A line under the figure when the window had to widen, and when the mutation
        reaches points, not a region (sign mutation of the whole vector), or nothing at all
        (alpha 0: every mutant is the global model)."""
        lines = []
        if float(values["alpha"]) == 0:
            lines.append("At alpha = 0 every mutant is the global model itself: no disc, fan "
                         "or mutant to draw, only the global model.")
        elif values["kind"] == "sign" and not values["layerwise"]:
            lines.append("A sign mutation of the whole vector reaches two points only, w + "
                         "alpha g and w - (1 - beta) alpha g (and their projections): no "
                         "region to shade.")
        half = self.half(values)
        if half > self.base():
            lines.append(f"The window widened from +-{self.base():g} to +-{half:g} around the "
                         f"global model, so that every mutant at alpha = "
                         f"{float(values['alpha']):g} stays in view (the ticks give the scale).")
        return " ".join(lines)


@lru_cache(maxsize=128)
def _mutation_panels(center: tuple, update: tuple, alpha: float, beta: float, qp_prob: float,
                     kind: str, layerwise: bool, num_models: int, seed: int):
    """(panels, clouds, arrow scale, regions) of the mutation figure, kept per setting."""
    common = {"kind": kind, "alpha": alpha, "beta": beta, "layerwise": layerwise, "seed": seed}
    panels, clouds, regions = {}, {}, {}
    for title, p in ((f"FedMut ({kind})", 0.0), (f"FedQP ({kind}, p={qp_prob:.2f})", qp_prob)):
        panels[title] = mutation_points(center, update, num_models=num_models, qp_prob=p, **common)
        clouds[title] = mutation_points(center, update, num_models=400, qp_prob=p, **common)
        # A whole-vector Gaussian mutation reaches a region: shade it (FedQP Fig. 1).
        regions[title] = mutation_regions(center, update, alpha, p, layerwise, kind)
    return panels, clouds, alpha, regions


def draw_mutations(alpha: float = 4.0, beta: float = 0.0, qp_prob: float = 0.5,
                   kind: str = "gaussian", layerwise: bool = False, num_models: int = 8,
                   seed: int = 0, center=(0.0, 1.1), update=(0.12, 0.08),
                   half_width: float | None = None) -> Figure:
    """FedMut's mutants next to FedQP's (projection with probability p) around one model."""
    return MutationScene(center, update, half_width).figure(
        alpha=alpha, beta=beta, qp_prob=qp_prob, kind=kind, layerwise=layerwise,
        num_models=num_models, seed=seed)


def mutation_explorer(center=(0.0, 1.1), update=(0.12, 0.08), half_width: float | None = None,
                      **defaults) -> Explorer:
    """Sliders for alpha, beta, p, the mutation kind and per-layer vs whole-vector mutation.

    ``center``, ``update`` (the global model and its last move g) and ``half_width`` (the
    zoom) are fixed: pass a notebook's own, so the explorer starts from its figures.
    """
    d = {"alpha": 4.0, "beta": 0.0, "qp_prob": 0.5, "kind": "gaussian", "layerwise": False,
         "num_models": 8, **defaults}
    controls = {
        "alpha": _slider(d["alpha"], 0.0, 8.0, 0.5, "alpha (range)"),
        "beta": _slider(d["beta"], 0.0, 1.0, 0.05, "beta (sign preference)"),
        "qp_prob": _slider(d["qp_prob"], 0.0, 1.0, 0.05, "p (projection prob.)"),
        "kind": W.Dropdown(options=["gaussian", "sign"], value=d["kind"], description="kind"),
        "layerwise": W.Checkbox(value=d["layerwise"], description="per layer (x, y apart)"),
        "num_models": W.IntSlider(value=d["num_models"], min=2, max=16, step=2,
                                  description="K mutants", continuous_update=False),
    }

    def idle(values: dict) -> dict[str, str]:
        if values["kind"] != "sign":
            return {"beta": "beta biases sign mutations: Gaussian mutants have no sign to "
                            "prefer (choose kind = sign)"}
        if not values["layerwise"]:
            return {"num_models": "a sign mutation of the whole vector has two mutants only, "
                                  "w + alpha g and w - (1 - beta) alpha g (and their "
                                  "projections): more of them land on the same points (tick "
                                  "per layer, or choose kind = gaussian)"}
        return {}

    scene = MutationScene(center, update, half_width)
    return Explorer(scene.figure, controls, "Mutation regions: circle vs fan", idle=idle,
                    scene=scene, note=scene.note)


class ClientsScene(Scene):
    """FedMut Fig. 1 for the chosen clients: the frames are drawn once per number of
    clients; a move redraws the landscapes, basins and overlap into them.

    ``most_clients`` (the slider's end): the explorer's figures, one per number of
    clients, are a single figure with panels for that many, laid out for each (a first
    visit to 4 clients then makes no axes, only renders their frames once).
    """

    def __init__(self, most_clients: int | None = None) -> None:
        super().__init__()
        self.most_clients = most_clients

    def key(self, values: dict):
        return int(values["num_clients"])

    def build(self, values: dict, pyplot: bool):
        clients = int(values["num_clients"])
        if pyplot or self.most_clients is None or clients > self.most_clients:
            return plots.ClientsFigure(clients, pyplot=pyplot)
        if self._panels is None:
            self._panels = plots.ClientsFigure(clients, pyplot=False, most=self.most_clients)
        return self._panels

    def update(self, drawing, values: dict) -> None:
        clients = int(values["num_clients"])
        if drawing.clients != clients:  # the shared figure, last shown for another number
            drawing.layout(clients)
        fed = make_federation("fedmut-fig1", num_clients=clients, shift=float(values["shift"]),
                              depth_spread=float(values["depth_spread"]))
        drawing.set(fed, level=float(values["level"]))

    def _png(self, values: dict) -> bytes:
        """:meth:`Scene.png`'s picture; when it has just built the shared figure, the
        frames of every other number of clients the kept figures have room for are rendered
        too (0.05 s each), so that a student's first move to one draws only the landscapes,
        as later moves do."""
        built = self._panels is None
        out = super()._png(values)
        if built and self._panels is not None:
            drawing = self._panels
            for clients in range(1, self.most_clients + 1):
                if clients in self._kept or len(self._kept) >= self.KEPT:
                    continue
                drawing.layout(clients)  # the next update lays it out for its own values
                kept = _Kept(drawing, None)
                kept.backgrounds[None] = self._render_background(drawing, drawing.not_frames())
                self._kept[clients] = kept
            shown = self.key(values)  # the number just drawn: kept the newest
            self._kept[shown] = self._kept.pop(shown)
        return out


def draw_clients(shift: float = 1.0, depth_spread: float = 0.2, num_clients: int = 2,
                 level: float = -0.5) -> Figure:
    """FedMut Fig. 1 for the chosen client shift: each client, the mean, their overlap."""
    return ClientsScene().figure(shift=shift, depth_spread=depth_spread,
                                 num_clients=num_clients, level=level)


def client_explorer(**defaults) -> Explorer:
    """Sliders for how far the clients' wells move apart and how unequal their depths are."""
    d = {"shift": 1.0, "depth_spread": 0.2, "num_clients": 2, "level": -0.5, **defaults}
    controls = {
        "shift": _slider(d["shift"], 0.0, 2.0, 0.1, "client shift"),
        "depth_spread": _slider(d["depth_spread"], 0.0, 0.6, 0.05, "depth spread"),
        "num_clients": W.IntSlider(value=d["num_clients"], min=1, max=4, description="clients",
                                   continuous_update=False),
        "level": _slider(d["level"], -1.5, 0.0, 0.1, "overlap level"),
    }
    def idle(values: dict) -> dict[str, str]:
        if values["num_clients"] == 1:
            return {"shift": "moves the clients' wells apart: one client has no other to "
                             "move away from"}
        return {}

    scene = ClientsScene(most_clients=controls["num_clients"].max)
    return Explorer(scene.figure, controls, "Client landscapes and their overlap", idle=idle,
                    scene=scene)


class TrainingScene(Scene):
    """FedAvg next to another method on the two-client toy: the frames are drawn once per
    number of panels, the landscapes once per client shift (the layer); a move redraws the
    trajectories and titles."""

    def key(self, values: dict):
        return values["algorithm"] == BASELINE  # one panel, or two

    def layer(self, values: dict):
        return float(values["shift"])

    def build(self, values: dict, pyplot: bool):
        fed = make_federation("fedmut-fig1", shift=float(values["shift"]))
        panels = 1 if values["algorithm"] == BASELINE else 2
        return plots.TrajectoryFigure(fed.global_loss, panels, federation=fed, pyplot=pyplot)

    def relayer(self, drawing, values: dict) -> None:
        fed = make_federation("fedmut-fig1", shift=float(values["shift"]))
        drawing.set_landscape(fed.global_loss, federation=fed)

    def update(self, drawing, values: dict) -> None:
        drawing.set(training_runs(**values))


def training_runs(algorithm: str = "fedmut", lr: float = 0.1, rounds: int = 20,
                  alpha: float = 4.0, beta0: float = 0.3, shift: float = 1.0,
                  start_x: float = -0.6, start_y: float = -0.7, seed: int = 0) -> dict:
    """{title: trajectory points} of FedAvg and ``algorithm`` from the same start and seed."""
    runs = {}
    for name, (final, points, _) in _figure_runs(algorithm, lr, rounds, alpha, beta0, shift,
                                                 start_x, start_y, seed).items():
        where = "flat" if final.get("accuracy") else "not flat"
        runs[f"{name}: loss {final.get('loss', float('nan')):.3f}, {where}"] = points
    return runs


def _figure_runs(algorithm: str, lr: float, rounds: int, alpha: float, beta0: float,
                 shift: float, start_x: float, start_y: float, seed: int = 0) -> dict:
    """{name: _toy_run(...)} of FedAvg and ``algorithm``: a training figure's runs, on one
    backend (:func:`_training_backend`)."""
    names = list(dict.fromkeys([BASELINE, algorithm]))
    backend, runs = _training_backend(names), {}
    for name in names:
        # alpha and beta0 are the mutation's range and preference: only the methods that
        # declare them (FedMut, FedQP) get them.
        mutation = (float(alpha), float(beta0)) if reads(name, "alpha", "beta0") else None
        runs[name] = _toy_run(name, float(lr), int(rounds), float(shift), float(start_x),
                              float(start_y), int(seed), mutation, backend)
    return runs


def draw_training(algorithm: str = "fedmut", lr: float = 0.1, rounds: int = 20,
                  alpha: float = 4.0, beta0: float = 0.3, shift: float = 1.0,
                  start_x: float = -0.6, start_y: float = -0.7, seed: int = 0) -> Figure:
    """FedAvg next to another method on the two-client toy, from the same start and seed."""
    return TrainingScene().figure(algorithm=algorithm, lr=lr, rounds=rounds, alpha=alpha,
                                  beta0=beta0, shift=shift, start_x=start_x, start_y=start_y,
                                  seed=seed)


def _training_backend(names: list[str]) -> str:
    """The backend of a training figure's runs: one for all of them, so that two paths
    differ only by their methods (the toy is chaotic at a high learning rate: float
    rounding of two backends grows into visibly different paths, and a method that draws
    exactly FedAvg's path would not). The two clients as one stack where the stack trains
    every method shown (a third less time than the loop on the toy), else the loop."""
    return "vmap" if all(stack_trains(name) for name in names) else "loop"


@lru_cache(maxsize=256)
def _toy_run(name: str, lr: float, rounds: int, shift: float, start_x: float, start_y: float,
             seed: int, mutation: tuple[float, float] | None,
             backend: str = "loop") -> tuple[dict, dict, tuple]:
    """One toy run's final row, trajectory and the notes its method gave (warnings, which a
    widget callback would send only to JupyterLab's log console), kept for the explorer:
    moving alpha re-runs the mutation method only, FedAvg's run is reused (a run is a
    function of these values)."""
    extra = {"alpha": mutation[0], "beta0": mutation[1]} if mutation else {}
    # Evaluated once, after the last round: the picture needs the recorded states of every
    # round but the evaluation (a Hessian per round) of the last only.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history, points = run_toy(name, lr=lr, rounds=rounds, seed=seed, eval_every=rounds,
                                  data_options={"start": [start_x, start_y], "shift": shift},
                                  backend=backend, **extra)
    notes = tuple(dict.fromkeys(str(w.message).removeprefix("flnotes: ") for w in caught))
    return dict(history.rows[-1]), points, notes


def _draws_fedavg(values: dict) -> tuple[bool, tuple[str, ...]]:
    """Whether the figure's run of the chosen method is FedAvg's path, and the warnings the
    method gave on the way."""
    runs = _figure_runs(**values)  # the figure's own runs
    ours, theirs = runs[values["algorithm"]][1]["global"], runs[BASELINE][1]["global"]
    return (ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-6),
            runs[values["algorithm"]][2])


DIVERGED_LOSS = 10.0  # a toy run whose loss ends above this (the start's is about 1) diverged


def diverged_note(values: dict) -> str:
    """Said beside the figure when a run's loss ends far above where it started: which run,
    its loss, and what to lower."""
    runs = _figure_runs(**values)
    gone = {name: loss for name, (final, _, _) in runs.items()
            if not (loss := float(final.get("loss", math.nan))) <= DIVERGED_LOSS}
    if not gone:
        return ""
    lower = "the learning rate" + (", alpha or beta0" if any(reads(n, "alpha", "beta0")
                                                              for n in gone) else "")
    return ("Diverged: " + ", ".join(f"{name}'s loss ends at {loss:.3g}"
                                      for name, loss in gone.items())
            + f", far above where it started; lower {lower}.")


def training_note(values: dict) -> str:
    """Said beside the figure when a run diverged (:func:`diverged_note`), or when the chosen
    method draws a copy of FedAvg's path: either these settings give its own step nothing to
    do (alpha 0, a single round) while the explorer's first settings do, or its extra term
    has nothing to act on in the toy at all (no classifier head, one output), with the reason
    the method gave, if it gave one."""
    method = values["algorithm"]
    gone = diverged_note(values)
    if method == BASELINE or gone:
        return gone
    same, said = _draws_fedavg(values)
    if not same:
        return ""
    toy = _copies_fedavg_on_the_toy(method)
    if not said and toy is None:
        why = [*(["alpha 0 draws no mutants"] if reads(method, "alpha") and
                 values["alpha"] == 0 else []),
               *(["a single round leaves no earlier round to build on"] if values["rounds"] == 1
                 else [])]
        return (f"{method} draws exactly FedAvg's path at these settings: "
                + ("; ".join(why) or "its own step changes nothing at these values")
                + ". At the explorer's first settings its path differs.")
    return (f"{method} draws exactly FedAvg's path here: {'; '.join(said) or toy}. Its own "
            "term acts on a model with classes (the CIFAR-10 and Shakespeare tasks), not on "
            "this toy.")


def _copies_fedavg_on_the_toy(method: str) -> str | None:
    """Why ``method`` draws FedAvg's path at the training explorer's first settings (the
    reason it gave, else the toy's lack of classes), or None where its path differs there."""
    first = {name: parameter.default for name, parameter in
             inspect.signature(training_runs).parameters.items()
             if name not in ("algorithm", "seed")}
    same, said = _draws_fedavg({**first, "algorithm": method})
    if not same:
        return None
    return "; ".join(said) or (f"on the 2-D toy {method}'s own term has nothing to act on "
                               "(the toy's model has no classes)")


def training_explorer(**defaults) -> Explorer:
    """Sliders for the learning rate, rounds, alpha, beta0, the client shift and the start."""
    d = {"algorithm": "fedmut", "lr": 0.1, "rounds": 20, "alpha": 4.0, "beta0": 0.3,
         "shift": 1.0, "start_x": -0.6, "start_y": -0.7, **defaults}
    controls = {
        "algorithm": W.Dropdown(options=algorithm_names(), value=d["algorithm"],
                                description="method"),
        "lr": _slider(d["lr"], 0.01, 0.2, 0.01, "learning rate"),
        "rounds": W.IntSlider(value=d["rounds"], min=1, max=60, description="rounds",
                              continuous_update=False),
        "alpha": _slider(d["alpha"], 0.0, 8.0, 0.5, "alpha"),
        "beta0": _slider(d["beta0"], 0.0, 1.0, 0.05, "beta0"),
        "shift": _slider(d["shift"], 0.0, 2.0, 0.1, "client shift"),
        "start_x": _slider(d["start_x"], -2.0, 2.0, 0.1, "start x"),
        "start_y": _slider(d["start_y"], -2.0, 2.0, 0.1, "start y"),
    }
    def idle(values: dict) -> dict[str, str]:
        method = values["algorithm"]
        if reads(method, "alpha", "beta0"):
            return {}
        why = f"{method} has no mutation: alpha and beta0 are settings of {readers_text('alpha')}"
        return {"alpha": why, "beta0": why}

    scene = TrainingScene()
    return Explorer(scene.figure, controls, "Train the toy federation", idle=idle, scene=scene,
                    note=training_note)


@lru_cache(maxsize=64)
def _minima_of(sharp_width: float):
    """The flat and sharp minima of the training loss, computed once per well width."""
    return flat_and_sharp_minima(flat_and_sharp(sharp_width=sharp_width))


def draw_shift(test_shift: float = 0.3, sharp_width: float = 0.2) -> Figure:
    """Train loss vs a test loss moved by ``test_shift``: the sharp minimum pays much more."""
    train = flat_and_sharp(sharp_width=sharp_width)
    test = train.shifted((test_shift, 0.0))
    minima = _minima_of(float(sharp_width)).clone()  # the shift slider moves the test curve only
    test_losses = test(minima)
    winner = ("flat", "sharp")[int(test_losses.argmin())]
    fig = plots.plot_slices({"train loss": train, "test loss (shifted)": test},
                            (-3.0, 0.0), (3.0, 0.0),
                            title=f"test = train moved by {test_shift:+.2f}:\n"
                                  f"the {winner} minimum has the lower test loss")
    ax = fig.axes[0]
    for point, name, loss in zip(minima, ("flat", "sharp"), test_losses, strict=True):
        # The same quantity as notebook 01's table: test - train at the training minimum.
        gap = float(loss - train(point))
        x = float(point[0])
        ax.plot(x, float(loss), "v", color="tab:red")
        ax.annotate(f"{name}: test {float(loss):.3f}\n(gap {gap:+.3f})", (x, float(loss)),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.8, "lw": 0})
    # Fixed margins that hold the x label and the title: the explorer renders the figure as
    # laid out (no bbox_inches="tight"), and the default bottom margin cut the label off.
    w, h = fig.get_figwidth(), fig.get_figheight()
    fig.subplots_adjust(left=0.8 / w, right=1 - 0.15 / w, bottom=0.6 / h, top=1 - 0.6 / h)
    return fig


def shift_explorer(**defaults) -> Explorer:
    """Sliders for the train/test shift and the sharp well's width."""
    d = {"test_shift": 0.3, "sharp_width": 0.2, **defaults}
    controls = {
        "test_shift": _slider(d["test_shift"], -0.6, 0.6, 0.02, "train/test shift"),
        "sharp_width": _slider(d["sharp_width"], 0.1, 0.6, 0.05, "sharp width"),
    }
    return Explorer(draw_shift, controls, "Flat vs sharp under a train/test shift")


def own_alpha(method: str) -> float | None:
    """A method's own default mutation range (its declared setting), None if it has none."""
    return settings_of(method)["alpha"].default if reads(method, "alpha") else None


RACE_SEEDS = 100  # notebook 04's table: the explorer starts from the same race


class RaceScene(Scene):
    """FedAvg's and one method's final models over the race federation: the landscapes,
    legend and colour bar are drawn once; a move redraws the dots, edge triangles and
    titles."""

    def __init__(self, options: Mapping | None = None) -> None:
        super().__init__()
        self.options = dict(options or {})

    def key(self, values: dict):
        return len({BASELINE, values["algorithm"]})  # panels

    def build(self, values: dict, pyplot: bool):
        fed = make_federation("fedmut-fig1", num_clients=self.options.get("num_clients", 2))
        return plots.EndpointsFigure(fed.global_loss, self.key(values), federation=fed,
                                     columns=2, interval=True, pyplot=pyplot)

    def update(self, drawing, values: dict) -> None:
        drawing.set(race_rows(options=self.options, **values))


def _race_jobs(algorithm: str, alpha: float | None, lr: float, rounds: int, seeds: int,
               options: Mapping | None) -> list[tuple[str, dict]]:
    """The races of a race picture, each (method, :func:`flnotes.toy.race` keywords):
    FedAvg's, then the method's (FedAvg against itself: its race once)."""
    if alpha is None:
        alpha = own_alpha(algorithm) or 0.0
    common = {"seeds": int(seeds), "lr": float(lr), "rounds": int(rounds), **dict(options or {})}
    # the mutation range goes to FedMut/FedQP only; FedAvg's rows do not depend on it
    mutation = {"alpha": float(alpha)} if reads(algorithm, "alpha") else {}
    return [(BASELINE, common), *([(algorithm, {**common, **mutation})]
                                  if algorithm != BASELINE else [])]


def race_rows(algorithm: str = "fedqp", alpha: float | None = None, lr: float = 0.1,
              rounds: int = 15, seeds: int = RACE_SEEDS,
              options: Mapping | None = None) -> list[dict]:
    """FedAvg's and ``algorithm``'s final rows over ``seeds`` runs (see :func:`draw_race`).
    :func:`flnotes.toy.race` keeps each method's rows per setting: changing the method or
    alpha re-runs that method only, and notebook 04's table race is read back."""
    return [row for name, keywords in _race_jobs(algorithm, alpha, lr, rounds, seeds, options)
            for row in race([name], **keywords)]


def race_rows_kept(algorithm: str = "fedqp", alpha: float | None = None, lr: float = 0.1,
                   rounds: int = 15, seeds: int = RACE_SEEDS,
                   options: Mapping | None = None) -> bool:
    """Whether every race of this picture is kept (it redraws at once)."""
    return all(kept_race(name, **keywords)
               for name, keywords in _race_jobs(algorithm, alpha, lr, rounds, seeds, options))


# A race's quick first picture: its first seeds, then all of them. A method whose seeds train
# as one stack takes 1.6x as long for 10 seeds as for 3 (a round's cost is mostly fixed); one
# that runs seed after seed (FML, MimeLite, STEM, ...) about 70 ms a seed on a CPU, so it
# shows fewer.
PREVIEW_SEEDS = 10
PREVIEW_SEEDS_ONE_BY_ONE = 3


def preview_seeds(algorithm: str, rounds: int = 15) -> int:
    """How many seeds a race's quick first picture shows for ``algorithm``: fewer for
    races of more than 15 rounds, never fewer than 2 (a stacked round costs nearly the same
    whatever the seeds: at 40 rounds 3 seeds took 0.35 s on a 2-core CPU, 2 seeds 0.28 s,
    against 0.22 s for 10 seeds at 15 rounds)."""
    first = PREVIEW_SEEDS if stack_trains(algorithm) else PREVIEW_SEEDS_ONE_BY_ONE
    return max(2, round(first * (15 / max(15, int(rounds))) ** 2))


def draw_race(algorithm: str = "fedqp", alpha: float | None = None, lr: float = 0.1,
              rounds: int = 15, seeds: int = RACE_SEEDS, options: Mapping | None = None) -> Figure:
    """Where FedAvg's and one method's final models end over the seeds (a mini race), each
    panel's share of flat runs with its 95% interval.

    ``alpha`` is the mutation range and goes only to the methods that declare it (FedMut,
    FedQP; None: the method's own default); ``options`` are further toy-config overrides
    (clients, start, ...).
    """
    return RaceScene(options).figure(algorithm=algorithm, alpha=alpha, lr=lr, rounds=rounds,
                                     seeds=seeds)


def race_note(values: dict) -> str:
    """Said beside the race when the method races exactly as FedAvg: at alpha 0 (no mutants),
    or because the toy gives its own term nothing to act on (as the training explorer finds
    from its first settings; the reason the method gave, if it gave one)."""
    method = values["algorithm"]
    if reads(method, "alpha") and values["alpha"] == 0:
        return f"{method} races exactly as FedAvg here: alpha 0 draws no mutants."
    why = _copies_fedavg_on_the_toy(method)
    return "" if why is None else f"{method} races exactly as FedAvg here: {why}."


def race_explorer(options: Mapping | None = None, **defaults) -> Explorer:
    """Sliders for one method's alpha, the learning rate, rounds and seeds of a mini race.

    It starts where notebook 04's table stands: the method's own alpha (its declared
    default, which the slider takes again whenever the method changes) and as many seeds.
    """
    options = dict(options or {})  # one copy: the figure, the preview and the races agree
    d = {"algorithm": "fedqp", "lr": 0.1, "rounds": 15, "seeds": RACE_SEEDS, **defaults}
    d.setdefault("alpha", own_alpha(d["algorithm"]) or 0.0)
    controls = {
        "algorithm": W.Dropdown(options=[n for n in algorithm_names() if n != BASELINE],
                                value=d["algorithm"], description="method"),
        "alpha": _slider(d["alpha"], 0.0, 8.0, 0.5, "alpha"),
        "lr": _slider(d["lr"], 0.01, 0.2, 0.01, "learning rate"),
        "rounds": W.IntSlider(value=d["rounds"], min=1, max=40, description="rounds",
                              continuous_update=False),
        "seeds": W.IntSlider(value=d["seeds"], min=2, max=max(200, d["seeds"]), step=1,
                             description="seeds", continuous_update=False),
    }

    def follow(moved: str, values: dict) -> dict:
        alpha = own_alpha(values["algorithm"]) if moved == "algorithm" else None
        return {} if alpha is None else {"alpha": alpha}

    def idle(values: dict) -> dict[str, str]:
        method = values["algorithm"]
        if reads(method, "alpha"):
            return {}
        return {"alpha": f"alpha is the mutation range of {readers_text('alpha')}; {method} "
                         f"has none{renamed_note(method, 'alpha')}"}

    def preview(values: dict):
        """The first seeds' picture first, when the whole race is not kept: a student sees
        an answer at once, then all the seeds."""
        seeds, first = int(values["seeds"]), preview_seeds(values["algorithm"], values["rounds"])
        if values["algorithm"] != BASELINE and not race_rows_kept(
                options=options, **{**values, "algorithm": BASELINE, "seeds": first}):
            first = max(2, first // 2)  # FedAvg races anew too (a new lr or rounds): half each
        if seeds <= first or race_rows_kept(options=options, **values):
            return None
        return ({"seeds": first},
                f"the first {first} of {seeds} seeds; the other {seeds - first} are running...")

    explorer = Explorer(partial(draw_race, options=options), controls,
                        "A mini race against FedAvg", idle=idle, follow=follow,
                        note=race_note, scene=RaceScene(options), preview=preview,
                        prepare=lambda values: race_rows(options=options, **values))
    warm_up([BASELINE, *controls["algorithm"].options])  # their first runs' imports, now
    return explorer
