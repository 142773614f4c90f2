"""Sweeps: running cells, resume, failures, device slots, papermill injection."""

import errno
import fcntl
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_blocked_sweep, write_grid, write_notebook

from flnotes.cli.main import main
from flnotes.engine.run_folder import DiskFullError
from flnotes.repro import sweep
from flnotes.repro.grid import load_grid

REPO = Path(__file__).resolve().parent.parent

# The cell writes a fake run folder (the format flnotes.engine.sim.run writes) and counts
# executions.
BODY = """import json
from pathlib import Path
out = Path(output_dir)
with open(out / "executions.txt", "a") as f:
    f.write("x\\n")
if fail:
    raise RuntimeError(f"boom at x={x}")
for seed in seeds:
    run = out / "runs" / f"fedavg-seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    config = {"algorithm": "fedavg", "dataset": "cifar10", "model": "cnn", "partition": "iid",
              "seed": seed, "lr": lr, **extra}
    (run / "run.json").write_text(json.dumps({"config": config, "status": "completed"}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": x / 100}) + "\\n")
"""


@pytest.fixture
def notebook(tmp_path) -> Path:
    """The tiny notebook with a body that writes a run folder and counts its executions."""
    return write_notebook(tmp_path, BODY)


def test_device_slots_round_robin():
    assert sweep.device_slots(3) == [None, None, None]
    assert sweep.device_slots(5, gpu_count=2) == ["0", "1", "0", "1", "0"]
    assert sweep.device_slots(3, visible="4,6") == ["4", "6", "4"]


def test_run_records_failures_and_resumes(tmp_path, notebook, capfd):
    spec = {"notebook": notebook.name, "paper_table": "fedmut_table1",
            "labels": {"model": "CNN", "heterogeneity": "iid"},
            "grid": {"x": [40, 50], "fail": {"ok": {"fail": False}, "broken": {"fail": True}}},
            "seeds": [0]}
    grid = load_grid(write_grid(tmp_path, spec))
    # Three cells: x = 40 and 50 that work, x = 40 that raises.
    grid.cells = [c for c in grid.cells if not (c.parameters["x"] == 50 and c.parameters["fail"])]
    out = tmp_path / "out"
    summary = sweep.run_sweep(grid, out, progress=False)
    status = dict(zip(summary["cell"], summary["status"], strict=True))
    assert sorted(status.values()) == ["completed", "completed", "failed"]
    failed = next(c for c in grid.cells if c.parameters["fail"])
    record = json.loads((out / "cells" / failed.id / "cell.json").read_text())
    assert record["status"] == "failed" and "boom at x=40" in record["error"]
    assert (out / "cells" / failed.id / "notebook.ipynb").exists()  # kept for debugging
    ok = summary[summary["status"] == "completed"].set_index("x")
    assert ok.loc["40", "acc_last10"] == 40.0 and ok.loc["50", "acc_last10"] == 50.0
    assert (out / "summary.csv").exists()
    # One kernel per cell, none warning about plain TCP (an ipykernel >= 7.3 warning that
    # would otherwise print once per cell of a sweep).
    assert "without encryption" not in capfd.readouterr().err

    # Re-run: completed cells are skipped, the failed one runs again (and fails again).
    again = sweep.run_sweep(grid, out, progress=False)
    assert sorted(again["status"]) == ["failed", "skipped (done)", "skipped (done)"]
    runs = {c.id: (out / "cells" / c.id / "executions.txt").read_text().count("x")
            for c in grid.cells}
    assert runs == {c.id: 2 if c.parameters["fail"] else 1 for c in grid.cells}
    # The cell records the device its runs trained on (the fake run.json names none here)
    # and, for the failed cell run a second time, its earlier attempt and error.
    twice = json.loads((out / "cells" / failed.id / "cell.json").read_text())
    assert twice["attempt"] == 2 and twice["device_slot"] == "none (cpu/auto)"
    assert [a["status"] for a in twice["earlier_attempts"]] == ["failed"]
    assert "boom at x=40" in twice["earlier_attempts"][0]["error"]
    # A finished sweep leaves no lock file behind: each cell's cell.lock is removed as the
    # sweep lets go of it (the folders are committed as they are).
    assert not list(out.rglob("*.lock"))


def test_reproduction_notebook_takes_injected_parameters(tmp_path):
    """Papermill injects smoke-size values into notebook 10; the run folder records them."""
    out = tmp_path / "cell"
    params = {"algorithms": "fedavg", "rounds": 1, "num_clients": 4, "clients_per_round": 2,
              "lr": 0.07, "data_options": {"num_train": 400, "num_test": 100},
              "config": {"eval_every": 1, "weighting": "uniform"}, "seeds": [0]}
    record = sweep.run_cell(str(REPO / "notebooks" / "10_reproduce_cifar.ipynb"),
                            {"id": "c", "parameters": params, "labels": {}, "seed": 0},
                            str(out), {})
    assert record["status"] == "completed", record.get("error")
    config = json.loads((out / "runs" / "fedavg" / "seed0" / "config.json").read_text())
    assert (config["lr"], config["num_clients"], config["rounds"]) == (0.07, 4, 1)
    assert config["weighting"] == "uniform"
    assert len((out / "runs" / "fedavg" / "seed0" / "metrics.jsonl").read_text().splitlines()) == 1


def _disk_full_for(monkeypatch, name: str) -> None:
    """Writing a sweep file called ``name`` finds the disk full halfway."""
    real = sweep.write_atomically

    def full(path, write):
        if Path(path).name != name:
            return real(path, write)

        def half(f):
            f.write(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, half)

    monkeypatch.setattr(sweep, "write_atomically", full)


def test_a_full_disk_on_the_summary_is_one_line_and_the_sweep_goes_on(tmp_path, notebook,
                                                                    monkeypatch, capsys):
    grid_file = write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [40]},
                                      "fixed": {"fail": False}, "seeds": [0]})
    out = tmp_path / "out"
    _disk_full_for(monkeypatch, "summary.csv")
    assert main(["sweep", str(grid_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: disk full: cannot write {out / 'summary.csv'} (no space left on "
                   f"the device); free some space, then {sweep.SWEEP_RESUMES}"), err
    assert not (out / "summary.csv").exists() and not list(out.rglob("*.tmp"))
    monkeypatch.undo()
    assert main(["sweep", str(grid_file), "--out", str(out)]) == 0
    assert "skipped (done)" in (out / "summary.csv").read_text()


def test_a_full_disk_on_a_cell_record_names_it(tmp_path, notebook, monkeypatch):
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [40]},
                                           "fixed": {"fail": False}, "seeds": [0]}))
    _disk_full_for(monkeypatch, "cell.json")
    with pytest.raises(DiskFullError, match=r"^disk full: cannot write .*cell\.json "):
        sweep.run_sweep(grid, tmp_path / "out", progress=False)
    assert not list((tmp_path / "out").rglob("*.tmp"))


def _hold(cell_dir: Path):
    """Hold a cell's lock as another live sweep running it does (its cell.json: running)."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    (cell_dir / "cell.json").write_text(json.dumps({"id": cell_dir.name, "status": "running"}))
    handle = open(cell_dir / "cell.lock", "a+")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write("pid 12345 on elsewhere since now\n")
    handle.flush()
    return handle


def test_a_cell_another_sweep_runs_is_left_to_it_not_failed(tmp_path, capsys):
    """Two sweeps of one grid on one --out: the second leaves the first's cell alone (its
    cell.json untouched), reports it running elsewhere and exits 0; a cell the other sweep
    completed meanwhile is reported done, never failed."""
    body = ("import json\nfrom pathlib import Path\n"
            "if x == 1:  # the other sweep finishes its cell while this one runs\n"
            "    done = Path(output_dir).parent / OTHER / 'cell.json'\n"
            "    if FINISH:\n"
            "        done.write_text(json.dumps({'id': OTHER, 'status': 'completed',\n"
            "                                    'parameters': {}, 'labels': {}}))\n")
    write_notebook(tmp_path)  # for the grid's check; rewritten below, knowing the ids
    grid_file = write_grid(tmp_path, {"notebook": "tiny.ipynb", "grid": {"x": [1, 2]},
                                      "seeds": [0]})
    other = next(c for c in load_grid(grid_file).cells if c.parameters["x"] == 2)
    for finish in (False, True):
        out = tmp_path / f"out-{finish}"
        write_notebook(tmp_path, f"OTHER = {other.id!r}\nFINISH = {finish}\n" + body)
        held = _hold(out / "cells" / other.id)
        try:
            code = main(["sweep", str(grid_file), "--out", str(out)])
        finally:
            held.close()
        text = capsys.readouterr().out
        assert code == 0, text
        if not finish:
            assert "1 cell(s) left to another sweep" in text, text
            assert "running elsewhere" in (out / "summary.csv").read_text()
            assert json.loads((out / "cells" / other.id / "cell.json").read_text()) == {
                "id": other.id, "status": "running"}  # the other sweep's record, untouched
            assert not (out / "cells" / other.id / "notebook.ipynb").exists()
        else:
            assert "left to another sweep" not in text
            assert "skipped (done)" in (out / "summary.csv").read_text()
            assert "failed" not in (out / "summary.csv").read_text()


def test_a_cell_completed_by_another_sweep_since_is_not_run_again(tmp_path, notebook):
    cell = {"id": "c", "parameters": {"x": 1}, "labels": {}, "seed": 0}
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "cell.json").write_text(json.dumps({**cell, "status": "completed"}))
    record = sweep.run_cell(str(notebook), cell, str(folder), {})
    assert record["status"] == "completed" and record["skipped"]
    assert not (folder / "executions.txt").exists()


# Cell x = 1 ends at once; x = 2 waits while the file extra["block"] exists.
BLOCKED = """from pathlib import Path
import time
while x > 1 and Path(extra["block"]).exists():
    time.sleep(0.05)
"""


def test_a_sweep_logs_a_line_per_cell_as_it_ends_into_a_pipe(tmp_path):
    """stdout a pipe (`sweep ... > log`): cell 1's line arrives while cell 2 still runs."""
    grid, block, out = write_blocked_sweep(tmp_path, BLOCKED)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "flnotes", "sweep", str(grid), "--out",
                             str(out), "--only", "1_seed", "--only", "2_seed"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines, deadline = [], time.monotonic() + 240
        while not any(line.startswith("[1/2] 1_seed") for line in lines):
            assert time.monotonic() < deadline, f"no line for cell 1: {lines}"
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                assert line, f"stdout closed early: {lines} {proc.stderr.read()}"
                lines.append(line)
        assert proc.poll() is None  # cell 2 still waits: the line came as cell 1 ended
        assert lines[0].startswith("sweep ") and "2 of 2 cells to run" in lines[0], lines
        assert "1_seed" in lines[-1] and ": completed (" in lines[-1], lines
        block.unlink()
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert rest.splitlines()[0].startswith("[2/2] 2_seed") and ": completed (" in rest, rest


def test_a_cell_says_the_device_its_runs_trained_on_not_the_one_it_was_offered(
        tmp_path, monkeypatch):
    """A worker offered GPU 0 (CUDA_VISIBLE_DEVICES) whose runs trained on the CPU: cell.json's
    device is the runs' ("cpu", from each run.json's environment), its device_slot the offer."""
    body = BODY.replace('"status": "completed"}', '"status": "completed", '
                        '"environment": {"device": "cpu"}}')
    notebook = write_notebook(tmp_path, body)
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [40]},
                                           "fixed": {"fail": False}, "seeds": [0]}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    sweep.run_sweep(grid, tmp_path / "out", progress=False)
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("cell.json")]
    assert record["status"] == "completed" and record["attempt"] == 1
    assert (record["device"], record["device_slot"]) == ("cpu", "CUDA_VISIBLE_DEVICES=0")
