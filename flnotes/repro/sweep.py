"""Papermill batches from a YAML grid: ``python -m flnotes sweep GRID.yaml``.

The grid file format, its checks and its expansion into cells are in flnotes.repro.grid; this
module runs the cells. Each cell runs in its own folder ``OUT/cells/<id>/`` (output notebook,
run folders, ``cell.json`` with status, parameters, labels and any error); a completed cell is
skipped on re-run, a failed one is recorded and the batch goes on. ``--workers N`` runs N
cells at once, each worker process pinned to one CUDA device (round-robin) or, on CPU, to its
share of the cores.

Two sweeps on one output folder: each cell is run under its ``cell.lock`` (``fcntl.flock``,
dropped by the kernel however its holder ends). A cell that another live sweep is running is
not run, nor its cell.json touched: it is reported ``running elsewhere`` (not a failure), and
a cell the other sweep finished meanwhile is skipped as done.

Stopping: Ctrl-C or SIGTERM stops the sweep at once. Cells that finished are kept, the cells
running are stopped and recorded ``interrupted`` (their run folders resume), the rest are
``not started``; ``summary.csv`` is written and the command exits 130 (143 for SIGTERM).
The same command again runs what is left. Each worker is a process of its own that dies
with the sweep, even a killed one (Linux's parent-death signal), and its notebook kernel
follows it (ipykernel exits when its parent does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from flnotes.config.yaml_text import read_yaml
from flnotes.engine.client_state import write_atomically
from flnotes.engine.run_folder import NO_SPACE, disk_full, lock_file, unlock_file
from flnotes.engine.sim import exit_code
from flnotes.engine.stops import send_nowhere
from flnotes.engine.tracking import (
    check_installed,
    log_finished_folder,
    logger_dir_problem,
    logger_environment,
    mlflow_run_dirs,
    parse_loggers,
    prepare_store,
)
from flnotes.messages import on_terminal, one_line
from flnotes.repro import REPO_ROOT
from flnotes.repro import grid as grid_file
from flnotes.repro.grid import (
    Cell,
    Grid,
    GridError,
    grid_summary,
    load_grid,
    shipped_grids,
)
from flnotes.repro.kernel import (
    current_kernel,
    import_papermill,
    kernel_environment,
    release_kernel,
)
from flnotes.repro.notebooks import quiet_kernel_manager
from flnotes.repro.ray_executor import _import_ray, cell_options, check_reachable, run_on_ray

# ---------------------------------------------------------------- execution


def device_slots(workers: int, visible: str | None = None, gpu_count: int = 0) -> list[str | None]:
    """The CUDA device (as CUDA_VISIBLE_DEVICES) each worker gets, round-robin; None = CPU."""
    devices = [d for d in (visible or "").split(",") if d.strip()] if visible else [
        str(i) for i in range(gpu_count)]
    return [devices[i % len(devices)] if devices else None for i in range(workers)]


def _gpu_count() -> int:
    try:
        return torch.cuda.device_count()
    except Exception:  # no driver: CPU only
        return 0


def _watch_parent(parent: int) -> None:
    """Stop this worker, as the sweep's SIGTERM would, once its parent is gone: a sweep killed
    outright (SIGKILL, a closed terminal) leaves no cell running that nobody waits for. A
    thread that polls getppid(), which works wherever Python does."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="watch-sweep").start()


def _worker(job: tuple, device: str | None, threads: int, parent: int) -> None:
    """A parallel sweep's worker process: one cell, then exit.

    The worker leads a process group of its own, which its notebook kernel joins. SIGTERM
    (the sweep stopping, or gone: :func:`_watch_parent`) interrupts the group (so a run inside
    the kernel marks its folder interrupted), records the cell ``interrupted`` a moment later
    and kills the group, itself last: no kernel is left running a cell nobody waits for.
    """
    _, cell, cell_dir, meta = job

    def stop(signum, frame):
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGINT)  # this worker ignores it; its kernel stops its run
        time.sleep(1.0)
        path = Path(cell_dir) / "cell.json"
        record = _read_record(path) or {**meta, **cell}
        # Only a cell this worker holds: one another sweep holds keeps that sweep's record.
        if cell_dir in _HOLDING and record.get("status") in (None, "running"):
            with contextlib.suppress(OSError, ValueError):
                _write_json(path, {**record, "status": "interrupted"})
        release_kernel()  # SIGKILL skips the exit handlers that would remove it
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sweep decides; it sends SIGTERM
    with contextlib.suppress(OSError):  # a group of its own: out of the terminal's Ctrl-C
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, stop)
    if os.getppid() != parent:  # the sweep died while this worker started
        os._exit(1)
    _watch_parent(parent)
    # The worker's device slot, which the kernel it starts inherits.
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    else:  # CPU: split the cores between workers instead of oversubscribing them
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    try:
        record = run_cell(*job)
    except ValueError as err:  # cell.json not written (a full disk): one line, no traceback;
        # the sweep records the cell (or stops on the same disk with its own line)
        print(f"sweep: cell {cell['id']}: {one_line(err)}", file=sys.stderr)
        sys.exit(1)
    if record.get("status") == RUNNING_ELSEWHERE:
        sys.exit(EXIT_ELSEWHERE)


# The cell folders whose lock this process holds (a stopped worker marks only those).
_HOLDING: set[str] = set()
# A cell another live sweep holds: not run here, not a failure.
RUNNING_ELSEWHERE = "running elsewhere"
# A worker's exit status for that cell: it wrote nothing, and the sweep must not record the
# other sweep's "running" cell.json as a worker that died.
EXIT_ELSEWHERE = 3


def run_cell(notebook: str, cell: dict, cell_dir: str, meta: dict) -> dict:
    """Execute one cell with papermill under its lock; write and return its cell.json record.

    A cell another sweep holds returns a ``running elsewhere`` record and writes nothing; one
    that another sweep completed since this one looked is returned as done (unless
    ``meta["force"]``: the sweep was asked to run completed cells again).
    """
    folder = Path(cell_dir)
    folder.mkdir(parents=True, exist_ok=True)
    force = bool(meta.get("force"))
    meta = {k: v for k, v in meta.items() if k != "force"}
    # The open cell.lock (closing it lets go), or the holder's line ("pid N on HOST since T")
    # when another process runs the cell.
    lock = lock_file(folder / "cell.lock")
    if isinstance(lock, str):
        return {**meta, **cell, "status": RUNNING_ELSEWHERE, "error": f"held by {lock}"}
    _HOLDING.add(cell_dir)
    try:
        found = None if force else _read_record(folder / "cell.json")
        if found is not None and found.get("status") == "completed":
            return {**found, "skipped": True}
        return _run_cell(notebook, cell, folder, meta)
    finally:
        _HOLDING.discard(cell_dir)
        unlock_file(lock)


def _run_cell(notebook: str, cell: dict, folder: Path, meta: dict) -> dict:
    pm = import_papermill()
    params = dict(cell["parameters"], output_dir=str(folder))
    slot = os.environ.get("CUDA_VISIBLE_DEVICES")
    # An earlier try of this cell (failed, interrupted, or a worker that died): counted, and
    # its error kept, so a cell that passed on its third try says so.
    before = _read_record(folder / "cell.json") or {}
    earlier = [*before.get("earlier_attempts", []),
               {k: before.get(k) for k in ("status", "error", "started")}] if before else []
    record = {**meta, **cell, "parameters": params, "status": "running", "error": None,
              # where the sweep put it; "device" below is what its runs trained on
              "device_slot": f"CUDA_VISIBLE_DEVICES={slot}" if slot else "none (cpu/auto)",
              "attempt": len(earlier) + 1, "earlier_attempts": earlier,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write_json(folder / "cell.json", record)
    tic = time.perf_counter()
    # The kernel (this interpreter) must import this same flnotes: a checkout's goes first; an
    # installed one is found already (its site-packages must not go before the stdlib).
    path = os.pathsep.join(p for p in (str(REPO_ROOT) if REPO_ROOT else None,
                                       os.environ.get("PYTHONPATH")) if p)
    # --logger: the kernel's runs log each round themselves (flnotes.engine.tracking).
    tracking = (logger_environment(meta["loggers"], meta["logger_dir"], meta["logger_base"])
                if meta.get("loggers") else {})
    try:
        with kernel_environment(PYTHONPATH=path, **tracking):
            pm.execute_notebook(notebook, str(folder / "notebook.ipynb"), parameters=params,
                                cwd=str(folder), progress_bar=False, log_output=False,
                                kernel_name=current_kernel(),
                                kernel_manager_class=quiet_kernel_manager())
        record["status"] = "completed"
    except KeyboardInterrupt:  # Ctrl-C, or the sweep stopping its workers
        record["status"] = "interrupted"
        record.update(seconds=round(time.perf_counter() - tic, 2), device=_devices_used(folder))
        _write_json(folder / "cell.json", record)
        raise
    except Exception as err:  # a failed cell is recorded; the batch goes on
        record["status"] = "failed"
        ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
        record["error"] = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
        record["traceback"] = traceback.format_exc(limit=3)[-4000:]
    record.update(seconds=round(time.perf_counter() - tic, 2), device=_devices_used(folder))
    _write_json(folder / "cell.json", record)
    return record


def _devices_used(folder: Path) -> str | None:
    """The devices the cell's runs trained on (each run.json's environment), e.g. "cpu" or
    "cuda:0"; None when no run folder says (a cell that failed before its first run)."""
    devices = set()
    for meta in folder.rglob("run.json"):
        record = _read_record(meta)
        device = (record or {}).get("environment", {}).get("device")
        if device:
            devices.add(str(device))
    return ", ".join(sorted(devices)) or None


# How a sweep stopped by a full disk goes on (a cell's run folders resume on their own).
SWEEP_RESUMES = ("run the same sweep command again: completed cells are kept and the others "
                 "run (their run folders resume)")


def _write_json(path: Path, obj: dict) -> None:
    _write_file(path, json.dumps(obj, indent=2, default=str).encode())


def _write_file(path: Path, data: bytes) -> None:
    """Write a sweep's file whole or not at all; a full disk is the one line that says so
    (which file, how the sweep goes on), another failure an OSError naming the file."""
    try:
        write_atomically(path, lambda f: f.write(data))
    except OSError as err:
        if err.errno in NO_SPACE:
            raise disk_full(path, SWEEP_RESUMES) from None
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None


def _read_record(path: Path) -> dict | None:
    """A cell.json, or None if there is none or it cannot be read (the cell runs again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or SIGTERM; ``summary`` holds every cell's status."""

    def __init__(self, summary, stop: KeyboardInterrupt) -> None:
        super().__init__()
        self.summary, self.stop = summary, stop


def run_sweep(grid: Grid, out_dir: str | Path | None = None, workers: int = 1,
              force: bool = False, progress: bool = True, only: list[str] | None = None,
              processes: bool | None = None, executor: str = "local",
              address: str | None = None, gpus_per_cell: float | None = None,
              cpus_per_cell: float = 1.0, retries: int = 0, loggers: list[str] | None = None,
              logger_dir: str | Path | None = None, log: bool = False):
    """Run every cell not yet completed; return the summary table (one row per cell).

    ``only``: run just the cells whose id contains one of these texts. ``processes``: run
    each cell in a worker process of its own (default: when ``workers`` > 1). The command
    line always does, even with one worker: papermill, waiting on a kernel in this
    process, does not stop on Ctrl-C, while a worker is stopped at once. ``executor="ray"``
    runs each cell as a Ray task instead (:mod:`flnotes.repro.ray_executor`; ``address``
    joins a running cluster; ``gpus_per_cell``, ``cpus_per_cell`` and ``retries`` as their
    flags), with the same folders, records and summary. ``loggers`` (``--logger``) copy
    each round of every cell's runs to TensorBoard / MLflow as it ends, into one store under
    ``logger_dir`` (default: the sweep's output folder). ``log``: print a line (flushed) as
    each cell ends, for a log without the progress bar.
    """
    if executor not in ("local", "ray"):
        raise ValueError(f"unknown executor {executor!r}; choose local or ray")
    if executor == "ray":
        _import_ray()  # no Ray: one line saying how to install it, before anything runs
        ray_options = cell_options(gpus_per_cell, cpus_per_cell, retries)  # bad: one line
        if address:
            check_reachable(address)  # a dead head: one line at once, not Ray's retries

    # Absolute before anything runs: papermill runs each cell in its own folder, where a
    # relative path would nest the run folders again (runs/sweeps/X/cells/ID/runs/sweeps/...).
    out = Path(out_dir or Path("runs") / "sweeps" / f"{grid.name}-{grid.variant}").resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"sweep output {out} is a file, not a folder; choose another --out")
    problem = logger_dir_problem(logger_dir) if loggers else None  # "": not "beside the runs"
    if problem:
        raise GridError(problem)
    out.mkdir(parents=True, exist_ok=True)
    cells = select_cells(grid, only)
    meta = {"grid": grid.name, "grid_file": str(grid.path), "variant": grid.variant,
            "notebook": str(grid.notebook), "paper_table": grid.paper_table}
    if force:  # run_cell runs a completed cell again (not written into cell.json)
        meta["force"] = True
    if loggers:
        meta["loggers"] = list(loggers)
        meta["logger_dir"] = str(Path(out if logger_dir is None else logger_dir).resolve())
        meta["logger_base"] = str(out)  # runs are named by their path below it
        prepare_store(loggers, meta["logger_dir"])  # before the workers share it
    renamed = adopt_renamed(out, grid.cells)
    if log:
        for line in renamed:
            _log_line(line)
    records, todo = {}, []
    for cell in cells:  # a cell completed before is skipped: its record read once
        found = None if force else _read_record(out / "cells" / cell.id / "cell.json")
        if found and found.get("status") == "completed":
            records[cell.id] = {**found, "skipped": True}
        else:
            todo.append(cell)
    if loggers:  # cells finished before: their runs' rounds into the store too, once
        _log_finished_cells(out, [c for c in cells if c not in todo], meta, progress)
    jobs = [(str(grid.notebook), vars(c), str(out / "cells" / c.id), meta) for c in todo]
    done = len(cells) - len(todo)
    bar = tqdm(total=len(cells), initial=done, desc=grid.name, unit="cell", disable=not progress)
    if log:
        before = f" ({done} done before)" if done else ""
        _log_line(f"sweep {grid.name}: {len(todo)} of {len(cells)} cells to run{before}; "
                  f"output {out}")
    ended = [done]

    def cell_ended(record: dict) -> None:
        records[record["id"]] = record
        bar.update()
        ended[0] += 1
        if log:
            _log_line(_cell_line(record, ended[0], len(cells)))

    try:
        if executor == "ray":
            def failed_record(job: tuple, error: str) -> dict:
                record = _finished_record(job, 1)
                if record.get("status") == "failed":
                    record["error"] = f"Ray task died before recording the cell ({error})"
                    _write_json(Path(job[2]) / "cell.json", record)
                return record

            def on_stop(job: tuple) -> None:
                # A cancelled cell that had started says interrupted in its cell.json (one
                # that finished meanwhile keeps its record); one still queued stays
                # "not started", with no folder.
                if (Path(job[2]) / "cell.json").exists():
                    record = _finished_record(job, None)
                    records[record["id"]] = record

            try:
                run_on_ray(run_cell, jobs, workers, address, cell_ended, failed_record,
                           on_stop, **ray_options)
            except ValueError:  # a cluster that cannot run the cells: its line after the bar
                bar.close()
                raise
        elif not (processes if processes is not None else workers > 1):
            for job in jobs:
                cell_ended(run_cell(*job))
        else:
            _run_parallel(jobs, workers, cell_ended, records)
    except KeyboardInterrupt as stop:
        bar.close()
        for cell in cells:  # the cell that was running (sequential) says so in its cell.json
            if cell.id not in records:
                found = _read_record(out / "cells" / cell.id / "cell.json") or {}
                started = found.get("status") in ("running", "interrupted")
                status = "interrupted" if started else "not started"
                records[cell.id] = {**meta, **vars(cell), "status": status}
        summary = summarise([records[c.id] for c in cells], out)
        _write_file(out / "summary.csv", summary.to_csv(index=False).encode())
        raise SweepInterrupted(summary, stop) from None
    bar.close()
    # A cell left to another sweep may have finished there since: as it stands now.
    records = {i: _elsewhere(r, out / "cells" / i) for i, r in records.items()}
    summary = summarise([records[c.id] for c in cells if c.id in records], out)
    _write_file(out / "summary.csv", summary.to_csv(index=False).encode())
    return summary


def _log_finished_cells(out: Path, cells: list[Cell], meta: dict, progress: bool) -> None:
    """``--logger`` over cells that finished in an earlier sweep (they are not run again):
    each of their run folders' rounds into the store, unless the store holds it already."""
    folders = [run_json.parent for cell in cells
               for run_json in sorted((out / "cells" / cell.id).rglob("run.json"))]
    # MLflow's file store reads every run on each search: read it once for all folders
    known = (mlflow_run_dirs(meta["logger_dir"]) if folders and "mlflow" in meta["loggers"]
             else None)
    logged = 0
    for folder in folders:
        try:
            done = log_finished_folder(meta["loggers"], folder, meta["logger_dir"],
                                       meta["logger_base"], mlflow_known=known)
        except ValueError as err:  # a damaged folder: said, the others still logged
            print(f"sweep: not logged: {err}", file=sys.stderr)
            continue
        logged += bool(done)
    if logged and progress:
        print(f"sweep: {logged} finished run(s) of earlier cells logged into "
              f"{meta['logger_dir']}", file=sys.stderr)


def adopt_renamed(out: Path, cells: list[Cell], dry_run: bool = False) -> list[str]:
    """Give the folder of a cell run under an earlier id scheme (before a cell's id hashed its
    settings flattened) the id it has now: a folder with the same name before the hash, and
    the same settings (flnotes.repro.grid.hashed_settings), that no cell of the grid has.
    Returns one line per folder renamed, so a sweep continued after the change skips them
    (``dry_run``: the folders that would be, none renamed)."""
    ids = {c.id for c in cells}
    lines = []
    for cell in cells:
        folder = out / "cells" / cell.id
        if folder.exists():
            continue
        wanted = grid_file.hashed_settings(cell.parameters)
        prefix = cell.id.rsplit("-", 1)[0]
        for old in sorted((out / "cells").glob(f"{prefix}-*")):
            record = _read_record(old / "cell.json")
            if (old.name in ids or record is None or old.name.rsplit("-", 1)[0] != prefix
                    or grid_file.hashed_settings(record.get("parameters") or {}) != wanted):
                continue
            if not dry_run:
                held = lock_file(old / "cell.lock")
                if isinstance(held, str):  # a sweep is running it now: not moved under it
                    continue
                unlock_file(held)
                old.rename(folder)
                record.update(id=cell.id, renamed_from=old.name)
                _write_json(folder / "cell.json", record)
            lines.append(f"cell {old.name} is now {cell.id} (the same settings; ids hash "
                         "settings flattened since)")
            break
    return lines


def select_cells(grid: Grid, only: list[str] | None) -> list[Cell]:
    """The grid's cells whose id contains one of ``only`` (all without it); a GridError if
    ``only`` matches none."""
    cells = [c for c in grid.cells if not only or any(text in c.id for text in only)]
    if only and not cells:
        example = grid.cells[0].id if grid.cells else "(the grid has no cells)"
        raise GridError(f"--only {' '.join(only)} matches no cell of {grid.path} "
                        f"({len(grid.cells)} cells, ids like {example}); `--dry-run` lists them")
    return cells


def _cell_line(record: dict, ended: int, total: int) -> str:
    """A log's line for a cell that ended: "[3/12] ID: completed (41.2 s)", and why not."""
    seconds = record.get("seconds")
    took = f" ({seconds:.1f} s)" if isinstance(seconds, (int, float)) else ""
    status = "skipped (done)" if record.get("skipped") else record.get("status")
    why = one_line(record.get("error"))[:160]
    return f"[{ended}/{total}] {record.get('id')}: {status}{took}" + (f": {why}" if why else "")


def _log_line(line: str) -> None:
    """Print and flush: a log (stdout a file or a pipe) shows each cell as it ends, not the
    whole sweep's lines at its end. A reader that left (``| head``) does not stop the
    cells: the records, not the log, are what a sweep leaves."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        send_nowhere()


def _run_parallel(jobs: list, workers: int, cell_ended, records: dict) -> None:
    """Run the jobs in at most ``workers`` processes, one process per cell; each record goes
    to ``cell_ended`` as its cell ends (into ``records`` on an interrupt).

    On KeyboardInterrupt (Ctrl-C, or SIGTERM made one by the command line) every running
    worker is stopped (SIGTERM; SIGKILL after a grace period), its cell recorded
    ``interrupted``, and the interrupt goes on up.
    """
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    slots = device_slots(workers, os.environ.get("CUDA_VISIBLE_DEVICES"), _gpu_count())
    threads = max(1, (os.cpu_count() or 1) // workers)
    free, pending = list(range(workers)), list(jobs)
    running: dict[int, tuple] = {}  # sentinel -> (process, job, slot)
    try:
        while pending or running:
            while pending and free:
                slot, job = free.pop(0), pending.pop(0)
                process = ctx.Process(target=_worker, daemon=False,
                                      args=(job, slots[slot], threads, os.getpid()))
                _start_ignoring_ctrl_c(process)
                running[process.sentinel] = (process, job, slot)
            for sentinel in wait(list(running)):
                process, job, slot = running.pop(sentinel)
                process.join()
                free.append(slot)
                cell_ended(_finished_record(job, process.exitcode))
    except KeyboardInterrupt:
        _stop_workers([process for process, _, _ in running.values()])
        for _, job, _ in running.values():
            record = _finished_record(job, None)
            records[record["id"]] = record
        raise


def _start_ignoring_ctrl_c(process) -> None:
    """Start a worker with SIGINT ignored (inherited through exec): a Ctrl-C at the terminal
    reaches the whole process group, and the sweep, not each worker, decides what stops."""
    if threading.current_thread() is not threading.main_thread():
        process.start()
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process.start()
    finally:
        signal.signal(signal.SIGINT, before)


def _finished_record(job: tuple, exitcode: int | None) -> dict:
    """The cell.json a worker left; a worker that died without one is recorded failed
    (``exitcode`` None: stopped by the sweep, recorded interrupted)."""
    _, cell, cell_dir, meta = job
    meta = {k: v for k, v in meta.items() if k != "force"}
    elsewhere = {**meta, **cell, "status": RUNNING_ELSEWHERE}
    if exitcode == EXIT_ELSEWHERE:  # another sweep's cell: its cell.json is that sweep's
        return _elsewhere(elsewhere, Path(cell_dir))
    path = Path(cell_dir) / "cell.json"
    record = _read_record(path)
    if record is not None and record.get("status") not in ("running", None):
        return record
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_file(path.parent / "cell.lock")  # the worker is gone: a holder is another sweep
    if isinstance(lock, str):
        return {**elsewhere, "error": f"held by {lock}"}
    record = {**(record or {**meta, **cell}), "status": "interrupted"}
    if exitcode is not None:
        record.update(status="failed",
                      error=f"worker died (exit code {exitcode}) before recording the cell")
    try:
        _write_json(path, record)
    finally:
        unlock_file(lock)
    return record


def _elsewhere(record: dict, cell_dir: Path) -> dict:
    """A cell left to another sweep, as that sweep has it now: completed there, it is done
    (skipped here); else still ``running elsewhere``."""
    if record.get("status") != RUNNING_ELSEWHERE:
        return record
    found = _read_record(cell_dir / "cell.json")
    if found is not None and found.get("status") == "completed":
        return {**found, "skipped": True}
    return record


def _stop_workers(processes: list, grace: float = 15.0) -> None:
    """SIGTERM every worker (each records its cell interrupted), SIGKILL those that linger."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def summarise(records: list[dict], out: Path):
    """One row per cell: labels, seed, status, seconds, mean last-10 accuracy (%), error."""
    import pandas as pd  # lazy: the workers need no pandas

    from flnotes.repro.tables import collect_runs  # lazy: pandas, as above

    runs = collect_runs(out) if (out / "cells").exists() else None
    rows = []
    for r in records:
        mine = runs[runs["run_dir"].str.startswith(str(out / "cells" / r["id"]) + os.sep)] \
            if runs is not None and len(runs) else None
        seeds = r.get("seeds") or [r.get("seed")]
        status = "skipped (done)" if r.get("skipped") else r["status"]
        statuses = set(mine["status"]) if mine is not None and len(mine) else set()
        if r["status"] == "completed" and "diverged" in statuses:
            # The notebook ran to its end, but a run of the cell blew up: its accuracy is
            # from before the blow-up.
            status = "diverged" + (" (skipped)" if r.get("skipped") else "")
        rows.append({"cell": r["id"], **r.get("labels", {}),
                     "seed": seeds[0] if len(seeds) == 1 else ",".join(map(str, seeds)),
                     "status": status, "seconds": r.get("seconds"),
                     "acc_last10": None if mine is None or not len(mine)
                     else round(float(mine["acc_last_mean"].mean()), 2),
                     "error": (r.get("error") or "")[:120]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``sweep`` subcommand."""
    parser.add_argument("grid", nargs="?",
                        help="a YAML grid file, or the name of a grid that ships with flnotes "
                        "(e.g. fedmut_table1; --list shows them)")
    parser.add_argument("--list", action="store_true", dest="list_grids",
                        help="list the grids that ship with flnotes and stop")
    parser.add_argument("--smoke", action="store_true", help="run the grid's smoke variant")
    parser.add_argument("--out", help="output folder (default: runs/sweeps/<name>-<variant>)")
    parser.add_argument("--workers", type=int, default=1,
                        help="cells run at once, each worker pinned to one GPU (round-robin); "
                        "with --executor ray and no --address: the local Ray instance gets "
                        "WORKERS x --cpus-per-cell CPUs and this machine's GPUs")
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="where cells run: local processes (default) or Ray tasks, one "
                        "per cell (pip install 'flnotes[ray]')")
    parser.add_argument("--address", default=None,
                        help="with --executor ray: a running Ray cluster to join (e.g. "
                        "HEAD_IP:6379, or auto); default: a local Ray instance")
    parser.add_argument("--gpus-per-cell", default=None, metavar="N",
                        help="with --executor ray: GPUs each cell's task asks for (Ray sets "
                        "its CUDA_VISIBLE_DEVICES; a fraction shares one, e.g. 0.25 packs "
                        "four small CNNs on a GPU; 0: the cell runs on the CPU); default: 1 "
                        "where the cluster has GPUs, else 0")
    parser.add_argument("--cpus-per-cell", default=None, metavar="N",
                        help="with --executor ray: CPUs each cell's task asks for (and its "
                        "threads; a fraction below 1 allowed); default: 1")
    parser.add_argument("--retries", default=None, metavar="N",
                        help="with --executor ray: run a cell again, up to N times, when its "
                        "worker or node dies (preempted, killed; its run folders resume from "
                        "their checkpoints); an error in the notebook is never retried; "
                        "default: 0")
    parser.add_argument("--force", action="store_true", help="re-run completed cells too")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="run only cells whose id contains TEXT (repeatable: any of them)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a parameter in every cell (YAML "
                        "value), e.g. --set data_dir=/data/cifar10 --set rounds=50")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and stop")
    parser.add_argument("--logger", action="append", metavar="{tensorboard,mlflow}",
                        help="also log each round of every cell's runs to TensorBoard or a "
                        "local MLflow store, as the rounds end (one store for the sweep: "
                        "OUT/tensorboard/, OUT/mlruns/); metrics.jsonl stays the record")
    parser.add_argument("--logger-dir", metavar="DIR",
                        help="log into DIR/tensorboard/ and DIR/mlruns/ instead of OUT")
    parser.add_argument("--stack-seeds", action="store_true", default=None,
                        help="one cell per setting running all its seeds as one batched run "
                        "(the grid's stack_seeds: true; pays on a GPU)")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Check the grid, run its cells, print the summary; exit 1 if any cell failed."""
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GridError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key.strip()] = read_yaml(value)
        except yaml.YAMLError as err:
            raise GridError(f"--set {item!r}: the value is not YAML ({one_line(err)}); quote it, "
                            f"e.g. {key.strip()}='{value}'") from None
    if args.list_grids:
        grids = shipped_grids()
        width = max(map(len, grids), default=0)
        for name, path in grids.items():
            print(f"{name:<{width}}  {grid_summary(path)}")
        return 0
    if args.grid is None:
        raise GridError("name a grid file or a shipped grid (python -m flnotes sweep --list)")
    if args.workers < 1:
        raise GridError(f"--workers must be 1 or more, got {args.workers}")
    if args.out is not None and not args.out.strip():  # else the default folder, silently
        raise GridError(f"--out {args.out!r} is not a folder's name; name one, or leave the "
                        "flag out for runs/sweeps/<grid>-<variant>")

    loggers = parse_loggers(args.logger)
    check_installed(loggers)
    if args.logger_dir is not None and not loggers:
        raise GridError("--logger-dir says where --logger writes: add --logger tensorboard "
                        "(or mlflow)")
    problem = logger_dir_problem(args.logger_dir)  # checked by --dry-run too
    if problem:
        raise GridError(problem)
    grid = load_grid(args.grid, smoke=args.smoke, overrides=overrides,
                     stack_seeds=getattr(args, "stack_seeds", None))
    cells = select_cells(grid, args.only)
    if args.dry_run:
        for cell in cells:
            print(cell.id, json.dumps(cell.parameters, default=str))
        print(f"{len(cells)} cells, notebook {grid.notebook}")
        out = Path(args.out or Path("runs") / "sweeps" / f"{grid.name}-{grid.variant}")
        for line in adopt_renamed(out, grid.cells, dry_run=True):
            print("on a run, " + line.replace(" is now ", " becomes "))
        return 0
    try:
        if args.address and args.executor != "ray":
            raise GridError("--address joins a Ray cluster: add --executor ray")
        names = ("gpus_per_cell", "cpus_per_cell", "retries")
        ray_flags = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
        if ray_flags and args.executor != "ray":
            flag = "--" + next(iter(ray_flags)).replace("_", "-")
            raise GridError(f"{flag} sizes the cells' Ray tasks: add --executor ray")
        terminal = on_terminal()  # the bar, on stderr
        # A line per cell wherever stdout is not watched live with the bar: redirected
        # (`> log`, a pipe) or without a bar.
        log = not terminal or not _stdout_is_terminal()
        summary = run_sweep(grid, args.out, workers=args.workers, force=args.force,
                            progress=terminal, log=log,
                            only=args.only, processes=True, executor=args.executor,
                            address=args.address, loggers=loggers,
                            logger_dir=args.logger_dir, **ray_flags)
    except SweepInterrupted as stopped:
        _print_summary(stopped.summary)
        done = int(stopped.summary["status"].isin(["completed", "skipped (done)"]).sum())
        print(f"sweep interrupted: {done} of {len(stopped.summary)} cells done and kept; run "
              "the same command again to run the rest", file=sys.stderr)
        return exit_code(stopped.stop)
    _print_summary(summary)
    failed = int((summary["status"] == "failed").sum()) if len(summary) else 0
    diverged = int(summary["status"].str.startswith("diverged").sum()) if len(summary) else 0
    elsewhere = int((summary["status"] == RUNNING_ELSEWHERE).sum()) if len(summary) else 0
    note = f", {diverged} diverged (the accuracy is from before the blow-up)" if diverged else ""
    print(f"{len(summary)} cells: {failed} failed{note}")
    if elsewhere:
        # Not a failure: another sweep on the same folder runs them; its summary has them.
        print(f"{elsewhere} cell(s) left to another sweep running in the same output folder "
              "(running elsewhere); run the same command again once it ends to see them all")
    return 1 if failed else 0


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def _print_summary(summary) -> None:
    import pandas as pd  # lazy: the workers need no pandas

    with pd.option_context("display.width", 200, "display.max_rows", 1000,
                           "display.max_colwidth", 60):
        print(summary.to_string(index=False))
