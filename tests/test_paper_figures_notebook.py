"""Notebook 22 (every paper figure from stored results): stored whole, one figure per
registered figure plus each real-data study's curves, every figure's results committed under
results/paper-figures-smoke, and one plain sentence per figure where no results/ folder is
found (an installed wheel, a copied notebook)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from flnotes.repro import figures

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "flnotes" / "notebooks" / "22_paper_figures.ipynb"
SMOKE = REPO / "results" / "paper-figures-smoke"


def _code_cells() -> list[dict]:
    return [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]


def _pngs(cell: dict) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def test_one_stored_figure_per_registered_figure_and_the_evidence_curves():
    from flnotes.repro.evidence import STUDIES

    code = _code_cells()
    studies = [c for c in code if "evidence.show(" in "".join(c["source"])]
    assert len(studies) == 1 and _pngs(studies[0]) == len(STUDIES)
    drawn = sum(_pngs(c) for c in code) - len(STUDIES)
    assert drawn == len(figures.FIGURES)
    shown = "".join(t for c in code for o in c["outputs"] if o["output_type"] == "stream"
                    for t in o["text"])
    assert f"{len(figures.FIGURES)} of {len(figures.FIGURES)} figures drawn from stored results" \
        in shown
    for name in figures.FIGURES:
        assert f"--figure {name}\n" in shown, name  # its paper-scale command


@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_every_figure_draws_from_the_committed_smoke_results(name):
    """benchmarks/paper_figures_results.py has been run for every registered figure (a new
    figure needs it run again, and its results committed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = figures.FIGURES[name]
    folder = SMOKE / Path(figure.grid.split()[0]).stem
    assert folder.is_dir(), f"{name}: run python benchmarks/paper_figures_results.py"
    fig, caption = figures.draw(figure, figures.load_runs(folder), scale="smoke scale")
    assert fig._suptitle.get_text().endswith(": ours, smoke scale")
    plt.close(fig)
    ours = [line for line in caption if line.startswith("Ours: ")]
    assert ours
    # one seed: no ordering the paper claims can be told from it
    assert not any("ordering holds" in line or "does not hold" in line for line in ours)


def test_without_a_results_folder_each_figure_says_how_to_make_its_results(tmp_path,
                                                                             monkeypatch):
    """The notebook's cells run from a folder with no results/ above it: no figure, no error,
    one sentence per figure naming the commands."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell in _code_cells():
            source = "".join(cell["source"])
            if "NBVAL_CHECK_OUTPUT" in source:  # the registry's table of runs found
                continue
            exec(compile(source, str(NOTEBOOK), "exec"), namespace)
    lines = out.getvalue().splitlines()
    assert namespace["root"] is None
    for name in figures.FIGURES:
        said = [line for line in lines if line.startswith(f"{name}: no stored results found")]
        assert len(said) == 1, name
        assert "python benchmarks/paper_figures_results.py" in said[0]
        assert f"--figure {name}`" in said[0]
    from flnotes.repro.evidence import STUDIES

    for study in STUDIES:  # each real-data study: one line naming its grid
        assert sum(line.startswith(f"No results/{study} folder here or above")
                   for line in lines) == 1, study
    # The count says how many figures were drawn, not how many sections were printed.
    n = len(figures.FIGURES)
    assert any(line.startswith(f"0 of {n} figures drawn from stored results; {n} without "
                               "results here") for line in lines)


def test_the_smoke_results_script_still_runs_a_grid_as_committed(tmp_path):
    # benchmarks/paper_figures_results.py makes results/paper-figures-smoke; it calls the
    # grid module's private helpers, which once changed under it unnoticed. One figure grid,
    # run here: each run's settings equal the committed run's (cell ids may differ: they hash
    # the settings as today's grid module writes them).
    import importlib.util
    import re

    path = REPO / "benchmarks" / "paper_figures_results.py"
    spec = importlib.util.spec_from_file_location("paper_figures_results", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--grid", "fedqp_figures", "--out", str(tmp_path)]) == 0

    def configs(root: Path) -> dict[str, dict]:
        found = {}
        for file in root.rglob("config.json"):
            key = re.sub(r"-[0-9a-f]{8}/", "/", str(file.relative_to(root)))
            found[key] = {k: v for k, v in json.loads(file.read_text()).items()
                          if k != "run_dir"}
        return found

    made, committed = configs(tmp_path / "fedqp_figures"), configs(SMOKE / "fedqp_figures")
    assert made and made.keys() == committed.keys()
    for key, config in committed.items():
        assert {k: made[key].get(k) for k in config} == config, key
