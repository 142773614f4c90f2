"""RunConfig: every setting of a federated run, validated on construction.

The field names are also the papermill parameters and the command-line flags
(``--clients-per-round``). Fields left as ``None`` take the algorithm's or dataset's
default; :meth:`RunConfig.resolved` fills them in, and a run records the resolved config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from flnotes.algorithms import algorithm_class, algorithm_names, all_settings, readers, settings_of
from flnotes.algorithms.settings import float32_overflow
from flnotes.config.presets import (
    BASELINE_READING,
    SEED_REPOSITORY,
    preset_names,
    preset_values,
    seed_code_baselines,
)
from flnotes.data.multitask import task_parts
from flnotes.data.options import data_option_problems
from flnotes.data.registry import composition_problem, dataset_names
from flnotes.messages import did_you_mean
from flnotes.models import model_names as registered

PARTITIONS = ("iid", "dirichlet", "shards", "natural")
BACKENDS = ("auto", "loop", "vmap")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
WEIGHTINGS = ("samples", "uniform")

# Model used when `model` is None, by dataset.
DEFAULT_MODEL = {"synthetic": "mlp", "toy": "toy", "cifar10": "cnn", "cifar100": "cnn",
                 "mnist": "mlp", "fashion-mnist": "mlp", "shakespeare": "lstm",
                 "femnist": "femnist-cnn"}


@dataclass(frozen=True, init=False, eq=False)
class RunConfig:
    """All settings of one federated run (``python -m flnotes run --help`` says what each does).

    The fields below are common to every method. A method's own settings (FedProx's ``mu``,
    FedMut's ``alpha`` ...) are declared in its module (:mod:`flnotes.algorithms.settings`)
    and given by the same flat name: ``RunConfig(algorithm="fedprox", mu=0.1)``; they read as
    attributes (``config.mu``) and a run records and hashes those its method reads.

    A setting the chosen method does not read is refused when the algorithm is named in the
    same call (``RunConfig(algorithm="fedavg", mu=0.1)``: a one-line error naming the methods
    that read ``mu``). Without ``algorithm`` the config may carry several methods' settings
    (a notebook's base config); ``replace(algorithm=...)`` then picks each method's own.
    """

    # what to run
    algorithm: str = "fedavg"
    dataset: str = "synthetic"  # or "A+B": tasks side by side for FML (Fig. 6; data/multitask)
    model: str | None = None  # None: the dataset's usual model (DEFAULT_MODEL)
    data_dir: str | None = None  # None: $FLNOTES_DATA or ~/.cache/flnotes/data
    download: bool = False
    data_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"coarse": True}
    # how data is split over clients
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    shards_per_client: int = 2
    min_client_size: int = 10
    partition_manifest: str | None = None  # load (or save) the exact split here
    client_test_fraction: float | None = None  # held-out share of each client's data
    # federation and local training
    num_clients: int = 20
    clients_per_round: int = 10
    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 50
    lr: float = 0.01
    # None: 0.9, or 0 for a method that brings its own momentum (MimeLite, STEM)
    momentum: float | None = None
    weight_decay: float = 0.0
    weighting: str | None = None  # None: the algorithm's default
    # bookkeeping
    seed: int = 0
    eval_every: int = 1
    eval_batch_size: int = 1000
    checkpoint_every: int = 10
    device: str = "auto"
    backend: str = "auto"
    # torch.compile of the vmap backend's training step: "off", or a torch.compile mode
    # ("default", "reduce-overhead" = CUDA graphs on a GPU, "max-autotune"). Costs a
    # compilation once per run (measured on a CPU: 20 s for the CNN to 4 min for the LSTM;
    # not yet on a GPU); see flnotes/engine/batched/stacked.py and benchmarks/README.md.
    compile: str = "off"
    record_states: bool = False  # keep every dispatched/local/global state (toy models)
    run_dir: str | None = None  # None: nothing written to disk
    # The method settings given (name -> value); read them as attributes (config.mu).
    method_settings: dict[str, Any] = field(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        _build(self, values, strict="algorithm" in values)

    # ---- method settings as attributes ------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """A method setting: the value given, else the chosen method's declared default."""
        if name.startswith("_"):  # pickle and copy probe dunders before __dict__ is filled
            raise AttributeError(name)
        declared = _declarations(name)
        if declared is None:
            raise AttributeError(f"RunConfig has no field or method setting {name!r}")
        given = self.__dict__.get("method_settings", {})
        if name in given:
            return given[name]
        return _declared(declared, self.__dict__.get("algorithm")).default

    def settings_read(self) -> dict[str, Any]:
        """The chosen method's settings and their values (given or default), in order."""
        return {name: getattr(self, name) for name in _method_settings(self.algorithm)}

    # ---- derived values -------------------------------------------------------
    def resolved(self) -> RunConfig:
        """A copy with every ``None`` default filled in for this algorithm and dataset."""
        cls = algorithm_class(self.algorithm)
        changes: dict[str, Any] = {}
        if self.model is None:
            # A composed dataset ("cifar10+cifar100"): its first task's usual model.
            changes["model"] = DEFAULT_MODEL.get(self.dataset.split("+")[0].strip(), "mlp")
        if self.weighting is None:
            changes["weighting"] = cls.default_weighting
        if self.client_test_fraction is None:
            changes["client_test_fraction"] = cls.default_client_test_fraction
        return self.replace(**changes) if changes else self

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again).

        Settings given before are carried over; with another ``algorithm`` the new method
        reads its own and ignores the rest (a base config for several methods).
        """
        return _build(RunConfig.__new__(RunConfig), {**self.__dict__["_given"], **changes},
                      strict=False)

    def check_device(self) -> None:
        """Raise ValueError if this machine cannot run on ``device`` (e.g. 'cuda' without a GPU).

        Not part of validation on construction: a config written by a GPU run must still
        load on a CPU machine (to plot or tabulate it); only running it needs the device.
        """
        target = None if self.device == "auto" else torch.device(self.device)
        if target is None or target.type != "cuda":
            return
        if not torch.cuda.is_available():
            raise ValueError(f"RunConfig.device={self.device!r} is invalid on this machine: "
                             "torch.cuda.is_available() is False; use --device cpu or auto")
        count = torch.cuda.device_count()
        if target.index is not None and target.index >= count:
            raise ValueError(f"RunConfig.device={self.device!r} is invalid on this machine: it "
                             f"has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; use one "
                             "of them, cuda or auto")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the common fields and the settings the method reads."""
        values = {name: getattr(self, name) for name in common_field_names()}
        return {**values, "data_options": dict(self.data_options), **self.settings_read()}

    def to_json(self) -> str:
        """The config as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable data_options: not hashable

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, strict: bool = False) -> RunConfig:
        """Build from a dict; unknown keys are an error that lists the valid ones.

        ``strict``: the dict is what a user typed (command line), so a setting the chosen
        method does not read is an error, as in ``RunConfig(algorithm=..., ...)``. Otherwise
        (a stored config.json, a preset) such settings are kept but not used.
        """
        if not isinstance(values, dict):
            raise ValueError(f"a RunConfig is built from a dict, got {type(values).__name__}")
        return _build(cls.__new__(cls), dict(values), strict=strict)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> RunConfig:
        """A named preset (see flnotes.config.presets) with some fields overridden.

        The preset's settings that the final method does not read are left out (a preset
        may carry several methods' values: fedmut-paper with algorithm='fedprox');
        ``overrides`` are the caller's own, so an unread one is an error.
        """
        if name not in preset_names():
            raise ValueError(f"unknown preset {name!r}{did_you_mean(name, preset_names())}; "
                             "list them with `python -m flnotes presets`")
        values = preset_values(name)
        if BASELINE_READING.get(name) == "seed-code" and "dataset" in overrides:
            # The seed code picks some baselines' values by the dataset (FedGen's in the FedMR
            # repository): those of the dataset the run trains on, as a grid cell gets them.
            values.update(seed_code_baselines(overrides["dataset"],
                                              SEED_REPOSITORY.get(name) or "FedMR"))
        algorithm = overrides.get("algorithm", values.get("algorithm", "fedavg"))
        values = {**only_read(values, algorithm), **overrides}
        return _build(cls.__new__(cls), values, strict=bool(overrides),
                      strict_names=set(overrides))


def only_read(values: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """``values`` without the method settings ``algorithm`` does not read (a preset's or a
    grid's values for several methods); common fields and unknown names stay (to be refused)."""
    if algorithm not in algorithm_names():
        return dict(values)
    read = _method_settings(algorithm)
    return {k: v for k, v in values.items() if k in read or _declarations(k) is None}


def common_field_names() -> list[str]:
    """The fields every run has, whatever its method (no method settings)."""
    return [f.name for f in fields(RunConfig) if f.name != "method_settings"]


def field_names() -> list[str]:
    """Every name a config may be given: the common fields, then each method setting."""
    return common_field_names() + list(all_settings())


def config_field_names(algorithm: str) -> list[str]:
    """The names a run of ``algorithm`` records: common fields and its own settings."""
    return common_field_names() + list(_method_settings(algorithm))


def _method_settings(algorithm: str) -> dict:
    return settings_of(algorithm) if algorithm in algorithm_names() else {}


def _declarations(name: str) -> dict | None:
    return all_settings().get(name)


def _declared(declared: dict, algorithm: Any):
    """The declaration that applies: ``algorithm``'s if it reads the setting, else the first."""
    return declared.get(algorithm) or next(iter(declared.values()))


def model_names() -> list[str]:
    """Every model name a config may use: the registered architectures and the toy's
    2-parameter model (built by the toy's own task, :mod:`flnotes.toy.task`)."""
    return sorted(set(registered()) | {"toy"})


_PATH_FIELDS = ("data_dir", "partition_manifest", "run_dir")


def _plain(value: Any) -> Any:
    """numpy scalars as the Python number they hold (a grid's or a notebook's np.arange
    values), so the config stays JSON-able; other values unchanged."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _build(config: RunConfig, values: dict[str, Any], *, strict: bool,
           strict_names: set[str] | None = None) -> RunConfig:
    """Fill ``config`` from ``values`` (common fields and method settings), validate it and
    return it.

    ``strict``: a method setting given that the chosen method does not read is an error
    (only those in ``strict_names`` when that is given).
    """
    common = {f.name: f for f in fields(RunConfig) if f.name != "method_settings"}
    if "method_settings" in values:  # dataclasses.replace and old callers pass it whole
        values = {**(values.pop("method_settings") or {}), **values}
    if unknown := sorted(n for n in values if n not in common and _declarations(n) is None):
        known = common_field_names() + sorted(set(field_names()) - set(common))
        hint = did_you_mean(unknown[0], known)
        raise ValueError(f"unknown RunConfig field(s) {unknown}{hint}; valid fields: {known}")
    # a pathlib.Path (any os.PathLike) is the path it names
    values = {k: os.fspath(v) if k in _PATH_FIELDS and isinstance(v, os.PathLike) else _plain(v)
              for k, v in values.items()}
    if isinstance(values.get("data_options"), dict):  # np.int64(100) is the loader's 100
        values["data_options"] = {k: _plain(v) for k, v in values["data_options"].items()}
    # A method setting given as None takes its method's default (a notebook's parameter
    # "alpha = None  # the method's default"), unless None has a meaning of its own there.
    values = {k: v for k, v in values.items() if v is not None or k in common
              or any(s.none_means for s in _declarations(k).values())}
    object.__setattr__(config, "_given", dict(values))
    for name, f in common.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        object.__setattr__(config, name, values.get(name, default))
    settings = {k: v for k, v in values.items() if k not in common}
    object.__setattr__(config, "method_settings", settings)
    known_algorithm = isinstance(config.algorithm, str) and config.algorithm in algorithm_names()
    if config.momentum is None:  # the method's: 0 if it brings its own momentum
        own = known_algorithm and algorithm_class(config.algorithm).own_momentum
        object.__setattr__(config, "momentum", 0.0 if own else 0.9)
    problems = list(_problems(config))
    if known_algorithm:
        read = _method_settings(config.algorithm)
        renamed = {old: s.name for s in read.values() for old in s.old_names}
        for name in [n for n in settings if n not in read]:
            # An old name another method still reads (FedMut's alpha) is that method's, in a
            # base config; given with this algorithm named, or read by none, it is this one's.
            if name in renamed and (strict or not readers(name)):
                problems.insert(0, f"RunConfig.{name}={settings[name]!r} is invalid for "
                                   f"{config.algorithm}: its setting is now called "
                                   f"{renamed[name]} (--{renamed[name].replace('_', '-')})")
            elif strict and (strict_names is None or name in strict_names):
                who = readers(name)
                who = ", ".join(who[:-1]) + " or " + who[-1] if len(who) > 1 else who[0]
                problems.insert(0, f"RunConfig.{name}={settings[name]!r} is not read by "
                                   f"{config.algorithm}: it is a setting of {who}; drop it "
                                   "or choose that algorithm")
    if problems:
        raise ValueError(problems[0])
    if known_algorithm:
        # The chosen method's settings as plain attributes (given, else its default), as
        # __getattr__ would give them: read without its registry lookups, which
        # torch.compile traced into a training step that reads one (FedProx's mu), with a
        # warning for each cached function it met.
        for name, setting in read.items():
            object.__setattr__(config, name, settings.get(name, setting.default))
    return config


def _problems(c: RunConfig):
    """Yield one message per invalid field: the field, the value and what is allowed."""
    def bad(name: str, allowed: str) -> str:
        try:
            shown = repr(getattr(c, name))
        except ValueError:  # an int of more digits than Python prints
            shown = "<a number too long to print>"
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"RunConfig.{name}={shown} is invalid: {allowed}"

    known_algorithm = isinstance(c.algorithm, str) and c.algorithm in algorithm_names()
    if not known_algorithm:
        yield bad("algorithm", f"registered algorithms are {algorithm_names()}"
                  + did_you_mean(str(c.algorithm), algorithm_names()))
    cls = algorithm_class(c.algorithm) if known_algorithm else None
    for name in ("dataset", "partition", "backend", "compile", "device"):
        if not isinstance(getattr(c, name), str):
            yield bad(name, "must be a string")
    for name in ("model", "weighting"):
        if getattr(c, name) is not None and not isinstance(getattr(c, name), str):
            yield bad(name, "must be a string (or None for the default)")
    for name in _PATH_FIELDS:
        value = getattr(c, name)
        if value is not None and (not isinstance(value, str) or not value.strip()
                                  or "\0" in value):
            yield bad(name, "must be a path (a non-empty string or os.PathLike, no NUL byte) "
                      "or None")
    for name in ("download", "record_states"):
        if not isinstance(getattr(c, name), bool):
            yield bad(name, "must be true or false")
    if not isinstance(c.dataset, str):
        return
    parts = task_parts(c.dataset)
    if parts is not None:  # "A+B": tasks for FML's objective heterogeneity (data/multitask.py)
        problem = composition_problem(c.dataset)
        if problem:
            yield bad("dataset", problem)
        elif cls is not None and not cls.trains_composed_datasets:
            composers = [n for n in algorithm_names()
                         if algorithm_class(n).trains_composed_datasets]
            yield bad("dataset", "a composed dataset gives clients different tasks (FML's "
                      "objective heterogeneity, Fig. 6); only "
                      f"{' or '.join(f'algorithm={n!r}' for n in composers)} trains on it")
        elif c.partition == "natural":
            yield bad("partition", "a composed dataset splits each task among its clients: "
                      "use iid, dirichlet or shards")
        elif isinstance(c.num_clients, int) and c.num_clients < len(parts):
            yield bad("num_clients", f"{c.dataset!r} has {len(parts)} tasks and client i holds "
                      f"task i mod {len(parts)}: use at least one client per task")
    elif c.dataset not in dataset_names():
        yield bad("dataset", f"registered datasets are {dataset_names()}"
                  + did_you_mean(c.dataset, dataset_names()))
    if c.model is not None and c.model not in model_names():
        yield bad("model", f"registered models are {model_names()}"
                  + did_you_mean(str(c.model), model_names()))
    elif c.dataset == "toy" and c.model not in (None, "toy"):
        yield bad("model", "the toy dataset trains its own 2-parameter model ('toy'); leave "
                  "model unset (or 'toy')")
    elif c.model == "toy" and c.dataset != "toy":
        yield bad("model", "'toy' is the toy dataset's 2-parameter model; choose one of "
                  f"{sorted(set(model_names()) - {'toy'})}")
    for name, allowed in (("partition", PARTITIONS), ("backend", BACKENDS),
                          ("compile", COMPILE_MODES)):
        if getattr(c, name) not in allowed:
            yield bad(name, f"choose one of {list(allowed)}")
    if c.compile in COMPILE_MODES and c.compile != "off" and c.backend == "loop":
        yield bad("compile", "compiles the vmap backend's step; use backend='vmap' or 'auto'")
    if c.weighting is not None and c.weighting not in WEIGHTINGS:
        yield bad("weighting", f"choose one of {list(WEIGHTINGS)} (or None for the default)")
    if not isinstance(c.data_options, dict):
        yield bad("data_options", "must be a dict of loader options")
    else:
        for name in parts if parts is not None and not composition_problem(c.dataset) else [
                c.dataset]:  # a composed dataset's options go to every task's loader
            yield from data_option_problems(name, c.data_options)
    for name in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                 "eval_every", "eval_batch_size", "checkpoint_every", "shards_per_client",
                 "min_client_size", "seed"):
        value, low = getattr(c, name), 0 if name in ("min_client_size", "seed") else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            yield bad(name, f"must be a {'non-negative' if low == 0 else 'positive'} integer")
    if isinstance(c.num_clients, int) and isinstance(c.clients_per_round, int):
        if c.clients_per_round > c.num_clients:
            yield (f"RunConfig.clients_per_round={c.clients_per_round} is invalid: it cannot "
                   f"exceed num_clients={c.num_clients}")
    for name in ("lr", "dirichlet_alpha"):
        if not _is_number(getattr(c, name)) or getattr(c, name) <= 0:
            yield bad(name, "must be a positive finite number")
    if not _is_number(c.weight_decay) or c.weight_decay < 0:
        yield bad("weight_decay", "must be a non-negative finite number")
    for name in ("lr", "weight_decay"):  # each becomes a float32 step inside the optimizer
        if overflow := float32_overflow(getattr(c, name)):
            yield bad(name, overflow)
    if not _is_number(c.momentum) or not 0 <= c.momentum < 1:
        yield bad("momentum", "must be in [0, 1)")
    elif c.momentum != 0 and cls is not None and cls.own_momentum:
        yield bad("momentum", f"must be 0 for {c.algorithm}: it brings its own momentum "
                  f"({cls.own_momentum_note}), the local SGD none; leave momentum unset")
    if c.client_test_fraction is not None and (not _is_number(c.client_test_fraction)
                                               or not 0 <= c.client_test_fraction < 1):
        yield bad("client_test_fraction", "must be in [0, 1) (or None for the default)")
    if not isinstance(c.device, str) or not _valid_device(c.device):
        yield bad("device", "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    # Each given method setting against its declaration (the chosen method's, if it reads
    # it), then the chosen method's own checks across its settings.
    setting_problems = [bad(name, problem) for name, value in c.method_settings.items()
                        if (problem := _declared(_declarations(name), c.algorithm).problem(value))]
    yield from setting_problems
    if cls is not None and not setting_problems:  # its checks may assume well-typed values
        yield from cls.config_problems(c)


def _is_number(value: Any) -> bool:
    """A finite int or float: NaN and inf pass every comparison-based range check wrongly."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value)))  # (isfinite fails on 10**400)


def _valid_device(device: str) -> bool:
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return device == "auto"
    return True
