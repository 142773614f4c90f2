"""Papermill batches from a YAML grid: ``python -m flnotes sweep GRID.yaml``.

The grid file format, its checks and its expansion into cells are in flnotes.repro.grid; this
module runs the cells. Each cell runs in its own folder ``OUT/cells/<id>/`` (output notebook,
run folders, ``cell.json`` with status, parameters, labels and any error); a completed cell is
skipped on re-run, a failed one is recorded and the batch goes on. ``--workers N`` runs N
cells at once, each worker process pinned to one CUDA device (round-robin) or, on CPU, to its
share of the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

from flnotes.repro import REPO_ROOT
from flnotes.repro import grid as grid_file
from flnotes.repro.grid import Cell, Grid, GridError, load_grid
from flnotes.repro.notebooks import quiet_kernel_manager

# ---------------------------------------------------------------- execution


def device_slots(workers: int, visible: str | None = None, gpu_count: int = 0) -> list[str | None]:
    """The CUDA device (as CUDA_VISIBLE_DEVICES) each worker gets, round-robin; None = CPU."""
    devices = [d for d in (visible or "").split(",") if d.strip()] if visible else [
        str(i) for i in range(gpu_count)]
    return [devices[i % len(devices)] if devices else None for i in range(workers)]


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch or no driver: CPU only
        return 0


def _pin_worker(slots, threads: int) -> None:
    """Process-pool initializer: take one device slot; kernels started later inherit it."""
    device = slots.get()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    else:  # CPU: split the cores between workers instead of oversubscribing them
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


def run_cell(notebook: str, cell: dict, cell_dir: str, meta: dict) -> dict:
    """Execute one cell with papermill; write and return its cell.json record."""
    import papermill as pm

    folder = Path(cell_dir)
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(cell["parameters"], output_dir=str(folder))
    device = os.environ.get("CUDA_VISIBLE_DEVICES")
    record = {**meta, **cell, "parameters": params, "status": "running", "error": None,
              "device": f"cuda (CUDA_VISIBLE_DEVICES={device})" if device else "cpu/auto",
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write_json(folder / "cell.json", record)
    tic = time.perf_counter()
    # The kernel must import this same flnotes, installed or not.
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        with _environment(PYTHONPATH=path):
            pm.execute_notebook(notebook, str(folder / "notebook.ipynb"), parameters=params,
                                cwd=str(folder), progress_bar=False, log_output=False,
                                kernel_name="python3",
                                kernel_manager_class=quiet_kernel_manager())
        record["status"] = "completed"
    except Exception as err:  # a failed cell is recorded; the batch goes on
        record["status"] = "failed"
        ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
        record["error"] = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
        record["traceback"] = traceback.format_exc(limit=3)[-4000:]
    record["seconds"] = round(time.perf_counter() - tic, 2)
    _write_json(folder / "cell.json", record)
    return record


@contextlib.contextmanager
def _environment(**values: str):
    """Set environment variables for the block (the kernel inherits them), then restore."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def cell_status(out_dir: Path, cell: Cell) -> str | None:
    """Status recorded for a cell in an earlier run of the sweep, if any."""
    record = out_dir / "cells" / cell.id / "cell.json"
    return json.loads(record.read_text()).get("status") if record.exists() else None


def run_sweep(grid: Grid, out_dir: str | Path | None = None, workers: int = 1,
              force: bool = False, progress: bool = True, only: list[str] | None = None):
    """Run every cell not yet completed; return the summary table (one row per cell).

    ``only``: run just the cells whose id contains one of these texts.
    """
    from tqdm.auto import tqdm

    out = Path(out_dir or Path("runs") / "sweeps" / f"{grid.name}-{grid.variant}")
    out.mkdir(parents=True, exist_ok=True)
    cells = [c for c in grid.cells if not only or any(text in c.id for text in only)]
    meta = {"grid": grid.name, "grid_file": str(grid.path), "variant": grid.variant,
            "notebook": str(grid.notebook), "paper_table": grid.paper_table}
    records, todo = {}, []
    for cell in cells:
        if not force and cell_status(out, cell) == "completed":
            records[cell.id] = json.loads((out / "cells" / cell.id / "cell.json").read_text())
            records[cell.id]["skipped"] = True
        else:
            todo.append(cell)
    jobs = [(str(grid.notebook), vars(c), str(out / "cells" / c.id), meta) for c in todo]
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=grid.name, unit="cell",
               disable=not progress)
    if workers <= 1:
        for job in jobs:
            record = run_cell(*job)
            records[record["id"]] = record
            bar.update()
    else:
        records.update(_run_parallel(jobs, workers, bar))
    bar.close()
    summary = summarise([records[c.id] for c in cells if c.id in records], out)
    summary.to_csv(out / "summary.csv", index=False)
    return summary


def _run_parallel(jobs: list, workers: int, bar) -> dict:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    slots = ctx.Queue()
    for slot in device_slots(workers, os.environ.get("CUDA_VISIBLE_DEVICES"), _gpu_count()):
        slots.put(slot)
    threads = max(1, (os.cpu_count() or 1) // workers)
    records = {}
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pin_worker,
                             initargs=(slots, threads)) as pool:
        futures = {pool.submit(run_cell, *job): job for job in jobs}
        for future in as_completed(futures):
            try:
                record = future.result()
            except Exception as err:  # the worker process itself died: record, go on
                _, cell, cell_dir, meta = futures[future]
                record = {**meta, **cell, "status": "failed", "error": f"worker died: {err!r}"}
                _write_json(Path(cell_dir) / "cell.json", record)
            records[record["id"]] = record
            bar.update()
    return records


def summarise(records: list[dict], out: Path):
    """One row per cell: labels, seed, status, seconds, mean last-10 accuracy (%), error."""
    import pandas as pd

    from flnotes.repro.tables import collect_runs

    runs = collect_runs(out) if (out / "cells").exists() else None
    rows = []
    for r in records:
        mine = runs[runs["run_dir"].str.startswith(str(out / "cells" / r["id"]) + os.sep)] \
            if runs is not None and len(runs) else None
        seeds = r.get("seeds") or [r.get("seed")]
        rows.append({"cell": r["id"], **r.get("labels", {}),
                     "seed": seeds[0] if len(seeds) == 1 else ",".join(map(str, seeds)),
                     "status": "skipped (done)" if r.get("skipped") else r["status"],
                     "seconds": r.get("seconds"),
                     "acc_last10": None if mine is None or not len(mine)
                     else round(float(mine["acc_last_mean"].mean()), 2),
                     "error": (r.get("error") or "")[:120]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``sweep`` subcommand."""
    parser.add_argument("grid", help="YAML grid file (see sweeps/)")
    parser.add_argument("--smoke", action="store_true", help="run the grid's smoke variant")
    parser.add_argument("--out", help="output folder (default: runs/sweeps/<name>-<variant>)")
    parser.add_argument("--workers", type=int, default=1,
                        help="cells run at once, each worker pinned to one GPU (round-robin)")
    parser.add_argument("--force", action="store_true", help="re-run completed cells too")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="run only cells whose id contains TEXT (repeatable: any of them)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a parameter in every cell (YAML "
                        "value), e.g. --set data_dir=/data/cifar10 --set rounds=50")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and stop")
    parser.add_argument("--stack-seeds", action="store_true", default=None,
                        help="one cell per setting running all its seeds as one batched run "
                        "(the grid's stack_seeds: true; pays on a GPU)")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Check the grid, run its cells, print the summary; exit 1 if any cell failed."""
    import pandas as pd

    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise GridError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    grid = load_grid(args.grid, smoke=args.smoke, overrides=overrides,
                     stack_seeds=getattr(args, "stack_seeds", None))
    if args.dry_run:
        cells = [c for c in grid.cells if not args.only or any(t in c.id for t in args.only)]
        for cell in cells:
            print(cell.id, json.dumps(cell.parameters, default=str))
        print(f"{len(cells)} cells, notebook {grid.notebook}")
        return 0
    summary = run_sweep(grid, args.out, workers=args.workers, force=args.force, only=args.only)
    with pd.option_context("display.width", 200, "display.max_rows", 1000,
                           "display.max_colwidth", 60):
        print(summary.to_string(index=False))
    failed = int((summary["status"] == "failed").sum()) if len(summary) else 0
    print(f"{len(summary)} cells: {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m flnotes.repro.sweep``."""
    # The help shows the grid file format too: it is what a user of the command writes.
    parser = argparse.ArgumentParser(prog="python -m flnotes sweep",
                                     description=f"{__doc__}\n{grid_file.__doc__}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        return cmd_sweep(parser.parse_args(argv))
    except GridError as err:
        print(f"error: {err}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
