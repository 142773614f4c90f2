"""A parallel sweep stopped by Ctrl-C, SIGTERM or SIGKILL: it stops at once, keeps
the cells that finished, writes its summary (Ctrl-C), leaves no worker or kernel behind, and
the same command again completes the grid without running a finished cell twice."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from helpers import write_blocked_sweep, write_grid, write_notebook

REPO = Path(__file__).resolve().parent.parent

# Cell x = 1 finishes at once; the others wait while the file extra["block"] exists. Every
# execution appends "kernel-pid worker-pid" to pids.txt in its cell folder.
BODY = """import json, os, time
from pathlib import Path
out = Path(output_dir)
with open(out / "pids.txt", "a") as f:
    f.write(f"{os.getpid()} {os.getppid()}\\n")
while x > 1 and Path(extra["block"]).exists():
    time.sleep(0.05)
run = out / "runs" / "fedavg-seed0"
run.mkdir(parents=True, exist_ok=True)
config = {"algorithm": "fedavg", "dataset": "cifar10", "model": "cnn", "partition": "iid",
          "seed": 0, "lr": lr}
(run / "run.json").write_text(json.dumps({"config": config, "status": "completed"}))
(run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": x / 100}) + "\\n")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by an init that is slow) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _wait_for(check, what: str, limit: float = 60.0) -> None:
    """Poll until check() holds; a hang guard, not a timing assertion."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _pids(out: Path) -> set[int]:
    return {int(p) for f in out.glob("cells/*/pids.txt") for line in f.read_text().splitlines()
            for p in line.split()}


def _cells(out: Path, x: int) -> list[Path]:
    """The folder of cell x (ids are <x>_seed0-<digest>)."""
    return sorted(d for d in (out / "cells").glob(f"{x}_seed*") if d.is_dir())


def _running_pids(out: Path) -> bool:
    """Both slow cells of this run have started (their kernels wrote their pids)."""
    return sum((d / "pids.txt").exists() for x in (2, 3) for d in _cells(out, x)) == 2


def _sweep(grid: Path, out: Path) -> subprocess.Popen:
    """The sweep, with its temporary files (the workers' kernelspec folders) in a folder of
    its own next to ``out``: every one must be gone once its process ends."""
    (out.parent / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(out.parent / "tmp")}
    return subprocess.Popen([sys.executable, "-m", "flnotes", "sweep", str(grid), "--workers",
                             "2", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_parallel_sweep_stops_on_ctrl_c_and_sigkill_and_resumes(tmp_path):
    grid, block, out = write_blocked_sweep(tmp_path, BODY)
    procs = []
    try:
        # 1. Ctrl-C while x=2 and x=3 run (x=1 done).
        sweep = _sweep(grid, out)
        procs.append(sweep)
        _wait_for(lambda: _running_pids(out), "the slow cells to start")
        sweep.send_signal(signal.SIGINT)
        stdout, stderr = sweep.communicate(timeout=60)
        assert sweep.returncode == 130, stderr
        assert "Traceback" not in stderr and "sweep interrupted" in stderr
        summary = pd.read_csv(out / "summary.csv")
        status = dict(zip(summary["x"], summary["status"], strict=True))
        assert status == {1: "completed", 2: "interrupted", 3: "interrupted"}
        _wait_for(lambda: not any(_alive(p) for p in _pids(out)), "workers and kernels to end",
                  limit=20)
        # a worker stopped by SIGTERM kills its own group, itself included: before that it
        # removes its kernelspec folder, which its exit handlers would have
        assert not list((out.parent / "tmp").glob("flnotes-jupyter-*"))

        # 2. SIGKILL of the sweep itself: its workers and their kernels die with it.
        for x in (2, 3):
            for d in _cells(out, x):
                (d / "pids.txt").unlink()
        before = _pids(out)
        sweep = _sweep(grid, out)
        procs.append(sweep)
        _wait_for(lambda: _running_pids(out), "the slow cells to start again")
        started = _pids(out) - before
        assert started  # worker and kernel pids of the running cells
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.communicate(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in started), "orphaned workers to end",
                  limit=30)
        assert not list((out.parent / "tmp").glob("flnotes-jupyter-*"))  # (they stop alike)

        # 3. The same command again completes the grid; x=1 is not run a third time.
        block.unlink()
        sweep = _sweep(grid, out)
        procs.append(sweep)
        stdout, stderr = sweep.communicate(timeout=120)
        assert sweep.returncode == 0, stderr
        summary = pd.read_csv(out / "summary.csv")
        status = dict(zip(summary["x"], summary["status"], strict=True))
        assert status == {1: "skipped (done)", 2: "completed", 3: "completed"}
        assert [len((d / "pids.txt").read_text().splitlines()) for d in _cells(out, 1)] == [1]
        assert not any(_alive(p) for p in _pids(out))
    finally:
        for proc in procs:  # never leave a sweep behind, even when an assertion failed
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_summary_marks_a_diverged_cell(tmp_path):
    """A cell whose notebook ran to its end but whose run blew up is 'diverged', not
    'completed' with the accuracy from before the blow-up."""
    import json

    from flnotes.repro import sweep

    records = []
    for cell, status in (("a", "completed"), ("b", "diverged")):
        run = tmp_path / "cells" / cell / "runs" / "fedavg-seed0"
        run.mkdir(parents=True)
        config = {"algorithm": "fedavg", "dataset": "cifar10", "model": "cnn",
                  "partition": "iid", "seed": 0}
        (run / "run.json").write_text(json.dumps({"config": config, "status": status}))
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.12}) + "\n")
        records.append({"id": cell, "status": "completed", "seed": 0})
    summary = sweep.summarise(records, tmp_path)
    assert list(summary["status"]) == ["completed", "diverged"]


def test_interrupted_sweep_writes_its_summary(tmp_path, monkeypatch):
    """Ctrl-C in the second cell of a sequential sweep: the first is kept, the second is
    'interrupted', the third 'not started', and summary.csv says so."""
    import pytest

    from flnotes.repro import sweep
    from flnotes.repro.grid import load_grid

    notebook = write_notebook(tmp_path)
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name,
                                           "grid": {"x": [1, 2, 3]}}))
    calls = []

    def fake_run_cell(notebook, cell, cell_dir, meta):
        calls.append(cell["id"])
        record = {**meta, **cell, "status": "running"}
        Path(cell_dir).mkdir(parents=True)
        sweep._write_json(Path(cell_dir) / "cell.json", record)
        if len(calls) == 2:
            raise KeyboardInterrupt
        record["status"] = "completed"
        sweep._write_json(Path(cell_dir) / "cell.json", record)
        return record

    monkeypatch.setattr(sweep, "run_cell", fake_run_cell)
    with pytest.raises(sweep.SweepInterrupted) as stopped:
        sweep.run_sweep(grid, tmp_path / "out", progress=False)
    assert list(stopped.value.summary["status"]) == ["completed", "interrupted", "not started"]
    written = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(written["status"]) == ["completed", "interrupted", "not started"]
