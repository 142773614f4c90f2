"""Gradient alignment during local training: FedUp's Table 2 ablation of Mime's correction.

Mime (Karimireddy et al. 2021) replaces a client's mini-batch gradient A by A - B + C, where,
on the client's k-th mini-batch xi^k,

- A = grad F_i(X_i^(t,k), xi^k): the client's gradient at its current local model,
- B = grad F_i(X^t, xi^k): the client's gradient at the round's global model,
- C = grad F(X^t, xi^k): the global objective's gradient at the global model.

FedUp (Sec. 4, Table 2) argues that the correction helps only when A and B are alike, and
measures four cosine similarities: (A, C) uncorrected, (A - B + C, C) as Mime corrects,
(A - B, C) with -B alone, and (A, B). Each is averaged over 40 mini-batches per client, then
over clients.

Decisions where the paper leaves room:

- The local trajectory X_i^(t,k) is plain local SGD from X^t (FedAvg's, the config's lr and
  batch order): what Mime's correction would be applied to, before it changes the path.
- C on batch k is the mean over the round's clients of each client's gradient at X^t on its
  own k-th mini-batch (F is the mean of the F_i; each client holds only its own data).
- At k = 0 the local model is X^t, so A = B and A - B is the zero vector, whose cosine is
  undefined: such terms are left out of the means (NaN-skipping), not counted as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from flnotes.engine.sim import initial_state, sample_clients
from flnotes.engine.tasks import build_task
from flnotes.engine.train import batch_schedule, client_generator

PAIRS = {
    "A and C (not correcting A)": lambda a, b, c: (a, c),
    "A - B + C and C (Mime's correction)": lambda a, b, c: (a - b + c, c),
    "A - B and C (only -B)": lambda a, b, c: (a - b, c),
    "A and B (not correcting A)": lambda a, b, c: (a, b),
}


def _cosine(u: torch.Tensor, v: torch.Tensor) -> float:
    """cos(u, v); NaN when either vector is zero."""
    norms = float(u.norm() * v.norm())
    return float(u @ v) / norms if norms > 0 else math.nan


def _flat_gradient(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor):
    """The loss's gradient over the model's parameters, as one float64 vector."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss_fn(model(x), y), params)
    return torch.cat([g.reshape(-1) for g in grads]).double()


def _batches(task, config, round: int, client: int, steps: int) -> list[torch.Tensor]:
    """The client's first ``steps`` mini-batches, in its local-SGD order for this round."""
    size = task.num_samples(client)
    epochs = max(1, math.ceil(steps * config.batch_size / max(size, 1)))
    x, _ = task.client_data(client)
    schedule = batch_schedule(size, epochs, config.batch_size,
                              client_generator(config, round, client), x.device)
    return list(schedule)[:steps]


def gradient_alignment(task, config, global_state, clients: Sequence[int], *, round: int = 1,
                       steps: int = 40) -> dict[str, float]:
    """FedUp Table 2's four mean cosine similarities (keys of :data:`PAIRS`) for ``clients``.

    Every client runs ``steps`` local SGD steps from ``global_state``; at each step the
    similarities of A, B and C (module docstring) are taken, averaged over the steps where
    they are defined, then over clients.
    """
    reference = task.model_factory()
    reference.load_state_dict(global_state)
    local = task.model_factory()
    data = {c: task.client_data(c) for c in clients}
    batches = {c: _batches(task, config, round, c, steps) for c in clients}
    steps = min(len(b) for b in batches.values())

    def grad(model, client, k):
        x, y = data[client]
        idx = batches[client][k]
        return _flat_gradient(model, task.loss_fn, x[idx], y[idx])

    # C at each step: the mean of every client's gradient at the global model.
    global_grads = [torch.stack([grad(reference, c, k) for c in clients]).mean(0)
                    for k in range(steps)]
    per_client = {name: [] for name in PAIRS}
    for client in clients:
        local.load_state_dict(global_state)
        sums = {name: [] for name in PAIRS}
        opt = torch.optim.SGD(local.parameters(), lr=config.lr)
        for k in range(steps):
            a, b, c = grad(local, client, k), grad(reference, client, k), global_grads[k]
            for name, pair in PAIRS.items():
                sums[name].append(_cosine(*pair(a, b, c)))
            # One plain SGD step along A (FedAvg's local trajectory).
            opt.zero_grad(set_to_none=True)
            x, y = data[client]
            idx = batches[client][k]
            task.loss_fn(local(x[idx]), y[idx]).backward()
            opt.step()
        for name, values in sums.items():
            defined = [v for v in values if not math.isnan(v)]
            per_client[name].append(sum(defined) / len(defined) if defined else math.nan)
    return {name: sum(v) / len(v) for name, v in per_client.items()}


# FedUp Table 2 as printed (cosine similarities; FEMNIST, CIFAR-10), to read ours against.
FEDUP_TABLE2 = {
    "A and C (not correcting A)": (0.3405, 0.0057),
    "A - B + C and C (Mime's correction)": (0.5451, -0.0111),
    "A - B and C (only -B)": (0.0182, -0.2062),
    "A and B (not correcting A)": (0.7514, 0.0316),
}


def alignment_table(config, *, steps: int = 40):
    """Table 2 for a config (e.g. preset fedup-paper-femnist): our four similarities at the
    initial global model over round 1's sampled clients, beside the paper's two columns.

    The paper does not say in which round it measured; round 1 (the initial model) is the
    one every run shares.
    """
    import pandas as pd  # lazy: pandas costs ~0.35 s

    config = config.resolved()
    task = build_task(config)
    ours = gradient_alignment(task, config, initial_state(config, task),
                              sample_clients(config, 1), steps=steps)
    return pd.DataFrame({"ours": ours,
                         "paper FEMNIST": {k: v[0] for k, v in FEDUP_TABLE2.items()},
                         "paper CIFAR-10": {k: v[1] for k, v in FEDUP_TABLE2.items()}})
