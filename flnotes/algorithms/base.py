"""The strategy interface every federated algorithm implements.

A round is: ``select_clients`` (who takes part; by default the engine samples uniformly),
``dispatch`` (the state each sampled client starts from), local training (by
a backend in :mod:`flnotes.engine.train`, adding ``local_penalty`` to the loss, or the
strategy's own ``local_update``), then ``aggregate`` (the new global state). Local training
has two more hooks: ``local_gradient`` (how a step's gradient is taken: FedSAM's two
passes) and ``teacher_loss`` (a term from a detached teacher's outputs on the same batch:
FedNTD's distillation from the dispatched model), and ``batch_loss`` (a term from the live
model on each batch: FedGen's head on generated features); ``local_lr`` gives a round its own
learning rate (FedSAM's SWA cycles). A strategy
sees models only as states, so it runs unchanged on the 2-parameter toy and on a ResNet.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from flnotes.algorithms.settings import Setting
from flnotes.engine.state import clone_state, weighted_mean


@dataclass
class ClientResult:
    """What one client sends back after local training."""

    client: int
    state: OrderedDict[str, torch.Tensor]
    num_samples: int
    train_loss: float  # mean training loss over the client's local steps
    extra: dict[str, Any] = field(default_factory=dict)


class Strategy:
    """Base strategy: FedAvg's dispatch; aggregation by the configured weighting."""

    name = "base"
    # The method's name in tables and figures ("FedMut"); empty: the registry name.
    label = ""
    # The method's own hyperparameters (flnotes.algorithms.settings): RunConfig settings,
    # command-line flags and help, hashed with every run of this method. A subclass adds
    # to its parents' (a declaration of the same name replaces theirs) and may drop
    # inherited ones it does not read with settings_not_read.
    settings: tuple[Setting, ...] = ()
    settings_not_read: tuple[str, ...] = ()
    default_weighting = "samples"
    default_client_test_fraction = 0.0
    # What a checkpoint keeps beside the global model: attribute -> kind, or (kind, key) when
    # the checkpoint's key differs from the attribute's name. Kinds: "state" (a name ->
    # tensor dict, or None), "states" (a list of them), "client_states" ({client: state}),
    # "int", "float", "tensor" (kept on the CPU in float32), "object" (anything with
    # state_dict/load_state_dict: a client-state store, an optimizer, a module). A subclass
    # adds to its parents' declarations.
    checkpointed: dict[str, str | tuple[str, str]] = {}
    # True when the strategy trains clients itself (FML's two models) via local_update; an
    # instance holds uses_custom_update's answer for its model (MOON without a classifier
    # head trains as FedAvg).
    custom_local_update = False
    # False when the clients' code writes into the strategy itself (FML's personal models,
    # STEM's directions): such rounds cannot train in worker processes
    # (flnotes.engine.client_workers), where the writes would stay.
    parallel_clients = True
    # True when local_penalty adds a term to the local loss (FedProx, FedUp).
    has_penalty = False
    # True when local_gradient takes each local step's gradient its own way (FedSAM).
    has_local_gradient = False
    # True when teacher_loss adds a term from a detached teacher's outputs (FedNTD).
    has_teacher = False
    # True when batch_loss gives each client a term computed from the live model (FedGen).
    has_batch_loss = False
    # True when the method brings its own momentum (MimeLite's server state, STEM's d): the
    # config's local-SGD momentum must then be 0 (RunConfig says so; the toy sets it).
    own_momentum = False
    own_momentum_note = ""  # what that momentum is, for the message that refuses another
    # True when the method trains on composed datasets, clients of different tasks (FML).
    trains_composed_datasets = False
    # True when each client keeps a personal model of its own between rounds (FML): on
    # Flower it lives on the client's node, not in the server's strategy.
    keeps_personal_models = False
    # False when clients keep state the server reads back (control variates, duals, a
    # previous model): such a round does not split into Flower's server and client apps.
    runs_on_flower = True

    @classmethod
    def config_problems(cls, config) -> Iterator[str]:
        """One-line messages for settings that are valid alone but not together.

        RunConfig checks each setting against its declaration; a method whose settings
        constrain each other (CluSamp: no count sketch with l1) says so here.
        """
        return iter(())

    @classmethod
    def config_warnings(cls, config) -> list[str]:
        """Warnings for valid settings that will do nothing in this run (printed by the
        command line before the run starts)."""
        return []

    def __init__(self, config, global_state) -> None:
        self.config = config.resolved()
        self.global_state = clone_state(global_state)
        # for this model (MOON without a classifier head trains as FedAvg: any backend)
        self.custom_local_update = self.uses_custom_update(self.global_state)

    @staticmethod
    def adapt_model(model, config):
        """The network this method trains, made from the task's model (default: itself).

        The engine calls it each time a task builds a model (flnotes.engine.tasks), so the
        initial global state, the clients and the evaluation all use it. MOON puts a
        projection head before the classifier.
        """
        return model

    # ---- one round ------------------------------------------------------------
    def select_clients(self, round: int, sizes: list[int], clients_per_round: int,
                       generator: torch.Generator) -> list[int] | None:
        """The clients that take part in ``round`` (sorted, no repeats), or None for the
        engine's uniform sampling without replacement (the default).

        ``sizes`` holds every client's number of training samples (the importance p_i of
        a strategy that weights by data); ``generator`` is the round's seeded sampling
        stream, so a selection made from it is the same on resume.
        """
        return None

    def dispatch(self, round: int, clients: list[int]) -> list[OrderedDict[str, torch.Tensor]]:
        """The state each sampled client starts local training from (FedAvg: the global)."""
        return [self.global_state for _ in clients]

    def local_lr(self, round: int) -> float:
        """The learning rate of every local step in ``round`` (default: the config's ``lr``).

        A strategy with a schedule (FedSAM's SWA phase: a cyclical rate) returns it here;
        the engine trains the round's clients with it in place of ``config.lr``
        (:func:`flnotes.engine.backends.round_config`).
        """
        return self.config.lr

    def penalty_anchor(self, start: dict[str, torch.Tensor],
                       client: int) -> dict[str, torch.Tensor]:
        """What ``local_penalty`` measures ``client`` against: by default its start state.

        A penalty that also needs run state (FedUp: the previous global model) or the
        client's own state (a control variate, a dual variable) takes it from here, so that
        the penalty is a function of (params, anchor) and the config alone: then clients of
        several runs can train in one stack (flnotes.engine.seeds).
        """
        return start

    def local_penalty(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """Extra local loss term over trainable params (None: plain empirical loss).

        ``anchor`` is :meth:`penalty_anchor` of the client's start state; the batched
        backend leaves out its entries for buffers (BatchNorm statistics), so read only
        the entries of trainable parameters and your own extra ones.
        """
        return None

    def local_gradient(self, params: dict[str, torch.Tensor],
                       closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Leave in each parameter's ``.grad`` the gradient this local step applies.

        ``closure()`` zeroes the gradients, runs forward and backward at the parameters'
        current values and returns the batch's empirical loss; the optimizer (SGD with the
        config's momentum and weight decay) then steps from wherever the parameters are
        when this returns, so a method that moves them (SAM's ascent) must put them back.
        Returns the loss to report. Default: one closure call, plain SGD. Used only when
        ``has_local_gradient`` is True.
        """
        return closure()

    # A method whose local_gradient is "the gradient at w + e(w, g)" (SAM) may also give e
    # for a stack of K lanes at once: stacked_ascent(params, grads) -> {name: (K, ...)}, each
    # lane's offset from its own parameters and gradient (pure, no .grad); the stacked
    # backend then trains its clients (two gradient passes a step) instead of the loop.
    stacked_ascent = None
    # Why this strategy's clients train on the loop when the stack cannot train them, for
    # the one-time note (None: "has no batched training step").
    loop_reason: str | None = None

    def teacher_state(self, start: dict[str, torch.Tensor],
                      client: int) -> dict[str, torch.Tensor]:
        """The state of the teacher ``teacher_loss`` sees: by default the dispatched model."""
        return start

    def teacher_loss(self, outputs: torch.Tensor, targets: torch.Tensor,
                     teacher_outputs: torch.Tensor) -> torch.Tensor | None:
        """Extra local loss term from the teacher's outputs on the same batch (no gradient
        flows into the teacher, which runs in eval mode). Used when ``has_teacher`` is True."""
        return None

    def batch_loss(self, round: int, client: int) -> Callable | None:
        """``client``'s extra loss term for ``round``: a callable ``(model, inputs, targets,
        outputs) -> Tensor | None`` called on every local batch with the live model (its
        parameters carry gradients) and the batch's outputs, or None for no term.

        For a term that needs more than the parameters and the outputs, e.g. FedGen's
        classifier head applied to generated features. Each client gets its own callable,
        so it can hold the client's random stream (seeded from the run's seed, the round and
        the client: the same on resume) and what it counts on the way (labels seen). Used
        when ``has_batch_loss`` is True; the loop backend runs it (the stack falls back).
        """
        return None

    @classmethod
    def uses_custom_update(cls, global_state) -> bool:
        """Whether clients of a model with ``global_state`` train by ``local_update`` (the
        class's ``custom_local_update``, unless the method's update needs something the
        model lacks): known before a run, so that seeds can be stacked (the toy's races)."""
        return cls.custom_local_update

    def local_update(self, task, round: int, client: int, start,
                     generator: torch.Generator) -> ClientResult:
        """A whole custom local update of ``client`` in ``round``; used only when
        ``custom_local_update`` is True."""
        raise NotImplementedError(f"{type(self).__name__} has no custom local update")

    def local_update_batched(self, task, round: int, clients: list[int], starts: list,
                             config) -> list[ClientResult] | None:
        """The custom local update of many clients at once (vmap backend); None: no such path.

        Must give the same results as ``local_update`` client by client (float tolerance).
        """
        return None

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict[str, torch.Tensor]:
        """New global state from the clients' results (weighted mean by default)."""
        self.global_state = self.average(results)
        return self.global_state

    def average(self, results: list[ClientResult]) -> OrderedDict[str, torch.Tensor]:
        """Mean of the clients' states, weighted by sample count or uniformly."""
        if self.config.weighting == "samples":
            weights = [r.num_samples for r in results]
        else:
            weights = [1.0] * len(results)
        return weighted_mean([r.state for r in results], weights)

    # ---- extra metrics and checkpoints -----------------------------------------
    def round_metrics(self, task) -> dict[str, float]:
        """Metrics beyond the global model's accuracy (e.g. FML's personal models)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything the strategy needs to resume: the global model and each attribute named
        in ``checkpointed`` (its own and its parents'), under its checkpoint key."""
        values: dict[str, Any] = {"global_state": self.global_state}
        for attribute, (kind, key) in _checkpointed(type(self)).items():
            value = getattr(self, attribute)
            if value is not None:
                values[key] = _saved(kind, value)
        return values

    def load_state_dict(self, values: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved.

        A key a checkpoint lacks leaves the attribute as the constructor made it when that is
        None (nothing to restore yet: FedMut before its first aggregation) or a number (a
        counter an older version did not save); for anything else it is an error, not a
        silent restart from the initial value.
        """
        self.global_state = OrderedDict(values["global_state"])
        for attribute, (kind, key) in _checkpointed(type(self)).items():
            current = getattr(self, attribute)
            if key not in values or values[key] is None:
                if current is None or kind in ("int", "float"):
                    continue
                raise ValueError(f"the checkpoint has no {key!r} for {self.name}: it was "
                                 "written by another version of flnotes; start the run over")
            if kind == "object":
                if current is not None:
                    current.load_state_dict(values[key])
                continue
            setattr(self, attribute, _restored(kind, values[key]))


_KINDS = ("state", "states", "client_states", "int", "float", "tensor", "object")


def _checkpointed(cls) -> dict[str, tuple[str, str]]:
    """attribute -> (kind, checkpoint key), over the class and its parents."""
    out: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        for attribute, spec in klass.__dict__.get("checkpointed", {}).items():
            kind, key = (spec, attribute) if isinstance(spec, str) else spec
            if kind not in _KINDS:
                raise TypeError(f"{cls.__name__}.checkpointed[{attribute!r}]: kind {kind!r} is "
                                f"not one of {_KINDS}")
            out[attribute] = (kind, key)
    return out


def _saved(kind: str, value: Any) -> Any:
    """What a checkpoint stores of one attribute."""
    if kind == "states":
        return list(value)
    if kind == "client_states":
        return {int(c): s for c, s in value.items()}
    if kind == "object":
        saved = value.state_dict()
        if isinstance(value, torch.nn.Module):  # a copy: the module trains on after saving
            saved = OrderedDict((k, v.detach().clone()) for k, v in saved.items())
        return saved
    return value


def _restored(kind: str, saved: Any) -> Any:
    """An attribute's value from what a checkpoint stored (kinds as in Strategy.checkpointed)."""
    if kind == "state":
        return OrderedDict(saved)
    if kind == "states":
        return [OrderedDict(s) for s in saved]
    if kind == "client_states":
        return {int(c): OrderedDict(s) for c, s in saved.items()}
    if kind == "int":
        return int(saved)
    if kind == "float":
        return float(saved)
    if kind == "tensor":
        return saved.to("cpu", torch.float32).clone()
    return saved
