"""The papers' result tables as published (CSV in data/paper_tables), and the key that names
one of their cells: dataset, model, heterogeneity and method, as the papers print them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from flnotes.algorithms import algorithm_class, algorithm_names
from flnotes.messages import did_you_mean
from flnotes.repro import PAPER_TABLE_DIR

KEY = ["dataset", "model", "heterogeneity", "method"]

DATASET_LABELS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "shakespeare": "Shakespeare",
                  "femnist": "FEMNIST", "mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}
# "lenet-cifar" is the seed authors' code's LeNet-style CNNCifar, the model their papers'
# tables call "CNN" (the *-official presets run it), so its runs belong in the CNN rows; the
# paper-setting check still marks such a cell, since the paper presets' CNN is "cnn". A sweep
# whose table names the model otherwise (FML's CNN2) says so in its cell labels.
MODEL_LABELS = {"cnn": "CNN", "lenet-cifar": "CNN", "resnet18": "ResNet-18",
                "resnet18-gn": "ResNet18", "resnet20": "ResNet-20", "vgg16": "VGG-16",
                "lstm": "LSTM", "lstm-100": "LSTM", "mlp": "MLP", "lenet5": "LeNet5",
                "femnist-cnn": "CNN"}


class _MethodLabels(Mapping):
    """Registry name -> the method's name in the papers' tables (``Strategy.label``), read from
    the registry on each lookup, so a method registered later has its label too."""

    def __getitem__(self, name: str) -> str:
        if name not in algorithm_names():
            raise KeyError(name)
        return algorithm_class(name).label or name

    def __iter__(self):
        return iter(algorithm_names())

    def __len__(self) -> int:
        return len(algorithm_names())


METHOD_LABELS = _MethodLabels()


def heterogeneity_label(config: dict) -> str:
    """The paper CSVs' heterogeneity tag of a config: dir=<alpha>, iid, leaf or shards=<p>."""
    partition = config.get("partition")
    if partition == "dirichlet":
        alpha = float(config.get("dirichlet_alpha"))
        # As printed in the papers: 1.0 and 0.5, but 0.02.
        return f"dir={alpha:.1f}" if round(alpha, 1) == alpha else f"dir={alpha:g}"
    if partition == "natural":
        return "leaf"
    if partition == "shards":
        return f"shards={config.get('shards_per_client')}"
    return str(partition)


def derived_labels(config: dict) -> dict[str, str]:
    """Table key of a run from its config alone."""
    model = config.get("model")
    return {"dataset": DATASET_LABELS.get(config.get("dataset"), str(config.get("dataset"))),
            "model": MODEL_LABELS.get(model, str(model)),
            "heterogeneity": heterogeneity_label(config),
            "method": METHOD_LABELS.get(config.get("algorithm"), str(config.get("algorithm")))}


def run_labels(config: dict, cell_labels: dict, algorithms) -> dict[str, str]:
    """A run's table key: labels derived from its config, then its sweep cell's labels.

    A cell's labels name the paper's setting; when a cell runs several algorithms, each run
    keeps the method of its own algorithm.
    """
    labels = derived_labels(config)
    several = isinstance(algorithms, list) and len(algorithms) > 1
    labels.update({k: v for k, v in cell_labels.items()
                   if k in KEY and not (k == "method" and several)})
    return labels


def paper_table_names(folder: Path = PAPER_TABLE_DIR) -> list[str]:
    """Names (CSV stems) of the paper tables shipped in data/paper_tables."""
    return sorted(p.stem for p in folder.glob("*.csv"))


def load_paper_table(name: str, folder: Path = PAPER_TABLE_DIR) -> pd.DataFrame:
    """A paper table CSV with numeric accuracy columns (percent)."""
    path = Path(name) if str(name).endswith(".csv") else folder / f"{name}.csv"
    if not path.exists():
        known = paper_table_names(folder)
        raise FileNotFoundError(f"no paper table {path}{did_you_mean(str(name), known)}; "
                                f"known: {', '.join(known)}")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in ("accuracy_mean", "accuracy_std"):
        table[column] = pd.to_numeric(table[column].replace("", np.nan))
    return table


def methods_markdown(folder: Path = PAPER_TABLE_DIR) -> str:
    """The README's table of methods, from the registry: each method's flag value, its name in
    the papers' tables, the first line of its class's docstring, its module, and the paper
    tables that have a column for it (`python -m flnotes methods` prints it)."""
    columns: dict[str, list[str]] = {}
    for name in paper_table_names(folder):
        for method in sorted(set(load_paper_table(name, folder)["method"])):
            columns.setdefault(method, []).append(name)
    lines = ["| `--algorithm` | in the papers' tables | what it is | module | paper tables |",
             "|---|---|---|---|---|"]
    for name in algorithm_names():
        cls = algorithm_class(name)
        label = cls.label or name
        what = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()).replace("|", "\\|")
        module = cls.__module__.replace(".", "/") + ".py"
        tables = ", ".join(columns.get(label, [])) or "—"
        lines.append(f"| `{name}` | {label} | {what} | `{module}` | {tables} |")
    return "\n".join(lines)
