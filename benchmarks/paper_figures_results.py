"""Smoke-scale results for every paper figure of :data:`flnotes.repro.figures.FIGURES`.

    python benchmarks/paper_figures_results.py                 # -> results/paper-figures-smoke/
    python benchmarks/paper_figures_results.py --out DIR --force

Each figure names the grid its runs come from (its own ``sweeps/<paper>_figures.yaml`` or the
cells of a table's grid). This script runs the ``smoke`` section of each of those grids here, in
this process (as tests/test_figures.py does: each cell's runs configured as its notebook would
configure them, without papermill), into ``OUT/<grid>/cells/<cell-id>/runs/<alg>/seed<N>/`` with
a ``cell.json`` per cell, the layout of ``python -m flnotes sweep GRID --smoke``. Notebook
22 then draws every figure from those folders:

    python -m flnotes figures results/paper-figures-smoke/fedmut_figures --figure fedmut-fig6

Smoke scale means synthetic data, a small MLP and 2-3 rounds: the runs check that each figure
finds its runs and draws the paper's panels and lines; their numbers say nothing about the
papers' claims. About a minute on one CPU thread.

Stand-ins where a grid's smoke section alone does not feed its figure (written into each
such cell's ``cell.json`` as ``stand_in``):

- fedmut-fig5 and fedqp-fig3 draw the table grids' ResNet-18 cells and fedmr-fig9 the
  CIFAR-100 ResNet-20 cells, but those grids' smoke sections label their MLP stand-in
  "CNN" (CIFAR-10): the same smoke cells run here labelled as the figure's setting
  (:data:`RELABEL`), as the figure grids' own smoke sections label theirs;
- fedup-fig3 draws the Shakespeare cells of ``fedup_figures.yaml``, which its smoke section
  leaves out: FedAvg and FedUp run here with the real preset (``fedup-paper-shakespeare``,
  its LSTM) on a tiny made-up play (``flnotes.data.plays.write_demo_plays``, as notebook 11's
  smoke), 2 rounds (:data:`EXTRA_CELLS`).

A cell whose ``cell.json`` says completed is skipped (``--force`` runs it again), so a second
call only checks. Only small files are kept for git: config.json, run.json, metrics.jsonl and
cell.json; the rest of each run folder (model files, checkpoints, client states, the lock)
is deleted once its cell is done.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flnotes.repro import SWEEP_DIR, figures  # noqa: E402
from flnotes.repro import grid as grids  # noqa: E402

OUT = ROOT / "results" / "paper-figures-smoke"

# grid -> labels put on each of its smoke cells (the figure's setting; see the docstring)
RELABEL: dict[str, dict[str, str]] = {
    "fedmut_table1": {"model": "ResNet-18"},  # fedmut-fig5
    "fedqp_tableI": {"model": "ResNet-18"},  # fedqp-fig3
    "fedmr_table1": {"dataset": "CIFAR-100", "model": "ResNet-20"},  # fedmr-fig9
}

# grid -> cells its smoke section leaves out: (cell id, preset, overrides, labels)
_SHAKESPEARE = {"dataset": "Shakespeare", "model": "LSTM", "heterogeneity": "leaf"}
_PLAY_SMOKE = {"data_options": {"seq_len": 20, "max_roles": None, "min_samples": 0},
               "num_clients": 4, "clients_per_round": 2, "rounds": 2, "batch_size": 50}
EXTRA_CELLS: dict[str, list[tuple[str, str, dict, dict]]] = {
    "fedup_figures": [
        (f"Shakespeare_{algorithm}_seed0-smoke", "fedup-paper-shakespeare",
         {**_PLAY_SMOKE, "algorithm": algorithm}, _SHAKESPEARE)
        for algorithm in ("fedavg", "fedup")],
}


def grid_of(figure: figures.Figure) -> str:
    """The grid a figure's runs come from: 'sweeps/fedmut_table1.yaml (reuses ...)' ->
    'fedmut_table1'."""
    return Path(figure.grid.split()[0]).stem


def _done(folder: Path) -> bool:
    info = folder / "cell.json"
    return info.is_file() and json.loads(info.read_text()).get("status") == "completed"


KEEP = {"cell.json", "config.json", "run.json", "metrics.jsonl"}


def _write_cell(folder: Path, info: dict) -> None:
    """The cell's cell.json; then everything but KEEP goes: model files, checkpoints, client
    states and locks (tens of MB for 43 runs that only need their curves)."""
    (folder / "cell.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file() and path.name not in KEEP:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def run_grid(name: str, out: Path, force: bool) -> int:
    """The smoke cells of flnotes/sweeps/NAME.yaml (and EXTRA_CELLS[NAME]) into OUT/NAME;
    returns the number of runs made."""
    from flnotes.config import RunConfig, field_names
    from flnotes.engine.sim import run

    grid = grids.load_grid(SWEEP_DIR / f"{name}.yaml", smoke=True)
    defaults = grids._notebook_defaults(grid.notebook)
    fields = set(field_names())
    made = 0
    for cell in grid.cells:
        folder = out / name / "cells" / cell.id
        if _done(folder) and not force:
            print(f"  {cell.id}: done (skipped)", flush=True)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        configs, _ = grids._cell_configs(cell.parameters, defaults, fields)
        start = time.perf_counter()
        for values in configs:
            for seed in cell.seeds:
                run_dir = folder / "runs" / values["algorithm"] / f"seed{seed}"
                run(RunConfig.from_dict({**values, "seed": seed, "run_dir": str(run_dir)}),
                    progress=False)
                made += 1
        info = {"grid": grid.name, "grid_file": f"flnotes/sweeps/{name}.yaml",
                "variant": "smoke", "paper_table": grid.paper_table, "id": cell.id,
                "parameters": cell.parameters, "labels": {**cell.labels,
                                                          **RELABEL.get(name, {})},
                "status": "completed"}
        if name in RELABEL:
            info["stand_in"] = (f"the grid's smoke cell (labels {cell.labels}) labelled as "
                                f"the figure's setting {RELABEL[name]}")
        _write_cell(folder, info)
        print(f"  {cell.id}: {len(configs) * len(cell.seeds)} run(s) in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    for cell_id, preset, overrides, labels in EXTRA_CELLS.get(name, []):
        made += _extra_cell(out / name / "cells" / cell_id, name, cell_id, preset, overrides,
                            labels, force)
    return made


def _extra_cell(folder: Path, grid: str, cell_id: str, preset: str, overrides: dict,
                labels: dict, force: bool) -> int:
    """A cell the grid's smoke section leaves out: the preset on a tiny made-up play."""
    import tempfile

    from flnotes.config import RunConfig
    from flnotes.data import plays
    from flnotes.engine.sim import run

    if _done(folder) and not force:
        print(f"  {cell_id}: done (skipped)", flush=True)
        return 0
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flnotes-play-") as tmp:
        data_dir = plays.write_demo_plays(Path(tmp) / "demo-play", num_roles=4, speeches=6)
        run_dir = folder / "runs" / overrides["algorithm"] / "seed0"
        config = RunConfig.from_preset(preset, **overrides, data_dir=str(data_dir), seed=0,
                                       run_dir=str(run_dir))
        run(config, progress=False)
    _write_cell(folder, {
        "grid": grid, "grid_file": f"flnotes/sweeps/{grid}.yaml", "variant": "smoke",
        "paper_table": None, "id": cell_id,
        "parameters": {"preset": preset, **overrides, "data_dir": None}, "labels": labels,
        "status": "completed",
        "stand_in": "not in the grid's smoke section: the preset on a made-up 4-role play "
                    "(flnotes.data.plays.write_demo_plays, deleted after the run)"})
    print(f"  {cell_id}: 1 run in {time.perf_counter() - start:.1f} s", flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help=f"default {OUT}")
    parser.add_argument("--force", action="store_true", help="run completed cells again")
    parser.add_argument("--grid", action="append",
                        help="only this grid (repeatable); default: every figure's grid")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # small models on a shared CPU: one thread is fastest
    needed: dict[str, list[str]] = {}
    for figure in figures.FIGURES.values():
        needed.setdefault(grid_of(figure), []).append(figure.name)
    names = args.grid or list(needed)
    unknown = [n for n in names if n not in needed]
    if unknown:
        parser.error(f"no figure draws from {unknown}; grids: {sorted(needed)}")
    start = time.perf_counter()
    made = 0
    for name in names:
        print(f"{name} (for {', '.join(needed[name])})", flush=True)
        made += run_grid(name, args.out, args.force)
    # every figure must now draw from its folder
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    failed = []
    for figure in figures.FIGURES.values():
        if grid_of(figure) not in names:
            continue
        try:
            fig, _ = figures.draw(figure, figures.load_runs(args.out / grid_of(figure)))
            plt.close(fig)
        except ValueError as err:
            failed.append(f"{figure.name}: {err}")
    print(f"{made} runs in {time.perf_counter() - start:.0f} s into {args.out}; "
          f"{len(names)} grids")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
