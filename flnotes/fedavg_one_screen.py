"""FedAvg in one screen: the whole federated loop in plain PyTorch, to read before the engine.

flnotes runs every method through one engine (``flnotes/engine/sim.py``: sampling, the
method's dispatch, local training, aggregation, evaluation, run folders, resume), which is
spread over several files because twenty-five methods plug into it. This file is the same
loop for FedAvg alone (McMahan et al. 2017, Algorithm 1), with nothing plugged in: a test
(tests/test_one_screen.py) checks that it gives the engine's global models, round by round,
bit for bit, on a small network and on the 2-D toy.

A round t:
1. sample m of the N clients, without replacement;
2. each sampled client k starts from the global model w_t and runs E epochs of mini-batch
   SGD on its own data (a fresh optimiser, so momentum starts at zero every round);
3. the server averages the clients' models weighted by their number of samples n_k:
   w_{t+1} = sum_k (n_k / n) w_k, with n = sum_k n_k over the sampled clients.

Every random draw comes from a generator named by what it is for, (seed, "sample", t) or
(seed, "batches", t, k), never from one running stream: the same rule as ``flnotes/rng.py``,
which is why a resumed run and this file draw exactly what the engine draws.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Data = tuple[torch.Tensor, torch.Tensor]  # a client's inputs and targets


def generator(seed: int, *purpose: object) -> torch.Generator:
    """A generator seeded by (seed, purpose...): 63 bits of a SHA-256 of their repr."""
    digest = hashlib.sha256(repr((int(seed), *purpose)).encode()).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return g


def sample_clients(num_clients: int, per_round: int, seed: int, round: int) -> list[int]:
    """Step 1: ``per_round`` distinct clients, sorted."""
    order = torch.randperm(num_clients, generator=generator(seed, "sample", round))
    return sorted(order[:per_round].tolist())


def local_training(model: nn.Module, start: dict, data: Data, *, epochs: int,
                   batch_size: int, lr: float, momentum: float, weight_decay: float,
                   g: torch.Generator, loss_fn: Callable) -> OrderedDict:
    """Step 2: E epochs of SGD from ``start`` on one client's data, a fresh shuffle per
    epoch (the last batch of an epoch may be short); the trained weights."""
    x, y = data
    model.load_state_dict(start)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=g)
        for first in range(0, len(y), batch_size):
            rows = order[first:first + batch_size]
            loss = loss_fn(model(x[rows]), y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return OrderedDict((name, t.detach().clone()) for name, t in model.state_dict().items())


def average(states: list[dict], sizes: list[int]) -> OrderedDict:
    """Step 3: the mean of the clients' weights, client k weighted n_k / n. Integer buffers
    (BatchNorm's batch count) are not averaged: the first client's are kept."""
    weights = torch.tensor([n / sum(sizes) for n in sizes])
    out = OrderedDict()
    for name, first in states[0].items():
        if first.is_floating_point():
            stacked = torch.stack([s[name] for s in states])  # (clients, *layer)
            out[name] = torch.tensordot(weights.to(first.dtype), stacked, dims=1)
        else:
            out[name] = first.clone()
    return out


def fedavg(model: nn.Module, clients: list[Data], *, rounds: int, clients_per_round: int,
           epochs: int, batch_size: int, lr: float, momentum: float = 0.0,
           weight_decay: float = 0.0, seed: int = 0,
           loss_fn: Callable = F.cross_entropy) -> list[OrderedDict]:
    """Run FedAvg from ``model``'s current weights (the round-0 global model); the global
    model after each round."""
    global_model = OrderedDict((n, t.detach().clone()) for n, t in model.state_dict().items())
    history = []
    for t in range(1, rounds + 1):
        chosen = sample_clients(len(clients), clients_per_round, seed, t)
        states = [local_training(model, global_model, clients[k], epochs=epochs,
                                 batch_size=batch_size, lr=lr, momentum=momentum,
                                 weight_decay=weight_decay,
                                 g=generator(seed, "batches", t, k), loss_fn=loss_fn)
                  for k in chosen]
        global_model = average(states, [len(clients[k][1]) for k in chosen])
        history.append(global_model)
    return history


@torch.no_grad()
def accuracy(model: nn.Module, state: dict, test: Data) -> float:
    """The share of test samples whose highest output is their label."""
    model.load_state_dict(state)
    model.eval()
    x, y = test
    return (model(x).argmax(1) == y).sum().item() / len(y)
