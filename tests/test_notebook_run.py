"""The reproduction notebooks' one configuration: named parameters, a preset and ``config``
(flnotes.repro.notebook_run), the grid keys that feed them by RunConfig's names, and the
cells run before ids hashed their settings flattened."""

import json
from pathlib import Path

import pytest
from test_method_settings import ShrinkAvg, shrinkavg  # noqa: F401 (the fixture)

from flnotes.config import RunConfig
from flnotes.config.presets import preset_values
from flnotes.engine.run_folder import lock_file, unlock_file
from flnotes.repro import grid as grids
from flnotes.repro.notebook_run import SettingsError, run_methods, settings
from flnotes.repro.sweep import adopt_renamed

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_10 = REPO / "notebooks" / "10_reproduce_cifar.ipynb"
# a parameters cell as notebook 10 writes it (CPU smoke values)
WRITTEN = {"dataset": "synthetic", "data_options": {"num_train": 300, "num_test": 100},
           "model": "mlp", "num_clients": 4, "clients_per_round": 2, "rounds": 6, "lr": 0.1,
           "momentum": 0.5, "algorithms": ["fedavg"], "seeds": [0], "threads": 1,
           "output_dir": None, "preset": None, "config": {}}


def test_without_a_preset_the_parameters_then_config_make_the_config():
    named = {**WRITTEN, "rounds": 3}  # papermill changed rounds
    setup = settings(None, named, WRITTEN, {"mu": 0.3, "eval_every": 2})
    config = setup.config
    assert (config.rounds, config.lr, config.momentum, config.mu, config.eval_every) == (
        3, 0.1, 0.5, 0.3, 2)
    assert setup.origin["rounds"] == "set as parameters" and setup.origin["mu"] == "config"
    assert setup.origin["lr"].startswith("this notebook's defaults")
    assert "seeds" not in setup.values and "algorithms" not in setup.values  # not fields
    lines = str(setup).splitlines()
    assert lines[0] == "set as parameters: rounds=3"
    assert lines[1] == "config: mu=0.3, eval_every=2"
    assert lines[-1].startswith("everything else: RunConfig's defaults")


def test_a_preset_gives_what_was_not_set_and_config_wins_over_both():
    paper = preset_values("fml-paper")
    named = {**WRITTEN, "lr": 0.03, "preset": "fml-paper"}  # lr set by papermill
    setup = settings("fml-paper", named, WRITTEN, {"rounds": 7})
    config = setup.config
    assert config.lr == 0.03 and setup.origin["lr"] == "set as parameters"
    assert config.rounds == 7 and setup.origin["rounds"] == "config"
    assert config.dataset == paper["dataset"] and setup.origin["dataset"] == "preset"
    assert config.personal_weight == paper["personal_weight"]  # a field no parameter names
    # a parameter the preset does not set takes RunConfig's default, not the smoke value
    assert "data_options" not in paper and config.data_options == {}
    assert str(setup).splitlines()[0].startswith("from preset fml-paper: ")
    assert config.algorithm == RunConfig().algorithm  # the preset's method is not taken


def test_bad_settings_are_one_line_errors():
    with pytest.raises(SettingsError, match="did you mean 'fml-paper'"):
        settings("fml-papr", WRITTEN, WRITTEN)
    with pytest.raises(SettingsError, match="is for cifar10; this notebook trains shakespeare"):
        settings("fedmut-paper", WRITTEN, WRITTEN, dataset="shakespeare")
    with pytest.raises(SettingsError, match="'beta_0' is not a RunConfig field.*'beta0'"):
        settings(None, WRITTEN, WRITTEN, {"beta_0": 0.1})
    with pytest.raises(SettingsError, match="lr"):
        settings(None, {**WRITTEN, "lr": -1.0}, WRITTEN)
    assert SettingsError("x")._render_traceback_() == ["SettingsError: x"]


def test_fill_computes_only_what_nothing_set():
    setup = settings(None, {**WRITTEN, "num_clients": None}, {**WRITTEN, "num_clients": None})
    assert "num_clients" not in setup.origin
    filled = setup.fill("num_clients", 3)
    assert filled.config.num_clients == 3 and "computed by the notebook: num_clients=3" in str(
        filled)
    assert settings(None, WRITTEN, WRITTEN, {"num_clients": 5}).fill(
        "num_clients", 3).config.num_clients == 5


def test_run_methods_names_each_module_and_reads_finished_runs_back(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = settings(None, {**WRITTEN, "rounds": 2}, WRITTEN).config
    runs = run_methods(base, ["fedavg", "fedprox"], [0, 1], None, "nb")
    out = capsys.readouterr().out
    assert "fedavg   (flnotes.algorithms.fedavg) seed 0: completed" in out
    assert "(flnotes.algorithms.fedprox) seed 1" in out
    assert set(runs.folders) == {"fedavg", "fedprox"}
    assert all(f.parent == Path("runs/notebooks/nb") for f in runs.folders.values())
    summary = runs.summary()
    assert sorted(summary["method"]) == ["FedAvg", "FedProx"] and set(summary["runs"]) == {2}
    again = run_methods(base, "fedavg", [0], None, "nb")  # the same settings: read back
    assert again.folders["fedavg"] == runs.folders["fedavg"]
    assert again.histories["fedavg", 0].final_accuracy == runs.histories[
        "fedavg", 0].final_accuracy
    cell = run_methods(base, "fedavg", [0], tmp_path / "cell", "nb")  # a sweep's cell
    assert cell.folders["fedavg"] == tmp_path / "cell" / "runs" / "fedavg"


@pytest.mark.usefixtures("shrinkavg")
def test_a_new_methods_setting_is_a_grid_axis_by_its_name(tmp_path, capsys,
                                                          monkeypatch):
    """A method added here, with no notebook change: its setting is a grid axis by name, goes
    into notebook 10's `config`, is checked before anything runs, and reaches the run."""
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(f"notebook: {NOTEBOOK_10}\nfixed: {{algorithms: shrinkavg, rounds: 2,"
                         " num_clients: 4, clients_per_round: 2}\n"
                         "grid: {shrink_step: [0.25, 1.0]}\nseeds: [0]\n")
    grid = grids.load_grid(grid_file)
    assert [c.parameters["config"] for c in grid.cells] == [{"shrink_step": 0.25},
                                                            {"shrink_step": 1.0}]
    assert [c.labels["shrink_step"] for c in grid.cells] == ["0.25", "1.0"]
    grid_file.write_text(grid_file.read_text().replace("1.0]", "2.0]"))
    with pytest.raises(grids.GridError, match=r"set by grid axis 'shrink_step': "
                                              r"RunConfig.shrink_step=2.0"):
        grids.load_grid(grid_file)
    grid_file.write_text(grid_file.read_text().replace("shrink_step: [", "shrink_stepp: ["))
    with pytest.raises(grids.GridError, match="'shrink_stepp' .* neither a parameter of "
                                              "10_reproduce_cifar.ipynb nor a RunConfig field"):
        grids.load_grid(grid_file)
    # what the notebook does with such a cell, in this process (where the method exists)
    monkeypatch.chdir(tmp_path)
    cell = grid.cells[0].parameters
    named = {**WRITTEN, **{k: v for k, v in cell.items() if k in WRITTEN}}
    base = settings(None, named, WRITTEN, cell["config"]).config
    runs = run_methods(base, cell["algorithms"], [0], tmp_path / "cell", "10_reproduce_cifar")
    stored = json.loads((runs.folders["shrinkavg"] / "seed0" / "config.json").read_text())
    assert stored["shrink_step"] == 0.25
    assert f"shrinkavg ({ShrinkAvg.__module__}) seed 0: completed" in capsys.readouterr().out


def test_a_cell_id_hashes_its_settings_however_a_notebook_names_them():
    """``extra:``/``config:`` mappings and top-level keys are the same settings; a method's
    setting that none of the cell's methods reads does not change the id."""
    named = grids.hashed_settings({"lr": 0.1, "algorithms": "fedmut", "alpha": 2.0,
                                   "data_dir": "/a", "output_dir": "/b"})
    nested = grids.hashed_settings({"lr": 0.1, "algorithms": "fedmut",
                                    "extra": {"alpha": 2.0, "mu": 0.5}, "data_dir": "/c"})
    assert named == nested == {"lr": 0.1, "algorithms": "fedmut", "alpha": 2.0}
    assert grids.hashed_settings({"algorithms": "fml", "personal_models": []}) == {
        "algorithms": "fml", "fig5_personal_models": []}  # notebook 12's list, renamed
    assert grids.hashed_settings({"algorithms": "fedavg", "personal_models": []}) == {
        "algorithms": "fedavg"}


def test_a_cell_run_under_the_old_ids_is_adopted_not_run_again(tmp_path):
    spec = (f"notebook: {NOTEBOOK_10}\nfixed: {{rounds: 2, eval_every: 5}}\n"
            "grid: {method: {A: {algorithms: fedavg}, B: {algorithms: fedmut, alpha: 2.0}}}\n"
            "seeds: [0]\n")
    (tmp_path / "grid.yaml").write_text(spec)
    cells = grids.load_grid(tmp_path / "grid.yaml").cells
    out = tmp_path / "out"
    old = {"A_seed0-00000000": {"rounds": 2, "algorithms": "fedavg",
                                "extra": {"eval_every": 5}, "seeds": [0]},
           "B_seed0-11111111": {"rounds": 2, "algorithms": "fedmut", "alpha": 3.0,
                                "extra": {"eval_every": 5}, "seeds": [0]}}
    for name, parameters in old.items():
        (out / "cells" / name).mkdir(parents=True)
        (out / "cells" / name / "cell.json").write_text(json.dumps(
            {"id": name, "parameters": {**parameters, "output_dir": "x"},
             "status": "completed"}))
    a, b = cells
    assert len(adopt_renamed(out, cells, dry_run=True)) == 1  # says so, renames nothing
    assert (out / "cells" / "A_seed0-00000000").is_dir()
    lines = adopt_renamed(out, cells)
    assert lines == [f"cell A_seed0-00000000 is now {a.id} (the same settings; ids hash "
                     "settings flattened since)"]
    record = json.loads((out / "cells" / a.id / "cell.json").read_text())
    assert record["id"] == a.id and record["renamed_from"] == "A_seed0-00000000"
    # other settings (alpha 3.0, not 2.0) stay where they are: that cell runs
    assert (out / "cells" / "B_seed0-11111111").is_dir() and not (out / "cells" / b.id).exists()
    assert adopt_renamed(out, cells) == []  # once
    # a folder a running sweep holds is not moved under it
    (out / "cells" / a.id).rename(out / "cells" / "A_seed0-22222222")
    held = lock_file(out / "cells" / "A_seed0-22222222" / "cell.lock")
    assert adopt_renamed(out, cells) == [] and (out / "cells" / "A_seed0-22222222").is_dir()
    unlock_file(held)
    assert len(adopt_renamed(out, cells)) == 1 and not list(out.rglob("cell.lock"))
