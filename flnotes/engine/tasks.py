"""A Task joins config -> data, partition and model factory: everything a run trains on.

Datasets come from :mod:`flnotes.data` (tensors) or from a module that builds a whole
task itself (the 2-D toy, LEAF's natural splits). Client data stay as one tensor plus
per-client index tensors, so training never does per-sample Python work.

A composed dataset ("cifar10+cifar100", :mod:`flnotes.data.multitask`) gives clients
different tasks in one joint label space: client i holds task i mod T, each task's rows are
split among its own clients, and evaluation reports each task on its own classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import flnotes.data
from flnotes.algorithms import algorithm_class
from flnotes.data.multitask import (
    MultitaskData,
    check_task_parts,
    class_offsets,
    load_multitask,
    multitask_partition,
    task_labels,
    task_parts,
)
from flnotes.data.partition import load_manifest, make_partition, save_manifest
from flnotes.data.registry import DATASETS, TASK_BUILDERS
from flnotes.data.tensors import default_data_dir
from flnotes.models import build_model
from flnotes.rng import torch_generator


@dataclass
class Task:
    """Client training data, the test set and the model factory of one run."""

    name: str
    model_factory: Callable[[], nn.Module]
    train_x: torch.Tensor
    train_y: torch.Tensor
    client_indices: list[torch.Tensor]  # rows of train_x each client trains on
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    client_test_indices: list[torch.Tensor] | None = None  # each client's held-out rows
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
    # Which tensor client_test_indices index: "train" (rows held out of the client's own
    # training share) or "test" (a natural split's per-client test rows, e.g. LEAF).
    client_test_source: str = "train"
    data_source: str = ""  # TensorData.source: e.g. "a JPEG image folder" (recorded by a run)
    # Objective heterogeneity (FML Fig. 6): the tasks of a composed dataset and their class
    # counts, labels of task t starting at sum(task_classes[:t]); client i holds task
    # i mod T. Empty: one task, every class.
    task_names: tuple[str, ...] = ()
    task_classes: tuple[int, ...] = ()
    model_name: str = ""  # the registered architecture model_factory builds (config.model)
    _working_model: nn.Module | None = field(default=None, init=False, repr=False)
    # Built once per run by a training backend (e.g. the compiled step), keyed by it.
    backend_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # A task whose models' loss can be computed for a stack of models at once (the toy: two
    # numbers per model) defines stacked_losses(params, x, y, mask) -> (K,): params
    # {name: (K, ...)}, x and y (K, B, ...), mask (K, B) or None (every row real), each lane's
    # loss_fn mean over its real rows of the model model_factory builds, lane k's loss a
    # function of lane k's parameters only (the gradient of the sum is then each lane's).
    # The stacked step then needs no vmap (batched/stacked).
    stacked_losses = None

    def working_model(self) -> nn.Module:
        """One model instance, built once, that training and evaluation load states into."""
        if self._working_model is None:
            self._working_model = self.model_factory()
        return self._working_model

    @property
    def num_clients(self) -> int:
        """Number of clients in the federation."""
        return len(self.client_indices)

    @property
    def num_tasks(self) -> int:
        """How many tasks (label sets) the clients hold; 1 for a plain dataset."""
        return max(1, len(self.task_classes))

    def client_task(self, client: int) -> int:
        """The task a client holds (i mod T, as data.multitask.client_tasks)."""
        return client % self.num_tasks

    def task_classes_range(self, task: int) -> tuple[int, int]:
        """The joint labels [start, stop) of one task; every class for a plain dataset."""
        if not self.task_classes:
            return 0, self.num_classes
        offsets = class_offsets(self.task_classes)
        return offsets[task], offsets[task + 1]

    def class_range(self, client: int) -> tuple[int, int]:
        """The joint labels [start, stop) of the client's own task."""
        return self.task_classes_range(self.client_task(client))

    def task_label(self, task: int) -> str:
        """A task's name in metric keys ('cifar100'; 'synthetic-2' for a repeated name)."""
        return task_labels(self.task_names)[task]

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, labels) a client trains on."""
        idx = self.client_indices[client]
        return self.train_x[idx], self.train_y[idx]

    def client_test_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, labels) a client holds out to test its own (personal) model."""
        if self.client_test_indices is None:
            raise ValueError("this task has no per-client test data: set client_test_fraction")
        idx = self.client_test_indices[client]
        if self.client_test_source == "test":
            return self.test_x[idx], self.test_y[idx]
        return self.train_x[idx], self.train_y[idx]

    def num_samples(self, client: int) -> int:
        """How many training samples a client holds."""
        return int(self.client_indices[client].numel())

    @torch.no_grad()
    def evaluate_on(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    batch_size: int = 1000, classes: tuple[int, int] | None = None
                    ) -> dict[str, float]:
        """Accuracy and mean loss of a model on (x, y), in eval mode.

        ``classes`` = (start, stop): rows of one task, judged on a shared model's logits
        [start, stop) against labels shifted to 0..stop-start-1 (several tasks).
        """
        was_training = model.training
        model.eval()
        # Sums stay on the device until the end: one transfer, not two per batch.
        correct = torch.zeros((), dtype=torch.long, device=y.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=y.device)
        for start in range(0, len(y), batch_size):
            out = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            if classes is not None:
                out, target = out[:, classes[0] : classes[1]], target - classes[0]
            loss_sum += self.loss_fn(out, target).double() * len(target)
            correct += (out.argmax(dim=1) == target).sum()
        model.train(was_training)
        n = max(len(y), 1)
        return {"accuracy": int(correct) / n, "loss": float(loss_sum) / n}

    def evaluate(self, model: nn.Module, batch_size: int = 1000) -> dict[str, float]:
        """Accuracy and loss on the full test set; with several tasks, each test row is
        judged on its own task's classes, and each task is reported too (accuracy_<task>)."""
        if self.num_tasks == 1:
            return self.evaluate_on(model, self.test_x, self.test_y, batch_size)
        row: dict[str, float] = {}
        correct = loss = 0.0
        for task in range(self.num_tasks):
            lo, hi = self.task_classes_range(task)
            rows = torch.nonzero((self.test_y >= lo) & (self.test_y < hi)).flatten()
            result = self.evaluate_on(model, self.test_x[rows], self.test_y[rows], batch_size,
                                      classes=(lo, hi))
            label = self.task_label(task)
            row[f"accuracy_{label}"], row[f"loss_{label}"] = result["accuracy"], result["loss"]
            correct += round(result["accuracy"] * len(rows))
            loss += result["loss"] * len(rows)
        n = max(len(self.test_y), 1)
        return {"accuracy": correct / n, "loss": loss / n, **row}

    def evaluate_client(self, model: nn.Module, client: int,
                        batch_size: int = 1000) -> dict[str, float]:
        """A client's own model (FML's personal model, which outputs only its task's classes)
        on the client's held-out rows."""
        x, y = self.client_test_data(client)
        if self.num_tasks > 1:  # labels shifted to the client's own classes
            y = y - self.class_range(client)[0]
        return self.evaluate_on(model, x, y, batch_size)


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def build_task(config) -> Task:
    """Load data, split it over clients and bind the model factory, all from a config."""
    config = config.resolved()
    if config.dataset in TASK_BUILDERS:  # a dataset that builds its whole task (the toy)
        return TASK_BUILDERS[config.dataset](config)
    data = load_task_data(config)
    if isinstance(data, MultitaskData):
        # Each task's rows split among its own clients (client i holds task i mod T).
        parts = _manifest_or(config, data, lambda: multitask_partition(
            data, config.num_clients, config.seed,
            lambda labels, n, seed: make_partition(
                labels, n, config.partition, seed=seed, dirichlet_alpha=config.dirichlet_alpha,
                shards_per_client=config.shards_per_client, min_size=config.min_client_size)),
            check=check_task_parts)
    elif config.partition == "natural":
        parts = getattr(data, "client_indices", None)
        if parts is None:
            raise ValueError(f"partition='natural' needs a dataset with its own client split "
                             f"(LEAF); {config.dataset!r} has none: use iid, dirichlet or shards")
        parts = list(parts)[: config.num_clients]
        if len(parts) < config.num_clients:
            raise ValueError(f"{config.dataset!r} has only {len(parts)} natural clients but "
                             f"num_clients={config.num_clients}: set num_clients to "
                             f"{len(parts)} or fewer (--num-clients {len(parts)})")
        natural_tests = getattr(data, "client_test_indices", None)
        if natural_tests:
            return _natural_task(config, data, parts, list(natural_tests)[: config.num_clients])
    else:
        parts = _manifest_or(config, data, lambda: _split(config, data))

    train_parts, test_parts = split_clients(parts, config.client_test_fraction, config.seed)
    return _make_task(config, data, train_parts, data.test_x, data.test_y, test_parts, "train")


def _split(config, data) -> list[torch.Tensor]:
    """The clients' rows by config.partition. A dataset with its own client split (LEAF) may
    hold rows that no client trains on (the test windows inside the role texts, rows left
    out by max_roles / max_samples): re-splitting it (iid, dirichlet) draws from its
    clients' training rows only."""
    pool = getattr(data, "client_indices", None)
    pool = torch.cat(list(pool)) if pool else None
    parts = make_partition(
        data.train_y if pool is None else data.train_y[pool], config.num_clients,
        config.partition, seed=config.seed, dirichlet_alpha=config.dirichlet_alpha,
        shards_per_client=config.shards_per_client, min_size=config.min_client_size)
    return parts if pool is None else [pool[p] for p in parts]


def _manifest_or(config, data, make, check=None) -> list[torch.Tensor]:
    """The clients' rows from config.partition_manifest when that file exists (checked
    against num_clients, and by ``check(data, parts)``); else ``make()``'s, saved there when
    a manifest is named, for the next run to read."""
    path = config.partition_manifest
    if path and Path(path).exists():
        parts = load_manifest(path, data.train_y)
        if len(parts) != config.num_clients:
            raise ValueError(f"manifest {path} has {len(parts)} clients but "
                             f"num_clients={config.num_clients}")
        if check is not None:
            check(data, parts)
        return parts
    parts = make()
    if path:
        save_manifest(path, parts, data.train_y, meta={"config": config.to_dict()})
    return parts


def load_task_data(config):
    """The run's dataset as tensors: a registered one, or a composition of them ("A+B")."""
    names = task_parts(config.dataset)
    if names is None:
        # through the package, so a test (or a user) may replace flnotes.data.load_dataset
        return flnotes.data.load_dataset(config.dataset, data_dir=config.data_dir,
                                         download=config.download, seed=config.seed,
                                         **config.data_options)
    data_dir = (Path(config.data_dir).expanduser() if config.data_dir is not None
                else default_data_dir())
    return load_multitask(names, DATASETS, data_dir, config.download, config.seed,
                          **config.data_options)


def _natural_task(config, data, parts: list[torch.Tensor], tests: list[torch.Tensor]) -> Task:
    """A natural (LEAF) split: the test set is the kept clients' own test rows."""
    rows = torch.cat(tests)
    bounds = torch.tensor([0] + [len(t) for t in tests]).cumsum(0).tolist()
    personal = [torch.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return _make_task(config, data, parts, data.test_x[rows], data.test_y[rows],
                      personal if config.client_test_fraction else None, "test")


def _make_task(config, data, train_parts, test_x, test_y, test_parts, test_source) -> Task:
    device = resolve_device(config.device)
    input_shape = tuple(data.train_x.shape[1:])
    adapt = algorithm_class(config.algorithm).adapt_model  # MOON: a projection head

    def model_factory() -> nn.Module:
        return adapt(build_model(config.model, data.num_classes, input_shape), config).to(device)

    to = lambda t: t.to(device)  # noqa: E731 - data live on the training device
    return Task(
        name=config.dataset, model_factory=model_factory,
        train_x=to(data.train_x), train_y=to(data.train_y),
        client_indices=[to(p) for p in train_parts], test_x=to(test_x), test_y=to(test_y),
        num_classes=data.num_classes,
        client_test_indices=[to(p) for p in test_parts] if test_parts else None,
        client_test_source=test_source, data_source=getattr(data, "source", ""),
        task_names=getattr(data, "task_names", ()),
        task_classes=getattr(data, "task_classes", ()), model_name=config.model)


def split_clients(parts: list[torch.Tensor], test_fraction: float, seed: int
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Hold out a seeded random share of each client's rows as its personal test set."""
    if not test_fraction:
        return parts, None
    train, test = [], []
    for client, idx in enumerate(parts):
        perm = idx[torch.randperm(len(idx), generator=torch_generator(seed, "heldout", client))]
        n_test = max(1, int(round(test_fraction * len(idx))))
        test.append(perm[:n_test].sort().values)
        train.append(perm[n_test:].sort().values)
    return train, test
