"""MimeLite (Karimireddy et al., "Breaking the centralized barrier for cross-device federated
learning", NeurIPS 2021; Mime and MimeLite): clients take the server optimiser's steps with
its state held fixed, and the server updates that state from full-batch gradients.

The base optimiser here is SGD with heavy-ball momentum m (the server state s). A round:

- the server sends x and m; each sampled client i computes the full-batch gradient of its
  loss at x, c_i = grad f_i(x) (for the server only), and takes its local steps with m
  fixed:  y <- y - eta (g_i(y) + beta m)        (MimeLite: U(g, s) with s not updated)
- the server averages the updates, x <- x - eta_g mean_i (x - y_i), and updates its state
  with the mean full-batch gradient:  m <- c_bar + beta m,  c_bar = sum_i n_i c_i / sum n_i.

FedUp (its Sec. 4) notes that with few clients per round c_bar, the state's only input,
rests on few clients; that is the regime of its Table 5.

Decisions where the paper leaves room (FedJAX's mime_lite.py, by the paper's group, where
the paper is silent):

- Momentum form: FedJAX's optax SGD, m <- g + beta m and a step of eta m (PyTorch's SGD
  form too), so a round with m = 0 (round 1, or beta = 0) is FedAvg's round bit for bit.
  beta = ``mime_beta``, default 0.9 (Mime's experiments with SGD + momentum).
- The local SGD has no momentum of its own: the momentum is the server's, so the config's
  ``momentum`` must be 0. Weight decay, if any, is part of g (as FedJAX's regulariser).
- Weighting: the updates and the full-batch gradients are weighted by sample counts, as
  FedJAX does; eta_g = ``server_lr`` (1: x is the mean of the y_i).
- c_i: the mean loss gradient over the client's training samples in train mode (BatchNorm
  on each batch of ``batch_size``), summed batch by batch; its BatchNorm updates are
  discarded (local training restarts from x).
- m covers the trainable parameters; BatchNorm statistics are averaged as FedAvg does.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import state_add, state_sub
from flnotes.engine.train import local_sgd


def full_batch_gradient(model, start, x, y, loss_fn, batch_size: int) -> dict[str, torch.Tensor]:
    """sum over the client's samples of the loss gradient at ``start`` (n times the mean)."""
    model.load_state_dict(start)
    model.train()
    params = dict(model.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for begin in range(0, len(y), batch_size):
        xb, yb = x[begin:begin + batch_size], y[begin:begin + batch_size]
        grads = torch.autograd.grad(loss_fn(model(xb), yb) * len(yb), list(params.values()),
                                    allow_unused=True)
        for n, g in zip(params, grads, strict=True):
            if g is not None:
                total[n] += g
    return total


class MimeLite(Strategy):
    """FedAvg whose clients step with the server's momentum, held fixed within a round."""

    name = "mimelite"
    # local_update writes each client's full-batch gradient into self.gradients: its clients train
    # in the loop
    parallel_clients = False
    checkpointed = {"momentum": "state"}
    label = "MimeLite"
    own_momentum_note = "the server's momentum mime_beta"
    runs_on_flower = False  # clients need the server's momentum and full-batch gradients
    settings = (
        Setting("mime_beta", 0.9, "MimeLite: momentum beta of the server state the clients "
                "step with", source="Mime (Karimireddy et al. 2021) Alg. 2; SGD + momentum "
                "0.9 in its runs", minimum=0, maximum=1, open_maximum=True),
        Setting("server_lr", 1.0, "server step size eta_g on the mean client update (1: "
                "FedAvg's mean)", source="Mime Alg. 2 (the server's step); 1 as SCAFFOLD",
                minimum=0, open_minimum=True),
    )
    default_weighting = "samples"
    custom_local_update = True  # a full-batch gradient besides the local steps
    own_momentum = True  # the server's m: the local SGD runs without momentum

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.momentum: OrderedDict[str, torch.Tensor] | None = None  # m, created lazily
        self.gradients: dict[int, tuple[dict, int]] = {}  # this round's sum of c_i, n_i

    def local_update(self, task, round: int, client: int, start, generator) -> ClientResult:
        """c_i at x, then local SGD whose gradient gets beta m added."""
        config = self.config
        model = task.working_model()
        x, y = task.client_data(client)
        if len(y):
            self.gradients[client] = (full_batch_gradient(model, start, x, y, task.loss_fn,
                                                          config.batch_size), len(y))
        momentum, beta = self.momentum, config.mime_beta

        def with_server_momentum(params, closure):
            loss = closure()
            with torch.no_grad():
                for n, p in params.items():
                    if p.grad is not None:
                        p.grad.add_(momentum[n], alpha=beta)
            return loss

        fixed = momentum is not None and beta > 0
        state, loss = local_sgd(
            model, start, x, y, epochs=config.local_epochs, batch_size=config.batch_size,
            lr=self.local_lr(round), momentum=0.0, weight_decay=config.weight_decay,
            generator=generator, loss_fn=task.loss_fn,
            local_gradient=with_server_momentum if fixed else None)
        return ClientResult(client, state, len(y), loss)

    def aggregate(self, round: int, results: list[ClientResult]):
        """x <- x - eta_g (x - mean y); m <- c_bar + beta m."""
        if self.gradients:
            count = sum(n for _, n in self.gradients.values())
            c_bar = OrderedDict()
            for total, _ in self.gradients.values():
                for n, g in total.items():
                    c_bar[n] = c_bar[n] + g if n in c_bar else g.clone()
            c_bar = OrderedDict((n, g / count) for n, g in c_bar.items())
            beta = self.config.mime_beta
            self.momentum = c_bar if self.momentum is None else OrderedDict(
                (n, g + beta * self.momentum[n]) for n, g in c_bar.items())
        self.gradients = {}
        mean = self.average(results)
        if self.config.server_lr != 1:
            mean = state_add(self.global_state, state_sub(mean, self.global_state),
                             self.config.server_lr)
        self.global_state = mean
        return mean

    # ---- checkpoints ---------------------------------------------------------------
