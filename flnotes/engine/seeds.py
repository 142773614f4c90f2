"""Several seeds of one configuration as one batched run: S seeds x K clients per step.

A paper's table cell is a mean +- std over seeds. Run one after another, every round of
every seed trains its K clients; stacked, the S runs go through their rounds in lockstep
and each round trains all S*K clients as one stack (:mod:`flnotes.engine.batched.stacked`, compiled
when ``config.compile`` asks for it). That keeps a GPU busier; on a CPU it is no faster
than running the seeds in turn. Each seed builds its own Task; seeds whose data come out
identical (a dataset read from files, whatever the seed) share one copy on the device.

Each seed stays a run of its own: its own partition, client sampling, strategy, History
and run folder (``run_dir/seed<N>``, resumable as usual), and its results equal
``run(config.replace(seed=N))`` to float tolerance (tests/test_seeds.py).

What shares the stack: every strategy that trains one model per client; a penalty's
run-dependent part (FedUp's previous global model) travels per lane in its anchor
(``Strategy.penalty_anchor``). FML trains two models per client and has its own batched
update, so its seeds train run by run inside the same lockstep round. Where the backend
resolves to the loop (``backend="loop"``, or ``"auto"`` on a CPU, where the loop is
faster), the seeds run one after another.
"""

from __future__ import annotations

import contextlib
import numbers
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flnotes.algorithms.base import ClientResult
from flnotes.engine.backends import resolve_backend, round_config, train_clients
from flnotes.engine.batched.stacked import train_supervised
from flnotes.engine.history import History
from flnotes.engine.sim import Simulation, check_config, run
from flnotes.engine.stops import check_stop
from flnotes.engine.tasks import build_task
from flnotes.engine.threads import threads_for
from flnotes.engine.tracking import environment_tracker


def seed_configs(config, seeds: list[int]) -> list:
    """One config per seed; a run folder gets one subfolder per seed (``seed<N>``)."""
    check_config(config, "run_seeds")
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise TypeError(f"run_seeds expects a list of seeds (integers), got "
                        f"{type(seeds).__name__} {seeds!r:.40}")
    seeds = list(seeds)
    odd = [s for s in seeds if isinstance(s, bool) or not isinstance(s, numbers.Integral)]
    if odd:
        raise TypeError(f"run_seeds expects integer seeds, got {odd[0]!r:.40} "
                        f"({type(odd[0]).__name__})")
    if not seeds:
        raise ValueError("run_seeds needs at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"run_seeds got a seed twice: {seeds}")
    if config.run_dir is not None and (Path(config.run_dir) / "run.json").exists():
        raise ValueError(f"{config.run_dir} holds one run (its run.json): the seeds' folders "
                         "would go inside it; give the seeds a run folder of their own")
    return [config.replace(seed=seed, run_dir=None if config.run_dir is None
                           else f"{config.run_dir}/seed{seed}") for seed in seeds]


def run_seeds(config, seeds: list[int], *, progress: bool = True, track: bool = True,
              threads: int | None = None, client_workers: int | None = 1) -> list[History]:
    """Run ``config`` once per seed, the seeds' clients trained together; one History each.

    ``track``: as :func:`flnotes.engine.sim.run` (``FLNOTES_LOGGERS``); a stacked run has no
    per-round callback, so each seed's rounds reach the loggers when the seeds end.
    ``client_workers``: as :func:`flnotes.engine.sim.run`, for seeds run in turn (a stacked
    run batches its clients on its device instead, and says so).
    """
    configs = seed_configs(config, seeds)
    if resolve_backend(config) == "loop":  # asked for, or "auto" on a CPU: seeds in turn
        return [run(c, progress=progress, track=track, threads=threads,
                    client_workers=client_workers) for c in configs]
    if client_workers is not None and client_workers > 1 and progress:
        tqdm.write(f"client_workers={client_workers}: not used by a stacked run (its clients "
                   "train as one batch on its device)")
    # Before training: a bad FLNOTES_LOGGERS is one line at once, not after every seed ran.
    trackers = [environment_tracker(c) if track else None for c in configs]
    # A stack trains on the GPU (the vmap backend's default): the CPU only feeds it, unless
    # the caller asks for threads.
    with threads_for(None, threads, on_gpu=True):
        histories = _run_stacked(config, configs, progress)
    for tracker, history in zip(trackers, histories, strict=True):
        if tracker:
            tracker.backfill(history.rows)
            tracker.close(history.status)
    return histories


def _run_stacked(config, configs: list, progress: bool) -> list[History]:
    """The seeds' runs advanced round by round together (their clients in one stack)."""
    sims: list[Simulation] = []
    try:
        for c in configs:  # one at a time, so at most two copies of the data exist at once
            check_stop()  # 200 seeds take a while to set up: a stop need not wait for them
            first = sims[0].task if sims else None
            sims.append(Simulation(c, task=share_identical_data(build_task(c), first)))
    except BaseException:  # a seed's folder refused: the seeds opened so far let go of theirs
        for sim in sims:
            sim.release()
        raise
    first = min((sim.start_round for sim in sims if sim.running), default=config.rounds + 1)
    bar = tqdm(range(first, config.rounds + 1), desc=f"{config.algorithm} x{len(sims)} seeds",
               disable=not progress, initial=first - 1, total=config.rounds)
    try:
        for rnd in bar:
            active = [sim for sim in sims if sim.running and sim.start_round <= rnd]
            if not active:
                break
            check_stop()  # a caller's stop (stops.stop_when), as Ctrl-C
            tic = time.perf_counter()
            plans = [(sim, *sim.begin_round(rnd)) for sim in active]
            trained = train_plans(plans, rnd)
            seconds = time.perf_counter() - tic  # the stack's time, reported by every seed
            rows = [sim.end_round(rnd, clients, starts, results, seconds)
                    for (sim, clients, starts), results in zip(plans, trained, strict=True)]
            accuracies = [row["accuracy"] for row in rows if "accuracy" in row]
            if accuracies:
                bar.set_postfix(mean_acc=f"{sum(accuracies) / len(accuracies):.3f}",
                                s_per_round=f"{seconds:.2f}")
    except KeyboardInterrupt:  # Ctrl-C: every run still going is marked, as run() does
        _end_all(sims, None)
        raise
    except Exception as err:  # an error: every run still going is marked failed
        _end_all(sims, err)
        raise
    finally:
        bar.close()
    try:
        return [sim.finish() for sim in sims]
    except Exception as err:  # e.g. a full disk while writing the last models
        for sim in sims:
            sim.end_early(err)
            sim.release()
        raise


def _end_all(sims: list[Simulation], err: Exception | None) -> None:
    """After a Ctrl-C (``err`` None) or an error: each run still going is marked interrupted
    or failed, as run() marks it; a seed that diverged earlier and waited for the others is
    finished as it would have been alone (its run.json says "diverged"). Every folder is let
    go now, not when the Simulations are collected: a notebook's stored traceback keeps them
    alive, and the next run of these seeds in that kernel would be refused."""
    for sim in sims:
        if sim.running:
            sim.end_early(err)
        elif not sim.finished:
            # best effort: the stop under way is what the caller must see, not a full disk
            with contextlib.suppress(Exception):
                sim.finish()
        sim.release()


def share_identical_data(task, first):
    """``task`` with its data tensors replaced by ``first``'s (a Task or None) where equal."""
    for name in ("train_x", "train_y", "test_x", "test_y") if first is not None else ():
        mine, theirs = getattr(task, name), getattr(first, name)
        if (mine.shape == theirs.shape and mine.dtype == theirs.dtype
                and mine.device == theirs.device and torch.equal(mine, theirs)):
            setattr(task, name, theirs)
    return task


def train_plans(plans: list[tuple], rnd: int) -> list[list[ClientResult]]:
    """Each plan's (sim, clients, starts) trained; stackable plans as one computation."""
    out: list[list[ClientResult] | None] = [None] * len(plans)
    # Plans whose clients can train in a stack with other seeds' clients (not FML's).
    stackable = [i for i, (sim, _, _) in enumerate(plans) if not sim.strategy.custom_local_update]
    # Once S x K models did not fit, later rounds go run by run at once.
    cache = plans[stackable[0]][0].task.backend_cache if stackable else {}
    if stackable and not cache.get("seed-stack-too-big"):
        groups = [(sim.task, sim.strategy, round_config(sim.strategy, rnd, sim.config), *plan)
                  for sim, *plan in (plans[i] for i in stackable)]
        too_big = False
        try:
            for i, results in zip(stackable, train_supervised(groups, rnd), strict=True):
                out[i] = results
        except torch.cuda.OutOfMemoryError:  # run by run below, where the vmap backend
            too_big = True  # halves groups that do not fit
        if too_big:
            cache["seed-stack-too-big"] = True
            torch.cuda.empty_cache()  # here: the except clause's traceback still held the stack
    # FML (or a stack too big): each run's clients alone
    return [results if results is not None else train_clients(
        sim.task, sim.strategy, rnd, clients, group_starts, sim.config)
        for results, (sim, clients, group_starts) in zip(out, plans, strict=True)]
