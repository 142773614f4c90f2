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
``depth_spread``, ``sharp_width``; see :mod:`flnotes.toy.landscapes`):

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

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from flnotes.data.registry import register_task_dataset
from flnotes.engine.tasks import Task, split_clients
from flnotes.rng import torch_generator
from flnotes.toy.landscapes import (
    LANDSCAPES,
    Federation,
    landscape_options,
    make_federation,
    top_eigenvalue,
)

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
        point = self.point()
        losses = self.federation.client_losses(point)  # (C,): one call for all clients
        return (losses[rows[:, 0].long()] + rows[:, 1:] @ point).unsqueeze(1)


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

    @property
    def stacked_losses(self):
        """:meth:`losses_of_stack` (Task.stacked_losses), while this task's loss is the
        toy_loss it computes (a ToyTask given another loss_fn trains by vmap)."""
        return self.losses_of_stack if self.loss_fn is toy_loss else None

    def losses_of_stack(self, params: dict[str, torch.Tensor], rows: torch.Tensor,
                        targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """toy_loss of K models (params x, y: (K,)) on their batches rows (K, B, 3) at once:
        (K,), each the mean over its real rows (mask (K, B); None: all) of ToyModel's per-row
        loss L_client(p) + noise . p; lane k's loss depends on lane k's parameters only. The
        stacked training step's path without vmap."""
        points = torch.stack([params["x"], params["y"]], dim=-1)  # (K, 2)
        losses = self.federation.client_losses(points)  # (K, C)
        noise = (rows[..., 1:] @ points[..., None])[..., 0]  # (K, B): noise . p
        per_row = losses.gather(1, rows[..., 0].long()) + noise
        if mask is None:
            return per_row.mean(1)
        # where, not a product: as masked_mean, a padding row never turns into NaN
        return torch.where(mask > 0, per_row, 0.0).sum(1) / mask.sum(1)

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


_FEDERATIONS: dict = {}  # (landscape, clients, options as JSON) -> Federation, oldest first


def _shared_federation(landscape: str, num_clients: int, shape: dict) -> Federation:
    """The federation of these options, built once: a race's 100 seeds share one (a
    federation is read-only once built; building it is most of a toy task's set-up)."""
    try:  # the builder itself too: a landscape registered again is another landscape
        key = (landscape, id(LANDSCAPES.get(landscape)), int(num_clients),
               json.dumps(shape, sort_keys=True))
    except TypeError:  # an option JSON cannot hold: built each time
        return make_federation(landscape, num_clients=num_clients, **shape)
    if key not in _FEDERATIONS:
        _FEDERATIONS[key] = make_federation(landscape, num_clients=num_clients, **shape)
        while len(_FEDERATIONS) > 32:
            _FEDERATIONS.pop(next(iter(_FEDERATIONS)), None)
    return _FEDERATIONS[key]


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
    federation = _shared_federation(toy["landscape"], config.num_clients, shape)
    start = start_point(config, toy)
    n = int(toy["samples_per_client"])
    if n < 2:
        raise ValueError(f"toy samples_per_client must be at least 2, got {n}")
    rows = client_rows(config.num_clients, n, toy["noise"], config.seed)
    parts = [torch.arange(c * n, (c + 1) * n) for c in range(config.num_clients)]
    train_parts, test_parts = split_clients(parts, config.client_test_fraction or 0.0,
                                            config.seed)
    return ToyTask(
        name="toy", model_factory=lambda: ToyModel(federation, start), train_x=rows,
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


register_task_dataset("toy", build_task)  # dataset "toy": this module builds its whole task
