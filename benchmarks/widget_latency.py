"""Seconds per redraw of every teaching explorer, control by control (issue 14's benchmark).

Each explorer of the teaching notebooks (flnotes/toy/widgets.py) is a draw function plus one
control per argument; a slider move calls the draw function with the new values and renders
the figure to PNG (what the notebook displays). This script does exactly that without a
browser: for every control of every explorer it moves the control from its default to its
extremes and midpoint (every other option, for a dropdown), each move from a freshly drawn
default with nothing about the new value kept, ``--repeats`` times, and prints the p50 and
p95 wall seconds and the CPU seconds per redraw, one row per control, and the wall seconds
until the first picture (the race shows its first seeds first; elsewhere the same). In a
notebook a move of the race made in the page keeps the kernel busy only that long: the rest
of the race runs in a worker thread (``Explorer(prepare=...)``), which the next move stops.

    python benchmarks/widget_latency.py                  # every explorer
    python benchmarks/widget_latency.py --explorers shift,clients --repeats 5

Targets (issue 14, on a 2-core CPU): p50 <= 0.2 s and p95 <= 0.4 s for notebooks 00-03; the
race explorer <= 1.5 s at 10 seeds (``--race-seeds 10``). Since issue 26 the race explorer
starts where notebook 04's table stands, at 100 seeds (the default here): a move then races
ten times as many runs. One torch thread, as the notebooks set.
"""

from __future__ import annotations

import argparse
import gc
import time

import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from flnotes import toy  # noqa: E402
from flnotes.toy import widgets  # noqa: E402

EXPLORERS = {
    "shift (01)": widgets.shift_explorer,
    "clients (02)": widgets.client_explorer,
    "training (00, 02)": widgets.training_explorer,
    "mutations (03)": widgets.mutation_explorer,
    "race (04)": widgets.race_explorer,
}


def settings(control: W.ValueWidget) -> list:
    """The values a benchmark moves a control to from its default: its extremes (every other
    option of a dropdown), and the midpoint of a slider."""
    if isinstance(control, W.Dropdown):
        return [o for o in control.options if o != control.value]
    if isinstance(control, W.Checkbox):
        return [not control.value]
    if hasattr(control, "min") and hasattr(control, "max"):
        middle = (control.min + control.max) / 2
        if isinstance(control.value, int):
            middle = int(middle)
        return [v for v in (control.min, middle, control.max) if v != control.value]
    return []


def clear_caches(explorer) -> None:
    """Forget every result the explorers keep (runs, minima, race rows, the races
    :func:`flnotes.toy.race` keeps) and the explorer's kept figures."""
    toy.forget_races()
    for name in dir(widgets):
        cached = getattr(widgets, name)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    if explorer.scene is not None:
        explorer.scene.forget()


def redraw_seconds(explorer, name: str, value) -> tuple[float, float, float]:
    """(wall, CPU, wall to the first picture) seconds of one slider move from the default to
    ``value``, PNG rendering included.

    As a student meets it: the explorer has drawn its defaults (what the defaults computed is
    kept; ``explorer.png()`` builds the kept figure, as displaying the explorer does), and
    the new value has never been drawn before. An explorer with a preview (the
    race: its first seeds) shows a quick picture first, as a move in the notebook does: the
    move's seconds are both pictures', the first picture's its own.
    """
    clear_caches(explorer)
    # The figures clear_caches dropped are cyclic garbage that an explorer in use rarely
    # makes (it keeps up to four figures): a full collection of them took 0.2 s, and it would
    # land in whichever move came next. Collected here, before the default is drawn.
    gc.collect()
    explorer.png()
    values = {**explorer.values(), name: value}
    first = explorer.preview(values) if explorer.preview is not None else None
    wall, cpu = time.perf_counter(), time.process_time()
    if first is not None:
        explorer.png(**{name: value, **first[0]})
    shown = time.perf_counter() - wall
    explorer.png(**{name: value})  # what a move computes: the draw and its one PNG rendering
    whole = time.perf_counter() - wall
    return whole, time.process_time() - cpu, shown if first is not None else whole


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--explorers", default="",
                        help="comma-separated substrings of explorer names (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--race-seeds", type=int, default=widgets.RACE_SEEDS,
                        help="seeds the race explorer starts from (notebook 04: 100)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    wanted = [w.strip() for w in args.explorers.split(",") if w.strip()]
    print(f"{'explorer':20s} {'control':14s} {'redraws':>7s} {'p50 s':>7s} {'p95 s':>7s} "
          f"{'cpu p50':>7s} {'cpu p95':>7s} {'1st p50':>7s} {'1st p95':>7s}")
    for title, make in EXPLORERS.items():
        if wanted and not any(w in title for w in wanted):
            continue
        # Each explorer as in its own notebook: the last explorer's kept figures (cyclic
        # garbage now) are collected before, not inside this explorer's redraws.
        explorer = None
        gc.collect()
        explorer = make(seeds=args.race_seeds) if make is widgets.race_explorer else make()
        explorer.figure()  # first draw: imports and caches, not what a slider move costs
        plt.close("all")
        every, every_cpu, every_first = [], [], []

        def row(name: str, walls: list, cpus: list, firsts: list, title=title) -> None:
            print(f"{title:20s} {name:14s} {len(walls):7d} {percentile(walls, 0.5):7.2f} "
                  f"{percentile(walls, 0.95):7.2f} {percentile(cpus, 0.5):7.2f} "
                  f"{percentile(cpus, 0.95):7.2f} {percentile(firsts, 0.5):7.2f} "
                  f"{percentile(firsts, 0.95):7.2f}", flush=True)

        for name, control in explorer.controls.items():
            walls, cpus, firsts = [], [], []
            for value in settings(control):
                for _ in range(args.repeats):
                    wall, cpu, first = redraw_seconds(explorer, name, value)
                    walls.append(wall)
                    cpus.append(cpu)
                    firsts.append(first)
            every += walls
            every_cpu += cpus
            every_first += firsts
            row(name, walls, cpus, firsts)
        row("(all)", every, every_cpu, every_first)


if __name__ == "__main__":
    main()
