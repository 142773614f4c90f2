"""Sweeps on Ray: the same summary as the local executor (a real smoke grid, then the tiny
notebook with a failing cell and a re-run), Ctrl-C while cells run, and one line when Ray is
missing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import write_blocked_sweep, write_grid, write_notebook
from test_sweep import BODY
from test_sweep_signals import BODY as BLOCKING_BODY
from test_sweep_signals import _alive, _cells, _pids, _running_pids, _wait_for

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


def _ray_sweep(grid: Path, out: Path, *extra: str) -> subprocess.Popen:
    """The command line's sweep on Ray, in a session of its own (so that a signal to its
    process group is a terminal's Ctrl-C, reaching the Ray instance it starts too)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # RAY_AUTH_MODE as the fixture's cluster
    return subprocess.Popen([sys.executable, "-m", "flnotes", "sweep", str(grid), "--workers",
                             "2", "--executor", "ray", *extra, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _statuses(out: Path) -> tuple[dict, dict]:
    """x -> status in summary.csv, and x -> status in the cell's own cell.json."""
    summary = pd.read_csv(out / "summary.csv")
    cells = {x: json.loads((d / "cell.json").read_text())["status"]
             for x in (1, 2, 3) for d in _cells(out, x)}
    return dict(zip(summary["x"], summary["status"], strict=True)), cells


def test_ctrl_c_stops_the_cells_keeps_what_finished_and_a_rerun_completes(tmp_path):
    """Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it) while two cells
    run on the sweep's own local Ray instance: it exits 130 at once with one line saying
    what was kept, the finished cell is kept, the stopped ones say interrupted (in their
    cell.json too) and hold no result, no worker or kernel is left. SIGTERM on a joined
    cluster does the same (143). The same command again runs only the rest."""
    # x = 1 ends at once, 2 and 3 wait
    grid, block, out = write_blocked_sweep(tmp_path, BLOCKING_BODY)
    procs = []
    try:
        sweep_ = _ray_sweep(grid, out)
        procs.append(sweep_)
        _wait_for(lambda: _running_pids(out) or sweep_.poll() is not None,
                  "the slow cells to start on Ray", limit=120)
        assert sweep_.poll() is None, sweep_.communicate()[1][-2000:]
        tic = time.monotonic()
        os.killpg(sweep_.pid, signal.SIGINT)
        stdout, stderr = sweep_.communicate(timeout=60)
        seconds = time.monotonic() - tic
        assert sweep_.returncode == 130, stderr[-2000:]
        assert seconds < 20, f"the sweep took {seconds:.1f} s to stop"
        assert "Traceback" not in stderr
        assert "sweep interrupted: 1 of 3 cells done and kept; run the same command again " \
            "to run the rest" in stderr
        summary, cells = _statuses(out)
        assert summary == {1: "completed", 2: "interrupted", 3: "interrupted"}
        assert cells == summary  # no stopped cell still says running
        kept = pd.read_csv(out / "summary.csv").set_index("x")["acc_last10"]
        assert kept[1] == 1.0 and kept[[2, 3]].isna().all()
        assert not any((d / "runs").exists() for x in (2, 3) for d in _cells(out, x))
        _wait_for(lambda: not any(_alive(p) for p in _pids(out)), "workers and kernels to end",
                  limit=10)

        # SIGTERM to the sweep alone, now joining a running cluster (the module's instance,
        # which outlives the sweep): the same stop, exit 143.
        for x in (2, 3):
            for d in _cells(out, x):
                (d / "pids.txt").unlink()
        address = ray.get_runtime_context().gcs_address
        sweep_ = _ray_sweep(grid, out, "--address", address)
        procs.append(sweep_)
        _wait_for(lambda: _running_pids(out) or sweep_.poll() is not None,
                  "the slow cells to start on the cluster", limit=60)
        sweep_.send_signal(signal.SIGTERM)
        stdout, stderr = sweep_.communicate(timeout=60)
        assert sweep_.returncode == 143, stderr[-2000:]
        assert "sweep interrupted: 1 of 3 cells done and kept" in stderr
        summary, cells = _statuses(out)
        assert summary == {1: "skipped (done)", 2: "interrupted", 3: "interrupted"}
        assert cells == {1: "completed", 2: "interrupted", 3: "interrupted"}
        _wait_for(lambda: not any(_alive(p) for p in _pids(out)), "the cluster's workers and "
                  "kernels to end", limit=10)

        block.unlink()
        sweep_ = _ray_sweep(grid, out, "--address", address)
        procs.append(sweep_)
        stdout, stderr = sweep_.communicate(timeout=120)
        assert sweep_.returncode == 0, stderr[-2000:]
        summary, cells = _statuses(out)
        assert summary == {1: "skipped (done)", 2: "completed", 3: "completed"}
        assert set(cells.values()) == {"completed"}
        assert [len((d / "pids.txt").read_text().splitlines()) for d in _cells(out, 1)] == [1]
        assert not any(_alive(p) for p in _pids(out))
    finally:
        for proc in procs:  # never leave a sweep (or the Ray instance it started) behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
