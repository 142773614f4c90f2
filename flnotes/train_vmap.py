"""The ``vmap`` backend: a round's K clients train as one batched computation.

The K start states are stacked into (K, *shape) tensors and every local step runs all
clients' forward and backward at once through ``torch.func.functional_call`` under
``torch.func.vmap``. Results equal the ``loop`` backend's (float tolerance) because:

- each client's batches are exactly :func:`flnotes.train.batch_schedule` with its own
  :func:`flnotes.train.client_generator`;
- clients are ordered by their number of steps (most first), so at step t the clients
  still training are a prefix ``[:a]`` of the stack: exhausted clients are simply not in
  the computation and neither their weights nor their momentum move;
- a short last batch is padded to the batch size and masked: the loss is the mean over
  its real rows and BatchNorm uses the statistics of its real rows;
- the update is torch.optim.SGD's: d = g + wd*p; buf = d on the first step, then
  buf = momentum*buf + d; p -= lr*buf;
- BatchNorm running statistics are updated per client from the batch statistics
  (:mod:`flnotes.functional`), as nn.BatchNorm does in train mode.

With ``config.compile`` set, and for FML's two models per client, a group trains on the
fixed-shape step of :mod:`flnotes.train_compiled` instead (every client in every step,
finished ones frozen by a mask), which torch.compile can compile once per run.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.functional import StatBatchNorm, StepContext, running_stat_updates, vmap_ready
from flnotes.train import batch_schedule, client_generator, train_clients_loop


@dataclass
class Schedule:
    """Every client's batches as one padded index tensor (clients sorted by step count)."""

    rows: torch.Tensor  # (K, T, B) rows of the concatenated client data; padding repeats
    sizes: torch.Tensor  # (K, T) real rows per step (0 once a client is done), CPU
    steps: list[int]  # steps per client, non-increasing
    batch_size: int
    masks: torch.Tensor | None = None  # (K, T, B) float, 1.0 on real rows (see to())

    def to(self, device) -> Schedule:
        """A copy with rows and masks on the training device (sizes stay on the CPU)."""
        cols = torch.arange(self.batch_size)
        masks = (cols < self.sizes[..., None]).float()
        return Schedule(self.rows.to(device), self.sizes, self.steps, self.batch_size,
                        masks.to(device))

    def active(self, t: int) -> int:
        """How many clients (a prefix of the stack) still train at step t."""
        return sum(1 for s in self.steps if s > t)

    def mask(self, t: int, a: int) -> torch.Tensor | None:
        """(a, B) float mask of real rows at step t; None when every batch is full."""
        if bool((self.sizes[:a, t] == self.batch_size).all()):  # CPU: no device sync
            return None
        if self.masks is None:
            return (torch.arange(self.batch_size) < self.sizes[:a, t, None]).float()
        return self.masks[:a, t]


def build_schedule(
    num_samples: list[int], offsets: list[int], epochs: int, batch_size: int, generators
) -> Schedule:
    """Pad the clients' :func:`batch_schedule` step lists into (K, T, B) global row indices."""
    per_client = [batch_schedule(n, epochs, batch_size, g)
                  for n, g in zip(num_samples, generators, strict=True)]
    steps = [len(s) for s in per_client]
    total = max(steps, default=0)
    rows = torch.zeros(len(steps), total, batch_size, dtype=torch.long)
    sizes = torch.zeros(len(steps), total, dtype=torch.long)
    for k, (batches, offset) in enumerate(zip(per_client, offsets, strict=True)):
        rows[k] = offset  # padding: the client's own first row, so padded inputs are real data
        for t, idx in enumerate(batches):
            rows[k, t, : len(idx)] = idx + offset
            sizes[k, t] = len(idx)
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
    chunk = chunk_size or len(order) or 1
    results: dict[int, ClientResult] = {}
    done = 0
    while done < len(order):
        part = order[done : done + chunk]
        try:
            trained = train_group(task, strategy, round, [clients[i] for i in part],
                                  [starts[i] for i in part], config)
        except torch.cuda.OutOfMemoryError:
            if chunk == 1:
                raise
            # K models did not fit: a group is a pure function of its inputs, so retry the
            # same clients in halves (the results do not depend on the grouping).
            chunk = (chunk + 1) // 2
            torch.cuda.empty_cache()
            continue
        results.update(zip(part, trained, strict=True))
        done += len(part)
    return [results[i] for i in range(len(clients))]


def train_group(task, strategy, round, clients, starts, config) -> list[ClientResult]:
    """Train one group of clients: the compiled fixed-shape step if asked for, else eager."""
    if strategy.custom_local_update:  # FML's two models per client
        batched = strategy.local_update_batched(task, round, clients, starts, config)
        if batched is None:  # the strategy has no batched path: the reference loop
            batched = train_clients_loop(task, strategy, round, clients, starts, config)
        return batched
    if config.compile != "off":
        from flnotes.train_compiled import train_group_compiled

        return train_group_compiled(task, strategy, round, clients, starts, config)
    return _train_group(task, strategy, round, clients, starts, config)


def _train_group(task, strategy, round, clients, starts, config) -> list[ClientResult]:
    """Train one group of clients (sorted by sample count, most first) as one stack."""
    if "eager-model" not in task.backend_cache:  # built once per run, like working_model
        ctx = StepContext()
        task.backend_cache["eager-model"] = (vmap_ready(task.model_factory(), ctx), ctx)
    fmodel, ctx = task.backend_cache["eager-model"]
    fmodel.train()
    param_names = [n for n, _ in fmodel.named_parameters()]
    names = list(fmodel.state_dict().keys())
    device = next(iter(fmodel.state_dict().values())).device
    # (K, *shape) stacks of the start states; parameters and buffers alike.
    stack = {n: torch.stack([s[n] for s in starts]).to(device) for n in names}
    penalty = strategy.local_penalty if strategy.has_penalty else None
    # The dispatched states, anchor of the local penalty (FedProx, FedUp), kept only if used.
    anchors = {n: stack[n].clone() for n in param_names} if penalty else {}
    buffer_names = [n for n in names if n not in param_names]
    bn_modules = {n: m for n, m in fmodel.named_modules() if isinstance(m, StatBatchNorm)}

    data = [task.client_data(c) for c in clients]
    x_all = torch.cat([x for x, _ in data]).to(device)
    y_all = torch.cat([y for _, y in data]).to(device)
    counts = [len(y) for _, y in data]
    offsets = [sum(counts[:k]) for k in range(len(counts))]
    schedule = build_schedule(counts, offsets, config.local_epochs, config.batch_size,
                              [client_generator(config, round, c) for c in clients]).to(device)
    loss_fn = task.loss_fn

    def client_loss(params, buffers, anchor, xb, yb, mask):
        """One client's loss on its batch (runs under vmap: one model, one batch)."""
        ctx.mask, ctx.stats = mask, {}
        out = functional_call(fmodel, (params, buffers), (xb,))
        loss = masked_loss(loss_fn, out, yb, mask)
        total = loss
        if penalty is not None:
            extra = penalty(params, anchor)
            if extra is not None:
                total = loss + extra
        return total, loss.detach(), dict(ctx.stats)

    batched = vmap(client_loss, in_dims=(0, 0, 0, 0, 0, 0))
    batched_full = vmap(client_loss, in_dims=(0, 0, 0, 0, 0, None))
    momentum, wd, lr = config.momentum, config.weight_decay, config.lr
    bufs: dict[str, torch.Tensor] = {}  # momentum buffers, (K, *shape)
    dtype = stack[param_names[0]].dtype  # losses in the model's precision
    losses = torch.zeros(len(clients), max(schedule.steps, default=0), device=device,
                         dtype=dtype)

    for t in range(losses.shape[1]):
        a = schedule.active(t)
        mask = schedule.mask(t, a)
        step_rows = schedule.rows[:a, t]  # (a, B)
        xb, yb = x_all[step_rows], y_all[step_rows]
        # Leaf views of the first a models: gradients per client, updates in place below.
        params = {n: stack[n][:a].detach().requires_grad_() for n in param_names}
        buffers = {n: stack[n][:a] for n in buffer_names}
        anchor = {n: anchors[n][:a] for n in anchors}
        fn = batched if mask is not None else batched_full
        ctx.min_rows = int(schedule.sizes[:a, t].min())
        total, loss, stats = fn(params, buffers, anchor, xb, yb, mask)
        ctx.mask, ctx.stats = None, {}  # drop the per-lane tensors the call left behind
        grads = torch.autograd.grad(total.sum(), list(params.values()), allow_unused=True)
        losses[:a, t] = loss
        with torch.no_grad():
            _sgd_step(stack, bufs, param_names, grads, a, lr, momentum, wd)
            _update_running_stats(stack, bn_modules, stats, a)

    mean_losses = step_means(losses[..., None], schedule.steps)  # one device transfer
    results = []
    for k, client in enumerate(clients):
        state = OrderedDict((n, stack[n][k].clone()) for n in names)
        results.append(ClientResult(client, state, counts[k], mean_losses[k][0]))
    return results


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


def _sgd_step(stack, bufs, names, grads, a, lr, momentum, wd) -> None:
    """torch.optim.SGD's update of the first ``a`` stacked models (no dampening/nesterov)."""
    # An unused parameter (grad None) is skipped, as SGD does: no decay, no momentum.
    used = [(n, g) for n, g in zip(names, grads, strict=True) if g is not None]
    params = [stack[n][:a] for n, _ in used]  # contiguous prefix views, updated in place
    steps = [g for _, g in used]
    if wd != 0:
        steps = list(torch._foreach_add(steps, params, alpha=wd))  # d = g + wd * p
    if momentum != 0:
        for i, (name, _) in enumerate(used):
            if name not in bufs:  # first step: buf = d
                bufs[name] = steps[i].detach().clone()
                steps[i] = bufs[name]
        old = [i for i, (n, _) in enumerate(used) if steps[i] is not bufs[n]]
        if old:
            views = [bufs[used[i][0]][:a] for i in old]
            torch._foreach_mul_(views, momentum)  # buf = momentum * buf + d
            torch._foreach_add_(views, [steps[i] for i in old])
            for i, view in zip(old, views, strict=True):
                steps[i] = view
    torch._foreach_add_(params, steps, alpha=-lr)  # p -= lr * buf


def _update_running_stats(stack, bn_modules, stats, a) -> None:
    """nn.BatchNorm's train-mode buffer updates for the first ``a`` models."""
    for name, (mean, var) in stats.items():
        module = bn_modules[name]
        tracked = stack[f"{name}.num_batches_tracked"][:a]
        tracked.add_(1)
        rm, rv = stack[f"{name}.running_mean"][:a], stack[f"{name}.running_var"][:a]
        new_mean, new_var = running_stat_updates(rm, rv, tracked, mean, var, module.bn_momentum)
        rm.copy_(new_mean)
        rv.copy_(new_var)
