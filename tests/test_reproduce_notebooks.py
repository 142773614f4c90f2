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

import IPython.display
import pandas as pd
import pytest

from flnotes.repro import evidence, tables

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
    assert "set as parameters: " in text and "rounds=1" in text


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
    assert line == f"SettingsError: {errors[0]['evalue']}"
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


def notebook_20_code(*markers: str) -> str:
    """The code of notebook 20's cells that contain each marker, in the notebook's order."""
    notebook = json.loads((NOTEBOOKS / "20_tables_vs_paper.ipynb").read_text())
    sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    chosen = [s for s in sources if any(m in s for m in markers)]
    assert len(chosen) == len(markers), markers
    return "\n".join(chosen)


# The parameters cell, the cell that reads the runs, and the tables cell.
NOTEBOOK_20_TABLES = ("# Parameters", "evidence.STUDIES", "side_by_side(")


def study_run(root: Path, cell_id: str, algorithm: str, method: str, heterogeneity: str):
    """One run folder of a study's sweep, made for FedMut's Table 1 (cell.json)."""
    cell = root / "cells" / cell_id
    run_dir = cell / "runs" / algorithm / "seed0"
    run_dir.mkdir(parents=True)
    config = {"algorithm": algorithm, "dataset": "cifar10", "model": "lenet-cifar",
              "partition": "iid" if heterogeneity == "iid" else "dirichlet",
              "dirichlet_alpha": 0.1, "rounds": 20, "seed": 0, "run_dir": str(run_dir)}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "run.json").write_text(json.dumps({"config": config, "status": "completed"}))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"round": r, "train_loss": 1.0, "accuracy": 0.3 + r / 100}) + "\n"
        for r in range(1, 21)))
    (cell / "cell.json").write_text(json.dumps(
        {"paper_table": "fedmut_table1", "labels": {
            "dataset": "CIFAR-10", "model": "CNN", "heterogeneity": heterogeneity,
            "method": method}}))


def test_notebook_20_shows_only_the_run_cells_of_the_committed_studies(
        tmp_path, monkeypatch, capsys):
    """With results_dir None the notebook reads each study of evidence.STUDIES under results/;
    a table shows its run cells only, under one line counting the cells not run, and a table
    without a run cell is that line alone."""
    root = tmp_path / "results" / "a-study"
    study_run(root, "dir=0.1_FedAvg_seed0", "fedavg", "FedAvg", "dir=0.1")
    study_run(root, "iid_FedMut_seed0", "fedmut", "FedMut", "iid")
    study_run(root, "dir=0.1_FedMR_seed0", "fedmr", "FedMR", "dir=0.1")  # no table has it
    monkeypatch.setattr(evidence, "STUDIES", {"a-study": evidence.STUDIES["cifar10-lenet"]})
    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.chdir(tmp_path)
    exec(notebook_20_code(*NOTEBOOK_20_TABLES), {})
    lines = capsys.readouterr().out.strip().splitlines()

    assert lines[0] == "read the committed studies: results/a-study (3 run folders)"
    counts = [i for i, line in enumerate(lines) if " cells run; " in line]
    names = [lines[i].split(":")[0] for i in counts]
    assert names == tables.paper_table_names()
    assert ("fedmut_table1: 2 of 120 cells run; 118 not run (paper values only: "
            "tables.load_paper_table('fedmut_table1'))") in lines
    # FedQP's Table I prints FedAvg at dir=0.1 and FedMut at IID for CIFAR-10 / CNN as well.
    assert lines[counts[names.index("fedqp_tableI")]].startswith("fedqp_tableI: 2 of 144 ")
    for i, end in zip(counts, [*counts[1:], len(lines)], strict=True):
        if lines[i].split(": ")[1].startswith("0 of"):  # nothing run: the count line alone
            assert end == i + 1 or lines[i + 1].startswith("run, but"), lines[i:end]
    assert lines[-1] == "run, but in no cell of the tables shown: CIFAR-10 / CNN / dir=0.1 / FedMR"

    assert len(shown) == 2 and all(isinstance(frame, pd.DataFrame) for frame in shown)
    fedmut = shown[0]
    assert list(fedmut.columns) == ["FedAvg", "FedMut"]
    assert list(fedmut.index) == [("CIFAR-10", "CNN", "dir=0.1"), ("CIFAR-10", "CNN", "iid")]
    for frame in shown:
        cells = [cell for cell in frame.to_numpy().ravel() if cell]
        assert len(cells) == 2 and not any("not run" in cell for cell in cells), frame
    assert fedmut.loc[("CIFAR-10", "CNN", "dir=0.1"), "FedAvg"].startswith("47.93 / ")


def test_notebook_20_without_the_studies_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Outside the repository (no results/<study> above) one line says where the stored tables
    came from, and every table is its paper's values alone."""
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(notebook_20_code(*NOTEBOOK_20_TABLES[:2]), namespace)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("No results/<study> folder here or above (cifar10-lenet, ")
    assert "stored in this notebook as the flnotes repository ships it" in lines[0]
    assert namespace["ours"] is None
    assert all(set(r["status"]) == {"not run"} for r in namespace["comparisons"].values())


@pytest.mark.parametrize("notebook, study", [("10_reproduce_cifar", "cifar10-lenet"),
                                             ("11_reproduce_shakespeare", "shakespeare-plays"),
                                             ("12_reproduce_fml", "fml-cifar10")])
def test_a_reproduction_notebook_opens_on_its_committed_study(notebook, study):
    """The first picture of 10, 11 and 12 is the committed real-data study (stored, so the
    notebook shows it when opened), drawn right after the parameters by flnotes.repro.evidence,
    and skipped in a sweep's cell (which sets output_dir)."""
    assert study in evidence.STUDIES
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(code) if "parameters" in c["metadata"].get("tags", []))
    shows = [i for i, c in enumerate(code) if f'evidence.show("{study}")' in "".join(c["source"])]
    assert shows == [first + 1], (notebook, shows, first)
    cell = code[shows[0]]
    assert "in_a_sweep = output_dir is not None\nif not in_a_sweep:" in "".join(cell["source"])
    outputs = cell["outputs"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{notebook}: no stored figure"
    assert any("text/markdown" in o.get("data", {}) for o in outputs), f"{notebook}: no reading"


def test_notebook_20_reads_each_claim_by_the_reading_rule(tmp_path, monkeypatch, capsys):
    """The committed studies' runs, read by tables.readings: one line per method beside a
    FedAvg run of its setting (FedMut at IID has none here: no line)."""
    root = tmp_path / "results" / "a-study"
    study_run(root, "dir=0.1_FedAvg_seed0", "fedavg", "FedAvg", "dir=0.1")
    study_run(root, "iid_FedMut_seed0", "fedmut", "FedMut", "iid")
    study_run(root, "dir=0.1_FedMR_seed0", "fedmr", "FedMR", "dir=0.1")
    monkeypatch.setattr(evidence, "STUDIES", {"a-study": evidence.STUDIES["cifar10-lenet"]})
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    exec(notebook_20_code(*NOTEBOOK_20_TABLES, "tables.readings("), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == ("CIFAR-10, CNN, dir=0.1: FedMR > FedAvg cannot tell (late difference "
                         "per seed: +0.00)")
    assert not any("FedMut >" in line for line in lines)


@pytest.mark.parametrize("name, study", [("10_reproduce_cifar", "cifar10-lenet"),
                                         ("11_reproduce_shakespeare", "shakespeare-plays"),
                                         ("12_reproduce_fml", "fml-cifar10")])
def test_the_reproduction_notebooks_are_stored_ending_on_their_studys_verdicts(name, study):
    """Each ends on evidence.answer: stored with the verdict lines it printed (the cells that
    run the methods make output_dir a folder, so the answer cell must not read it)."""
    cells = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]
    (answer,) = [c for c in cells if c["cell_type"] == "code"
                 and "evidence.answer(" in "".join(c["source"])
                 and study in "".join(c["source"])]
    printed = "".join("".join(o.get("text", "")) for o in answer["outputs"])
    assert " > FedAvg " in printed and ("holds" in printed or "cannot tell" in printed
                                        or "does not hold" in printed), printed
