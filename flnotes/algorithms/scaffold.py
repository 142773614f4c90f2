"""SCAFFOLD (Karimireddy et al., ICML 2020), partial participation, option II control variates.

Each client i keeps a control variate c_i, the server keeps c; both start at zero. A round
(the paper's Algorithm 1, with S the sampled clients and N all clients):

- local steps from the global model x:  y <- y - eta_l (g_i(y) - c_i + c)          (l. 10)
- option II:  c_i+ = c_i - c + (x - y_i) / (K eta_l)                                (l. 12)
- server:     x <- x + eta_g * mean_{i in S} (y_i - x)                             (l. 16)
              c <- c + (|S| / N) * mean_{i in S} (c_i+ - c_i)                     (l. 17)

The correction -c_i + c is the gradient of the linear term <y, c - c_i>, so it is written
as :meth:`Scaffold.local_penalty` and both training backends run it unchanged (the anchor
carries c - c_i per client under ``control:`` names, as FedUp carries X^(t-1)). Clients that
sit a round out keep their c_i in the engine's client state store
(:mod:`flnotes.engine.client_state`): on disk in a run folder, one file per client.

Decisions where the paper leaves room:

- K is the number of local steps the client actually took: local_epochs x ceil(n_i / B)
  (the engine's batch schedule, short last batch included). The paper fixes K for every
  client; with epochs over unequal data K differs per client, and option II divides the
  client's own displacement by its own step count. A client with no samples takes no
  step: its c_i stays.
- eta_g (``server_lr``) defaults to 1, the paper's experiments (Sec. 7: "global step-size
  1"); eta_g = 1 sets x to the mean of the y_i directly (no x + (mean - x) rounding), so
  round 1, where every control variate is zero, equals FedAvg's round 1 bit for bit.
- Aggregation of models: the uniform mean of l. 16 by default (``weighting="uniform"``);
  ``weighting="samples"`` weights the y_i by sample count. c is always updated with the
  uniform 1/N of l. 17, which keeps c equal to the mean of all N client variates (the
  invariant the method rests on).
- Momentum and weight decay: the paper analyses plain SGD. Here the correction is part
  of the gradient, so ``weight_decay`` adds wd * y to it (the same term for every client,
  part of each client's objective) and ``momentum`` averages the corrected gradient. With
  momentum m, K steps of a constant gradient g move the model by eta_l * S(K, m) * g with
  S(K, m) = sum_{k=1..K} (1 - m^k) / (1 - m) (the buffer starts empty each round), not
  eta_l * K * g; option II divides by eta_l * S(K, m) (:func:`effective_steps`) so that
  c_i+ still estimates the client's mean gradient. S(K, 0) = K: the paper's formula. Without
  this, momentum 0.9 makes the variates about 10 times too large and the run diverges.
- Control variates cover trainable layers only: BatchNorm's running statistics (the only
  float buffers of the registry's models) are averaged like FedAvg and get none.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory
from flnotes.engine.state import is_float_layer, state_add, state_sub

CONTROL = "control:"  # anchor names of c - c_i (a colon never appears in a module path)

# Float buffers of the registry's models (BatchNorm statistics): no gradient, so no
# control variate or dual variable belongs to them.
_STATISTICS = ("running_mean", "running_var")


def trainable_layer_names(state) -> list[str]:
    """Float layers of a state that are trained (not BatchNorm running statistics)."""
    return [n for n, t in state.items()
            if is_float_layer(t) and n.rsplit(".", 1)[-1] not in _STATISTICS]


def zeros_like_layers(state, names) -> OrderedDict[str, torch.Tensor]:
    """Zeros shaped like the named layers of ``state``."""
    return OrderedDict((n, torch.zeros_like(state[n])) for n in names)


def local_steps(num_samples: int, epochs: int, batch_size: int) -> int:
    """Steps of the engine's batch schedule: ``epochs`` passes of ceil(n / B) batches."""
    return epochs * math.ceil(num_samples / batch_size)


def control_penalty(params, anchor) -> torch.Tensor:
    """<y, c - c_i> over trainable params; its gradient is the correction c - c_i (l. 10)."""
    return sum((p * anchor[CONTROL + n]).sum() for n, p in params.items())


def effective_steps(steps: int, momentum: float) -> float:
    """S(K, m) = sum_{k=1..K} (1 - m^k) / (1 - m): how many plain-SGD steps K heavy-ball steps
    of one constant gradient amount to (K when m = 0)."""
    if momentum == 0:
        return float(steps)
    return sum((1 - momentum ** k) / (1 - momentum) for k in range(1, steps + 1))


class Scaffold(Strategy):
    """FedAvg whose local gradients are corrected by control variates c - c_i."""

    name = "scaffold"
    checkpointed = {"control": "state", "store": ("object", "clients")}
    label = "SCAFFOLD"
    runs_on_flower = False  # clients keep control variates the server reads back
    settings = (
        Setting("server_lr", 1.0, "server step size eta_g on the mean client update (1: "
                "FedAvg's mean)", source="SCAFFOLD (Karimireddy et al. 2020) Alg. 1 l.17; "
                "eta_g = 1 in its experiments", minimum=0, open_minimum=True),
    )
    default_weighting = "uniform"  # Alg. 1 l. 16
    has_penalty = True  # the correction; zero in round 1, where it changes nothing

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.layers = trainable_layer_names(self.global_state)
        self.control = zeros_like_layers(self.global_state, self.layers)  # c
        device = next(iter(self.global_state.values())).device
        self.store = ClientStateStore(store_directory(self.config.run_dir, "scaffold"),
                                      self._new_variate, device=device)

    def _new_variate(self, client: int) -> OrderedDict[str, torch.Tensor]:
        return zeros_like_layers(self.global_state, self.layers)  # c_i = 0 (Alg. 1 input)

    def dispatch(self, round, clients):
        """The global model; the round's control variates are read into memory."""
        self.store.hold(clients)
        return super().dispatch(round, clients)

    def penalty_anchor(self, start, client):
        """The start state and, under ``control:`` names, c - c_i."""
        c_i = self.store.get(client)
        return {**start, **{CONTROL + n: self.control[n] - c_i[n] for n in self.layers}}

    def local_penalty(self, params, anchor):
        """The linear term whose gradient corrects the client's drift."""
        return control_penalty(params, anchor)

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict:
        """Option II variates for the round's clients; then x and c (l. 12, 16, 17)."""
        x, lr = self.global_state, self.config.lr
        total_change = OrderedDict((n, torch.zeros_like(c)) for n, c in self.control.items())
        for r in results:
            c_i = self.store.get(r.client)
            steps = local_steps(r.num_samples, self.config.local_epochs, self.config.batch_size)
            if steps == 0:
                continue  # no step taken: nothing measured, c_i stays
            scale = effective_steps(steps, self.config.momentum) * lr
            new_c_i = OrderedDict(
                (n, c_i[n] - self.control[n] + (x[n] - r.state[n]) / scale)
                for n in self.layers)
            for n in self.layers:
                total_change[n] += new_c_i[n] - c_i[n]
            self.store.put(r.client, new_c_i, round)
        self.store.release()
        mean = self.average(results)
        if self.config.server_lr != 1:
            mean = state_add(x, state_sub(mean, x), self.config.server_lr)
        # (|S|/N) * mean of the changes = (1/N) * their sum.
        n_clients = self.config.num_clients
        self.control = OrderedDict((n, c + total_change[n] / n_clients)
                                   for n, c in self.control.items())
        self.global_state = mean
        return mean
