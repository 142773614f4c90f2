"""A run folder's client-state files, interrupts and full disks.

- Resuming checks every client-state file the checkpoint names before its first round: a
  missing, damaged, foreign (another run's) or swapped (another client's or round's) file is
  one line naming it and what to do, exit 2, and the folder is left as it was.
- Ctrl-C or SIGTERM inside a client-state write stops the run as any interrupt does (130 or
  143, run.json "interrupted", the resume line), and the run resumes.
- An error marks run.json "failed" with the error; a full disk is one line, leaves no
  ``.tmp`` file, and the folder resumes once there is space again (mocked ENOSPC, and a real
  200 kB tmpfs where this machine lets the test mount one).
- ``--run-dir ""`` and a run() given something that is not a RunConfig are one line.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import fail_halfway

from flnotes.cli.main import main
from flnotes.config import RunConfig
from flnotes.engine import client_state, run_folder, sim
from flnotes.engine.seeds import run_seeds

TINY = ["--num-clients", "4", "--clients-per-round", "2", "--data-option", "num_train=400",
        "--data-option", "num_test=100", "--device", "cpu", "--backend", "loop",
        "--checkpoint-every", "1"]
METHODS = {"scaffold": ["--momentum", "0"], "feddyn": [], "moon": [], "fedsmoo": [],
           "fedpvr": ["--momentum", "0"]}


@pytest.fixture(autouse=True)
def _keep_sigterm():
    """main() makes SIGTERM stop a run like Ctrl-C; give pytest its own handler back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _argv(folder: Path, method: str = "scaffold", rounds: int = 2, *extra: str) -> list[str]:
    return ["run", *TINY, "--algorithm", method, *METHODS[method], "--rounds", str(rounds),
            "--run-dir", str(folder), *extra]


def _one_error_line(capsys) -> str:
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text
    return errors[0]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each method's finished 2-round folder (checkpointed every round)."""
    base = tmp_path_factory.mktemp("folders")
    made = {}
    for method in METHODS:
        assert main(_argv(base / method, method)) == 0
        made[method] = base / method
    assert main(_argv(base / "other-lr", "scaffold", 2, "--lr", "0.05")) == 0
    made["other-lr"] = base / "other-lr"
    return made


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(folder, target)
    return target


def _state_files(folder: Path) -> list[Path]:
    return sorted((folder / "client_states").rglob("*.pt"))


def _damage(kind: str, folder: Path, folders) -> Path:
    """Damage one client-state file the checkpoint names; returns the file named."""
    files = _state_files(folder)
    target = files[-1]
    if kind == "missing":
        target.unlink()
    elif kind == "garbage":
        target.write_bytes(b"\x00garbage" * 50)
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "truncated":
        target.write_bytes(target.read_bytes()[:1000])
    elif kind == "a byte flipped":
        data = bytearray(target.read_bytes())
        data[-100] ^= 0x01
        target.write_bytes(bytes(data))
    elif kind == "foreign":  # the same client and round, from a run with another lr
        theirs = folders["other-lr"] / target.relative_to(folder)
        target.write_bytes(theirs.read_bytes())
    elif kind == "swapped":
        a = next(f for f in files if f.name.split(".")[0] != target.name.split(".")[0])
        data = a.read_bytes()
        a.write_bytes(target.read_bytes())
        target.write_bytes(data)
        target = min(a, target)  # the first one checked is named
    elif kind == "a directory":
        target.unlink()
        target.mkdir()
    return target


KINDS = {"missing": "is missing", "garbage": "is damaged and cannot be read",
         "empty": "is damaged and cannot be read", "truncated": "is damaged",
         "a byte flipped": "is damaged", "foreign": "belongs to another run",
         "swapped": "a swapped or renamed file", "a directory": "cannot read"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_bad_client_state_file_is_refused_before_the_first_round(kind, folders, tmp_path,
                                                                   capsys, monkeypatch):
    folder = _copy(folders["scaffold"], tmp_path)
    named = _damage(kind, folder, folders)
    before = _snapshot(folder)
    trained = []
    monkeypatch.setattr(sim, "train_clients", lambda *a, **k: trained.append(a) or [])
    assert main(_argv(folder, "scaffold", 4)) == 2
    line = _one_error_line(capsys)
    assert str(named) in line and KINDS[kind] in line, line
    assert "delete the run folder to start the run over" in line
    assert trained == []  # refused before the first resumed round
    assert _snapshot(folder) == before  # and nothing written


@pytest.mark.parametrize("method", ["feddyn", "moon", "fedsmoo", "fedpvr"])
def test_every_method_with_client_states_checks_them(method, folders, tmp_path, capsys):
    folder = _copy(folders[method], tmp_path)
    named = _damage("a byte flipped", folder, folders)
    assert main(_argv(folder, method, 4)) == 2
    line = _one_error_line(capsys)
    assert str(named) in line and "is damaged" in line
    folder2 = _copy(folders[method], tmp_path / "again")
    assert main(_argv(folder2, method, 3)) == 0  # undamaged: resumes


# ---- interrupts inside a client-state write --------------------------------------------------
def _signal_inside_state_write(monkeypatch, signum: int, point: int = 3) -> None:
    """The point-th client-state write sends ``signum`` to this process halfway through."""
    real, count = client_state.write_atomically, [0]

    def halfway(path, write):
        count[0] += 1
        if count[0] != point:
            return real(path, write)

        def write_in_two(f):
            import io

            buffer = io.BytesIO()
            write(buffer)
            data = buffer.getvalue()
            f.write(data[:100])
            os.kill(os.getpid(), signum)
            f.write(data[100:])
        return real(path, write_in_two)

    monkeypatch.setattr(client_state, "write_atomically", halfway)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_inside_a_client_state_write_stops_like_any(signum, code, folders,
                                                                 tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    _signal_inside_state_write(monkeypatch, signum)
    assert main(_argv(folder, "scaffold", 3)) == code
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "unexpected pos" not in out.err
    assert "run the same command again to resume" in out.err
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    assert not list(folder.rglob("*.tmp"))
    monkeypatch.undo()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert main(_argv(folder, "scaffold", 3)) == 0
    reference = tmp_path / "reference"
    assert main(_argv(reference, "scaffold", 3)) == 0
    assert _final(folder) == _final(reference)


def _final(folder: Path) -> dict:
    """What must equal an uninterrupted run's: metrics (no times), final model, states."""
    rows = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (folder / "metrics.jsonl").read_text().splitlines()]
    model = torch.load(folder / "global_model.pt", weights_only=True)
    return {"rows": rows, "model": {n: t.tolist() for n, t in model.items()},
            "states": {str(p.relative_to(folder)): p.read_bytes() for p in _state_files(folder)},
            "status": json.loads((folder / "run.json").read_text())["status"]}


# ---- errors and full disks --------------------------------------------------------------
def test_an_error_marks_the_run_failed_and_it_resumes(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.replace(algorithm="scaffold", momentum=0.0, rounds=3,
                                 checkpoint_every=1, run_dir=str(tmp_path / "run"))
    real = sim.train_clients

    def breaks_in_round_2(task, strategy, rnd, *args):
        if rnd == 2:
            raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
        return real(task, strategy, rnd, *args)

    monkeypatch.setattr(sim, "train_clients", breaks_in_round_2)
    with pytest.raises(RuntimeError):
        sim.run(config, progress=False)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed"
    assert meta["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert meta["checkpoint_round"] == 1
    monkeypatch.undo()
    history = sim.run(config, progress=False)
    assert history.status == "completed"
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "completed" and "error" not in meta


def test_an_error_marks_every_seed_failed(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.replace(rounds=2, backend="vmap", run_dir=str(tmp_path / "seeds"))
    import flnotes.engine.seeds as seeds

    def broken(plans, rnd):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(seeds, "train_plans", broken)
    with pytest.raises(RuntimeError):
        run_seeds(config, [0, 1], progress=False)
    for seed in (0, 1):
        meta = json.loads((tmp_path / "seeds" / f"seed{seed}" / "run.json").read_text())
        assert meta["status"] == "failed" and meta["error"] == "RuntimeError: out of memory"


def _disk_full_in_torch_save(monkeypatch) -> None:
    """The first checkpoint.pt finds the disk full inside torch.save, whose zip writer turns
    the file's OSError into "RuntimeError: [enforce fail at inline_container.cc] unexpected
    pos ..." (what a real full disk gave)."""
    real, done = run_folder.write_atomically, []

    class FullDisk:
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

    def full(path, write):
        if Path(path).name != "checkpoint.pt" or done:
            return real(path, write)
        done.append(path)
        return real(path, lambda f: write(FullDisk()))

    monkeypatch.setattr(run_folder, "write_atomically", full)


@pytest.mark.parametrize("where, point, file", [
    (client_state, 1, "client_states/scaffold/client"),
    (client_state, 4, "client_states/scaffold/client"), (run_folder, 6, "run.json"),
    (None, 0, "checkpoint.pt")],
    ids=["first client state", "a later client state", "run.json", "checkpoint in torch.save"])
def test_a_full_disk_is_one_line_and_the_folder_resumes(where, point, file, tmp_path, capsys,
                                                         monkeypatch):
    folder = tmp_path / "run"
    if where is None:
        _disk_full_in_torch_save(monkeypatch)
    else:
        fail_halfway(monkeypatch, where, point, errno.ENOSPC)
    assert main(_argv(folder, "scaffold", 3)) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: disk full: cannot write {folder / file}"), line
    assert f"run --resume {folder}" in line and "RuntimeError" not in line, line
    assert not list(folder.rglob("*.tmp"))
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"
    monkeypatch.undo()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert main(_argv(folder, "scaffold", 3)) == 0
    assert main(_argv(tmp_path / "reference", "scaffold", 3)) == 0
    assert _final(folder) == _final(tmp_path / "reference")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 200 kB tmpfs (skipped where mount is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("cannot run mount here")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


def test_a_real_full_disk(tiny_disk, tmp_path, capsys):
    """The toy's run folder (a few kB a file) on a tmpfs filled up to 24 kB: the run stops
    with one line, leaves no .tmp, and finishes once the filler is gone."""
    toy = ["run", "--dataset", "toy", "--algorithm", "scaffold", "--momentum", "0",
           "--num-clients", "4", "--clients-per-round", "2", "--rounds", "4", "--device",
           "cpu", "--checkpoint-every", "1", "--run-dir"]
    stats = os.statvfs(tiny_disk)
    filler = tiny_disk / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - 24 * 1024))
    folder = tiny_disk / "run"
    assert main([*toy, str(folder)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: disk full: cannot write {folder}"), line
    assert not list(folder.rglob("*.tmp"))
    filler.unlink()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert main([*toy, str(folder)]) == 0
    assert main([*toy, str(tmp_path / "reference")]) == 0
    assert _final(folder) == _final(tmp_path / "reference")


# ---- inputs that are not a run ---------------------------------------------------------------
def test_an_empty_run_dir_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *TINY, "--rounds", "1", "--run-dir", ""]) == 2
    line = _one_error_line(capsys)  # RunConfig's own check, or the command line's
    assert "run_dir='' is invalid" in line or "--run-dir '' is empty" in line, line
    assert list(tmp_path.iterdir()) == []  # no curve dropped here
    with pytest.raises(ValueError, match="run_dir=''"):
        sim.run(RunConfig(rounds=1, run_dir=""), progress=False)


@pytest.mark.parametrize("value", [{"rounds": 1}, None, "config.json", 3, [RunConfig()]],
                         ids=["dict", "None", "str", "int", "list"])
def test_run_given_something_else_is_one_line(value):
    with pytest.raises(TypeError, match="^run\\(\\) expects a RunConfig, got [^\n]*$"):
        sim.run(value, progress=False)
    with pytest.raises(TypeError, match="^run_seeds\\(\\) expects a RunConfig, got [^\n]*$"):
        run_seeds(value, [0], progress=False)


@pytest.mark.parametrize("seeds", ["01", 3, [0, "1"], [1.5], [True]])
def test_run_seeds_given_odd_seeds_is_one_line(seeds):
    with pytest.raises(TypeError, match="^run_seeds expects [^\n]*$"):
        run_seeds(RunConfig(rounds=1), seeds, progress=False)
