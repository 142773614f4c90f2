"""Bad inputs and failing disks met by the command line: each ends in one line (exit 2), and
what was written is whole (no half file for a later call to take as a finished one)."""

import errno
import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flnotes
from flnotes.cli.main import main
from flnotes.repro import notebooks


def _error_line(capsys) -> str:
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    errors = [line for line in (out.out + out.err).splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: "), out.out + out.err
    return errors[0]


# ---- notebooks DEST ------------------------------------------------------------------------
def test_notebooks_on_a_full_disk_leave_no_half_copy_and_copy_it_next_time(tmp_path, capsys,
                                                                           monkeypatch):
    real, count = notebooks.write_atomically, [0]

    def full_at_the_third(path, write):
        count[0] += 1
        if count[0] != 3:
            return real(path, write)

        def half(f):
            f.write(b'{"cells": [')
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, half)

    monkeypatch.setattr(notebooks, "write_atomically", full_at_the_third)
    dest = tmp_path / "nb"
    assert main(["notebooks", str(dest)]) == 2
    line = _error_line(capsys)
    names = sorted(p.name for p in notebooks.NOTEBOOK_DIR.glob("*.ipynb"))
    third = dest / names[2]
    assert line.startswith(f"error: disk full: cannot write {third} "), line
    assert str(notebooks.NOTEBOOK_DIR) not in line  # the package's file is not the problem
    assert sorted(p.name for p in dest.iterdir()) == names[:2]  # no half copy, no .tmp
    monkeypatch.undo()
    assert main(["notebooks", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"kept {third}" not in out and f"kept {dest / names[0]}" in out
    assert third.read_bytes() == (notebooks.NOTEBOOK_DIR / names[2]).read_bytes()


def test_notebooks_into_an_unwritable_folder_names_the_destination(tmp_path, capsys,
                                                                   monkeypatch):
    def refused(path, write):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(notebooks, "write_atomically", refused)
    assert main(["notebooks", str(tmp_path / "nb")]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: cannot use {tmp_path / 'nb'}"), line
    assert line.endswith(": no permission to write there; choose a folder you can write to "
                         "(Permission denied)"), line


def test_a_destination_under_a_file_says_so(tmp_path, capsys):
    """demo --out and sweep --out under a file: the path, and that a part of it is a file
    (the system's bare 'Not a directory: PATH' before)."""
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--quick", "--out", str(tmp_path / "file" / "demo")]) == 2
    line = _error_line(capsys)
    assert f"cannot use {tmp_path / 'file'}" in line, line
    assert "a part of that path is a file, not a folder (Not a directory)" in line


# ---- small ones: flags that did nothing, empty paths, a resume line, a huge size -----------
TINY = ["--num-clients", "4", "--clients-per-round", "2", "--data-option", "num_train=400",
        "--data-option", "num_test=100", "--device", "cpu"]


def test_a_download_without_a_network_says_what_failed_and_what_to_do(tmp_path, monkeypatch):
    """The network's refusal (torchvision's urlopen) is one line naming the dataset, the
    folder and the way without a network, not "<urlopen error ...>" alone."""
    import urllib.error

    from flnotes.data import DATASETS, load_dataset

    def offline(*args, **kwargs):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setitem(DATASETS, "cifar10", offline)
    with pytest.raises(ConnectionError, match=f"downloading cifar10 into {tmp_path} failed "
                       r"\(\[Errno -2\] Name or service not known\): without a network, copy"):
        load_dataset("cifar10", data_dir=tmp_path, download=True)


@pytest.mark.parametrize("flags, name", [(["--lr", "1e308"], "lr"),
                                         (["--weight-decay", "1e39"], "weight_decay"),
                                         (["--algorithm", "fedgen", "--fedgen-lr", "1e308"],
                                          "fedgen_lr")])
def test_a_number_float32_cannot_hold_is_refused_up_front(tmp_path, capsys, flags, name):
    """Finite but beyond float32: the optimizer failed in round 1 with an 'unexpected'
    overflow (the loop backend) or the run read as diverged (vmap)."""
    assert main(["run", *TINY, "--rounds", "1", *flags, "--run-dir", str(tmp_path / "r")]) == 2
    assert _error_line(capsys).startswith(f"error: RunConfig.{name}=1e+")
    assert not (tmp_path / "r").exists()


def test_every_missing_logger_package_is_named_at_once(monkeypatch):
    import importlib.util

    from flnotes.engine.tracking import TrackingError, check_installed

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TrackingError, match=r"^--logger tensorboard,mlflow needs the "
                       r"tensorboard and mlflow packages: pip install "
                       r"'flnotes\[tensorboard,mlflow\]'$"):
        check_installed(["tensorboard", "mlflow"])
    with pytest.raises(TrackingError, match=r"^--logger mlflow needs the mlflow package: "
                       r"pip install 'flnotes\[mlflow\]'$"):
        check_installed(["mlflow"])


def test_seeds_are_not_written_into_a_single_runs_folder(tmp_path, capsys):
    single = tmp_path / "r"
    assert main(["run", *TINY, "--rounds", "1", "--run-dir", str(single)]) == 0
    capsys.readouterr()
    assert main(["run", *TINY, "--rounds", "1", "--seeds", "0,1", "--run-dir",
                 str(single)]) == 2
    assert _error_line(capsys).startswith(f"error: {single} holds one run (its run.json)")
    assert not (single / "seed0").exists()


def test_seed_and_seeds_together_are_refused_not_one_dropped(tmp_path, capsys):
    assert main(["run", *TINY, "--seeds", "0,1", "--seed", "5", "--run-dir",
                 str(tmp_path / "r")]) == 2
    assert _error_line(capsys) == ("error: give --seed 5 or --seeds 0,1, not both (--seeds "
                                   "runs each seed it names)")
    assert not (tmp_path / "r").exists()


def test_run_refuses_logger_dir_without_logger_as_sweep_does(tmp_path, capsys):
    assert main(["run", *TINY, "--rounds", "1", "--logger-dir", str(tmp_path / "logs"),
                 "--run-dir", str(tmp_path / "r")]) == 2
    assert _error_line(capsys) == ("error: --logger-dir says where --logger writes: add "
                                   "--logger tensorboard (or mlflow)")
    assert not (tmp_path / "r").exists() and not (tmp_path / "logs").exists()


def test_an_empty_destination_is_refused_not_the_current_folder(tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["notebooks", ""]) == 2
    assert "'' is not a folder's name" in _error_line(capsys)
    assert main(["sweep", "fedqp_figures", "--smoke", "--out", " "]) == 2  # not runs/sweeps/...
    assert "--out ' ' is not a folder's name" in _error_line(capsys)
    assert not (tmp_path / "runs").exists()
    assert main(["demo", "--quick", "--out", ""]) == 2
    assert "--out '' is not a folder's name" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_the_resume_line_comes_only_once_the_folder_is_accepted(tmp_path, capsys):
    folder = tmp_path / "r"
    assert main(["run", *TINY, "--rounds", "2", "--run-dir", str(folder)]) == 0
    capsys.readouterr()
    with open(folder / "run.lock", "a+") as held:  # another run holds the folder
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["run", *TINY, "--rounds", "3", "--run-dir", str(folder)]) == 2
        out = capsys.readouterr()
        assert "resuming" not in out.out + out.err, out.out
        assert "is in use" in out.err
    assert main(["run", *TINY, "--rounds", "3", "--run-dir", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"resuming {folder} from round 2") and \
        lines[1].startswith("round    3"), lines


def test_a_data_option_too_large_for_memory_is_named(tmp_path, capsys):
    assert main(["run", "--num-clients", "4", "--clients-per-round", "2", "--rounds", "1",
                 "--device", "cpu", "--data-option", "num_train=1000000000000",
                 "--run-dir", str(tmp_path / "r")]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: --data-option num_train=1000000000000 is too large: the "
                           "data do not fit in memory"), line


def test_a_lock_taken_on_a_file_just_removed_is_taken_again_on_the_new_one(tmp_path,
                                                                           monkeypatch):
    """run.lock and cell.lock are removed when let go. A process that opened the old file
    just before and then got its lock holds a file no longer at the path; lock_file sees the
    inode differ and takes the file that is there, so two processes never both hold."""
    from flnotes.engine import run_folder

    path = tmp_path / "run.lock"
    real_hold, calls = run_folder.hold_lock, []

    def hold_then_lose_the_file(handle):
        held = real_hold(handle)
        if not calls:  # the first take: another process lets go and removes the file now
            path.unlink()
            path.write_text("")
        calls.append(held)
        return held

    monkeypatch.setattr(run_folder, "hold_lock", hold_then_lose_the_file)
    held = run_folder.lock_file(path)
    assert len(calls) == 2 and calls[0].closed
    assert os.fstat(held.fileno()).st_ino == os.stat(path).st_ino
    with open(path, "a+") as other:  # the file at the path is the one held
        with pytest.raises(OSError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    run_folder.unlock_file(held)
    assert not path.exists() and held.closed


def test_done_in_counts_the_start_up_the_user_waited_for(tmp_path):
    """'done in X s' of `python -m flnotes ...` is the whole wait, the interpreter's start and
    the imports (torch's: most of a short command) included, not the command's work alone."""
    env = {k: v for k, v in os.environ.items() if k != "FLNOTES_TRACEBACK"}
    env.update(OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(flnotes.__file__).parents[1]),
                                           env.get("PYTHONPATH", "")]))
    tic = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flnotes", "methods"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - tic
    assert done.returncode == 0, done.stderr
    took = float(re.search(r"done in ([\d.]+) s", done.stderr).group(1))
    assert "done in" not in done.stdout  # the output (a markdown table) stays the command's
    assert 0.5 * wall <= took <= wall + 0.1, (took, wall)
