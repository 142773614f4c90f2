"""`python -m flnotes tables DIR` on results that are not clean: the same run in two folders,
unreadable metrics rows, failed runs. Each is left out with a one-line warning or note."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flnotes.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent
CONFIG = {"dataset": "cifar10", "model": "cnn", "partition": "dirichlet", "dirichlet_alpha": 0.1,
          "rounds": 12, "algorithm": "fedavg"}
CELL = "CIFAR-10", "CNN", "dir=0.1"  # FedAvg's paper number there: 47.93


def write_run(folder: Path, accuracies, seed=0, status="completed", lines=None, **meta):
    """A run folder as the engine writes it; ``lines`` replaces metrics.jsonl's lines."""
    folder.mkdir(parents=True)
    if lines is None:
        lines = [json.dumps({"round": r, "accuracy": a / 100, "seconds": 0.5})
                 for r, a in enumerate(accuracies, 1)]
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    config = dict(CONFIG, seed=seed, run_dir=str(folder))
    (folder / "run.json").write_text(json.dumps({"config": config, "status": status, **meta}))
    return folder


def tables(folder, capsys):
    """`python -m flnotes tables FOLDER --table fedmut_table1`, in this process."""
    code = cli_main(["tables", str(folder), "--table", "fedmut_table1"])
    out, err = capsys.readouterr()
    return code, out, err


def fedavg_cell(out: str) -> str:
    """The printed 'paper / ours (difference)' of FedAvg, CIFAR-10, CNN, dir=0.1."""
    line = next(x for x in out.splitlines() if x.startswith("CIFAR-10") and " CNN " in x
                and "dir=0.1" in x)
    return line.split("dir=0.1", 1)[1].strip().split("  ")[0]


def test_the_same_run_in_two_folders_counts_once_the_newer(tmp_path, capsys):
    old = write_run(tmp_path / "first" / "fedavg-seed0", [30.0])
    new = write_run(tmp_path / "again" / "fedavg-seed0", [50.0])
    os.utime(old / "run.json", (1_000_000, 1_000_000))
    os.utime(old / "metrics.jsonl", (1_000_000, 1_000_000))
    write_run(tmp_path / "seed1", [60.0], seed=1)  # another seed: averaged in
    code, out, err = tables(tmp_path, capsys)
    assert code == 0, err
    # (50 + 60) / 2 with the newer folder; never (30 + 50 + 60) / 3 as if seeds
    assert fedavg_cell(out).startswith("47.93 / 55.00")
    warnings = [x for x in err.splitlines() if "same run" in x]
    assert len(warnings) == 1 and str(old) in warnings[0] and str(new) in warnings[0]
    assert f"keeping the newer {new}" in warnings[0]
    assert "Traceback" not in err


def test_a_stored_settings_hash_decides_whether_two_folders_are_one_run(tmp_path, capsys):
    # One stored hash: one run.
    a = write_run(tmp_path / "a", [40.0], settings_hash="abc")
    b = write_run(tmp_path / "b", [44.0], settings_hash="abc")
    os.utime(b / "run.json", (1_000_000, 1_000_000))
    os.utime(b / "metrics.jsonl", (1_000_000, 1_000_000))
    code, out, err = tables(tmp_path, capsys)
    assert code == 0 and fedavg_cell(out).startswith("47.93 / 40.00")
    assert f"keeping the newer {a}" in err
    # The same config under another hash: the hash decides, two runs of seed 0 (averaged).
    write_run(tmp_path / "c", [44.0], settings_hash="def")
    code, out, err = tables(tmp_path, capsys)
    assert fedavg_cell(out).startswith("47.93 / 42.00")


@pytest.mark.parametrize("bad,why", [
    ("{not json", "line 2 (not JSON)"),
    ('{"round": 2, "accuracy": null}', "line 2 (accuracy null)"),
    ('{"round": 2, "accuracy": "0.9"}', 'line 2 (accuracy "0.9")'),
    ('{"round": 2, "accuracy": NaN}', "line 2 (accuracy NaN)"),
    ('{"round": 2, "accuracy": Infinity}', "line 2 (accuracy Infinity)"),
    ("[1, 2]", "line 2 (not a round's metrics)"),
])
def test_unreadable_metrics_rows_are_skipped_with_one_warning(tmp_path, capsys, bad, why):
    good = [json.dumps({"round": r, "accuracy": a}) for r, a in ((1, 0.40), (3, 0.50))]
    run = write_run(tmp_path / "run", [], lines=[good[0], bad, good[1], bad])
    code, out, err = tables(tmp_path, capsys)
    assert code == 0, err
    assert fedavg_cell(out).startswith("47.93 / 45.00")  # the two readable rows, no nan
    warnings = [x for x in err.splitlines() if x.startswith("warning")]
    assert warnings == [f"warning: {run / 'metrics.jsonl'}: skipped 2 unreadable metrics rows: "
                        f"{why}, {why.replace('line 2', 'line 4')}"]
    assert "nan" not in out and "Traceback" not in err


def test_a_half_written_last_line_of_a_running_run_is_no_warning(tmp_path, capsys):
    write_run(tmp_path / "run", [], status="running",
              lines=[json.dumps({"round": 1, "accuracy": 0.4}), '{"round": 2, "acc'])
    code, out, err = tables(tmp_path, capsys)
    assert code == 0 and "warning" not in err
    assert fedavg_cell(out).startswith("47.93 / 40.00~")  # running: partial, as before


def test_a_missing_or_dangling_metrics_file_is_named_not_dropped_silently(tmp_path, capsys):
    """A completed run whose metrics.jsonl is gone, or a link to nothing, would change the
    averages unseen; a run that has not reached its first round is no warning."""
    write_run(tmp_path / "seed0", [50.0])
    gone = write_run(tmp_path / "seed1", [60.0], seed=1)
    (gone / "metrics.jsonl").unlink()
    (gone / "metrics.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    lost = write_run(tmp_path / "seed2", [70.0], seed=2)
    (lost / "metrics.jsonl").unlink()
    (write_run(tmp_path / "seed3", [], seed=3, status="running") / "metrics.jsonl").unlink()
    code, out, err = tables(tmp_path, capsys)
    assert code == 0 and fedavg_cell(out).startswith("47.93 / 50.00")
    assert f"skipping run folder {gone}: its metrics.jsonl is missing (a link to nothing)" in err
    assert f"skipping run folder {lost}: its metrics.jsonl is missing" in err
    assert "seed3" not in err


def test_a_cell_json_with_bad_labels_or_an_unknown_table_is_said(tmp_path, capsys):
    """Labels that are lists are a damaged cell.json (skipped, named; it raised an
    'unexpected' TypeError); an unknown paper table is named and its runs read as loose runs."""
    for name, info in (("listed", {"labels": {"dataset": [1]}}),
                       ("elsewhere", {"paper_table": "nope"})):
        write_run(tmp_path / name / "runs" / "seed0", [50.0])
        (tmp_path / name / "cell.json").write_text(json.dumps(info))
    code, out, err = tables(tmp_path, capsys)
    assert code == 0 and "Traceback" not in err
    assert f"skipping run folder {tmp_path / 'listed' / 'runs' / 'seed0'}: " in err
    assert "its labels must map names to a text or a number each" in err
    assert f"{tmp_path / 'elsewhere' / 'cell.json'} names paper table 'nope'" in err
    assert fedavg_cell(out).startswith("47.93 / 50.00")  # the loose run, read after all


def test_a_cell_averaging_two_studies_is_marked_and_read_apart(tmp_path, capsys):
    """Seed 0 at 12 rounds and again at 24 (two studies in one folder): the table cell
    averages both and says so with MIXED_MARK; the readings take each study with its own
    FedAvg (before, a reading paired one study's method with the other's FedAvg)."""
    for rounds, folder in ((12, "short"), (24, "long")):
        for algorithm, accuracy in (("fedavg", 50.0), ("fedmut", 52.0 + rounds / 12)):
            run = write_run(tmp_path / folder / algorithm, [accuracy] * rounds)
            config = dict(CONFIG, algorithm=algorithm, rounds=rounds, seed=0, run_dir=str(run))
            (run / "run.json").write_text(json.dumps({"config": config,
                                                      "status": "completed"}))
    code, out, err = tables(tmp_path, capsys)
    assert code == 0, err
    assert fedavg_cell(out).startswith("47.93 / 50.00*+")
    assert "+ more runs than seeds: the cell averages runs of different settings" in out
    assert ("CIFAR-10, CNN, dir=0.1, rounds 12: FedMut > FedAvg cannot tell (late difference "
            "per seed: +3.00)") in out
    assert "CIFAR-10, CNN, dir=0.1, rounds 24: FedMut > FedAvg cannot tell (late difference " \
        "per seed: +4.00)" in out


def test_failed_runs_are_shown_apart_and_never_averaged(tmp_path, capsys):
    write_run(tmp_path / "ok", [50.0])
    broken = write_run(tmp_path / "broken", [10.0], seed=1, status="failed",
                       error="RuntimeError: CUDA out of memory")
    write_run(tmp_path / "broken2", [5.0], seed=2, status="failed")
    code, out, err = tables(tmp_path, capsys)
    assert code == 0, err
    # not partial (no ~; * is the 12 rounds), never (50 + 10 + 5) / 3
    assert fedavg_cell(out) == "47.93 / 50.00* (+2.07)"
    assert "== failed: 2 runs left out of every table" in out
    assert f"  {broken} (FedAvg, seed 1): RuntimeError: CUDA out of memory" in out
    assert f"  {tmp_path / 'broken2'} (FedAvg, seed 2)" in out


def test_a_cell_with_only_failed_runs_is_not_run(tmp_path, capsys):
    write_run(tmp_path / "broken", [10.0], status="failed")
    code, out, err = tables(tmp_path, capsys)
    assert fedavg_cell(out) == "47.93 / not run"
    assert "== failed: 1 run left out of every table" in out


def test_the_module_command_prints_no_traceback(tmp_path):
    """The real `python -m flnotes tables DIR`, with every kind of mess at once."""
    write_run(tmp_path / "a", [50.0])
    write_run(tmp_path / "b", [50.0])
    write_run(tmp_path / "c", [], seed=1, lines=['{"round": 1, "accuracy": null}', "garbage"])
    write_run(tmp_path / "d", [20.0], seed=2, status="failed")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "flnotes", "tables", str(tmp_path), "--table",
                           "fedmut_table1"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "same run" in done.stderr and "skipped 2 unreadable metrics rows" in done.stderr
    assert "== failed: 1 run left out of every table" in done.stdout


def test_tables_mark_a_baseline_run_as_the_seed_code_ran_it():
    """a seed table's baseline numbers come from the seed code's reading, so a run
    under that reading (an *-official preset) is marked, and one under its paper's is not."""
    from flnotes.config import RunConfig
    from flnotes.repro.paper_setting import baseline_reading

    seed = RunConfig.from_preset("fedmut-official", algorithm="fedgen").to_dict()
    paper = RunConfig.from_preset("fedmut-paper", algorithm="fedgen").to_dict()
    assert "FedGen as the seed code ran it" in baseline_reading(seed)
    assert baseline_reading(paper) == ""
    fedexp = RunConfig.from_preset("fedqp-official", algorithm="fedexp").to_dict()
    assert "FedExP as the seed code" in baseline_reading(fedexp)
    # FedAvg and FedMut have no second reading: never marked.
    assert baseline_reading(RunConfig.from_preset("fedmut-official").to_dict()) == ""
    assert baseline_reading({"algorithm": "fedgen"}) == ""  # an older folder: nothing to say
