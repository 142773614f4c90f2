"""The paper's setting of each table cell, and how a run's config differs from it.

The setting of a cell is the paper-scale expansion of the table's grid in sweeps/ (its
preset, then the cell's values). :func:`flnotes.repro.tables.compare` marks a cell whose runs
differ in a field every method depends on (:data:`SETTING_FIELDS`), in the partition's own
field, or in a setting the run's algorithm reads (:func:`algorithm_fields`), so a FedAvg run
is not flagged for an unused FedMut alpha.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flnotes.algorithms import algorithm_class, algorithm_names, settings_of
from flnotes.config.presets import SEED_REPOSITORIES, seed_code_baselines
from flnotes.repro import SWEEP_DIR
from flnotes.repro.grid import flat_settings, load_grid
from flnotes.repro.paper_tables import KEY, run_labels

# Fields every method's result depends on; algorithm_fields adds those one method reads, so
# a FedAvg run is not flagged for an unused FedMut alpha.
SETTING_FIELDS = ("dataset", "model", "partition", "rounds", "num_clients", "clients_per_round",
                  "local_epochs", "batch_size", "lr", "momentum", "weight_decay", "weighting",
                  "client_test_fraction", "data_options", "min_client_size")
PARTITION_FIELDS = {"dirichlet": ("dirichlet_alpha",), "shards": ("shards_per_client",)}


def algorithm_fields(algorithm: str | None) -> tuple[str, ...]:
    """The settings a run of ``algorithm`` reads (its declarations); () for an unknown name."""
    return tuple(settings_of(algorithm)) if algorithm in algorithm_names() else ()


def paper_settings(table: str, sweep_dir: Path = SWEEP_DIR) -> dict[tuple, dict]:
    """Table key -> the paper-scale parameters of that cell, from the table's grid in sweeps/.

    Empty when no grid there names the table. The grid is expanded as a sweep would (its
    preset's fields and each cell's values), without running anything.
    """
    settings: dict[tuple, dict] = {}
    for path in sorted(sweep_dir.glob("*.yaml")):
        grid = load_grid(path)
        if grid.paper_table != table:
            continue
        for cell in grid.cells:
            params = flat_settings(cell.parameters)
            algorithms = params.get("algorithms", params.get("algorithm"))
            algorithms = [algorithms] if isinstance(algorithms, str) else list(algorithms or [])
            for algorithm in algorithms:
                setting = {**params, "algorithm": algorithm}
                labels = run_labels(setting, cell.labels, algorithms)
                settings.setdefault(tuple(labels[k] for k in KEY), setting)
    return settings


def baseline_reading(config: dict) -> str:
    """'FedGen as the seed code ran it' when a run's own settings are the seed code's variant
    of its method (the values the ``*-official`` presets set where they differ from the
    method's defaults, i.e. from its own paper), else ''. Tables mark which reading a cell
    used, since a seed table's baseline numbers come from the seed code's reading."""
    algorithm = config.get("algorithm")
    if algorithm not in algorithm_names():
        return ""
    own = settings_of(algorithm)
    for repository in SEED_REPOSITORIES:  # the two repositories' values differ by dataset
        baselines = seed_code_baselines(config.get("dataset"), repository)
        variant = {k: v for k, v in baselines.items() if k in own and own[k].default != v}
        present = {k: v for k, v in variant.items() if k in config}  # an older folder lacks some
        if present and all(_same(config[k], v) for k, v in present.items()):
            label = algorithm_class(algorithm).label or algorithm
            return f"{label} as the seed code ran it (*-official presets), not its paper's"
    return ""


def setting_differences(configs: list[dict], paper: dict | None) -> list[str]:
    """How runs' configs differ from a cell's paper setting, e.g. '3 rounds instead of 2000'.

    A run read from a lossy copy of its data (``data_source``, from the run's environment,
    e.g. "a JPEG image folder") is marked too, with or without a paper setting to check.
    """
    notes = [f"{config['dataset']} read from {config['data_source']} (lossy: quote as "
             f"'{config['dataset']} (JPEG)')" for config in configs
             if "JPEG" in str(config.get("data_source", ""))]
    notes += [note for config in configs if (note := baseline_reading(config))]
    if not paper:
        return list(dict.fromkeys(notes))
    for config in configs:
        fields = SETTING_FIELDS + PARTITION_FIELDS.get(paper.get("partition"), ()) \
            + algorithm_fields(config.get("algorithm"))
        for name in fields:
            # A field the run folder does not record (an older version's) is not checked.
            if name not in paper or paper[name] is None or name not in config \
                    or _same(config[name], paper[name]):
                continue
            ours, theirs = config.get(name), paper[name]
            if name == "rounds":
                notes.append(f"{ours} rounds instead of {theirs}")
            elif name in ("dataset", "model"):
                notes.append(f"{ours} instead of {theirs}")
            else:
                notes.append(f"{name} {ours} instead of {theirs}")
    return list(dict.fromkeys(notes))


def _same(ours, theirs) -> bool:
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers) \
            and not isinstance(ours, bool) and not isinstance(theirs, bool):
        return bool(np.isclose(ours, theirs, rtol=1e-9, atol=0))
    return ours == theirs
