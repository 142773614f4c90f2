"""The ``vmap`` backend: a round's K clients train as one batched computation.

The K start states are stacked into (K, *shape) tensors and every local step runs all
clients' forward and backward at once: ``torch.func.vmap`` over a per-client
``grad_and_value`` of ``functional_call`` (:mod:`flnotes.train_stacked`). Results equal
the ``loop`` backend's (float tolerance) because:

- each client's batches are exactly :func:`flnotes.train.batch_schedule` with its own
  :func:`flnotes.train.client_generator`;
- clients are ordered by their number of steps (most first), so at step t the clients
  still training are a prefix of the stack: eagerly, finished clients leave the stack;
  a compiled step keeps them, frozen by a client mask (one shape, one compilation);
- a short last batch is padded to the batch size and masked: the loss is the mean over
  its real rows and BatchNorm uses the statistics of its real rows;
- the update is torch.optim.SGD's: d = g + wd*p; buf = d on the first step, then
  buf = momentum*buf + d; p -= lr*buf;
- BatchNorm running statistics are updated per client from the batch statistics
  (:mod:`flnotes.functional`), as nn.BatchNorm does in train mode.

This module schedules the batches and splits a round into groups (halving them when a
GPU runs out of memory); :mod:`flnotes.train_stacked` trains a group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.train import train_clients_loop


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


def build_schedule(
    num_samples: list[int], offsets: list[int], epochs: int, batch_size: int, generators
) -> Schedule:
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


def train_clients_vmap(
    task,
    strategy: Strategy,
    round: int,
    clients: list[int],
    starts: list,
    config,
    *,
    chunk_size: int | None = None,
) -> list[ClientResult]:
    """Train the sampled clients together; the same results as the loop backend."""
    sizes = [task.num_samples(c) for c in clients]
    # Most steps first, so the clients still training are always a prefix of the stack.
    order = sorted(range(len(clients)), key=lambda i: -sizes[i])
    # The largest group that fitted in an earlier round of this task: later rounds start
    # there instead of running out of memory again.
    fitted = ("vmap-group-size", strategy.name, config.batch_size)  # FML: two models a lane
    chunk = chunk_size or min(len(order), task.backend_cache.get(fitted, len(order))) or 1
    results: dict[int, ClientResult] = {}
    done = 0
    while done < len(order):
        part = order[done : done + chunk]
        too_big = False
        try:
            trained = train_group(task, strategy, round, [clients[i] for i in part],
                                  [starts[i] for i in part], config)
        except torch.cuda.OutOfMemoryError:
            if chunk == 1:
                raise
            too_big = True
        if too_big:
            # K models did not fit: a group is a pure function of its inputs, so retry the
            # same clients in halves (the results do not depend on the grouping). Freed
            # here: the except clause's traceback still held the group's tensors.
            chunk = (chunk + 1) // 2
            task.backend_cache[fitted] = chunk
            torch.cuda.empty_cache()
            continue
        results.update(zip(part, trained, strict=True))
        done += len(part)
    return [results[i] for i in range(len(clients))]


def train_group(task, strategy, round, clients, starts, config) -> list[ClientResult]:
    """Train one group of clients as one stack (FML: its own batched update, if it has one)."""
    from flnotes.train_stacked import train_supervised

    if strategy.custom_local_update:  # FML's two models per client
        batched = strategy.local_update_batched(task, round, clients, starts, config)
        if batched is None:  # the strategy has no batched path: the reference loop
            batched = train_clients_loop(task, strategy, round, clients, starts, config)
        return batched
    return train_supervised([(task, strategy, config, clients, starts)], round)[0]


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
