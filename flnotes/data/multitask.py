"""Several datasets as one multitask dataset: FML's objective heterogeneity (Fig. 6).

A dataset named ``"A+B"`` (e.g. ``"cifar10+cifar100"``) joins registered tensor datasets into
one label space: task A's classes come first, then task B's (10 + 100 = 110 classes), so a
label says which task a row belongs to. Client i holds task ``i mod T`` (T tasks), the same
rule as FML's ``personal_models`` (client i takes architecture ``i mod n``): listing one
personal architecture per task, in the same order, gives each task its model. Each task's
rows are split among its own clients by the run's partition, with the run's seed for the
first task, so a one-task composition is the plain dataset and the plain split.

Why these choices (FML's letter says only that clients have "different tasks", CIFAR-10
beside CIFAR-100, and share one model): one joint output layer is the simplest shared model
that covers both label sets; round-robin assignment needs no new setting and gives every
task clients whenever ``num_clients >= T``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from flnotes.data.tensors import TensorData
from flnotes.rng import derive_seed

SEPARATOR = "+"


@dataclass(repr=False)
class MultitaskData(TensorData):
    """A TensorData whose label space is its tasks' classes one after the other."""

    task_names: tuple[str, ...] = ()
    task_classes: tuple[int, ...] = ()  # classes of each task; labels of task t start at
    # sum(task_classes[:t])

    def __repr__(self) -> str:
        tasks = ", ".join(f"{name} ({count} classes)"
                          for name, count in zip(self.task_names, self.task_classes, strict=True))
        return (f"MultitaskData({self.name!r}, tasks: {tasks}, train={len(self.train_y)}, "
                f"test={len(self.test_y)}, input_shape={self.input_shape})")


def task_parts(name: str) -> list[str] | None:
    """The datasets a composed name joins ("cifar10+cifar100" -> both), None if not composed."""
    if not isinstance(name, str) or SEPARATOR not in name:
        return None
    return [part.strip() for part in name.split(SEPARATOR)]


def task_labels(names) -> list[str]:
    """Names that tell the tasks apart in metric keys: 'synthetic', 'synthetic-2', ..."""
    labels = []
    for t, name in enumerate(names):
        repeats = list(names[:t]).count(name)
        labels.append(name if repeats == 0 else f"{name}-{repeats + 1}")
    return labels


def class_offsets(task_classes) -> list[int]:
    """First joint label of each task, and the total at the end: (10, 100) -> [0, 10, 110]."""
    offsets = [0]
    for count in task_classes:
        offsets.append(offsets[-1] + int(count))
    return offsets


def client_tasks(num_clients: int, num_tasks: int) -> list[int]:
    """Each client's task: client i holds task i mod T (as personal_models' i mod n)."""
    if num_clients < num_tasks:
        raise ValueError(f"{num_tasks} tasks need num_clients >= {num_tasks} (one client per "
                         f"task at least; client i holds task i mod {num_tasks}); got "
                         f"num_clients={num_clients}")
    return [client % num_tasks for client in range(num_clients)]


def load_multitask(names, loaders: dict, data_dir: Path, download: bool, seed: int,
                   **options) -> MultitaskData:
    """Load each named dataset and join them, labels shifted into one label space.

    Task t > 0 loads with a seed derived from (seed, "task", t), so two draws of a generated
    dataset ("synthetic+synthetic") are two different tasks; task 0 keeps the run's seed.
    Options go to every part's loader.
    """
    parts = []
    for t, name in enumerate(names):
        part_seed = seed if t == 0 else derive_seed(seed, "task", t)
        part = loaders[name](data_dir, download, part_seed, **options)
        if getattr(part, "client_indices", None):
            # A LEAF dataset's rows outside its clients' shares (test windows) would leak into
            # the re-split; its natural split has no place in a composition either.
            raise ValueError(f"{name!r} comes with its own client split (LEAF) and cannot be "
                             f"a task of {SEPARATOR.join(names)!r}")
        parts.append(part)
    shapes = {part.input_shape for part in parts}
    if len(shapes) > 1:
        described = ", ".join(f"{p.name} {p.input_shape}" for p in parts)
        raise ValueError(f"the tasks of {SEPARATOR.join(names)!r} share one model and need one "
                         f"input shape; they have {described}")
    offsets = class_offsets(p.num_classes for p in parts)
    shift = lambda split: torch.cat([getattr(p, split) + offsets[t] for t, p in enumerate(parts)])
    cat = lambda split: torch.cat([getattr(p, split) for p in parts])
    sources = "; ".join(f"{p.name}: {p.source}" for p in parts if p.source)
    return MultitaskData(SEPARATOR.join(names), cat("train_x"), shift("train_y"), cat("test_x"),
                         shift("test_y"), offsets[-1], source=sources,
                         task_names=tuple(names),
                         task_classes=tuple(p.num_classes for p in parts))


def multitask_partition(data: MultitaskData, num_clients: int, seed: int,
                        split) -> list[torch.Tensor]:
    """Each task's training rows split among that task's clients by ``split``.

    ``split(labels, num_clients, seed)`` returns one index tensor per client into
    ``labels`` (the run's partition scheme); task 0 uses the run's seed as given, task t > 0
    a seed derived from it, so one task gives exactly the plain split.
    """
    tasks = client_tasks(num_clients, len(data.task_classes))
    offsets = class_offsets(data.task_classes)
    parts: list[torch.Tensor | None] = [None] * num_clients
    for t in range(len(data.task_classes)):
        rows = torch.nonzero((data.train_y >= offsets[t]) & (data.train_y < offsets[t + 1]))
        rows = rows.flatten()
        members = [c for c in range(num_clients) if tasks[c] == t]
        task_seed = seed if t == 0 else derive_seed(seed, "task-partition", t)
        split_rows = split(data.train_y[rows], len(members), task_seed)
        for client, idx in zip(members, split_rows, strict=True):
            parts[client] = rows[idx]
    return parts


def check_task_parts(data: MultitaskData, parts: list[torch.Tensor]) -> None:
    """Raise ValueError if some client holds rows of another task than its own (a manifest)."""
    tasks = client_tasks(len(parts), len(data.task_classes))
    offsets = class_offsets(data.task_classes)
    for client, idx in enumerate(parts):
        y = data.train_y[idx]
        lo, hi = offsets[tasks[client]], offsets[tasks[client] + 1]
        if len(y) and not bool(((y >= lo) & (y < hi)).all()):
            raise ValueError(f"client {client} holds task {data.task_names[tasks[client]]!r} "
                             f"(client i holds task i mod {len(data.task_classes)}) "
                             "but the manifest gives it rows of another task")
