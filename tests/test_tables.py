"""Results tables: the last-10 metric, aggregation over seeds, and the paper comparison."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from flnotes.cli.main import main as cli_main
from flnotes.repro import paper_tables, tables
from flnotes.repro.paper_setting import paper_settings, setting_differences


def test_run_metrics_against_hand_computed_numbers():
    # 12 evaluations 10, 20, ..., 120 (fractions would be scaled by the caller).
    m = tables.run_metrics([10 * k for k in range(1, 13)])
    # Last 10 are 30..120: mean (30 + 120) / 2 = 75; deviations +-5, +-15, +-25, +-35, +-45,
    # squares sum to 2 * (25 + 225 + 625 + 1225 + 2025) = 8250; sample std: / (10 - 1).
    assert m["last_mean"] == pytest.approx(75.0)
    assert m["last_std"] == pytest.approx(math.sqrt(8250 / 9))
    assert (m["final"], m["best"], m["evaluations"]) == (120.0, 120.0, 12)
    few = tables.run_metrics([50.0, 70.0, 60.0])  # fewer than 10: all of them
    assert few["last_mean"] == pytest.approx(60.0)
    assert few["last_std"] == pytest.approx(10.0)  # sqrt((100 + 100 + 0) / (3 - 1))
    assert (few["final"], few["best"]) == (60.0, 70.0)
    assert tables.run_metrics([])["evaluations"] == 0
    assert math.isnan(tables.run_metrics([50.0])["last_std"])  # one value has no spread


def test_sample_std_matches_the_textbook_formula():
    assert tables.sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2.0))  # ((-1)^2 + 1^2) / 1
    assert tables.sample_std([2.0, 4.0, 6.0]) == pytest.approx(2.0)
    assert math.isnan(tables.sample_std([5.0])) and math.isnan(tables.sample_std([]))


@pytest.mark.parametrize("config,label", [
    ({"partition": "dirichlet", "dirichlet_alpha": 1.0}, "dir=1.0"),
    ({"partition": "dirichlet", "dirichlet_alpha": 0.5}, "dir=0.5"),
    ({"partition": "dirichlet", "dirichlet_alpha": 0.02}, "dir=0.02"),
    ({"partition": "iid"}, "iid"),
    ({"partition": "natural"}, "leaf"),
    ({"partition": "shards", "shards_per_client": 2}, "shards=2"),
])
def test_heterogeneity_labels_match_the_csvs(config, label):
    assert paper_tables.heterogeneity_label(config) == label


def _write_run(folder, config, accuracies, status="completed", every=1):
    """A run folder as flnotes.engine.sim.run writes it (run.json + metrics.jsonl)."""
    folder.mkdir(parents=True)
    rows = []
    for r in range(1, len(accuracies) * every + 1):
        row = {"round": r, "train_loss": 1.0, "seconds": 0.5}
        if r % every == 0:
            row["accuracy"] = accuracies[r // every - 1] / 100
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "run.json").write_text(json.dumps({"config": config, "status": status}))


BASE = {"dataset": "cifar10", "model": "cnn", "partition": "dirichlet", "dirichlet_alpha": 0.1,
        "rounds": 12}


def test_collect_and_aggregate_over_seeds(tmp_path):
    # FedMut, seeds 0 and 1, evaluated every other round: last 10 evaluations of 11.
    seed0 = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]  # last 10: 41..50, mean 45.5
    seed1 = [0, 50, 50, 50, 50, 50, 52, 52, 52, 52, 52]  # last 10: 5 x 50 + 5 x 52, mean 51
    for seed, acc in ((0, seed0), (1, seed1)):
        _write_run(tmp_path / "cellA" / "runs" / f"fedmut-seed{seed}",
                   dict(BASE, algorithm="fedmut", seed=seed), acc, every=2)
    (tmp_path / "cellA" / "cell.json").write_text(json.dumps(
        {"paper_table": "fedmut_table1", "labels": {"model": "CNN", "heterogeneity": "dir=0.1"},
         "parameters": {"algorithms": ["fedmut"]}}))
    _write_run(tmp_path / "adhoc" / "fedavg-seed0", dict(BASE, algorithm="fedavg", seed=0),
               [30.0, 31.0], status="running")
    runs = tables.collect_runs(tmp_path)
    assert len(runs) == 3
    fedmut = runs[runs["method"] == "FedMut"].sort_values("seed")
    assert list(fedmut["acc_evaluations"]) == [11, 11]
    assert list(fedmut["paper_table"]) == ["fedmut_table1"] * 2
    assert fedmut["acc_last_mean"].tolist() == pytest.approx([45.5, 51.0])
    # Sample std of 41..50 is sqrt(82.5 / 9); of five 50s and five 52s, sqrt(10 / 9).
    stds = [math.sqrt(82.5 / 9), math.sqrt(10 / 9)]
    assert fedmut["acc_last_std"].tolist() == pytest.approx(stds)

    agg = tables.aggregate(runs)
    row = agg[agg["method"] == "FedMut"].iloc[0]
    assert (row["dataset"], row["model"], row["heterogeneity"]) == ("CIFAR-10", "CNN", "dir=0.1")
    assert row["accuracy_mean"] == pytest.approx((45.5 + 51.0) / 2)
    assert row["accuracy_std"] == pytest.approx(sum(stds) / 2)
    assert row["seed_std"] == pytest.approx(5.5 / math.sqrt(2))  # sample std of 45.5 and 51
    assert row["final_mean"] == pytest.approx(51.0) and row["best_mean"] == pytest.approx(51.0)
    assert (row["seeds"], row["completed"], row["runs"]) == (2, 2, 2)
    adhoc = agg[agg["method"] == "FedAvg"].iloc[0]
    assert adhoc["paper_table"] == "" and adhoc["completed"] == 0
    assert adhoc["accuracy_mean"] == pytest.approx(30.5)


def test_cell_labels_override_derived_ones_but_not_the_method_of_several(tmp_path):
    for algorithm in ("fedavg", "fml"):
        _write_run(tmp_path / "cell" / "runs" / algorithm,
                   dict(BASE, algorithm=algorithm, seed=0, partition="shards",
                        shards_per_client=2), [10.0])
    (tmp_path / "cell" / "cell.json").write_text(json.dumps(
        {"labels": {"model": "CNN1", "heterogeneity": "shards-3", "method": "X"},
         "parameters": {"algorithms": ["fedavg", "fml"]}}))
    runs = tables.collect_runs(tmp_path)
    assert sorted(runs["method"]) == ["FML", "FedAvg"]
    assert set(runs["model"]) == {"CNN1"} and set(runs["heterogeneity"]) == {"shards-3"}


def test_paper_tables_ship_complete():
    sizes = {"fedmut_table1": 120, "fedmut_table2": 5, "fedqp_tableI": 144, "fedqp_tableII": 18,
             "fml_table1": 72, "fedmr_table1": 2, "fedup_table4": 110, "fedup_table5": 60}
    assert tables.paper_table_names() == sorted(sizes)
    for name, rows in sizes.items():
        t = tables.load_paper_table(name)
        assert len(t) == rows
        assert list(t.columns) == ["paper", "table", "dataset", "model", "heterogeneity",
                                   "method", "accuracy_mean", "accuracy_std", "notes"]
        assert t["accuracy_mean"].dtype == float
    t1 = tables.load_paper_table("fedmut_table1")
    cell = t1[(t1["model"] == "CNN") & (t1["dataset"] == "CIFAR-10")
              & (t1["heterogeneity"] == "dir=0.1") & (t1["method"] == "FedAvg")]
    assert cell[["accuracy_mean", "accuracy_std"]].values.tolist() == [[47.93, 3.26]]
    # FedDyn's three CIFAR-10 cells of Table 5 were not run in the paper: empty accuracy.
    assert tables.load_paper_table("fedup_table5")["accuracy_mean"].isna().sum() == 3


def test_compare_difference_and_not_run(tmp_path):
    ours = pd.DataFrame([
        {"paper_table": "fedmut_table1", "dataset": "CIFAR-10", "model": "CNN",
         "heterogeneity": "dir=0.1", "method": "FedAvg", "accuracy_mean": 50.0,
         "accuracy_std": 1.0, "seeds": 2, "runs": 2, "completed": 2},
        {"paper_table": "fedqp_tableI", "dataset": "CIFAR-10", "model": "CNN",
         "heterogeneity": "dir=0.1", "method": "FedMut", "accuracy_mean": 99.0,
         "accuracy_std": 0.0, "seeds": 1, "runs": 1, "completed": 1},
        {"paper_table": "", "dataset": "CIFAR-10", "model": "CNN",
         "heterogeneity": "iid", "method": "FedMut", "accuracy_mean": 60.0,
         "accuracy_std": 0.5, "seeds": 2, "runs": 2, "completed": 1},
    ])
    result = tables.compare(tables.load_paper_table("fedmut_table1"), ours, table="fedmut_table1")
    assert len(result) == 120
    done = result[result["status"] != "not run"].set_index(["heterogeneity", "method"])
    # Another table's run (FedQP's FedMut) does not count; an untagged run does.
    assert sorted(done.index) == [("dir=0.1", "FedAvg"), ("iid", "FedMut")]
    assert done.loc[("dir=0.1", "FedAvg"), "difference"] == pytest.approx(50.0 - 47.93)
    assert done.loc[("dir=0.1", "FedAvg"), "status"] == "done"
    assert done.loc[("iid", "FedMut"), "difference"] == pytest.approx(60.0 - 59.70)
    assert done.loc[("iid", "FedMut"), "status"] == "partial"
    assert (result["status"] == "not run").sum() == 118
    wide = tables.side_by_side(result)
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.1"), "FedAvg"] == "47.93 / 50.00 (+2.07)"
    assert wide.loc[("CIFAR-10", "CNN", "iid"), "FedMut"] == "59.70 / 60.00~ (+0.30)"
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.5"), "FedGen"] == "53.86 / not run"
    fig = tables.plot_comparison(result)
    assert len(fig.axes[0].lines) >= 1
    empty = tables.compare(tables.load_paper_table("fedmut_table2"), None)
    assert set(empty["status"]) == {"not run"} and empty["difference"].isna().all()


def test_side_by_side_run_only_keeps_the_cells_with_a_run():
    # FedAvg ran at dir=0.1, FedMut at iid: two rows, two columns, a blank where they cross.
    ours = pd.DataFrame([
        {"paper_table": "fedmut_table1", "dataset": "CIFAR-10", "model": "CNN",
         "heterogeneity": heterogeneity, "method": method, "accuracy_mean": accuracy,
         "accuracy_std": 1.0, "seeds": 1, "runs": 1, "completed": 1}
        for heterogeneity, method, accuracy in (("dir=0.1", "FedAvg", 50.0),
                                                ("iid", "FedMut", 60.0))])
    result = tables.compare(tables.load_paper_table("fedmut_table1"), ours, table="fedmut_table1")
    wide = tables.side_by_side(result, run_only=True)
    assert list(wide.columns) == ["FedAvg", "FedMut"]
    assert list(wide.index) == [("CIFAR-10", "CNN", "dir=0.1"), ("CIFAR-10", "CNN", "iid")]
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.1"), "FedAvg"] == "47.93 / 50.00 (+2.07)"
    assert wide.loc[("CIFAR-10", "CNN", "iid"), "FedMut"] == "59.70 / 60.00 (+0.30)"
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.1"), "FedMut"] == ""
    assert wide.loc[("CIFAR-10", "CNN", "iid"), "FedAvg"] == ""
    # The full view still has every cell, "not run" included.
    assert tables.side_by_side(result).shape == (24, 5)
    nothing = tables.side_by_side(tables.compare(tables.load_paper_table("fedmut_table2"), None),
                                  run_only=True)
    assert nothing.empty and list(nothing.index.names) == ["dataset", "model", "heterogeneity"]


def test_command_line_prints_each_table(tmp_path, capsys):
    _write_run(tmp_path / "r", dict(BASE, algorithm="fedavg", seed=0), list(np.full(3, 40.0)))
    assert cli_main(["tables", str(tmp_path), "--table", "fedmut_table1"]) == 0
    out = capsys.readouterr().out
    # BASE runs 12 rounds where the paper's setting (preset fedmut-paper) runs 2000.
    assert "fedmut_table1: 1 of 120 cells run" in out and "47.93 / 40.00* (-7.93)" in out
    assert "cells: paper / ours (ours - paper)" in out
    assert "* not the paper's setting (1 cell): 12 rounds instead of 2000" in out


def test_command_line_refuses_a_missing_results_folder(tmp_path, capsys):
    assert cli_main(["tables", str(tmp_path / "nonexist"), "--table", "fedmut_table1"]) == 2
    assert "results folder" in capsys.readouterr().err
    assert cli_main(["tables", str(tmp_path), "--table", "fedmut_tabel1"]) == 2
    assert "did you mean 'fedmut_table1'" in capsys.readouterr().err


def _paper_config(algorithm, **changes):
    """The resolved config a run of fedmut_table1's CIFAR-10/CNN/dir=0.5 cell records."""
    from flnotes.config import RunConfig

    config = RunConfig.from_preset("fedmut-paper", algorithm=algorithm, dirichlet_alpha=0.5)
    return dict(config.resolved().to_dict(), **changes)


def test_paper_settings_expand_the_tables_grid():
    settings = paper_settings("fedmut_table1")
    cell = settings[("CIFAR-10", "ResNet-18", "dir=0.1", "FedMut")]
    assert (cell["model"], cell["beta0"], cell["rounds"], cell["dirichlet_alpha"]) == (
        "resnet18", 0.5, 2000, 0.1)
    assert settings[("CIFAR-100", "VGG-16", "iid", "FedAvg")]["model"] == "vgg16"
    fedmr = paper_settings("fedmr_table1")
    # FedProx's mu per data set (FedMR Sec. 5.1) and the two-stage start of the deep models
    prox = fedmr[("CIFAR-100", "ResNet-20", "iid", "FedProx")]
    assert (prox["dataset"], prox["mu"], prox["stage1_rounds"]) == ("cifar100", 0.001, 100)
    assert fedmr[("FEMNIST", "CNN", "leaf", "FedProx")]["mu"] == 0.1
    assert fedmr[("FEMNIST", "VGG-16", "leaf", "FedMR")]["data_options"]["pad"] == 2


def test_another_partition_or_mutation_is_not_the_papers_setting():
    paper = paper_settings("fedmut_table1")[("CIFAR-10", "CNN", "dir=0.1", "FedMut")]
    run = dict(paper, algorithm="fedmut", mutation="sign")
    assert setting_differences([run], paper) == []
    assert setting_differences([dict(run, partition="iid")], paper) == [
        "partition iid instead of dirichlet"]
    assert setting_differences([dict(run, mutation="gaussian")], dict(paper, mutation="sign")) == [
        "mutation gaussian instead of sign"]


def test_runs_off_the_papers_setting_are_marked(tmp_path):
    smoke = _paper_config("fedmut", dataset="synthetic", model="mlp", rounds=3)
    _write_run(tmp_path / "smoke" / "run", dict(smoke, seed=0), [50.0, 56.9])
    (tmp_path / "smoke" / "cell.json").write_text(json.dumps(
        {"paper_table": "fedmut_table1", "parameters": {"algorithms": ["fedmut"]},
         "labels": {"dataset": "CIFAR-10", "model": "CNN", "heterogeneity": "dir=0.5"}}))
    # A FedAvg run at the paper's setting: FedMut's alpha (unused by FedAvg) is not compared.
    paper = _paper_config("fedavg", alpha=None, seed=0)
    _write_run(tmp_path / "paper", paper, [54.0, 55.0])
    result = tables.compare(tables.load_paper_table("fedmut_table1"),
                            tables.aggregate(tables.collect_runs(tmp_path)),
                            table="fedmut_table1")
    wide = tables.side_by_side(result)
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.5"), "FedMut"] == "56.90 / 53.45* (-3.45)"
    assert wide.loc[("CIFAR-10", "CNN", "dir=0.5"), "FedAvg"] == "54.33 / 54.50 (+0.17)"
    legend = "\n".join(tables.legend(result))
    for note in ("3 rounds instead of 2000", "synthetic instead of cifar10",
                 "mlp instead of cnn"):
        assert note in legend
    assert "alpha" not in legend and "~" not in legend  # every run completed
