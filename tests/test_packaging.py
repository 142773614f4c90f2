"""what ships in the package and finds it from any folder: grids by name, the
notebook series copied out, a sweep's runs logged to one TensorBoard store as they go."""

import json
import os
import re
from pathlib import Path

import pytest
from helpers import write_grid, write_notebook

from flnotes.cli.main import main
from flnotes.repro import NOTEBOOK_DIR, PAPER_TABLE_DIR, SWEEP_DIR
from flnotes.repro.grid import GridError, load_grid, resolve_grid, shipped_grids

REPO = Path(__file__).resolve().parent.parent


def test_the_package_holds_the_notebooks_grids_and_paper_tables():
    # Inside flnotes/ (so a wheel carries them), and the clone's top-level names lead there.
    for folder, pattern in ((NOTEBOOK_DIR, "*.ipynb"), (SWEEP_DIR, "*.yaml"),
                            (PAPER_TABLE_DIR, "*.csv")):
        assert folder.parent.name == "flnotes" and any(folder.glob(pattern)), folder
    root = NOTEBOOK_DIR.parents[1]
    if (root / "pyproject.toml").is_file():
        for link, target in (("notebooks", NOTEBOOK_DIR), ("sweeps", SWEEP_DIR),
                             ("data/paper_tables", PAPER_TABLE_DIR)):
            assert (root / link).resolve() == target.resolve()


def test_a_shipped_grid_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: the names must not depend on the cwd
    expected = SWEEP_DIR / "fml_table1.yaml"
    for name in ("fml_table1", "fml_table1.yaml", "sweeps/fml_table1.yaml"):
        assert resolve_grid(name) == expected
    grid = load_grid("fml_table1", smoke=True)
    assert grid.path == expected and grid.notebook.parent == NOTEBOOK_DIR
    assert set(shipped_grids()) == {p.stem for p in SWEEP_DIR.glob("*.yaml")}


def test_a_file_beats_a_shipped_name_and_an_unknown_name_says_what_exists(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    notebook = write_notebook(tmp_path)
    write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1]}}, name="fml_table1")
    assert resolve_grid("fml_table1") == Path("fml_table1")  # the user's file, as given
    with pytest.raises(GridError, match="did you mean 'fedmut_table1'"):
        resolve_grid("fedmut_tabel1")
    for path in ("other/fml_table1.yaml", "/elsewhere/sweeps/fml_table1.yaml"):
        with pytest.raises(GridError, match=f"grid file {path} not found"):
            resolve_grid(path)  # a path elsewhere is not a shipped name
    (tmp_path / "fedmut_table1.yaml").write_text((SWEEP_DIR / "fml_table1.yaml").read_text())
    assert resolve_grid("fedmut_table1") == Path("fedmut_table1.yaml")  # yours first


def test_sweep_list_names_every_shipped_grid(capsys):
    assert main(["sweep", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line and not line.startswith("done")]
    assert listed == sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))


def test_notebooks_are_copied_out_and_a_students_edit_is_kept(tmp_path, capsys):
    dest = tmp_path / "course"
    assert main(["notebooks", str(dest)]) == 0
    shipped = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    assert sorted(p.name for p in dest.glob("*.ipynb")) == shipped
    assert (dest / "README.md").is_file()
    edited = dest / shipped[0]
    edited.write_text("my notes")
    assert main(["notebooks", str(dest)]) == 0
    assert edited.read_text() == "my notes" and "kept" in capsys.readouterr().out
    assert main(["notebooks", str(dest), "--force"]) == 0
    assert json.loads(edited.read_text())["cells"]
    (tmp_path / "file").write_text("")
    assert main(["notebooks", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


TRAIN = """
from flnotes.config import RunConfig
from flnotes.engine.sim import run
for seed in seeds:
    run(RunConfig(algorithm="fedavg", num_clients=4, clients_per_round=2, rounds=2, seed=seed,
                  lr=lr, data_options={"num_train": 400, "num_test": 100}, device="cpu",
                  run_dir=f"{output_dir}/runs/fedavg/seed{seed}"), progress=False)
"""


def test_a_sweeps_logger_gets_each_cells_rounds_in_one_store(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flnotes.repro.sweep import run_sweep

    notebook = write_notebook(tmp_path, TRAIN)
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name,
                                           "grid": {"lr": [0.05, 0.1]}, "seeds": [0]}))
    out, logs = tmp_path / "out", tmp_path / "logs"  # --logger-dir: a store outside OUT
    run_sweep(grid, out, progress=False, loggers=["tensorboard"], logger_dir=logs)
    for cell in grid.cells:
        run_dir = out / "cells" / cell.id / "runs" / "fedavg" / "seed0"
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        # one store for the sweep, each run named by its path below OUT (not all "seed0")
        events = EventAccumulator(str(logs / "tensorboard" / run_dir.relative_to(out)))
        events.Reload()
        logged = [(e.step, e.value) for e in events.Scalars("accuracy")]
        assert logged == [(r["round"], pytest.approx(r["accuracy"])) for r in rows]
        assert not (run_dir / "tensorboard").exists()


@pytest.mark.parametrize("logger", ["tensorboard", "mlflow"])
def test_a_logger_asked_for_after_the_sweep_gets_the_finished_cells_once(tmp_path, capsys,
                                                                          logger):
    """Cells finished by an earlier sweep are not run again; a later ``--logger`` copies
    their runs' rounds into the store (each once: a third sweep adds nothing)."""
    pytest.importorskip(logger)
    from flnotes.repro.sweep import run_sweep

    notebook = write_notebook(tmp_path, TRAIN)
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name,
                                           "grid": {"lr": [0.05, 0.1]}, "seeds": [0]}))
    out, logs = tmp_path / "out", tmp_path / "logs"
    run_sweep(grid, out, progress=False)
    capsys.readouterr()
    for attempt in range(2):
        summary = run_sweep(grid, out, progress=True, loggers=[logger], logger_dir=logs)
        assert set(summary["status"]) == {"skipped (done)"}  # not run again
        err = capsys.readouterr().err
        assert ("2 finished run(s) of earlier cells logged" in err) == (attempt == 0)
        for cell in grid.cells:
            run_dir = out / "cells" / cell.id / "runs" / "fedavg" / "seed0"
            rows = [json.loads(line)
                    for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            logged = _logged_accuracy(logger, logs, out, run_dir)
            assert logged == [(r["round"], pytest.approx(r["accuracy"])) for r in rows]


def _logged_accuracy(logger: str, logs, out, run_dir) -> list[tuple[int, float]]:
    """(round, accuracy) as the store holds them for one run folder (every copy of it)."""
    if logger == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(logs / "tensorboard" / run_dir.relative_to(out)))
        events.Reload()
        return [(e.step, e.value) for e in events.Scalars("accuracy")]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(logs / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("flnotes")
    runs = [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("flnotes.run_dir") == str(run_dir.resolve())]
    return sorted((m.step, m.value) for r in runs
                  for m in client.get_metric_history(r.info.run_id, "accuracy"))


def test_a_bad_loggers_variable_is_one_line_and_leaves_the_folder_usable(tmp_path,
                                                                        monkeypatch):
    from flnotes.config import RunConfig
    from flnotes.engine.sim import run
    from flnotes.engine.tracking import TrackingError

    config = RunConfig(algorithm="fedavg", num_clients=4, clients_per_round=2, rounds=1,
                       data_options={"num_train": 200, "num_test": 50}, device="cpu",
                       run_dir=str(tmp_path / "run"))
    monkeypatch.setenv("FLNOTES_LOGGERS", "wandb")
    with pytest.raises(TrackingError, match="unknown logger 'wandb'"):
        run(config, progress=False)
    monkeypatch.delenv("FLNOTES_LOGGERS")
    assert run(config, progress=False).status == "completed"  # the folder is still usable


def test_stacked_seeds_log_each_seed_from_the_environment(tmp_path, monkeypatch):
    """run_seeds' stacked path (no per-round callback) logs each seed's rounds as it ends,
    named by its path below FLNOTES_LOGGER_BASE, as a sweep's cells do."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flnotes.config import RunConfig
    from flnotes.engine.seeds import run_seeds

    config = RunConfig(algorithm="fedavg", num_clients=4, clients_per_round=2, rounds=2,
                       data_options={"num_train": 400, "num_test": 100}, device="cpu",
                       backend="vmap", run_dir=str(tmp_path / "cell" / "fedavg"))
    monkeypatch.setenv("FLNOTES_LOGGERS", "tensorboard")
    monkeypatch.setenv("FLNOTES_LOGGER_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("FLNOTES_LOGGER_BASE", str(tmp_path))
    histories = run_seeds(config, [0, 1], progress=False)
    for seed, history in zip((0, 1), histories, strict=True):
        events = EventAccumulator(str(tmp_path / "logs" / "tensorboard" / "cell" / "fedavg"
                                      / f"seed{seed}"))
        events.Reload()
        logged = [(e.step, e.value) for e in events.Scalars("accuracy")]
        assert logged == [(r["round"], pytest.approx(r["accuracy"])) for r in history.rows]


def test_the_widget_state_extension_is_built_from_its_source_and_enabled():
    """jupyter-config/labextension/ was built from the current widget-state-extension/
    source (`make lab-extension` records its digest), declares no JupyterLab package it
    would have to share (it uses the application's document registry only), and this
    environment's JupyterLab finds it, enabled (the wheel installs it; `make install` copies
    it in a clone). tests/test_browser.py checks what it does: a reopened saved copy is not
    marked unsaved, an edit still is."""
    import importlib.util
    import sys

    from jupyterlab.labapp import LabApp
    from jupyterlab_server.config import get_page_config

    root = Path(__file__).parents[1] / "jupyter-config"
    spec = importlib.util.spec_from_file_location("build_lab_extension",
                                                  root / "build_lab_extension.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    recorded = (root / "labextension" / "source.sha256").read_text().strip()
    assert recorded == builder.source_digest(), (
        "jupyter-config/labextension/ is older than its source: run `make lab-extension`")
    package = json.loads((root / "labextension" / "package.json").read_text())
    assert package["name"] == "flnotes-widget-state" and package["dependencies"] == {}
    assert (root / "labextension" / package["jupyterlab"]["_build"]["load"]).is_file()
    placed = Path(sys.prefix, "share/jupyter/labextensions/flnotes-widget-state")
    assert json.loads((placed / "package.json").read_text()) == package, (
        "this JupyterLab has another build of flnotes-widget-state: run `make install`")
    app = LabApp()
    config = get_page_config(app.labextensions_path, logger=app.log)
    disabled = config.get("disabledExtensions", config.get("disabled_labextensions", {}))
    if isinstance(disabled, dict):  # older page configs: {name: true}
        disabled = [name for name, off in disabled.items() if off]
    assert "flnotes-widget-state" not in disabled, (
        "flnotes-widget-state is disabled in this JupyterLab: jupyter labextension enable "
        "flnotes-widget-state")


def test_the_widget_state_default_names_a_real_jupyterlab_setting():
    """jupyter-config/'s override sets a boolean that jupyterlab_widgets' own schema
    declares (a renamed plugin or setting would silently do nothing), and this environment's
    JupyterLab reads it (the wheel installs it; `make install` copies it in a clone)."""
    import sys

    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import _get_overrides

    ours = json.loads((Path(__file__).parents[1] / "jupyter-config"
                       / "flnotes-widget-state.json").read_text())
    (plugin, values), = ours.items()
    package, name = plugin.split(":")
    schema = Path(sys.prefix, "share/jupyter/labextensions", package, "schemas", package,
                  f"{name}.json")
    declared = json.loads(schema.read_text())["properties"]
    assert values == {"saveState": True} and declared["saveState"]["type"] == "boolean"
    settings = Path(get_app_dir()) / "settings"
    placed = settings / "overrides.d" / "flnotes-widget-state.json"
    assert placed.is_file() and json.loads(placed.read_text()) == ours, (
        f"flnotes' widget-state default is not in this JupyterLab's {placed.parent}: run "
        "`make install`")
    read, error = _get_overrides(str(settings))
    assert not error and read.get(plugin, {}).get("saveState") is True


def test_the_readmes_methods_table_is_the_registrys(capsys):
    """README.md's table of methods is generated (`python -m flnotes methods`): a method
    added to the registry, or a docstring changed, shows there once the table is pasted
    again; this fails until then. Every registered method has its row and module."""
    from flnotes.algorithms import algorithm_names
    from flnotes.repro.paper_tables import methods_markdown

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index("<!-- methods: generated")
    table = readme[readme.index("\n", start) + 1:readme.index("\n<!-- end of methods -->")]
    assert table == methods_markdown()
    rows = table.splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == algorithm_names()
    assert main(["methods"]) == 0
    assert capsys.readouterr().out.startswith(methods_markdown() + "\n")


def test_the_readmes_cpu_only_install_pins_what_the_package_allows():
    """The README's CPU-only command installs torch and torchvision at the newest versions
    pyproject allows, both: a torch the package's bounds refuse (the CPU index's newest), or
    a torchvision left to PyPI (it pins its torch), makes pip fetch CUDA torch again."""
    readme = (REPO / "README.md").read_text()
    (command,) = [line for line in readme.splitlines()
                  if "--index-url https://download.pytorch.org/whl/cpu" in line]
    pinned = dict(re.findall(r"\b(torch|torchvision)==([\w.]+)", command))
    # (read as text: tomllib is Python 3.11+, flnotes runs on 3.10)
    project = (REPO / "pyproject.toml").read_text()
    highest = dict(re.findall(r'"(torch|torchvision)>=[\w.]+,<=([\w.]+)"', project))
    assert pinned == highest and set(pinned) == {"torch", "torchvision"}


def test_the_teaching_notebooks_are_listed_once_and_all_exist():
    """One list (flnotes.repro.notebooks.TEACHING) for what is stored with its figures, what
    the browser test drives and what the demo runs; every name in it is a notebook."""
    from flnotes.notebooks import refresh_outputs
    from flnotes.repro.notebooks import TEACHING, TOY_COURSE, teaching_notebooks

    assert all((NOTEBOOK_DIR / f"{name}.ipynb").is_file() for name in TEACHING)
    assert refresh_outputs.SHIPPED_WITH_FIGURES == TEACHING and "21_flatness" in TEACHING
    assert [p.stem for p in teaching_notebooks()] == list(TOY_COURSE) == sorted(
        p.stem for p in NOTEBOOK_DIR.glob("0[0-9]_*.ipynb"))
