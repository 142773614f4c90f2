"""STEM (Khanduri et al., "STEM: A Stochastic Two-Sided Momentum Algorithm Achieving Near-Optimal
Sample and Communication Complexities for Federated Learning", NeurIPS 2021): clients move
along a STORM-type momentum d, and the server averages both the models and the momenta.

Algorithm 1, for a client between two communications (I local steps, fresh batch xi each):

    x_{t+1} = x_t - eta d_t
    d_{t+1} = g(x_{t+1}; xi_{t+1}) + (1 - a) (d_t - g(x_{t+1 - 1}; xi_{t+1}))

(both gradients on the same batch, at the new and at the previous point), and every I steps
the server sets x and d to the means of the clients' x and d: the "two-sided" momentum, one
on the clients and one carried across rounds by the server. a = 1 turns d into the plain
stochastic gradient: each move uses the gradient at the point it starts from, on the batch of
the step before (SGD with the batches shifted by one step, so not FedAvg bit for bit).

Decisions where the paper leaves room:

- Step size and a: the paper's theory uses eta_t = kappa / (w_t + sigma^2 t)^(1/3) and
  a_{t+1} = c eta_t^2; its experiments tune them. We keep the toolkit's constant local
  learning rate and a constant a (``stem_a``, default 0.1: our choice, not the paper's).
- I is one round's local steps (local_epochs x ceil(n_i / B), the engine's batch schedule);
  the batches are the engine's, so every method sees the same data order.
- d_0 (Alg. 1's initialisation, before the first communication): each client's minibatch
  gradient at x_0 on its first batch of round 1; from round 2 every client starts from the
  server's d.
- Partial participation: the paper's analysis has every client in every round; here the
  server averages the x and d of the sampled clients (uniformly, as Alg. 1's 1/K; the
  ``weighting`` setting can make it sample-weighted) and sends both to the next sample.
- Weight decay is part of g (the regularised objective); the local SGD has no momentum of
  its own (``momentum`` must be 0; d is the momentum). BatchNorm statistics move with both
  forward passes of a step and are averaged as FedAvg does.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import clone_state, weighted_mean
from flnotes.engine.train import batch_schedule

Grads = dict[str, torch.Tensor]


def loss_gradient(model, params: dict, x, y, loss_fn, weight_decay: float) -> tuple[Grads, float]:
    """The gradient of loss + wd/2 ||w||^2 at the model's current parameters; the loss."""
    loss = loss_fn(model(x), y)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    out = {}
    for (n, p), g in zip(params.items(), grads, strict=True):
        g = torch.zeros_like(p) if g is None else g
        out[n] = g + weight_decay * p.detach() if weight_decay else g
    return out, float(loss.detach())


class STEM(Strategy):
    """Local STORM momentum d on each client; the server averages models and momenta."""

    name = "stem"
    # local_update writes each client's direction d into self.directions: its clients train in the
    # loop
    parallel_clients = False
    checkpointed = {"direction": "state"}
    label = "STEM"
    own_momentum_note = "STEM's local momentum d, set by stem_a"
    runs_on_flower = False  # x and d are both sent and averaged
    settings = (
        Setting("stem_a", 0.1, "STEM: momentum parameter a of d = g(x) + (1 - a)(d - "
                "g(x_prev)); 1: plain SGD steps", source="STEM (Khanduri et al. 2021) Alg. 1; "
                "0.1 our choice (its experiments tune a)", minimum=0, maximum=1,
                open_minimum=True),
    )
    default_weighting = "uniform"  # Alg. 1: (1/K) sum over the clients
    custom_local_update = True  # two gradients per step at two points
    own_momentum = True  # d is the momentum: the local SGD runs without one

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.direction: Grads | None = None  # the server's d (None before round 1 ends)
        self.directions: dict[int, Grads] = {}  # this round's client d's

    def local_update(self, task, round: int, client: int, start, generator) -> ClientResult:
        """I steps of x <- x - eta d, then d <- g(x) + (1 - a)(d - g(x_prev)), one batch each."""
        config = self.config
        model = task.working_model()
        model.load_state_dict(start)
        model.train()
        params = dict(model.named_parameters())
        x, y = task.client_data(client)
        schedule = batch_schedule(len(y), config.local_epochs, config.batch_size, generator,
                                  x.device)
        lr, a, wd = self.local_lr(round), config.stem_a, config.weight_decay
        losses = []
        d = self.direction
        if d is None and schedule:  # d_0: the first batch's gradient at x_0
            d, _ = loss_gradient(model, params, x[schedule[0]], y[schedule[0]],
                                 task.loss_fn, wd)
        for idx in schedule:
            xb, yb = x[idx], y[idx]
            previous = {n: p.detach().clone() for n, p in params.items()}
            with torch.no_grad():
                for n, p in params.items():
                    p.sub_(d[n], alpha=lr)  # x_{t+1} = x_t - eta d_t
            g_new, loss = loss_gradient(model, params, xb, yb, task.loss_fn, wd)
            current = {n: p.detach().clone() for n, p in params.items()}
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(previous[n])
            g_old, _ = loss_gradient(model, params, xb, yb, task.loss_fn, wd)
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(current[n])
            d = {n: g_new[n] + (1.0 - a) * (d[n] - g_old[n]) for n in params}
            losses.append(loss)
        if schedule:
            self.directions[client] = d
        mean_loss = sum(losses) / len(losses) if losses else float("nan")
        return ClientResult(client, clone_state(model.state_dict()), len(y), mean_loss)

    def aggregate(self, round: int, results: list[ClientResult]):
        """x and d: the means of the sampled clients' (the two-sided momentum's server side)."""
        trained = [r for r in results if r.client in self.directions]
        if trained:
            weights = ([r.num_samples for r in trained] if self.config.weighting == "samples"
                       else [1.0] * len(trained))
            self.direction = OrderedDict(
                weighted_mean([self.directions[r.client] for r in trained], weights))
        self.directions = {}
        return super().aggregate(round, results)

    # ---- checkpoints ---------------------------------------------------------------
