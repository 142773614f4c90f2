"""Explorers redraw without a browser; every toy plot function returns a Figure."""

import io
import threading

import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import HERE, REOPENED, explorers_in  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flnotes import plots as shared_plots  # noqa: E402
from flnotes import toy  # noqa: E402
from flnotes.repro.notebooks import TEACHING  # noqa: E402
from flnotes.toy import plots, widgets  # noqa: E402
from flnotes.toy.landscapes import make_federation  # noqa: E402

FAST = {  # small settings so each callback is quick
    "mutation_explorer": {"num_models": 4},
    "client_explorer": {},
    "training_explorer": {"rounds": 2},
    "shift_explorer": {},
    "race_explorer": {"seeds": 2, "rounds": 2},
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("name", list(FAST))
def test_explorer_callbacks_return_figures(name):
    explorer = getattr(widgets, name)(**FAST[name])
    assert isinstance(explorer.figure(), Figure)
    png = explorer.refresh()  # what a redraw shows: the figure rendered once, as PNG
    assert png.startswith(b"\x89PNG")
    # Moving a control redraws (through the observer) with the new value.
    control, widget = next((n, w) for n, w in explorer.controls.items()
                           if hasattr(w, "max") and isinstance(w.value, float))
    drawn = []
    explorer.draw = lambda **values: drawn.append(values) or Figure()
    explorer.scene = None  # redraw through the spy, not the explorer's kept figure
    new = (widget.value + widget.max) / 2
    explorer.set(**{control: new})
    assert explorer.values()[control] == pytest.approx(new, abs=widget.step)
    assert drawn and drawn[-1][control] == pytest.approx(new, abs=widget.step)


def _image(png: bytes):
    from PIL import Image as PILImage

    image = PILImage.open(io.BytesIO(png))
    image.load()
    return image


def _pixels(png: bytes) -> bytes:
    return _image(png).convert("RGBA").tobytes()


def test_displayed_explorer_updates_its_image_in_place(monkeypatch):
    """The figure is an image widget (every page showing the notebook follows it, a reloaded
    one too) with the stored PNG beside it in the same output, for viewers without widgets."""
    import base64

    shown = []
    monkeypatch.setattr(widgets, "display", lambda obj, raw=False: shown.append(obj))
    explorer = widgets.shift_explorer()
    explorer._ipython_display_()
    # the picture, a line saying how to revive the controls, the controls with a text
    # fallback for viewers without widgets
    view = "application/vnd.jupyter.widget-view+json"
    assert shown[0][view]["model_id"] == explorer.image.model_id
    stored = base64.b64decode(shown[0]["image/png"])
    assert _pixels(stored) == _pixels(explorer.image.value) == _pixels(explorer.png())
    assert "run this cell" in shown[1].data
    model = shown[2][view]["model_id"]
    assert model == explorer.box.model_id and "run this cell" in shown[2]["text/plain"]
    explorer.set(test_shift=0.4)  # the default is 0.3: a move, so a redraw
    # the new value's picture (stored PNGs are compressed harder: compare pixels)
    assert _pixels(explorer.image.value) == _pixels(explorer.png()) != _pixels(stored)


@pytest.mark.parametrize("name, move", [("client_explorer", {"shift": 0.5}),
                                        ("training_explorer", {"lr": 0.12}),
                                        ("mutation_explorer", {"qp_prob": 0.7})])
def test_a_displayed_explorer_has_built_its_figure_before_the_first_move(monkeypatch, name,
                                                                        move):
    """Displaying an explorer builds its scene's kept figure (and the client explorer's
    frames of every number of clients): the student's first move only redraws, as every
    later move does, and shows what a fresh figure shows."""
    import numpy as np

    monkeypatch.setattr(widgets, "display", lambda obj, raw=False: None)
    ex = getattr(widgets, name)(**FAST[name])
    ex._ipython_display_()
    built = []
    original = ex.scene.build
    monkeypatch.setattr(ex.scene, "build", lambda *a, **k: built.append(a) or original(*a, **k))
    renders = []
    rendered = widgets.Scene._render_background  # a static method, called through the class
    monkeypatch.setattr(widgets.Scene, "_render_background",
                        staticmethod(lambda *a: renders.append(a) or rendered(*a)))
    ex.set(**move)
    if name == "client_explorer":
        ex.set(num_clients=4)  # another number of clients: its frames were rendered too
    assert built == [] and renders == []
    kept = np.asarray(_image(ex.last_png).convert("RGB"), dtype=int)
    fig = ex.figure()
    fresh = np.asarray(_image(widgets.figure_png(fig)).convert("RGB"), dtype=int)
    plt.close(fig)
    assert kept.shape == fresh.shape and (np.abs(kept - fresh).sum(-1) > 30).sum() <= 20


STOPPED_MOVES = {  # a move to a new figure layout, then moves to it, back, and elsewhere
    "client_explorer": [{"num_clients": 4}, {"num_clients": 2, "level": -0.8},
                        {"num_clients": 3}],
    "mutation_explorer": [{"alpha": 8.0}, {"alpha": 4.0, "qp_prob": 0.8},
                          {"alpha": 8.0, "kind": "sign"}],
}


@pytest.mark.parametrize("name", STOPPED_MOVES)
@pytest.mark.parametrize("where", ["landscape", "frames"])
def test_a_move_stopped_midway_leaves_a_shared_figure_drawing_right(monkeypatch, name, where):
    """Ctrl-C (or an error) inside a redraw of an explorer's one shared figure (the client
    explorer's for every number of clients, the mutation explorer's for every window), while
    it draws a landscape or renders frames: the next moves still show what a fresh figure
    shows."""
    import numpy as np

    ex = getattr(widgets, name)(**FAST[name])
    ex.png()
    moves = STOPPED_MOVES[name]
    with monkeypatch.context() as m:
        if where == "landscape":  # after the last landscapes were removed
            def stop(*args, **kwargs):
                raise KeyboardInterrupt

            m.setattr(plots, "draw_landscape", stop)
        else:  # while the frames of a new layout are rendered, moving artists hidden
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            def stop(canvas):
                raise KeyboardInterrupt

            ex.scene.forget()  # (the client explorer rendered every layout's frames)
            m.setattr(FigureCanvasAgg, "draw", stop)
        with pytest.raises(KeyboardInterrupt):
            ex.scene.png({**ex.values(), **moves[0]})
    for move in moves:
        ex.set(**move)
        kept = np.asarray(_image(ex.last_png).convert("RGB"), dtype=int)
        fig = ex.figure()
        fresh = np.asarray(_image(widgets.figure_png(fig)).convert("RGB"), dtype=int)
        plt.close(fig)
        assert kept.shape == fresh.shape, move
        assert (np.abs(kept - fresh).sum(-1) > 30).sum() <= 20, move


@pytest.mark.parametrize("name, moves", [
    ("client_explorer", [{"level": -0.4}, {"level": -0.9}, {"num_clients": 3},
                         {"shift": 0.4}]),
    ("mutation_explorer", [{"alpha": 8.0}, {"alpha": 4.0}, {"alpha": 8.0, "beta": 0.5}]),
    ("training_explorer", [{"shift": 0.5}, {"shift": 1.5}]),
])
def test_an_explorer_in_use_keeps_one_colour_bar_per_figure(name, moves):
    """A kept figure that draws new landscapes moves its one colour bar to their levels: a
    new bar in a cleared colour-bar axes kept every earlier bar and its contours alive (the
    axes' locator chained them), so memory grew with every move."""
    import gc

    from matplotlib.colorbar import Colorbar

    def bars() -> int:
        gc.collect()
        return sum(isinstance(o, Colorbar) for o in gc.get_objects())

    ex = getattr(widgets, name)(**FAST[name])
    for move in moves:  # every layout and window of these moves seen once
        ex.set(**move)
    seen = bars()
    for _ in range(4):
        for move in moves:
            ex.set(**move)
    assert bars() == seen


def test_mutation_drawing_depends_on_p():
    calls = []
    original = toy.mutation_points

    def spy(*args, **kwargs):
        calls.append(kwargs["qp_prob"])
        return original(*args, **kwargs)

    widgets._mutation_panels.cache_clear()  # an earlier test may have drawn this setting
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(widgets, "mutation_points", spy)
        widgets.draw_mutations(qp_prob=0.7, num_models=4)
    assert 0.0 in calls and 0.7 in calls  # FedMut panel (no projection) and FedQP panel


def test_plot_functions_return_figures():
    fed = make_federation("fedmut-fig1")
    fn = fed.global_loss
    history, points = toy.run_toy("fedavg", rounds=2)
    rows = toy.race(["fedavg", "fedprox"], seeds=2, rounds=2)
    mutants = toy.mutation_points((0.0, 1.0), (0.1, 0.1), num_models=4)
    figures = [
        plots.plot_landscape(fn, title="global", num=21),
        plots.plot_surface(fn, num=11),
        plots.plot_slices({"a": fn, "b": fed.clients[0]}, (-2.0, -1.0), (2.0, -1.0)),
        plots.plot_client_landscapes(fed),
        plots.plot_trajectories(fn, {"fedavg": points}, federation=fed),
        plots.plot_mutants(fn, (0.0, 1.0), (0.1, 0.1), {"sign": mutants}, {"sign": mutants}),
        plots.plot_endpoints(fn, rows, federation=fed),
        plots.plot_race(rows),
        shared_plots.plot_learning_curves({"fedavg": history}, metric="loss"),
    ]
    for fig in figures:
        assert isinstance(fig, Figure) and fig.axes
    rounds = figures[-1].axes[0].get_xticks()
    assert all(float(r).is_integer() for r in rounds)  # rounds are whole numbers
    # The trajectory panel draws the run's global path.
    lines = [line for line in figures[4].axes[0].lines if line.get_label() == "global model"]
    assert torch.allclose(torch.tensor(lines[0].get_xydata()), points["global"].double())


def test_shift_figure_gaps_are_the_notebooks_test_minus_train():
    from flnotes.toy.landscapes import flat_and_sharp, flat_and_sharp_minima

    train = flat_and_sharp()
    minima = flat_and_sharp_minima(train)
    gaps = train.shifted((0.3, 0.0))(minima) - train(minima)
    texts = [t.get_text() for t in widgets.draw_shift(test_shift=0.3).axes[0].texts]
    for name, gap in zip(("flat", "sharp"), gaps.tolist(), strict=True):
        assert any(t.startswith(f"{name}:") and f"gap {gap:+.3f}" in t for t in texts)


def test_endpoints_count_models_beyond_the_frame():
    fed = make_federation("fedmut-fig1")
    rows = [{"algorithm": "fedqp", "x": x, "y": y, "accuracy": 0.0}
            for x, y in [(0.0, 1.0), (9.0, 0.0), (0.0, -12.0)]]
    ax = plots.plot_endpoints(fed.global_loss, rows, federation=fed, columns=1).axes[0]
    assert "2 off the map (median |w| 10.5)" in ax.get_title()
    assert ax.get_xlim() == pytest.approx(plots.LIMITS[0])  # the frame did not grow


def test_log_colour_scale_and_label():
    fig = plots.plot_landscape(lambda p: p.pow(2).sum(-1) * 10 - 0.05, num=21, log=True,
                               label="curvature")
    assert fig.axes[-1].get_ylabel() == "curvature"  # the colour bar


def test_controls_that_do_nothing_are_disabled_with_a_reason():
    training = widgets.training_explorer(algorithm="fedavg", rounds=2)
    for name in ("alpha", "beta0"):
        assert training.controls[name].disabled
        assert "fedavg has no mutation" in training.reasons[name].value
    training.set(algorithm="fedmut")  # now they apply
    assert not training.controls["alpha"].disabled and training.reasons["alpha"].value == ""
    assert not training.controls["lr"].disabled  # a control that always applies

    mutations = widgets.mutation_explorer(num_models=4)  # default kind: gaussian
    assert mutations.controls["beta"].disabled
    assert "Gaussian" in mutations.reasons["beta"].value
    mutations.set(kind="sign")
    assert not mutations.controls["beta"].disabled

    clients = widgets.client_explorer()
    assert not clients.controls["shift"].disabled
    clients.set(num_clients=1)  # one client: the shift moves nothing (checked below)
    assert clients.controls["shift"].disabled and "one client" in clients.reasons["shift"].value
    assert _pixels(clients.png(shift=0.0)) == _pixels(clients.png(shift=2.0))

    race = widgets.race_explorer(algorithm="fedup", seeds=2, rounds=2)
    assert race.controls["alpha"].disabled and "penalty weight" in race.reasons["alpha"].value
    assert race.status == ""  # no busy note left behind after a redraw


def test_the_race_gives_alpha_to_mutation_methods_only(monkeypatch):
    from flnotes.toy import experiments

    calls = []

    def fake_runs(algorithms, seeds, processes, stack, progress, overrides):
        calls.extend((a, overrides.get("alpha")) for a in algorithms)
        return [[{"algorithm": a, "x": 0.0, "y": 0.0, "accuracy": 0.0, "seed": s}
                 for s in seeds] for a in algorithms]

    monkeypatch.setattr(experiments, "_run_races", fake_runs)
    toy.forget_races()
    try:
        widgets.race_rows("fedup", alpha=3.0, seeds=2, rounds=2)
        widgets.race_rows("fedqp", alpha=3.0, seeds=2, rounds=2)
        widgets.race_rows("fedqp", alpha=2.0, seeds=2, rounds=2)
        # FedAvg against itself: one panel, its seeds once (not each twice)
        assert len(widgets.race_rows("fedavg", seeds=2, rounds=2)) == 2
    finally:
        toy.forget_races()  # no fake rows for later tests
    # FedAvg ran once for the races (kept by toy.race); FedUp without alpha (its alpha is
    # another setting: a penalty weight keeps its default); FedQP once per alpha.
    assert calls.count(("fedavg", None)) == 1
    assert set(calls) == {("fedavg", None), ("fedup", None), ("fedqp", 3.0), ("fedqp", 2.0)}


@pytest.mark.parametrize("explorer, moves", [
    # a new shift draws a new landscape into the kept frames; 1.0 again restores its layer
    ("training_explorer", [{"rounds": 3}, {"algorithm": "fedqp"}, {"shift": 0.5},
                           {"algorithm": "fedavg"}, {"shift": 1.0, "algorithm": "fedmr"},
                           {"shift": 0.0}, {"shift": 2.0}, {"shift": 1.0}]),
    # alpha 8 widens the window of the one kept figure, 4 narrows it back (a kept window)
    ("mutation_explorer", [{"qp_prob": 1.0}, {"layerwise": True}, {"alpha": 2.0},
                           {"kind": "sign"}, {"alpha": 8.0}, {"kind": "gaussian"},
                           {"alpha": 4.0}, {"alpha": 8.0, "qp_prob": 0.3}]),
    # one figure laid out for every number of clients: to 4 and 1 (new layouts of the kept
    # panels), back to 2 (a kept layout, shown after others)
    ("client_explorer", [{"shift": 0.5}, {"level": -0.9}, {"num_clients": 3},
                         {"depth_spread": 0.4}, {"num_clients": 2}, {"num_clients": 4},
                         {"num_clients": 1}, {"num_clients": 2, "level": -1.2}]),
    # FedQP at alpha 8 sends runs off the map: edge triangles and a third title line
    ("race_explorer", [{"alpha": 8.0}, {"rounds": 6}, {"algorithm": "clusamp"},
                       {"seeds": 5}, {"algorithm": "fedqp", "alpha": 2.0}]),
])
def test_a_kept_figure_redraws_what_a_fresh_figure_draws(explorer, moves):
    """A scene's redraw (background rendered once per landscape, moving artists drawn onto
    it) must show what a new, fully drawn figure of the same values shows."""
    import numpy as np

    ex = getattr(widgets, explorer)(**FAST[explorer])
    ex.png()
    for move in moves:
        ex.set(**move)
        kept = np.asarray(_image(ex.png()).convert("RGB"), dtype=int)
        fig = ex.figure()
        fresh = np.asarray(_image(widgets.figure_png(fig)).convert("RGB"), dtype=int)
        plt.close(fig)
        assert kept.shape == fresh.shape, move
        # A few antialiased pixels where a moving artist meets a static one may differ; a
        # missing or misordered artist differs in hundreds.
        assert (np.abs(kept - fresh).sum(-1) > 30).sum() <= 20, move


def test_one_clients_figure_laid_out_for_each_number_is_the_figure_built_for_it():
    """The client explorer keeps one figure with panels for up to 4 clients and lays it out
    for the number chosen: drawn in full, it must be the figure built for that number (its
    width, panels, ticks, titles), in any order of moves."""
    import numpy as np

    shared = plots.ClientsFigure(2, pyplot=False, most=4)
    for clients in (4, 1, 3, 2):
        fed = make_federation("fedmut-fig1", num_clients=clients, shift=0.7)
        shared.layout(clients)
        kept = np.asarray(_image(widgets.figure_png(shared.set(fed, -0.6))).convert("RGB"),
                          dtype=int)
        fresh_figure = plots.ClientsFigure(clients, pyplot=False)
        fresh = np.asarray(_image(widgets.figure_png(fresh_figure.set(fed, -0.6)))
                           .convert("RGB"), dtype=int)
        assert kept.shape == fresh.shape, clients
        assert (np.abs(kept - fresh).sum(-1) > 30).sum() == 0, clients
    with pytest.raises(ValueError, match="panels for 1 to 4 clients"):
        shared.layout(5)


def test_mutation_regions_are_the_disc_and_its_projection():
    """The shaded regions: the disc of radius alpha |g| and, through FedQP's projection
    code, the half disc ahead of the global model (FedQP Fig. 1's fan)."""
    import math

    center, g, alpha = (0.2, 1.0), (-0.3, 0.15), 3.0
    radius = alpha * math.hypot(*g)
    disc = toy.mutation_region(center, g, alpha) - torch.tensor(center, dtype=torch.float64)
    assert torch.allclose(disc.norm(dim=1), torch.full_like(disc[:, 0], radius))
    fan = toy.mutation_region(center, g, alpha, projected=True)
    moved = fan - torch.tensor(center, dtype=torch.float64)
    ahead = moved @ torch.tensor(g, dtype=torch.float64)
    # the toy's layers are float32: the projection holds to float32's precision
    assert (ahead >= -1e-6).all() and (moved.norm(dim=1) <= radius + 1e-6).all()
    # Its area is half the disc's (shoelace formula), up to the polygon's chords.
    x, y = fan[:, 0], fan[:, 1]
    area = 0.5 * abs(float((x * y.roll(-1) - x.roll(-1) * y).sum()))
    assert area == pytest.approx(math.pi * radius**2 / 2, rel=2e-3)
    assert toy.mutation_region(center, g, 0.0, projected=True).shape == (180, 2)  # a point


@pytest.mark.parametrize("name, start", [(n, {}) for n in FAST] + [
    ("mutation_explorer", {"kind": "sign"}),  # beta enabled
    ("client_explorer", {"num_clients": 1}),  # shift disabled
    ("training_explorer", {"algorithm": "fedavg"}),  # alpha, beta0 disabled
])
def test_every_enabled_control_changes_the_picture(name, start):
    """A control either changes what the student sees or is disabled with its reason: moving
    each enabled control away from its default must change the explorer's image."""
    ex = getattr(widgets, name)(**{**FAST[name], **start})
    default = _pixels(ex.png())
    for control, widget in ex.controls.items():
        if widget.disabled:
            assert ex.reasons[control].value, f"{name}: {control} disabled without a reason"
            continue
        if isinstance(widget, W.Dropdown):
            other = next(o for o in widget.options if o != widget.value)
        elif isinstance(widget, W.Checkbox):
            other = not widget.value
        else:
            other = widget.max if widget.value != widget.max else widget.min
        assert _pixels(ex.png(**{control: other})) != default, f"{name}: {control}"


def _other_value(widget):
    """A value of the control other than its current one: another option, the far end."""
    if isinstance(widget, W.Dropdown):
        return next(o for o in widget.options if o != widget.value)
    if isinstance(widget, W.Checkbox):
        return not widget.value
    return widget.max if widget.value != widget.max else widget.min


def _differing_pixels(png_a: bytes, png_b: bytes) -> int:
    import numpy as np

    a = np.asarray(_image(png_a).convert("RGB"), dtype=int)
    b = np.asarray(_image(png_b).convert("RGB"), dtype=int)
    assert a.shape == b.shape
    return int((np.abs(a - b).sum(-1) > 30).sum())


# Starting settings under which the ends test moves an explorer's controls: together they
# enable every control (beta only under sign mutations, which disable num_models).
ENDS_STARTS = [(name, {}) for name in FAST] + [("mutation_explorer", {"kind": "sign"})]


def _ends(widget) -> list:
    if isinstance(widget, W.Dropdown):
        return [widget.options[-1], widget.options[0]]
    if isinstance(widget, W.Checkbox):
        return [not widget.value, widget.value]
    return [widget.max, widget.min]


@pytest.mark.parametrize("name, start", ENDS_STARTS)
def test_every_control_at_its_ends_draws_what_a_fresh_figure_draws(name, start):
    """Every control enabled at the start to both of its ends (a slider's top and bottom, a
    dropdown's last and first option, a checkbox both ways), one after another as a student
    leaves them, set through the observer as the browser sets them: each redraw raises
    nothing and shows what a fresh full draw of that setting shows. Sliders first, dropdowns
    last, so that no option disables a control still to be moved. The browser test types
    one end per explorer into a readout; every control's ends are checked here, where each
    costs a redraw, not a browser round trip."""
    ex = getattr(widgets, name)(**{**FAST[name], **start})
    ex.png()
    enabled = [c for c, w in ex.controls.items() if not w.disabled]
    order = sorted(enabled, key=lambda c: (isinstance(ex.controls[c], W.Dropdown),
                                           isinstance(ex.controls[c], W.Checkbox)))
    held = {c: {ex.controls[c].value} for c in order}
    for control in order:
        widget = ex.controls[control]
        for value in _ends(widget):
            if widget.disabled or widget.value == value:
                continue
            ex.last_png = None
            widget.value = value
            held[control].add(widget.value)
            shown = ex.last_png
            assert shown is not None, f"{name}: {control} = {value} did not redraw"
            fig = ex.figure()
            fresh = widgets.figure_png(fig)
            plt.close(fig)
            assert _differing_pixels(shown, fresh) <= 20, f"{name}: {control} = {value}"
    missed = {c: sorted(set(_ends(ex.controls[c])) - held[c], key=str) for c in order
              if not set(_ends(ex.controls[c])) <= held[c]}
    assert not missed, f"{name}: controls never at these ends: {missed}"


def test_the_ends_test_starts_enable_every_control():
    """ENDS_STARTS leave no control of any explorer unmoved: each is enabled in one start."""
    enabled: dict[str, set] = {}
    for name, start in ENDS_STARTS:
        ex = getattr(widgets, name)(**{**FAST[name], **start})
        enabled.setdefault(name, set()).update(c for c, w in ex.controls.items()
                                               if not w.disabled)
    for name in FAST:
        assert enabled[name] == set(getattr(widgets, name)(**FAST[name]).controls), name


FIRST_MOVES = [(name, control) for name, controls in {
    "mutation_explorer": ["alpha", "beta", "qp_prob", "kind", "layerwise", "num_models"],
    "client_explorer": ["shift", "depth_spread", "num_clients", "level"],
    "training_explorer": ["algorithm", "lr", "rounds", "alpha", "beta0", "shift", "start_x",
                          "start_y"],
    "shift_explorer": ["test_shift", "sharp_width"],
    "race_explorer": ["algorithm", "alpha", "lr", "rounds", "seeds"],
}.items() for control in controls]


@pytest.mark.parametrize("name, control", FIRST_MOVES)
def test_the_first_image_after_a_move_is_a_fresh_full_draw(name, control):
    """the first picture of a new figure (a new client shift, number of clients,
    zoom) lost its titles until the next move. The image a control's first move shows must
    be what a fresh, fully drawn figure of that setting shows: titles, legends, labels."""
    ex = getattr(widgets, name)(**{**FAST[name], **({"kind": "sign"} if control == "beta"
                                                    else {})})
    widget = ex.controls[control]
    if widget.disabled:  # e.g. beta under Gaussian mutations: checked elsewhere
        pytest.skip(f"{control} is disabled at the start")
    if name == "race_explorer" and control == "seeds":
        value = 3  # the far end would race 200 seeds
    else:
        value = _other_value(widget)
    widget.value = value  # as the browser sets it: through the observer
    shown = ex.last_png
    assert shown is not None, "the move did not redraw"
    fig = ex.figure()
    fresh = widgets.figure_png(fig)
    plt.close(fig)
    assert _differing_pixels(shown, fresh) <= 20, f"{name}: {control} = {value}"


def test_sign_mutation_of_the_whole_vector_disables_k_and_shades_nothing():
    ex = widgets.mutation_explorer(kind="sign", layerwise=False, num_models=4, qp_prob=1.0)
    assert ex.controls["num_models"].disabled and "two points" in ex.note.value
    assert "two mutants" in ex.reasons["num_models"].value
    assert _pixels(ex.png(num_models=2)) == _pixels(ex.png(num_models=16))
    assert toy.mutation_regions((0.0, 1.0), (0.1, 0.1), 4.0, 0.5, False, "sign") == {}
    ex.set(layerwise=True)
    assert not ex.controls["num_models"].disabled


def test_the_mutation_window_widens_to_hold_every_mutant():
    center, update = (0.0, 1.1), (-0.3, 0.15)
    ex = widgets.mutation_explorer(center=center, update=update, half_width=1.8,
                                   num_models=4)
    assert ex.note.value == ""
    for alpha in (6.5, 8.0):
        ex.set(alpha=alpha)
        values = ex.values()
        half = ex.scene.half(values)
        panels, clouds, scale, regions = ex.scene.panels(values)
        points = torch.cat([*panels.values(), *clouds.values()]).double()
        assert (points - torch.tensor(center)).abs().max() <= half
        assert scale * max(abs(u) for u in update) <= half
        assert half > 1.8 and "widened" in ex.note.value
        ax = ex.figure().axes[0]
        assert ax.get_xlim()[1] == pytest.approx(center[0] + half)


def test_a_method_that_draws_fedavgs_path_says_so_beside_the_figure():
    ex = widgets.training_explorer(algorithm="fedntd", rounds=2)
    assert "exactly FedAvg's path" in ex.note.value
    ex.set(algorithm="moon")
    assert "exactly FedAvg's path" in ex.note.value and "classifier head" in ex.note.value
    ex.set(algorithm="fedmut")
    assert ex.note.value == ""


TRAINING_FIRST = {"lr": 0.1, "rounds": 20, "alpha": 4.0, "beta0": 0.3, "shift": 1.0,
                  "start_x": -0.6, "start_y": -0.7}  # the training explorer's first settings


@pytest.mark.parametrize("method, moved, reason", [
    ("fedmut", {"alpha": 0.0}, "alpha 0 draws no mutants"),
    ("fedqp", {"alpha": 0.0}, "alpha 0 draws no mutants"),
    ("fedmut", {"rounds": 1}, "a single round leaves no earlier round to build on")])
def test_a_copy_of_fedavg_made_by_the_settings_says_so(method, moved, reason):
    """A mutation method at alpha 0, or in one round, draws FedAvg's path because of those
    settings, not because the toy has no classes: the note names the setting."""
    values = {"algorithm": method, **TRAINING_FIRST}
    assert widgets.training_note(values) == ""  # its own path at the first settings
    note = widgets.training_note({**values, **moved})
    assert f"{method} draws exactly FedAvg's path at these settings: {reason}." in note
    assert "no classes" not in note


@pytest.mark.parametrize("method", ["moon", "fedgen", "fedntd"])
def test_a_method_that_races_as_fedavg_says_so_beside_the_race(method):
    """The race gives these methods FedAvg's rows (their term needs classes); the note says
    so, as the training explorer does, and a method that does race apart gets none."""
    assert widgets._draws_fedavg({**TRAINING_FIRST, "algorithm": method})[0]
    ex = widgets.race_explorer(algorithm=method, seeds=2, rounds=2)
    assert f"{method} races exactly as FedAvg here: " in ex.note.value
    assert widgets.race_note({**ex.values(), "algorithm": "fedqp", "alpha": 2.0}) == ""
    assert widgets.race_note({**ex.values(), "algorithm": "fedqp", "alpha": 0.0}) == (
        "fedqp races exactly as FedAvg here: alpha 0 draws no mutants.")


def test_the_mutation_explorer_at_alpha_zero_says_why_only_the_global_model_shows():
    ex = widgets.mutation_explorer()
    assert "At alpha = 0" not in ex.note.value
    ex.set(alpha=0.0)
    assert "At alpha = 0 every mutant is the global model itself" in ex.note.value
    ex.set(kind="sign")  # no "two points" line either: there are none
    assert "two points" not in ex.note.value and "At alpha = 0" in ex.note.value


def test_a_run_that_diverges_says_so_beside_the_figure():
    """FedQP with beta0 1 at lr 0.1: its mutants overshoot and the loss ends near 1e8 while
    the title alone showed the number; the note names the run and what to lower."""
    ex = widgets.training_explorer(algorithm="fedqp", rounds=30)
    assert "Diverged" not in ex.note.value  # beta0 0.3: a sound run
    ex.set(beta0=1.0)
    loss = widgets._figure_runs(**ex.values())["fedqp"][0]["loss"]
    assert loss > widgets.DIVERGED_LOSS
    assert f"Diverged: fedqp's loss ends at {loss:.3g}, far above where it started; lower " \
        "the learning rate, alpha or beta0." in ex.note.value


@pytest.mark.parametrize("method", ["fedntd", "fedgen", "moon"])
def test_a_figures_runs_share_one_backend_so_a_copy_of_fedavg_stays_a_copy(method):
    """At a high learning rate over many rounds the toy is chaotic: FedAvg on the stack and
    a method on the loop would part by float rounding alone. Both runs of a figure train on
    one backend, so a method that trains as FedAvg still draws exactly FedAvg's path."""
    values = {"algorithm": method, "lr": 0.2, "rounds": 60, "alpha": 4.0, "beta0": 0.3,
              "shift": 1.0, "start_x": -0.6, "start_y": -0.7}
    assert "exactly FedAvg's path" in widgets.training_note(values)
    shown = widgets._training_backend([widgets.BASELINE, method])
    assert shown == widgets._training_backend([method])
    assert widgets._training_backend([widgets.BASELINE, "fedmut"]) == "vmap"


def test_the_race_starts_from_the_methods_defaults_and_shows_an_interval():
    from flnotes.algorithms import settings_of

    race = widgets.race_explorer(seeds=3, rounds=2)
    assert race.values()["alpha"] == settings_of("fedqp")["alpha"].default
    assert widgets.race_explorer().values()["seeds"] == widgets.RACE_SEEDS
    race.set(algorithm="fedmut")  # the slider takes the new method's own alpha
    assert race.values()["alpha"] == settings_of("fedmut")["alpha"].default
    fig = race.figure()
    assert all("95% interval" in ax.get_title() for ax in fig.axes[:2])
    assert plots.share_interval(0, 10)[0] == 0.0 and plots.share_interval(10, 10)[1] == 1.0


def test_drawing_note_sits_beside_the_control_that_moved():
    ex = widgets.shift_explorer()
    seen = []
    ex.busy["sharp_width"].observe(lambda change: seen.append(change["new"]), names="value")
    ex.set(sharp_width=0.3)
    assert any("drawing" in text for text in seen) and ex.status == ""
    row = next(child for child in ex.box.children
               if isinstance(child, W.HBox) and ex.controls["sharp_width"] in child.children)
    assert ex.busy["sharp_width"] in row.children


def test_the_shift_figure_keeps_its_labels_inside():
    fig = widgets.draw_shift()
    fig.canvas.draw()
    box = fig.bbox
    ax = fig.axes[0]
    for text in (ax.xaxis.label, ax.yaxis.label, ax.title):
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text.get_text()
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, text.get_text()


def test_cell_values_take_the_notebooks_values_else_the_defaults():
    assert widgets.cell_values({"lr": 0.05}, lr=0.1, rounds=30) == {"lr": 0.05, "rounds": 30}


def test_a_long_race_shows_its_first_seeds_then_all_of_them():
    """A race not yet run shows the first PREVIEW_SEEDS seeds' picture at once (a fresh
    draw of that setting), then the whole race's; a race already run redraws in one step."""
    import numpy as np

    def pixels(png: bytes):
        return np.asarray(_image(png).convert("RGB"), dtype=int)

    def fresh(**values):
        fig = ex.figure(**values)
        try:
            return pixels(widgets.figure_png(fig))
        finally:
            plt.close(fig)

    toy.forget_races()  # a race kept by an earlier test would need no quick picture
    seeds = widgets.PREVIEW_SEEDS + 2
    ex = widgets.race_explorer(seeds=seeds, rounds=2)
    ex.png()
    ex.set(alpha=3.0)  # FedQP at a new alpha: not run yet
    assert ex.last_preview is not None
    for shown, want in ((ex.last_preview, fresh(seeds=widgets.PREVIEW_SEEDS)),
                        (ex.last_png, fresh())):
        assert (np.abs(pixels(shown) - want).sum(-1) > 30).sum() <= 20
    assert ex.note.value == ""  # the "first seeds" line is gone with the whole picture
    ex.set(alpha=2.0)  # the starting race, kept
    assert ex.last_preview is None
    # A new learning rate: FedAvg's race is new too, so each shows half as many first seeds
    half = widgets.PREVIEW_SEEDS // 2
    assert ex.preview({**ex.values(), "lr": 0.12})[0] == {"seeds": half}
    ex.set(lr=0.12)
    assert (np.abs(pixels(ex.last_preview) - fresh(seeds=half)).sum(-1) > 30).sum() <= 20
    ex.set(lr=0.1)
    small = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS, rounds=2)
    small.set(alpha=3.5)
    assert small.last_preview is None  # nothing quicker to show
    # A method whose seeds run one after another shows fewer first
    assert widgets.preview_seeds("fml") == widgets.PREVIEW_SEEDS_ONE_BY_ONE < seeds
    ex.set(algorithm="fml")
    assert ex.last_preview is not None
    want = fresh(seeds=widgets.PREVIEW_SEEDS_ONE_BY_ONE)
    assert (np.abs(pixels(ex.last_preview) - want).sum(-1) > 30).sum() <= 20


def test_off_map_models_are_triangles_on_the_edge_pointing_the_way_they_went():
    """draw_off_frame against a hand computation: each model beyond the frame is a triangle
    at its point clipped into the inset frame, pointing from the frame's centre towards it,
    in its own colour; the count and the median distance from the origin are returned."""
    import math

    from matplotlib.colors import to_rgba

    fig, ax = plt.subplots()
    (x0, x1), (y0, y1) = plots.LIMITS
    pad_x, pad_y = 0.04 * (x1 - x0), 0.04 * (y1 - y0)
    points = [(0.0, 0.0), (10.0, 0.5), (0.3, -9.0), (-7.0, 7.0)]
    colors = ["white", "red", "white", "red"]
    off, distance = plots.draw_off_frame(ax, points, colors, plots.LIMITS[0], plots.LIMITS[1])
    plt.close(fig)
    outside = points[1:]
    assert off == 3
    assert distance == pytest.approx(sorted(math.hypot(*p) for p in outside)[1])
    triangles = ax.collections[-1]
    centre = ((x0 + x1) / 2, (y0 + y1) / 2)
    for k, (x, y) in enumerate(outside):
        edge = (min(max(x, x0 + pad_x), x1 - pad_x), min(max(y, y0 + pad_y), y1 - pad_y))
        assert tuple(triangles.get_offsets()[k]) == pytest.approx(edge)
        assert tuple(triangles.get_facecolors()[k]) == pytest.approx(to_rgba(colors[k + 1]))
        # a regular triangle whose first vertex, (0, 1) before turning, is the apex
        apex = triangles.get_paths()[k].vertices[0]
        want = math.atan2(y - centre[1], x - centre[0])
        assert math.atan2(apex[1], apex[0]) == pytest.approx(want, abs=1e-9)


def test_an_explorer_settles_the_garbage_collector_once(monkeypatch):
    """The first explorer of a kernel collects and freezes what is alive, so that a full
    collection (0.15-0.25 s with torch and matplotlib loaded) no longer lands inside a
    redraw; later explorers leave the collector alone. (A frozen object freed by reference
    counting leaves the frozen set, so the count itself is not compared.)"""
    import gc

    done = []
    monkeypatch.setattr(widgets, "_GC_SETTLED", False)  # as in a fresh kernel
    monkeypatch.setattr(gc, "collect", lambda *a: done.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: done.append("freeze"))
    widgets.shift_explorer()
    widgets.shift_explorer()
    assert done == ["collect", "freeze"] and widgets._GC_SETTLED


def test_every_figure_in_a_notebook_shows_inline(tmp_path):
    """In a kernel, the toy's figures show one after another: the first one must not leave
    matplotlib's inline backend unable to show the next (a figure built inside
    ``rc_context`` once undid the interactive mode the inline backend starts with, and every
    later figure of the kernel stayed silent)."""
    import nbformat
    from nbclient import NotebookClient

    from flnotes.repro.kernel import current_kernel
    from flnotes.repro.notebooks import quiet_kernel_manager

    cells = [
        "from flnotes import toy\nfrom flnotes.toy import landscapes, plots\n"
        "fed = landscapes.make_federation('fedmut-fig1')",
        "plots.plot_client_landscapes(fed)",
        "history, points = toy.run_toy('fedavg', rounds=2)\n"
        "fig = plots.plot_trajectories(fed.global_loss, {'FedAvg': points}, federation=fed)",
        "fig = plots.plot_landscape(fed.global_loss, title='global')",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(notebook, timeout=120, kernel_name=current_kernel(),
                   kernel_manager_class=quiet_kernel_manager(), resources={
                       "metadata": {"path": str(tmp_path)}}).execute()
    silent = [cell.source for cell in notebook.cells[1:]
              if not any("image/png" in output.get("data", {}) for output in cell.outputs)]
    assert not silent, f"no figure shown by {silent}"


def test_an_interrupted_race_takes_its_first_seeds_line_down():
    """Interrupted (or failing) after its quick picture, a redraw does not leave the line
    "the other seeds are running..." standing."""
    toy.forget_races()  # a race kept by an earlier test would need no quick picture
    ex = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS + 2, rounds=2)
    ex.png()
    real, calls = ex.png, []

    def png(**overrides):
        calls.append(overrides)
        if len(calls) == 2:  # the whole race, after the first seeds' picture
            raise KeyboardInterrupt
        return real(**overrides)

    ex.png = png
    with pytest.raises(KeyboardInterrupt):
        ex.set(alpha=3.0)
    assert calls[0] == {"seeds": widgets.PREVIEW_SEEDS} and ex.last_preview is not None
    assert ex.note.value == "" and ex.status == ""


class _KernelLoop:
    """The kernel's event loop, as a page move's redraw sees it: callbacks queued by the
    explorer's worker thread, run on the main thread when the test says."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def add_callback(self, fn, *args) -> None:
        self.callbacks.append((fn, args))

    def run(self) -> int:
        ran = 0
        while self.callbacks:
            fn, args = self.callbacks.pop(0)
            fn(*args)
            ran += 1
        return ran


def _same_picture(png_a: bytes, png_b: bytes) -> bool:
    import numpy as np

    a, b = (np.asarray(_image(p).convert("RGB"), dtype=int) for p in (png_a, png_b))
    return a.shape == b.shape and int((np.abs(a - b).sum(-1) > 30).sum()) <= 20


def _fresh_png(ex, **values) -> bytes:
    fig = ex.figure(**values)
    try:
        return widgets.figure_png(fig)
    finally:
        plt.close(fig)


def _endless_race(ended: list, started: threading.Event | None = None):
    """A worker's ``prepare`` that only a stop ends (or 30 s, failing the test); ``ended``
    gets "stopped" when the stop lands."""
    import time

    from flnotes.engine.stops import Stopped, check_stop

    def endless(values):
        if started is not None:
            started.set()
        try:
            for _ in range(3000):
                check_stop()
                time.sleep(0.01)
        except Stopped:
            ended.append("stopped")
            raise
        ended.append("ran out")

    return endless


def test_a_page_move_answers_with_its_first_seeds_and_races_the_rest_in_a_worker(monkeypatch):
    """A move made in the page returns after the quick picture; the worker's whole race
    then shows (a fresh draw of the setting) through the kernel's loop, and "drawing..."
    stays beside the control until it does. A newer move stops a stale worker, whose
    picture never shows, and the newer move's whole race is what stays."""
    toy.forget_races()
    loop = _KernelLoop()
    ex = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS + 4, rounds=3)
    ex.png()
    monkeypatch.setattr(ex, "_page_move_loop", lambda: loop)
    ex.controls["alpha"].value = 3.0  # as the page moves it
    assert ex.last_preview is not None and "running" in ex.note.value
    assert "drawing" in ex.busy["alpha"].value  # still working on the whole picture
    assert ex.wait(60) and loop.run() == 1
    assert ex.status == "" and ex.note.value == ""
    assert _same_picture(ex.last_png, _fresh_png(ex))
    assert toy.kept_race("fedqp", widgets.PREVIEW_SEEDS + 4, alpha=3.0, lr=0.1, rounds=3)

    # Two quick moves: the first one's worker is stopped, its callback (if any) is stale.
    ex.controls["alpha"].value = 3.5
    first_worker = ex._worker[0]
    ex.controls["lr"].value = 0.15
    assert not first_worker.is_alive()  # stopped before the second move raced anything
    assert "drawing" in ex.busy["lr"].value and "drawing" not in ex.busy["alpha"].value
    assert ex.wait(60)
    loop.run()
    assert ex.status == ""
    assert _same_picture(ex.last_png, _fresh_png(ex))  # alpha 3.5, lr 0.15: the last move's
    # A move by code (a cell's ex.set) draws everything before it returns, no worker
    monkeypatch.setattr(ex, "_page_move_loop", widgets.Explorer._page_move_loop)
    ex.set(alpha=4.5)
    assert ex._worker is None and _same_picture(ex.last_png, _fresh_png(ex))


def test_a_newer_move_stops_the_running_worker_and_a_stale_picture_never_shows(monkeypatch):
    """The worker of a move stops at its next check once a newer move comes (it raises
    Stopped inside the race and queues nothing); a worker that finished before a newer move
    made by code queues a picture that is dropped, not shown over the newer one."""
    toy.forget_races()
    loop = _KernelLoop()
    ex = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS + 2, rounds=2)
    ex.png()
    monkeypatch.setattr(ex, "_page_move_loop", lambda: loop)
    ended, racing = [], threading.Event()
    monkeypatch.setattr(ex, "prepare", _endless_race(ended, racing))
    ex.controls["alpha"].value = 3.0
    assert racing.wait(30)
    monkeypatch.setattr(ex, "prepare", lambda values: None)  # the next move's: done at once
    ex.controls["alpha"].value = 3.5
    assert ended == ["stopped"]
    assert ex.wait(30) and len(loop.callbacks) == 1  # the second move's picture only
    # That callback is stale once a move by code has drawn a newer setting
    monkeypatch.setattr(ex, "_page_move_loop", widgets.Explorer._page_move_loop)
    ex.set(alpha=4.0)
    newer = ex.last_png
    loop.run()
    assert ex.last_png == newer and _same_picture(newer, _fresh_png(ex))


def test_one_race_at_a_time_a_move_or_a_new_explorer_stops_another_explorers_worker(
        monkeypatch):
    """Races run one at a time in a kernel: a move of one explorer (or a new explorer, a cell
    run again) stops another explorer's worker instead of waiting for it; that explorer shows
    its last whole picture again and says why."""
    toy.forget_races()
    loop = _KernelLoop()
    ended = []
    explorers = []
    for _ in range(2):
        ex = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS + 2, rounds=2)
        ex.last_png = ex.png()
        monkeypatch.setattr(ex, "_page_move_loop", lambda: loop)
        monkeypatch.setattr(ex, "prepare", _endless_race(ended))
        explorers.append(ex)
    first, second = explorers
    first.controls["alpha"].value = 3.0
    assert first._worker is not None
    second.controls["alpha"].value = 3.5  # the other explorer's move
    assert ended == ["stopped"] and first._worker is None
    assert "stopped: another explorer" in first.note.value and first.status == ""
    assert second._worker is not None
    widgets.race_explorer(seeds=4, rounds=2)  # a new explorer: the cell run again
    assert ended == ["stopped", "stopped"] and second._worker is None
    assert not loop.callbacks  # no stopped worker's picture comes later


def test_a_worker_that_fails_leaves_the_last_picture_and_says_why(monkeypatch):
    toy.forget_races()
    loop = _KernelLoop()
    ex = widgets.race_explorer(seeds=widgets.PREVIEW_SEEDS + 2, rounds=2)
    before = ex.png()
    ex.last_png = before
    monkeypatch.setattr(ex, "_page_move_loop", lambda: loop)

    def broken(values):
        raise ValueError("no room on the toy\nsecond line")

    monkeypatch.setattr(ex, "prepare", broken)
    ex.controls["alpha"].value = 3.0
    assert ex.wait(60) and loop.run() == 1
    assert "ValueError: no room on the toy" in ex.note.value
    assert "second line" not in ex.note.value
    assert ex.last_png == before and ex.status == ""


def test_only_a_widget_message_to_a_running_kernel_moves_in_the_background(monkeypatch):
    """The worker is for moves made in the page (a comm message); a cell's code, the tests
    and the benchmark (no kernel) draw synchronously."""

    assert widgets.Explorer._page_move_loop() is None  # no kernel here

    class Kernel:
        io_loop = object()

        def __init__(self, msg_type):
            self.msg_type = msg_type

        def get_parent(self, channel):
            assert channel == "shell"
            return {"header": {"msg_type": self.msg_type}}

    for msg_type, wanted in (("comm_msg", True), ("execute_request", False)):
        kernel = Kernel(msg_type)
        shell = type("Shell", (), {"kernel": kernel})()
        monkeypatch.setattr(widgets, "get_ipython", lambda shell=shell: shell)
        assert (widgets.Explorer._page_move_loop() is kernel.io_loop) is wanted, msg_type


def test_the_race_figure_is_the_same_picture_for_the_same_rows():
    """Seaborn jitters notebook 04's dots with numpy's global generator: the figure seeds it
    (a stored notebook's image changes only with its data) and leaves it as it found it."""
    import numpy as np

    rows = toy.race(["fedavg", "fedqp"], seeds=6, rounds=2)
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    pictures = []
    for _ in range(2):
        fig = plots.plot_race(rows)
        pictures.append(np.asarray(_image(widgets.figure_png(fig)).convert("RGB")))
        plt.close(fig)
    assert np.array_equal(*pictures)
    assert np.array_equal(np.random.get_state()[1], before)


def test_longer_races_show_fewer_first_seeds_never_fewer_than_two():
    """A stacked round costs nearly the same whatever the seeds, so the quick picture of a
    longer race shows fewer of them: as many as at 15 rounds up to there, then fewer."""
    for method, most in (("fedqp", widgets.PREVIEW_SEEDS),
                         ("fml", widgets.PREVIEW_SEEDS_ONE_BY_ONE)):
        counts = [widgets.preview_seeds(method, rounds) for rounds in range(1, 41)]
        assert counts[:15] == [most] * 15
        assert counts == sorted(counts, reverse=True) and min(counts) == 2
        assert counts[-1] < most


def test_a_move_from_the_page_leaves_a_real_kernel_free_while_the_race_runs(tmp_path):
    """In a running kernel, a widget message (what the page sends when a student moves a
    control) is answered with the first seeds' picture, and the kernel goes idle while the
    rest of the race runs in a worker: the next move is answered at once. The worker's whole
    picture then shows through the kernel's own loop (its "drawing..." note gone)."""
    from flnotes.repro.kernel import current_kernel
    from flnotes.repro.notebooks import quiet_kernel_manager

    manager = quiet_kernel_manager()(kernel_name=current_kernel())
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)

        def idle_after(msg_id: str) -> list[dict]:
            seen = []
            while True:
                msg = client.get_iopub_msg(timeout=120)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                seen.append(msg)
                if (msg["msg_type"] == "status"
                        and msg["content"]["execution_state"] == "idle"):
                    return seen

        def run(code: str) -> str:
            seen = idle_after(client.execute(code))
            errors = [m["content"]["evalue"] for m in seen if m["msg_type"] == "error"]
            assert not errors, errors
            return "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")

        model = run("import torch; torch.set_num_threads(1)\n"
                    "from IPython.display import display\n"
                    "from flnotes.toy import widgets\n"
                    "ex = widgets.race_explorer(seeds=40, rounds=6)\n"
                    "display(ex)\n"
                    "print(ex.controls['algorithm'].model_id, "
                    "list(ex.controls['algorithm'].options).index('fml'), end='')")
        comm_id, index = model.split()
        # FML's seeds run one after another: its race of 40 seeds outlasts the move by far
        move = client.session.msg("comm_msg", {"comm_id": comm_id, "data": {
            "method": "update", "state": {"index": int(index)}, "buffer_paths": []}})
        client.shell_channel.send(move)
        idle_after(move["header"]["msg_id"])
        state = run("print(ex.values()['algorithm'], ex._worker is not None, "
                    "'running' in ex.note.value, end='')")
        assert state == "fml True True"  # answered; the rest still racing in the worker
        run("assert ex.wait(120)")  # the worker is done; its picture comes on the loop
        run("import time; time.sleep(0.2)")  # the loop runs the callback before this cell
        state = run("print(ex._worker is None, repr(ex.status), repr(ex.note.value), "
                    "ex.last_preview is not None, end='')")
        assert state == "True '' '' True"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_the_reopened_notebooks_show_every_kind_of_control():
    """The browser test reopens only REOPENED and loses nothing: their explorers hold every
    widget class of every teaching notebook's explorers, and there is one in each half."""
    def kinds(names):
        return {type(control).__name__ for notebook in names for explorer in
                explorers_in(notebook)
                for control in getattr(widgets, explorer)().controls.values()}

    assert kinds(REOPENED) >= kinds(TEACHING), kinds(TEACHING) - kinds(REOPENED)
    assert len(set(REOPENED) & set(HERE)) == 1 and len(set(REOPENED) - set(HERE)) == 1
