"""Local training of a round's clients, the reference ``loop`` backend.

:func:`flnotes.engine.backends.train_clients` is the one entry point the engine calls; the
loop is the reference: each client in turn, ``torch.optim.SGD`` on its own mini-batches. A faster
backend must produce the same models from the same seed, so the batch order of every
client is fixed by :func:`batch_schedule` from (seed, round, client) alone.

"The same" means to float32 rounding (about 1e-6 relative after a round). On a GPU with
TF32 on (PyTorch's default for cuDNN convolutions, recorded in a run's environment) the
backends run different kernels at TF32 precision and agree to about 1e-3; turn it off
(``torch.backends.cudnn.allow_tf32 = False``) for the tighter agreement.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator

import torch
from torch import nn

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.engine.state import clone_state
from flnotes.rng import torch_generator


def iter_batches(num_samples: int, epochs: int, batch_size: int, generator: torch.Generator,
                 device: torch.device | str | None = None) -> Iterator[torch.Tensor]:
    """Row indices of every local step, in order: a fresh shuffle per epoch, the last batch
    of an epoch may be short.

    The shuffles are drawn a chunk of epochs at a time (about a million indices), so memory
    does not grow with the number of local steps; with ``device`` each chunk goes there in
    one copy (a copy per step would make a GPU finish the previous step first). The draws are
    the same, in the same order, as one shuffle per epoch drawn up front.
    """
    chunk = max(1, 2**20 // max(num_samples, 1))
    for first in range(0, epochs, chunk):
        count = min(chunk, epochs - first)
        order = torch.cat([torch.randperm(num_samples, generator=generator)
                           for _ in range(count)])
        if device is not None:
            order = order.to(device)
        for e in range(count):
            for s in range(0, num_samples, batch_size):
                yield order[e * num_samples + s: e * num_samples + min(s + batch_size,
                                                                      num_samples)]


def batch_schedule(num_samples: int, epochs: int, batch_size: int, generator: torch.Generator,
                   device: torch.device | str | None = None) -> list[torch.Tensor]:
    """Every step's row indices at once (:func:`iter_batches` as a list), for callers that
    need the whole schedule; a training loop iterates :func:`iter_batches` instead."""
    return list(iter_batches(num_samples, epochs, batch_size, generator, device))


def client_generator(config, round: int, client: int) -> torch.Generator:
    """The generator that orders one client's batches in one round."""
    return torch_generator(config.seed, "batches", round, client)


def local_sgd(model: nn.Module, start: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
              *, epochs: int, batch_size: int, lr: float, momentum: float, weight_decay: float,
              generator: torch.Generator,
              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              penalty: Callable[[dict, dict], torch.Tensor | None] | None = None,
              anchor: dict[str, torch.Tensor] | None = None,
              local_gradient: Callable[[dict, Callable], torch.Tensor] | None = None,
              teacher: nn.Module | None = None, teacher_loss: Callable | None = None,
              batch_loss: Callable | None = None) -> tuple[OrderedDict[str, torch.Tensor], float]:
    """Mini-batch SGD from ``start``; returns the trained state and the mean empirical loss.

    ``penalty(params, anchor)`` is added to the loss; ``anchor`` defaults to ``start``.
    ``teacher_loss(outputs, targets, teacher_outputs)`` is added too, with ``teacher``'s
    outputs on the batch (computed without gradient). ``local_gradient(params, closure)``
    takes each step's gradient (Strategy.local_gradient); None: one backward, plain SGD.
    ``batch_loss(model, inputs, targets, outputs)`` (Strategy.batch_loss) adds a term from
    the live model on each batch.
    """
    model.load_state_dict(start)
    model.train()
    params = dict(model.named_parameters())
    anchor = {n: t.detach() for n, t in (start if anchor is None else anchor).items()}
    opt = torch.optim.SGD(params.values(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    losses = []
    for idx in iter_batches(len(y), epochs, batch_size, generator, x.device):
        xb, yb = x[idx], y[idx]
        teacher_out = None
        if teacher is not None:
            with torch.no_grad():
                teacher_out = teacher(xb)

        def closure(xb=xb, yb=yb, teacher_out=teacher_out) -> torch.Tensor:
            """Forward and backward at the current weights; the batch's empirical loss."""
            out = model(xb)
            total = loss = loss_fn(out, yb)
            # each method's extra term, where it has one (None: nothing to add)
            if penalty is not None and (term := penalty(params, anchor)) is not None:
                total = total + term
            if teacher_out is not None and (term := teacher_loss(out, yb, teacher_out)) is not None:
                total = total + term
            if batch_loss is not None and (term := batch_loss(model, xb, yb, out)) is not None:
                total = total + term
            opt.zero_grad(set_to_none=True)
            total.backward()
            return loss

        loss = closure() if local_gradient is None else local_gradient(params, closure)
        opt.step()
        losses.append(loss.detach())
    mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")
    return clone_state(model.state_dict()), mean_loss


def train_clients_loop(
    task, strategy: Strategy, round: int, clients: list[int], starts: list, config
) -> list[ClientResult]:
    """Reference backend: train the sampled clients one after another."""
    model = task.working_model()  # every client loads its start state into it
    penalty = strategy.local_penalty if strategy.has_penalty else None
    local_gradient = strategy.local_gradient if strategy.has_local_gradient else None
    # FedNTD's teacher: a second model, in eval mode and without gradients, that loads
    # each client's teacher state (the dispatched model). A copy, built once per task: a
    # fresh model would draw its initial weights from the global generator every round.
    teacher = None
    if strategy.has_teacher and not strategy.custom_local_update:
        if "teacher-model" not in task.backend_cache:
            task.backend_cache["teacher-model"] = copy.deepcopy(model).eval().requires_grad_(False)
        teacher = task.backend_cache["teacher-model"]
    results = []
    for client, start in zip(clients, starts, strict=True):
        generator = client_generator(config, round, client)
        if strategy.custom_local_update:
            results.append(strategy.local_update(task, round, client, start, generator))
            continue
        x, y = task.client_data(client)
        if teacher is not None:
            teacher.load_state_dict(strategy.teacher_state(start, client))
        state, loss = local_sgd(
            model, start, x, y, epochs=config.local_epochs, batch_size=config.batch_size,
            lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
            generator=generator, loss_fn=task.loss_fn, penalty=penalty,
            anchor=strategy.penalty_anchor(start, client) if penalty is not None else None,
            local_gradient=local_gradient, teacher=teacher,
            teacher_loss=strategy.teacher_loss if teacher is not None else None,
            batch_loss=strategy.batch_loss(round, client) if strategy.has_batch_loss else None)
        results.append(ClientResult(client, state, len(y), loss))
    return results
