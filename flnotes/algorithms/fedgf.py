"""FedGF (Lee and Yoon, ICML 2024, "Rethinking the Flat Minima Searching in Federated
Learning"): FedSAM whose clients take each step's gradient at a point between their own SAM
point and a perturbed *global* model, so that the search for flat minima aims at the global
objective's flatness, not only each client's ("flatness discrepancy").

Round t, global model w^t, the one before it w^(t-1), c^t in [0, 1] from the server:

    server, after aggregating:
        d       = w^(t-1) - w^t                              (the pseudo-gradient)
        w~^t    = w^t + rho_g d / ||d||                      (the perturbed global model)
        c^t     = mean over the last W rounds of [D^s > T_D],
        D^s     = mean over round s's clients k of ||w^(s-1) - w_k^s||   (their drift)
    client step at w (batch B):
        g       = grad L_B(w)
        e       = rho g / ||g||                              (SAM's local ascent)
        w_p     = c^t w~^t + (1 - c^t) (w + e)               (global and local perturbed points)
        w       <- SGD step from w with grad L_B(w_p)

so c = 0 is FedSAM's step and c = 1 takes every gradient at the perturbed global model.
The server's mean is FedAvg's (by client size).

Where this comes from. The paper's text was not reachable from this workplace; only its
abstract (PMLR 235:27037). Everything above is read from the authors' code,
hwan-sig/Official-FedGF at 36233b7: ``fedlab/contrib/algorithm/fedgf.py`` (server:
``calc_c`` and ``append_grad_norm`` for c, ``calc_perturbation`` for w~; client: ``train``
and ``weighted_sum`` for w_p), ``minimizers.py`` (the SAM ascent), ``tools/Lib/arg_parser.py``
and ``tools/experiments/cifar.sh`` (settings). Check against the paper before citing an
equation number.

Decisions (default first):

1. c (``gf_threshold`` T_D, ``gf_window`` W, ``gf_c``). The code always computes c as
   above (starting from c = 0), but its parser gives T_D no default (the comparison with
   None fails) and its example script passes ``--c_o 0.2`` / ``0.3``, an option the parser
   does not have; no version of the code runs as published. So the default is flnotes'
   choice, not the authors': c_o read as a fixed c, c = ``gf_c`` = 0.3 in every round from
   round 2 while ``gf_threshold`` is unset (c_o may as well have capped or scaled the
   windowed c). With a threshold, c is the code's windowed fraction (W = 30, the script's).
   The drift D^s is an unweighted mean over the round's clients of an L2 norm, and the
   window includes the round just aggregated (the code appends before it averages).
2. Round 1 has no perturbed global model: plain SAM steps (the code's ``perturb_parameters``
   is None until the first aggregation).
3. w_p interpolates points, not offsets (``weighted_sum``: perturbed global times c plus the
   current local SAM point times 1 - c); equivalently the offset from w is
   c (w~ - w) + (1 - c) e, so the global part also pulls towards the global model the
   client has left.
4. ||d|| has no epsilon in the code (0/0 when the global model did not move); here a model
   that did not move gives w~ = w^t.
5. rho (``gf_rho``) 0.1: the largest of the script's grid {0.02, 0.05, 0.1} and the rho its
   FedSAM runs use on CIFAR-10 at high heterogeneity; rho_g (``gf_global_rho``) = rho unless
   set (the code: ``g_rho`` defaults to ``rho``). SAM's norm gets flnotes' FedSAM epsilon
   (the code adds 1e-16), so c = 0 equals FedSAM at the same rho bit for bit.
6. Only trainable tensors enter the drift, d, w~ and w_p; BatchNorm statistics stay w's.
   The code's flat vectors are the whole state dict (FedLab's ``serialize_model``), buffers
   included, and its ``set_model`` puts the running statistics back every step; the two
   agree on models without BatchNorm (the code's CNN, flnotes' LeNet). The loss reported
   for a step is the one at w (FedSAM's).
7. Backends: the step needs the round's perturbed global model beside the batch's gradient,
   which the stacked two-pass SAM step does not take; clients train on the loop (said once).
8. Not on Flower: w~ and c are server state the client-side strategy does not receive.

Server state kept in checkpoints: w~ and the window of [D > T_D].
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.fedsam import ascent_offsets, gradient_at, sharpness_aware_gradient
from flnotes.algorithms.scaffold import trainable_layer_names
from flnotes.algorithms.settings import Setting

DEFAULT_C = 0.3  # the example script's --c_o 0.3, read as a fixed c (decision 1)
DEFAULT_WINDOW = 30  # the example script's --W 30


def perturbed_global(previous, current, rho_g: float) -> OrderedDict[str, torch.Tensor]:
    """w~ = w^t + rho_g d / ||d||, d = w^(t-1) - w^t over the trainable tensors; the other
    entries are w^t's. A global model that did not move gives w^t."""
    names = trainable_layer_names(current)
    d = {n: previous[n] - current[n] for n in names}
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in d.values()]))
    out = OrderedDict((n, t.clone()) for n, t in current.items())
    if norm > 0:
        for n in names:
            out[n] = current[n] + d[n] * (rho_g / norm)
    return out


def client_drift(start, results: list[ClientResult]) -> float:
    """D: the mean over the clients of ||w^(t-1) - w_k|| (trainable tensors together)."""
    names = trainable_layer_names(start)
    norms = [torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(start[n] - r.state[n]) for n in names])) for r in results]
    return float(torch.stack(norms).mean())


def interpolated_gradient(params, closure, rho: float, c: float, target) -> torch.Tensor:
    """Leave grad L(c w~ + (1 - c)(w + e)) in ``.grad``, the weights back at w; the loss at w."""
    loss = closure()  # g at w, for SAM's e
    offsets = ascent_offsets(params, rho, False, 0.0)
    with torch.no_grad():
        moved = {n: c * target[n].to(p.device, p.dtype)
                 + (1 - c) * (p + offsets[n] if n in offsets else p)
                 for n, p in params.items() if n in target}
    gradient_at(params, closure, moved)  # g at w_p replaces g
    return loss


class FedGF(Strategy):
    """FedSAM whose gradient is taken between the local SAM point and a perturbed global model."""

    name = "fedgf"
    label = "FedGF"
    checkpointed = {"perturbed": "state", "window": "tensor"}
    runs_on_flower = False  # w~ and c are server state
    settings = (
        Setting("gf_rho", 0.1, "FedGF: radius rho of the clients' SAM ascent",
                source="FedGF's code (hwan-sig/Official-FedGF): its script's grid "
                "{0.02, 0.05, 0.1}", minimum=0),
        Setting("gf_global_rho", None, "FedGF: radius rho_g of the perturbed global model "
                "w + rho_g d/||d||", kind=float, minimum=0, none_means="gf_rho",
                source="FedGF's code: g_rho defaults to rho"),
        Setting("gf_c", DEFAULT_C, "FedGF: weight c of the perturbed global model in the step's "
                "gradient point, used while gf_threshold is unset (0: FedSAM)",
                minimum=0, maximum=1, source="FedGF's example script (--c_o 0.2, 0.3), read "
                "as a fixed c"),
        Setting("gf_threshold", None, "FedGF: divergence threshold T_D; set, c is the share "
                "of the last gf_window rounds whose mean client drift exceeded it",
                kind=float, minimum=0, none_means="c fixed at gf_c",
                source="FedGF's code (calc_c; no default there)"),
        Setting("gf_window", DEFAULT_WINDOW, "FedGF: rounds W of the window c is read from",
                minimum=1, source="FedGF's example script (W=30)"),
    )
    default_weighting = "samples"
    loop_reason = ("takes its gradient at a point between the SAM point and a perturbed "
                   "global model, which the stacked two-pass step does not compute")

    @classmethod
    def config_warnings(cls, config) -> list[str]:
        """The setting that this run's rule for c does not read."""
        if config.gf_threshold is not None and config.gf_c != DEFAULT_C:
            return [f"gf_c={config.gf_c} is not read: with gf_threshold set, c is the share "
                    "of the last gf_window rounds above it"]
        if config.gf_threshold is None and config.gf_window != DEFAULT_WINDOW:
            return [f"gf_window={config.gf_window} is not read: without gf_threshold, c is "
                    "fixed at gf_c"]
        return []

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.perturbed: OrderedDict | None = None  # w~^t; None in round 1
        self.window = torch.zeros(0)  # [D^s > T_D] of the last W rounds, oldest first

    @property
    def rho(self) -> float:
        """The clients' SAM radius (``gf_rho``)."""
        return self.config.gf_rho

    @property
    def global_rho(self) -> float:
        """The perturbed global model's radius (``gf_global_rho``, else ``gf_rho``)."""
        rho_g = self.config.gf_global_rho
        return self.rho if rho_g is None else rho_g

    @property
    def c(self) -> float:
        """This round's weight of the perturbed global model."""
        if self.config.gf_threshold is None:
            return self.config.gf_c
        return float(self.window.mean()) if len(self.window) else 0.0

    @property
    def has_local_gradient(self) -> bool:  # rho = 0 and c = 0: FedAvg's plain steps
        return self.rho > 0 or (self.perturbed is not None and self.c > 0)

    def local_gradient(self, params, closure):
        """SAM's gradient in round 1 or at c = 0; else the gradient at w_p."""
        c = self.c
        if self.perturbed is None or c == 0:
            return sharpness_aware_gradient(params, closure, self.rho, False, 0.0)
        return interpolated_gradient(params, closure, self.rho, c, self.perturbed)

    def aggregate(self, round: int, results: list[ClientResult]):
        """FedAvg's mean; then c's window, and w~ from the step just taken."""
        start = self.global_state
        if self.config.gf_threshold is not None:
            above = float(client_drift(start, results) > self.config.gf_threshold)
            self.window = torch.cat([self.window, torch.tensor([above])])[-self.config.gf_window:]
        new = super().aggregate(round, results)
        self.perturbed = perturbed_global(start, new, self.global_rho)
        return new
