"""Experiments on the 2-D toy: one run, a race of every method over many seeds, the
mutants of one round, and the trajectory points that the pictures draw.

Every run here goes through the same :func:`flnotes.engine.sim.run` as a full-scale run.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress
from typing import TYPE_CHECKING

import torch
from tqdm.std import tqdm  # text, not a widget bar: a reopened notebook lacks its model

from flnotes.algorithms import algorithm_class, algorithm_names
from flnotes.algorithms.mutation import gaussian_mutations, project_mutants, sign_mutations
from flnotes.config import RunConfig
from flnotes.engine.batched.stacked import trains_in_stack
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import run
from flnotes.engine.stops import check_stop
from flnotes.engine.tracking import ENV_LOGGERS
from flnotes.messages import expecting_fallbacks
from flnotes.rng import torch_generator
from flnotes.toy import shipped
from flnotes.toy.landscapes import descend
from flnotes.toy.task import point_of, state_of

if TYPE_CHECKING:
    import pandas as pd  # lazy: pandas costs ~0.35 s


def trajectory_points(history) -> dict[str, torch.Tensor]:
    """Points of a recorded run: global (R+1, 2) from the start, dispatched/local (R, K, 2)."""
    traj = history.trajectory
    if not traj:
        raise ValueError("the run has no trajectory: run it with record_states=True")
    width = max(len(t["dispatched"]) for t in traj)

    def padded(states) -> list[tuple[float, float]]:
        # A round may train fewer clients than others (CluSamp draws a client twice and
        # trains it once): NaN rows keep one (R, K, 2) array, and plots skip NaN points.
        points = [point_of(s) for s in states]
        return points + [(math.nan, math.nan)] * (width - len(points))

    dispatched = torch.tensor([padded(t["dispatched"]) for t in traj])
    glob = torch.tensor([point_of(t["global"]) for t in traj])
    # Every strategy dispatches the initial model to all clients in round 1.
    return {"global": torch.cat([dispatched[0, :1], glob]), "dispatched": dispatched,
            "local": torch.tensor([padded(t["local"]) for t in traj])}


def mutation_points(center: Sequence[float], update: Sequence[float], *, kind: str = "sign",
                    alpha: float = 4.0, beta: float = 0.0, num_models: int = 8,
                    qp_prob: float = 0.0, layerwise: bool = True, seed: int = 0) -> torch.Tensor:
    """Mutants (K, 2) of the point ``center`` by the strategies' own mutation functions.

    ``kind`` is "sign" (FedMut) or "gaussian"; ``qp_prob`` > 0 adds FedQP's projection.
    ``layerwise=True`` is what the strategies do (x and y mutate separately: the corners of
    a rectangle); ``layerwise=False`` treats (x, y) as one vector: a circle of radius
    alpha * |g|, and with projection the outline of a fan (half circle and diameter).
    """
    glob, g = state_of(center), state_of(update)
    generator = torch_generator(seed, "toy-mutation")
    if kind == "gaussian":
        mutants = gaussian_mutations(glob, g, num_models, alpha, generator, layerwise=layerwise)
    elif kind == "sign":
        mutants = sign_mutations(glob, g, num_models, alpha, beta, generator, layerwise=layerwise)
    else:
        raise ValueError(f"mutation kind must be 'sign' or 'gaussian', got {kind!r}")
    if qp_prob > 0:
        mutants = project_mutants(glob, mutants, g, qp_prob, generator, layerwise=layerwise)
    return torch.tensor([point_of(m) for m in mutants])


def mutation_region(center: Sequence[float], update: Sequence[float], alpha: float,
                    projected: bool = False, points: int = 180) -> torch.Tensor:
    """The region (M, 2) polygon a whole-vector mutation of ``center`` can reach: the disc
    of radius alpha * |g| (FedMut), or with ``projected`` its image under FedQP's projection
    (the fan of FedQP's Fig. 1: the half disc ahead of the global model).

    The fan is computed by the strategies' own projection (``project_mutants`` with
    probability 1) applied to mutants on the disc's rim, then closed through the centre:
    the projection onto a half-plane maps the disc to the convex hull of its rim's image.
    """
    cx, cy = float(center[0]), float(center[1])
    radius = float(alpha) * math.hypot(float(update[0]), float(update[1]))
    angles = torch.linspace(0.0, 2 * math.pi, points + 1, dtype=torch.float64)[:-1]
    rim = torch.stack([cx + radius * angles.cos(), cy + radius * angles.sin()], dim=1)
    if not projected or radius == 0:  # alpha = 0 or g = 0: the region is the point itself
        return rim
    from scipy.spatial import ConvexHull  # lazy: scipy costs ~0.5 s

    glob, g = state_of(center), state_of(update)
    moved = project_mutants(glob, [state_of(p.tolist()) for p in rim], g, 1.0,
                            torch_generator(0, "toy-region"), layerwise=False)
    image = torch.tensor([point_of(m) for m in moved] + [(cx, cy)], dtype=torch.float64)
    return image[torch.as_tensor(ConvexHull(image.numpy()).vertices)]  # in order round it


def mutation_regions(center: Sequence[float], update: Sequence[float], alpha: float,
                     qp_prob: float, layerwise: bool,
                     kind: str = "gaussian") -> dict[str, torch.Tensor]:
    """The shaded regions of a mutation picture: {"circle": disc} where mutants may stay
    unprojected (p < 1) and {"fan": ...} where they may be projected (p > 0). A per-layer
    mutation of the toy's one-number layers reaches points, not a region: none. Nor does a
    sign mutation of the whole vector: its mutants are w + alpha g and w - (1 - beta) alpha g
    (and their projections), two points however many mutants are drawn."""
    if layerwise or kind == "sign":
        return {}
    regions = {}
    if qp_prob < 1:
        regions["circle"] = mutation_region(center, update, alpha)
    if qp_prob > 0:
        regions["fan"] = mutation_region(center, update, alpha, projected=True)
    return regions


def mutation_round(fn, center: Sequence[float], update: Sequence[float], *, steps: int = 20,
                   lr: float = 0.05, **mutation) -> dict[str, torch.Tensor]:
    """One FedMut-style round on a single landscape ``fn`` (FedMut Fig. 2): mutate, descend, mean.

    Mutants come from :func:`mutation_points` (keyword options passed on); "local training"
    is ``steps`` of plain gradient descent on ``fn``. Returns trajectory points: global (2, 2)
    = [center, mean of local models], dispatched (1, K, 2), local (1, K, 2).
    """
    mutants = mutation_points(center, update, **mutation).double()
    local = descend(fn, mutants, steps=steps, lr=lr)
    glob = torch.stack([torch.tensor(center, dtype=torch.float64), local.mean(0)])
    return {"global": glob, "dispatched": mutants[None], "local": local[None]}


# ---- teaching runs and the race -------------------------------------------------------------
# The notebooks' toy federation: small enough that a run takes a fraction of a second.
TEACHING = {"dataset": "toy", "num_clients": 2, "clients_per_round": 2, "rounds": 20,
            "local_epochs": 1, "batch_size": 4, "lr": 0.1, "momentum": 0.5, "device": "cpu",
            "backend": "loop", "data_options": {"samples_per_client": 8, "noise": 0.5}}


def toy_config(algorithm: str = "fedavg", **overrides):
    """A RunConfig for the toy with the notebooks' defaults; ``data_options`` are merged."""
    values = {**TEACHING, "algorithm": algorithm}
    if algorithm_class(algorithm).own_momentum:  # MimeLite, STEM: their momentum, not SGD's
        values["momentum"] = 0.0
    options = {**TEACHING["data_options"], **overrides.pop("data_options", {})}
    values.update(overrides, data_options=options)
    return RunConfig(**values)


def run_toy(algorithm: str = "fedavg", **overrides):
    """Run the toy with states recorded; returns (History, trajectory points)."""
    history = run(toy_config(algorithm, record_states=True, **overrides), progress=False)
    return history, trajectory_points(history)


def final_table(histories: Mapping[str, object]) -> pd.DataFrame:
    """Final evaluation of several toy runs ({label: History}) as a pandas DataFrame."""
    import pandas as pd  # lazy: pandas costs ~0.35 s

    rows = {label: {k: h.rows[-1].get(k, float("nan")) for k in FINAL_KEYS}
            for label, h in histories.items()}
    frame = pd.DataFrame(rows).T.rename(columns={"accuracy": "flat"})
    return frame[["x", "y", "loss", "worst_client_loss", "sharpness", "flat", "sharp_basin"]]


FINAL_KEYS = ("accuracy", "sharp_basin", "loss", "sharpness", "worst_client_loss", "x", "y")


def final_row(history) -> dict:
    """A toy run's final evaluation as one race row (algorithm, seed, status, FINAL_KEYS)."""
    last = history.rows[-1] if history.rows else {}
    row = {"algorithm": history.config["algorithm"], "seed": history.config["seed"],
           "status": history.status}
    row.update({k: last.get(k, float("nan")) for k in FINAL_KEYS})
    if history.status == "diverged":  # no final evaluation: count the run as "elsewhere"
        row.update(accuracy=0.0, sharp_basin=0.0)
    return row


def final_metrics(config_values: dict) -> dict:
    """Run one toy config (a dict of RunConfig fields) and return its final evaluation."""
    config = RunConfig(**config_values).replace(eval_every=config_values["rounds"])
    return final_row(run(config, progress=False))


def stacks_seeds(algorithm: str) -> bool:
    """Whether a method's seeds train as one stack: not for a method with a whole local
    update of its own on the toy's model (FML, MimeLite, STEM, FedSMOO; not MOON, which
    trains as FedAvg on a model without a classifier head), whose batched update is slower
    on a CPU than its loop; those run seed after seed."""
    return not algorithm_class(algorithm).uses_custom_update(state_of((0.0, 0.0)))


def stack_trains(algorithm: str) -> bool:
    """Whether the stack itself trains a method's clients (its seeds at once); the others
    (their own update, a teacher, a batch term) go seed by seed."""
    return stacks_seeds(algorithm) and trains_in_stack(algorithm_class(algorithm))


def method_rows(job: tuple[str, list[int], dict]) -> list[dict]:
    """Every seed of one method, as one stacked run (:func:`flnotes.engine.seeds.run_seeds`):
    per step the S seeds x K clients train as one batched computation, the same strategy
    code as every run. Returns one final row per seed, in seed order."""
    algorithm, seeds, overrides = job
    config = toy_config(algorithm, **overrides)
    config = config.replace(eval_every=config.rounds,
                            backend="vmap" if stacks_seeds(algorithm) else "loop")
    # FedNTD, FedGen: "no batched training step, its clients train on the loop backend"
    # is the expected path inside the stack, not news for a race.
    with expecting_fallbacks():
        histories = run_seeds(config, list(seeds), progress=False)
    return [final_row(history) for history in histories]


_WARMED: set[str] = set()  # methods warm_up has run in this process


def warm_up(algorithms: Sequence[str]) -> None:
    """One round of one seed of each method not warmed up before in this process, kept
    nowhere (0.1 s for every method). A method's first run imports what
    it needs: torch.optim's first step imports torch._dynamo (about 1 s on a 2-core CPU),
    ClusSamp imports scipy.cluster (0.4 s). The race explorer calls this when it is made, so
    that those imports land in its cell, not in a student's first move to such a method."""
    todo = [name for name in algorithms if name not in _WARMED]
    # Only a speed-up: never waited for (a worker still racing holds the lock: its race has
    # run the imports) and never an error of the explorer's cell (a method that fails here
    # fails in its race, which says so).
    if not todo or not _RACING.acquire(blocking=False):
        return
    try:
        for name in todo:
            _WARMED.add(name)
            with suppress(Exception):  # see above
                method_rows((name, [0], {"rounds": 1}))  # a race's own path, kept nowhere
    finally:
        _RACING.release()


def race(algorithms: Sequence[str] | None = None, seeds: int | Sequence[int] = 100,
         processes: int = 1, stack: bool = True, progress: bool = False, **overrides) -> list[dict]:
    """Every algorithm on the same toy federation for every seed: one final row per run.

    ``stack`` (the default) trains each method's seeds as one stacked run (S seeds x K clients per
    step, the vmap backend): on the two-parameter toy, where a step is mostly fixed cost, that is
    several times faster than running the seeds one by one (``stack=False``), and each seed's run
    equals its one-by-one run to float tolerance (tests/test_toy.py). ``processes`` > 1 spreads the
    methods (stacked) or the runs over worker processes; the rows are the same whatever the number
    of processes. ``progress`` shows a bar over the methods (or runs).

    A method's rows are kept (the last :data:`RACES_KEPT` methods' races): a run is a function
    of its config and seed, so a later race of the same method, seeds and setting (notebook
    04's explorer after the table's race) reuses them, a race of the first seeds of a kept
    one reads those seeds' rows, and a race of more seeds than a kept one runs only the
    seeds it lacks (rows equal to their own race to float tolerance: a stack of other seeds
    around them changes only the last bits); :func:`forget_races` drops them.
    """
    # One race at a time: an explorer's worker thread may be racing. A worker waiting here
    # for another thread's race can still be stopped (a newer move need not wait for both).
    while not _RACING.acquire(timeout=0.05):
        check_stop()
    try:
        return _kept_or_run(algorithms, seeds, processes, stack, progress, overrides)
    finally:
        _RACING.release()


def _kept_or_run(algorithms, seeds, processes: int, stack: bool, progress: bool,
                 overrides: dict) -> list[dict]:
    _load_shipped()
    algorithms = list(algorithms) if algorithms is not None else algorithm_names()
    seeds = list(range(seeds) if isinstance(seeds, int) else seeds)
    keys = {a: _race_key(a, seeds, stack, overrides) for a in algorithms}
    found = {a: rows for a in algorithms if (rows := _kept_rows(keys[a])) is not None}
    todo = [a for a in dict.fromkeys(algorithms) if a not in found]
    # A method kept for the first seeds only runs the seeds it lacks (more seeds for the
    # explorer's interval); methods lacking the same seeds run together.
    head = {a: _kept_head(keys[a]) for a in todo}
    lacking: dict[tuple, list[str]] = {}
    for a in todo:
        lacking.setdefault(tuple(seeds[len(head[a]):]), []).append(a)
    for rest, group in lacking.items():
        for algorithm, rows in zip(group, _run_races(group, list(rest), processes, stack,
                                                     progress, overrides), strict=True):
            found[algorithm] = [*head[algorithm], *rows]
            if keys[algorithm] is not None:
                _RACES[keys[algorithm]] = found[algorithm]
                while len(_RACES) > RACES_KEPT:
                    del _RACES[next(iter(_RACES))]
    if not todo and progress and algorithms:
        shipped_only = all(_is_shipped(keys[a]) for a in algorithms)
        print(f"race: the {len(algorithms)} methods' rows "
              + ("shipped with flnotes (this setting's race, run once and checked against "
                 "fresh runs by the tests: flnotes/toy/shipped.py)" if shipped_only
                 else "from an earlier race"))
    return [dict(row) for a in algorithms for row in found[a]]


def _kept_head(key) -> list[dict]:
    """The rows of the longest kept race whose seeds begin ``key``'s (same method, setting
    and stacking), fewer seeds than ``key`` asks for; [] if none."""
    heads = [_RACES[k] for k in _same_races(key, _RACES)
             if len(k[2]) < len(key[2]) and key[2][:len(k[2])] == k[2]]
    return max(heads, key=len, default=[])


def _same_races(key, keys) -> list[tuple]:
    """Those of ``keys`` (race keys, in their order) of ``key``'s method, setting and
    stacking ([] for None)."""
    return [] if key is None else [k for k in keys if (*k[:2], k[3]) == (*key[:2], key[3])]


RACES_KEPT = 256  # methods' races kept by race() (a race of 100 seeds is ~30 KB of rows)
_RACES: dict = {}  # _race_key -> one method's rows, oldest first
_RACING = threading.RLock()  # held by race(), kept_race() and forget_races()
_SHIPPED: set = set()  # keys of _RACES read from the shipped file
_SHIPPED_READ = [False]  # whether it was read (once: forget_races() means "compute")


def _load_shipped() -> None:
    """Keep the shipped default race (flnotes.toy.shipped) as if it had run here: each method
    still registered to the class its rows were made with. Once per process, and not after
    :func:`forget_races`."""
    if _SHIPPED_READ[0]:
        return
    _SHIPPED_READ[0] = True

    known = set(algorithm_names())
    for entry in shipped.entries():
        name = entry.get("algorithm")
        if name not in known or shipped.class_path(algorithm_class(name)) != entry.get("class"):
            continue
        key = _race_key(name, entry["seeds"], entry["stack"], entry["overrides"])
        if key is not None and key not in _RACES:
            _RACES[key] = entry["rows"]
            _SHIPPED.add(key)


def _is_shipped(key) -> bool:
    """Whether ``key``'s rows are (the head of) a shipped race."""
    return any(k[2][:len(key[2])] == key[2] for k in _same_races(key, _SHIPPED))


def _kept_rows(key) -> list[dict] | None:
    """The kept rows of ``key``'s race, or of its seeds at the head of a kept race of more
    seeds (same method, setting and stacking); None if neither is kept."""
    if key in _RACES:
        _RACES[key] = _RACES.pop(key)  # now the newest, found first below
    n = len(key[2]) if key is not None else 0
    return next((_RACES[k][:n] for k in reversed(_same_races(key, _RACES))  # rows in seed order
                 if k[2][:n] == key[2]), None)


def kept_race(algorithm: str, seeds: int | Sequence[int], stack: bool = True, **overrides) -> bool:
    """Whether :func:`race` keeps this method's rows for these seeds and setting (a race of
    it would return at once)."""
    seeds = list(range(seeds) if isinstance(seeds, int) else seeds)
    with _RACING:
        return _kept_rows(_race_key(algorithm, seeds, stack, overrides)) is not None


def ship_default_race(path=shipped.PATH, seeds: int = shipped.SEEDS, processes: int = 1):
    """Run notebook 04's default race of every method from scratch and write it where
    :func:`race` reads it (flnotes.toy.shipped); returns the file's path."""
    forget_races()
    races = []
    for algorithm in algorithm_names():
        rows = race([algorithm], seeds=seeds, processes=processes, **shipped.DEFAULT)
        races.append({"algorithm": algorithm, "rows": rows, "stack": True,
                      "class": shipped.class_path(algorithm_class(algorithm)),
                      "overrides": shipped.DEFAULT, "seeds": list(range(seeds))})
        print(f"{algorithm}: {len(rows)} runs", flush=True)
    return shipped.write(races, path)


def forget_races() -> None:
    """Drop the rows :func:`race` keeps (benchmarks measure first visits)."""
    with _RACING:
        _RACES.clear()
        _SHIPPED.clear()
        _SHIPPED_READ[0] = True  # a forgetting caller measures or checks runs: none shipped


def _race_key(algorithm: str, seeds: list, stack: bool, overrides: dict) -> tuple | None:
    """What decides a method's race rows: its whole toy config (a default written out or
    left to the method is the same key), the class that runs it (a method registered again
    is another method), the seeds and stacking (stacked rows equal one-by-one rows to float
    tolerance, not bit for bit). None, never kept: a race whose runs also write somewhere
    (a run folder, loggers asked for in the environment), which a kept race would skip."""
    if overrides.get("run_dir") or os.environ.get(ENV_LOGGERS):
        return None
    try:
        config = toy_config(algorithm, **json.loads(json.dumps(overrides))).to_dict()
    except TypeError:  # an override JSON cannot hold: not kept
        return None
    config.pop("seed", None)
    return (json.dumps(config, sort_keys=True), id(algorithm_class(algorithm)),
            tuple(int(s) for s in seeds), bool(stack))


def _run_races(algorithms: list[str], seeds: list[int], processes: int, stack: bool,
               progress: bool, overrides: dict) -> list[list[dict]]:
    """Each method's rows, run now."""
    tic = time.perf_counter()
    if stack:
        work, jobs = method_rows, [(a, seeds, overrides) for a in algorithms]
    else:
        work = final_metrics
        jobs = [toy_config(a, seed=int(s), **overrides).to_dict()
                for a in algorithms for s in seeds]
    bar = tqdm(jobs, desc=f"race: {len(algorithms)} methods x {len(seeds)} seeds",
               unit="method" if stack else "run", disable=not progress)
    # The toy's model is two numbers without a classifier head, so FedGen and MOON run as
    # FedAvg on it (their modules say so, as do notebook 04 and the README): once per race
    # is not news, and in a notebook the warning reads like an error. Per thread: an
    # explorer's worker races while a cell may record warnings of its own.
    with expecting_fallbacks():
        if processes <= 1:
            results = [work(job) for job in bar]
        else:
            # fork (where there is one) skips re-importing torch in every worker, which costs
            # more than a small race; each worker then runs single-threaded (tiny tensors
            # gain nothing from threads), as DataLoader workers do.
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            # Stacked, the methods that run seed by seed take several times longer than the
            # others: hand them out first, so the workers finish together.
            order = (sorted(range(len(jobs)), key=lambda i: stack_trains(jobs[i][0])) if stack
                     else list(range(len(jobs))))
            with ProcessPoolExecutor(processes, mp_context=context,
                                     initializer=torch.set_num_threads, initargs=(1,)) as pool:
                chunk = 1 if stack else max(1, len(jobs) // (4 * processes))
                results = [None] * len(jobs)
                for i, result in zip(order, pool.map(work, [jobs[i] for i in order],
                                                     chunksize=chunk), strict=True):
                    results[i] = result
                    bar.update()
    bar.close()
    # Stacked: one list of rows per method already; else runs in method order, each
    # method's seeds in a row.
    n = len(seeds)
    rows = results if stack else [results[i * n:(i + 1) * n] for i in range(len(algorithms))]
    if progress:
        print(f"race: {sum(map(len, rows))} runs ({len(algorithms)} methods x {len(seeds)} "
              f"seeds) in {time.perf_counter() - tic:.0f} s")
    return rows


def race_table(rows: Sequence[dict]) -> pd.DataFrame:
    """Per algorithm: runs, share ending flat / sharp / elsewhere, median loss and sharpness."""
    import pandas as pd  # lazy: pandas costs ~0.35 s

    frame = pd.DataFrame(list(rows))
    frame["elsewhere"] = 1.0 - frame["accuracy"] - frame["sharp_basin"]
    table = frame.groupby("algorithm").agg(
        runs=("seed", "size"), flat=("accuracy", "mean"), sharp=("sharp_basin", "mean"),
        elsewhere=("elsewhere", "mean"), median_loss=("loss", "median"),
        median_sharpness=("sharpness", "median"),
        diverged=("status", lambda s: float((s == "diverged").mean())))
    # Ties broken by the loss as printed (3 decimals), then by name: float noise in the last
    # digits (one-by-one vs stacked seeds) must not reorder methods that print the same.
    table["_loss"] = table["median_loss"].round(3)
    table = table.rename_axis("algorithm").reset_index()
    table = table.sort_values(["flat", "_loss", "algorithm"], ascending=[False, True, True])
    return table.set_index("algorithm").drop(columns="_loss")
