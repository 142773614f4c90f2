"""Named presets: the settings each paper states (and the official code's, where different).

A preset is a dict of RunConfig fields; ``RunConfig.from_preset(name, **overrides)``
builds the config. Each preset's docstring cites where every value comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PRESETS: dict[str, Callable[[], dict[str, Any]]] = {}


def preset(name: str):
    """Register a function returning a preset's field values under ``name``."""

    def register(fn: Callable[[], dict[str, Any]]):
        PRESETS[name] = fn
        return fn

    return register


def preset_names() -> list[str]:
    """Names of every preset."""
    return sorted(PRESETS)


def preset_values(name: str) -> dict[str, Any]:
    """The RunConfig fields of a preset (a fresh dict each call)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {preset_names()}")
    return dict(PRESETS[name]())


def describe(name: str) -> str:
    """A preset's docstring: where each of its values comes from."""
    preset_values(name)
    return (PRESETS[name].__doc__ or "").strip()


@preset("demo")
def demo() -> dict[str, Any]:
    """Quick-start smoke run: synthetic 28x28 task, MLP, 20 clients (10 per round).

    Values chosen to finish in well under a minute on two CPU cores; they come from no
    paper. Dirichlet 0.5 gives moderate label skew.
    """
    return dict(algorithm="fedavg", dataset="synthetic", model="mlp", partition="dirichlet",
                dirichlet_alpha=0.5, num_clients=20, clients_per_round=10, rounds=15,
                local_epochs=1, batch_size=50, lr=0.05, momentum=0.5)
