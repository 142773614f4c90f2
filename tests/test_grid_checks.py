"""`python -m flnotes sweep GRID --dry-run` refuses, in one line and before any kernel starts,
a grid whose YAML repeats a key, whose axis or seeds repeat a value, or whose cells RunConfig
refuses (``--set`` applied first)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_grid, write_notebook

from flnotes.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent
CIFAR = REPO / "notebooks" / "10_reproduce_cifar.ipynb"


@pytest.fixture
def notebook(tmp_path) -> Path:
    """The tiny notebook (x, lr, fail, extra, seeds, output_dir); grids only read it."""
    return write_notebook(tmp_path)


def dry_run(path, capsys, *flags):
    """`python -m flnotes sweep PATH --dry-run FLAGS`, in this process: (code, out, err)."""
    code = cli_main(["sweep", str(path), "--dry-run", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def refused(path, capsys, *flags) -> str:
    """The one-line error of a grid that must not run; nothing listed, no traceback."""
    code, out, err = dry_run(path, capsys, *flags)
    assert code == 2, (out, err)
    assert "cells, notebook" not in out  # no cell was listed, none ran
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_valid_grid_still_lists_its_cells(tmp_path, notebook, capsys):
    path = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1, 2]},
                                 "seeds": [0, 1]})
    code, out, err = dry_run(path, capsys, "--set", "lr=0.5")
    assert code == 0, err
    assert "4 cells, notebook" in out


@pytest.mark.parametrize("text,message", [
    ("notebook: tiny.ipynb\nseeds: [0]\ngrid: {x: [1, 2]}\nseeds: [1]\n",
     "key 'seeds' given twice in one mapping (lines 2 and 4)"),
    ("notebook: tiny.ipynb\nfixed:\n  lr: 0.1\n  x: 3\n  lr: 0.2\n",
     "key 'lr' given twice in one mapping (lines 3 and 5)"),
    ("notebook: tiny.ipynb\ngrid:\n  h:\n    a: {lr: 0.1}\n    a: {lr: 0.2}\n",
     "key 'a' given twice in one mapping (lines 4 and 5)"),
])
def test_a_yaml_key_given_twice_is_refused(tmp_path, notebook, capsys, text, message):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    assert message in refused(path, capsys)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path, notebook, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text("notebook: tiny.ipynb\nbase: &base {lr: 0.1, x: 1}\n".replace(
        "base: &base", "fixed: &base") + "grid:\n  h:\n    a: {<<: *base, lr: 0.3}\n")
    code, out, err = dry_run(path, capsys)
    assert code == 0, err
    assert '"lr": 0.3' in out


@pytest.mark.parametrize("change,message", [
    ({"grid": {"x": [1, 2, 1]}}, "grid axis 'x' lists 1 2 times"),
    ({"grid": {"x": [[1, 2], [1, 2]]}}, "grid axis 'x' lists [1, 2] 2 times"),
    ({"seeds": [0, 1, 0, 0]}, "'seeds' lists 0 3 times"),
    ({"grid": {"h": {"a": {"lr": 0.1}, "b": {"lr": 0.1}}}},
     "grid axis 'h': labels 'a' and 'b' set the same parameters"),
    ({"smoke": {"seeds": [3, 3]}}, "'seeds' lists 3 2 times"),
])
def test_a_value_or_seed_listed_twice_is_refused(tmp_path, notebook, capsys, change, message):
    spec = {"notebook": notebook.name, "grid": {"x": [1, 2]}, "seeds": [0]}
    spec.update(change)
    flags = ["--smoke"] if "smoke" in change else []
    assert message in refused(write_grid(tmp_path, spec), capsys, *flags)


def test_set_that_makes_cells_the_same_is_refused(tmp_path, notebook, capsys):
    path = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1, 2]}})
    assert "run the same parameters" in refused(path, capsys, "--set", "x=5")


def test_set_values_are_checked_by_runconfig(tmp_path, notebook, capsys):
    path = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1, 2]}})
    line = refused(path, capsys, "--set", "lr=abc")
    assert "set by --set: RunConfig.lr='abc' is invalid" in line
    assert "and 1 more" in line  # both cells, one line


@pytest.mark.parametrize("spec,flags,message", [
    ({"fixed": {"algorithms": "fedavg", "rounds": -3}}, [],
     "set in fixed: RunConfig.rounds=-3 is invalid"),
    ({"fixed": {"algorithms": "fedavg"}}, ["--set", "rounds=-3"],
     "set by --set: RunConfig.rounds=-3 is invalid"),
    ({"fixed": {"algorithms": "fedavg"}, "grid": {"lr": [0.1, -1]}}, [],
     "set by grid axis 'lr': RunConfig.lr=-1 is invalid"),
    ({"fixed": {"algorithms": "fedavg"},
      "grid": {"h": {"ok": {"partition": "iid"}, "bad": {"partition": "stripes"}}}}, [],
     "set by grid axis 'h', label 'bad': RunConfig.partition='stripes' is invalid"),
    ({"fixed": {"algorithms": "fedavg", "extra": {"eval_every": 0}}}, [],
     "set in fixed: RunConfig.eval_every=0 is invalid"),
    ({"fixed": {"algorithms": "fedavg", "num_clients": 4, "clients_per_round": 9}}, [],
     "RunConfig.clients_per_round=9 is invalid"),
])
def test_cells_of_a_reproduction_notebook_are_checked_by_runconfig(tmp_path, capsys, spec,
                                                                  flags, message):
    path = write_grid(tmp_path, {"notebook": str(CIFAR), **spec})
    line = refused(path, capsys, *flags)
    assert message in line and "cell " in line


def test_the_module_command_prints_one_line_and_no_traceback(tmp_path):
    """The real `python -m flnotes sweep GRID --dry-run --set rounds=-3`."""
    path = write_grid(tmp_path, {"notebook": str(CIFAR), "fixed": {"algorithms": "fedavg"},
                                 "grid": {"lr": [0.1, 0.2]}})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "flnotes", "sweep", str(path), "--dry-run",
                           "--set", "rounds=-3"], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "set by --set: RunConfig.rounds=-3 is invalid" in line and "and 1 more" in line


def test_a_grid_runs_the_baselines_as_the_seed_code_ran_them_by_one_option():
    """--set baselines=seed-code gives every cell the seed code's reading of the
    baselines over its own preset; methods with one reading keep their cells (same ids)."""
    from flnotes.config.presets import seed_code_baselines
    from flnotes.repro.grid import GridError, load_grid

    grid = Path(__file__).resolve().parent.parent / "sweeps" / "fedmut_table1.yaml"
    paper = {c.id: c for c in load_grid(grid).cells}
    seed = {c.id: c for c in load_grid(grid, overrides={"baselines": "seed-code"}).cells}
    fedgen = [c for c in seed.values() if c.parameters.get("algorithms") == "fedgen"]
    assert fedgen and all(c.parameters["config"]["fedgen_teacher_weighting"] == "mean-product"
                          for c in fedgen)
    assert all(c.id not in paper for c in fedgen)  # another reading: other cells
    assert {k: v for k, v in seed_code_baselines().items() if k.startswith("fedgen")} == {
        k: v for k, v in fedgen[0].parameters["config"].items() if k.startswith("fedgen")}
    fedavg = [i for i, c in seed.items() if c.parameters.get("algorithms") == "fedavg"]
    assert fedavg and all(i in paper for i in fedavg)  # FedAvg has one reading: same cells
    with pytest.raises(GridError, match="baselines"):
        load_grid(grid, overrides={"baselines": "nope"})
