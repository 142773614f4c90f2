"""The 2-parameter toy: every algorithm runs unchanged on analytic 2-D client landscapes.

The model has two 0-dim parameters, ``x`` and ``y`` (so its state has exactly two
"layers"). A client's "data" are rows ``[client_id, noise_x, noise_y]``; the model's output
for a row is that client's landscape loss at (x, y) plus ``noise . (x, y)``, so mini-batch
SGD on a client is gradient descent on its landscape with zero-mean gradient noise (each
client's noise rows are centred, hence its full-batch loss is exactly its landscape).

Evaluation of the global model (``ToyTask.evaluate``) reports
- ``loss``: the GLOBAL landscape (mean of the client landscapes) at (x, y);
- ``accuracy``: 1.0 if (x, y) lies in the flat basin (within ``flat_radius`` of the mean
  flat-well centre), else 0.0 -- "did the run find the flat minimum";
- ``sharp_basin``: 1.0 if (x, y) lies within ``sharp_radius`` of a client's sharp well;
- ``sharpness``: the top Hessian eigenvalue of the global landscape at (x, y);
- ``worst_client_loss``, ``x`` and ``y``.

``data_options`` (all optional; unknown keys go to the landscape builder, e.g. ``shift``,
``depth_spread``, ``sharp_width``; see :mod:`flnotes.landscapes`):

- ``landscape``: name in ``landscapes.LANDSCAPES`` (default ``"fedmut-fig1"``);
- ``noise``: per-sample gradient-noise standard deviation (default 0.3);
- ``start``: the initial model [x, y] (default: the landscape's ``DEFAULT_START``);
- ``start_jitter``: std of a Gaussian move of the start drawn from the seed (default 0);
- ``samples_per_client``: rows per client (default 20).

FML's distillation compares softmax outputs over dim 1; the toy's output per row is one
number (shape (B, 1)), whose softmax is 1, so FML's KL terms are exactly zero on the toy
and its meme models train on ``b`` times the loss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from flnotes.landscapes import (
    LANDSCAPES,
    Federation,
    landscape_options,
    make_federation,
    top_eigenvalue,
)
from flnotes.rng import torch_generator
from flnotes.tasks import Task, split_clients

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_START = {"fedmut-fig1": (-0.6, -0.7), "fedmut-fig2": (0.5, 0.3)}  # near the ravines
TOY_KEYS = ("landscape", "noise", "start", "start_jitter", "samples_per_client")


class ToyModel(nn.Module):
    """Two scalar parameters (x, y); forward(rows) -> per-row loss (B, 1) on the row's client."""

    def __init__(self, federation: Federation, start: Sequence[float]) -> None:
        super().__init__()
        self.federation = federation
        self.x = nn.Parameter(torch.tensor(float(start[0])))
        self.y = nn.Parameter(torch.tensor(float(start[1])))

    def point(self) -> torch.Tensor:
        """The model as a point (2,) of the plane."""
        return torch.stack([self.x, self.y])

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (B, 3) = [client, noise_x, noise_y] -> loss (B, 1) = L_client + noise . p."""
        point = torch.stack([self.x, self.y])
        losses = self.federation.client_losses(point)  # (C,): one call for all clients
        out = losses[rows[:, 0].long()] + rows[:, 1:] @ point
        return out.unsqueeze(1)


def toy_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean of the per-row losses the model returns (labels are unused)."""
    return out.mean()


@dataclass
class ToyTask(Task):
    """A Task whose evaluation reads the landscapes directly (see the module docstring)."""

    federation: Federation | None = None

    @torch.no_grad()
    def evaluate_on(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    batch_size: int = 1000) -> dict[str, float]:
        """Mean landscape loss of the rows' clients at the model (no noise) and the flat flag."""
        point = model.point().detach()
        losses = self.federation.client_losses(point)[x[:, 0].long()]
        flat = bool(self.federation.in_flat_basin(point))
        return {"accuracy": float(flat), "loss": float(losses.mean())}

    def evaluate(self, model: nn.Module, batch_size: int = 1000) -> dict[str, float]:
        """Global loss, flat-basin flag, top Hessian eigenvalue and position of the model."""
        point = model.point().detach().double()
        fed = self.federation
        clients = fed.client_losses(point)
        return {
            "accuracy": float(fed.in_flat_basin(point)),
            "sharp_basin": float(fed.in_sharp_basin(point)),
            "loss": float(clients.mean()),
            "sharpness": float(top_eigenvalue(fed.global_loss, point)),
            "worst_client_loss": float(clients.max()),
            "x": float(point[0]), "y": float(point[1]),
        }


def split_options(options: dict) -> tuple[dict, dict]:
    """(toy options with defaults filled in, landscape-builder options)."""
    toy = {"landscape": "fedmut-fig1", "noise": 0.3, "start": None, "start_jitter": 0.0,
           "samples_per_client": 20}
    toy.update({k: v for k, v in options.items() if k in TOY_KEYS})
    return toy, {k: v for k, v in options.items() if k not in TOY_KEYS}


def start_point(config, toy: dict) -> tuple[float, float]:
    """The initial model: the given or default start, moved by a seeded jitter if asked."""
    start = toy["start"] if toy["start"] is not None else DEFAULT_START.get(toy["landscape"],
                                                                              (0.0, 0.0))
    if not toy["start_jitter"]:
        return float(start[0]), float(start[1])
    move = torch.randn(2, generator=torch_generator(config.seed, "toy-start"),
                       dtype=torch.float64) * float(toy["start_jitter"])
    return float(start[0] + move[0]), float(start[1] + move[1])


def client_rows(num_clients: int, per_client: int, noise: float, seed: int) -> torch.Tensor:
    """Rows (C * n, 3) = [client, noise_x, noise_y]; noise centred per client."""
    g = torch_generator(seed, "toy-noise")
    draws = torch.randn(num_clients, per_client, 2, generator=g) * float(noise)
    draws = draws - draws.mean(dim=1, keepdim=True)  # full-batch loss = the landscape exactly
    ids = torch.arange(num_clients, dtype=torch.float32)[:, None, None].expand(-1, per_client, 1)
    return torch.cat([ids, draws], dim=-1).reshape(-1, 3)


def build_task(config) -> ToyTask:
    """The toy federation of a config (dataset "toy"): landscapes, noise rows, start point."""
    config = config.resolved()
    toy, shape = split_options(dict(config.data_options))
    if "num_clients" in shape:
        raise ValueError("toy data_options: num_clients is RunConfig.num_clients "
                         "(--num-clients), not a data option")
    if toy["landscape"] in LANDSCAPES:
        unknown = sorted(set(shape) - set(landscape_options(toy["landscape"])))
        if unknown:
            raise ValueError(f"toy data_options {unknown} unknown: the toy takes "
                             f"{', '.join(TOY_KEYS)}, and landscape {toy['landscape']!r} takes "
                             f"{', '.join(landscape_options(toy['landscape']))}")
    federation = make_federation(toy["landscape"], num_clients=config.num_clients, **shape)
    start = start_point(config, toy)
    n = int(toy["samples_per_client"])
    if n < 2:
        raise ValueError(f"toy samples_per_client must be at least 2, got {n}")
    rows = client_rows(config.num_clients, n, toy["noise"], config.seed)
    parts = [torch.arange(c * n, (c + 1) * n) for c in range(config.num_clients)]
    train_parts, test_parts = split_clients(parts, config.client_test_fraction or 0.0,
                                            config.seed)

    def model_factory() -> ToyModel:
        return ToyModel(federation, start)

    return ToyTask(
        name="toy", model_factory=model_factory, train_x=rows,
        train_y=torch.zeros(len(rows), dtype=torch.long), client_indices=train_parts,
        test_x=rows[:: n], test_y=torch.zeros(config.num_clients, dtype=torch.long),
        num_classes=1, client_test_indices=test_parts, loss_fn=toy_loss, federation=federation,
    )


# ---- helpers for the notebooks --------------------------------------------------------------
def point_of(state) -> tuple[float, float]:
    """The (x, y) of a toy state."""
    return float(state["x"]), float(state["y"])


def state_of(point: Sequence[float]) -> OrderedDict[str, torch.Tensor]:
    """A toy state (two 0-dim layers) at a point."""
    return OrderedDict([("x", torch.tensor(float(point[0]))),
                        ("y", torch.tensor(float(point[1])))])


def trajectory_points(history) -> dict[str, torch.Tensor]:
    """Points of a recorded run: global (R+1, 2) from the start, dispatched/local (R, K, 2)."""
    traj = history.trajectory
    if not traj:
        raise ValueError("the run has no trajectory: run it with record_states=True")
    dispatched = torch.tensor([[point_of(s) for s in t["dispatched"]] for t in traj])
    glob = torch.tensor([point_of(t["global"]) for t in traj])
    # Every strategy dispatches the initial model to all clients in round 1.
    return {"global": torch.cat([dispatched[0, :1], glob]), "dispatched": dispatched,
            "local": torch.tensor([[point_of(s) for s in t["local"]] for t in traj])}


def mutation_points(center: Sequence[float], update: Sequence[float], *, kind: str = "sign",
                    alpha: float = 4.0, beta: float = 0.0, num_models: int = 8,
                    qp_prob: float = 0.0, layerwise: bool = True, seed: int = 0) -> torch.Tensor:
    """Mutants (K, 2) of the point ``center`` by the strategies' own mutation functions.

    ``kind`` is "sign" (FedMut) or "gaussian"; ``qp_prob`` > 0 adds FedQP's projection.
    ``layerwise=True`` is what the strategies do (x and y mutate separately: the corners of
    a rectangle); ``layerwise=False`` treats (x, y) as one vector: a circle of radius
    alpha * |g|, and with projection the outline of a fan (half circle and diameter).
    """
    from flnotes.algorithms.mutation import gaussian_mutations, project_mutants, sign_mutations

    glob, g = state_of(center), state_of(update)
    generator = torch_generator(seed, "toy-mutation")
    if kind == "gaussian":
        mutants = gaussian_mutations(glob, g, num_models, alpha, generator, layerwise=layerwise)
    elif kind == "sign":
        mutants = sign_mutations(glob, g, num_models, alpha, beta, generator,
                                 layerwise=layerwise)
    else:
        raise ValueError(f"mutation kind must be 'sign' or 'gaussian', got {kind!r}")
    if qp_prob > 0:
        mutants = project_mutants(glob, mutants, g, qp_prob, generator, layerwise=layerwise)
    return torch.tensor([point_of(m) for m in mutants])


def mutation_round(fn, center: Sequence[float], update: Sequence[float], *, steps: int = 20,
                   lr: float = 0.05, **mutation) -> dict[str, torch.Tensor]:
    """One FedMut-style round on a single landscape ``fn`` (FedMut Fig. 2): mutate, descend, mean.

    Mutants come from :func:`mutation_points` (keyword options passed on); "local training"
    is ``steps`` of plain gradient descent on ``fn``. Returns trajectory points: global (2, 2)
    = [center, mean of local models], dispatched (1, K, 2), local (1, K, 2).
    """
    from flnotes.landscapes import descend

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
    from flnotes.config import RunConfig

    values = {**TEACHING, "algorithm": algorithm}
    options = {**TEACHING["data_options"], **overrides.pop("data_options", {})}
    values.update(overrides, data_options=options)
    return RunConfig(**values)


def run_toy(algorithm: str = "fedavg", **overrides):
    """Run the toy with states recorded; returns (History, trajectory points)."""
    from flnotes.sim import run

    history = run(toy_config(algorithm, record_states=True, **overrides), progress=False)
    return history, trajectory_points(history)


def final_table(histories: Mapping[str, object]) -> pd.DataFrame:
    """Final evaluation of several toy runs ({label: History}) as a pandas DataFrame."""
    import pandas as pd

    rows = {label: {k: h.rows[-1].get(k, float("nan")) for k in FINAL_KEYS}
            for label, h in histories.items()}
    frame = pd.DataFrame(rows).T.rename(columns={"accuracy": "flat"})
    return frame[["x", "y", "loss", "worst_client_loss", "sharpness", "flat", "sharp_basin"]]


FINAL_KEYS = ("accuracy", "sharp_basin", "loss", "sharpness", "worst_client_loss", "x", "y")


def final_metrics(config_values: dict) -> dict:
    """Run one toy config (a dict of RunConfig fields) and return its final evaluation."""
    from flnotes.config import RunConfig
    from flnotes.sim import run

    config = RunConfig(**config_values).replace(eval_every=config_values["rounds"])
    history = run(config, progress=False)
    last = history.rows[-1] if history.rows else {}
    row = {"algorithm": config.algorithm, "seed": config.seed, "status": history.status}
    row.update({k: last.get(k, float("nan")) for k in FINAL_KEYS})
    if history.status == "diverged":  # no final evaluation: count the run as "elsewhere"
        row.update(accuracy=0.0, sharp_basin=0.0)
    return row


def race(algorithms: Sequence[str] | None = None, seeds: int | Sequence[int] = 100,
         processes: int = 1, **overrides) -> list[dict]:
    """Every algorithm on the same toy federation for every seed: one final row per run.

    ``processes`` > 1 spreads the runs over worker processes (each run depends only on its
    config, so the rows are the same whatever the number of processes).
    """
    from flnotes.algorithms import algorithm_names

    algorithms = list(algorithms) if algorithms is not None else algorithm_names()
    seeds = range(seeds) if isinstance(seeds, int) else seeds
    jobs = [toy_config(a, seed=int(s), **overrides).to_dict() for a in algorithms for s in seeds]
    if processes <= 1:
        return [final_metrics(job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork (where there is one) skips re-importing torch in every worker, which costs more
    # than a small race; each worker then runs single-threaded (tiny tensors gain nothing
    # from threads), as DataLoader workers do.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=torch.set_num_threads,
                             initargs=(1,)) as pool:
        return list(pool.map(final_metrics, jobs, chunksize=max(1, len(jobs) // (4 * processes))))


def race_table(rows: Sequence[dict]) -> pd.DataFrame:
    """Per algorithm: runs, share ending flat / sharp / elsewhere, median loss and sharpness."""
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    frame["elsewhere"] = 1.0 - frame["accuracy"] - frame["sharp_basin"]
    table = frame.groupby("algorithm").agg(
        runs=("seed", "size"), flat=("accuracy", "mean"), sharp=("sharp_basin", "mean"),
        elsewhere=("elsewhere", "mean"), median_loss=("loss", "median"),
        median_sharpness=("sharpness", "median"),
        diverged=("status", lambda s: float((s == "diverged").mean())))
    return table.sort_values(["flat", "median_loss"], ascending=[False, True])
