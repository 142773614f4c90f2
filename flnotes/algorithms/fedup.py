"""FedUp (Wan et al., Sci Sin Inform 2024): each client minimises an upper bound of the global loss.

Local objective (FedUp eq. 6, Alg. 1 l.5), over the trainable parameters X:

    F_i(X) + (alpha/eta) <X^(t-1) - X^t, X - X^t> + (alpha/2) ||X - X^t||^2

X^t is the global model dispatched this round, X^(t-1) the one dispatched the round before
and eta the local learning rate. (alpha/eta)(X^(t-1) - X^t) is the paper's estimate of the
global gradient at X^t (Sec. 5.2), so the linear term is the first-order part of the smooth
upper bound of eq. 5 and the quadratic is its curvature part with alpha in place of the
smoothness constant. Its gradient is (alpha/eta)(X^(t-1) - X^t) + alpha (X - X^t): one SGD
step on the penalty alone, from X^t, moves by alpha (X^t - X^(t-1)), i.e. along the last
global update.

Decisions:

- X^(-1) = X^0: in round 1 there is no previous global model, so the linear term vanishes
  and round 1 is FedProx with mu = alpha. (Alg. 1 takes X^0 as input but dispatches X^t from
  t = 1 and never defines the model before it; this is the only reading without a made-up
  update.)
- Alg. 1 l.5 writes F(X^t) for the first term of h_i; eq. 6 writes F_i(X), which is what a
  client can train on, so F_i(X) it is (the F(X^t) of eq. 5 is a constant the paper drops).
- default alpha = 0.01 (the paper does not report its value). Theorem 1's error term
  (alpha K - 1)^2 says the global-gradient estimate is right when alpha ~ 1/K for K local
  SGD steps without momentum (X^(t-1) - X^t ~ eta K grad F); with momentum m the update is
  about 1/(1-m) larger, so alpha ~ (1-m)/K. The paper's settings (1 epoch, batch 16-32)
  give K ~ 12-32 steps, i.e. alpha ~ 0.03-0.08; our default schedules (5 epochs, momentum
  0.9) have many more effective steps, and 0.01, the FedProx mu used by the sibling papers,
  keeps the linear term from over-extrapolating there. Set alpha per preset.
- Stability: over K local steps the linear term alone moves a client by about
  alpha K / (1 - m) times the last global update, so each round extrapolates the previous
  one by that factor; above about 1 the global updates grow geometrically and the run
  diverges (measured: alpha = 0.01 with 120 momentum-0.9 steps per round diverged in round
  3 on Fashion-MNIST). Choose alpha <= (1 - m) / K.
- Aggregation: the uniform mean, as the paper writes it (Alg. 1 l.9: X^(t+1) = sum (1/m)
  X_i; eq. 3 defines FedAvg's aggregation the same way). FedML, the platform the paper ran
  on, weights by sample count: ``weighting="samples"``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.fedprox import proximal_term
from flnotes.algorithms.settings import Setting

PREVIOUS = "previous:"  # anchor names of X^(t-1) (a colon never appears in a module path)


def upper_bound_penalty(
    params: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor],
    previous: dict[str, torch.Tensor],
    alpha: float,
    lr: float,
) -> torch.Tensor:
    """(alpha/lr) <previous - start, w - start> + alpha/2 ||w - start||^2 over params (eq. 6)."""
    linear = sum(
        ((alpha / lr) * (previous[n].to(p.device) - start[n]) * (p - start[n])).sum()
        for n, p in params.items()
    )
    # The quadratic part is exactly FedProx's proximal term with mu = alpha.
    return linear + proximal_term(params, start, alpha)


class FedUp(Strategy):
    """FedAvg whose clients add FedUp's estimated global-loss upper bound to their loss."""

    name = "fedup"
    checkpointed = {"previous_global": "state"}
    label = "FedUp"
    settings = (
        Setting("fedup_alpha", 0.01, "FedUp: penalty weight alpha of the upper-bound term "
                "(alpha/eta)<X^(t-1) - X^t, X - X^t> + (alpha/2)||X - X^t||^2",
                source="FedUp eq. 6; the paper reports no value (module docstring)",
                minimum=0, old_names=("alpha",)),
    )
    default_weighting = "uniform"  # Alg. 1 l.9

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        # X^(t-1), the global model dispatched one round earlier; X^(-1) = X^0.
        self.previous_global: OrderedDict[str, torch.Tensor] = self.global_state

    @property
    def has_penalty(self) -> bool:  # alpha = 0 is exactly FedAvg: skip the extra work
        return self.config.fedup_alpha > 0

    def penalty_anchor(self, start, client):
        """X^t (the start state) and, under ``previous:`` names, X^(t-1)."""
        return {**start, **{PREVIOUS + n: t for n, t in self.previous_global.items()}}

    def local_penalty(self, params, anchor):
        """The linear and quadratic terms of eq. 6 around the dispatched model X^t."""
        previous = {n: anchor[PREVIOUS + n] for n in params}
        return upper_bound_penalty(params, anchor, previous, self.config.fedup_alpha,
                                   self.config.lr)

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict[str, torch.Tensor]:
        """New global X^(t+1); the model dispatched this round becomes X^(t-1) of the next."""
        self.previous_global = self.global_state
        self.global_state = self.average(results)
        return self.global_state
