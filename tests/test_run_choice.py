"""Which runs the paper tables, the figures and the results page use: a run of the seed
code's LeNet-style CNN ("lenet-cifar") in the tables' CNN rows, a one-line reason for a run
that lands in no cell of the asked table, and, of two folders of one run, the completed one
before a newer failed or interrupted one."""

import json
import os
from pathlib import Path

from flnotes.cli import main as cli_main
from flnotes.config import RunConfig
from flnotes.repro import figures, results_page, tables

OLD = (1_000_000, 1_000_000)  # an mtime long before the other folder's


def write_run(folder: Path, config: dict, accuracies, status="completed", cell=None,
              when=None) -> Path:
    """A run folder as the engine writes it (config.json, run.json, metrics.jsonl), evaluated
    every round; ``cell`` a sweep's cell.json in the folder above; ``when`` its files' mtime."""
    folder.mkdir(parents=True)
    config = dict(config, run_dir=str(folder))
    rows = [{"round": r, "accuracy": a / 100, "seconds": 0.5}
            for r, a in enumerate(accuracies, 1)]
    files = {"config.json": json.dumps(config),
             "run.json": json.dumps({"config": config, "status": status}),
             "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in rows)}
    for name, text in files.items():
        (folder / name).write_text(text)
        if when is not None:
            os.utime(folder / name, when)
    if cell is not None:
        (folder.parent / "cell.json").write_text(json.dumps(cell))
    return folder


def tables_output(folder, capsys, table="fedmut_table1"):
    code = cli_main(["tables", str(folder), "--table", table])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def cell(folder: Path, table: str, key: tuple) -> str:
    """The printed 'paper / ours (difference)' of one cell of ``table``."""
    ours = tables.aggregate(tables.collect_runs(folder))
    wide = tables.side_by_side(tables.compare(tables.load_paper_table(table), ours, table))
    return wide.loc[key[:3], key[3]]


# --- the seed code's CNN in the CNN rows -----------------------------------------------------

def official(algorithm="fedmut", **changes) -> dict:
    """The config a standalone `python -m flnotes run --preset fedmut-official` records."""
    config = RunConfig.from_preset("fedmut-official", algorithm=algorithm).resolved()
    return {**config.to_dict(), "seed": 0, "rounds": 3, **changes}


def test_a_lenet_cifar_run_lands_in_the_cnn_rows(tmp_path, capsys):
    write_run(tmp_path / "runs" / "fedmut", official(), [40.0, 45.0, 50.0])
    out, _ = tables_output(tmp_path, capsys)
    assert "== fedmut_table1: 1 of 120 cells run" in out
    # paper 56.90; ours the mean of the three evaluations, off the paper's setting (*)
    assert cell(tmp_path, "fedmut_table1", ("CIFAR-10", "CNN", "dir=0.5", "FedMut")) == \
        "56.90 / 45.00* (-11.90)"
    # ...and says honestly that the seed code's CNN is not the paper setting's "cnn"
    assert "lenet-cifar instead of cnn" in out
    out, _ = tables_output(tmp_path, capsys, table="fedqp_tableI")
    assert "== fedqp_tableI: 1 of 144 cells run" in out


def test_a_run_in_no_row_says_why_in_one_line(tmp_path, capsys):
    run = write_run(tmp_path / "fmnist", official(dataset="fashion-mnist"), [40.0])
    out, _ = tables_output(tmp_path, capsys)
    assert "0 of 120 cells run" in out
    reasons = [x for x in out.splitlines() if str(run) in x]
    assert len(reasons) == 1
    assert "dataset Fashion-MNIST (fashion-mnist) is in no row of fedmut_table1" in reasons[0]


def test_each_kind_of_miss_has_its_reason(tmp_path, capsys):
    model = write_run(tmp_path / "mlp", official(model="mlp"), [40.0])
    split = write_run(tmp_path / "dir03", official(dirichlet_alpha=0.3), [40.0])
    method = write_run(tmp_path / "fedqp", official(algorithm="fedqp"), [40.0])
    out, _ = tables_output(tmp_path, capsys)
    lines = out.splitlines()
    assert any(str(model) in x and "model MLP (mlp) is in no CIFAR-10 row of fedmut_table1"
               in x for x in lines)
    assert any(str(split) in x and "heterogeneity dir=0.3 is in no CIFAR-10 / CNN row" in x
               for x in lines)
    assert any(str(method) in x and "method FedQP is in no column of fedmut_table1" in x
               for x in lines)


def test_runs_of_another_tables_sweep_are_named_once(tmp_path, capsys):
    cell = {"paper_table": "fedqp_tableI", "parameters": {"algorithms": "fedavg"}}
    for seed in (0, 1):
        write_run(tmp_path / f"cell{seed}" / "runs", official("fedavg", seed=seed), [40.0],
                  cell=cell)
    out, _ = tables_output(tmp_path, capsys)
    (line,) = [x for x in out.splitlines() if "fedqp_tableI" in x]
    assert "2 runs" in line and "made for fedqp_tableI" in line


def test_the_committed_evidence_lands_in_the_cnn_rows(capsys):
    evidence = Path(__file__).resolve().parent.parent / "results" / "cifar10-lenet"
    out, _ = tables_output(evidence, capsys)
    # its CIFAR-10 / CNN / dir=0.1 and iid cells of FedAvg and FedMut at least (the folder
    # grows as the evidence grid gets more methods and seeds)
    (head,) = [x for x in out.splitlines() if x.startswith("== fedmut_table1:")]
    assert int(head.split()[2]) >= 4
    # its FedQP runs: FedMut's Table 1 has no FedQP column
    (line,) = [x for x in out.splitlines() if "method FedQP" in x and "no column" in x]
    assert line.startswith("not placed: ") and "runs (" in line


def test_a_loose_run_in_no_printed_table_is_named_once(tmp_path):
    """Printing every table, a run made outside any sweep is not reported under each table,
    only once if no table has its cell."""
    loose = write_run(tmp_path / "fmnist", official(dataset="fashion-mnist"), [40.0])
    write_run(tmp_path / "ok", official(), [40.0])
    runs = tables.one_per_run(tables.collect_runs(tmp_path))
    papers = {name: tables.load_paper_table(name) for name in ("fedmut_table1", "fml_table1")}
    assert tables.unplaced(papers["fml_table1"], runs, "fml_table1", untagged=False) == []
    assert tables.placed_nowhere(papers, runs) == [
        f"not placed: run {loose}: no printed table has a cell Fashion-MNIST / CNN / dir=0.5 "
        "/ FedMut"]


# --- of two folders of one run, the completed one ---------------------------------------------

CONFIG = {"dataset": "cifar10", "model": "cnn", "partition": "dirichlet", "dirichlet_alpha": 0.1,
          "rounds": 5, "algorithm": "fedavg", "seed": 0}
CELL = {"paper_table": "fedmut_table1", "parameters": {"algorithms": "fedavg"},
        "labels": {"dataset": "CIFAR-10", "model": "CNN", "heterogeneity": "dir=0.1",
                   "method": "FedAvg"}}


def two_folders(root: Path, newer_status: str, newer_rounds: int) -> tuple[Path, Path]:
    """The run completed in an older folder and again, newer, failed or stopped early."""
    done = write_run(root / "cells" / "a" / "runs", CONFIG, [50.0] * 5, cell=CELL, when=OLD)
    again = write_run(root / "cells" / "b" / "runs", CONFIG, [20.0] * newer_rounds,
                      status=newer_status, cell=CELL)
    return done, again


def test_the_completed_folder_wins_over_a_newer_failed_one(tmp_path, capsys):
    done, again = two_folders(tmp_path, "failed", 1)
    out, err = tables_output(tmp_path, capsys)
    assert "== fedmut_table1: 1 of 120 cells run" in out
    assert any("dir=0.1" in x and "47.93 / 50.00* (+2.07)" in x for x in out.splitlines())
    assert f"keeping the completed {done}" in err and str(again) in err
    (run,) = figures.load_runs(tmp_path)
    assert (run.run_dir, run.status) == (str(done), "completed")


def test_the_completed_folder_wins_over_a_newer_interrupted_one(tmp_path, capsys):
    done, _ = two_folders(tmp_path, "interrupted", 3)
    out, _ = tables_output(tmp_path, capsys)
    # 50.00, not the partial run's 20.00~
    assert any("dir=0.1" in x and "47.93 / 50.00* (+2.07)" in x for x in out.splitlines())
    (run,) = figures.load_runs(tmp_path)
    assert (run.run_dir, run.status, len(run.rows)) == (str(done), "completed", 5)
    page, _ = results_page.build_page(tmp_path, tmp_path / "page" / "README.md")
    text = page.read_text()
    assert "1 runs: 1 completed" in text and "interrupted" not in text
    assert "| CIFAR-10 | CNN | dir=0.1 | FedAvg | 0 | 5 / 5 |" in text


def test_a_partial_run_counts_only_where_no_completed_one_exists(tmp_path, capsys):
    failed = write_run(tmp_path / "a", CONFIG, [10.0], status="failed")
    partial = write_run(tmp_path / "b", CONFIG, [30.0] * 3, status="interrupted", when=OLD)
    out, _ = tables_output(tmp_path, capsys)
    # the older interrupted run over the newer failed one, marked partial (~)
    assert any("dir=0.1" in x and "47.93 / 30.00~*" in x for x in out.splitlines())
    (run,) = figures.load_runs(tmp_path)
    assert run.run_dir == str(partial) and str(failed) != run.run_dir
    # among completed folders, the newest
    newest = write_run(tmp_path / "c", CONFIG, [60.0] * 5)
    write_run(tmp_path / "d", CONFIG, [40.0] * 5, when=OLD)
    (run,) = figures.load_runs(tmp_path)
    assert run.run_dir == str(newest)


def test_a_completed_run_with_an_empty_metrics_file_is_named_not_counted(tmp_path, capsys):
    """A completed run always wrote its rounds: one whose metrics.jsonl is empty was emptied
    or damaged, so it is left out with a line naming it (it was a 'run' cell of 0 rounds),
    and a partial run of the same setting counts in its place."""
    emptied = write_run(tmp_path / "a", CONFIG, [50.0] * 5)
    (emptied / "metrics.jsonl").write_text("")
    partial = write_run(tmp_path / "b", CONFIG, [30.0] * 3, status="interrupted", when=OLD)
    out, err = tables_output(tmp_path, capsys)
    assert f"skipping run folder {emptied}: it says completed but its metrics.jsonl" in err
    assert any("dir=0.1" in x and "47.93 / 30.00~*" in x for x in out.splitlines())
    (run,) = figures.load_runs(tmp_path)
    assert run.run_dir == str(partial)
    (partial / "metrics.jsonl").unlink()
    (partial / "run.json").unlink()
    assert tables.collect_runs(tmp_path).empty
