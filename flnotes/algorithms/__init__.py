"""Registry of federated algorithms: name -> Strategy class (imported on first use)."""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting, declared_settings

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
    # baselines of the FedMut, FedQP and FedMR tables
    "fedexp": "flnotes.algorithms.fedexp:FedExP",
    "fedsam": "flnotes.algorithms.fedsam:FedSAM",
    "fedasam": "flnotes.algorithms.fedsam:FedASAM",
    "fedntd": "flnotes.algorithms.fedntd:FedNTD",
    "clusamp": "flnotes.algorithms.clusamp:CluSamp",
    "fedgen": "flnotes.algorithms.fedgen:FedGen",
    # baselines of FedUp's tables
    "scaffold": "flnotes.algorithms.scaffold:Scaffold",
    "feddyn": "flnotes.algorithms.feddyn:FedDyn",
    "fedpvr": "flnotes.algorithms.fedpvr:FedPVR",
    "moon": "flnotes.algorithms.moon:MOON",
    "mimelite": "flnotes.algorithms.mimelite:MimeLite",
    "stem": "flnotes.algorithms.stem:STEM",
    "fedsmoo": "flnotes.algorithms.fedsmoo:FedSMOO",
    # flat-minima methods published after the seed papers (in no seed table)
    "fedswa": "flnotes.algorithms.fedswa:FedSWA",
    "fedmoswa": "flnotes.algorithms.fedswa:FedMoSWA",
    "fedlesam": "flnotes.algorithms.fedlesam:FedLESAM",
    "fedgloss": "flnotes.algorithms.fedgloss:FedGloSS",
    "fedcross": "flnotes.algorithms.fedcross:FedCross",
    "fedgf": "flnotes.algorithms.fedgf:FedGF",
    "fedgmt": "flnotes.algorithms.fedgmt:FedGMT",
}


@cache  # a module's presence does not change while flnotes runs; find_spec costs stats
def _available(name: str) -> bool:
    module = _REGISTRY[name].split(":")[0]
    return importlib.util.find_spec(module) is not None


# Methods registered at run time (a user's own, or a test's): name -> class.
_REGISTERED: dict[str, type[Strategy]] = {}


def register_algorithm(cls: type[Strategy], name: str | None = None) -> type[Strategy]:
    """Make a Strategy subclass runnable by name (default: its ``name`` attribute).

    Its ``settings`` become RunConfig settings, command-line flags and help like any
    built-in method's; usable as a class decorator.
    """
    name = name or cls.name
    if not isinstance(cls, type) or not issubclass(cls, Strategy):
        raise TypeError(f"register_algorithm needs a Strategy subclass, got {cls!r}")
    if name in _REGISTRY:
        raise ValueError(f"algorithm name {name!r} is taken by a built-in method")
    _REGISTERED[name] = cls
    all_settings.cache_clear()
    return cls


def unregister_algorithm(name: str) -> None:
    """Forget a method added by :func:`register_algorithm` (tests clean up with it)."""
    _REGISTERED.pop(name, None)
    all_settings.cache_clear()


def algorithm_names() -> list[str]:
    """Names of every registered algorithm."""
    return sorted(_ordered_names())


def _ordered_names() -> list[str]:
    """Every registered algorithm in registry order (seed methods first, then baselines)."""
    return [n for n in _REGISTRY if _available(n)] + list(_REGISTERED)


def algorithm_class(name: str) -> type[Strategy]:
    """The Strategy class registered under ``name``."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _REGISTRY or not _available(name):
        raise ValueError(f"unknown algorithm {name!r}; registered: {algorithm_names()}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def settings_of(name: str) -> dict[str, Setting]:
    """The settings the algorithm ``name`` reads, by name (its declarations)."""
    return declared_settings(algorithm_class(name))


@cache
def all_settings() -> dict[str, dict[str, Setting]]:
    """Every declared setting name -> {algorithm: its declaration}, in registry order."""
    out: dict[str, dict[str, Setting]] = {}
    for algorithm in _ordered_names():
        for name, setting in settings_of(algorithm).items():
            out.setdefault(name, {})[algorithm] = setting
    return out


def readers(setting: str) -> list[str]:
    """The algorithms that read a setting (registry order); [] for a name no method declares."""
    return list(all_settings().get(setting, {}))


def build_strategy(config, global_state) -> Strategy:
    """Instantiate the config's algorithm around the initial global state."""
    return algorithm_class(config.algorithm)(config, global_state)


__all__ = ["ClientResult", "Setting", "Strategy", "algorithm_class", "algorithm_names",
           "all_settings", "build_strategy", "readers", "register_algorithm", "settings_of",
           "unregister_algorithm"]
