"""The ``vmap`` backend: a round's K clients train as one batched computation.

The K start states are stacked into (K, *shape) tensors and every local step runs all
clients' forward and backward at once: ``torch.func.vmap`` over a per-client
``grad_and_value`` of ``functional_call`` (:mod:`flnotes.engine.batched.stacked`). Results equal
the ``loop`` backend's (float tolerance) because:

- each client's batches are exactly :func:`flnotes.engine.train.batch_schedule` with its own
  :func:`flnotes.engine.train.client_generator`;
- a short last batch is padded and masked, and a finished client is frozen by a client
  mask or leaves the stack (:mod:`flnotes.engine.batched.stacked` says how);
- the update is torch.optim.SGD's: d = g + wd*p; buf = d on the first step, then
  buf = momentum*buf + d; p -= lr*buf;
- BatchNorm running statistics are updated per client from the batch statistics
  (:mod:`flnotes.engine.batched.functional`), as nn.BatchNorm does in train mode.

This module splits a round into groups (halving them when a GPU runs out of memory);
:mod:`flnotes.engine.batched.stacked` trains a group, or says once why a strategy's clients
train on the loop instead (:func:`flnotes.engine.batched.stacked.trains_in_stack`: FedNTD, FedGen).
"""

from __future__ import annotations

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.engine.batched.stacked import train_supervised
from flnotes.engine.train import train_clients_loop


def train_clients_vmap(task, strategy: Strategy, round: int, clients: list[int], starts: list,
                       config, *, chunk_size: int | None = None) -> list[ClientResult]:
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
        try:
            trained = train_group(task, strategy, round, [clients[i] for i in part],
                                  [starts[i] for i in part], config)
        except torch.cuda.OutOfMemoryError:
            if chunk == 1:
                raise
            trained = None
        if trained is None:
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
    if strategy.custom_local_update:  # FML's two models per client
        batched = strategy.local_update_batched(task, round, clients, starts, config)
        # None: the strategy has no batched path, so the reference loop
        return batched if batched is not None else train_clients_loop(
            task, strategy, round, clients, starts, config)
    return train_supervised([(task, strategy, config, clients, starts)], round)[0]
