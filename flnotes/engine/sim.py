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
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flnotes.algorithms import algorithm_class, build_strategy

# The run folder and stop handling live in their own modules; the names used outside stay
# importable from here (flnotes.engine.sim.settings_hash, ...), as before the split. The round
# loop calls the folder's functions through the module, where tests replace them.
from flnotes.engine import run_folder
from flnotes.engine.backends import train_clients
from flnotes.engine.client_state import bind_stores, deferred_signals
from flnotes.engine.client_workers import ClientWorkers, default_workers, why_not
from flnotes.engine.history import History, code_version, environment_info
from flnotes.engine.run_folder import (  # noqa: F401
    RESUMABLE_CHANGES,
    RunFolderError,
    lock_folder,
    settings_hash,
)
from flnotes.engine.state import clone_state, state_is_finite
from flnotes.engine.stops import (  # noqa: F401
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    check_stop,
    exit_code,
    interruption_report,
    terminate_like_ctrl_c,
)
from flnotes.engine.tasks import build_task, resolve_device
from flnotes.engine.threads import idle_cores, task_multiply_adds, threads_for
from flnotes.engine.tracking import environment_tracker
from flnotes.messages import one_line
from flnotes.rng import seeded_cpu_rng, torch_generator


def check_config(config, caller: str = "run") -> None:
    """A one-line TypeError for something that is not a RunConfig (a dict, a path, None),
    and a ValueError for an empty run_dir, before anything deep inside trips on them.

    The engine does not import config (the layer above): a RunConfig is what has
    ``resolved``, ``replace`` and ``to_dict``.
    """
    if not all(callable(getattr(config, n, None)) for n in ("resolved", "replace", "to_dict")):
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
        environment = environment_info(resolve_device(config.device))
        if getattr(self.task, "data_source", ""):
            environment["data_source"] = self.task.data_source
        self.history = History(config=config.to_dict(), environment=environment,
                               code_version=code_version(), run_dir=config.run_dir)
        self.strategy = build_strategy(config, initial_state(config, self.task))
        # Its client-state files carry, and are checked against, this run's settings.
        bind_stores(self.strategy, run_folder.settings_hash(config))
        self.start_round = 1
        self.run_dir = Path(config.run_dir) if config.run_dir else None
        self.finished = False  # a completed or diverged folder: nothing left to run
        self.checkpoint_round = 0  # round of the folder's last checkpoint (0: none yet)
        self._lock = None  # the open run.lock while this run holds its folder
        self.threads_changed: int | None = None  # the resumed start's CPU threads, if not ours
        self.error: str | None = None  # a failed run's error, one line
        if self.run_dir is not None:
            self._lock = run_folder.lock_folder(self.run_dir)
            self.checkpoint_round = None  # not known (nor run.json right) until the folder is read
            try:
                # Checks and reads first (a Ctrl-C there leaves the folder as it was), then the
                # writes, Ctrl-C held until run.json is right (an interrupt then marks it so).
                with run_folder._writing(self.run_dir):
                    saved = run_folder._check_folder(self.run_dir, config, self.strategy)
                    with deferred_signals():
                        self._start_folder(saved)
            except BaseException as stop:
                if isinstance(stop, KeyboardInterrupt) and self.checkpoint_round is not None \
                        and not self.finished:
                    self.interrupt()  # the folder was read: it says it was stopped
                self.release()
                raise
        try:
            self.model = self.task.working_model()
        except KeyboardInterrupt:
            self.end_early(None)
            raise
        except Exception as err:
            self.end_early(err)
            raise

    def _start_folder(self, saved: dict | None) -> None:
        config, history, run_dir = self.config, self.history, self.run_dir
        self.start_round = run_folder._start_folder(run_dir, config, history, saved)
        self.checkpoint_round = self.start_round - 1
        before = run_folder._starts(run_dir) if self.start_round > 1 else []
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
            meta = run_folder._read_meta(run_dir)
            if not model.exists() or meta.get("status") != "completed":
                if not model.exists():
                    run_folder._atomic_save(self.strategy.global_state, model)
                if isinstance(meta.get("environment"), dict):
                    history.environment = meta["environment"]
                run_folder._write_meta(run_dir, history, self.checkpoint_round)
        elif history.status == "diverged":
            self.finished = True
        else:
            history.environment["starts"] = [*before, this]
            history.status = "running"
            # An interrupted folder says "running" again (and where it runs now).
            run_folder._write_meta(run_dir, history, self.checkpoint_round)

    def release(self) -> None:
        """Let go of the run folder's lock (a finished, interrupted or failed run)."""
        if self._lock is not None:
            run_folder.unlock_file(self._lock)
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
        with run_folder._writing(self.run_dir):  # aggregate writes client states too
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
                run_folder._append_row(self.run_dir, row)
                if history.status != "diverged" and rnd % config.checkpoint_every == 0:
                    run_folder._save_checkpoint(self.run_dir, rnd, strategy, history, config)
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
        self.error = f"{type(err).__name__}: {one_line(err)}"
        self._record_end()

    def end_early(self, err: Exception | None) -> None:
        """A run stopped before its end: marked interrupted (``err`` None: Ctrl-C, SIGTERM) or
        failed, unless it had finished; its folder let go either way."""
        if self.finished:
            return
        if err is None:
            self.interrupt()
        else:
            self.fail(err)

    def _record_end(self) -> None:
        """run.json for a run that stops here (if the folder was read), then release it."""
        if self._lock is not None and self.checkpoint_round is not None:  # a folder held, read
            # Best effort: a full disk that stopped the run may refuse run.json too; the
            # checkpoint, not run.json, is what a resume starts from.
            with contextlib.suppress(OSError):
                run_folder._write_meta(self.run_dir, self.history, self.checkpoint_round,
                                       self.error)
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
            with run_folder._writing(self.run_dir):
                run_folder._save_checkpoint(self.run_dir, last, self.strategy, history,
                                            self.config, meta=False)
                run_folder._atomic_save(self.strategy.global_state,
                                        self.run_dir / "global_model.pt")
                self.checkpoint_round = last
                run_folder._write_meta(self.run_dir, history, last)
        self.finished = True
        self.release()
        return history


def run(config, *, progress: bool = True, task=None,
        on_round: Callable[[dict], None] | None = None, track: bool = True,
        threads: int | None = None, client_workers: int | None = 1) -> History:
    """Run (or resume, or reload) a federated training and return its History.

    ``on_round(row)`` is called with each round's metrics as soon as the round ends (the
    command line prints it there, so a redirected log grows while the run goes on). With
    ``progress``, a resumed run says so. Ctrl-C marks the run folder "interrupted" and
    re-raises the KeyboardInterrupt; running the config again resumes from the checkpoint.
    Any other error marks it "failed" (with the error) and is re-raised.

    With ``track`` (the default), the environment's ``FLNOTES_LOGGERS`` (what ``sweep
    --logger`` sets for its cells) copies each round to TensorBoard / MLflow as well; the
    command line's ``run --logger`` keeps its own tracker and passes ``track=False``.

    ``threads``: torch's CPU threads for the run (None: flnotes/engine/threads.py's rule,
    one thread unless a large model finds idle cores); torch's count is restored after.

    ``client_workers``: train each round's clients in that many processes, one thread each
    (:mod:`flnotes.engine.client_workers`; the same results bit for bit). Where a run cannot,
    its clients train in turn and, with ``progress``, one line says why. None: flnotes picks
    (:func:`flnotes.engine.client_workers.default_workers`: the idle cores for a model of
    LeNet's size or more on a CPU, else 1), as ``flnotes run`` does without the flag.
    """
    check_config(config)
    if task is None:  # built here, so that the thread rule can look at its model
        resolved = config.resolved()
        resolved.check_device()  # before loading data: "no GPU here", not a CUDA traceback
        task = build_task(resolved)
    picked = client_workers is None  # flnotes picks: a method that cannot need not say so
    if picked:
        client_workers = default_workers(config, task_multiply_adds(task), idle_cores())
    if isinstance(client_workers, bool) or not isinstance(client_workers, int) \
            or client_workers < 1:
        raise ValueError(f"client_workers={client_workers!r} is invalid: give a whole number "
                         ">= 1 (1: the clients train in turn)")
    with threads_for(task, threads, on_gpu=resolve_device(config.device).type == "cuda"):
        sim = Simulation(config, task=task)
        try:  # a bad FLNOTES_LOGGERS (unknown name, package missing) lets go of the folder
            tracker = environment_tracker(sim.config) if track else None
        except BaseException:
            sim.release()
            raise
        if tracker:
            def on_round(row, _given=on_round):
                tracker.log_round(row)
                if _given is not None:
                    _given(row)
        status, reloaded = "failed", sim.finished
        try:
            history = _run_rounds(sim, progress, on_round, client_workers, picked)
            status = history.status
            if tracker and reloaded:
                tracker.backfill(history.rows)  # a finished folder reloaded: its rounds, once
            return history
        except KeyboardInterrupt:  # wherever it lands, before, in or after a round
            status = "interrupted"
            sim.end_early(None)
            raise
        except Exception as err:
            sim.end_early(err)
            raise
        finally:
            if tracker:
                tracker.close(status)
            sim.release()


def ignored_settings(config) -> list[str]:
    """Warnings for settings a run would silently not use (the command line prints them):
    the method's own (``Strategy.config_warnings``)."""
    return list(algorithm_class(config.algorithm).config_warnings(config))


def _run_rounds(sim: Simulation, progress: bool, on_round, workers: int, picked: bool) -> History:
    if sim.finished:
        return sim.finish()
    config = sim.config
    if progress:
        for line in ignored_settings(config):
            tqdm.write(line, file=sys.stderr)
    if sim.resumed and progress:
        tqdm.write(f"resuming {sim.run_dir} from round {sim.checkpoint_round}, its last "
                   f"checkpoint (rounds {sim.start_round}-{config.rounds} to run)")
        if sim.threads_changed is not None:
            tqdm.write(f"warning: {sim.run_dir} began with {sim.threads_changed} CPU threads "
                       f"and goes on with {sim.history.environment.get('cpu_threads')}: CPU "
                       "results may differ in the last bits (run.json records each start)")
    reason = why_not(config, sim.strategy, workers)
    if reason is not None:
        if progress and not picked:
            tqdm.write(f"client_workers={workers}: the clients train in turn ({reason})",
                       file=sys.stderr)
        workers = 1
    bar = tqdm(range(sim.start_round, config.rounds + 1), desc=config.algorithm,
               disable=not progress, initial=sim.start_round - 1, total=config.rounds)
    pool = ClientWorkers(sim.task, workers) if workers > 1 else None
    try:
        for rnd in bar:
            check_stop()  # a caller's stop (stops.stop_when), between rounds as Ctrl-C
            tic = time.perf_counter()
            clients, starts = sim.begin_round(rnd)
            results = (pool.train(sim.strategy, rnd, clients, starts, config) if pool is not None
                       else train_clients(sim.task, sim.strategy, rnd, clients, starts, config))
            row = sim.end_round(rnd, clients, starts, results, time.perf_counter() - tic)
            if "accuracy" in row:
                bar.set_postfix(acc=f"{row['accuracy']:.3f}", s_per_round=f"{row['seconds']:.2f}")
            if on_round is not None:
                on_round(row)
            if not sim.running:
                break
    finally:
        bar.close()
        if pool is not None:
            pool.close()
    return sim.finish()


def _mean_extras(results) -> dict[str, float]:
    """Sample-weighted mean of numeric per-client extras (e.g. FML's personal_loss)."""
    names = {k for r in results for k, v in r.extra.items() if isinstance(v, (int, float))}
    out = {}
    for name in sorted(names):
        having = [r for r in results if name in r.extra]
        total = sum(r.num_samples for r in having)
        out[name] = sum(float(r.extra[name]) * r.num_samples for r in having) / total
    return out
