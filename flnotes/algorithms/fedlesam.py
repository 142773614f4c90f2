"""FedLESAM (Fan, Hu, Yao, Niu, Zhang, Sugiyama, Wang, ICML 2024, "Locally Estimated Global
Perturbations are Better than Local Perturbations for Federated Sharpness-aware
Minimization"): FedAvg whose clients take sharpness-aware steps towards a *global*
perturbation that they estimate from the global models, so each step needs one gradient,
not SAM's two.

Round t, dispatched global model w^t, the global model of the round before w^(t-1):

    d       = w^(t-1) - w^t                       (the estimated global ascent direction: the
                                                   global loss rose from w^t back to w^(t-1))
    e       = rho d / (||d|| + 1e-7)              (one offset per round, fixed for its steps)
    g       = grad L_B(w + e)                     (the step's only forward-backward pass)
    w       <- SGD step from w (not w + e) with g (weight decay as configured)

and the server is FedAvg's (the weighted mean of the local models). This is FedSAM's step
(flnotes.algorithms.fedsam: e = rho g / ||g||, g from an extra pass at w) with the local
ascent direction replaced by the global one.

Where this comes from. The paper's text beyond its abstract was not available to us when
this was written (no equation numbers are quoted here for that reason: check them against
the paper before citing); the abstract states the rule ("locally estimates the direction of
global perturbation on client side as the difference between global models received in the
previous active and current rounds"; "only performs once backpropagation in each
iteration"). The rest is read from the authors' code, MediaBrain-SJTU/FedLESAM at d6663cc:
``optimizer/LESAM.py`` (the step), ``client/fedlesam.py`` (the local loop),
``server/FedLESAM.py`` (what the server sends), ``train.py`` (defaults).

Decisions (paper reading / code reading; default first):

1. Which "previous" global model. The abstract: the global model the client received in
   its previous *active* round (per client, w_i^old). The code (server/FedLESAM.py l. 28-29,
   LESAM.py l. 48): the server's last global step, eta_g * mean update = w^t - w^(t-1),
   the same for every client of the round. Default: the last global step (the code; also
   how this method was specified to flnotes). The two agree under full participation; under
   partial participation the paper's reading needs a per-client memory (the global model
   each client last received) and a per-client direction, which flnotes' local-gradient
   hook (called without the client) does not carry. Not implemented.
2. The first round (no previous global model): e = 0, plain SGD steps (the code: its
   ``global_update`` is None in round 1 and LESAM.first_step skips the perturbation).
3. The norm ||d||: the L2 norm over all trainable tensors together (the paper's and SAM's
   ||.||). The code indexes the flat update vector by the parameter tensor's position
   (LESAM.py l. 32 and 48, ``g_update[idx]`` with idx the index of the tensor in the
   parameter list), so it perturbs tensor k by the scalar -rho u_k / sum_j |u_j| built from
   the first few entries u of the flat update: a defect, not followed.
4. 1e-7 is added to ||d|| (LESAM.py l. 37), so a global model that did not move (d = 0)
   gives no perturbation, not 0/0.
5. The offset is applied to trainable parameters only (the code's flat vector is
   ``model.parameters()``); BatchNorm running statistics are neither perturbed nor part of
   the norm. The forward pass at w + e runs in train mode, so BatchNorm's running
   statistics move once per step, computed at the perturbed weights (as the code's).
6. The loss reported for a local step is the loss at w + e, the step's only forward pass
   (the loss at w is never computed; computing it would cost the pass FedLESAM saves).
7. Weight decay and momentum act in the descent step at w, through the configured SGD (the
   code's base optimizer: SGD with weight decay, no momentum). The code also clips each
   step's gradient to norm 10 (client/fedlesam.py l. 29, as all its methods); flnotes clips
   for no method and does not here.
8. rho (``lesam_rho``): 0.1, the code's default (train.py ``--rho``); its README runs
   FedLESAM-S at 0.5 and says rho needs tuning. rho = 0 is exactly FedAvg: the strategy then
   takes the plain one-pass step.
9. Backends: the step's gradient is taken at an offset from the global models, not from the
   batch's gradient, which the stacked (vmap) backend's two-pass SAM step does not compute;
   clients train on the loop backend, said once (``loop_reason``), with the same results.
10. Not on Flower: the offset is server state (the previous global model) that Flower's
    client-side strategy does not receive.

Server state kept in checkpoints: the previous global model w^(t-1).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.fedsam import gradient_at
from flnotes.algorithms.scaffold import trainable_layer_names
from flnotes.algorithms.settings import Setting

NORM_EPS = 1e-7  # added to ||d|| as in the authors' code (optimizer/LESAM.py l. 37)


def global_offsets(previous, current, rho: float) -> OrderedDict[str, torch.Tensor]:
    """e = rho d / (||d|| + 1e-7), d = previous - current over the trainable layers;
    empty when there is no previous model (the first round)."""
    if previous is None:
        return OrderedDict()
    names = trainable_layer_names(current)
    d = OrderedDict((n, previous[n] - current[n]) for n in names)
    if not d:
        return OrderedDict()
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t) for t in d.values()]))
    scale = rho / (norm + NORM_EPS)
    return OrderedDict((n, t * scale) for n, t in d.items())


def perturbed_gradient(params: dict[str, torch.Tensor], closure, offsets) -> torch.Tensor:
    """Leave grad L(w + e) in ``.grad`` with the weights back at w; the loss at w + e."""
    with torch.no_grad():
        moved = {n: params[n] + e.to(params[n].device, params[n].dtype)
                 for n, e in offsets.items() if n in params}
    return gradient_at(params, closure, moved)


class FedLESAM(Strategy):
    """FedAvg whose local steps take the gradient at w + rho d/||d||, d = w^(t-1) - w^t."""

    name = "fedlesam"
    label = "FedLESAM"
    checkpointed = {"previous": "state"}
    runs_on_flower = False  # the offset comes from server state the client does not see
    settings = (
        Setting("lesam_rho", 0.1, "FedLESAM: radius rho of the estimated global perturbation "
                "rho (w_prev - w)/||w_prev - w|| (0: FedAvg)",
                source="FedLESAM (Fan et al. 2024); 0.1, the authors' code's default "
                "(train.py --rho)", minimum=0),
    )
    default_weighting = "samples"
    loop_reason = ("takes its one gradient at an offset from the global models, not from "
                   "the batch's gradient, which the stacked two-pass step does not compute")

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.previous: OrderedDict | None = None  # w^(t-1); None before the first aggregate
        self.offsets: OrderedDict[str, torch.Tensor] = OrderedDict()  # e of this round

    @property
    def rho(self) -> float:
        """The perturbation radius (``lesam_rho``)."""
        return self.config.lesam_rho

    @property
    def has_local_gradient(self) -> bool:  # rho = 0 is exactly FedAvg: plain steps
        return self.rho > 0

    def dispatch(self, round: int, clients: list[int]):
        """w^t to every client; fixes this round's offset e from w^(t-1) - w^t."""
        self.offsets = global_offsets(self.previous, self.global_state, self.rho)
        return super().dispatch(round, clients)

    def local_gradient(self, params, closure):
        """The gradient at w + e (one pass), applied from w."""
        if not self.offsets:
            return closure()
        return perturbed_gradient(params, closure, self.offsets)

    def aggregate(self, round: int, results: list[ClientResult]):
        """FedAvg's mean; the model it replaces becomes w^(t-1) for the next round."""
        self.previous = self.global_state
        return super().aggregate(round, results)
