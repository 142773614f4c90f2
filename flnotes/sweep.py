"""Papermill batches from a YAML grid: ``python -m flnotes sweep GRID.yaml``.

A grid file::

    notebook: notebooks/10_reproduce_cifar.ipynb  # relative to the grid, cwd or the repo
    paper_table: fedmut_table1       # optional: CSV in data/paper_tables the cells belong to
    labels: {dataset: CIFAR-10}      # optional: table labels shared by every cell
    fixed: {preset: fedmut-paper, rounds: 500}   # parameters of every cell
    grid:                            # axes crossed with each other
      algorithms: [fedavg, fedmut]   #   a parameter and its values (label = the value)
      heterogeneity:                 #   or labels -> bundles of parameters
        dir=0.1: {partition: dirichlet, dirichlet_alpha: 0.1}
        iid: {partition: iid}
        CIFAR-100/q=0.3: {dataset: cifar100, labels: {dataset: CIFAR-100}}  # more labels
    seeds: [0, 1, 2]                 # one cell per seed (injected as seeds=[s] or seed=s)
    smoke: {fixed: {...}, grid: {...}, seeds: [0]}   # --smoke: overrides for a CPU check

``preset`` (in fixed or in a bundle) expands to that preset's RunConfig fields
(``python -m flnotes presets NAME``) under everything set explicitly; fields the notebook has
no parameter for go into its ``extra`` dict; the preset's ``algorithm`` is left to the grid.
An axis's label is the cell's label for the axis name; the labels named dataset, model,
heterogeneity and method key the cell into the paper table (see flnotes.tables).

Every parameter is checked against the notebook's parameters cell before anything runs. Each
cell runs in its own folder ``OUT/cells/<id>/`` (output notebook, run folders, ``cell.json``
with status, parameters, labels and any error); a completed cell is skipped on re-run, a
failed one is recorded and the batch goes on. ``--workers N`` runs N cells at once, each
worker process pinned to one CUDA device (round-robin) or, on CPU, to its share of the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
GRID_KEYS = {"name", "notebook", "paper_table", "labels", "fixed", "grid", "seeds", "smoke",
             "description"}
SMOKE_KEYS = {"fixed", "grid", "seeds", "labels"}
RESERVED = {"output_dir", "seeds", "seed"}  # set by the sweep itself
PSEUDO = {"preset", "labels"}  # grid keys that are not notebook parameters


class GridError(ValueError):
    """A grid file that cannot run; the message lists every problem found."""


@dataclass
class Cell:
    """One notebook execution: parameters, table labels and its folder name."""

    id: str
    parameters: dict[str, Any]
    labels: dict[str, str]
    seed: int


@dataclass
class Grid:
    """A validated grid file (one variant: paper scale or smoke)."""

    name: str
    path: Path
    notebook: Path
    variant: str
    cells: list[Cell] = field(default_factory=list)
    paper_table: str | None = None


# ---------------------------------------------------------------- loading and validation


def find_notebook(name: str, grid_path: Path) -> Path | None:
    """The notebook path: as given, or relative to the grid file, the cwd or the repo root."""
    candidates = [Path(name)] if Path(name).is_absolute() else [
        grid_path.parent / name, Path.cwd() / name, REPO_ROOT / name]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def notebook_parameters(notebook: Path) -> set[str]:
    """Names defined in the notebook's cell tagged 'parameters'."""
    import papermill as pm

    return set(pm.inspect_notebook(str(notebook)))


def load_grid(path: str | Path, smoke: bool = False, overrides: dict | None = None) -> Grid:
    """Read and check a grid file; raise GridError naming every problem before anything runs.

    ``overrides`` (command line ``--set KEY=VALUE``) win over every value of the grid.
    """
    path = Path(path)
    if not path.is_file():
        raise GridError(f"grid file {path} not found")
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise GridError(f"{path}: a grid file is a YAML mapping, got {type(spec).__name__}")
    problems = [f"unknown key {k!r} (allowed: {sorted(GRID_KEYS)})"
                for k in spec if k not in GRID_KEYS]
    fixed, axes = dict(spec.get("fixed") or {}), dict(spec.get("grid") or {})
    labels, seeds = dict(spec.get("labels") or {}), spec.get("seeds", [0])
    if smoke:
        over = spec.get("smoke")
        if not isinstance(over, dict):
            problems.append("--smoke asked but the grid has no 'smoke' section")
            over = {}
        problems += [f"unknown key 'smoke.{k}' (allowed: {sorted(SMOKE_KEYS)})"
                     for k in over if k not in SMOKE_KEYS]
        fixed.update(over.get("fixed") or {})
        axes.update(over.get("grid") or {})  # an axis given here replaces the same axis
        labels.update(over.get("labels") or {})
        seeds = over.get("seeds", seeds)
    notebook = find_notebook(str(spec.get("notebook", "")), path)
    if not spec.get("notebook"):
        problems.append("no 'notebook' given")
    elif notebook is None:
        problems.append(f"notebook {spec['notebook']!r} not found (looked beside the grid, in "
                        f"the current folder and in {REPO_ROOT})")
    table = spec.get("paper_table")
    if table is not None:
        from flnotes.tables import paper_table_names

        if table not in paper_table_names():
            problems.append(f"unknown paper_table {table!r}; known: {paper_table_names()}")
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        problems.append(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    problems += _axis_problems(axes)
    overrides = dict(overrides or {})
    if notebook is not None:
        problems += _parameter_problems(notebook, fixed, axes, overrides)
    if problems:
        raise GridError(f"{path}: " + "; ".join(dict.fromkeys(problems)))
    variant = "smoke" if smoke else "paper"
    grid = Grid(name=str(spec.get("name") or path.stem), path=path, notebook=notebook,
                variant=variant, paper_table=table)
    known = notebook_parameters(notebook)
    try:
        grid.cells = expand(fixed, axes, seeds, labels, seed_parameter=_seed_parameter(notebook),
                            known=known, overrides=overrides)
    except ValueError as err:  # an unknown preset, or preset fields with nowhere to go
        raise GridError(f"{path}: {err}") from err
    return grid


def _axis_problems(axes: dict) -> list[str]:
    problems = []
    for name, values in axes.items():
        if isinstance(values, dict):
            if not values:
                problems.append(f"grid axis {name!r} is empty")
            for label, bundle in values.items():
                if not isinstance(bundle, dict) or not bundle:
                    problems.append(f"grid axis {name!r}, label {label!r}: expected a non-empty "
                                    f"mapping of parameters, got {bundle!r}")
        elif not isinstance(values, list) or not values:
            problems.append(f"grid axis {name!r} must be a non-empty list of values or a mapping "
                            f"label -> parameters, got {values!r}")
    return problems


def _parameter_problems(notebook: Path, fixed: dict, axes: dict, overrides: dict) -> list[str]:
    """Every parameter the grid sets must exist in the notebook's parameters cell."""
    own = notebook_parameters(notebook)
    known = own | PSEUDO
    used = [(k, "fixed") for k in fixed] + [(k, "--set") for k in overrides]
    for name, values in axes.items():
        if isinstance(values, dict):
            used += [(k, f"grid axis {name!r}") for bundle in values.values()
                     if isinstance(bundle, dict) for k in bundle]
        else:
            used.append((name, "grid"))
    problems = [f"parameter {k!r} (in {where}) is set by the sweep itself" for k, where in used
                if k in RESERVED]
    problems += [f"parameter {k!r} (in {where}) is not a parameter of {notebook.name}; its "
                 f"parameters are {sorted(own - RESERVED)} (others go in 'extra')"
                 for k, where in used if k not in known and k not in RESERVED]
    if "output_dir" not in known:
        problems.append(f"{notebook.name} has no 'output_dir' parameter to put run folders in")
    if not known & {"seeds", "seed"}:
        problems.append(f"{notebook.name} has no 'seeds' or 'seed' parameter")
    return problems


def _seed_parameter(notebook: Path) -> str:
    return "seeds" if "seeds" in notebook_parameters(notebook) else "seed"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-") or "x"


def expand(fixed: dict, axes: dict, seeds: list[int], labels: dict | None = None,
           seed_parameter: str = "seeds", known: set[str] | None = None,
           overrides: dict | None = None) -> list[Cell]:
    """Cross the axes (seeds outermost, so every setting's first seed runs first)."""
    choices = []
    for name, values in axes.items():
        if isinstance(values, dict):
            choices.append([(name, str(label), dict(b)) for label, b in values.items()])
        else:
            choices.append([(name, _label(v), {name: v}) for v in values])
    cells = []
    for seed in seeds:
        for combo in itertools.product(*choices):
            cell_labels = dict(labels or {})
            for axis, label, bundle in combo:
                cell_labels[axis] = label
                cell_labels.update(bundle.get("labels") or {})
            layers = [fixed, *(bundle for _, _, bundle in combo), overrides or {}]
            params = resolve_parameters(layers, known)
            params[seed_parameter] = [seed] if seed_parameter == "seeds" else seed
            digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode())
            name = "_".join(_slug(label) for _, label, _ in combo)
            cell_id = f"{name + '_' if name else ''}seed{seed}-{digest.hexdigest()[:8]}"
            cells.append(Cell(cell_id, params, cell_labels, seed))
    return cells


def resolve_parameters(layers: list[dict], known: set[str] | None = None) -> dict[str, Any]:
    """Notebook parameters of a cell: its preset's fields, then each layer in order on top."""
    from flnotes.presets import preset_values

    preset = next((layer["preset"] for layer in reversed(layers) if "preset" in layer), None)
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if preset is not None:
        values = preset_values(preset)
        values.pop("algorithm", None)  # the grid chooses the methods
        for key, value in values.items():
            if known is None or key in known:
                params[key] = value
            else:
                extra[key] = value
    for layer in layers:
        for key, value in layer.items():
            if key == "extra":
                extra.update(value or {})
            elif key not in PSEUDO:
                params[key] = value
                extra.pop(key, None)
    if extra:
        if known is not None and "extra" not in known:
            raise ValueError(f"preset {preset!r} sets {sorted(extra)}, which the notebook has no "
                             "parameter for (and it has no 'extra' parameter)")
        params["extra"] = extra
    return params


def _label(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


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
                                kernel_name="python3")
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

    from flnotes.tables import collect_runs

    runs = collect_runs(out) if (out / "cells").exists() else None
    rows = []
    for r in records:
        mine = runs[runs["run_dir"].str.startswith(str(out / "cells" / r["id"]) + os.sep)] \
            if runs is not None and len(runs) else None
        rows.append({"cell": r["id"], **r.get("labels", {}), "seed": r.get("seed"),
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


def cmd_sweep(args: argparse.Namespace) -> int:
    """Check the grid, run its cells, print the summary; exit 1 if any cell failed."""
    import pandas as pd

    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise GridError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    grid = load_grid(args.grid, smoke=args.smoke, overrides=overrides)
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
    """Entry point of ``python -m flnotes.sweep``."""
    parser = argparse.ArgumentParser(prog="python -m flnotes sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        return cmd_sweep(parser.parse_args(argv))
    except GridError as err:
        print(f"error: {err}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
