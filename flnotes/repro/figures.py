"""The papers' figures from a sweep's results folder: ``python -m flnotes figures RESULTS
--figure NAME`` (``--list``: every figure, its grid and its caption).

Each figure of :data:`FIGURES` says which runs it draws (``where``: labels of the table key,
dataset / model / heterogeneity / method, or config fields such as ``alpha``), how it splits
them into the paper's panels (``split``) and which line each run belongs to (``line``). A run
that names no value for a ``where`` field (FedAvg has no ``alpha``) is kept: it is the
reference line of an ablation. Every line is the mean over the seeds found, with a band from
the lowest to the highest seed; accuracies are in percent.

Beside the plot: the paper's caption, what its text claims, and ours (per panel, each line's
last value and whether the line the paper says wins does, read by the reading rule of
flnotes.repro.reading over the seeds), in the figure and in a caption file ``NAME.md`` next
to the PNG.

Where a figure's runs come from: its own grid ``sweeps/<paper>_figures.yaml`` (and
``fedmr_clients_figures.yaml``), or the cells of a table's grid (``grid`` says which); every
grid has a ``smoke`` variant on synthetic data that tests/test_figures.py runs. Choices made
where a paper is silent (which setting an ablation runs in, which values it sweeps) are written
in the grid's header and in the figure's ``note``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import MaxNLocator

from flnotes.messages import did_you_mean
from flnotes.plots import line_style, markevery
from flnotes.repro.reading import DOES_NOT_HOLD, HOLDS, read
from flnotes.repro.tables import SETTING, Run, load_runs

# ---------------------------------------------------------------- runs and curves


def _matches(run: Run, where: dict) -> bool:
    for key, wanted in where.items():
        have = run.value(key)
        if have is None:
            continue
        options = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        if not any(_same(have, option) for option in options):
            return False
    return True


def _same(have, wanted) -> bool:
    if isinstance(have, (int, float)) and isinstance(wanted, (int, float)):
        return math.isclose(float(have), float(wanted), rel_tol=1e-9, abs_tol=1e-12)
    return str(have) == str(wanted)


def mean_band(curves: list[tuple[np.ndarray, np.ndarray]]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds every curve has, and the seeds' mean, lowest and highest value there."""
    common = set.intersection(*(set(r.tolist()) for r, _ in curves)) if curves else set()
    x = np.asarray(sorted(common), dtype=float)
    stack = np.stack([np.asarray([dict(zip(r.tolist(), v.tolist(), strict=True))[k]
                                  for k in x]) for r, v in curves]) if len(x) else \
        np.zeros((len(curves), 0))
    return x, stack.mean(axis=0), stack.min(axis=0), stack.max(axis=0)


# ---------------------------------------------------------------- the registry


def _method(run: Run) -> str:
    return str(run.labels["method"])


def _number(value) -> str:
    return f"{float(value):g}" if isinstance(value, (int, float)) else str(value)


def _variant(setting: str, name: str | None = None) -> Callable[[Run], str]:
    """Lines of an ablation: 'FedMut-4' for a FedMut run with alpha 4; other methods by name."""
    def line(run: Run) -> str:
        if run.config.get(setting) is None:
            return _method(run)
        return f"{name or _method(run)}-{_number(run.config[setting])}"
    return line


@dataclass
class Figure:
    """A paper figure: which runs, which panels, which lines, and what the paper says."""

    name: str
    paper: str
    number: str
    caption: str  # the paper's caption, as printed ([...]: none survives, said from its text)
    claim: str  # what the paper's text says the figure shows
    grid: str  # where the runs come from
    where: dict = field(default_factory=dict)
    split: tuple[str, ...] = ()  # one panel per value of these keys (labels or config)
    line: Callable[[Run], str] = _method
    metrics: tuple[str, ...] = ("accuracy",)
    ylabel: str = "test accuracy (%)"
    higher_is_better: bool = True
    expected_best: tuple[str, ...] = ()  # lines the claim says end best
    note: str = ""  # our choices where the paper is silent


FIGURES: dict[str, Figure] = {f.name: f for f in [
    Figure(
        "fedmut-fig5", "FedMut (AAAI 2024)", "Fig. 5",
        "Learning curves of FedMut and four baselines on CIFAR-10 using ResNet-18 model",
        "FedMut converges more quickly than all four baselines and is more accurate in almost "
        "all rounds; as non-IID grows, the curves fluctuate more and need more rounds.",
        "sweeps/fedmut_table1.yaml (reuses its CIFAR-10 ResNet-18 cells, one panel per "
        "heterogeneity setting)",
        where={"dataset": "CIFAR-10", "model": "ResNet-18"}, split=("heterogeneity",),
        expected_best=("FedMut",)),
    Figure(
        "fedmut-fig6", "FedMut (AAAI 2024)", "Fig. 6",
        "Ablation studies for alpha and beta_0",
        "(a) accuracy grows with alpha while alpha < 5; alpha = 5 trains no usable model. "
        "(b) a higher beta_0 converges faster; a too large beta_0 may fail.",
        "sweeps/fedmut_figures.yaml",
        where={"dataset": "CIFAR-10", "model": "ResNet-18", "heterogeneity": "dir=0.5"},
        line=_variant("alpha"),  # panels (a) and (b): see FEDMUT_FIG6_REFERENCE
        note="the paper names neither the setting nor the values swept: CIFAR-10, ResNet-18, "
             "Dir(0.5); alpha 1..5 at beta_0 0.5, beta_0 0.1..0.9 at alpha 4"),
    Figure(
        "fedqp-fig3", "FedQP (SEKE 2024)", "Fig. 3",
        "Learning curves of our method and all the baseline methods on CIFAR-10 with ResNet-18.",
        "Compared with FedMut, FedQP is more accurate and converges faster early in training.",
        "sweeps/fedqp_tableI.yaml (reuses its CIFAR-10 ResNet-18 cells; panels (a)-(d) = "
        "its four heterogeneity settings)",
        where={"dataset": "CIFAR-10", "model": "ResNet-18"}, split=("heterogeneity",),
        expected_best=("FedQP",)),
    Figure(
        "fedqp-fig4", "FedQP (SEKE 2024)", "Fig. 4",
        "Ablation study results.",
        "Accuracy improves as the programming probability p grows; a too high p slows or "
        "stops convergence. ours-0 is FedMut.",
        "sweeps/fedqp_figures.yaml",
        where={"dataset": "CIFAR-10", "model": "ResNet-18", "heterogeneity": "dir=0.5"},
        line=lambda run: (f"ours-{_number(run.config['qp_prob'])}"
                          if run.config.get("algorithm") == "fedqp" else _method(run)),
        note="the p values are not in the text: 0.1, 0.3, 0.5, 0.7, 0.9, 1.0"),
    Figure(
        "fedmr-fig8", "FedMR (KDD 2024)", "Fig. 8",
        "[no caption in our copy; Sec. 5.2] Test losses of FedAvg and FedMR (without "
        "two-stage training) in IID and non-IID scenarios",
        "The global models of FedMR reach a lower test loss than FedAvg's in all four cases.",
        "sweeps/fedmr_figures.yaml (Fig. 8 cells)",
        where={"dataset": "CIFAR-10", "model": "ResNet-20", "method": ["FedAvg", "FedMR"],
               "stage1_rounds": 0, "segments": 0},
        split=("heterogeneity",), metrics=("loss",), ylabel="test loss",
        higher_is_better=False, expected_best=("FedMR",),
        note="the text names no model for Fig. 8: ResNet-20 (its Sec. 5.2 model); the "
             "Dirichlet alphas were lost from the text: 0.1, 0.5, 1.0 as in FedMut"),
    Figure(
        "fedmr-fig9", "FedMR (KDD 2024)", "Fig. 9",
        "[no caption in our copy; Sec. 5.3.2] Convergence trends of the FL methods on "
        "CIFAR-100 (ResNet-20, FedMR with two-stage training, 100 rounds of first stage)",
        "FedMR beats the other six methods in non-IID and IID settings, with smoother curves.",
        "sweeps/fedmr_table1.yaml (reuses its CIFAR-100 ResNet-20 cells)",
        where={"dataset": "CIFAR-100", "model": "ResNet-20"}, split=("heterogeneity",),
        expected_best=("FedMR",)),
    Figure(
        "fedmr-fig10", "FedMR (KDD 2024)", "Fig. 10",
        "[no caption in our copy; Sec. 5.4.1] Learning trends of FedMR and six baselines "
        "with different numbers of activated clients (ResNet-20, CIFAR-10, non-IID)",
        "FedMR is best in every case; too few activated clients hurt every method; more "
        "clients reduce fluctuations, FedMR's most.",
        "sweeps/fedmr_clients_figures.yaml",
        where={"dataset": "CIFAR-10", "model": "ResNet-20"}, split=("clients_per_round",),
        expected_best=("FedMR",),
        note="the client counts and the alpha were lost from the text: K = 5, 10, 20, 50, "
             "100 of 100, Dir(0.1); FedGen is the baseline left out"),
    Figure(
        "fedmr-fig11", "FedMR (KDD 2024)", "Fig. 11",
        "[no caption in our copy; Sec. 5.4.2] Ablation: FedMR-p (recombination of p segments "
        "instead of layers), CIFAR-10, ResNet-20 and VGG-16, non-IID, no two-stage training",
        "Layer-wise FedMR beats every FedMR-p; the coarser the segments, the worse.",
        "sweeps/fedmr_figures.yaml (Fig. 11 cells; its layer-wise ResNet-20 run is Fig. 8's)",
        where={"dataset": "CIFAR-10", "heterogeneity": "dir=0.1", "method": "FedMR",
               "stage1_rounds": 0},
        split=("model",), expected_best=("FedMR",),
        line=lambda run: (f"FedMR-{run.config['segments']}" if run.config.get("segments")
                          else "FedMR"),
        note="p values not in the text: 2, 4, 8; alpha lost from the text: Dir(0.1)"),
    Figure(
        "fedmr-fig12", "FedMR (KDD 2024)", "Fig. 12",
        "[no caption in our copy; Sec. 5.4.3] Learning trends of FedMR with five two-stage "
        "settings (FedMR-x: x rounds of aggregation first), CIFAR-10, ResNet-20 and VGG-16, "
        "non-IID",
        "FedMR-50 and FedMR-100 are best in accuracy and convergence rate; the gain is "
        "larger for VGG-16.",
        "sweeps/fedmr_figures.yaml (Fig. 12 cells; FedMR-0 is Fig. 11's layer-wise run)",
        where={"dataset": "CIFAR-10", "heterogeneity": "dir=0.1", "method": "FedMR",
               "segments": 0},
        split=("model",), line=_variant("stage1_rounds", "FedMR"),
        expected_best=("FedMR-50", "FedMR-100"),
        note="x values besides 50 and 100 are not in the text: 0, 25, 50, 100, 200"),
    Figure(
        "fml-fig3", "FML (FITEE 2023)", "Fig. 3",
        "Our findings indicate that FML offers better performance improvements than the FedAvg and "
        "FedProx approaches across four different data settings. We simulate various levels of "
        "DH, where the difficulty level gradually increases from left to right. (...)",
        "FML performs better, with a stable trajectory, while FedProx and FedAvg oscillate "
        "in the non-IID settings.",
        "sweeps/fml_table1.yaml (reuses its cells; one row of panels per column of Table 1 "
        "found)",
        split=("dataset", "model", "heterogeneity"), expected_best=("FML",)),
    Figure(
        "fml-fig4", "FML (FITEE 2023)", "Fig. 4",
        "The global model trained in an FL system functions as a generalized model, which "
        "exhibits poor performance on private data in non-IID settings. (...)",
        "FedAvg oscillates more as heterogeneity grows (non-IID (3) most); FedProx oscillates "
        "less but stays low; FML rises fast and stays high.",
        "sweeps/fml_table1.yaml (reuses its cells: each client holds out a share of its data)",
        split=("dataset", "model", "heterogeneity"),
        metrics=("personal_accuracy", "accuracy"),
        ylabel="accuracy on private data (%)", expected_best=("FML",),
        note="FML: its personal models on each client's held-out rows (personal_accuracy); "
             "FedAvg and FedProx have no personal model: their global model's test accuracy"),
    Figure(
        "fedup-fig1", "FedUp (Sci Sin Inform 2024)", "Fig. 1",
        "Impact of non-IID degrees on the testing accuracy of global model over CIFAR-10 and "
        "CIFAR-100. (a)-(c) CIFAR-10, q = 0.3, 0.4, 0.6; (d)-(f) CIFAR-100, q = 0.3, 0.4, 0.6",
        "FedUp is the most accurate in every non-IID setting; the others match FedAvg or do "
        "worse; MimeLite converges faster but no higher.",
        "sweeps/fedup_table4.yaml (reuses its CIFAR-10/100 q = 0.3, 0.4, 0.6 cells)",
        where={"dataset": ["CIFAR-10", "CIFAR-100"],
               "heterogeneity": ["dir=0.3", "dir=0.4", "dir=0.6"]},
        split=("dataset", "heterogeneity"), expected_best=("FedUp",)),
    Figure(
        "fedup-fig2", "FedUp (Sci Sin Inform 2024)", "Fig. 2",
        "Impact of the large-scale clients on the testing accuracy over non-IID FEMNIST",
        "With 500 or 1020 clients per round the others match FedAvg or fail to converge "
        "(STEM, SCAFFOLD); FedUp converges fastest and is the most accurate.",
        "sweeps/fedup_figures.yaml (FEMNIST cells)",
        where={"dataset": "FEMNIST"}, split=("heterogeneity",), expected_best=("FedUp",)),
    Figure(
        "fedup-fig3", "FedUp (Sci Sin Inform 2024)", "Fig. 3",
        "[no caption in our copy; Sec. 6.2.5] FedUp against FedAvg on Shakespeare "
        "next-character prediction (LSTM)",
        "FedUp converges faster and reaches a higher accuracy than FedAvg.",
        "sweeps/fedup_figures.yaml (Shakespeare cells)",
        where={"dataset": "Shakespeare"}, expected_best=("FedUp",)),
]}


# FedMut Fig. 6 has two panels from one grid: (a) the alpha runs at the reference beta_0,
# (b) the beta_0 runs at the reference alpha. Which panel a run belongs to is read from its
# config (a run at both reference values, FedMut-4 with beta_0 0.5, is in both).
FEDMUT_FIG6_REFERENCE = {"alpha": 4.0, "beta0": 0.5}


def _panels(figure: Figure, runs: list[Run]) -> list[tuple[str, list[Run], Callable]]:
    """(title, runs, line function) of each panel, in order."""
    chosen = [r for r in runs if _matches(r, figure.where)]
    if figure.name == "fedmut-fig6":
        alpha, beta = FEDMUT_FIG6_REFERENCE["alpha"], FEDMUT_FIG6_REFERENCE["beta0"]
        by_alpha = [r for r in chosen if _matches(r, {"beta0": beta})]
        by_beta = [r for r in chosen if _matches(r, {"alpha": alpha})]
        return [(f"(a) alpha (beta_0 = {beta:g})", by_alpha, _variant("alpha")),
                (f"(b) beta_0 (alpha = {alpha:g})", by_beta, _variant("beta0"))]
    if not figure.split:
        return [("", chosen, figure.line)]
    groups: dict[tuple, list[Run]] = {}
    for run in chosen:
        groups.setdefault(tuple(run.value(k) for k in figure.split), []).append(run)
    order = sorted(groups, key=lambda key: [_natural(v) for v in key])
    titles = [", ".join(str(v) if k in SETTING else f"{k} = {_number(v)}"
                        for k, v in zip(figure.split, key, strict=True)) for key in order]
    return [(f"({chr(97 + i)}) {title}" if len(order) > 1 else title, groups[key],
             figure.line) for i, (key, title) in enumerate(zip(order, titles, strict=True))]


def _natural(value) -> tuple:
    """Sort key: numbers by value, text with its numbers read as numbers (clients=500 before
    clients=1020)."""
    if isinstance(value, (int, float)):
        return (0, float(value), ())
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return (1, 0.0, tuple((0, float(p), "") if i % 2 else (1, 0.0, p)
                          for i, p in enumerate(parts)))


@dataclass
class Line:
    label: str
    rounds: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int
    per_seed: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def panel_lines(figure: Figure, runs: list[Run], line: Callable) -> list[Line]:
    """The lines of one panel: runs grouped by line label, mean and band over seeds."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(line(run), []).append(run)
    out = []
    for label in sorted(groups, key=_line_order):
        drawn = [(run.seed, c) for run in groups[label] if len((c := run.curve(figure.metrics))[0])]
        if not drawn:
            continue
        seeds, curves = (list(v) for v in zip(*drawn, strict=True))
        x, mean, low, high = mean_band(curves)
        # the seeds' own curves, for the reading rule; none where a seed repeats in a line
        per_seed = dict(zip(seeds, curves, strict=True)) if len(set(seeds)) == len(seeds) \
            else {}
        out.append(Line(label, x, mean, low, high, len(curves), per_seed))
    return out


def _line_order(label: str):
    """FedAvg first, then baselines by name, variants by their number."""
    name, _, number = label.rpartition("-")
    try:
        return (label != "FedAvg", name, float(number))
    except ValueError:
        return (label != "FedAvg", label, 0.0)


def summary(figure: Figure, panels: list[tuple[str, list[Line]]]) -> list[str]:
    """Ours, one line per panel: each line's value at the last round its seeds share, and
    whether the line the paper says ends best does, by the reading rule (flnotes.repro.
    reading: per seed, the late mean difference to every other line; never one round)."""
    out = []
    for title, lines in panels:
        if not lines:
            out.append(f"{title or 'panel'}: no runs")
            continue
        last = {line.label: float(line.mean[-1]) for line in lines if len(line.mean)}
        if not last:
            out.append(f"{title or 'panel'}: no round common to the seeds")
            continue
        values = ", ".join(f"{k} {v:.2f}" for k, v in last.items())
        rounds = int(max(line.rounds[-1] for line in lines if len(line.rounds)))
        out.append(f"{title or 'panel'}: at the last common round (up to {rounds}): "
                   f"{values}{_verdict(figure, lines)}")
    return out


def _verdict(figure: Figure, lines: list[Line]) -> str:
    """Whether the lines the paper says end best do, as '; ...' to follow the values.

    Each claimed line against each line the paper does not name, by the reading rule over
    the seeds both have ("X > Y", or "X < Y" for a loss): the ordering holds when every such
    claim holds, does not hold when one of them does not, and otherwise cannot be told (with
    one seed, always: one run cannot tell a method from its seed). Claimed lines are not
    read against each other (FedMR-50 and FedMR-100 both "best")."""
    if not figure.expected_best:
        return ""
    claimed = [line for line in lines if line.label in figure.expected_best]
    others = [line for line in lines if line.label not in figure.expected_best]
    if not claimed:
        return f"; {' / '.join(figure.expected_best)} not run"
    if not others:
        return ""
    # (lower is better, a loss: "best < other" is read as "other > best")
    claims = [(f"{b.label} > {o.label}", read(b.per_seed, o.per_seed)) if figure.higher_is_better
              else (f"{b.label} < {o.label}", read(o.per_seed, b.per_seed))
              for b in claimed for o in others]
    verdicts = {result.verdict for _, result in claims}
    overall = ("holds" if verdicts == {HOLDS} else "does not hold" if DOES_NOT_HOLD in verdicts
               else "cannot be told")
    seeds = max(len(result.seeds) for _, result in claims)
    detail = "; ".join(f"{claim} {result.verdict} ("
                       + (", ".join(f"{s.difference:+.2f}" for s in result.seeds) or "no seed")
                       + ")" for claim, result in claims)
    return (f"; the paper's ordering {overall} by the reading rule over {seeds} "
            f"seed{'s' if seeds != 1 else ''}, late difference per seed: {detail}")


# The caption under a figure: monospace (its lines wrapped to a width in characters), at a
# size that stays readable at the 72 dpi notebook 22 shows figures at (8 pt = 8 px there).
CAPTION_FONT = {"family": "monospace", "size": 8.0}
CAPTION_LINE = 1.25  # line height, in font sizes (matplotlib's linespacing 1.2 and a margin)
CAPTION_MARGIN = 0.12  # inches between the caption and the canvas's left and bottom edges


def caption_width(fig, margin: float = CAPTION_MARGIN) -> int:
    """How many caption characters fit on one line of ``fig``, from the width its renderer
    gives a run of monospace characters (in inches, so at any dpi the figure is saved at)."""
    renderer = fig.canvas.get_renderer()
    sample = "M" * 50
    width_px, _, _ = renderer.get_text_width_height_descent(
        sample, FontProperties(**CAPTION_FONT), ismath=False)
    per_char = width_px / fig.dpi / len(sample)
    return max(20, int((fig.get_figwidth() - 2 * margin) / per_char) - 1)


def draw(figure: Figure, runs: list[Run], scale: str | None = None):
    """The figure in the paper's layout, with the paper's caption and claim and ours below.

    The caption is wrapped to the figure's width and the figure made tall enough for it, so
    it lies inside the canvas whatever the dpi or bounding box it is saved with. Each line
    keeps one colour, line style and marker in every panel (``flnotes.plots.line_style``).

    ``scale`` (e.g. "smoke scale") goes into the title, so that a figure drawn from runs that
    cannot test the claim says so on itself.

    Returns (matplotlib Figure, caption lines)."""
    matplotlib.use("Agg", force=False)

    panels = [(title, panel_lines(figure, chosen, line))
              for title, chosen, line in _panels(figure, runs)]
    if not any(lines for _, lines in panels):
        raise ValueError(f"no runs for {figure.name} under the results folder (it needs "
                         f"{figure.grid}; where {json.dumps(figure.where, default=str)})")
    panels = [(t, lines) for t, lines in panels if lines] or panels
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    # One panel alone is drawn wider: its caption has room then, in fewer lines.
    width, plots_height, title_height = max(4.2 * columns, 6.4), 3.3 * rows, 0.3
    fig, axes = plt.subplots(rows, columns, figsize=(width, plots_height + title_height),
                             squeeze=False)
    labels = list(dict.fromkeys(line.label for _, lines in panels for line in lines))
    styles = {label: line_style(k) for k, label in enumerate(labels)}
    for ax, (title, lines) in zip(axes.flat, panels, strict=False):
        for line in lines:
            style = styles[line.label]
            ax.plot(line.rounds, line.mean, lw=1.4, ms=4, label=line.label,
                    markevery=markevery(len(line.rounds)), **style)
            if line.seeds > 1:
                ax.fill_between(line.rounds, line.low, line.high, color=style["color"],
                                alpha=0.2, lw=0)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no round 2.5
        ax.set_ylabel(figure.ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    ours = summary(figure, panels)
    caption = caption_lines(figure, ours)
    fig.suptitle(f"{figure.paper} {figure.number}: ours" + (f", {scale}" if scale else ""),
                 fontsize=11)
    chars = caption_width(fig)
    text = "\n".join(textwrap.fill(line, chars, subsequent_indent="  ")
                     for line in caption[1:])
    # The canvas grows by the caption's height, the panels keep theirs.
    caption_height = ((text.count("\n") + 1) * CAPTION_LINE * CAPTION_FONT["size"] / 72
                      + 2 * CAPTION_MARGIN)
    height = plots_height + title_height + caption_height
    fig.set_size_inches(width, height)
    fig.text(CAPTION_MARGIN / width, CAPTION_MARGIN / height, text, va="bottom", ha="left",
             fontdict=CAPTION_FONT, gid="caption")
    # (tight_layout leaves the suptitle its room itself)
    fig.tight_layout(rect=(0, caption_height / height, 1, 1))
    return fig, caption


def caption_lines(figure: Figure, ours: list[str]) -> list[str]:
    lines = [f"{figure.paper} {figure.number} ({figure.name})",
             f"Paper's caption: {figure.caption}",
             f"Paper's claim: {figure.claim}",
             f"Runs: {figure.grid}; lines: mean over seeds, band: lowest to highest seed."]
    if figure.note:
        lines.append(f"Our choices: {figure.note}")
    lines += [f"Ours: {line}" for line in ours]
    return lines


def make_figure(results: str | Path, name: str, out: str | Path | None = None
                ) -> tuple[Path, Path]:
    """Draw figure ``name`` from the runs under ``results``; write the PNG and the caption
    file (default: RESULTS/figures/NAME.png and .md). Returns both paths."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}{did_you_mean(name, list(FIGURES))}; "
                         f"figures: {', '.join(FIGURES)}")

    runs = load_runs(results)
    # runs of a grid's smoke variant keep the paper setting's labels: the figure says so
    smoked = sum(run.variant == "smoke" for run in runs)
    smoke = None if not smoked else "smoke scale" if smoked == len(runs) else \
        f"{smoked} of {len(runs)} runs at smoke scale"
    fig, caption = draw(FIGURES[name], runs, scale=smoke)
    png = Path(out) if out else Path(results) / "figures" / f"{name}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    text = png.with_suffix(".md")
    if smoke:  # (the figure's own title says it too)
        caption = [f"{caption[0]}, {'at ' if smoked == len(runs) else ''}{smoke}: the "
                   "grid's smoke variant (its own small data and model) under the paper "
                   "setting's labels", *caption[1:]]
    text.write_text("\n\n".join(caption) + "\n")
    return png, text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``figures`` subcommand."""
    parser.add_argument("results", nargs="?", help="folder of run folders (a sweep's output)")
    parser.add_argument("--figure", action="append",
                        help="a figure to draw (repeatable; see --list)")
    parser.add_argument("--list", action="store_true", help="list the figures and their grids")
    parser.add_argument("--out", help="PNG path of the figure (one --figure only); default "
                        "RESULTS/figures/NAME.png, its caption beside it as NAME.md")


def cmd_figures(args: argparse.Namespace) -> int:
    if args.list or not args.figure:
        for figure in FIGURES.values():
            print(f"{figure.name:12s} {figure.paper} {figure.number}: {figure.caption}")
            print(f"{'':12s}   runs: {figure.grid}")
        return 0
    if not args.results:
        raise ValueError("give the results folder: figures RESULTS --figure NAME")
    if args.out and len(args.figure) > 1:
        raise ValueError("--out takes one --figure")
    for name in args.figure:
        png, text = make_figure(args.results, name, args.out)
        print(f"{name}: {png} (caption {text})")
        print(Path(text).read_text().rstrip())
    return 0
