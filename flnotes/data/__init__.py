"""Data: datasets as tensors, their checked options, client partitions, LEAF's natural splits.

The front door is :func:`load_dataset`: a registered name -> :class:`TensorData`. This
package imports nothing of the engine: a run's Task is built from it in
:mod:`flnotes.engine.tasks`.
"""

from __future__ import annotations

import urllib.error
from pathlib import Path

from flnotes.data.natural import LeafData
from flnotes.data.options import data_option_problems
from flnotes.data.registry import DATASETS, dataset_names, tensor_dataset_names
from flnotes.data.tensors import TensorData, default_data_dir
from flnotes.messages import one_line

__all__ = ["DATASETS", "LeafData", "TensorData", "dataset_names", "load_dataset",
           "tensor_dataset_names"]


def load_dataset(name: str, data_dir: str | Path | None = None, download: bool = False,
                 seed: int = 0, **options) -> TensorData:
    """Load a registered dataset as tensors; options go to its loader (e.g. coarse=True)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(tensor_dataset_names())}")
    problems = list(data_option_problems(name, options))
    if problems:
        raise ValueError(problems[0])
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    try:
        return DATASETS[name](data_dir, download, seed, **options)
    except urllib.error.URLError as err:  # download=True, and the network did not answer
        raise ConnectionError(
            f"downloading {name} into {data_dir} failed ({one_line(err.reason)}): without a "
            "network, copy its files from a machine that has one and point data_dir (or "
            "$FLNOTES_DATA) at them (the repository's data/README.md gives each layout)") from None
