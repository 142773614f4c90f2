"""run --logger tensorboard|mlflow: each round's metrics and the settings copied
to file stores beside the run folder, read back here; and progress bars only on a terminal."""

import io
import json
import os
import sys
from pathlib import Path

import pytest

from flnotes.cli.main import main

TINY = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2",
        "--data-option", "num_train=400", "--data-option", "num_test=100", "--device", "cpu"]


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _mlflow_runs(store: Path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("flnotes")
    return client, client.search_runs([experiment.experiment_id])


def _needs(module: str):
    return pytest.mark.skipif(
        __import__("importlib").util.find_spec(module) is None,
        reason=f"{module} is not installed (pip install 'flnotes[{module}]')")


@_needs("tensorboard")
def test_tensorboard_event_file_holds_each_rounds_metrics(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["run", *TINY, "--run-dir", str(folder), "--logger", "tensorboard"]) == 0
    rows = _rows(folder)
    accuracy = _tensorboard_scalars(folder / "tensorboard", "accuracy")
    assert [step for step, _ in accuracy] == [r["round"] for r in rows] == [1, 2]
    assert [v for _, v in accuracy] == pytest.approx([r["accuracy"] for r in rows])
    for tag in ("loss", "train_loss", "seconds"):  # every number of the row
        assert len(_tensorboard_scalars(folder / "tensorboard", tag)) == 2
    assert f"tensorboard: {folder / 'tensorboard'}" in capsys.readouterr().out


@_needs("mlflow")
def test_mlflow_file_store_holds_each_rounds_accuracy_and_the_settings(tmp_path):
    folder = tmp_path / "run"
    assert main(["run", *TINY, "--run-dir", str(folder), "--logger", "mlflow",
                 "--lr", "0.07"]) == 0
    client, runs = _mlflow_runs(folder / "mlruns")
    assert len(runs) == 1
    found = runs[0]
    history = client.get_metric_history(found.info.run_id, "accuracy")
    assert sorted((m.step, m.value) for m in history) == \
        [(r["round"], pytest.approx(r["accuracy"])) for r in _rows(folder)]
    assert found.info.status == "FINISHED"
    assert found.data.tags["flnotes.status"] == "completed"
    assert found.data.params["lr"] == "0.07" and found.data.params["num_clients"] == "4"
    assert json.loads(found.data.params["data_options"]) == {"num_train": 400, "num_test": 100}


@_needs("tensorboard")
@_needs("mlflow")
def test_a_resumed_folder_continues_its_tracker_runs(tmp_path, capsys):
    folder = tmp_path / "run"
    both = ["--logger", "tensorboard,mlflow"]
    assert main(["run", *TINY, "--run-dir", str(folder), *both]) == 0
    assert main(["run", "--resume", str(folder), "--rounds", "3", *both]) == 0
    assert "resuming" in capsys.readouterr().out
    steps = [step for step, _ in _tensorboard_scalars(folder / "tensorboard", "accuracy")]
    assert steps == [1, 2, 3]
    client, runs = _mlflow_runs(folder / "mlruns")
    assert len(runs) == 1  # the same MLflow run, not a second one
    history = client.get_metric_history(runs[0].info.run_id, "accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]


@_needs("tensorboard")
@_needs("mlflow")
def test_logger_dir_holds_the_stores_of_several_runs(tmp_path, capsys):
    logs = tmp_path / "logs"
    for name in ("a", "b"):
        assert main(["run", *TINY, "--run-dir", str(tmp_path / name), "--seed", "3",
                     "--logger", "tensorboard", "--logger", "mlflow",
                     "--logger-dir", str(logs)]) == 0
    assert not (tmp_path / "a" / "tensorboard").exists()
    assert len(_tensorboard_scalars(logs / "tensorboard" / "b", "accuracy")) == 2
    _, runs = _mlflow_runs(logs / "mlruns")
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]


@_needs("tensorboard")
def test_a_finished_run_reloaded_with_a_logger_gets_its_rows_once(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["run", *TINY, "--run-dir", str(folder)]) == 0
    for _ in range(2):
        assert main(["run", *TINY, "--run-dir", str(folder), "--logger", "tensorboard"]) == 0
    assert "tensorboard: logged the 2 rounds" in capsys.readouterr().out
    assert [s for s, _ in _tensorboard_scalars(folder / "tensorboard", "accuracy")] == [1, 2]


@pytest.mark.parametrize("value", ["wandb", "tensorboard,comet", "tb", ","])
def test_an_unknown_logger_is_one_line_naming_the_choices(value, capsys):
    assert main(["run", *TINY, "--logger", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "choices: tensorboard, mlflow" in err


@pytest.mark.parametrize("name", ["tensorboard", "mlflow"])
def test_a_missing_package_is_one_line_with_the_pip_command(name, tmp_path, monkeypatch,
                                                              capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda module, *a: None if module == name else real(module, *a))
    assert main(["run", *TINY, "--run-dir", str(tmp_path / "r"), "--logger", name]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"pip install 'flnotes[{name}]'" in err
    assert not (tmp_path / "r").exists()  # refused before anything ran


@_needs("tensorboard")
def test_a_failing_logger_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from flnotes.engine import tracking

    def full_disk(self, row):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking.TensorBoardLogger, "log_round", full_disk)
    folder = tmp_path / "run"
    assert main(["run", *TINY, "--run-dir", str(folder), "--logger", "tensorboard"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: the tensorboard logger stopped") == 1
    assert "No space left on device" in err
    assert len(_rows(folder)) == 2  # metrics.jsonl keeps every round


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert main(["run", *TINY, "--run-dir", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err and "it/s" not in err and "s/it" not in err
    lines = [line for line in out.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in lines] == ["1", "2"]


def test_a_progress_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["run", *TINY, "--run-dir", str(tmp_path / "r")]) == 0
    assert "\r" in terminal.getvalue() and "2/2" in terminal.getvalue()
    assert "round    2" in capsys.readouterr().out


@_needs("tensorboard")
def test_seeds_log_each_seeds_folder_when_they_end(tmp_path, capsys):
    folder = tmp_path / "cell"
    assert main(["run", *TINY, "--seeds", "0,1", "--run-dir", str(folder),
                 "--logger", "tensorboard"]) == 0
    for seed in (0, 1):
        logged = _tensorboard_scalars(folder / f"seed{seed}" / "tensorboard", "accuracy")
        assert logged == [(r["round"], pytest.approx(r["accuracy"]))
                          for r in _rows(folder / f"seed{seed}")]


@_needs("mlflow")
def test_mlflow_runs_racing_to_create_the_experiment_share_one(tmp_path):
    """Two processes of a sweep logging into one fresh store: the second looked before the
    first created the experiment, so its own create fails; it joins the first's experiment
    instead of dropping its logger, and the sweep makes the experiment before its workers
    start anyway (prepare_store)."""
    from flnotes.engine import tracking

    store = tmp_path / "logs" / "mlruns"
    first = tracking.MLflowLogger(store, {}, str(tmp_path / "a"), "a")
    made = first._experiment_id(create=True)
    late = tracking.MLflowLogger(store, {}, str(tmp_path / "b"), "b")
    client = late._connect()
    real = client.get_experiment_by_name
    looks = []

    def looked_too_early(name):
        looks.append(name)
        return None if len(looks) == 1 else real(name)

    client.get_experiment_by_name = looked_too_early
    assert late._experiment_id(create=True) == made and len(looks) == 2
    for logger in (first, late):
        logger.log_round({"round": 1, "accuracy": 0.5})
        logger.close("completed")
    _, runs = _mlflow_runs(store)
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    # prepare_store: the experiment exists before any run, once
    fresh = tmp_path / "fresh"
    tracking.prepare_store(["tensorboard", "mlflow"], fresh)
    tracking.prepare_store(["mlflow"], fresh)
    client, _ = _mlflow_runs(fresh / "mlruns")
    assert [e.name for e in client.search_experiments()].count("flnotes") == 1
