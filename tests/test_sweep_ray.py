"""Sweeps on Ray: the same summary as the local executor (a real smoke grid, then the tiny
notebook with a failing cell and a re-run), Ctrl-C while cells run, one line when Ray is
missing; each cell on its own (fake) GPU or a shared one, retries of cells whose worker
dies, and one line for bad task sizes and a dead head. One local Ray instance with four
fake GPUs serves the module (its cells never touch a GPU)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from helpers import write_blocked_sweep, write_grid, write_notebook
from test_sweep import BODY
from test_sweep_signals import BODY as BLOCKING_BODY
from test_sweep_signals import _alive, _cells, _pids, _running_pids, _wait_for

from flnotes.cli.main import main as cli_main
from flnotes.repro import sweep
from flnotes.repro.grid import load_grid

REPO = Path(__file__).resolve().parent.parent


def test_without_ray_the_executor_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code = cli_main(["sweep", str(REPO / "sweeps" / "fedup_table4.yaml"), "--smoke", "--executor",
                       "ray", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: --executor ray needs Ray: pip install 'flnotes[ray]'"]
    assert not (tmp_path / "out").exists()  # nothing ran
    code = cli_main(["sweep", str(REPO / "sweeps" / "fedup_table4.yaml"), "--smoke", "--address",
                       "auto", "--out", str(tmp_path / "out")])
    assert code == 2 and "--executor ray" in capsys.readouterr().err


ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'flnotes[ray]'")

@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module (a sweep joins it instead of starting its own),
    with four fake GPUs: Ray gives them to tasks and sets CUDA_VISIBLE_DEVICES as for real
    ones."""
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


COLUMNS = ["cell", "dataset", "model", "heterogeneity", "algorithms", "seed", "status",
           "acc_last10"]


def test_a_ray_task_leaves_no_kernel_folder_behind():
    """Ray ends its workers without their exit handlers, which would remove the folder: each
    task removes its own (a sweep left one flnotes-jupyter-* folder per worker in /tmp)."""
    from flnotes.repro.ray_executor import _run_in_task

    def kernel_folder_of_this_task(*job) -> str:  # a cell's stand-in (local: sent by value)
        from flnotes.repro.kernel import current_kernel

        current_kernel()
        return os.environ["JUPYTER_PATH"].split(os.pathsep)[0]

    task = ray.remote(_run_in_task).options(num_cpus=1, num_gpus=0)
    folder = ray.get(task.remote(kernel_folder_of_this_task, 0, 1, ()))
    assert Path(folder).name.startswith("flnotes-jupyter-") and not Path(folder).exists()


def test_smoke_grid_gives_the_local_summary(tmp_path):
    grid = load_grid(REPO / "sweeps" / "fedup_table4.yaml", smoke=True)
    grid.cells = [c for c in grid.cells if c.parameters["algorithms"] in ("fedavg", "moon")]
    local = sweep.run_sweep(grid, tmp_path / "local", progress=False)
    on_ray = sweep.run_sweep(grid, tmp_path / "ray", workers=2, progress=False,
                             executor="ray", gpus_per_cell=0)  # the fake GPUs are no device
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
        # the cluster ends a finished sweep's workers a moment after it exits
        _wait_for(lambda: not any(_alive(p) for p in _pids(out)), "the workers of the "
                  "finished sweep to end", limit=10)
    finally:
        for proc in procs:  # never leave a sweep (or the Ray instance it started) behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# ---- GPUs, CPUs and retries of each cell's task, and the head's address ----------------

def _records(out: Path) -> dict:
    """x -> the cell.json of each cell of a sweep's output folder."""
    records = [json.loads(path.read_text()) for path in (out / "cells").glob("*/cell.json")]
    return {int(r["parameters"]["x"]): r for r in records}


DEVICE_BODY = """import os, time
from pathlib import Path
seen = Path(extra["seen"])
(seen / f"{x}.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset") + " "
                               + os.environ.get("OMP_NUM_THREADS", "unset"))
deadline = time.time() + 120  # every cell waits for the others: all four run at once
while len(list(seen.glob("*.txt"))) < 4 and time.time() < deadline:
    time.sleep(0.1)
"""


def _devices(tmp_path: Path, gpus: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES that each of four cells running at once saw in its notebook
    kernel, with --gpus-per-cell ``gpus`` (and half a CPU each, so all four fit)."""
    folder = tmp_path / gpus
    seen = folder / "seen"
    seen.mkdir(parents=True)
    notebook = write_notebook(folder, DEVICE_BODY)
    grid = write_grid(folder, {"notebook": notebook.name, "fixed": {"extra": {"seen": str(seen)}},
                               "grid": {"x": [1, 2, 3, 4]}, "seeds": [0]})
    code = cli_main(["sweep", str(grid), "--executor", "ray", "--gpus-per-cell", gpus,
                       "--cpus-per-cell", "0.5", "--out", str(folder / "out")])
    assert code == 0
    values = [(seen / f"{x}.txt").read_text().split() for x in (1, 2, 3, 4)]
    assert all(threads == "1" for _, threads in values)  # half a CPU: one thread
    records = _records(folder / "out")
    for x, (device, _) in zip((1, 2, 3, 4), values, strict=True):
        assert records[x]["device_slot"] == f"CUDA_VISIBLE_DEVICES={device}"
    return [device for device, _ in values]


def test_each_cell_sees_its_own_gpu_or_shares_one_by_fractions(tmp_path):
    """Four cells at once with one GPU each see four different devices in their notebook
    kernels; with half a GPU each, two cells share a device (Ray packs them), never more."""
    whole = _devices(tmp_path, "1")
    assert sorted(whole) == ["0", "1", "2", "3"]
    halves = Counter(_devices(tmp_path, "0.5"))
    assert all(device in "0123" and len(device) == 1 for device in halves)
    assert max(halves.values()) == 2


KILLED_BODY = """import os, signal
from pathlib import Path
out = Path(output_dir)
with open(out / "executions.txt", "a") as f:
    f.write("x\\n")
runs = len((out / "executions.txt").read_text().splitlines())
checkpoint = out / "checkpoint.txt"
if runs <= extra.get("kills", 0):  # the node goes away mid-cell, once or more
    checkpoint.write_text(f"round {3 * runs}")
    os.kill(os.getppid(), signal.SIGKILL)  # the cell's Ray worker (this kernel's parent)
    os._exit(1)
if fail:
    raise RuntimeError(f"boom at x={x}")
(out / "resumed.txt").write_text(checkpoint.read_text() if checkpoint.exists() else "fresh")
"""


def test_a_cell_whose_worker_dies_is_retried_and_resumes_a_notebook_error_is_not(tmp_path):
    """--retries 1: a cell whose Ray worker is killed once runs again in its folder (and
    finds what the first attempt left); one killed twice is recorded failed, saying its task
    died; a notebook that raises runs once."""
    notebook = write_notebook(tmp_path, KILLED_BODY)
    grid = load_grid(write_grid(tmp_path, {
        "notebook": notebook.name, "seeds": [0],
        "grid": {"case": {"once": {"x": 1, "extra": {"kills": 1}},
                          "twice": {"x": 2, "extra": {"kills": 2}},
                          "broken": {"x": 3, "fail": True}}}}))
    out = tmp_path / "out"
    summary = sweep.run_sweep(grid, out, progress=False, executor="ray", gpus_per_cell=0,
                              cpus_per_cell=0.5, retries=1)
    status = dict(zip(summary["case"], summary["status"], strict=True))
    assert status == {"once": "completed", "twice": "failed", "broken": "failed"}
    records = _records(out)
    folder = {case: out / "cells" / records[x]["id"] for case, x in
              (("once", 1), ("twice", 2), ("broken", 3))}
    executions = {case: len((f / "executions.txt").read_text().splitlines())
                  for case, f in folder.items()}
    assert executions == {"once": 2, "twice": 2, "broken": 1}
    assert (folder["once"] / "resumed.txt").read_text() == "round 3"
    # the retried cell says it took two tries, and what the first one left
    once = json.loads((folder["once"] / "cell.json").read_text())
    assert once["attempt"] == 2 and [a["status"] for a in once["earlier_attempts"]] == ["running"]
    error = dict(zip(summary["case"], summary["error"], strict=True))
    assert error["twice"].startswith("Ray task died before recording the cell")
    assert "boom at x=3" in error["broken"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_head_fails_in_one_line_at_once(tmp_path):
    """--address where no Ray head listens: one line and exit 2 within seconds, before any
    cell runs (not minutes of Ray's connection warnings)."""
    notebook = write_notebook(tmp_path, "pass")
    grid = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1]}, "seeds": [0]})
    port = _free_port()
    tic = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "flnotes", "sweep", str(grid), "--executor",
                           "ray", "--address", f"127.0.0.1:{port}", "--out",
                           str(tmp_path / "out")], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - tic
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: cannot reach the Ray head at 127.0.0.1:{port}: Connection refused (is "
        "`ray start --head` running there, and the port open?)"]
    assert seconds < 20, f"{seconds:.1f} s"
    assert not list((tmp_path / "out").glob("cells/*"))


@pytest.mark.parametrize("flags, message", [
    (["--gpus-per-cell", "abc"], "--gpus-per-cell must be a number 0 or more, got 'abc'"),
    (["--gpus-per-cell", "-1"], "--gpus-per-cell must be a number 0 or more, got '-1'"),
    (["--gpus-per-cell", "1.5"], "--gpus-per-cell takes a fraction only below 1"),
    (["--cpus-per-cell", "two"], "--cpus-per-cell must be a number 0 or more, got 'two'"),
    (["--cpus-per-cell", "-0.5"], "--cpus-per-cell must be a number 0 or more"),
    (["--retries", "-1"], "--retries must be a whole number 0 or more, got '-1'"),
    (["--retries", "1.5"], "--retries must be a whole number 0 or more, got '1.5'"),
    (["--gpus-per-cell", "8"], "no node of the Ray cluster has 8 GPUs (the most on one node "
                               "is 4); lower --gpus-per-cell"),
    (["--cpus-per-cell", "3"], "no node of the Ray cluster has 3 CPUs"),
])
def test_bad_task_sizes_are_one_line(tmp_path, capsys, flags, message):
    notebook = write_notebook(tmp_path, "pass")
    grid = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1]}, "seeds": [0]})
    code = cli_main(["sweep", str(grid), "--executor", "ray", *flags, "--out",
                     str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    # one line (a cluster too small is seen once Ray is joined: after the progress bar)
    assert code == 2 and err[-1].startswith("error: " + message), err
    assert all(line.startswith("grid:") for line in err[:-1]), err  # the bar, redrawn
    assert not list((tmp_path / "out").glob("cells/*"))  # nothing ran
    code = cli_main(["sweep", str(grid), *flags, "--out", str(tmp_path / "local")])  # no Ray asked
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"error: {flags[0]} sizes the cells' Ray tasks: add --executor ray"]


def test_gpus_on_a_cluster_without_any_is_one_line():
    """A cluster with no GPUs: asking for some is an error; by default cells take none."""
    from flnotes.repro.ray_executor import NO_GPUS, _task_resources

    class NoGpus:  # the two calls the check makes, of a CPU-only cluster
        @staticmethod
        def cluster_resources():
            return {"CPU": 8.0}

        @staticmethod
        def nodes():
            return [{"Alive": True, "Resources": {"CPU": 8.0}}]

    with pytest.raises(ValueError, match=NO_GPUS):
        _task_resources(NoGpus, 0.25, 1.0)
    assert _task_resources(NoGpus, None, 1.0) == (0, 1.0)
    assert _task_resources(NoGpus, 0, 2.0) == (0, 2.0)
