"""FML (Shen et al. 2023, FITEE): federated mutual learning with a meme and a personal model.

Each client keeps a personal model for the whole run and, every round, forks the global
model as its meme model. The two models train side by side on the client's batches by deep
mutual learning (DML, Zhang et al. 2018): each learns from the labels and from the other's
predictions. Only meme models go back to the server, which averages them (FML Alg. 1 l.5);
personal models never leave their client.

Decisions where the paper (a short letter) is silent, and why:

- KL direction: the DML convention. The personal loss is
  ``a * CE(personal) + (1 - a) * KL(p_meme || p_personal)``: the meme's softmax is the
  target distribution and the personal model is the student; the meme loss mirrors it with
  ``b``. This is what the official code computes (``kl_div(log_softmax(student),
  softmax(teacher.detach()))``), batch-mean reduction, temperature 1.
- Both models step on the same mini-batch from one forward pass each (simultaneous updates,
  as the official code does), not DML's alternating updates.
- Personal models are initialised independently of the global model, seeded by
  (seed, client), and created the first time a client is sampled. The paper allows a
  personal architecture different from the global one, the official code draws a fresh
  model per client, and with a shared start and ``a == b`` the two models of a client would
  stay identical through round 1 (the KL terms would be zero).
- Aggregation is the plain 1/K mean (Alg. 1 l.5 and the official merge), so
  ``default_weighting`` is ``"uniform"``; with the paper's equal-sized shards it equals the
  sample-weighted mean.
- Both optimisers start fresh every round (like every other method's local SGD), so a round
  depends only on its start states; the official code keeps the personal optimiser's
  momentum across rounds.

Model heterogeneity (the title's "models"; Fig. 5): ``personal_models`` names the personal
architecture, one name or a comma-separated list of which client i takes entry i mod n, as
Fig. 5 gives each client its own model; unset, personal models share the global model's
architecture. Only the logits meet (the KL terms), so any two classifiers of the same classes
can learn from each other. Clients whose personal model differs from the shared one train on
the reference loop (a stack holds one architecture per model slot).

Independent training, Fig. 5's dashed reference, is ``personal_weight = 1``: the personal
loss is then plain cross-entropy, and each personal model trains on its own client alone.
Fig. 5 draws one curve per client and architecture and, dashed, the highest accuracy the same
model reaches alone; with more than one architecture named, each round also records
``personal_model_accuracy_<name>``, the mean personal accuracy of the clients holding that
architecture (one client each when the list has one entry per client, as in Fig. 5), whose
best round over a ``personal_weight = 1`` run is the dashed line.

Objective heterogeneity (Fig. 6: "LeNet5 and CNN1 models, trained independently on CIFAR-10
and CIFAR-100 ... [and] trained using FML ... despite the presence of different tasks
assigned to each client"). The letter says only that the tasks differ and that the clients
share one model; the official code (ZJU-DAI/Federated-Mutual-Learning, Data.py, Args.py)
loads one dataset and has no such experiment. Decided here, and why:

- The tasks share one label space: ``dataset="cifar10+cifar100"`` (:mod:`flnotes.data.multitask`)
  numbers CIFAR-10's classes 0-9 and CIFAR-100's 10-109, and client i holds task i mod T.
  The global (meme) model has the joint output layer (110 logits), the one shared model that
  covers both label sets; each personal model outputs only its own task's classes (10 or
  100), as a model trained "independently on CIFAR-10" would.
- A client's meme is used through its task's slice of logits, ``meme(x)[:, start:stop]``:
  both KL terms compare distributions over the same classes (the softmax of the slice), and
  the meme's cross-entropy is over that slice too. Each client's loss is then exactly plain
  FML's on its own task (one task: bit for bit the same run), and the shared model is a
  shared representation with one head per task, which is what the caption credits ("the use
  of a shared representation"). A cross-entropy over all 110 classes would also teach the
  meme to tell the tasks apart, which no curve of Fig. 6 measures.
- The server still takes the plain mean of the memes (Alg. 1 l.5). A task's head rows get
  gradients from that task's clients only, so they move by that task's share of the mean
  (weight decay, when set, still shrinks every row on every client).
- Only FML trains on a composed dataset (RunConfig refuses the other methods): they have no
  reading of Fig. 6, and a single model over 110 classes is another problem.
- Evaluation is per task: the global model on each task's test rows, judged on that task's
  slice (``accuracy_cifar10``, ``accuracy_cifar100``; ``accuracy`` over all rows), and each
  personal model on its own client's held-out rows (``personal_accuracy_<task>``, the
  curves of Fig. 6, beside their mean ``personal_accuracy``).
- Personal architectures: ``personal_models="lenet-cifar,cnn"`` gives client i entry
  i mod 2, so with two tasks every CIFAR-10 client gets LeNet-5 and every CIFAR-100 client
  the CNN (the ``fml-fig6`` preset). Unset, each personal model is the shared architecture
  with its task's output size.
- Clients of several tasks train on the reference loop (slices differ from client to client).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.batched.schedule import masked_loss, masked_mean
from flnotes.engine.batched.stacked import client_lanes, train_stacked
from flnotes.engine.state import clone_state
from flnotes.engine.train import iter_batches
from flnotes.messages import did_you_mean
from flnotes.models import build_model, model_names
from flnotes.rng import seeded_cpu_rng


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)), batch mean; the teacher is detached."""
    return F.kl_div(
        F.log_softmax(student_logits, dim=1),
        F.softmax(teacher_logits.detach(), dim=1),
        reduction="batchmean",
    )


def distillation_kl_rows(student_logits: torch.Tensor, teacher_logits: torch.Tensor):
    """Per-row KL(softmax(teacher) || softmax(student)); their mean is distillation_kl."""
    return F.kl_div(F.log_softmax(student_logits, dim=1),
                    F.softmax(teacher_logits.detach(), dim=1), reduction="none").sum(1)


def mutual_losses(
    personal_logits: torch.Tensor,
    meme_logits: torch.Tensor,
    target: torch.Tensor,
    personal_weight: float,
    meme_weight: float,
    loss_fn=F.cross_entropy,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(personal loss, meme loss, personal CE, meme CE) of one batch (DML with weights a, b)."""
    ce_personal = loss_fn(personal_logits, target)
    ce_meme = loss_fn(meme_logits, target)
    personal_loss = personal_weight * ce_personal
    meme_loss = meme_weight * ce_meme
    # Skip a KL term whose weight is zero: a = 1 or b = 1 is then exactly plain CE training.
    if personal_weight < 1:
        personal_loss = personal_loss + (1 - personal_weight) * distillation_kl(
            personal_logits, meme_logits)
    if meme_weight < 1:
        meme_loss = meme_loss + (1 - meme_weight) * distillation_kl(meme_logits, personal_logits)
    return personal_loss, meme_loss, ce_personal, ce_meme


def personal_architectures(spec: str | None) -> list[str]:
    """The names in a ``personal_models`` setting (empty: the shared model's architecture)."""
    return [name.strip() for name in spec.split(",")] if spec else []


def personal_name(task, spec: str | None, client: int) -> str | None:
    """``client``'s personal architecture; None: the task's own model (one task, unset)."""
    names = personal_architectures(spec)
    if names:
        return names[client % len(names)]
    return task.model_name or None if task.num_tasks > 1 else None


def personal_factory(task, spec: str | None, client: int):
    """A builder of ``client``'s personal model: the task's model, or its own architecture
    (with several tasks: the output size of the client's own task)."""
    name = personal_name(task, spec, client)
    if name is None:
        return task.model_factory
    start, stop = task.class_range(client)
    shape, device = tuple(task.train_x.shape[1:]), task.train_x.device
    return lambda: build_model(name, stop - start, shape).to(device)


def task_slice(task, client: int, logits: torch.Tensor, target: torch.Tensor):
    """The shared model's logits and the labels on ``client``'s task: joint logits
    [start, stop) and labels shifted to 0..stop-start-1 (untouched with one task)."""
    if task.num_tasks == 1:
        return logits, target
    start, stop = task.class_range(client)
    return logits[:, start:stop], target - start


def check_personal_state(task, client: int, state, model: nn.Module) -> None:
    """Raise a one-line ValueError if a personal state does not fit the client's model."""
    expected = model.state_dict()
    for name, tensor in state.items():
        if name in expected and tensor.shape != expected[name].shape:
            start, stop = task.class_range(client)
            raise ValueError(
                f"client {client}'s personal model has {name} of shape {tuple(tensor.shape)}, "
                f"but its model here expects {tuple(expected[name].shape)} (its task has "
                f"{stop - start} classes): the state comes from a run with another dataset "
                "or personal_models")


def initial_personal_state(task, seed: int, client: int,
                           spec: str | None = None) -> OrderedDict[str, torch.Tensor]:
    """A client's fresh personal model, seeded by (seed, client); the global RNG is restored."""
    with seeded_cpu_rng(seed, "fml-personal", client):
        return clone_state(personal_factory(task, spec, client)().state_dict())


class FML(Strategy):
    """Federated mutual learning: meme models are averaged, personal models stay local."""

    name = "fml"
    # local_update keeps each client's personal model in self.personal: its clients train in the
    # loop
    parallel_clients = False
    checkpointed = {"personal": "client_states"}
    label = "FML"
    settings = (
        Setting("personal_weight", 0.5, "FML a: cross-entropy weight in the personal model's "
                "loss", source="FML eq. 5 (a = 0.5 in its experiments)", minimum=0, maximum=1),
        Setting("meme_weight", 0.5, "FML b: cross-entropy weight in the meme model's loss",
                source="FML eq. 6 (b = 0.5 in its experiments)", minimum=0, maximum=1),
        Setting("personal_models", None, "FML: the personal models' architecture, one name or "
                "a comma-separated list (client i takes entry i mod n)", kind=str,
                source="FML Sec. 4.3 / Fig. 5 (model heterogeneity)",
                none_means="the shared model's"),
    )
    trains_composed_datasets = True  # Fig. 6: clients of different tasks
    keeps_personal_models = True

    @classmethod
    def config_problems(cls, config):
        """personal_models must name registered architectures."""
        names = config.personal_models
        if names is None:
            return
        unknown = [n.strip() for n in names.split(",") if n.strip() not in model_names()]
        if unknown:
            yield (f"RunConfig.personal_models={names!r} is invalid: one model name or a "
                   f"comma-separated list of {model_names()}"
                   + did_you_mean(unknown[0], model_names()))
    default_weighting = "uniform"  # Alg. 1 l.5: global = (1/K) sum_k meme_k
    default_client_test_fraction = 0.1  # personal accuracy; the official code's val_ratio 0.1
    custom_local_update = True

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.personal: dict[int, OrderedDict[str, torch.Tensor]] = {}
        self._models: tuple | None = None  # (task, meme model, personal model), reused
        self._personal_models: dict[str, nn.Module] = {}  # heterogeneous: one per architecture

    def _two_models(self, task, client: int | None = None) -> tuple[nn.Module, nn.Module]:
        """The meme model and ``client``'s personal model (built once per task and
        architecture; their weights are always loaded before use)."""
        if self._models is None or self._models[0] is not task:
            self._models = (task, task.model_factory(), task.model_factory())
            self._personal_models = {}
        name = None if client is None else personal_name(
            task, self.config.personal_models, client)
        if name is None:
            return self._models[1], self._models[2]
        start, stop = task.class_range(client)
        key = f"{name}/{stop - start}"  # one per architecture and output size
        if key not in self._personal_models:
            self._personal_models[key] = personal_factory(
                task, self.config.personal_models, client)()
        return self._models[1], self._personal_models[key]

    def heterogeneous(self) -> bool:
        """Whether some personal model has another architecture than the shared model."""
        names = personal_architectures(self.config.personal_models)
        return any(name != self.config.model for name in names)

    def personal_state(self, task, client: int) -> OrderedDict[str, torch.Tensor]:
        """The client's personal model, created on first use."""
        if client not in self.personal:
            self.personal[client] = initial_personal_state(
                task, self.config.seed, client, self.config.personal_models)
        return self.personal[client]

    def local_update(self, task, round: int, client: int, start,
                     generator: torch.Generator) -> ClientResult:
        """DML of the meme (forked from ``start``) and the personal model over local epochs."""

        cfg = self.config
        x, y = task.client_data(client)
        meme, personal = self._two_models(task, client)
        meme.load_state_dict(start)  # Alg. 1 l.8: fork the global model as the meme
        check_personal_state(task, client, self.personal_state(task, client), personal)
        personal.load_state_dict(self.personal_state(task, client))
        meme.train()
        personal.train()
        opts = [torch.optim.SGD(m.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay) for m in (personal, meme)]
        meme_ces, personal_ces = [], []
        # Same batch order as every other method's local SGD for this (seed, round, client).
        for idx in iter_batches(len(y), cfg.local_epochs, cfg.batch_size, generator, x.device):
            xb = x[idx]
            personal_out = personal(xb)
            # Several tasks: the meme on this client's slice of classes, labels shifted to it.
            meme_out, yb = task_slice(task, client, meme(xb), y[idx])
            personal_loss, meme_loss, ce_p, ce_m = mutual_losses(
                personal_out, meme_out, yb, cfg.personal_weight, cfg.meme_weight, task.loss_fn)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            # The teachers are detached, so the two graphs are disjoint: one backward is
            # the same as backpropagating each loss into its own model.
            (personal_loss + meme_loss).backward()
            for opt in opts:
                opt.step()
            meme_ces.append(ce_m.detach())
            personal_ces.append(ce_p.detach())
        self.personal[client] = clone_state(personal.state_dict())
        mean = lambda v: float(torch.stack(v).mean()) if v else float("nan")
        return ClientResult(client, clone_state(meme.state_dict()), len(y), mean(meme_ces),
                            extra={"personal_loss": mean(personal_ces)})

    def local_update_batched(self, task, round: int, clients: list[int], starts: list,
                             config) -> list[ClientResult] | None:
        """Every client's DML at once, as one stack (:mod:`flnotes.engine.batched.stacked`).

        None (the reference loop trains them) when personal architectures differ or clients
        hold different tasks.
        """

        if self.heterogeneous() or task.num_tasks > 1:
            return None
        personal = [self.personal_state(task, c) for c in clients]
        states, means = train_stacked(
            task, client_lanes(task, config, round, clients),
            {"meme.": starts, "personal.": personal}, config,
            ("fml", self), lambda: self.batched_objective(task.loss_fn))
        results = []
        for k, client in enumerate(clients):
            self.personal[client] = states["personal."][k]
            results.append(ClientResult(client, states["meme."][k], task.num_samples(client),
                                        means[k][0], extra={"personal_loss": means[k][1]}))
        return results

    def batched_objective(self, loss_fn):
        """The DML objective of one client's two models, for the batched step (masked rows)."""

        a, b = self.config.personal_weight, self.config.meme_weight

        def objective(forward, params, anchor, xb, yb, mask):
            personal_out, meme_out = forward("personal.", xb), forward("meme.", xb)
            ce_personal = masked_loss(loss_fn, personal_out, yb, mask)
            ce_meme = masked_loss(loss_fn, meme_out, yb, mask)
            personal_loss, meme_loss = a * ce_personal, b * ce_meme
            if a < 1:  # as mutual_losses: a zero-weight KL term is left out
                personal_loss = personal_loss + (1 - a) * masked_mean(
                    distillation_kl_rows(personal_out, meme_out), mask)
            if b < 1:
                meme_loss = meme_loss + (1 - b) * masked_mean(
                    distillation_kl_rows(meme_out, personal_out), mask)
            # The teachers are detached: one gradient of the sum trains each model on its own.
            return personal_loss + meme_loss, torch.stack([ce_meme, ce_personal]).detach()

        return objective

    def round_metrics(self, task) -> dict[str, float]:
        """Mean accuracy of each personal model on its own client's held-out data (and of
        each task's personal models, with several tasks; of each architecture's, with several
        architectures and one task)."""
        if task.client_test_indices is None:
            raise ValueError(
                "FML reports personal_accuracy on each client's held-out data, but this task "
                "has none: set client_test_fraction > 0 (FML's default is 0.1)")
        if not self.personal:
            return {"personal_clients": 0}
        accuracies: dict[int, list[float]] = {}
        by_model: dict[str, list[float]] = {}
        names = personal_architectures(self.config.personal_models)
        for client, state in sorted(self.personal.items()):
            _, model = self._two_models(task, client)
            check_personal_state(task, client, state, model)
            model.load_state_dict(state)
            result = task.evaluate_client(model, client, self.config.eval_batch_size)
            accuracies.setdefault(task.client_task(client), []).append(result["accuracy"])
            if names:
                by_model.setdefault(names[client % len(names)], []).append(result["accuracy"])
        every = [a for values in accuracies.values() for a in values]
        row = {"personal_accuracy": sum(every) / len(every), "personal_clients": len(every)}
        if task.num_tasks > 1:  # Fig. 6's curves: each task's personal models
            for t, values in sorted(accuracies.items()):
                row[f"personal_accuracy_{task.task_label(t)}"] = sum(values) / len(values)
        elif len(set(names)) > 1:  # Fig. 5's curves: each architecture's personal models
            for name, values in sorted(by_model.items()):
                row[f"personal_model_accuracy_{name}"] = sum(values) / len(values)
        return row
