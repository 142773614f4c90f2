"""The run folder: what keeps its results its own, and every write into it.

:mod:`flnotes.engine.sim` lists the folder's files and says what each guard (settings, lock,
rounds, the end, damaged files, writes) promises; this module keeps them: the settings hash
and its check, the lock, reading and writing each file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import socket
import time
import traceback
from pathlib import Path

import torch

from flnotes.algorithms import settings_of
from flnotes.engine import client_state
from flnotes.engine.client_state import (
    ClientStateError,
    deferred_signals,
    write_atomically,
)
from flnotes.engine.history import History
from flnotes.engine.tasks import resolve_device
from flnotes.messages import one_line

# Fields that may differ when resuming a run folder without changing its results. data_dir
# is where the data lie, not which data: a run folder committed from one machine continues
# on another whose copy sits elsewhere (the data's own source is recorded in run.json).
RESUMABLE_CHANGES = {"rounds", "checkpoint_every", "device", "backend", "compile", "run_dir",
                     "eval_batch_size", "download", "data_dir"}


class RunFolderError(ValueError):
    """A run folder that cannot be used for this run (one line: the folder or file, and why)."""


class DiskFullError(RunFolderError):
    """No room left for a file being written (a full disk, a used-up quota): one line saying
    so, naming the file and how to go on."""


# What a write that found no room fails with: a full disk, or the user's quota used up.
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def write_failure(err: BaseException) -> OSError | None:
    """The OSError behind a failed write: ``err`` itself, or the one torch.save's zip writer
    met (it raises its own RuntimeError, "[enforce fail at inline_container.cc] unexpected
    pos ...", with the file object's OSError as its context); None for anything else."""
    if isinstance(err, OSError):
        return err
    behind = err.__cause__ or err.__context__
    return behind if isinstance(err, RuntimeError) and isinstance(behind, OSError) else None


def disk_full(file, then: str) -> DiskFullError:
    """The one line for a write that found no room: the file, and ``then`` (how to go on)."""
    return DiskFullError(f"disk full: cannot write {file} (no space left on the device); "
                         f"free some space, then {then}")


def _written_file(err: OSError, run_dir: Path) -> str:
    """The file a failed write was writing: the error's own file name, else (a file object's
    write says none) the path that write_atomically was given, from the traceback, as it
    lives in client_state and its error reaches here unchanged; else the folder."""
    if getattr(err, "filename", None):
        return str(err.filename)
    for frame, _ in traceback.walk_tb(err.__traceback__):
        if frame.f_code is client_state.write_atomically.__code__:
            return str(frame.f_locals.get("path", run_dir))
    return str(run_dir)


def _write_error(err: BaseException, run_dir: Path) -> RunFolderError | None:
    """The one-line error for a write into ``run_dir`` that failed with ``err`` (None: not a
    failed write, so not ours to rename)."""
    cause = write_failure(err)
    if cause is None:
        return None
    if cause.errno in NO_SPACE:
        return disk_full(_written_file(cause, run_dir),
                         f"`python -m flnotes run --resume {run_dir}` (or the same command "
                         "again) continues the run from its last checkpoint")
    return RunFolderError(f"cannot write to run folder {run_dir}: {_os_reason(cause)}")


def result_settings(config, *, seed: bool = True) -> dict:
    """The settings that make a run's results what they are: every resolved field but
    RESUMABLE_CHANGES (and, with ``seed=False``, the seed)."""
    return {k: v for k, v in config.resolved().to_dict().items()
            if k not in RESUMABLE_CHANGES and (seed or k != "seed")}


def settings_hash(config, *, seed: bool = True) -> str:
    """sha256 (hex) of :func:`result_settings`: the same for a config that may resume a
    folder (more rounds, another device), different for another lr, mu, ... or seed."""
    text = json.dumps(result_settings(config, seed=seed), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def lock_folder(run_dir: Path):
    """Create the folder and hold its ``run.lock``; refuse if another run holds it.

    ``fcntl.flock`` is dropped by the kernel when the holder's process ends, however it
    ends, so a lock left by a killed run is taken over without a word. Returns the open
    lock file (closing it lets go).
    """
    try:
        if run_dir.exists() and not run_dir.is_dir():
            raise RunFolderError(f"run folder {run_dir} is a file, not a folder; choose "
                                 "another run_dir")
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunFolderError(f"cannot use run folder {run_dir}: {_os_reason(err)}") from None
    try:
        held = lock_file(run_dir / "run.lock")
    except OSError as err:  # a full disk, or a folder we may not write
        if isinstance(err, (PermissionError, FileNotFoundError)):
            raise RunFolderError(f"cannot use run folder {run_dir}: {_os_reason(err)}") \
                from None
        raise _write_error(err, run_dir) from None
    if isinstance(held, str):
        raise RunFolderError(f"run folder {run_dir} is in use by {held}; wait for that run "
                             "to end, or choose another run_dir") from None
    return held


def lock_file(path: Path):
    """Open ``path`` and hold it (:func:`hold_lock`): the open file, or the holder's line.

    The file is removed when its holder lets go (:func:`unlock_file`), so a finished folder
    keeps no lock file. A process that opened the file just before it was removed holds a
    file no longer at ``path``: it opens the new one and tries again."""
    for _ in range(5):
        held = hold_lock(open(path, "a+"))
        if isinstance(held, str):
            return held
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(held.fileno()).st_ino:
                return held
        held.close()
    raise OSError(f"{path} keeps being removed while taken; another process is cleaning it")


def unlock_file(handle) -> None:
    """Let go of a lock taken by :func:`lock_file`, removing its file first (while still
    held, so no other process can hold the old file after it)."""
    with contextlib.suppress(OSError):
        os.unlink(handle.name)
    handle.close()


def hold_lock(handle):
    """Take ``handle``'s file with ``fcntl.flock`` and write who holds it: the open file
    (closing it lets go; the kernel drops it when the process ends), or the holder's line
    ("pid N on HOST since T") when another process holds it (``handle`` is then closed).
    An OSError while writing the line closes the file and is raised."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return holder
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()
    except OSError:
        handle.close()
        raise
    return handle


@contextlib.contextmanager
def _writing(run_dir: Path | None):
    """An OSError while the block writes the run folder (a folder made read-only, deleted)
    is the one line "cannot write to run folder R: why"; a full disk (torch.save's
    RuntimeError too) says so, with the file and how the folder resumes."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        mapped = None if run_dir is None else _write_error(err, run_dir)
        if mapped is None:  # no folder, or a RuntimeError of the training itself: not a write
            raise
        raise mapped from None


def _os_reason(err: OSError) -> str:
    """'Is a directory', 'Permission denied', ...: an OSError without its errno prefix."""
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    return f"{err.strerror or err}{where}"


def _differences(stored: dict, wanted: dict, defaults: dict) -> list[str]:
    """'field: stored != wanted' for each result setting that differs.

    The settings compared are the wanted run's: the common fields and its method's own (a
    folder written before settings belonged to methods also holds every other method's, which
    this run never reads). A field the folder lacks counts as its default.
    """
    pairs = ((k, stored.get(k, defaults.get(k)), wanted.get(k, defaults.get(k)))
             for k in sorted(wanted) if k not in RESUMABLE_CHANGES)
    return [f"{k}: {a!r} != {b!r}" for k, a, b in pairs if a != b]


def _field_defaults(config) -> dict:
    """Each field's default for this config's method: common fields and its settings."""
    values = {f.name: f.default for f in dataclasses.fields(config)
              if f.default is not dataclasses.MISSING}
    values.update((n, s.default) for n, s in settings_of(config.algorithm).items())
    return values


def _read_json(path: Path, what: str = "") -> dict:
    """A JSON object from a run folder's file, or RunFolderError naming the file."""
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunFolderError(f"{path} is damaged (not JSON: {err}){what}") from None
    except OSError as err:
        raise RunFolderError(f"cannot read {path}: {_os_reason(err)}") from None
    if not isinstance(value, dict):
        raise RunFolderError(f"{path} is damaged (a JSON {type(value).__name__}, not an "
                             f"object){what}")
    return value


def _load_checkpoint(checkpoint: Path, config) -> dict:
    """checkpoint.pt, checked: readable, complete, written under these settings."""
    fix = "; delete it (or the run folder) to start the run over"
    try:
        # Onto this run's device: a run checkpointed on a GPU resumes on a CPU and vice versa.
        saved = torch.load(checkpoint, map_location=resolve_device(config.device),
                           weights_only=True)
    except Exception as err:  # truncated, empty, garbage: torch raises many kinds
        reason = one_line(err)
        reason = f": {reason}" if 0 < len(reason) <= 100 else ""
        raise RunFolderError(f"{checkpoint} is damaged and cannot be read "
                             f"({type(err).__name__}{reason}){fix}") from None
    missing = [k for k in ("round", "strategy", "rows", "status")
               if not isinstance(saved, dict) or k not in saved]
    if missing:
        raise RunFolderError(f"{checkpoint} is damaged: no {', '.join(missing)} in it{fix}")
    if "settings_hash" in saved and saved["settings_hash"] != settings_hash(config):
        differing = _differences(saved.get("settings") or {}, result_settings(config),
                                 _field_defaults(config))
        if differing or not saved.get("settings"):
            details = ", ".join(differing) or "settings hash differs"
            raise RunFolderError(
                f"{checkpoint} was written by a run with other settings ({details}); "
                "choose another run_dir or delete that folder")
    return saved


def _check_folder(run_dir: Path, config, strategy) -> dict | None:
    """Check the (locked) folder holds this config, and load its checkpoint (None: none)
    into the strategy; nothing is written here (:func:`_start_folder` writes)."""
    config_file = run_dir / "config.json"
    if config_file.exists():
        stored = _read_json(config_file, "; delete it (the checkpoint keeps the settings) "
                                         "or the run folder")
        differing = _differences(stored, config.to_dict(), _field_defaults(config))
        if differing:
            raise RunFolderError(f"run folder {run_dir} holds a different run "
                                 f"({', '.join(differing)}); choose another run_dir or "
                                 "delete that folder")
    checkpoint = run_dir / "checkpoint.pt"
    saved = _load_checkpoint(checkpoint, config) if checkpoint.exists() else None
    if saved is not None and int(saved["round"]) > config.rounds:
        held = int(saved["round"])
        raise RunFolderError(
            f"run folder {run_dir} holds {held} rounds (its checkpoint), more than the "
            f"{config.rounds} asked; ask for rounds >= {held} to resume or reload it, or "
            "choose another run_dir for a shorter run")
    if saved is not None:
        try:  # its client-state files are checked here, before anything is written
            strategy.load_state_dict(saved["strategy"])
        except ClientStateError as err:
            raise RunFolderError(str(err)) from None
    return saved


def _start_folder(run_dir: Path, config, history: History, saved: dict | None) -> int:
    """Start the checked folder (config.json, metrics, run.json) or resume its checkpoint
    ``saved``; returns the next round. Called inside :func:`_writing`, which names a failed
    write."""
    config_file = run_dir / "config.json"
    finished = saved is not None and (saved["status"] == "diverged" or (
        saved["status"] == "completed" and int(saved["round"]) >= config.rounds))
    if not (finished and config_file.exists()):  # a finished run's config stays its own
        _write_text(config_file, config.to_json())
    if saved is None:
        _write_text(run_dir / "metrics.jsonl", "")
        _write_meta(run_dir, history, 0)
        return 1
    history.rows = list(saved["rows"])
    history.status = saved["status"]
    # Rewrite metrics to match the checkpoint (rounds after it are recomputed).
    _write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in history.rows))
    return int(saved["round"]) + 1


def _read_meta(run_dir: Path) -> dict:
    """run.json as written, or {} if it is missing or cannot be read."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _starts(run_dir: Path) -> list[dict]:
    """Each earlier start of a resumed folder (round, CPU threads, device), from run.json.

    run.json is rewritten from the checkpoint on every start: one that cannot be read is
    no loss but its list of starts.
    """
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        env = meta.get("environment") or {}
        starts = env.get("starts") or [{"round": 1, "cpu_threads": env.get("cpu_threads"),
                                        "device": env.get("device")}]
        return [s for s in starts if isinstance(s, dict)]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def _append_row(run_dir: Path, row: dict) -> None:
    # Appended, not renamed (a half line is skipped on reading), but whole if interrupted.
    with deferred_signals(), open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _write_meta(run_dir: Path, history: History, checkpoint_round: int,
                error: str | None = None) -> None:
    # checkpoint_round: what an interrupted run can resume from, without loading the .pt.
    meta = {k: v for k, v in history.summary().items() if k != "rows"}
    meta["checkpoint_round"] = checkpoint_round
    if error is not None:  # a failed run: why, in one line
        meta["error"] = error
    _write_text(run_dir / "run.json", json.dumps(meta, indent=2))


def _write_text(path: Path, text: str) -> None:
    """Written whole or not at all (a Ctrl-C mid-write leaves no half file): as _atomic_save."""
    with _naming(path):
        write_atomically(path, lambda f: f.write(text.encode()))


@contextlib.contextmanager
def _naming(path: Path):
    """A failed write of ``path`` as an OSError that names it: a file object's write says no
    file, and torch.save's zip writer turns the OSError it met into a RuntimeError."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        cause = write_failure(err)
        if cause is None or (cause is err and err.filename):
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from None


def _save_checkpoint(run_dir: Path, rnd: int, strategy, history: History, config,
                     meta: bool = True) -> None:
    """checkpoint.pt: the strategy, the rows, the status and the settings it belongs to."""
    _atomic_save({"round": rnd, "strategy": strategy.state_dict(), "rows": history.rows,
                  "status": history.status, "settings": result_settings(config),
                  "settings_hash": settings_hash(config)}, run_dir / "checkpoint.pt")
    if meta:
        _write_meta(run_dir, history, rnd)


def _atomic_save(obj, path: Path) -> None:
    """Write to a temporary file and rename, so a killed run never leaves half a file (and
    a Ctrl-C inside torch.save waits for it: see :func:`write_atomically`)."""
    with _naming(path):
        write_atomically(path, lambda f: torch.save(obj, f))
