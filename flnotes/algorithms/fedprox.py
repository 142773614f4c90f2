"""FedProx (Li et al. 2020): FedAvg plus a proximal term mu/2 ||w - w_start||^2 locally."""

from __future__ import annotations

import torch

from flnotes.algorithms.base import Strategy
from flnotes.algorithms.settings import Setting


def proximal_term(
    params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], mu: float
) -> torch.Tensor:
    """mu/2 * sum over trainable params of ||w - anchor||^2."""
    total = sum(((p - anchor[n]) ** 2).sum() for n, p in params.items())
    return 0.5 * mu * total


class FedProx(Strategy):
    """FedAvg whose clients minimise F_i(w) + mu/2 ||w - w_global||^2."""

    name = "fedprox"
    label = "FedProx"
    settings = (
        Setting("mu", 0.01, "FedProx proximal weight mu of (mu/2)||w - w_global||^2",
                source="FedProx (Li et al. 2020) eq. 2; 0.01 as FedMut's experiments",
                minimum=0),
    )
    default_weighting = "samples"

    @property
    def has_penalty(self) -> bool:  # mu = 0 is exactly FedAvg: skip the extra work
        return self.config.mu > 0

    def local_penalty(self, params, start):
        """The proximal term towards the dispatched (global) state."""
        return proximal_term(params, start, self.config.mu)
