"""FedSMOO (Sun et al., "Dynamic Regularized Sharpness Aware Minimization in Federated Learning:
Approaching Global Consistency and Smooth Landscape", ICML 2023): FedDyn's dynamic
regulariser for the models plus SAM whose perturbation is steered towards a global one.

FedSAM perturbs each client towards its own sharpest direction, which drifts with its data.
FedSMOO keeps a second dual variable per client, mu_i, on the perturbation, and the server
keeps a global perturbation s, so that the clients' ascent steps agree. A local step on a
batch, at w (the authors' DRegSAM optimiser and fedsmoo client in woodenchild95/FL-Simulator,
the first author's code):

    g      = grad L_B(w)
    g~     = g - mu_i - s                          (the ascent direction, corrected)
    e      = rho g~ / ||g~||
    mu_i  <- mu_i + e - s                          (the perturbation's dual ascent)
    w     <- w - eta ( grad L_B(w + e) + alpha (d_i + w - w_t) )    (SAM's gradient plus
                                                   FedDyn's: d_i the client's drift, w_t the
                                                   dispatched model; flnotes.algorithms.feddyn)

and after the round the server updates FedDyn's state and model (mean of the clients plus
the mean drift D) and sets s = rho mean_i(mu_i) / ||mean_i(mu_i)|| over the round's clients.

Decisions (the code, where the paper is silent):

- s: the code's simplification ("ignoring the s^_{i,K} term, its norm is small"), as above.
  s and every mu_i start at zero.
- alpha (``smoo_alpha``) = 0.1 and rho (``smoo_rho``) = 0.1: the simulator's defaults
  (--lamb, --rho). FedDyn's own default alpha (0.01) is its authors'; the two are kept
  apart so that each setting means one thing.
- The norm ||g~|| gets 1e-7 added (the code); both passes run in train mode.
- Not copied: the simulator clips every method's local gradient to norm 10 (a harness-wide
  choice, not FedSMOO's); flnotes clips no method's gradients.
- rho = 0: no perturbation (e = 0, mu_i and s stay 0), so FedSMOO is FedDyn with alpha =
  smoo_alpha, and then runs FedDyn's own local path (bit for bit).
- The local SGD's momentum and weight decay act as for every method (the code: none, and
  the configured weight decay). mu_i lives in the per-client store next to FedDyn's d_i.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.feddyn import FedDyn
from flnotes.algorithms.fedsam import gradient_at
from flnotes.algorithms.scaffold import zeros_like_layers
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory
from flnotes.engine.train import local_sgd

ASCENT_EPS = 1e-7  # added to ||g~|| (the code)


class FedSMOO(FedDyn):
    """FedDyn with a sharpness-aware step whose perturbation is steered by mu_i and s."""

    name = "fedsmoo"
    # local_update writes each client's new dual into self.new_duals: its clients train in the loop
    parallel_clients = False
    checkpointed = {"perturbation": "state", "duals": "object"}
    label = "FedSMOO"
    settings_not_read = ("feddyn_alpha",)  # smoo_alpha is its regulariser's weight
    settings = (
        Setting("smoo_alpha", 0.1, "FedSMOO: weight alpha of its FedDyn-style dynamic "
                "regulariser", source="FedSMOO (Sun et al. 2023) Alg. 1; the first author's "
                "simulator default (--lamb)", minimum=0),
        Setting("smoo_rho", 0.1, "FedSMOO: SAM radius rho of the globally steered "
                "perturbation (0: FedDyn)", source="FedSMOO Alg. 1; the simulator's --rho",
                minimum=0),
    )
    custom_local_update = True  # the step needs the client's mu_i and drift

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.perturbation = zeros_like_layers(self.global_state, self.layers)  # s
        device = next(iter(self.global_state.values())).device
        self.duals = ClientStateStore(store_directory(self.config.run_dir, "fedsmoo-mu"),
                                      self._new_drift, device=device)  # mu_i, zeros at first
        self.new_duals: dict[int, OrderedDict] = {}

    @property
    def alpha(self) -> float:
        """FedSMOO's dynamic-regulariser weight (``smoo_alpha``)."""
        return self.config.smoo_alpha

    def dispatch(self, round, clients):
        self.duals.hold(clients)
        return super().dispatch(round, clients)

    def local_update(self, task, round: int, client: int, start, generator) -> ClientResult:
        """FedDyn's local SGD, each step's gradient taken FedSMOO's way (rho > 0)."""
        config, rho, alpha = self.config, self.config.smoo_rho, self.alpha
        model = task.working_model()
        x, y = task.client_data(client)
        anchor = self.penalty_anchor(start, client)
        common = dict(epochs=config.local_epochs, batch_size=config.batch_size,
                      lr=self.local_lr(round), momentum=config.momentum,
                      weight_decay=config.weight_decay, generator=generator,
                      loss_fn=task.loss_fn)
        if rho == 0:  # FedDyn's path exactly
            state, loss = local_sgd(model, start, x, y, penalty=self.local_penalty if
                                    self.has_penalty else None, anchor=anchor, **common)
            return ClientResult(client, state, len(y), loss)
        mu = OrderedDict((n, t.clone()) for n, t in self.duals.get(client).items())
        s = self.perturbation
        drift = self.store.get(client)

        def steered_sam(params, closure):
            loss = closure()  # g at w (the loss alone: no penalty in this closure)
            with torch.no_grad():
                ascent = {n: params[n].grad - mu[n] - s[n] for n in self.layers
                          if params[n].grad is not None}
                norm = torch.linalg.vector_norm(torch.stack(
                    [torch.linalg.vector_norm(a) for a in ascent.values()])) + ASCENT_EPS
                moved = {}
                for n, a in ascent.items():
                    e = a * (rho / norm)
                    mu[n] += e - s[n]
                    moved[n] = params[n] + e
            gradient_at(params, closure, moved)  # g at w + e
            with torch.no_grad():
                for n in self.layers:  # FedDyn's gradient at w: alpha (d_i + w - w_t)
                    if params[n].grad is not None:
                        params[n].grad.add_(drift[n] + params[n] - start[n], alpha=alpha)
            return loss

        state, loss = local_sgd(model, start, x, y, local_gradient=steered_sam, **common)
        if len(y):
            self.new_duals[client] = mu
        return ClientResult(client, state, len(y), loss)

    def aggregate(self, round: int, results: list[ClientResult]):
        """FedDyn's server; the clients' mu_i stored; s from their mean."""
        if self.new_duals:
            for client, mu in self.new_duals.items():
                self.duals.put(client, mu, round)
            mean = OrderedDict((n, torch.stack([mu[n] for mu in self.new_duals.values()])
                                .mean(0)) for n in self.layers)
            norm = torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(t) for t in mean.values()])) + ASCENT_EPS
            self.perturbation = OrderedDict(
                (n, t * (self.config.smoo_rho / norm)) for n, t in mean.items())
        self.new_duals = {}
        self.duals.release()
        return super().aggregate(round, results)

    # ---- checkpoints ---------------------------------------------------------------
