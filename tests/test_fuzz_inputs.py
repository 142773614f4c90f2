"""A fuzz of bad inputs: flags, Python calls, run folders, client-state files and
paths that cannot be written. Each must end in one line that says what is wrong, never a
traceback and never a silent result: a non-zero exit from the command line (run in-process,
``flnotes.cli.main.main``), or a ValueError/TypeError of one line from the Python API.

Most cases are rejected before any data is built; the folder cases copy one tiny finished
run. The whole table runs in well under a minute. The cases found by the audit of run
folders, copies and --config files are here too: a full disk while copying the notebooks,
torch.save's own error on a full disk, config files that give what the flags refuse.
"""

import errno
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from helpers import fail_halfway

from flnotes.algorithms import all_settings
from flnotes.cli.main import main
from flnotes.config import RunConfig
from flnotes.engine import client_state, run_folder, sim
from flnotes.engine.seeds import run_seeds
from flnotes.flower import FlowerStrategy
from flnotes.flower.dropin import FedMut as DropInFedMut
from flnotes.flower.records import config_from_run_config
from flnotes.repro import notebooks

TINY = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2", "--data-option",
        "num_train=400", "--data-option", "num_test=100", "--device", "cpu", "--backend", "loop"]


def run_argv(*flags: str) -> list[str]:
    """``run`` on the tiny federation, with the flags under test last (they win)."""
    return ["run", *TINY, *flags]


# ---- flags: one bad value per common field ---------------------------------------------------
BAD_COMMON = {
    "rounds": ["0", "-3", "abc", "2.5", "", "1e3"],
    "num-clients": ["0", "-1", "x", "1"],
    "clients-per-round": ["0", "-1", "5", "two"],
    "local-epochs": ["0", "-1", "1.5"],
    "batch-size": ["0", "-8", "none"],
    "lr": ["nan", "inf", "-0.1", "abc", ""],
    "momentum": ["1", "-0.5", "2", "nan"],
    "weight-decay": ["-1", "nan", "inf"],
    "seed": ["-1", "x", "0.5"],
    "eval-every": ["0", "-1"],
    "eval-batch-size": ["0", "-5"],
    "checkpoint-every": ["0", "-2"],
    "dirichlet-alpha": ["0", "-1", "nan", "inf"],
    "shards-per-client": ["0", "-1"],
    "min-client-size": ["-1", "a"],
    "client-test-fraction": ["-0.1", "1.5", "nan"],
    "partition": ["xyz", ""],
    "dataset": ["", "nope", "cifar"],
    "model": ["nope", ""],
    "algorithm": ["", "FEDAVG", "fed avg"],
    "weighting": ["nope"],
    "backend": ["gpu", ""],
    "compile": ["fast"],
    "device": ["cuda:99", "tpu", "", "gpu0"],
    "download": ["maybe", "2"],
    "record-states": ["yes please"],
}
FLAG_CASES = [(f"--{flag} {value!r}", run_argv(f"--{flag}", value))
              for flag, values in BAD_COMMON.items() for value in values]


# ---- flags: one or two bad values per method setting, with a method that reads it ---------
def _bad_values(setting) -> list[str]:
    """Values outside a setting's declared range (from its own description)."""
    allowed = setting.allowed()
    if setting.choices:
        return ["zzz"]
    if setting.kind is bool:
        return ["maybe"]
    if setting.kind is int:
        return ["-1", "1.5"] if "non-negative" in allowed else ["0", "x"]
    if allowed.startswith("in "):
        return ["1.5", "-0.5"]
    if "positive" in allowed:
        return ["0", "inf"]
    return ["-1", "nan"]


SETTING_CASES = []
for _name, _readers in sorted(all_settings().items()):
    _method, _setting = next(iter(_readers.items()))
    if _setting.kind is str and not _setting.choices:
        continue  # free text (fml's personal_models): checked by its method at build time
    for _value in _bad_values(_setting):
        _flag = "--" + _name.replace("_", "-")
        SETTING_CASES.append((f"{_method} {_flag} {_value!r}",
                              run_argv("--algorithm", _method, _flag, _value)))

# ---- flags: misuse of the command line itself ----------------------------------------------
MISUSE_CASES = [
    ("no command", []),
    ("unknown command", ["runn"]),
    ("flag without its value", run_argv("--rounds")),
    ("lr without its value", ["run", "--lr"]),
    ("unknown flag", run_argv("--roundz", "3")),
    ("abbreviated flag", run_argv("--round", "3")),
    ("short flag", run_argv("-r", "3")),
    ("stray positional", ["run", "extra"]),
    ("unread method setting", run_argv("--algorithm", "fedavg", "--mu", "0.1")),
    ("renamed setting", run_argv("--algorithm", "fedup", "--alpha", "0.1")),
    ("data option without =", run_argv("--data-option", "num_train")),
    ("data option not YAML", run_argv("--data-option", "num_train=[1")),
    ("unknown data option", run_argv("--data-option", "num_trian=5")),
    ("data option with empty key", run_argv("--data-option", "=5")),
    ("seeds not numbers", run_argv("--seeds", "a,b")),
    ("seeds twice the same", run_argv("--seeds", "1,1")),
    ("negative seed in seeds", run_argv("--seeds", "-1")),
    ("seeds empty", run_argv("--seeds", "")),
    ("unknown preset", ["run", "--preset", "fedmut-papr"]),
    ("empty preset", run_argv("--preset", "")),
    ("preset with a bad override", ["run", "--preset", "fedmut-paper", "--rounds", "0"]),
    ("presets: unknown", ["presets", "nope"]),
    ("tables: missing folder", ["tables", "/nonexistent/flnotes-results"]),
    ("tables: unknown table", ["tables", "--table", "nope"]),
    ("sweep: missing grid", ["sweep", "/nonexistent/grid.yaml"]),
    ("toy with a model", run_argv("--dataset", "toy", "--model", "resnet18")),
    ("more clients a round than clients", run_argv("--num-clients", "3",
                                                   "--clients-per-round", "4")),
    ("logger-dir without --logger", run_argv("--logger-dir", "logs")),
    ("notebooks into ''", ["notebooks", ""]),
    ("demo --out ''", ["demo", "--quick", "--out", ""]),
    ("data option too large for memory", run_argv("--data-option",
                                                  "num_train=1000000000000")),
]


# ---- run folders and paths --------------------------------------------------------------------
def _finished(tmp: Path, cache: dict, method: str = "scaffold") -> Path:
    """A copy of a finished 2-round run folder of ``method`` (made once per test session)."""
    if method not in cache:
        folder = cache["base"] / method
        extra = ["--momentum", "0"] if method == "scaffold" else []
        assert main(run_argv("--algorithm", method, *extra, "--checkpoint-every", "1",
                             "--run-dir", str(folder))) == 0
        cache[method] = folder
    target = tmp / "run"
    shutil.copytree(cache[method], target)
    return target


def _resume_argv(folder: Path, method: str = "scaffold", rounds: str = "3") -> list[str]:
    extra = ["--momentum", "0"] if method == "scaffold" else []
    return run_argv("--algorithm", method, *extra, "--checkpoint-every", "1", "--rounds",
                    rounds, "--run-dir", str(folder))


def _state_file(folder: Path) -> Path:
    return sorted((folder / "client_states").rglob("*.pt"))[-1]


def _damaged(how):
    """A case: a finished folder with its last client-state file changed by ``how``."""
    def make(tmp, cache, method="scaffold"):
        folder = _finished(tmp, cache, method)
        how(_state_file(folder), folder)
        return _resume_argv(folder, method)
    return make


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x40
    path.write_bytes(bytes(data))


def _swap(path: Path, folder: Path) -> None:
    other = sorted((folder / "client_states").rglob("*.pt"))[0]
    a, b = other.read_bytes(), path.read_bytes()
    other.write_bytes(b)
    path.write_bytes(a)


def _torch_file(obj):
    def write(path: Path, folder: Path) -> None:
        torch.save(obj, path)
    return write


STATE_DAMAGE = {
    "missing": lambda p, f: p.unlink(),
    "empty": lambda p, f: p.write_bytes(b""),
    "garbage": lambda p, f: p.write_bytes(os.urandom(512)),
    "truncated to 10 bytes": lambda p, f: p.write_bytes(p.read_bytes()[:10]),
    "truncated by half": lambda p, f: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "last byte cut": lambda p, f: p.write_bytes(p.read_bytes()[:-1]),
    "a byte appended": lambda p, f: p.write_bytes(p.read_bytes() + b"\0"),
    "a byte flipped at 100": lambda p, f: _flip(p, 100),
    "a byte flipped at -200": lambda p, f: _flip(p, -200),
    "swapped with another client's": _swap,
    "a folder": lambda p, f: (p.unlink(), p.mkdir()),
    "a JSON file": lambda p, f: p.write_text('{"w": [1, 2]}'),
    "a plain tensor": _torch_file(torch.zeros(3)),
    "a list": _torch_file([1, 2, 3]),
    "a header without a state": _torch_file({"flnotes_client_state": 1, "client": 0,
                                             "round": 1, "settings_hash": "", "state": 5}),
    "another run's header": _torch_file({"flnotes_client_state": 1, "client": 0, "round": 1,
                                         "settings_hash": "f" * 64, "state": {}}),
}
FOLDER_CASES = [(f"client-state file {name}", _damaged(how))
                for name, how in STATE_DAMAGE.items()]
FOLDER_CASES += [(f"feddyn client-state file {name}",
                  lambda t, c, how=how: _damaged(how)(t, c, "feddyn"))
                 for name, how in list(STATE_DAMAGE.items())[:6]]


def _replace(name: str, content: bytes | None):
    def make(tmp, cache):
        folder = _finished(tmp, cache)
        if content is None:
            (folder / name).unlink()
        else:
            (folder / name).write_bytes(content)
        return _resume_argv(folder)
    return make


FOLDER_CASES += [
    ("checkpoint garbage", _replace("checkpoint.pt", b"garbage")),
    ("checkpoint empty", _replace("checkpoint.pt", b"")),
    ("config.json a list", _replace("config.json", b"[1]")),
    ("config.json not JSON", _replace("config.json", b"{")),
    ("config.json binary", _replace("config.json", b"\xff\xfe\x00")),
    ("other settings in the folder", lambda t, c: _resume_argv(_finished(t, c)) + ["--lr",
                                                                                   "0.5"]),
    ("fewer rounds than the folder holds", lambda t, c: _resume_argv(_finished(t, c),
                                                                     rounds="1")),
    ("client_states a file", lambda t, c: (lambda f: (shutil.rmtree(f / "client_states"),
                                                     (f / "client_states").write_text("x"),
                                                     _resume_argv(f))[-1])(_finished(t, c))),
    ("run-dir is a file", lambda t, c: ((t / "file").write_text("x"),
                                        run_argv("--run-dir", str(t / "file")))[-1]),
    ("run-dir under a file", lambda t, c: ((t / "file").write_text("x"),
                                           run_argv("--run-dir", str(t / "file" / "sub")))[-1]),
    ("run-dir empty", lambda t, c: run_argv("--run-dir", "")),
    ("run-dir /dev/null", lambda t, c: run_argv("--run-dir", "/dev/null")),
    ("run-dir under /dev/null", lambda t, c: run_argv("--run-dir", "/dev/null/run")),
    ("run-dir under /proc", lambda t, c: run_argv("--run-dir", "/proc/flnotes-run")),
    ("run-dir name too long", lambda t, c: run_argv("--run-dir", str(t / ("x" * 300)))),
    ("run-dir with a NUL byte", lambda t, c: run_argv("--run-dir", str(t / "a\0b"))),
    ("partition manifest under a file", lambda t, c: ((t / "file").write_text("x"),
                                                      run_argv("--partition-manifest",
                                                               str(t / "file" / "m.json")))[-1]),
    ("partition manifest a folder", lambda t, c: run_argv("--partition-manifest", str(t))),
    ("partition manifest empty", lambda t, c: ((t / "m.json").write_text(""),
                                               run_argv("--partition-manifest",
                                                        str(t / "m.json")))[-1]),
    ("partition manifest a list", lambda t, c: ((t / "m.json").write_text("[1, 2]"),
                                                run_argv("--partition-manifest",
                                                         str(t / "m.json")))[-1]),
    ("logger-dir under a file", lambda t, c: ((t / "file").write_text("x"),
                                              run_argv("--logger", "tensorboard", "--logger-dir",
                                                       str(t / "file" / "logs")))[-1]),
    ("sweep --dry-run logger-dir under a file",
     lambda t, c: ((t / "file").write_text("x"),
                   ["sweep", "fml_table1", "--smoke", "--dry-run", "--logger", "tensorboard",
                    "--logger-dir", str(t / "file" / "logs")])[-1]),
    ("sweep --dry-run logger-dir empty",
     lambda t, c: ["sweep", "fml_table1", "--smoke", "--dry-run", "--logger", "tensorboard",
                   "--logger-dir", ""]),
    ("sweep logger-dir empty",
     lambda t, c: ["sweep", "fml_table1", "--smoke", "--out", str(t / "out"), "--logger",
                   "tensorboard", "--logger-dir", ""]),
]


# ---- --config files: what the flags refuse, a file refuses too ------------------------------
def _config_file(name: str, text: str, *more: str):
    """``run --config`` of a file holding ``text`` (a tiny federation unless it says other)."""
    def make(tmp, cache):
        (tmp / name).write_text(text)
        return ["run", "--config", str(tmp / name), *more]
    return make


CONFIG_CASES = [
    ("config json: a setting its method does not read", _config_file(
        "c.json", '{"algorithm": "fedavg", "mu": 0.5}')),
    ("config yaml: a setting its method does not read", _config_file(
        "c.yaml", "algorithm: fedavg\nmu: 0.5\n")),
    ("config json: a key twice", _config_file("c.json", '{"lr": 0.1, "lr": 0.5}')),
    ("config json: a data option twice", _config_file(
        "c.json", '{"data_options": {"num_train": 400, "num_train": 9}}')),
    ("config yaml: a key twice", _config_file("c.yaml", "lr: 0.1\nrounds: 2\nlr: 0.5\n")),
    ("config yaml: damaged", _config_file("c.yaml", "lr: [0.1\nrounds: 2\n")),
    ("config yaml: a list as a key", _config_file("c.yaml", "lr: 0.1\n[a, b]: 1\n")),
    ("config yaml: a list", _config_file("c.yaml", "- lr: 0.1\n")),
    ("config yaml: rounds 0", _config_file("c.yaml", "rounds: 0\n")),
    ("config yaml: unknown field", _config_file("c.yaml", "roundz: 3\n")),
    ("config with a preset", _config_file("c.yaml", "rounds: 1\n", "--preset",
                                          "fedmut-paper")),
    ("config empty", _config_file("c.json", "")),
    ("config missing", lambda t, c: ["run", "--config", str(t / "nope.json")]),
]


# ---- paths that cannot be written (the error injected where the write happens) -------------
def _unwritable(module, name: str, code: int, point: int = 1):
    """A fresh run whose point-th ``module.name`` call fails with OSError(code)."""
    def make(tmp, cache, monkeypatch):
        real, count = getattr(module, name), [0]

        def failing(*args, **kwargs):
            count[0] += 1
            if count[0] == point:
                raise OSError(code, os.strerror(code))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, failing)
        return run_argv("--algorithm", "scaffold", "--momentum", "0", "--checkpoint-every",
                        "1", "--run-dir", str(tmp / "run"))
    return make


WRITE_CASES = [
    (f"{where} {errno.errorcode[code]}", _unwritable(module, name, code, point))
    for where, module, name, point in [
        ("client-state write", client_state, "write_atomically", 1),
        ("a later client-state write", client_state, "write_atomically", 3),
        ("checkpoint write", run_folder, "_atomic_save", 1),
        ("metrics append", run_folder, "_append_row", 1),
        ("config.json write", run_folder, "_write_text", 1),
    ]
    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO, errno.EDQUOT)
]


def _torch_zip_error(point: int):
    """A fresh run whose point-th checkpoint save fails as torch.save does on a full disk: its
    own RuntimeError ("... unexpected pos ..."), the file's OSError behind it."""
    def make(tmp, cache, monkeypatch):
        real, count = run_folder._atomic_save, [0]

        def failing(*args, **kwargs):
            count[0] += 1
            if count[0] == point:
                try:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                except OSError:  # as torch does: the OSError only the context, not the cause
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . "  # noqa: B904
                                       "unexpected pos 1984 vs 1878")
            return real(*args, **kwargs)

        monkeypatch.setattr(run_folder, "_atomic_save", failing)
        return run_argv("--checkpoint-every", "1", "--run-dir", str(tmp / "run"))
    return make


def _notebooks_unwritable(code: int, point: int):
    """``notebooks DEST`` whose point-th copy fails with OSError(code) halfway through."""
    def make(tmp, cache, monkeypatch):
        fail_halfway(monkeypatch, notebooks, point, code)
        return ["notebooks", str(tmp / "nb")]
    return make


WRITE_CASES += [(f"checkpoint torch zip error at save {point}", _torch_zip_error(point))
                for point in (1, 2)]
WRITE_CASES += [(f"notebooks copy {errno.errorcode[code]} at {point}",
                 _notebooks_unwritable(code, point))
                for code in (errno.ENOSPC, errno.EACCES, errno.EROFS) for point in (1, 3)]


# ---- the Python API ---------------------------------------------------------------------------
def _tiny(**changes) -> RunConfig:
    return RunConfig(num_clients=4, clients_per_round=2, rounds=1, device="cpu",
                     data_options={"num_train": 400, "num_test": 100}, **changes)


API_CASES = [
    ("run(dict)", lambda: sim.run({"rounds": 1}, progress=False)),
    ("run(None)", lambda: sim.run(None, progress=False)),
    ("run(str)", lambda: sim.run("config.json", progress=False)),
    ("run(int)", lambda: sim.run(3, progress=False)),
    ("run(Path)", lambda: sim.run(Path("runs/x"), progress=False)),
    ("run(list of configs)", lambda: sim.run([_tiny()], progress=False)),
    ("run(RunConfig class)", lambda: sim.run(RunConfig, progress=False)),
    ("Simulation(dict)", lambda: sim.Simulation({"rounds": 1})),
    ("run_seeds(dict)", lambda: run_seeds({"rounds": 1}, [0], progress=False)),
    ("run_seeds(None)", lambda: run_seeds(None, [0], progress=False)),
    ("run_seeds seeds empty", lambda: run_seeds(_tiny(), [], progress=False)),
    ("run_seeds seeds twice", lambda: run_seeds(_tiny(), [0, 0], progress=False)),
    ("run_seeds seeds a string", lambda: run_seeds(_tiny(), "01", progress=False)),
    ("run_seeds seeds an int", lambda: run_seeds(_tiny(), 3, progress=False)),
    ("run_seeds seeds None", lambda: run_seeds(_tiny(), None, progress=False)),
    ("run_seeds seed a float", lambda: run_seeds(_tiny(), [1.5], progress=False)),
    ("run_seeds seed a bool", lambda: run_seeds(_tiny(), [True], progress=False)),
    ("run_seeds seed a string", lambda: run_seeds(_tiny(), ["1"], progress=False)),
    ("run_seeds seed negative", lambda: run_seeds(_tiny(), [-1], progress=False)),
    ("RunConfig rounds a string", lambda: RunConfig(rounds="3")),
    ("RunConfig rounds a float", lambda: RunConfig(rounds=2.5)),
    ("RunConfig rounds None", lambda: RunConfig(rounds=None)),
    ("RunConfig lr a string", lambda: RunConfig(lr="0.1")),
    ("RunConfig lr nan", lambda: RunConfig(lr=float("nan"))),
    ("RunConfig algorithm None", lambda: RunConfig(algorithm=None)),
    ("RunConfig algorithm unknown", lambda: RunConfig(algorithm="fedavgg")),
    ("RunConfig dataset a number", lambda: RunConfig(dataset=5)),
    ("RunConfig data_options a string", lambda: RunConfig(data_options="num_train=5")),
    ("RunConfig data_options a list", lambda: RunConfig(data_options=[1])),
    ("RunConfig seed negative", lambda: RunConfig(seed=-1)),
    ("RunConfig run_dir empty", lambda: RunConfig(run_dir="")),
    ("RunConfig run_dir a number", lambda: RunConfig(run_dir=5)),
    ("RunConfig unknown field", lambda: RunConfig.from_dict({"nope": 1})),
    ("RunConfig from a list", lambda: RunConfig.from_dict([("rounds", 1)])),
    ("RunConfig momentum 1", lambda: RunConfig(momentum=1.0)),
    ("RunConfig unread setting", lambda: RunConfig(algorithm="fedavg", mu=0.1)),
    ("RunConfig mu negative", lambda: RunConfig(algorithm="fedprox", mu=-1.0)),
    ("run with run_dir empty (replace)", lambda: sim.run(_tiny().replace(run_dir=""),
                                                          progress=False)),
    *[(f"Flower timeout {value!r}", lambda value=value: FlowerStrategy(_tiny(), timeout=value))
      for value in (-1, 0, float("nan"), float("inf"), "soon", True)],
    ("Flower run config timeout -1", lambda: config_from_run_config({"timeout": -1})),
    ("drop-in start timeout -1", lambda: DropInFedMut().start(None, None, timeout=-1)),
]


# ---- the table ----------------------------------------------------------------------------------
def _case(name, kind, value, marks=()):
    return pytest.param(name, kind, value, marks=marks, id=name)


def _misuse(case):
    if hasattr(case, "values"):  # a pytest.param: a known gap, marked
        name, argv = case.values
        return _case(f"cli: {name}", "flags", argv, case.marks)
    return _case(f"cli: {case[0]}", "flags", case[1])


ALL = [_case(f"cli: {name}", "flags", argv) for name, argv in FLAG_CASES + SETTING_CASES]
ALL += [_misuse(case) for case in MISUSE_CASES]
ALL += [_case(f"cli: {name}", "folder", make) for name, make in FOLDER_CASES + CONFIG_CASES]
ALL += [_case(f"cli: {name}", "write", make) for name, make in WRITE_CASES]
ALL += [_case(f"api: {name}", "api", call) for name, call in API_CASES]


def test_the_fuzz_has_at_least_150_cases():
    names = [case.id for case in ALL]
    assert len(names) >= 150, len(names)
    assert len(set(names)) == len(names)  # each case its own name


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"base": tmp_path_factory.mktemp("finished")}


@pytest.fixture(autouse=True)
def _keep_sigterm():
    """main() makes SIGTERM stop a run like Ctrl-C; give pytest its own handler back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("name, kind, value", ALL)
def test_a_bad_input_ends_in_one_line(name, kind, value, tmp_path, cache, capsys,
                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default run folder, if any, lands here
    if kind == "api":
        with pytest.raises((ValueError, TypeError)) as err:
            value()
        message = str(err.value)
        assert message and "\n" not in message, f"{name}: {message!r}"
        assert "Traceback" not in capsys.readouterr().err
        return
    if kind == "flags":
        argv = value
    elif kind == "folder":
        argv = value(tmp_path, cache)
    else:
        argv = value(tmp_path, cache, monkeypatch)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's errors
        code = stop.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert isinstance(code, int) and code != 0, f"{name}: exit {code!r} (a silent result)\n{text}"
    assert "Traceback" not in text, f"{name}: {text}"
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, f"{name}: {errors or text}"
    if "run-dir" in name:  # a run folder that cannot be used says which
        assert "run-dir" in errors[0] or "run folder" in errors[0] or "run_dir" in errors[0], \
            f"{name}: {errors[0]}"
    if any(word in name for word in ("ENOSPC", "EDQUOT", "torch zip")):  # no room: said so
        assert "disk full" in errors[0], f"{name}: {errors[0]}"
    assert not list(tmp_path.rglob("*.tmp")), f"{name}: a .tmp file was left"
