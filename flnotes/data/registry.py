"""Every dataset a run can name: the tensor loaders, and the datasets that build a whole task.

A loader is called as ``loader(data_dir, download, seed, **options)`` and returns a
:class:`~flnotes.data.tensors.TensorData`; its keyword options are read from its signature
(:mod:`flnotes.data.options`), so a loader documents its options once.

Tensor datasets also compose: ``"cifar10+cifar100"`` names one multitask dataset of both
(:mod:`flnotes.data.multitask`, FML's objective heterogeneity).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from flnotes.data.leaf import load_femnist, load_shakespeare
from flnotes.data.multitask import SEPARATOR, task_parts
from flnotes.data.tensors import TensorData
from flnotes.data.vision import load_cifar, load_idx_dataset, load_synthetic
from flnotes.messages import did_you_mean

DATASETS: dict[str, Callable[..., TensorData]] = {
    "synthetic": load_synthetic,
    "cifar10": partial(load_cifar, name="cifar10"),
    "cifar100": partial(load_cifar, name="cifar100"),
    "fashion-mnist": partial(load_idx_dataset, name="fashion-mnist"),
    "mnist": partial(load_idx_dataset, name="mnist"),
    "shakespeare": load_shakespeare,
    "femnist": load_femnist,
}

# Datasets whose whole task (data, split and model) is built by a layer above this one: name
# -> ``build_task(config) -> Task``. That layer registers itself (flnotes.toy.task registers
# "toy" when imported, which ``import flnotes`` does), so this layer names none of them.
TASK_BUILDERS: dict[str, Callable] = {}


def register_task_dataset(name: str, build_task: Callable) -> None:
    """Make ``name`` a dataset whose ``build_task(config)`` builds the whole task."""
    if name in DATASETS:
        raise ValueError(f"dataset name {name!r} is taken by a tensor dataset")
    TASK_BUILDERS[name] = build_task


def tensor_dataset_names() -> list[str]:
    """Names of the datasets loaded as tensors."""
    return sorted(DATASETS)


def dataset_names() -> list[str]:
    """Every dataset name a config may use (tensor datasets and whole-task datasets)."""
    return sorted(set(DATASETS) | set(TASK_BUILDERS))


def composition_problem(name: str) -> str | None:
    """Why a composed name ("A+B") names no multitask dataset, or None if it does."""
    parts = task_parts(name)
    if parts is None:
        return None
    # LEAF's datasets bring their own client split (and rows no client trains on): not tasks.
    composable = sorted(n for n, loader in DATASETS.items()
                        if getattr(loader, "__module__", "") != "flnotes.data.leaf")
    unknown = [part for part in parts if part not in composable]
    if unknown:
        kind = ("comes with its own client split (LEAF)" if unknown[0] in DATASETS
                else "is not a tensor dataset" + did_you_mean(unknown[0], composable))
        return (f"{unknown[0]!r} in {name!r} {kind}; compose two or more of {composable} "
                f"with {SEPARATOR!r}, e.g. 'cifar10+cifar100'")
    return None
