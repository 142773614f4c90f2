"""The quick-start main job: a small federated run on synthetic data, then the notebooks."""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.messages import on_terminal
from flnotes.plots import plot_learning_curves
from flnotes.repro.notebooks import run_teaching_notebooks

# --quick: a few rounds and the first notebook only (a check that an install works).
QUICK_ROUNDS = 3
QUICK_NOTEBOOK_PARAMETERS = {"rounds": 5}


def main_job(out: Path, skip_notebooks: bool = False, quick: bool = False) -> int:
    """Run the demo preset with FedAvg and FedMut, print accuracies, save a PNG, then run
    the teaching notebooks headless (``quick``: 3 rounds and notebook 00 alone)."""

    out.mkdir(parents=True, exist_ok=True)
    histories = {}
    for algorithm in ("fedavg", "fedmut"):
        # --quick in a folder of its own: a full demo's 15-round folders are not shortened
        runs = out / ("runs-quick" if quick else "runs")
        config = RunConfig.from_preset("demo", algorithm=algorithm,
                                       run_dir=str(runs / algorithm))
        if quick:
            config = config.replace(rounds=QUICK_ROUNDS)
        print(f"== {algorithm}: {config.num_clients} clients, {config.clients_per_round} "
              f"per round, {config.rounds} rounds on {config.dataset}")
        printed = []

        def show(row: dict, printed=printed) -> None:  # each round as it ends
            printed.append(row["round"])
            if "accuracy" in row:  # above a terminal's progress bar, not into it
                tqdm.write(f"  round {row['round']:3d}  accuracy {row['accuracy']:.4f}")

        # no bar redrawn into a log
        history = run(config, progress=on_terminal(), on_round=show)
        for row in history.rows if not printed else ():  # a finished folder, reloaded
            show(row)
        histories[algorithm] = history
    fig = plot_learning_curves(histories, title="demo: synthetic task, Dirichlet 0.5")
    png = out / "learning_curve.png"
    fig.savefig(png, dpi=120)
    print(f"learning curve: {png}")
    if not skip_notebooks:
        # save_figures: each notebook writes its key figures as PNGs next to its copy.
        parameters = {"save_figures": True, **(QUICK_NOTEBOOK_PARAMETERS if quick else {})}
        run_teaching_notebooks(out / "notebooks", parameters, first=1 if quick else None)
    return 0
