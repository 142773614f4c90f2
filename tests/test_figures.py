"""The papers' figures (flnotes.repro.figures): each paper's figure grid runs its smoke
variant here, in this process (the sweep's cells, each run as its notebook would configure it,
without papermill's kernels), and each figure's axes and legend are checked. Figures that
reuse a table grid's cells are drawn from run folders written by hand."""

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from flnotes.cli.main import main as cli_main  # noqa: E402
from flnotes.repro import figures  # noqa: E402
from flnotes.repro import grid as grids  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_smoke(name: str, out: Path) -> Path:
    """The smoke cells of sweeps/NAME.yaml, run here into OUT/cells/<id>/runs/<alg>/seed<N>
    with a cell.json each, the layout of ``python -m flnotes sweep``."""
    from flnotes.config import RunConfig, field_names
    from flnotes.engine.sim import run

    grid = grids.load_grid(REPO / "sweeps" / f"{name}.yaml", smoke=True)
    defaults = grids._notebook_defaults(grid.notebook)
    fields = set(field_names())
    for cell in grid.cells:
        folder = out / "cells" / cell.id
        configs, _ = grids._cell_configs(cell.parameters, defaults, fields)
        for values in configs:
            for seed in cell.seeds:
                run_dir = folder / "runs" / values["algorithm"] / f"seed{seed}"
                run(RunConfig.from_dict({**values, "seed": seed, "run_dir": str(run_dir)}),
                    progress=False)
        (folder / "cell.json").write_text(json.dumps(
            {"grid": grid.name, "variant": "smoke", "paper_table": grid.paper_table,
             "id": cell.id, "parameters": cell.parameters, "labels": cell.labels,
             "status": "completed"}, default=str))
    return out


def fake_run(root: Path, cell: str, labels: dict, config: dict, accuracies: list[float],
             seed: int = 0) -> None:
    """A finished run folder written by hand: one accuracy (and loss) per round."""
    # (the cell's name in the config: two cells' runs are two runs, not one run twice)
    config = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "rounds":
              len(accuracies), "seed": seed, "note": cell, **config}
    run_dir = root / "cells" / cell / "runs" / config["algorithm"] / f"seed{seed}"
    run_dir.mkdir(parents=True)
    config["run_dir"] = str(run_dir)
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "run.json").write_text(json.dumps({"config": config, "status": "completed"}))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"round": i + 1, "accuracy": a, "loss": 2 - a}) + "\n"
        for i, a in enumerate(accuracies)))
    (root / "cells" / cell / "cell.json").write_text(json.dumps({"labels": labels}))


def drawn(name: str, results: Path):
    fig, caption = figures.draw(figures.FIGURES[name], figures.load_runs(results))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    return fig, axes, caption


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict[str, Path]:
    """One smoke sweep per paper (figure grids, and FML's table grid that its figures reuse),
    shared by the tests of this module."""
    root = tmp_path_factory.mktemp("figures")
    return {name: run_smoke(name, root / name) for name in
            ("fedmut_figures", "fedqp_figures", "fedmr_figures", "fedmr_clients_figures",
             "fml_table1", "fedup_figures")}


def test_registry_covers_the_issue_figures():
    assert set(figures.FIGURES) == {
        "fedmut-fig5", "fedmut-fig6", "fedqp-fig3", "fedqp-fig4", "fedmr-fig8", "fedmr-fig9",
        "fedmr-fig10", "fedmr-fig11", "fedmr-fig12", "fml-fig3", "fml-fig4", "fedup-fig1",
        "fedup-fig2", "fedup-fig3"}
    for figure in figures.FIGURES.values():
        assert figure.caption and figure.claim and figure.grid.startswith("sweeps/")
        grid = figure.grid.split()[0]
        assert (REPO / grid).is_file(), (figure.name, grid)
        # A figure grid has no table; a reused table grid says which of its cells it uses.
        assert grid.endswith("_figures.yaml") or "reuses" in figure.grid, figure.name


def test_fedmut_fig6_ablation_panels(smoke):
    fig, axes, caption = drawn("fedmut-fig6", smoke["fedmut_figures"])
    assert len(axes) == 2
    assert all(ax.get_xlabel() == "round" and ax.get_ylabel() == "test accuracy (%)"
               for ax in axes)
    assert legend(axes[0]) == ["FedAvg", "FedMut-2", "FedMut-4"]  # beta_0 = 0.5
    assert legend(axes[1]) == ["FedAvg", "FedMut-0.5", "FedMut-0.9"]  # alpha = 4
    assert any(line.startswith("Paper's caption: Ablation studies") for line in caption)


def test_fedqp_fig4_ablation(smoke):
    _, (ax,), caption = drawn("fedqp-fig4", smoke["fedqp_figures"])
    assert legend(ax) == ["FedMut", "ours-0.5", "ours-1"]
    assert ax.get_ylabel() == "test accuracy (%)"


def test_fedmr_figs_8_11_12_share_one_sweep(smoke):
    results = smoke["fedmr_figures"]
    _, (ax,), caption = drawn("fedmr-fig8", results)
    assert ax.get_ylabel() == "test loss" and legend(ax) == ["FedAvg", "FedMR"]
    assert ax.get_title() == "dir=0.1"
    assert any("the paper's ordering" in line for line in caption)
    _, (ax,), _ = drawn("fedmr-fig11", results)
    assert legend(ax) == ["FedMR", "FedMR-2"] and ax.get_title() == "ResNet-20"
    _, (ax,), _ = drawn("fedmr-fig12", results)
    assert legend(ax) == ["FedMR-0", "FedMR-1"]


def test_fedmr_fig10_one_panel_per_client_count(smoke):
    _, axes, _ = drawn("fedmr-fig10", smoke["fedmr_clients_figures"])
    assert [ax.get_title() for ax in axes] == ["(a) clients_per_round = 2",
                                               "(b) clients_per_round = 4"]
    assert all(legend(ax) == ["FedAvg", "FedMR"] for ax in axes)


def test_fml_figs_from_its_table_grid(smoke):
    _, (ax,), _ = drawn("fml-fig3", smoke["fml_table1"])
    assert legend(ax) == ["FedAvg", "FML"] and ax.get_title() == "CIFAR-10, CNN1, shards-3"
    _, (ax,), caption = drawn("fml-fig4", smoke["fml_table1"])
    assert ax.get_ylabel() == "accuracy on private data (%)"
    assert legend(ax) == ["FedAvg", "FML"]
    assert any("personal_accuracy" in line for line in caption)


def test_fedup_figs_2_and_3(smoke, tmp_path):
    _, (ax,), _ = drawn("fedup-fig2", smoke["fedup_figures"])
    assert legend(ax) == ["FedAvg", "FedUp"] and ax.get_title() == "clients=500"
    assert figures._natural("clients=500") < figures._natural("clients=1020")
    assert figures._natural("dir=0.1") < figures._natural("dir=1.0") < figures._natural("iid")
    with pytest.raises(ValueError, match="no runs for fedup-fig3"):
        drawn("fedup-fig3", smoke["fedup_figures"])  # the smoke runs no Shakespeare cell
    fake_run(tmp_path, "shakespeare-fedavg", {"dataset": "Shakespeare", "model": "LSTM"},
             {"algorithm": "fedavg"}, [0.1, 0.2])
    fake_run(tmp_path, "shakespeare-fedup", {"dataset": "Shakespeare", "model": "LSTM"},
             {"algorithm": "fedup"}, [0.1, 0.3])
    _, (ax,), caption = drawn("fedup-fig3", tmp_path)
    assert legend(ax) == ["FedAvg", "FedUp"]
    # one seed: the reading rule cannot tell FedUp's lead from its seed, and says so
    assert any("the paper's ordering cannot be told by the reading rule over 1 seed" in line
               and "FedUp > FedAvg cannot tell (+10.00)" in line for line in caption), caption


@pytest.mark.parametrize("name,labels,methods,panels", [
    ("fedmut-fig5", {"dataset": "CIFAR-10", "model": "ResNet-18"},
     ["fedavg", "fedprox", "fedgen", "clusamp", "fedmut"], ["dir=0.1", "iid"]),
    ("fedqp-fig3", {"dataset": "CIFAR-10", "model": "ResNet-18"},
     ["fedavg", "fedmut", "fedqp"], ["dir=0.1", "dir=0.5"]),
    ("fedmr-fig9", {"dataset": "CIFAR-100", "model": "ResNet-20"},
     ["fedavg", "fedmr"], ["dir=0.1", "iid"]),
    ("fedup-fig1", {"model": "ResNet18"}, ["fedavg", "mimelite", "fedup"],
     ["CIFAR-10/dir=0.3", "CIFAR-100/dir=0.6"]),
])
def test_figures_from_table_grids(tmp_path, name, labels, methods, panels):
    """Figures drawn from a table grid's cells: one panel per setting, each method a line with
    a band over two seeds; runs of other settings (a CNN cell) stay out."""
    for setting in panels:
        dataset, _, heterogeneity = setting.rpartition("/")
        cell_labels = {**labels, "heterogeneity": heterogeneity,
                       **({"dataset": dataset} if dataset else {})}
        for method in methods:
            for seed in (0, 1):
                fake_run(tmp_path, f"{setting}-{method}-{seed}".replace("/", "_"), cell_labels,
                         {"algorithm": method}, [0.1, 0.2 + 0.01 * seed], seed=seed)
    fake_run(tmp_path, "other", {**cell_labels, "model": "CNN"}, {"algorithm": "fedavg"},
             [0.5, 0.6])
    fig, axes, caption = drawn(name, tmp_path)
    assert len(axes) == len(panels)
    from flnotes.repro.paper_tables import METHOD_LABELS

    expected = sorted((METHOD_LABELS[m] for m in methods), key=figures._line_order)
    for ax in axes:
        assert legend(ax) == expected and ax.get_xlabel() == "round"
        assert len(ax.collections) == len(methods)  # one seed band per line
    assert sum(line.startswith("Ours: ") for line in caption) == len(panels)


def test_cli_lists_and_writes_png_and_caption(smoke, tmp_path, capsys):
    assert cli_main(["figures", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in figures.FIGURES)
    out = tmp_path / "fig.png"
    assert cli_main(["figures", str(smoke["fedqp_figures"]), "--figure", "fedqp-fig4",
                     "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    text = out.with_suffix(".md").read_text()
    assert "Paper's caption: Ablation study results." in text and "Ours: " in text
    # smoke runs keep the paper setting's labels: the caption (and the title) say smoke scale
    assert text.startswith("FedQP (SEKE 2024) Fig. 4 (fedqp-fig4), at smoke scale: the grid's "
                           "smoke variant")
    assert cli_main(["figures", str(tmp_path), "--figure", "fedqp-fig44"]) == 2
    assert "did you mean" in capsys.readouterr().err.lower()
