"""Which training backend trains a round's clients: the one place the choice is made.

``loop`` (:mod:`flnotes.engine.train`) is the reference; ``vmap``
(:mod:`flnotes.engine.batched`) trains a round's clients as one batched computation with the
same results. ``auto`` picks vmap on a GPU and the loop on a CPU.
"""

from __future__ import annotations

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.engine.batched.vmap import train_clients_vmap
from flnotes.engine.tasks import resolve_device
from flnotes.engine.train import train_clients_loop


def resolve_backend(config) -> str:
    """'auto' -> vmap on a GPU; loop on a CPU, where vmap is no faster (benchmarks/README.md).

    A config that asks for ``compile`` gets vmap: only its step is compiled.
    """
    if config.backend != "auto":
        return config.backend
    if config.compile != "off":
        return "vmap"
    return "vmap" if resolve_device(config.device).type == "cuda" else "loop"


def round_config(strategy: Strategy, round: int, config):
    """``config`` with the strategy's learning rate for ``round`` (itself when unchanged)."""
    lr = strategy.local_lr(round)
    return config if lr == config.lr else config.replace(lr=lr)


def train_clients(
    task, strategy: Strategy, round: int, clients: list[int], starts: list, config
) -> list[ClientResult]:
    """Train every sampled client from its start state with the configured backend."""
    config = round_config(strategy, round, config)
    backend = resolve_backend(config)
    if backend == "loop":
        return train_clients_loop(task, strategy, round, clients, starts, config)
    if backend == "vmap":
        return train_clients_vmap(task, strategy, round, clients, starts, config)
    raise ValueError(f"unknown backend {backend!r}; choose loop or vmap")
