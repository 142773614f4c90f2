"""run(config) -> History: sample, dispatch, train, aggregate, evaluate, checkpoint.

A run folder (``config.run_dir``) holds ``config.json``, ``metrics.jsonl`` (one line per
round), ``run.json`` (status: running, completed, diverged or interrupted by Ctrl-C; the
round of the last checkpoint; environment, code version), ``checkpoint.pt`` and, at the
end, ``global_model.pt``; the methods that keep per-client state add ``client_states/``
(:mod:`flnotes.engine.client_state`). A run that ends in an error (anything but Ctrl-C or
SIGTERM) is marked ``failed`` with the error's one line (run.json ``"error"``). Running a
config on an existing folder resumes from the last checkpoint; because every random draw is
derived from (seed, round, purpose), the resumed run ends in the same state as an
uninterrupted one.

What keeps a folder's results its own:

- settings: ``checkpoint.pt`` carries the run's settings and their hash
  (:func:`settings_hash`, all fields but RESUMABLE_CHANGES); a run under other settings is
  refused, whether or not ``config.json`` is still there;
- a lock: ``run.lock`` is held (``fcntl.flock``) while a run uses the folder, and a second
  run is refused with the holder's pid and host; the kernel drops the lock when its holder
  dies, so a killed run's folder is taken over at once;
- rounds: a folder that holds more rounds than asked is refused (never a model of another
  round count under a config.json that says otherwise);
- the end: ``run.json`` says ``completed`` only once ``global_model.pt`` and the metrics are
  written; a model found missing is rebuilt from the last checkpoint;
- damaged files: a ``checkpoint.pt`` or ``config.json`` that cannot be read is a one-line
  :class:`RunFolderError` naming the file (``run.json`` and ``metrics.jsonl`` are rewritten
  from the checkpoint on resume); so is a client-state file the checkpoint names that is
  missing, damaged, another run's or another client's or round's, found before the first
  resumed round (the checkpoint records each file's sha256);
- writes: every file but metrics.jsonl is written whole or not at all (a ``.tmp`` file,
  fsync, rename; :func:`~flnotes.engine.client_state.write_atomically`), with Ctrl-C and
  SIGTERM held until the write is done, so an interrupt mid-write stops the run as any
  interrupt does; a disk that is full or cannot be written is the one line "cannot write to
  run folder R: ..." (no ``.tmp`` left), and the folder resumes once it can be written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flnotes.algorithms import algorithm_class, build_strategy, settings_of
from flnotes.engine.backends import train_clients
from flnotes.engine.client_state import (
    ClientStateError,
    bind_stores,
    deferred_signals,
    write_atomically,
)
from flnotes.engine.history import History, code_version, environment_info
from flnotes.engine.state import clone_state, state_is_finite
from flnotes.engine.tasks import build_task, resolve_device
from flnotes.rng import seeded_cpu_rng, torch_generator

# Fields that may differ when resuming a run folder without changing its results. data_dir
# is where the data lie, not which data: a run folder committed from one machine continues
# on another whose copy sits elsewhere (the data's own source is recorded in run.json).
RESUMABLE_CHANGES = {"rounds", "checkpoint_every", "device", "backend", "compile", "run_dir",
                     "eval_batch_size", "download", "data_dir"}


class RunFolderError(ValueError):
    """A run folder that cannot be used for this run (one line: the folder or file, and why)."""


def check_config(config, caller: str = "run") -> None:
    """A one-line TypeError for something that is not a RunConfig (a dict, a path, None),
    and a ValueError for an empty run_dir, before anything deep inside trips on them.

    The engine does not import config (the layer above): a RunConfig is what has
    ``resolved``, ``replace`` and ``to_dict``.
    """
    if not all(callable(getattr(config, name, None))
               for name in ("resolved", "replace", "to_dict")):
        hint = (": build one with RunConfig.from_dict(values)" if isinstance(config, dict)
                else ": build one with RunConfig(...)")
        raise TypeError(f"{caller}() expects a RunConfig, got {type(config).__name__}{hint}")
    run_dir = getattr(config, "run_dir", None)
    if run_dir is not None and not str(run_dir).strip():
        raise ValueError(f"{caller}(): run_dir={run_dir!r} is empty; give a folder, or "
                         "run_dir=None to run without one")
    if run_dir is not None and "\0" in str(run_dir):  # else "embedded null byte", unnamed
        raise ValueError(f"{caller}(): run_dir={str(run_dir)!r:.80} holds a NUL byte; give a "
                         "folder's name")


def result_settings(config, *, seed: bool = True) -> dict:
    """The settings that make a run's results what they are: every resolved field but
    RESUMABLE_CHANGES (and, with ``seed=False``, the seed)."""
    values = config.resolved().to_dict()
    return {k: v for k, v in values.items()
            if k not in RESUMABLE_CHANGES and (seed or k != "seed")}


def settings_hash(config, *, seed: bool = True) -> str:
    """sha256 (hex) of :func:`result_settings`: the same for a config that may resume a
    folder (more rounds, another device), different for another lr, mu, ... or seed."""
    text = json.dumps(result_settings(config, seed=seed), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sample_clients(config, round: int) -> list[int]:
    """The clients that take part in a round (without replacement, sorted)."""
    g = torch_generator(config.seed, "sample", round)
    chosen = torch.randperm(config.num_clients, generator=g)[: config.clients_per_round]
    return sorted(chosen.tolist())


def initial_state(config, task):
    """The round-0 global model, the same for every algorithm given the seed."""
    with seeded_cpu_rng(config.seed, "init"):
        return clone_state(task.model_factory().state_dict())


class Simulation:
    """One run between rounds: its task, strategy, History and folder.

    :func:`run` drives one Simulation; :func:`flnotes.engine.seeds.run_seeds` drives several in
    lockstep and trains their clients together. A round is ``begin_round`` (sample and
    dispatch), training (the caller's), then ``end_round`` (aggregate, evaluate, record).
    """

    def __init__(self, config, *, task=None) -> None:
        check_config(config, "Simulation")
        self.config = config = config.resolved()
        config.check_device()  # before loading data: "no GPU here", not a CUDA traceback
        self.task = task if task is not None else build_task(config)
        device = resolve_device(config.device)
        environment = environment_info(device)
        if getattr(self.task, "data_source", ""):
            environment["data_source"] = self.task.data_source
        self.history = History(config=config.to_dict(), environment=environment,
                               code_version=code_version(), run_dir=config.run_dir)
        self.strategy = build_strategy(config, initial_state(config, self.task))
        # Its client-state files carry, and are checked against, this run's settings.
        bind_stores(self.strategy, settings_hash(config))
        self.start_round = 1
        self.run_dir = Path(config.run_dir) if config.run_dir else None
        self.finished = False  # a completed or diverged folder: nothing left to run
        self.checkpoint_round = 0  # round of the folder's last checkpoint (0: none yet)
        self._lock = None  # the open run.lock while this run holds its folder
        # CPU threads of the start this run resumes, where they differ from this one's.
        self.threads_changed: int | None = None
        self.error: str | None = None  # a failed run's error, one line
        if self.run_dir is not None:
            self._lock = lock_folder(self.run_dir)
            try:
                with _writing(self.run_dir):
                    self._open_folder()
            except BaseException as stop:
                if isinstance(stop, KeyboardInterrupt) and self.checkpoint_round is not None \
                        and not self.finished:
                    self.interrupt()  # the folder was read: it says it was stopped
                self.release()
                raise
        try:
            self.model = self.task.working_model()
        except KeyboardInterrupt:
            if not self.finished:
                self.interrupt()
            raise
        except Exception as err:
            if not self.finished:
                self.fail(err)
            raise

    def _open_folder(self) -> None:
        self.checkpoint_round = None  # not known (nor run.json right) until the folder is read
        # Checks and reads first (a Ctrl-C there leaves the folder as it was), then the writes
        # with Ctrl-C held until run.json is right, so that an interrupt marks it interrupted.
        saved = _check_folder(self.run_dir, self.config, self.strategy)
        with deferred_signals():
            self._start_folder(saved)

    def _start_folder(self, saved: dict | None) -> None:
        config, history, run_dir = self.config, self.history, self.run_dir
        self.start_round = _start_folder(run_dir, config, history, saved)
        self.checkpoint_round = self.start_round - 1
        before = _starts(run_dir) if self.start_round > 1 else []
        threads = history.environment.get("cpu_threads")
        if before and before[-1].get("cpu_threads") not in (None, threads):
            self.threads_changed = before[-1]["cpu_threads"]
        this = {"round": self.start_round, "cpu_threads": threads,
                "device": history.environment.get("device"), "code_version": history.code_version}
        history.environment["starts"] = before  # a finished folder, reloaded: no new start
        if history.status == "completed" and self.start_round > config.rounds:
            history.final_state = self.strategy.global_state
            self.finished = True
            # A run killed between its last checkpoint and its model, or a deleted model:
            # rebuilt from the checkpoint, which holds the same state; then run.json says
            # completed (keeping the environment of the run that trained it).
            model = run_dir / "global_model.pt"
            meta = _read_meta(run_dir)
            if not model.exists() or meta.get("status") != "completed":
                if not model.exists():
                    _atomic_save(self.strategy.global_state, model)
                if isinstance(meta.get("environment"), dict):
                    history.environment = meta["environment"]
                _write_meta(run_dir, history, self.checkpoint_round)
        elif history.status == "diverged":
            self.finished = True
        else:
            history.environment["starts"] = [*before, this]
            history.status = "running"
            # An interrupted folder says "running" again (and where it runs now).
            _write_meta(run_dir, history, self.checkpoint_round)

    def release(self) -> None:
        """Let go of the run folder's lock (a finished, interrupted or failed run)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def resumed(self) -> bool:
        """True when this run continues a run folder's checkpoint."""
        return not self.finished and self.start_round > 1

    @property
    def running(self) -> bool:
        """True while rounds are left and the run has not diverged."""
        return not self.finished and self.history.status == "running"

    def begin_round(self, rnd: int) -> tuple[list[int], list]:
        """The round's sampled clients and the states dispatched to them.

        A strategy that chooses its own clients (CluSamp) does so in ``select_clients``,
        from the same seeded stream the uniform sampling would use; None: uniform.
        """
        sizes = [self.task.num_samples(c) for c in range(self.config.num_clients)]
        clients = self.strategy.select_clients(
            rnd, sizes, self.config.clients_per_round,
            torch_generator(self.config.seed, "sample", rnd))
        if clients is None:
            clients = sample_clients(self.config, rnd)
        return clients, self.strategy.dispatch(rnd, clients)

    def end_round(self, rnd: int, clients, starts, results, seconds: float) -> dict:
        """Aggregate, evaluate, record and checkpoint; returns the round's metrics row."""
        with _writing(self.run_dir):  # aggregate writes client states too
            return self._end_round(rnd, clients, starts, results, seconds)

    def _end_round(self, rnd: int, clients, starts, results, seconds: float) -> dict:
        config, history, strategy = self.config, self.history, self.strategy
        tic = time.perf_counter()
        new_global = strategy.aggregate(rnd, results)
        samples = sum(r.num_samples for r in results)
        train_loss = sum(r.train_loss * r.num_samples for r in results) / samples
        row = {"round": rnd, "train_loss": train_loss, **_mean_extras(results)}
        if not math.isfinite(train_loss) or not state_is_finite(new_global):
            history.status = "diverged"
        elif rnd % config.eval_every == 0 or rnd == config.rounds:
            self.model.load_state_dict(new_global)
            row.update(self.task.evaluate(self.model, config.eval_batch_size))
            row.update(strategy.round_metrics(self.task))
        row["seconds"] = seconds + time.perf_counter() - tic
        history.rows.append(row)
        if config.record_states:
            history.trajectory.append({
                "round": rnd, "clients": clients,
                "dispatched": [clone_state(s) for s in starts],
                "local": [r.state for r in results], "global": clone_state(new_global)})
        if self.run_dir is not None:
            _append_row(self.run_dir, row)
            if history.status != "diverged" and rnd % config.checkpoint_every == 0:
                _save_checkpoint(self.run_dir, rnd, strategy, history, config)
                self.checkpoint_round = rnd
        return row

    def interrupt(self) -> None:
        """Record that the run was stopped (Ctrl-C, SIGTERM): status "interrupted" in run.json
        too, and let go of the folder."""
        self.history.status = "interrupted"
        self._record_end()

    def fail(self, err: BaseException) -> None:
        """Record that the run ended in an error: status "failed" and the error's one line in
        run.json (``tables`` lists failed runs apart), and let go of the folder."""
        self.history.status = "failed"
        self.error = f"{type(err).__name__}: {' '.join(str(err).split())}"
        self._record_end()

    def _record_end(self) -> None:
        """run.json for a run that stops here (if the folder was read), then release it."""
        if self.run_dir is not None and self._lock is not None \
                and self.checkpoint_round is not None:
            # Best effort: a full disk that stopped the run may refuse run.json too; the
            # checkpoint, not run.json, is what a resume starts from.
            with contextlib.suppress(OSError):
                _write_meta(self.run_dir, self.history, self.checkpoint_round, self.error)
        self.release()

    def finish(self) -> History:
        """Mark the run completed (unless it diverged), save the last checkpoint and model.

        Written in this order: checkpoint, global_model.pt, then run.json's status; a kill
        in between leaves run.json "running", and the next run rebuilds the model from the
        checkpoint.
        """
        history = self.history
        if self.finished:
            self.release()
            return history
        if history.status == "running":
            history.status = "completed"
        history.final_state = self.strategy.global_state
        if self.run_dir is not None:
            last = history.rows[-1]["round"] if history.rows else 0
            with _writing(self.run_dir):
                _save_checkpoint(self.run_dir, last, self.strategy, history, self.config,
                                 meta=False)
                _atomic_save(self.strategy.global_state, self.run_dir / "global_model.pt")
                self.checkpoint_round = last
                _write_meta(self.run_dir, history, last)
        self.finished = True
        self.release()
        return history


def run(config, *, progress: bool = True, task=None,
        on_round: Callable[[dict], None] | None = None) -> History:
    """Run (or resume, or reload) a federated training and return its History.

    ``on_round(row)`` is called with each round's metrics as soon as the round ends (the
    command line prints it there, so a redirected log grows while the run goes on). With
    ``progress``, a resumed run says so. Ctrl-C marks the run folder "interrupted" and
    re-raises the KeyboardInterrupt; running the config again resumes from the checkpoint.
    Any other error marks it "failed" (with the error) and is re-raised.
    """
    check_config(config)
    sim = Simulation(config, task=task)
    try:
        return _run_rounds(sim, progress, on_round)
    except KeyboardInterrupt:  # wherever it lands, before, in or after a round
        if not sim.finished:
            sim.interrupt()
        raise
    except Exception as err:
        if not sim.finished:
            sim.fail(err)
        raise
    finally:
        sim.release()


def ignored_settings(config) -> list[str]:
    """Warnings for settings a run would silently not use (the command line prints them):
    the method's own (``Strategy.config_warnings``)."""
    return list(algorithm_class(config.algorithm).config_warnings(config))


def _run_rounds(sim: Simulation, progress: bool, on_round) -> History:
    if sim.finished:
        return sim.finish()
    config = sim.config
    if progress:
        for line in ignored_settings(config):
            tqdm.write(line, file=sys.stderr)
    if sim.resumed and progress:
        tqdm.write(f"resuming {sim.run_dir} from round {sim.checkpoint_round}, its last "
                   f"checkpoint (rounds {sim.start_round}-{config.rounds} to run)")
        if sim.threads_changed is not None and sim.model is not None:
            tqdm.write(f"warning: {sim.run_dir} began with {sim.threads_changed} CPU threads "
                       f"and goes on with {sim.history.environment.get('cpu_threads')}: CPU "
                       "results may differ in the last bits (run.json records each start)")
    bar = tqdm(range(sim.start_round, config.rounds + 1), desc=config.algorithm,
               disable=not progress, initial=sim.start_round - 1, total=config.rounds)
    try:
        for rnd in bar:
            tic = time.perf_counter()
            clients, starts = sim.begin_round(rnd)
            results = train_clients(sim.task, sim.strategy, rnd, clients, starts, config)
            row = sim.end_round(rnd, clients, starts, results, time.perf_counter() - tic)
            if "accuracy" in row:
                bar.set_postfix(acc=f"{row['accuracy']:.3f}",
                                s_per_round=f"{row['seconds']:.2f}")
            if on_round is not None:
                on_round(row)
            if not sim.running:
                break
    finally:
        bar.close()
    return sim.finish()


EXIT_INTERRUPTED = 130  # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be: the run stops the same way
    (folder marked interrupted, resume hint), and the command exits 143."""


def exit_code(stop: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by Ctrl-C (130) or SIGTERM (143)."""
    return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED


@contextlib.contextmanager
def terminate_like_ctrl_c():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (the command
    line's runs and sweeps); the previous handler is put back after it."""
    import signal
    import threading

    def handler(signum, frame):
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interruption_report(run_dir: str | Path) -> str:
    """How far a stopped run folder got and how to go on (a line for the command line).

    Reads run.json and metrics.jsonl only: :meth:`Simulation.interrupt` has marked the
    folder "interrupted" (run and run_seeds call it on Ctrl-C).
    """
    run_dir = Path(run_dir)
    meta_file = run_dir / "run.json"
    if not meta_file.exists():
        return "interrupted before the first round; run the same command again to start over"
    try:
        meta = _read_json(meta_file)
    except RunFolderError as err:
        return f"{err}; run the same command again to resume from the last checkpoint"
    if meta.get("status") in ("completed", "diverged"):  # e.g. a seed that finished first
        return f"{meta['status']}; nothing to resume"
    last = _last_logged_round(run_dir / "metrics.jsonl")
    done = f"after round {last}" if last else "in its first round"
    checkpoint = meta.get("checkpoint_round")
    if checkpoint is None and (run_dir / "checkpoint.pt").exists():
        where = "the last checkpoint"  # a folder from before run.json named the round
    elif checkpoint:
        where = f"the last checkpoint (round {checkpoint})"
    else:
        every = meta.get("config", {}).get("checkpoint_every", "?")
        return (f"interrupted {done}, before the first checkpoint (one every {every} rounds); "
                "run the same command again to start over")
    return f"interrupted {done}; run the same command again to resume from {where}"


def _last_logged_round(metrics_file: Path) -> int:
    """The last round written to metrics.jsonl (0 if none; a half-written line is skipped)."""
    last = 0
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            try:
                last = int(json.loads(line)["round"])
            except (ValueError, KeyError, TypeError):
                continue
    return last


def _mean_extras(results) -> dict[str, float]:
    """Sample-weighted mean of numeric per-client extras (e.g. FML's personal_loss)."""
    names = {k for r in results for k, v in r.extra.items() if isinstance(v, (int, float))}
    out = {}
    for name in sorted(names):
        having = [r for r in results if name in r.extra]
        total = sum(r.num_samples for r in having)
        out[name] = sum(float(r.extra[name]) * r.num_samples for r in having) / total
    return out


# ---- run folder --------------------------------------------------------------------
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
        handle = open(run_dir / "run.lock", "a+")
    except OSError as err:
        raise RunFolderError(f"cannot use run folder {run_dir}: {_os_reason(err)}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunFolderError(f"run folder {run_dir} is in use by {holder}; wait for that run "
                             "to end, or choose another run_dir") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()
    except OSError as err:  # a full disk
        handle.close()
        raise RunFolderError(f"cannot write to run folder {run_dir}: {_os_reason(err)}"
                             ) from None
    return handle


@contextlib.contextmanager
def _writing(run_dir: Path | None):
    """An OSError while the block writes the run folder (a full disk, a folder made
    read-only, deleted) is the one line "cannot write to run folder R: why"."""
    if run_dir is None:
        yield
        return
    try:
        yield
    except OSError as err:
        raise RunFolderError(f"cannot write to run folder {run_dir}: {_os_reason(err)}"
                             ) from None


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
    out = []
    for k in sorted(wanted):
        if k in RESUMABLE_CHANGES:
            continue
        a, b = stored.get(k, defaults.get(k)), wanted.get(k, defaults.get(k))
        if a != b:
            out.append(f"{k}: {a!r} != {b!r}")
    return out


def _field_defaults(config) -> dict:
    """Each field's default for this config's method: common fields and its settings."""
    import dataclasses

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
        reason = " ".join(str(err).split())
        reason = reason if 0 < len(reason) <= 100 else ""
        raise RunFolderError(f"{checkpoint} is damaged and cannot be read "
                             f"({type(err).__name__}{': ' + reason if reason else ''}){fix}"
                             ) from None
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
    ``saved``; returns the next round."""
    config_file = run_dir / "config.json"
    finished = saved is not None and (saved["status"] == "diverged" or (
        saved["status"] == "completed" and int(saved["round"]) >= config.rounds))
    try:
        if not (finished and config_file.exists()):  # a finished run's config stays its own
            _write_text(config_file, config.to_json())
        if saved is None:
            _write_text(run_dir / "metrics.jsonl", "")
            _write_meta(run_dir, history, 0)
            return 1
        history.rows = list(saved["rows"])
        history.status = saved["status"]
        # Rewrite metrics to match the checkpoint (rounds after it are recomputed).
        _write_text(run_dir / "metrics.jsonl",
                    "".join(json.dumps(r) + "\n" for r in history.rows))
    except OSError as err:
        raise RunFolderError(f"cannot write to run folder {run_dir}: {_os_reason(err)}"
                             ) from None
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
    _write_json(run_dir / "run.json", meta)


def _write_json(path: Path, obj: dict) -> None:
    """Write to a temporary file and rename: a Ctrl-C mid-write must not leave half a file."""
    _write_text(path, json.dumps(obj, indent=2))


def _write_text(path: Path, text: str) -> None:
    data = text.encode()
    write_atomically(path, lambda f: f.write(data))


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
    write_atomically(path, lambda f: torch.save(obj, f))
