"""Registry of federated algorithms: name -> Strategy class (imported on first use)."""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from flnotes.algorithms.base import ClientResult, Strategy

# name -> "module:Class"; modules are imported lazily so a broken or heavy method does not
# slow down `import flnotes`.
_REGISTRY = {
    "fedavg": "flnotes.algorithms.fedavg:FedAvg",
    "fedprox": "flnotes.algorithms.fedprox:FedProx",
    "fedmut": "flnotes.algorithms.fedmut:FedMut",
    "fedqp": "flnotes.algorithms.fedqp:FedQP",
    "fedmr": "flnotes.algorithms.fedmr:FedMR",
    "indep": "flnotes.algorithms.fedmr:Indep",  # FedMR's reference without recombination
    "fml": "flnotes.algorithms.fml:FML",
    "fedup": "flnotes.algorithms.fedup:FedUp",
    # baselines of the FedMut, FedQP and FedMR tables (issue 17)
    "fedexp": "flnotes.algorithms.fedexp:FedExP",
    "fedsam": "flnotes.algorithms.fedsam:FedSAM",
    "fedasam": "flnotes.algorithms.fedsam:FedASAM",
    "fedntd": "flnotes.algorithms.fedntd:FedNTD",
    "clusamp": "flnotes.algorithms.clusamp:CluSamp",
    "fedgen": "flnotes.algorithms.fedgen:FedGen",
    # baselines of FedUp's tables (issue 12)
    "scaffold": "flnotes.algorithms.scaffold:Scaffold",
    "feddyn": "flnotes.algorithms.feddyn:FedDyn",
    "fedpvr": "flnotes.algorithms.fedpvr:FedPVR",
    "moon": "flnotes.algorithms.moon:MOON",
    "mimelite": "flnotes.algorithms.mimelite:MimeLite",
    "stem": "flnotes.algorithms.stem:STEM",
    "fedsmoo": "flnotes.algorithms.fedsmoo:FedSMOO",
}


@cache  # a module's presence does not change while flnotes runs; find_spec costs stats
def _available(name: str) -> bool:
    module = _REGISTRY[name].split(":")[0]
    return importlib.util.find_spec(module) is not None


def algorithm_names() -> list[str]:
    """Names of every registered algorithm."""
    return sorted(n for n in _REGISTRY if _available(n))


def algorithm_class(name: str) -> type[Strategy]:
    """The Strategy class registered under ``name``."""
    if name not in _REGISTRY or not _available(name):
        raise ValueError(f"unknown algorithm {name!r}; registered: {algorithm_names()}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_strategy(config, global_state) -> Strategy:
    """Instantiate the config's algorithm around the initial global state."""
    return algorithm_class(config.algorithm)(config, global_state)


__all__ = ["ClientResult", "Strategy", "algorithm_class", "algorithm_names", "build_strategy"]
