"""Bad inputs: every one ends in a non-zero exit and one line that names what is
wrong (the file, the flag, the field), never a traceback, and none is silently ignored.

The table runs the command line in-process (``flnotes.cli.main.main``: an exception that
escapes it would be the traceback a user sees); a few cases also run as real subprocesses.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import write_notebook

from flnotes.cli.main import main
from flnotes.config import RunConfig
from flnotes.engine import sim
from flnotes.engine.history import History

REPO = Path(__file__).resolve().parent.parent
TINY = ["--data-option", "num_train=600", "--data-option", "num_test=200", "--num-clients",
        "10", "--clients-per-round", "5", "--batch-size", "32", "--backend", "loop",
        "--device", "cpu"]


@pytest.fixture(autouse=True)
def _keep_sigterm():
    """main() makes SIGTERM stop a run like Ctrl-C; give pytest its own handler back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-round run folder, copied by the cases that damage one."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", *TINY, "--rounds", "3", "--checkpoint-every", "1",
                 "--run-dir", str(folder)]) == 0
    return folder


def _copy(finished: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    target.mkdir(parents=True)
    for f in finished.iterdir():
        if f.is_file():
            (target / f.name).write_bytes(f.read_bytes())
    return target


def _grid(tmp_path: Path, text: str) -> str:
    write_notebook(tmp_path)
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return str(path)


GOOD_GRID = "notebook: tiny.ipynb\ngrid:\n  x: [1, 2]\n"

# (case, a function tmp_path, finished -> argv, text the one error line must contain)
CASES = [
    ("rounds 0", lambda t, f: ["run", "--rounds", "0"], "RunConfig.rounds=0"),
    ("rounds not a number", lambda t, f: ["run", "--rounds", "abc"], "--rounds"),
    ("lr nan", lambda t, f: ["run", "--lr", "nan"], "RunConfig.lr=nan"),
    ("negative mu", lambda t, f: ["run", "--mu", "-1"], "RunConfig.mu=-1"),
    ("momentum 1", lambda t, f: ["run", "--momentum", "1"], "RunConfig.momentum"),
    ("unknown algorithm", lambda t, f: ["run", "--algorithm", "fedavgg"], "did you mean"),
    ("unknown dataset", lambda t, f: ["run", "--dataset", "cifar"], "RunConfig.dataset"),
    ("unknown model", lambda t, f: ["run", "--model", "resnet"], "RunConfig.model"),
    ("toy with another model", lambda t, f: ["run", "--dataset", "toy", "--model", "resnet18"],
     "toy dataset trains its own"),
    ("toy model elsewhere", lambda t, f: ["run", "--model", "toy"], "RunConfig.model='toy'"),
    ("more clients per round than clients",
     lambda t, f: ["run", "--num-clients", "4", "--clients-per-round", "5"], "cannot exceed"),
    ("unknown partition", lambda t, f: ["run", "--partition", "dir"], "RunConfig.partition"),
    ("unknown flag", lambda t, f: ["run", "--roundz", "3"], "unrecognized arguments: --roundz"),
    # argparse would otherwise read an abbreviation as the flag it starts: --round as --rounds.
    ("abbreviated flag", lambda t, f: ["run", "--round", "3"], "unrecognized arguments: --round"),
    ("abbreviated sweep flag", lambda t, f: ["sweep", "grid.yaml", "--dry"],
     "unrecognized arguments: --dry"),
    ("manifest not JSON",
     lambda t, f: (t / "m.json").write_text("{oops") and ["run", *TINY, "--partition-manifest",
                                                        str(t / "m.json"), "--run-dir",
                                                        str(t / "r")],
     "partition manifest"),
    ("manifest without its keys",
     lambda t, f: (t / "m.json").write_text('{"clients": []}') and [
         "run", *TINY, "--partition-manifest", str(t / "m.json"), "--run-dir", str(t / "r")],
     "labels_sha256"),
    ("data option not YAML", lambda t, f: ["run", "--data-option", "num_train=[1"],
     "not YAML"),
    ("data option without =", lambda t, f: ["run", "--data-option", "num_train"],
     "KEY=VALUE"),
    ("unknown data option", lambda t, f: ["run", "--data-option", "num_trian=5"],
     "num_trian"),
    ("bad seeds", lambda t, f: ["run", "--seeds", "a,b"], "expected seeds"),
    ("bad bool", lambda t, f: ["run", "--download", "maybe"], "expected true or false"),
    ("unknown preset", lambda t, f: ["run", "--preset", "fedmut-papr"], "unknown preset"),
    ("presets: unknown name", lambda t, f: ["presets", "nope"], "unknown preset 'nope'"),
    ("device that is not one", lambda t, f: ["run", "--device", "gpu0"], "RunConfig.device"),
    ("fashion-mnist data_dir missing",
     lambda t, f: ["run", "--dataset", "fashion-mnist", "--data-dir", str(t / "nope"),
                   "--run-dir", str(t / "r")], "does not exist"),
    ("run-dir is a file",
     lambda t, f: (t / "file").write_text("x") and ["run", *TINY, "--run-dir", str(t / "file")],
     "is a file, not a folder"),
    ("run-dir cannot be created",
     lambda t, f: (t / "file").write_text("x") and ["run", *TINY, "--run-dir",
                                                    str(t / "file" / "sub")],
     "cannot use run folder"),
    ("checkpoint garbage",
     lambda t, f: _damage(f, t, "checkpoint.pt", b"garbage"), "checkpoint.pt is damaged"),
    ("checkpoint empty", lambda t, f: _damage(f, t, "checkpoint.pt", b""),
     "checkpoint.pt is damaged"),
    ("checkpoint truncated", lambda t, f: _damage(f, t, "checkpoint.pt", slice(0, 300)),
     "checkpoint.pt is damaged"),
    ("checkpoint not a checkpoint",
     lambda t, f: _damage(f, t, "checkpoint.pt", _torch_bytes({"x": 1})),
     "checkpoint.pt is damaged: no round"),
    ("config.json not JSON", lambda t, f: _damage(f, t, "config.json", b"{"),
     "config.json is damaged"),
    ("config.json a list", lambda t, f: _damage(f, t, "config.json", b"[1]"),
     "config.json is damaged"),
    ("checkpoint of other settings",
     lambda t, f: _damage(f, t, "config.json", None) + ["--lr", "0.05"],
     "checkpoint.pt was written by a run with other settings (lr: 0.01 != 0.05)"),
    ("config.json of other settings",
     lambda t, f: _damage(f, t, None, None) + ["--weight-decay", "0.5"],
     "holds a different run (weight_decay: 0.0 != 0.5)"),
    ("fewer rounds than the folder holds",
     lambda t, f: _damage(f, t, None, None, rounds=2), "holds 3 rounds"),
    ("folder in use", lambda t, f: _locked(f, t), "is in use by pid"),
    ("grid file missing", lambda t, f: ["sweep", str(t / "none.yaml")], "not found"),
    ("grid not YAML", lambda t, f: ["sweep", _grid(t, "grid: [1, 2\n"), "--dry-run"],
     "not valid YAML at line"),
    ("grid a number", lambda t, f: ["sweep", _grid(t, "5\n"), "--dry-run"],
     "a grid file is a YAML mapping"),
    ("grid: 5", lambda t, f: ["sweep", _grid(t, "notebook: tiny.ipynb\ngrid: 5\n"),
                              "--dry-run"], "'grid' must be a mapping"),
    ("fixed a list", lambda t, f: ["sweep", _grid(t, GOOD_GRID + "fixed: [1]\n"), "--dry-run"],
     "'fixed' must be a mapping"),
    ("grid axis empty", lambda t, f: ["sweep", _grid(t, "notebook: tiny.ipynb\ngrid: {x: []}\n"),
                                      "--dry-run"], "grid axis 'x'"),
    ("grid unknown key", lambda t, f: ["sweep", _grid(t, GOOD_GRID + "fixd: {}\n"), "--dry-run"],
     "unknown key 'fixd'"),
    ("grid unknown parameter",
     lambda t, f: ["sweep", _grid(t, GOOD_GRID + "fixed: {rounds: 3}\n"), "--dry-run"],
     "'rounds' (in fixed) is not a parameter"),
    ("grid unknown algorithm",
     lambda t, f: ["sweep", _grid(t, GOOD_GRID + "fixed: {extra: {algorithm: fedavgg}}\n"),
                   "--dry-run"], "unknown algorithm 'fedavgg'"),
    ("grid seeds not integers",
     lambda t, f: ["sweep", _grid(t, GOOD_GRID + "seeds: [a]\n"), "--dry-run"], "'seeds'"),
    ("--set not YAML", lambda t, f: ["sweep", _grid(t, GOOD_GRID), "--set", "x=[1", "--dry-run"],
     "--set 'x=[1': the value is not YAML"),
    ("--set without =", lambda t, f: ["sweep", _grid(t, GOOD_GRID), "--set", "x", "--dry-run"],
     "--set expects KEY=VALUE"),
    ("--only matching nothing",
     lambda t, f: ["sweep", _grid(t, GOOD_GRID), "--only", "zzz", "--dry-run"],
     "--only zzz matches no cell"),
    ("--workers 0", lambda t, f: ["sweep", _grid(t, GOOD_GRID), "--workers", "0"],
     "--workers must be 1 or more"),
    ("sweep --out is a file",
     lambda t, f: (t / "out").write_text("x") and ["sweep", _grid(t, GOOD_GRID), "--out",
                                                  str(t / "out")], "is a file, not a folder"),
    ("tables: no such folder", lambda t, f: ["tables", str(t / "none")], "not found"),
    ("tables: unknown table", lambda t, f: ["tables", "--table", "nope"], "no paper table"),
]


def _torch_bytes(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _damage(finished: Path, tmp_path: Path, name, content, rounds: int = 3) -> list[str]:
    """A copy of the finished folder with one file replaced (bytes), cut (a slice) or
    deleted (None); the argv that reruns it."""
    folder = _copy(finished, tmp_path)
    if name is not None:
        path = folder / name
        if content is None:
            path.unlink()
        elif isinstance(content, slice):
            path.write_bytes(path.read_bytes()[content])
        else:
            path.write_bytes(content)
    return ["run", *TINY, "--rounds", str(rounds), "--checkpoint-every", "1",
            "--run-dir", str(folder)]


_held = []


def _locked(finished: Path, tmp_path: Path) -> list[str]:
    argv = _damage(finished, tmp_path, None, None)
    _held.append(sim.lock_folder(tmp_path / "run"))  # this process holds the folder
    return argv


@pytest.mark.parametrize("case, make_argv, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(case, make_argv, expected, tmp_path, finished, capsys,
                                     monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default run folder, if any, lands here
    argv = make_argv(tmp_path, finished)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    finally:
        while _held:
            _held.pop().close()
    out = capsys.readouterr()
    text = out.out + out.err
    assert code not in (0, None), f"{case}: exit {code}\n{text}"
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, f"{case}: {lines}"
    assert expected in lines[0], f"{case}: {lines[0]!r}"


# ---------------------------------------------------------------- what must still work

def test_stale_lock_of_a_dead_run_is_taken_over(tmp_path, finished, capsys):
    argv = _damage(finished, tmp_path, None, None, rounds=4)
    (tmp_path / "run" / "run.lock").write_text("pid 999999 on nowhere since then\n")
    assert main(argv) == 0
    # The run took the lock over and, once over, let go of it and removed the file: a
    # finished folder keeps no run.lock (nor a stale holder's line).
    assert not (tmp_path / "run" / "run.lock").exists()


def test_damaged_run_json_and_metrics_are_rewritten_on_resume(tmp_path, finished):
    argv = _damage(finished, tmp_path, "run.json", b"{")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"round": 1}\n{"rou')
    assert main(argv[:-4] + ["--rounds", "4", "--checkpoint-every", "1",
                             "--run-dir", str(tmp_path / "run")]) == 0
    history = History.load(tmp_path / "run")
    assert history.status == "completed" and [r["round"] for r in history.rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("name, content, expected", [
    ("run.json", "{", "run.json is damaged (not JSON"),
    ("run.json", "[]", "run.json is damaged (not a run's record"),
    ("metrics.jsonl", '{"round": 1}\nnope\n{"round": 3}\n', "metrics.jsonl is damaged: line 2"),
    ("global_model.pt", "garbage", "global_model.pt is damaged"),
])
def test_history_load_names_the_damaged_file(tmp_path, finished, name, content, expected):
    folder = _copy(finished, tmp_path)
    (folder / name).write_text(content)
    with pytest.raises(ValueError, match="^[^\n]*$") as err:
        History.load(folder)
    assert expected in str(err.value) and str(folder / name) in str(err.value)


def test_tables_skips_a_damaged_folder_and_goes_on(tmp_path, finished, capsys):
    good = _copy(finished, tmp_path / "a")  # tmp/a/run
    bad = _copy(finished, tmp_path / "b")
    (bad / "run.json").write_text("{")
    assert good.exists()
    assert main(["tables", str(tmp_path), "--table", "fedmut_table1"]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipping run folder {bad}" in err and "Traceback" not in err
    from flnotes.repro.tables import collect_runs

    assert list(collect_runs(tmp_path)["run_dir"]) == [str(good)]


def test_numpy_numbers_are_numbers():
    config = RunConfig(rounds=np.int64(2), num_clients=np.int32(6), clients_per_round=np.int64(3),
                       lr=np.float32(0.5), seed=np.int64(0), download=np.bool_(False))
    assert (config.rounds, config.num_clients, config.lr) == (2, 6, 0.5)
    assert type(config.rounds) is int and type(config.lr) is float
    assert json.loads(config.to_json())["rounds"] == 2
    with pytest.raises(ValueError, match="RunConfig.rounds=0 is invalid"):
        RunConfig(rounds=np.int64(0))


@pytest.mark.parametrize("values, expected", [
    ({"rounds": "3"}, "RunConfig.rounds='3' is invalid: must be a positive integer"),
    ({"rounds": 2.5}, "RunConfig.rounds=2.5"),
    ({"lr": float("inf")}, "RunConfig.lr=inf"),
    ({"seed": -1}, "RunConfig.seed=-1"),
    ({"data_options": [1]}, "RunConfig.data_options"),
    ({"dataset": "toy", "model": "mlp"}, "toy dataset trains its own"),
    ({"nope": 1}, "unknown RunConfig field(s) ['nope']"),
])
def test_runconfig_refuses_with_one_line(values, expected):
    with pytest.raises(ValueError) as err:
        RunConfig.from_dict(values)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_fedmr_stage1_beyond_rounds_is_said(tmp_path, capsys):
    code = main(["run", *TINY, "--algorithm", "fedmr", "--rounds", "2", "--stage1-rounds", "5",
                 "--run-dir", str(tmp_path / "r")])
    assert code == 0
    assert "stage1_rounds=5 is not below rounds=2" in capsys.readouterr().err


# ---------------------------------------------------------------- as real processes

@pytest.mark.parametrize("argv, expected", [
    (["run", "--rounds", "0"], "RunConfig.rounds=0"),
    (["sweep", "{grid}", "--dry-run"], "not valid YAML"),
    (["run", *TINY, "--run-dir", "{file}"], "is a file, not a folder"),
])
def test_command_line_exits_non_zero_with_one_line(tmp_path, argv, expected):
    (tmp_path / "grid.yaml").write_text("grid: [1, 2\n")
    (tmp_path / "file").write_text("x")
    argv = [a.format(grid=tmp_path / "grid.yaml", file=tmp_path / "file") for a in argv]
    done = subprocess.run([sys.executable, "-m", "flnotes", *argv], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line] == [
        line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert expected in done.stderr


def test_yaml_grid_fixture_is_valid(tmp_path):
    """GOOD_GRID, which the sweep cases build on, passes: their errors are the ones named."""
    assert main(["sweep", _grid(tmp_path, GOOD_GRID), "--dry-run"]) == 0
    assert yaml.safe_load(GOOD_GRID)["grid"] == {"x": [1, 2]}
