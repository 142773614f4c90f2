"""run(config) -> History: sample, dispatch, train, aggregate, evaluate, checkpoint.

A run folder (``config.run_dir``) holds ``config.json``, ``metrics.jsonl`` (one line per
round), ``run.json`` (status: running, completed, diverged or interrupted by Ctrl-C; the
round of the last checkpoint; environment, code version), ``checkpoint.pt`` and, at the
end, ``global_model.pt``. Running a config on an existing folder resumes from the last
checkpoint; because every random draw is derived from (seed, round, purpose), the
resumed run ends in the same state as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flnotes.algorithms import build_strategy
from flnotes.engine.backends import train_clients
from flnotes.engine.history import History, code_version, environment_info
from flnotes.engine.state import clone_state, state_is_finite
from flnotes.engine.tasks import build_task, resolve_device
from flnotes.rng import seeded_cpu_rng, torch_generator

# Fields that may differ when resuming a run folder without changing its results.
RESUMABLE_CHANGES = {"rounds", "checkpoint_every", "device", "backend", "compile", "run_dir",
                     "eval_batch_size", "download"}


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
        self.start_round = 1
        self.run_dir = Path(config.run_dir) if config.run_dir else None
        self.finished = False  # a completed or diverged folder: nothing left to run
        self.checkpoint_round = 0  # round of the folder's last checkpoint (0: none yet)
        if self.run_dir is not None:
            history = self.history
            self.start_round = _prepare_folder(self.run_dir, config, history, self.strategy)
            self.checkpoint_round = self.start_round - 1
            if history.status == "completed" and self.start_round > config.rounds:
                history.final_state = self.strategy.global_state
                self.finished = True
            elif history.status == "diverged":
                self.finished = True
            else:
                history.status = "running"
                # An interrupted folder says "running" again (and where it runs now).
                _write_meta(self.run_dir, history, self.checkpoint_round)
        self.model = self.task.working_model()

    @property
    def resumed(self) -> bool:
        """True when this run continues a run folder's checkpoint."""
        return not self.finished and self.start_round > 1

    @property
    def running(self) -> bool:
        """True while rounds are left and the run has not diverged."""
        return not self.finished and self.history.status == "running"

    def begin_round(self, rnd: int) -> tuple[list[int], list]:
        """The round's sampled clients and the states dispatched to them."""
        clients = sample_clients(self.config, rnd)
        return clients, self.strategy.dispatch(rnd, clients)

    def end_round(self, rnd: int, clients, starts, results, seconds: float) -> dict:
        """Aggregate, evaluate, record and checkpoint; returns the round's metrics row."""
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
                _save_checkpoint(self.run_dir, rnd, strategy, history)
                self.checkpoint_round = rnd
        return row

    def interrupt(self) -> None:
        """Record that the run was stopped (Ctrl-C): status "interrupted" in run.json too."""
        self.history.status = "interrupted"
        if self.run_dir is not None:
            _write_meta(self.run_dir, self.history, self.checkpoint_round)

    def finish(self) -> History:
        """Mark the run completed (unless it diverged), save the last checkpoint and model."""
        history = self.history
        if self.finished:
            return history
        if history.status == "running":
            history.status = "completed"
        history.final_state = self.strategy.global_state
        if self.run_dir is not None:
            last = history.rows[-1]["round"] if history.rows else 0
            _save_checkpoint(self.run_dir, last, self.strategy, history)
            _atomic_save(self.strategy.global_state, self.run_dir / "global_model.pt")
        self.finished = True
        return history


def run(config, *, progress: bool = True, task=None,
        on_round: Callable[[dict], None] | None = None) -> History:
    """Run (or resume, or reload) a federated training and return its History.

    ``on_round(row)`` is called with each round's metrics as soon as the round ends (the
    command line prints it there, so a redirected log grows while the run goes on). With
    ``progress``, a resumed run says so. Ctrl-C marks the run folder "interrupted" and
    re-raises the KeyboardInterrupt; running the config again resumes from the checkpoint.
    """
    sim = Simulation(config, task=task)
    if sim.finished:
        return sim.history
    config = sim.config
    if sim.resumed and progress:
        tqdm.write(f"resuming {sim.run_dir} from round {sim.checkpoint_round}, its last "
                   f"checkpoint (rounds {sim.start_round}-{config.rounds} to run)")
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
    except KeyboardInterrupt:
        bar.close()
        sim.interrupt()
        raise
    bar.close()
    return sim.finish()


def interruption_report(run_dir: str | Path) -> str:
    """How far a stopped run folder got and how to go on (a line for the command line).

    Reads run.json and metrics.jsonl only: :meth:`Simulation.interrupt` has marked the
    folder "interrupted" (run and run_seeds call it on Ctrl-C).
    """
    run_dir = Path(run_dir)
    meta_file = run_dir / "run.json"
    if not meta_file.exists():
        return "interrupted before the first round; run the same command again to start over"
    meta = json.loads(meta_file.read_text())
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
def _prepare_folder(run_dir: Path, config, history: History, strategy) -> int:
    """Create the folder, or check it holds this config and resume; returns the next round."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "config.json"
    if config_file.exists():
        stored = json.loads(config_file.read_text())
        wanted = config.to_dict()
        differing = sorted(k for k in set(stored) | set(wanted)
                           if k not in RESUMABLE_CHANGES and stored.get(k) != wanted.get(k))
        if differing:
            details = ", ".join(f"{k}: {stored.get(k)!r} != {wanted.get(k)!r}" for k in differing)
            raise ValueError(f"run folder {run_dir} holds a different run ({details}); "
                             f"choose another run_dir or delete that folder")
    config_file.write_text(config.to_json())
    checkpoint = run_dir / "checkpoint.pt"
    if not checkpoint.exists():
        (run_dir / "metrics.jsonl").write_text("")
        _write_meta(run_dir, history, 0)
        return 1
    # Onto this run's device: a run checkpointed on a GPU resumes on a CPU and vice versa.
    saved = torch.load(checkpoint, map_location=resolve_device(config.device),
                       weights_only=True)
    strategy.load_state_dict(saved["strategy"])
    history.rows = list(saved["rows"])
    history.status = saved["status"]
    # Rewrite metrics to match the checkpoint (rounds after it are recomputed).
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history.rows))
    return int(saved["round"]) + 1


def _append_row(run_dir: Path, row: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _write_meta(run_dir: Path, history: History, checkpoint_round: int) -> None:
    # checkpoint_round: what an interrupted run can resume from, without loading the .pt.
    meta = {k: v for k, v in history.summary().items() if k != "rows"}
    meta["checkpoint_round"] = checkpoint_round
    _write_json(run_dir / "run.json", meta)


def _write_json(path: Path, obj: dict) -> None:
    """Write to a temporary file and rename: a Ctrl-C mid-write must not leave half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _save_checkpoint(run_dir: Path, rnd: int, strategy, history: History) -> None:
    _atomic_save({"round": rnd, "strategy": strategy.state_dict(), "rows": history.rows,
                  "status": history.status}, run_dir / "checkpoint.pt")
    _write_meta(run_dir, history, rnd)


def _atomic_save(obj, path: Path) -> None:
    """Write to a temporary file and rename, so a killed run never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
