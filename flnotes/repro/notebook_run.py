"""What a reproduction notebook (10, 11, 12) does between its parameters and its pictures.

A notebook names the common settings as parameters (dataset, model, rounds, lr, ...) and takes
any other RunConfig field, any method's setting included, in one ``config`` dict, so that a new
method's setting needs no notebook change and a sweep's grid names it as RunConfig does.
:func:`settings` builds the notebook's one base RunConfig from a preset, those parameters and
``config``, and says where each value came from; :func:`run_methods` runs each method over the
seeds into resumable run folders and reads them back as a table.

Papermill cannot say which parameters it was given, so a parameter whose value differs from
the parameters cell's counts as set: it wins over a preset. With a preset, a parameter left as
the cell wrote it takes the preset's value, or RunConfig's own default where the preset sets
none (the cell's values are CPU smoke values), as ``flnotes run --preset`` does. ``config``
wins over both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flnotes.algorithms import algorithm_class
from flnotes.config import RunConfig, field_names
from flnotes.config.presets import PRESETS, preset_names, preset_values
from flnotes.engine.history import History
from flnotes.engine.run_folder import settings_hash
from flnotes.engine.seeds import run_seeds
from flnotes.messages import did_you_mean, one_line
from flnotes.repro import tables

# where each value came from, in the order the lines print
ORIGINS = ("preset", "set as parameters", "config", "this notebook's defaults (CPU smoke scale)",
           "computed by the notebook")


class SettingsError(ValueError):
    """Settings a notebook cannot run; IPython shows it as one line, not a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"SettingsError: {self}"]


@dataclass(frozen=True)
class Settings:
    """A notebook's base RunConfig and where each value given to it came from."""

    config: RunConfig
    values: dict[str, Any]  # what RunConfig was given ...
    origin: dict[str, str]  # ... and where each came from (one of ORIGINS)
    preset: str | None = None

    def fill(self, name: str, value: Any) -> Settings:
        """These settings with ``name`` computed by the notebook (the roles of a play as
        clients), unless a preset, a parameter or ``config`` gave it."""
        if name in self.origin:
            return self
        values = {**self.values, name: value}
        return Settings(_build(values), values, {**self.origin, name: ORIGINS[4]}, self.preset)

    def __str__(self) -> str:
        lines = []
        for where in ORIGINS:
            names = [n for n in self.values if self.origin.get(n) == where]
            if names:
                label = f"from preset {self.preset}" if where == "preset" else where
                lines.append(f"{label}: " + ", ".join(f"{n}={self.values[n]!r}" for n in names))
        lines.append("everything else: RunConfig's defaults (python -m flnotes run --help)")
        return "\n".join(lines)


def settings(preset: str | None, named: dict[str, Any], written: dict[str, Any],
             config: dict[str, Any] | None = None, *, dataset: str | None = None) -> Settings:
    """The notebook's base RunConfig (its ``algorithm`` is each method's in turn) and where
    each value came from (printing it says so, one line per origin).

    ``named``: each parameter's value now; ``written``: as the parameters cell writes it (the
    parameters that are no RunConfig field, like ``seeds``, are ignored). ``config``: any
    RunConfig field, over everything. ``dataset``: the one dataset the notebook trains (a
    preset or value for another is refused).
    """
    fields = set(field_names())
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise SettingsError(f"unknown preset {preset!r}{did_you_mean(preset, preset_names())}"
                                "; list them with `python -m flnotes presets`")
        given = preset_values(preset)
        given.pop("algorithm", None)  # the methods a notebook runs are its `algorithms`
        if dataset is not None and given.get("dataset", dataset) != dataset:
            raise SettingsError(f"preset {preset!r} is for {given['dataset']}; this notebook "
                                f"trains {dataset}")
        values.update(given)
        origin.update(dict.fromkeys(given, "preset"))
    for name, value in named.items():
        if name not in fields:
            continue
        if value != written.get(name):
            values[name], origin[name] = value, ORIGINS[1]
        elif preset is None and value is not None:
            values[name], origin[name] = value, ORIGINS[3]
        # else: the preset's value, or RunConfig's default (None: the notebook fills it in)
    if not isinstance(config, dict | None):
        raise SettingsError(f"config must be a dict of RunConfig fields, got {config!r}")
    for name, value in (config or {}).items():
        if name not in fields:
            raise SettingsError(f"config: {name!r} is not a RunConfig field"
                                f"{did_you_mean(name, sorted(fields))}")
        values[name], origin[name] = value, "config"
    if dataset is not None and values.get("dataset", dataset) != dataset:
        raise SettingsError(f"dataset {values['dataset']!r}: this notebook trains {dataset}")
    return Settings(_build(values), values, origin, preset)


def _build(values: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.from_dict(values)
    except (ValueError, TypeError) as err:
        raise SettingsError(one_line(err)) from None


def seconds_per_round(history: History) -> float:
    """Mean seconds of the rounds after the first: the first round of the first run also pays
    one-off start-up costs (lazy imports, first allocations), about 1 s on a CPU, which would
    make the first method look slow."""
    rows = [r for r in history.rows if r["round"] > 1] or history.rows
    return sum(r["seconds"] for r in rows) / len(rows)


@dataclass
class MethodRuns:
    """Each method's runs of one notebook: histories by (method, seed) and run folders."""

    seeds: list[int]
    histories: dict[tuple[str, int], History] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)

    def first_seed(self) -> dict[str, History]:
        """Each method's history of the first seed (the curves a notebook draws)."""
        return {a: self.histories[a, self.seeds[0]] for a in self.folders}

    def summary(self) -> pd.DataFrame:
        """One row per method: the run folders' table (flnotes.repro.tables.aggregate), of
        these folders and seeds only (the default runs/notebooks/ keeps other settings')."""
        runs = pd.concat([tables.collect_runs(f) for f in self.folders.values()],
                         ignore_index=True)
        return tables.aggregate(runs[runs["seed"].isin(self.seeds)], by=["method"])


def run_folder(config: RunConfig, output_dir: str | Path | None, notebook: str) -> Path:
    """Where a method's runs go (``seed<N>`` below it). Given an output_dir (a sweep's cell):
    ``runs/<method>`` in it. Without one, a folder per method and settings under
    ``runs/notebooks/<notebook>/`` of the working directory (where ``python -m flnotes tables
    runs/notebooks`` finds it): the same settings again resume those runs (finished ones are
    read back, not trained again), other settings get folders of their own."""
    if output_dir is not None:
        return Path(output_dir) / "runs" / config.algorithm
    settings_tag = settings_hash(config, seed=False)[:8]  # all but seed, rounds, device, data
    return Path("runs/notebooks") / notebook / f"{config.algorithm}-{config.rounds}r-{settings_tag}"


def run_methods(base: RunConfig, algorithms: list[str] | str, seeds: list[int],
                output_dir: str | Path | None, notebook: str,
                threads: int | None = 1) -> MethodRuns:
    """Every method over every seed from ``base``, one line each as it ends (naming the module
    that defines the method). All seeds of a method at once (flnotes.engine.seeds): on a GPU
    their clients train as one batched computation, on a CPU in turn."""
    algorithms = [algorithms] if isinstance(algorithms, str) else list(algorithms)
    runs = MethodRuns(seeds=list(seeds))
    for algorithm in algorithms:
        config = base.replace(algorithm=algorithm)
        folder = run_folder(config, output_dir, notebook)
        runs.folders[algorithm] = folder
        module = algorithm_class(algorithm).__module__
        histories = run_seeds(config.replace(run_dir=str(folder)), list(seeds), progress=False,
                              threads=threads)
        for seed, history in zip(seeds, histories, strict=True):
            runs.histories[algorithm, seed] = history
            print(f"{algorithm:8s} ({module}) seed {seed}: {history.status}, final accuracy "
                  f"{history.final_accuracy:.4f}, {seconds_per_round(history):.2f} s/round "
                  "after round 1")
    return runs
