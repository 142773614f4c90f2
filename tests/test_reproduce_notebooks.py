"""The reproduction notebooks 10-12 as papermill runs them, and as they are stored.

- ``-p preset NAME`` starts from that preset; a parameter set explicitly (one whose value
  differs from the parameters cell's) overrides the preset's value; a wrong name is one line;
- by default the run folders land under ``runs/notebooks/`` of the working directory, where
  ``flnotes.repro.tables`` (``python -m flnotes tables runs/notebooks``) finds them, and the
  same parameters again resume (here: read back) the finished runs instead of failing;
- 10, 11 and 12 are stored with the figures of a run of their defaults.

The runs use the ``demo`` preset (synthetic data, nothing to download) and one round.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "flnotes" / "notebooks"
CIFAR = NOTEBOOKS / "10_reproduce_cifar.ipynb"
REPRODUCTIONS = ("10_reproduce_cifar", "11_reproduce_shakespeare", "12_reproduce_fml")
# Set explicitly over the demo preset: one method, one round, a small synthetic task.
SMALL = {"preset": "demo", "algorithms": "fedavg", "rounds": 1,
         "data_options": {"num_train": 300, "num_test": 100}}


def execute(parameters: dict, cwd: Path) -> dict:
    """Run notebook 10 with papermill in ``cwd``; the executed notebook (raises on an error)."""
    import papermill as pm

    from flnotes.repro.kernel import current_kernel
    from flnotes.repro.notebooks import quiet_kernel_manager

    out = cwd / "executed.ipynb"
    pm.execute_notebook(str(CIFAR), str(out), parameters=parameters, cwd=str(cwd),
                        progress_bar=False, kernel_name=current_kernel(),
                        kernel_manager_class=quiet_kernel_manager())
    return json.loads(out.read_text())


def printed(notebook: dict) -> str:
    return "".join("".join(o.get("text", "")) for c in notebook["cells"]
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """Notebook 10 from the demo preset with its default output folder, run twice."""
    cwd = tmp_path_factory.mktemp("nb10")
    first = execute(SMALL, cwd)
    configs = sorted((cwd / "runs" / "notebooks").rglob("config.json"))
    written = {p: p.read_bytes() for p in (cwd / "runs").rglob("metrics.jsonl")}
    again = execute(SMALL, cwd)
    return cwd, first, configs, written, again


def test_preset_sets_the_config_and_explicit_parameters_override_it(demo_run):
    from flnotes.config import RunConfig

    _, first, configs, _, _ = demo_run
    assert len(configs) == 1, configs
    config = json.loads(configs[0].read_text())
    demo = RunConfig.from_preset("demo")
    # From the preset (the notebook's own defaults differ: 10 clients, 5 a round, lr 0.1)
    for name in ("num_clients", "clients_per_round", "lr", "momentum", "local_epochs"):
        assert config[name] == getattr(demo, name), name
    assert (config["num_clients"], config["clients_per_round"], config["lr"]) == (20, 10, 0.05)
    # Set explicitly, over the preset's 15 rounds and its dataset's own sizes
    assert config["rounds"] == 1 and config["algorithm"] == "fedavg"
    assert config["data_options"] == SMALL["data_options"]
    text = printed(first)
    assert "from preset demo: " in text and "lr=0.05" in text
    assert "set as parameters, over the preset: " in text and "rounds=1" in text


def test_default_folder_is_under_runs_and_tables_find_it(demo_run):
    from flnotes.repro import tables

    cwd, _, configs, written, again = demo_run
    assert configs[0].relative_to(cwd).parts[:3] == ("runs", "notebooks", "10_reproduce_cifar")
    runs = tables.collect_runs(cwd / "runs" / "notebooks")
    assert list(runs["status"]) == ["completed"] and list(runs["algorithm"]) == ["fedavg"]
    # The same parameters again: the finished run is resumed in its folder (its rounds are
    # read back, not trained again) and the notebook's table still counts it once.
    assert {p: p.read_bytes() for p in written} == written and len(written) == 1
    assert sorted((cwd / "runs" / "notebooks").rglob("config.json")) == configs
    assert "1 methods, 1 runs, 1 completed" in printed(again)


def test_a_wrong_preset_name_is_one_line(tmp_path):
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError):
        execute({"preset": "fedmut-papr"}, tmp_path)
    notebook = json.loads((tmp_path / "executed.ipynb").read_text())
    errors = [o for c in notebook["cells"] for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert len(errors) == 1
    (line,) = errors[0]["traceback"]  # one line, no traceback
    assert line == f"PresetError: {errors[0]['evalue']}"
    assert "unknown preset 'fedmut-papr'" in line and "'fedmut-paper'" in line
    assert "python -m flnotes presets" in line
    assert not (tmp_path / "runs").exists()  # it stopped before any run


def test_preset_parameter_is_typed_and_sweep_grids_still_expand():
    """papermill --help-notebook shows ``preset`` with its type; a grid's ``preset`` key is the
    grid's own (expanded into the cell's parameters), never passed to the notebook."""
    import papermill as pm

    from flnotes.repro import grid as grids

    for name in REPRODUCTIONS:
        info = pm.inspect_notebook(str(NOTEBOOKS / f"{name}.ipynb"))
        assert info["preset"]["inferred_type_name"] == "Optional[str]", name
        assert info["preset"]["default"] == "None", name
        assert "cell_values" not in info, name  # the cell's snapshot is no parameter
    cells = grids.load_grid(NOTEBOOKS.parent / "sweeps" / "fedmut_table1.yaml", smoke=True).cells
    assert cells and all("preset" not in c.parameters for c in cells)


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_stored_with_the_figures_of_a_default_run(name):
    notebook = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), name
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], name
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert figures, f"{name}: no figure stored"
    for cell in code:  # every cell that draws stores its figure
        if "plot_learning_curves(" in "".join(cell["source"]):
            assert any("image/png" in o.get("data", {}) for o in cell["outputs"]), name
    assert (NOTEBOOKS / f"{name}.ipynb").stat().st_size < 300_000, name
    # A default run's folders are under runs/notebooks/ (printed relative, not a temp folder)
    assert "/tmp" not in json.dumps(outputs), name


def test_what_we_see_numbers_are_stored_outputs():
    """Every percentage the discussion of notebook 10 quotes is a stored number, rounded."""
    import re

    notebook = json.loads((CIFAR).read_text())
    text = "".join("".join(c["source"]) for c in notebook["cells"]
                   if c["cell_type"] == "markdown" and "## What we see" in "".join(c["source"]))
    stored = printed(notebook) + "".join(
        "".join(o.get("data", {}).get("text/plain", "")) for c in notebook["cells"]
        for o in c.get("outputs", []))
    accuracies = {round(100 * float(a)) for a in re.findall(r"final accuracy (0\.\d+)", stored)}
    for percent in map(int, re.findall(r"(\d+)%", text)):
        assert percent in accuracies, (percent, sorted(accuracies))


def test_notebook_20_without_the_repository_results_says_where_its_figure_came_from(
        tmp_path, monkeypatch, capsys):
    """Installed from a wheel there is no results/ folder above the working directory: the
    seed-code cell says in one sentence whose figure is stored and which command makes one."""
    import matplotlib

    matplotlib.use("Agg")
    notebook = json.loads((NOTEBOOKS / "20_tables_vs_paper.ipynb").read_text())
    (cell,) = [c for c in notebook["cells"] if c["cell_type"] == "code"
               and "seed-code-baselines/comparison.json" in "".join(c["source"])]
    assert any("image/png" in o.get("data", {}) for o in cell["outputs"])  # the stored figure
    monkeypatch.chdir(tmp_path)
    exec("".join(cell["source"]), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert "stored in this notebook as the flnotes repository ships it" in lines[0]
    assert "python benchmarks/seed_code_baselines.py" in lines[0]
