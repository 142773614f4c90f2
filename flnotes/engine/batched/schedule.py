"""The batched backend's bookkeeping: each client's batch schedule laid out as one tensor,
the masked loss of a padded batch, and per-client means of per-step values.

Shared by the vmap dispatcher (:mod:`flnotes.engine.batched.vmap`), the stacked step
(:mod:`flnotes.engine.batched.stacked`) and strategies with their own batched update (FML).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap


@dataclass
class Schedule:
    """Every client's batches as one padded index tensor (clients sorted by step count)."""

    rows: torch.Tensor  # (K, T, B) rows of the concatenated client data; padding repeats
    sizes: torch.Tensor  # (K, T) real rows per step (0 once a client is done), CPU
    steps: list[int]  # steps per client (non-increasing once clients are sorted by size)
    batch_size: int

    def active(self, t: int) -> int:
        """How many clients (a prefix of the stack, when sorted) still train at step t."""
        return sum(1 for s in self.steps if s > t)


def build_schedule(num_samples: list[int], offsets: list[int], epochs: int, batch_size: int,
                   generators) -> Schedule:
    """Pad the clients' :func:`batch_schedule` step lists into (K, T, B) global row indices.

    The same shuffles as batch_schedule (one randperm per epoch from each client's
    generator), laid out a client at a time rather than a step at a time.
    """
    per_epoch = [-(-n // batch_size) for n in num_samples]  # steps per epoch, last one short
    steps = [epochs * s for s in per_epoch]
    total = max(steps, default=0)
    rows = torch.zeros(len(steps), total, batch_size, dtype=torch.long)
    sizes = torch.zeros(len(steps), total, dtype=torch.long)
    for k, (n, offset, g) in enumerate(zip(num_samples, offsets, generators, strict=True)):
        # Padding: the client's own first row, so padded inputs are real data (a client
        # with no rows pads with row 0: its offset may be past the end of the data).
        rows[k] = offset if n > 0 else 0
        if n == 0:
            continue
        s = per_epoch[k]
        order = torch.full((epochs, s * batch_size), offset, dtype=torch.long)
        order[:, :n] = torch.stack([torch.randperm(n, generator=g) for _ in range(epochs)])
        order[:, :n] += offset
        rows[k, :steps[k]] = order.view(epochs * s, batch_size)
        epoch_sizes = torch.full((s,), batch_size, dtype=torch.long)
        epoch_sizes[-1] = n - (s - 1) * batch_size
        sizes[k, :steps[k]] = epoch_sizes.repeat(epochs)
    return Schedule(rows, sizes, steps, batch_size)


def masked_loss(loss_fn, out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None):
    """loss_fn's batch mean over the real rows only (one model, inside vmap)."""
    if mask is None:
        return loss_fn(out, y)
    if loss_fn is F.cross_entropy:
        per_row = F.cross_entropy(out, y, reduction="none")
    else:  # any batch-mean loss: evaluate it on batches of one row
        per_row = vmap(lambda o, t: loss_fn(o[None], t[None]))(out, y)
    return masked_mean(per_row, mask)


def masked_mean(per_row: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of per-row values over the real rows (all rows when mask is None)."""
    if mask is None:
        return per_row.mean()
    # where, not a product: a padding row's loss may be huge, and inf * 0 would be NaN.
    return torch.where(mask > 0, per_row, 0.0).sum() / mask.sum()


def step_means(values: torch.Tensor | None, steps: list[int]) -> list[list[float]]:
    """Each client's mean of each (K, T, R) value over its own steps, in one transfer."""
    if values is None or values.shape[1] == 0:  # nobody took a step
        return [[float("nan")] * (1 if values is None else values.shape[2]) for _ in steps]
    device = values.device
    taken = torch.arange(values.shape[1], device=device) < torch.tensor(
        steps, device=device)[:, None]
    sums = torch.where(taken[..., None], values, 0.0).sum(1)
    counts = torch.tensor(steps, device=device, dtype=values.dtype)[:, None]
    return (sums / counts).tolist()  # a client with no steps gets 0/0 = nan, as the loop
