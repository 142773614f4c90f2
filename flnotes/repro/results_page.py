"""The results page: ``python -m flnotes results-page results/fedup`` writes
``results/fedup.md`` (and the learning curves beside it, ``results/fedup-curves.png``)
from the run folders of a sweep's output, ``<folder>/cells/<cell-id>/runs/<alg>/seed<N>/``
(``config.json``, ``run.json``, ``metrics.jsonl``; ``cell.json`` per cell for the labels).

Generated, never typed: every number on the page comes from the metrics files, and the same
folder gives the same page. It holds

- the learning curves: per setting (dataset, model, heterogeneity) one panel, per method the
  mean test accuracy over seeds and a band from the lowest to the highest seed;
- our test accuracy at the quarters of the planned rounds (50, 100, 150, 200 for 200) and at
  each run's last evaluation, per method and setting: mean +- sample std over seeds (the
  evaluation at that round, or the last one before it, for runs that got there);
- each method minus FedAvg per setting, read by the reading rule (flnotes.repro.reading): per
  seed, the mean difference over the late window (the last quarter of the evaluations both
  runs of the seed have) and at how many of them the method is ahead; holds / does not hold /
  cannot tell; beside the papers' difference for the same cell (a seed method's own paper:
  FedMut Table 1, FedQP Table I, FedMR Table 1, FML Table 1; a baseline: the table its grid
  lands on; flnotes.repro.paper_tables) and the papers' cells themselves;
- for methods with personal models (FML): personal against global accuracy, read the same way;
- the reading: that verdict as a sentence per difference, and how far from converged;
- the settings and cost: the command that made the runs (the grid their cells name), the
  settings every run shares, each method's own, and the time its rounds took.

Accuracies in percent. Failed runs are left out; running or interrupted runs count with the
rounds they have, and the page says how far each got. Of two folders of one run, the page
uses the one ``tables`` uses (the completed one before a newer failed or interrupted one:
``flnotes.repro.tables.one_per_run``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from flnotes.plots import line_style, markevery
from flnotes.repro import REPO_ROOT, SWEEP_DIR
from flnotes.repro.figures import mean_band
from flnotes.repro.paper_tables import load_paper_table
from flnotes.repro.reading import CANNOT_TELL, DOES_NOT_HOLD, HOLDS, Reading, read
from flnotes.repro.tables import (
    BASELINE,
    NOT_SETTINGS,
    SETTING,
    Run,
    by_setting,
    diverged,
    load_runs,
    sample_std,
)

# a seed method -> its own paper's table, whose difference to FedAvg sits beside ours; any
# other method (a baseline) is read against the table its grid lands on (cell.json)
PAPER_OF = {"FedMut": "fedmut_table1", "FedQP": "fedqp_tableI", "FedMR": "fedmr_table1",
            "FML": "fml_table1"}
# the order of the papers' columns; only tables with a cell for a setting on the page show
PAPER_TABLES = ("fedmut_table1", "fedqp_tableI", "fedmr_table1", "fml_table1",
                "fedmut_table2", "fedqp_tableII", "fedup_table4", "fedup_table5")
PERSONAL = "personal_accuracy"  # FML's personal models, on each client's held-out rows


def checkpoints(runs: list[Run]) -> tuple[int, ...]:
    """The rounds the accuracy table shows: the quarters of the longest planned run (50, 100,
    150, 200 for 200 rounds)."""
    planned = max((int(run.config.get("rounds") or 0) for run in runs), default=0)
    planned = max(planned, max((r["round"] for run in runs for r in run.rows), default=0), 4)
    return tuple(sorted({round(planned * q / 4) for q in (1, 2, 3, 4)}))


def paper_table_of(method: str, runs: list[Run], setting: tuple,
                   papers: dict[tuple, dict[str, float]]) -> str | None:
    """The table whose cells a method's difference to FedAvg is read beside: its own paper's
    (PAPER_OF), else its grid's, the first of them with the method's cell for this setting
    (FedMut on Shakespeare: Table 2, not Table 1)."""
    candidates = [PAPER_OF.get(method), *sorted({r.paper_table for r in runs if r.paper_table})]
    candidates = [t for t in candidates if t]
    return next((t for t in candidates if method in papers.get((t, *setting), {})),
                candidates[0] if candidates else None)


def paper_setting(by_method: dict[str, list[Run]]) -> tuple[str, str, str]:
    """The paper's setting a setting of ours is read beside: its own, except where the grid
    names a stand-in's original (labels paper_dataset, paper_model, paper_heterogeneity:
    Fashion-MNIST read beside FEMNIST's cells, LeNet beside ResNet18's)."""
    labels = next(run.labels for runs in by_method.values() for run in runs)
    return tuple(str(labels.get(f"paper_{k}", labels[k])) for k in SETTING)


def accuracy_at(run: Run, round_: int) -> float | None:
    """Test accuracy (%) at ``round_``: its evaluation there or the last one before it; None
    if the run has not reached that round."""
    last = max((r["round"] for r in run.rows), default=0)
    rounds, values = run.curve()
    if last < round_ or not len(rounds) or rounds[0] > round_:
        return None
    return float(values[rounds <= round_][-1])


def final(run: Run, metric: str = "accuracy") -> tuple[int, float] | None:
    """(round, accuracy %) of the run's last evaluation."""
    rounds, values = run.curve((metric,))
    return (int(rounds[-1]), float(values[-1])) if len(rounds) else None


def _mean_std(values: list[float], of: int | None = None, signed: bool = False) -> str:
    """'mean ± std' over seeds ('—' for none); '(n of m seeds)' when fewer than ``of``."""
    if not values:
        return "—"
    mean = float(np.mean(values))
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    if len(values) > 1:
        text += f" ± {sample_std(values):.2f}"
    if of is not None and len(values) < of:
        text += f" ({len(values)} of {of} seeds)"
    return text


def late_reading(method_runs: list[Run], base_runs: list[Run]) -> Reading:
    """The reading rule on each seed's pair of runs (the method's and FedAvg's). Two runs of
    one method, setting and seed (two settings of one cell, e.g. an old folder beside a rerun)
    are an error naming both: the page would otherwise read one and not say which."""
    for runs in (method_runs, base_runs):
        seen: dict[int, Run] = {}
        for run in runs:
            if run.seed in seen:
                raise ValueError(f"two runs of {run.labels['method']}, seed {run.seed}, in "
                                 f"{', '.join(run.setting)}: "
                                 f"{seen[run.seed].run_dir} and {run.run_dir}; move one away")
            seen[run.seed] = run
    return read({run.seed: run.curve() for run in method_runs},
                {run.seed: run.curve() for run in base_runs})


def _paper_cells() -> dict[tuple, dict[str, float]]:
    """(table, dataset, model, heterogeneity) -> method -> the paper's accuracy."""
    cells: dict[tuple, dict[str, float]] = {}
    for name in PAPER_TABLES:
        for _, row in load_paper_table(name).iterrows():
            key = (name, row["dataset"], row["model"], row["heterogeneity"])
            if not np.isnan(row["accuracy_mean"]):
                cells.setdefault(key, {})[row["method"]] = float(row["accuracy_mean"])
    return cells


def progress(runs: list[Run]) -> str:
    """How far the runs got: completed count and the shortest run against the plan."""
    done = sum(run.status == "completed" for run in runs)
    reached = [max((r["round"] for r in run.rows), default=0) for run in runs]
    planned = sorted({str(run.config.get("rounds")) for run in runs})
    return (f"- progress: {done} of {len(runs)} runs completed; the shortest has "
            f"{min(reached)} rounds, the longest {max(reached)}, of {', '.join(planned)} "
            "planned. Every ordering below is at the rounds it names, not at convergence.")


def convergence(groups: dict[tuple, dict[str, list[Run]]], window: int = 50) -> list[str]:
    """How far from converged: per setting and method, the mean accuracy of the last
    ``window`` rounds' evaluations against the ``window`` before them (seeds pooled), and the
    spread of the last window (evaluation to evaluation noise)."""
    out = []
    for setting, by_method in groups.items():
        parts = []
        for method, method_runs in by_method.items():
            last, before, spread = [], [], []
            for run in method_runs:
                rounds, accuracy = run.curve()
                if not len(rounds) or rounds.max() < 2 * window:
                    continue
                end = rounds.max()
                tail = accuracy[rounds > end - window]
                last.extend(tail)
                before.extend(accuracy[(rounds > end - 2 * window) & (rounds <= end - window)])
                spread.append(float(tail.max() - tail.min()))
            if last and before:
                change = float(np.mean(last) - np.mean(before))  # already percent
                parts.append(f"{method} {change:+.1f} points (its last {window} rounds range "
                             f"over {max(spread):.1f})")
        if parts:
            out.append(f"- {', '.join(setting)}: mean accuracy of the last {window} rounds "
                       f"against the {window} before: {'; '.join(parts)}. A method still "
                       "gaining points per 50 rounds has not converged, and single evaluations "
                       "swing by the range given, so one round's ordering is weak evidence.")
    return out


def panel_title(setting: tuple, by_method: dict[str, list[Run]]) -> str:
    """A panel's setting, with the model its runs trained where the label names another (the
    tables' "CNN" row holds the seed code's LeNet: "CIFAR-10, CNN (model lenet-cifar), dir=0.1")."""
    models = sorted({str(r.config.get("model")) for runs in by_method.values() for r in runs
                     if r.config.get("model")})
    parts = [str(p) for p in setting]
    if models and not any(m.lower() == p.lower() for m in models for p in parts):
        parts[min(len(parts), 2) - 1] += f" (model {', '.join(models)})"  # after the model
    return ", ".join(parts)


def curves_figure(groups: dict[tuple, dict[str, list[Run]]]):
    """One panel per setting: mean accuracy over seeds per method, band lowest-highest.
    Drawn with the current backend (a notebook's inline one; the command sets Agg)."""
    # One style per method on every panel (colour, dash and marker: lines that lie on top of
    # each other, FedProx on FedAvg, stay visible; FedAvg first)
    methods = list(dict.fromkeys(m for by_method in groups.values() for m in by_method))
    style = {m: line_style(i) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(5 * max(len(groups), 1), 3.8),
                             squeeze=False)
    for ax, setting in zip(axes.flat, groups, strict=False):
        for method, runs in groups[setting].items():
            curves = [c for c in (r.curve() for r in runs) if len(c[0])]
            if not curves:
                continue
            x, mean, low, high = mean_band(curves)
            seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
            (line,) = ax.plot(x, mean, lw=1.4, label=f"{method} ({seeds})", **style[method],
                              markersize=4, markevery=markevery(len(x)))
            if len(curves) > 1:
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, lw=0)
            personal = [c for c in (r.curve((PERSONAL,)) for r in runs) if len(c[0])]
            if personal:  # dotted, the method's colour, no marker: its personal models
                x, mean, _, _ = mean_band(personal)
                ax.plot(x, mean, lw=1.6, ls=":", color=line.get_color(),
                        label=f"{method} personal models")
        ax.set_title(panel_title(setting, groups[setting]), fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# The reading figure's colour per verdict: green leads, red trails, grey cannot tell.
VERDICT_COLOURS = {HOLDS: "#1b9e77", DOES_NOT_HOLD: "#d62728", CANNOT_TELL: "#808080"}
DIVERGED_SEED = "a run of this seed diverged"  # the readings picture's legend for a ring


def readings_figure(groups: dict[tuple, dict[str, list[Run]]]):
    """The reading rule as a picture, one panel per setting with a FedAvg run: per method,
    each seed's late difference to FedAvg (a dot; a ring where the method's or FedAvg's run
    of that seed diverged, as the page's table says), their mean (a bar) and the rule's
    verdict (the colour). Methods sorted by the mean; the spread the rule compares against
    is the width of each row's dots. None when no setting has a method beside FedAvg."""
    panels = {setting: [(m, late_reading(runs, by_method[BASELINE]),
                         {r.seed for r in runs + by_method[BASELINE] if r.status == "diverged"})
                        for m, runs in by_method.items() if m != BASELINE]
              for setting, by_method in groups.items() if BASELINE in by_method}
    panels = {k: sorted((r for r in v if r[1].seeds), key=lambda r: r[1].mean)
              for k, v in panels.items()}
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return None
    rows = max(len(v) for v in panels.values())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 1.0 + 0.32 * rows),
                             squeeze=False)
    for ax, (setting, readings) in zip(axes.flat, panels.items(), strict=True):
        for y, (_, result, ringed) in enumerate(readings):
            colour = VERDICT_COLOURS[result.verdict]
            for ring in (False, True):
                seeds = [s for s in result.seeds if (s.seed in ringed) == ring]
                if seeds:
                    ax.scatter([s.difference for s in seeds], [y] * len(seeds), s=22,
                               zorder=3, facecolors="none" if ring else colour,
                               edgecolors=colour, linewidths=1.2,
                               label=DIVERGED_SEED if ring else result.verdict)
            ax.plot([result.mean] * 2, [y - 0.3, y + 0.3], color=colour, lw=2)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(readings)), [m for m, *_ in readings], fontsize=8)
        ax.set_ylim(-0.7, len(readings) - 0.3)
        ax.set_xlabel(f"mean over {readings[-1][1].window()}\nminus {BASELINE} (points)",
                      fontsize=9)
        ax.set_title(panel_title(setting, groups[setting]), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        shown = dict(zip(labels, handles, strict=True))  # one entry per verdict, one ring
        if DIVERGED_SEED in shown:  # the ring's entry in black: it means any verdict's ring
            shown[DIVERGED_SEED] = Line2D([], [], marker="o", linestyle="", markersize=5,
                                          markerfacecolor="none", markeredgecolor="black")
        order = [v for v in (*VERDICT_COLOURS, DIVERGED_SEED) if v in shown]
        ax.legend([shown[v] for v in order], order, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


# a partition's own setting: said only of runs with that partition
PARTITION_SETTING = {"dirichlet_alpha": "dirichlet", "shards_per_client": "shards"}


def _setting_text(run: Run, key: str) -> str | None:
    """A run's value of ``key`` as text; None where it has none or its partition does not
    read it."""
    value, partition = run.config.get(key), PARTITION_SETTING.get(key)
    if value is None or (partition and run.config.get("partition") != partition):
        return None
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def _shared(runs: list[Run], keys: list[str]) -> dict[str, str]:
    """The settings of ``keys`` that every run of ``runs`` holds at one value, as text."""
    shared = {}
    for k in keys:
        seen = {_setting_text(run, k) for run in runs}
        if len(seen) == 1 and None not in seen:
            shared[k] = seen.pop()
    return shared


def _settings_text(settings: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items())


IN_MEMORY = {"synthetic", "toy"}  # datasets made in memory: no data folder to name


def _grid_named(path: str) -> str:
    """A grid as the sweep command takes it: a shipped grid by its name, any other by path."""
    return Path(path).stem if Path(path).resolve().parent == SWEEP_DIR.resolve() else path


def settings_and_cost(results: Path, groups: dict[tuple, dict[str, list[Run]]]) -> list[str]:
    """The page's last section: how to make the runs again and what they cost. A setting is
    said once where it is shared: by every run, by a panel's runs, then a method's own on its
    row. Times are the rounds' own (metrics.jsonl ``seconds``: local training, aggregation and
    evaluation; the data's loading and a resume's start-up left out), summed per run."""
    runs = [r for by_method in groups.values() for rs in by_method.values() for r in rs]
    keys = sorted({k for run in runs for k in run.config} - NOT_SETTINGS)
    everywhere = _shared(runs, keys)
    grids = sorted({(_grid_named(run.grid_file), run.variant == "smoke") for run in runs
                    if run.grid_file})
    data_dir = any(set(str(r.config.get("dataset", "")).split("+")) - IN_MEMORY for r in runs)
    made_by = ("Made by " + " and ".join(
        f"`python -m flnotes sweep {grid}{' --smoke' if smoke else ''}"
        f"{' --set data_dir=DIR' if data_dir else ''} --out {_shown(results)} --workers 1`"
        for grid, smoke in grids)
        + (" (DIR: the dataset's folder)" if data_dir else "")
        + "; it skips the cells a folder holds and runs the rest."
        if grids else "Made by single runs (no sweep's cell.json above them).")
    devices, threads = (sorted({str(r.environment[k]) for r in runs if r.environment.get(k)})
                        for k in ("device", "cpu_threads"))
    lines = ["", "## Settings and cost", "", made_by, "",
             f"Every run: {_settings_text(everywhere)}.", ""]
    rows, total = [], 0.0
    for setting, by_method in groups.items():
        panel_runs = [r for rs in by_method.values() for r in rs]
        panel = {k: v for k, v in _shared(panel_runs, keys).items() if k not in everywhere}
        if panel and len(groups) > 1:
            lines += [f"{', '.join(setting)}: {_settings_text(panel)}.", ""]
        for method, method_runs in by_method.items():
            own = [f"{k} {' / '.join(sorted(seen))}" for k in keys if k not in everywhere
                   and (k not in panel or len(groups) == 1)
                   and (seen := {_setting_text(run, k) for run in method_runs} - {None})]
            seconds = [r["seconds"] for run in method_runs for r in run.rows
                       if isinstance(r.get("seconds"), (int, float))]
            total += sum(seconds)
            median = f"{float(np.median(seconds)):.1f}" if seconds else "—"
            rows.append(_row(*setting, method, ", ".join(own) or "—", len(method_runs),
                             f"{sum(seconds) / 3600:.2f}", median))
    lines += [
        "Time: the rounds' own seconds (training, aggregation, evaluation; loading the data "
        "left out) summed per run, on " + (", ".join(devices) or "an unrecorded device")
        + (f" with {', '.join(threads)} torch thread{'' if threads == ['1'] else 's'} per run"
           if threads else "")
        + ". Wall time: where other work shared the machine it is more than the CPU time.",
        "",
        *_table([*SETTING, "method", "its own settings", "runs", "hours (all runs)",
                 "seconds a round (median)"], rows),
        "",
        f"In all: {len(runs)} runs, {total / 3600:.1f} hours of rounds.",
    ]
    return lines


def _row(*cells) -> str:
    """A markdown table's row."""
    return "| " + " | ".join(map(str, cells)) + " |"


def _table(header: list[str], rows: list[str] = ()) -> list[str]:
    """A markdown table: its header, the rule under it, then ``rows``."""
    return [_row(*header), "|" + "---|" * len(header), *rows]


def _shown(path: Path) -> str:
    """A path as the page shows it: relative to the repository when inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT or Path.cwd()))
    except ValueError:
        return str(path)


def readings_png(curves_png: Path) -> Path:
    """Where build_page puts the reading rule's picture: beside the curves PNG."""
    return curves_png.with_name(curves_png.name.replace("-curves.png", "-readings.png"))


GENERATED = "<!-- Generated by `python -m flnotes results-page "  # a page's first marker


def default_page(results: Path) -> Path:
    """Where a results folder's page goes unless told: ``<folder>.md`` beside the folder."""
    return results.resolve().parent / f"{results.resolve().name}.md"


def build_page(results: str | Path, out: str | Path | None = None) -> tuple[Path, Path]:
    """Write the page (default: :func:`default_page`), its curves PNG beside it and, where a
    method runs beside FedAvg, the reading rule's picture (``readings_png``); return the
    page's and the curves' paths. A file there that no results-page wrote is an error, not
    overwritten."""
    results = Path(results)
    runs = load_runs(results)
    if not runs:
        raise ValueError(f"no run folders (run.json + metrics.jsonl) under {results}")
    out = Path(out) if out else default_page(results)
    if out.is_file() and GENERATED not in out.read_text(errors="replace")[:2000]:
        raise ValueError(f"{out} exists and no results-page wrote it: give another --out, or "
                         "move it away")
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.parent / f"{results.resolve().name}-curves.png"
    groups = by_setting(runs)

    # A file, never a window: the command may run where a display is set. Only here, not in
    # curves_figure, which a notebook calls under its inline backend.
    matplotlib.use("Agg", force=False)

    dots = readings_png(png)
    dots.unlink(missing_ok=True)  # where no reading is drawn, none from an earlier page either
    for figure, path in ((curves_figure, png), (readings_figure, dots)):
        if (fig := figure(groups)) is not None:
            fig.savefig(path, dpi=110, metadata={"Software": None})
            plt.close(fig)
    command = f"python -m flnotes results-page {_shown(results)}" + (
        f" --out {_shown(out)}" if out.resolve() != default_page(results) else "")
    out.write_text(page_text(results, groups, os.path.relpath(png, out.parent),
                             os.path.relpath(dots, out.parent) if dots.is_file() else "",
                             command))
    return out, png


def smoke_note(runs: list[Run]) -> list[str]:
    """A warning under the page's first lines where runs come from a grid's smoke variant:
    they keep the labels of the paper setting they stand in for, so the tables would read as
    that setting's."""
    smoke = [run for run in runs if run.variant == "smoke"]
    if not smoke:
        return []
    shared = _shared(smoke, ["dataset", "model", "rounds"])
    return ["", f"**Smoke runs** ({len(smoke)} of {len(runs)}): the grid's smoke variant ("
            + (_settings_text(shared) or "its own small settings") + ") under the labels of the "
            "paper setting it stands in for. Their numbers show that the pipeline runs, not "
            "what the paper's setting gives; the papers' cells below are not comparable."]


def page_text(results: Path, groups: dict, png: str, readings_png: str = "",
              command: str = "") -> str:
    """The page's markdown; ``png`` and ``readings_png`` the pictures' paths relative to it
    (no readings picture where empty); ``command`` the one that writes it (default: the
    folder's results-page without --out)."""
    papers = _paper_cells()
    runs = [r for by_method in groups.values() for rs in by_method.values() for r in rs]
    at_rounds = checkpoints(runs)
    paper_of = {setting: paper_setting(by_method) for setting, by_method in groups.items()}
    shown_tables = [t for t in PAPER_TABLES
                    if any((t, *paper_of[setting]) in papers for setting in groups)]
    statuses = Counter(run.status for run in runs)
    accuracies, differences, paper_cells, readings = [], [], [], []  # rows of the tables
    for setting, by_method in groups.items():
        base, theirs = by_method.get(BASELINE, []), paper_of[setting]
        for method, method_runs in by_method.items():
            reached = ", ".join(str(max((r["round"] for r in run.rows), default=0))
                                for run in method_runs)
            planned = sorted({str(run.config.get("rounds")) for run in method_runs})
            at = [_mean_std([v for v in (accuracy_at(run, r) for run in method_runs)
                             if v is not None], of=len(method_runs)) for r in at_rounds]
            finals = [f for f in (final(run) for run in method_runs) if f is not None]
            rounds = sorted({r for r, _ in finals})
            where = "" if not rounds else f" (round {rounds[0]})" if len(rounds) == 1 else \
                f" (rounds {rounds[0]}-{rounds[-1]})"
            ours = _mean_std([v for _, v in finals])
            accuracies.append(_row(*setting, method, ", ".join(str(r.seed) for r in method_runs),
                                   f"{reached} / {', '.join(planned)}", *at, ours + where))
            # the papers' cells by the method's own name ('FedMut' for 'FedMut (alpha 2.0)')
            named = str(method_runs[0].labels["method"])
            published = [papers.get((t, *theirs), {}).get(named) for t in shown_tables]
            paper_cells.append(_row(*setting, method, ours, " | ".join(
                "—" if v is None else f"{v:.2f}" for v in published)))
            if method == BASELINE or not base:
                continue
            result = late_reading(method_runs, base)
            table = paper_table_of(named, method_runs, theirs, papers)
            cells = papers.get((table, *theirs), {})
            paper = (cells[named] - cells[BASELINE]
                     if named in cells and BASELINE in cells else None)
            per_seed = "; ".join(f"{s.seed}: {s.difference:+.2f}, {s.leads}/{s.evaluations}"
                                 for s in result.seeds) or "—"
            # ', for FEMNIST/CNN/leaf' where our setting stands in for the paper's
            stand_in = "" if setting == theirs else f", for {'/'.join(theirs)}"
            cell_text = "—" if paper is None else \
                f"{named} {cells[named]:.2f}, {BASELINE} {cells[BASELINE]:.2f} " \
                f"({table}{stand_in})"
            note = diverged(by_method, method, BASELINE)
            differences.append(_row(
                *setting, f"{method} − {BASELINE}",
                _mean_std([s.difference for s in result.seeds], signed=True), per_seed,
                result.verdict + (" (a run diverged)" if note else ""),
                "—" if paper is None else f"{paper:+.2f}", cell_text))
            readings.append(f"- {', '.join(setting)}: {result.sentence(method, BASELINE)}"
                            + (f" The paper's difference is {paper:+.2f}, ours "
                               f"{result.mean:+.2f}." if paper is not None and result.seeds
                               else "") + (f" {note[0].upper()}{note[1:]}." if note else ""))
    stand_ins = [f"Our {'/'.join(setting)} stands in for the paper's {'/'.join(paper)}: its "
                 "rows show the paper's cells of that setting." for setting, paper in
                 paper_of.items() if tuple(setting) != tuple(paper)]
    personal_lines, personal_readings = personal_section(groups)
    return "\n".join([
        f"# Results: {results.resolve().name}",
        "",
        f"<!-- Generated by `{command or 'python -m flnotes results-page ' + _shown(results)}`"
        " from the run folders; do not edit: run the command again. -->",
        "",
        f"Generated from the run folders under `{_shown(results)}` "
        f"({len(runs)} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
        + "). Test accuracy in percent; ± is the sample std over seeds; failed runs are left "
        "out; a running run counts with the rounds it has.",
        *smoke_note(runs),
        "",
        "## Learning curves",
        "",
        f"![test accuracy per round, mean over seeds, band lowest to highest seed]({png})",
        "",
        "## Our test accuracy",
        "",
        "At round R: the evaluation at R (or the last before it) of each run that got there; "
        "final: each run's last evaluation.",
        "",
        *_table([*SETTING, "method", "seeds", "rounds (per seed / planned)",
                 *(f"round {r}" for r in at_rounds), "final"], accuracies),
        "",
        "## Differences to FedAvg, beside the papers'",
        "",
        "Ours, by the reading rule (flnotes/repro/reading.py): per seed, the method's run minus "
        "FedAvg's run of the same seed, averaged over the late window (the last quarter of the "
        "evaluations both have), and at how many of the window's evaluations the method is "
        "ahead; mean ± std over seeds. It holds when every seed leads by more than the seeds' "
        "spread, does not hold when every seed trails by more, and otherwise cannot be told "
        "(always with one seed). Paper: the same difference of the published cells.",
        "",
        *_table([*SETTING, "difference", "ours (late mean)",
                 "per seed (seed: late difference, ahead)", "reading", "paper", "paper's cells"],
                differences),
        *(["", f"![per method, each seed's late difference to {BASELINE} (a dot), their mean "
            "(a bar), coloured by the reading: green holds, red does not hold, grey cannot "
            f"tell]({readings_png})"] if readings_png else []),
        "",
        "## The papers' cells beside our final accuracy",
        "",
        *([" ".join(stand_ins), ""] if stand_ins else []),
        # (the tables' cells joined into one: no table shown, still one empty cell)
        _row(*SETTING, "method", "ours (final)", " | ".join(shown_tables)),
        "|---|---|---|---|---|" + "---|" * len(shown_tables),
        *paper_cells,
        *personal_lines,
        "",
        "## Reading",
        "",
        "Generated from the numbers above:",
        "",
        progress(runs),
        *(readings or ["- no method's run beside a FedAvg run yet."]),
        *personal_readings,
        *convergence(groups),
        *settings_and_cost(results, groups),
        "",
    ])


def personal_readings(by_method: dict[str, list[Run]]) -> list[tuple[str, Reading]]:
    """(method, reading of "personal > global") for each method of a setting whose runs
    record personal accuracy (FML), over the runs that do."""
    out = []
    for method, method_runs in by_method.items():
        with_personal = [r for r in method_runs if len(r.curve((PERSONAL,))[0])]
        if with_personal:
            out.append((method, read({r.seed: r.curve((PERSONAL,)) for r in with_personal},
                                     {r.seed: r.curve() for r in with_personal})))
    return out


def personal_section(groups: dict[tuple, dict[str, list[Run]]]) -> tuple[list[str], list[str]]:
    """For methods with personal models (FML): each run's personal accuracy (the mean over
    clients, each on its own held-out rows) beside its global model's test accuracy, and the
    reading of "personal > global" over the same seeds. The two are read on different data
    (a client's own distribution against the whole test set), which is the point of a
    personal model under non-IID data; the page says so."""
    rows, readings = [], []
    for setting, by_method in groups.items():
        for method, result in personal_readings(by_method):
            with_personal = [r for r in by_method[method] if len(r.curve((PERSONAL,))[0])]
            personal = [f[1] for f in (final(r, PERSONAL) for r in with_personal) if f]
            overall = [f[1] for f in (final(r) for r in with_personal) if f]
            rows.append(_row(*setting, method, ", ".join(str(r.seed) for r in with_personal),
                             _mean_std(personal), _mean_std(overall),
                             _mean_std([s.difference for s in result.seeds], signed=True),
                             result.verdict))
            readings.append(f"- {', '.join(setting)}: " + result.sentence(
                f"{method}'s personal models", "its global model"))
    if not rows:
        return [], []
    return [
        "",
        "## Personal models",
        "",
        "Personal accuracy: each client's personal model on the client's own held-out rows, "
        "mean over clients; global: the shared model on the whole test set. Final "
        "evaluations, mean ± std over seeds; the difference and verdict by the reading rule "
        "(personal minus global over the late window). Different test data: a personal "
        "model is meant for its own client's distribution.",
        "",
        *_table([*SETTING, "method", "seeds", "personal (final)", "global (final)",
                 "personal − global (late mean)", "reading"], rows),
    ], readings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``results-page`` subcommand."""
    parser.add_argument("results", help="a sweep's output folder, e.g. results/cifar10-lenet")
    parser.add_argument("--out", help="the page (default: FOLDER.md beside the folder, e.g. "
                        "results/fedup.md); the curves PNG goes beside it")


def cmd_results_page(args: argparse.Namespace) -> int:
    page, png = build_page(args.results, args.out)
    dots = readings_png(png)
    print(f"wrote {page}, {png}" + (f" and {dots}" if dots.is_file() else ""))
    return 0
