"""The committed real-data evidence, as the reproduction notebooks open on it.

Each study is one sweep grid in ``benchmarks/`` whose run folders are committed under
``results/<name>/`` (config.json, run.json, metrics.jsonl per run). ``show(name)`` draws the
study's learning curves and its reading exactly as the results page does
(flnotes.repro.results_page: the same figure, the same tables, the reading rule of
flnotes.repro.reading), from the runs there when it is called. Without the repository's
results folder above the working directory (a wheel, or notebooks copied by ``flnotes
notebooks DEST``) it prints one line: where the stored picture comes from and the command
that makes the runs.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import PIL.Image

from flnotes.repro import figures, results_page
from flnotes.repro.reading import claim_line


@dataclass(frozen=True)
class Study:
    """One committed real-data study: its grid, its results folder and what it costs."""

    grid: str  # the grid file, relative to the repository
    page: str  # its generated page, relative to results/
    cost: str  # CPU cost as measured, for the one-line message
    data: str = "--set data_dir=DATA "  # how the command names the data folder ...
    env: str = ""  # ... or the environment before it

    def command(self, name: str) -> str:
        """The command that makes the study's runs in a clone with the data."""
        return (f"{self.env}python -m flnotes sweep {self.grid} {self.data}--out "
                f"results/{name} --workers 1")


STUDIES = {
    "cifar10-lenet": Study("benchmarks/cifar10_lenet_evidence.yaml", "README.md",
                           "about 6.5 CPU-seconds a round on one thread, 200 rounds a run"),
    "cifar10-lenet-400": Study("benchmarks/cifar10_lenet_400.yaml", "cifar10-lenet-400.md",
                               "6-9 CPU-seconds a round on one loaded thread, 400 rounds a "
                               "run"),
    "fml-cifar10": Study("benchmarks/fml_cifar10_evidence.yaml", "fml-cifar10.md",
                         "3-8 s a round on one loaded thread, 100 rounds a run"),
    "shakespeare-plays": Study("benchmarks/shakespeare_evidence.yaml", "shakespeare-plays.md",
                               "25-57 s a round on one loaded thread, 40 rounds a run"),
    "flat-minima-cpu": Study("benchmarks/flat_minima_cpu.yaml", "flat-minima-cpu.md",
                             "7-10 s a round on one loaded thread (twice that for two "
                             "gradients a step), 200 rounds a run"),
    # CIFAR-10 from $FLNOTES_DATA, so that Fashion-MNIST may come from Debian's copy
    "fedup": Study("benchmarks/fedup_evidence.yaml", "fedup.md",
                   "2-4 s a round on one loaded thread, 150-200 rounds a run",
                   data="", env="FLNOTES_DATA=DATA "),
}
# the page's sections a notebook shows under the curves
SECTIONS = ("Differences to FedAvg, beside the papers'", "Personal models", "Reading")


def find(name: str, start: Path | None = None) -> Path | None:
    """``results/<name>`` in the first folder at or above ``start`` (the working directory)
    that has it, or None."""
    start = Path.cwd() if start is None else Path(start)
    return next((p / "results" / name for p in [start, *start.parents]
                 if (p / "results" / name / "cells").is_dir()), None)


def missing_line(name: str) -> str:
    """What a notebook prints where there is no results folder to read."""
    study = STUDIES[name]
    return (f"No results/{name} folder here or above, so nothing to draw: the picture and "
            f"reading stored in this notebook come from the flnotes repository's committed "
            f"runs (results/{name}, page results/{study.page}); in a clone with the data, "
            f"`{study.command(name)}` makes them ({study.cost}).")


def sections(text: str, wanted: tuple[str, ...] = SECTIONS) -> str:
    """The ``## `` sections of a page named in ``wanted``, in the page's order."""
    parts = text.split("\n## ")
    kept = [part for part in parts[1:] if part.split("\n", 1)[0] in wanted]
    return "\n".join("### " + part.strip() + "\n" for part in kept)


def load(name: str, folder: Path | None = None):
    """(runs, groups, page text) of a study's folder, or None when there is none."""
    folder = find(name) if folder is None else Path(folder)
    if folder is None or not folder.is_dir():
        return None
    runs = figures.load_runs(folder)
    if not runs:
        return None
    groups = results_page.by_setting(runs)
    return runs, groups, results_page.page_text(folder, groups, png="")


def show(name: str, folder: Path | None = None, wanted: tuple[str, ...] = SECTIONS,
         readings: bool = False):
    """Display a study's curves and reading in a notebook (IPython's display); return the
    figure, or None with the one-line message printed when there are no runs to read.
    ``readings``: also the reading rule's picture (results_page.readings_figure), for a
    study with more methods than its curves keep apart."""
    # (imported here: only a notebook needs pyplot and IPython; the pages and tables do not)
    import matplotlib.pyplot as plt
    from IPython.display import Image, Markdown, display

    loaded = load(name, folder)
    if loaded is None:
        print(missing_line(name))
        return None
    runs, groups, text = loaded
    statuses = Counter(run.status for run in runs)
    counted = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    late = "" if set(statuses) == {"completed"} else \
        "; a run not completed is drawn to its last evaluation"
    print(f"{len(runs)} runs under results/{name} ({counted}{late})")
    fig = results_page.curves_figure(groups)
    dots = results_page.readings_figure(groups) if readings else None
    # shown as a PNG made here, then closed: where a caller switched pyplot to Agg (notebook
    # 22's figure code does) neither plt.show() nor display(fig) shows anything, and an open
    # figure would be drawn a second time at the cell's end under the inline backend
    for shown in (fig, dots):
        if shown is not None:
            display(Image(line_chart_png(shown)))
            plt.close(shown)
    display(Markdown(sections(text, wanted)))
    return fig


def line_chart_png(fig) -> bytes:
    """``fig`` as a PNG with a 64-colour palette: a line chart's dozen colours and their
    anti-aliased edges look the same as at 256 colours, in about two thirds of the bytes
    (notebook 10 stores four of these and must stay small enough to open quickly)."""
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=100, bbox_inches="tight")
    with PIL.Image.open(rendered) as image:
        quantised = image.convert("RGB").quantize(64, method=PIL.Image.Quantize.MEDIANCUT)
    buffer = io.BytesIO()
    quantised.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def verdicts(groups: dict) -> list[str]:
    """One line per difference the study reads: the setting, "method > FedAvg", the verdict
    and each seed's late difference (and, for personal models, personal > global). The same
    reading rule and numbers as the page's tables, without the sentences."""
    lines = []
    for setting, by_method in groups.items():
        base = by_method.get(results_page.BASELINE, [])
        lines += [claim_line(setting, f"{m} > {results_page.BASELINE}",
                             results_page.late_reading(runs, base),
                             results_page.diverged(by_method, m, results_page.BASELINE))
                  for m, runs in by_method.items() if m != results_page.BASELINE and base]
        lines += [claim_line(setting, f"{m}'s personal models > its global model", result,
                             results_page.diverged(by_method, m))
                  for m, result in results_page.personal_readings(by_method)]
    return lines


def answer(name: str, folder: Path | None = None) -> list[str] | None:
    """Print the study's verdicts (the answer a notebook ends on); None, with the one-line
    message printed, when there are no runs to read."""
    loaded = load(name, folder)
    if loaded is None:
        print(missing_line(name))
        return None
    lines = verdicts(loaded[1]) or [f"results/{name}: no method's run beside a FedAvg run yet"]
    print("\n".join(lines))
    return lines

