"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation, partial participation (Alg. 1).

Round t, sampled clients P_t out of m, dispatched model theta^(t-1):

- local objective (eq. 1 / Alg. 1 l. 6):
      L_i(theta) - <grad L_i(theta_i^(t-1)), theta> + (alpha/2) ||theta - theta^(t-1)||^2
- client state (l. 7):  grad L_i(theta_i^t) = grad L_i(theta_i^(t-1))
                                              - alpha (theta_i^t - theta^(t-1))
- server (l. 9-10):     h^t = h^(t-1) - (alpha/m) sum_{i in P_t} (theta_i^t - theta^(t-1))
                        theta^t = (1/|P_t|) sum_{i in P_t} theta_i^t - h^t / alpha

Parametrisation (the authors' code, alpemreacar/FedDyn ``train_FedDyn``): both recursions
start at zero and subtract alpha times model displacements, so

    grad L_i(theta_i^t) = -alpha d_i,  d_i = sum over i's rounds of (theta_i - theta^(t-1))
    -h^t / alpha        = D,           D   = (1/m) sum over all m clients of d_i

The store keeps d_i per client (the code's ``local_param_list``, "-nabla/alpha"), the server
keeps D, and the local penalty is alpha <d_i, theta> + (alpha/2) ||theta - theta^(t-1)||^2.
Stored this way nothing divides by alpha, and alpha = 0 is well defined.

The neutral case, exactly: with alpha = 0 the local objective is L_i alone, so every
client trains as in FedAvg (round 1's client models equal FedAvg's bit for bit), but the
server still adds D: theta^t = mean_{P_t} theta_i^t + D^t, and D does not depend on alpha
(h / alpha is alpha-free). Under full participation round 1 gives 2 mean(theta_i) - theta^0,
twice FedAvg's step. No alpha makes FedDyn FedAvg; the paper never sets alpha = 0.

Decisions:

- default alpha (``feddyn_alpha``) = 0.01: the authors' CIFAR-10 example
  (``example_cifar_10.py``, alpha_coef = 1e-2); the paper searched {0.1, 0.01, 0.001}.
- The model dispatched and evaluated is theta^t (the authors' "cloud" model). Their code
  also reports the mean of the round's client models (``avg_model``); that is theta^t - D^t,
  not evaluated here.
- Aggregation: the uniform mean of l. 10 by default; ``weighting="samples"`` weights it by
  sample count. The authors' code divides alpha by n_i / mean(n) per client on unbalanced
  data; not done here (identical on balanced splits), because a strategy does not see
  client sizes before training.
- Momentum and weight decay act on the gradient of the whole local objective (the
  authors' code passes alpha + weight_decay as the optimiser's weight decay, i.e. the same
  quadratic; it uses momentum 0). BatchNorm running statistics get no d_i and are averaged.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.fedprox import proximal_term
from flnotes.algorithms.scaffold import trainable_layer_names, zeros_like_layers
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory

DRIFT = "drift:"  # anchor names of the client's d_i (a colon never appears in a module path)


def dynamic_penalty(params, anchor, alpha: float) -> torch.Tensor:
    """alpha <d_i, theta> + alpha/2 ||theta - theta^(t-1)||^2 over trainable params (l. 6)."""
    linear = sum((p * anchor[DRIFT + n]).sum() for n, p in params.items())
    return alpha * linear + proximal_term(params, anchor, alpha)


class FedDyn(Strategy):
    """FedAvg with a per-client linear term and a server that adds the clients' mean drift."""

    name = "feddyn"
    checkpointed = {"drift": "state", "store": ("object", "clients")}
    label = "FedDyn"
    runs_on_flower = False  # clients keep their gradient state between rounds
    settings = (
        Setting("feddyn_alpha", 0.01, "FedDyn: weight alpha of the dynamic regulariser (0: "
                "clients train as FedAvg, the server still adds the mean drift)",
                source="FedDyn (Acar et al. 2021) Alg. 1; 0.01, the authors' CIFAR-10 example",
                minimum=0),
    )
    default_weighting = "uniform"  # Alg. 1 l. 10

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.layers = trainable_layer_names(self.global_state)
        self.drift = zeros_like_layers(self.global_state, self.layers)  # D = -h / alpha
        device = next(iter(self.global_state.values())).device
        self.store = ClientStateStore(store_directory(self.config.run_dir, "feddyn"),
                                      self._new_drift, device=device)

    def _new_drift(self, client: int) -> OrderedDict[str, torch.Tensor]:
        return zeros_like_layers(self.global_state, self.layers)  # grad L_i(theta_i^0) = 0

    @property
    def alpha(self) -> float:
        """The regulariser's weight alpha (``feddyn_alpha``)."""
        return self.config.feddyn_alpha

    @property
    def has_penalty(self) -> bool:  # alpha = 0: the local objective is FedAvg's
        return self.alpha > 0

    @property
    def h(self) -> OrderedDict[str, torch.Tensor]:
        """The paper's server state h^t = -alpha D^t."""
        return OrderedDict((n, -self.alpha * d) for n, d in self.drift.items())

    def dispatch(self, round, clients):
        """theta^(t-1); the round's clients' d_i are read into memory."""
        self.store.hold(clients)
        return super().dispatch(round, clients)

    def penalty_anchor(self, start, client):
        """theta^(t-1) (the start) and, under ``drift:`` names, the client's d_i."""
        d_i = self.store.get(client)
        return {**start, **{DRIFT + n: d_i[n] for n in self.layers}}

    def local_penalty(self, params, anchor):
        """The linear and quadratic terms of the local objective."""
        return dynamic_penalty(params, anchor, self.alpha)

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict:
        """Clients' d_i, then D (i.e. h) and theta^t (Alg. 1 l. 7, 9, 10)."""
        start = self.global_state
        moved = OrderedDict((n, torch.zeros_like(d)) for n, d in self.drift.items())
        for r in results:
            d_i = self.store.get(r.client)
            step = {n: r.state[n] - start[n] for n in self.layers}
            self.store.put(r.client, OrderedDict((n, d_i[n] + step[n]) for n in self.layers),
                           round)
            for n in self.layers:
                moved[n] += step[n]
        self.store.release()
        # h^t = h^(t-1) - (alpha/m) sum(theta_i - theta^(t-1))  <=>  D^t = D^(t-1) + sum / m
        m = self.config.num_clients
        self.drift = OrderedDict((n, d + moved[n] / m) for n, d in self.drift.items())
        mean = self.average(results)
        for n in self.layers:  # theta^t = mean - h^t / alpha = mean + D^t
            mean[n] = mean[n] + self.drift[n]
        self.global_state = mean
        return mean
