"""Sweeps on Ray: the same summary as the local executor (a real smoke grid, then the tiny
notebook with a failing cell and a re-run), and one line when Ray is missing."""

import sys
from pathlib import Path

import pytest
from helpers import write_grid, write_notebook
from test_sweep import BODY

from flnotes.repro import sweep
from flnotes.repro.grid import load_grid

REPO = Path(__file__).resolve().parent.parent


def test_without_ray_the_executor_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code = sweep.main([str(REPO / "sweeps" / "fedup_table4.yaml"), "--smoke", "--executor",
                       "ray", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: --executor ray needs Ray: pip install 'flnotes[ray]'"]
    assert not (tmp_path / "out").exists()  # nothing ran
    code = sweep.main([str(REPO / "sweeps" / "fedup_table4.yaml"), "--smoke", "--address",
                       "auto", "--out", str(tmp_path / "out")])
    assert code == 2 and "--executor ray" in capsys.readouterr().err


ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'flnotes[ray]'")

@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module (a sweep joins it instead of starting its own)."""
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


COLUMNS = ["cell", "dataset", "model", "heterogeneity", "algorithms", "seed", "status",
           "acc_last10"]


def test_smoke_grid_gives_the_local_summary(tmp_path):
    grid = load_grid(REPO / "sweeps" / "fedup_table4.yaml", smoke=True)
    grid.cells = [c for c in grid.cells if c.parameters["algorithms"] in ("fedavg", "moon")]
    local = sweep.run_sweep(grid, tmp_path / "local", progress=False)
    on_ray = sweep.run_sweep(grid, tmp_path / "ray", workers=2, progress=False,
                             executor="ray")
    assert list(on_ray["status"]) == ["completed", "completed"]
    assert on_ray[COLUMNS].equals(local[COLUMNS])
    assert (tmp_path / "ray" / "summary.csv").read_text().splitlines()[0] == \
        (tmp_path / "local" / "summary.csv").read_text().splitlines()[0]


def test_a_failing_cell_is_recorded_while_the_others_go_on_and_reruns_skip(tmp_path):
    notebook = write_notebook(tmp_path, BODY)
    spec = {"notebook": notebook.name, "paper_table": "fedmut_table1",
            "labels": {"model": "CNN", "heterogeneity": "iid"},
            "grid": {"x": [40, 50], "fail": {"ok": {"fail": False}, "broken": {"fail": True}}},
            "seeds": [0]}
    grid = load_grid(write_grid(tmp_path, spec))
    out = tmp_path / "out"
    summary = sweep.run_sweep(grid, out, workers=2, progress=False, executor="ray")
    status = dict(zip(summary["x"].astype(str) + summary["fail"].astype(str),
                      summary["status"], strict=True))
    assert status == {"40ok": "completed", "50ok": "completed", "40broken": "failed",
                      "50broken": "failed"}
    failed = summary[summary["status"] == "failed"]
    assert all("boom at x=" in e for e in failed["error"])
    again = sweep.run_sweep(grid, out, workers=2, progress=False, executor="ray")
    assert sorted(again["status"]) == ["failed", "failed", "skipped (done)", "skipped (done)"]
