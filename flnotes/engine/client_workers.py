"""A round's clients trained in parallel worker processes on a CPU (``run --client-workers N``).

A round's clients are independent until the server aggregates them, and each one draws its
batches from its own generator (:func:`flnotes.engine.train.client_generator`: seed, round,
client), so splitting them over processes changes the wall time and nothing else. Each worker
holds the task (model and data: inherited at the fork on Linux, sent once otherwise) for the
whole run and trains with one torch thread; each round it gets the strategy as it stands
(what the clients' code reads: the global model, SCAFFOLD's control variates, FedDyn's drift)
and its share of the clients, and sends back their results, which the round takes in the
loop's order. Results equal the sequential loop's bit for bit (tests/test_client_workers.py
runs every registered method both ways).

Where it cannot: a GPU run (one device, its own batching: the vmap backend), a method whose
client code changes the strategy itself (``Strategy.parallel_clients = False``: the change
would stay in the worker), or fewer than two clients a round. Those train in the loop, and
:func:`why_not` says why in one line.
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor

import torch

from flnotes.engine.backends import resolve_backend, round_config
from flnotes.engine.threads import LARGE_MACS, MOST_THREADS
from flnotes.engine.train import train_clients_loop

_TASK = None  # the worker's task, set once when it starts


def _start_worker(task_bytes: bytes | None) -> None:
    global _TASK
    torch.set_num_threads(1)  # N workers on N cores: one thread each
    if task_bytes is not None:
        _TASK = pickle.loads(task_bytes)


def _train_share(strategy_bytes: bytes, round: int, clients: list[int], starts: list, config):
    strategy = pickle.loads(strategy_bytes)
    return train_clients_loop(_TASK, strategy, round, clients, starts, config)


def why_not(config, strategy, workers: int) -> str | None:
    """Why this run's clients cannot train in ``workers`` processes (None: they can)."""
    if workers <= 1:
        return None
    if resolve_backend(config) != "loop" or str(config.device).startswith("cuda"):
        return "clients train on one device there (the vmap backend batches them)"
    if not getattr(type(strategy), "parallel_clients", True):
        return f"{type(strategy).__name__}'s client code changes its strategy's own state"
    if config.clients_per_round < 2:
        return "one client a round"
    return None


class ClientWorkers:
    """``workers`` processes that train a round's clients; use as a context manager."""

    def __init__(self, task, workers: int) -> None:
        global _TASK
        fork = sys.platform.startswith("linux")
        context = multiprocessing.get_context("fork" if fork else "spawn")
        if fork:  # the children inherit the task as it is in memory now
            _TASK = task
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_start_worker,
            initargs=(None if fork else pickle.dumps(task),))

    def train(self, strategy, round: int, clients: list[int], starts: list, config) -> list:
        """The clients' results, as :func:`flnotes.engine.backends.train_clients` returns
        them for the loop backend."""
        config = round_config(strategy, round, config)
        shares = [list(range(i, len(clients), self.workers)) for i in range(self.workers)]
        shares = [s for s in shares if s]
        state = pickle.dumps(strategy)
        futures = [self._pool.submit(_train_share, state, round, [clients[i] for i in share],
                                     [starts[i] for i in share], config) for share in shares]
        results: list = [None] * len(clients)
        for share, future in zip(shares, futures, strict=True):
            for i, result in zip(share, future.result(), strict=True):
                results[i] = result
        return results

    def close(self) -> None:
        global _TASK
        self._pool.shutdown(wait=True, cancel_futures=True)
        _TASK = None  # the parent's reference for the fork: the run's data are let go

    def __enter__(self) -> ClientWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_workers(config, macs: float, idle: int) -> int:
    """How many workers a run the user left to flnotes gets (``run`` without
    ``--client-workers``): the ``idle`` cores, at most the round's clients, for a model large
    enough that a client's training outweighs sending it (the thread rule's ``LARGE_MACS``
    multiply-adds per sample) on a CPU; else 1. Two workers on two idle cores took 0.54x the
    wall time of one for the CIFAR-10 LeNet round, and 0.83x with the cores busy
    (benchmarks/README.md), so busy cores give 1."""
    if macs < LARGE_MACS or resolve_backend(config) != "loop" \
            or str(config.device).startswith("cuda"):
        return 1
    return max(1, min(idle, config.clients_per_round, MOST_THREADS))
