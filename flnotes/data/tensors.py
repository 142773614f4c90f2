"""The in-memory dataset every loader returns, and where data live on disk.

Every loader returns a TensorData with the whole train and test sets in memory, so training
indexes tensors per client and never runs per-sample Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class TensorData:
    """A dataset held as tensors: train/test inputs and int64 labels."""

    name: str
    train_x: torch.Tensor  # float32 images (N,C,H,W) normalised per channel, or int64 ids (N,80)
    train_y: torch.Tensor  # int64 (N,)
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    # Where the data came from when it is not the usual copy, e.g. "a JPEG image folder":
    # a run records it, and tables mark results read from a lossy copy.
    source: str = ""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, e.g. (3, 32, 32)."""
        return tuple(self.train_x.shape[1:])

    def __repr__(self) -> str:
        # The dataclass default would print whole tensors.
        return (f"TensorData({self.name!r}, train={len(self.train_y)}, test={len(self.test_y)}, "
                f"input_shape={self.input_shape}, num_classes={self.num_classes})")


def default_data_dir() -> Path:
    """Where datasets live unless told: $FLNOTES_DATA, else ~/.cache/flnotes/data."""
    return Path(os.environ.get("FLNOTES_DATA") or "~/.cache/flnotes/data").expanduser()


def default_cache_dir() -> Path:
    """Where decoded image folders are cached: $FLNOTES_CACHE, else ~/.cache/flnotes."""
    return Path(os.environ.get("FLNOTES_CACHE") or "~/.cache/flnotes").expanduser()
