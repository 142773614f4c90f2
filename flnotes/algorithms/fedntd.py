"""FedNTD (Lee et al., "Preservation of the Global Knowledge by Not-True Distillation in
Federated Learning", NeurIPS 2022): FedAvg whose clients distil the dispatched global
model's predictions over the classes that are not the sample's label.

Local loss on a batch (paper eq. 4-5; Alg. 1):

    L = CE(q^l, y) + beta * L_NTD
    L_NTD = tau^2 (1/B) sum_b sum_{c != y_b} q~^g_tau(c) log(q~^g_tau(c) / q~^l_tau(c))

where q~_tau(c) = exp(z_c / tau) / sum_{c' != y} exp(z_c' / tau) is the softmax over the
not-true logits only (the true class's logit removed), z^l the local model's logits and z^g
the dispatched global model's, held fixed (a detached teacher). L_NTD is KL(global || local),
the direction of ``KLDivLoss(log q~^l, q~^g)`` in the authors' code (Lee-Gihun/FedNTD,
``NTD_Loss``), averaged over the batch ("batchmean"). The server is FedAvg's.

Decisions where the paper leaves room:

- The tau^2 factor (Hinton's scaling, which keeps the gradient's size as tau grows) is the
  authors' code's (``NTD_Loss._ntd_loss``: ``(self.tau ** 2) * self.KLDiv(...)``); the
  paper's eq. 5 writes L_NTD without it. At the defaults (tau = 1) the two readings agree.
- Defaults beta = 1, tau = 1: the authors' config (config/fedntd.json). beta = 0 is exactly
  FedAvg (the teacher is then not even run).
- The teacher runs in eval mode (BatchNorm with its running statistics, no dropout): in the
  authors' code the teacher is a copy of the client model taken after the previous client's
  evaluation left it in eval mode.
- A model with one output (the 2-D toy, whose output is a per-row loss) has no not-true
  class, so L_NTD is 0 there and FedNTD trains exactly as FedAvg.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flnotes.algorithms.base import Strategy
from flnotes.algorithms.settings import Setting


def not_true_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, C) logits -> (B, C-1): each row without its true class, other classes in order."""
    # Column k of the result is class k below the label and class k + 1 from it on (a
    # gather, not a boolean mask: no host sync on a GPU).
    columns = torch.arange(logits.shape[1] - 1, device=logits.device).expand(len(logits), -1)
    columns = columns + (columns >= targets.view(-1, 1)).long()
    return logits.gather(1, columns)


def ntd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
             tau: float) -> torch.Tensor:
    """tau^2 KL(teacher || student) of the tempered softmax over not-true classes, batch mean."""
    if logits.dim() != 2 or logits.shape[1] < 2:  # no not-true class (the toy's (B, 1))
        return logits.sum() * 0.0
    student = F.log_softmax(not_true_logits(logits, targets) / tau, dim=1)
    teacher = F.softmax(not_true_logits(teacher_logits.detach(), targets) / tau, dim=1)
    return tau * tau * F.kl_div(student, teacher, reduction="batchmean")


class FedNTD(Strategy):
    """FedAvg with not-true distillation from the dispatched global model."""

    name = "fedntd"
    label = "FedNTD"
    settings = (
        Setting("ntd_beta", 1.0, "FedNTD: weight of the not-true distillation loss (0: FedAvg)",
                source="FedNTD (Lee et al. 2022) eq. 4; the authors' config", minimum=0),
        Setting("ntd_tau", 1.0, "FedNTD: softmax temperature of the not-true distillation",
                source="FedNTD eq. 3; the authors' config", minimum=0, open_minimum=True),
    )
    default_weighting = "samples"

    @property
    def has_teacher(self) -> bool:  # beta = 0 is exactly FedAvg: skip the teacher
        return self.config.ntd_beta > 0

    def teacher_loss(self, outputs, targets, teacher_outputs):
        """beta * L_NTD (eq. 5) against the dispatched model's outputs."""
        return self.config.ntd_beta * ntd_loss(outputs, teacher_outputs, targets,
                                               self.config.ntd_tau)
