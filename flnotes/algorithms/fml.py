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
Objective heterogeneity (Fig. 6: clients with different tasks, CIFAR-10 beside CIFAR-100)
needs clients with different label sets and is not offered.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.engine.state import clone_state
from flnotes.models import build_model
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


def personal_factory(task, spec: str | None, client: int):
    """A builder of ``client``'s personal model: the task's model, or its own architecture."""
    names = personal_architectures(spec)
    if not names:
        return task.model_factory
    name = names[client % len(names)]
    shape, device = tuple(task.train_x.shape[1:]), task.train_x.device
    return lambda: build_model(name, task.num_classes, shape).to(device)


def initial_personal_state(task, seed: int, client: int,
                           spec: str | None = None) -> OrderedDict[str, torch.Tensor]:
    """A client's fresh personal model, seeded by (seed, client); the global RNG is restored."""
    with seeded_cpu_rng(seed, "fml-personal", client):
        return clone_state(personal_factory(task, spec, client)().state_dict())


class FML(Strategy):
    """Federated mutual learning: meme models are averaged, personal models stay local."""

    name = "fml"
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
        names = personal_architectures(self.config.personal_models)
        if client is None or not names:
            return self._models[1], self._models[2]
        name = names[client % len(names)]
        if name not in self._personal_models:
            self._personal_models[name] = personal_factory(
                task, self.config.personal_models, client)()
        return self._models[1], self._personal_models[name]

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

    def local_update(self, task, client: int, start, generator: torch.Generator) -> ClientResult:
        """DML of the meme (forked from ``start``) and the personal model over local epochs."""
        from flnotes.engine.train import batch_schedule  # train imports algorithms: import lazily

        cfg = self.config
        x, y = task.client_data(client)
        meme, personal = self._two_models(task, client)
        meme.load_state_dict(start)  # Alg. 1 l.8: fork the global model as the meme
        personal.load_state_dict(self.personal_state(task, client))
        meme.train()
        personal.train()
        opts = [torch.optim.SGD(m.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay) for m in (personal, meme)]
        meme_ces, personal_ces = [], []
        # Same batch order as every other method's local SGD for this (seed, round, client).
        for idx in batch_schedule(len(y), cfg.local_epochs, cfg.batch_size, generator, x.device):
            xb, yb = x[idx], y[idx]
            personal_loss, meme_loss, ce_p, ce_m = mutual_losses(
                personal(xb), meme(xb), yb, cfg.personal_weight, cfg.meme_weight, task.loss_fn)
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

        None (the reference loop trains them) when personal architectures differ.
        """
        from flnotes.engine.batched.stacked import client_lanes, train_stacked  # (import cycle)

        if self.heterogeneous():
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
        from flnotes.engine.batched.schedule import masked_loss, masked_mean

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
        """Mean accuracy of each personal model on its own client's held-out data."""
        if task.client_test_indices is None:
            raise ValueError(
                "FML reports personal_accuracy on each client's held-out data, but this task "
                "has none: set client_test_fraction > 0 (FML's default is 0.1)")
        if not self.personal:
            return {"personal_clients": 0}
        accuracies = []
        for client, state in sorted(self.personal.items()):
            _, model = self._two_models(task, client)
            model.load_state_dict(state)
            x, y = task.client_test_data(client)
            result = task.evaluate_on(model, x, y, self.config.eval_batch_size)
            accuracies.append(result["accuracy"])
        return {"personal_accuracy": sum(accuracies) / len(accuracies),
                "personal_clients": len(accuracies)}

    def state_dict(self) -> dict:
        """Global model plus every personal model (client -> state)."""
        return {"global_state": self.global_state,
                "personal": {int(c): s for c, s in self.personal.items()}}

    def load_state_dict(self, values: dict) -> None:
        """Restore the global model and the personal models."""
        super().load_state_dict(values)
        self.personal = {int(c): OrderedDict(s) for c, s in values.get("personal", {}).items()}
