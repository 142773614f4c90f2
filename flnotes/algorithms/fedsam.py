"""FedSAM and FedASAM (Caldarola, Caputo, Ciccone, ECCV 2022): FedAvg whose clients take
sharpness-aware steps, so the local models and their average sit in flatter regions.

Each local step on a batch B takes two forward-backward passes (SAM: Foret et al. 2021;
ASAM: Kwon et al., ICML 2021, eq. 9-10 there):

    g      = grad L_B(w)                                   (first pass, the reported loss)
    e      = rho * T_w^2 g / ||T_w g||                     (ascent to the worst nearby point)
    g_sam  = grad L_B(w + e)                               (second pass)
    w      <- SGD step from w (not from w + e) with g_sam  (momentum and weight decay as usual)

FedSAM is SAM: T_w = I, so e = rho g / ||g||. FedASAM is ASAM: T_w = diag(|w| + eta)
elementwise, which makes the neighbourhood scale with the weights. The server is FedAvg's
(the weighted mean of the local models).

Decisions where the papers leave room (we follow the authors' code, debcaldarola/fedsam,
whose minimizers are ASAM's own):

- T_w = |w| + eta applies to tensors whose name contains "weight" (layer and BatchNorm
  weights); biases, and every other parameter, use T_w = 1 (ASAM's code does the same).
  On the 2-parameter toy, whose parameters are named x and y, FedASAM is therefore FedSAM.
- ||T_w g|| gets 1e-16 added (as the code), so a zero gradient gives no step, not 0/0.
- The ascent direction uses the loss gradient only: weight decay and momentum belong to the
  descent step, which the configured SGD takes at the unperturbed weights.
- The weights are put back by copying the saved tensors (the code subtracts e, which is
  the same up to float rounding).
- Both passes run in train mode, so BatchNorm's running statistics move twice per step, the
  second time with the perturbed weights (as the code's two forward calls do).
- rho: the papers tune it per data set. Defaults (``sam_rho`` None): FedSAM 0.05 (SAM's
  default, Foret et al.), FedASAM 0.5 with eta 0.01 (ASAM's defaults, also the defaults of
  the FedSAM code's ASAM minimizer). rho = 0 is exactly FedAvg: the strategy then skips the
  second pass.
- Not built: FedSAM's server-side SWA variant.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from flnotes.algorithms.base import Strategy

GRAD_NORM_EPS = 1e-16  # added to ||T_w g|| as in the authors' code


def adaptive_scale(name: str, weight: torch.Tensor, eta: float) -> torch.Tensor | None:
    """ASAM's T_w for one tensor: |w| + eta for weights, None (identity) for the rest."""
    return weight.abs() + eta if "weight" in name else None


@torch.no_grad()
def ascent_offsets(params: dict[str, torch.Tensor], rho: float, adaptive: bool,
                   eta: float) -> dict[str, torch.Tensor]:
    """e = rho T^2 g / ||T g|| from the gradients in ``.grad`` (T = I unless adaptive)."""
    scales, scaled = {}, {}
    for n, p in params.items():
        if p.grad is None:  # a parameter the loss does not use is not perturbed
            continue
        scales[n] = adaptive_scale(n, p, eta) if adaptive else None
        scaled[n] = p.grad if scales[n] is None else scales[n] * p.grad  # T g
    if not scaled:
        return {}
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t) for t in scaled.values()])) + GRAD_NORM_EPS
    return {n: (t if scales[n] is None else scales[n] * t) * (rho / norm)  # T (T g)
            for n, t in scaled.items()}


def sharpness_aware_gradient(params: dict[str, torch.Tensor], closure: Callable[[], torch.Tensor],
                             rho: float, adaptive: bool, eta: float) -> torch.Tensor:
    """Leave the gradient at w + e in ``.grad`` with the weights back at w; the loss at w."""
    loss = closure()  # g at w
    offsets = ascent_offsets(params, rho, adaptive, eta)
    saved = {}
    with torch.no_grad():
        for n, e in offsets.items():
            saved[n] = params[n].detach().clone()
            params[n].add_(e)
    closure()  # g at w + e replaces g
    with torch.no_grad():
        for n, w in saved.items():
            params[n].copy_(w)
    return loss


class FedSAM(Strategy):
    """FedAvg with SAM's two-pass local step (``adaptive`` False) or ASAM's (True)."""

    name = "fedsam"
    default_weighting = "samples"
    adaptive = False
    default_rho = 0.05  # SAM's default (Foret et al. 2021)

    @property
    def rho(self) -> float:
        """The neighbourhood radius: ``sam_rho``, or this method's default when None."""
        return self.default_rho if self.config.sam_rho is None else self.config.sam_rho

    @property
    def has_local_gradient(self) -> bool:  # rho = 0 is exactly FedAvg: one pass is enough
        return self.rho > 0

    def local_gradient(self, params, closure):
        """The gradient at the ascent point w + e, applied from w."""
        return sharpness_aware_gradient(params, closure, self.rho, self.adaptive,
                                        self.config.asam_eta)


class FedASAM(FedSAM):
    """FedSAM with ASAM's adaptive neighbourhood T_w = |w| + eta."""

    name = "fedasam"
    adaptive = True
    default_rho = 0.5  # ASAM's default (Kwon et al. 2021; the FedSAM code's ASAM minimizer)
