"""FedMR (Hu et al., KDD 2024): layer-wise recombination of local models instead of averaging.

The server keeps the K local models of the last round. Each float layer (one ``state_dict``
tensor) is shuffled across the K models with its own random permutation, so every layer of
every local model is used by exactly one recombined model (FedMR Sec. 4.2.2); recombined
model i starts local training on the i-th sampled client of the next round (Alg. 1 l.5).

Decisions where the paper leaves room:

- Two-stage training (Sec. 4.3): rounds ``<= stage1_rounds`` are uniform FedAvg. The first
  recombination round, ``stage1_rounds + 1``, recombines the local models trained in round
  ``stage1_rounds``; with ``stage1_rounds = 0`` round 1 still dispatches the initial model
  to every client, which is Alg. 1 l.1 (K copies of the initial model).
- Assignment: ``sim.sample_clients`` returns the round's clients sorted, and recombined model
  i goes to the i-th of them. The paper pairs the i-th list entry with the i-th randomly
  selected client; because every layer's permutation is uniformly random, which client gets
  which recombined model is uniformly random either way.
- FedMR-p (Sec. 5.4.2): the float layers, in state order, are cut into p consecutive segments
  (layer j of L, counted from 0, is in segment floor(j * p / L), so sizes differ by at most
  one); all layers of a segment share one permutation. p = 1 moves whole models; p = 0 (the
  default) is per-layer FedMR. p must not exceed the number of float layers.
- BatchNorm running statistics are float layers, so they are shuffled like any other layer.
  Integer buffers (``num_batches_tracked``) are copied from the first local model, as for
  every method, and do not count as layers for the segments.
- The reported global model (evaluated each round) is the mean of the round's local models
  (Sec. 5.3, Fig. 9: "an aggregated version of all the local models"); uniform by default
  (App. A.1: "all the models have the same weight"). Clients never train from it in stage 2.
- ``model_similarity`` (Sec. 5.4, Fig. 6: "the average cosine similarity between all the
  intermediate models") is recorded every evaluated round: the mean over pairs of the
  round's K local models of the cosine between their weight vectors. The paper does not say
  which tensors make up the vector; here every float layer except BatchNorm's running
  statistics, which are not weights (their variances would push every pair towards 1).

Secure recombination (App. B, ``secure_exchanges`` > 0): before the upload, the round's
clients swap layers among themselves so that the server receives recombined models and
cannot tell whose layers it holds. One exchange, per float layer: each client sends its layer,
with probability 1/2 (the appendix says "a part of its layers"), to one other client drawn
uniformly; a receiver buffers what it gets beside its own layer if it kept it, and returns
one uniformly drawn buffered layer to each sender; a client ends with its returned layer or
what is left in its buffer. Every layer thus ends in exactly one model: an exchange is a
per-layer permutation, so the mean the server reports is the same (to float rounding) and the
next dispatch is still a recombination of the same layers. The appendix's public-key
encryption of the exchanged layers protects them from the other clients and is not
simulated. Integer buffers stay with their client.

Indep (Sec. 3 and 5.4, Figs. 1 and 5), registered as ``indep``, is the paper's reference
without recombination: the server shuffles the received local models whole and dispatches
them without aggregation, i.e. FedMR-p with p = 1 from round 1. Its ``accuracy`` is that of
the mean of its local models, the paper's "IndepAggr"; ``local_accuracy_mean`` and
``local_accuracy_max`` are those of the local models themselves (Fig. 5 plots four of them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import StateLike, float_layer_names
from flnotes.rng import torch_generator


def layer_segments(num_layers: int, segments: int) -> list[int]:
    """Segment index of each of ``num_layers`` layers (0 segments: one per layer)."""
    if segments == 0:
        return list(range(num_layers))
    if not 1 <= segments <= num_layers:
        raise ValueError(
            f"FedMR segments={segments} is invalid for a model with {num_layers} float "
            f"layers: use 0 (per layer) or 1..{num_layers}"
        )
    # Consecutive groups whose sizes differ by at most one (FedMR Sec. 5.4.2).
    return [j * segments // num_layers for j in range(num_layers)]


def recombination_sources(
    num_models: int, num_layers: int, segments: int, generator: torch.Generator
) -> torch.Tensor:
    """(num_layers, num_models) tensor: row l says which local model feeds each new model."""
    segment_of = layer_segments(num_layers, segments)
    num_segments = max(segment_of) + 1 if segment_of else 0
    # One uniformly random permutation per segment, drawn in segment order.
    perms = [torch.randperm(num_models, generator=generator) for _ in range(num_segments)]
    if not perms:
        return torch.empty(0, num_models, dtype=torch.long)
    return torch.stack([perms[s] for s in segment_of])


def recombine(
    states: Sequence[StateLike], segments: int, generator: torch.Generator
) -> list[OrderedDict[str, torch.Tensor]]:
    """Shuffle every float layer (or segment of layers) across the states; each used once."""
    if not states:
        raise ValueError("recombine needs at least one state")
    names = float_layer_names(states[0])
    sources = recombination_sources(len(states), len(names), segments, generator)
    source_of = {name: sources[j].tolist() for j, name in enumerate(names)}
    models: list[OrderedDict[str, torch.Tensor]] = [OrderedDict() for _ in states]
    for name, first in states[0].items():
        for i, model in enumerate(models):
            # Integer buffers are never shuffled: they come from the first state.
            model[name] = states[source_of[name][i]][name] if name in source_of else first
    return models


RUNNING_STATS = ("running_mean", "running_var")


def secure_exchange_sources(num_clients: int, generator: torch.Generator) -> list[int]:
    """One layer's secure exchange (App. B stages 1-4): ``sources[i]`` is the client whose
    layer client i holds afterwards; a permutation of range(num_clients)."""
    if num_clients < 2:
        return list(range(num_clients))
    draw = lambda n: int(torch.randint(n, (), generator=generator))  # noqa: E731
    # Stage 1: each client sends its layer, with probability 1/2, to one other client.
    target = {}
    for i in range(num_clients):
        if float(torch.rand((), generator=generator)) < 0.5:
            other = draw(num_clients - 1)
            target[i] = other + (other >= i)  # uniform over the other clients
    # Stage 2: a receiver buffers what it gets, beside its own layer if it kept it.
    buffers = {j: ([] if j in target else [j]) for j in range(num_clients)}
    senders = {j: [] for j in range(num_clients)}
    for i, j in target.items():
        buffers[j].append(i)
        senders[j].append(i)
    # Stage 3: each receiver returns one uniformly drawn buffered layer to each sender.
    returned = {}
    for j in range(num_clients):
        for i in senders[j]:
            returned[i] = buffers[j].pop(draw(len(buffers[j])))
    # Stage 4: a sender holds what came back; any other client what is left in its buffer.
    return [returned[i] if i in target else buffers[i][0] for i in range(num_clients)]


def secure_exchange(states: Sequence[StateLike], exchanges: int,
                    generator: torch.Generator) -> list[OrderedDict[str, torch.Tensor]]:
    """The clients' models after ``exchanges`` secure exchanges of their float layers."""
    models = [OrderedDict(s) for s in states]
    for _ in range(exchanges):
        for name in float_layer_names(models[0]):
            sources = secure_exchange_sources(len(models), generator)
            layers = [m[name] for m in models]
            for i, model in enumerate(models):
                model[name] = layers[sources[i]]
    return models


def mean_pairwise_cosine(states: Sequence[StateLike]) -> float:
    """Mean cosine similarity over all pairs of states' weight vectors (FedMR Fig. 6).

    A state's vector is its float layers, BatchNorm running statistics left out, flattened
    and concatenated in state order; NaN for fewer than two states.
    """
    if len(states) < 2:
        return float("nan")
    names = [n for n in float_layer_names(states[0]) if not n.endswith(RUNNING_STATS)]
    vectors = torch.stack([torch.cat([s[n].reshape(-1).double() for n in names])
                           for s in states])
    unit = vectors / vectors.norm(dim=1, keepdim=True)
    gram = unit @ unit.T
    k = len(states)
    return float((gram.sum() - gram.diagonal().sum()) / (k * (k - 1)))


class FedMR(Strategy):
    """Federated Model Recombination, with two-stage training and the FedMR-p variant."""

    name = "fedmr"
    checkpointed = {"local_states": "states"}
    label = "FedMR"
    settings = (
        Setting("stage1_rounds", 0, "FedMR: rounds of plain FedAvg before recombination starts",
                source="FedMR Sec. 3.3 (two-stage training)", minimum=0),
        Setting("segments", 0, "FedMR-p: segments recombined as units (0: every layer is a "
                "segment)", source="FedMR Sec. 4.4 (FedMR-p)", minimum=0),
        Setting("secure_exchanges", 0, "FedMR: secure layer exchanges among the round's "
                "clients before upload (App. B), so the server cannot tell whose layers it "
                "holds; 0: off", source="FedMR App. B", minimum=0),
    )

    @classmethod
    def config_warnings(cls, config) -> list[str]:
        """stage1_rounds >= rounds: a FedMR run that never recombines."""
        if "stage1_rounds" in cls.settings_not_read or config.stage1_rounds < config.rounds:
            return []
        return [f"warning: FedMR's stage1_rounds={config.stage1_rounds} is not below "
                f"rounds={config.rounds}: every round of this run is plain FedAvg, with "
                "no recombination (lower --stage1-rounds or raise --rounds)"]
    default_weighting = "uniform"

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        # Fail at construction, not mid-run, when segments does not fit the model.
        layer_segments(len(float_layer_names(self.global_state)), self.config.segments)
        self.local_states: list[OrderedDict[str, torch.Tensor]] = []

    def recombining(self, round: int) -> bool:
        """True when this round dispatches recombined models (stage 2 with kept models)."""
        return round > self.config.stage1_rounds and bool(self.local_states)

    def dispatch(self, round: int, clients: list[int]) -> list[OrderedDict[str, torch.Tensor]]:
        """Stage 1: the global model to all; stage 2: last round's models, recombined."""
        if not self.recombining(round):
            return [self.global_state for _ in clients]
        if len(clients) != len(self.local_states):
            raise ValueError(
                f"FedMR keeps {len(self.local_states)} local models but round {round} "
                f"samples {len(clients)} clients; clients_per_round must stay fixed"
            )
        generator = torch_generator(self.config.seed, round, "recombine")
        return recombine(self.local_states, self.config.segments, generator)

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict[str, torch.Tensor]:
        """Keep the K local models for the next dispatch; report their mean as the global."""
        # The engine hands over fresh tensors and never changes them in place, so keeping
        # references (not copies) is safe and saves K model copies.
        if self.config.secure_exchanges:  # App. B: the clients swap layers before upload
            generator = torch_generator(self.config.seed, round, "secure-exchange")
            exchanged = secure_exchange([r.state for r in results],
                                        self.config.secure_exchanges, generator)
            results = [ClientResult(r.client, s, r.num_samples, r.train_loss, r.extra)
                       for r, s in zip(results, exchanged, strict=True)]
        self.local_states = [OrderedDict(r.state) for r in results]
        self.global_state = self.average(results)
        return self.global_state

    def round_metrics(self, task) -> dict[str, float]:
        """The round's mean pairwise cosine similarity of the local models (Fig. 6)."""
        return {"model_similarity": mean_pairwise_cosine(self.local_states)}



class Indep(FedMR):
    """Independent training (FedMR Sec. 3): local models shuffled whole, never aggregated.

    The seed code (Algorithm/Training_FedIndenp.py) keeps model i in slot i and gives slot i
    to the i-th of the round's randomly drawn clients; flnotes draws a random permutation of
    whole models over the sorted clients. Either way each model meets a uniformly random
    client each round, so the two are the same process in distribution.
    """

    name = "indep"
    label = "Indep"
    # Whole models, from round 1: Indep sets these itself (below), whatever was given.
    settings_not_read = ("stage1_rounds", "segments")

    def __init__(self, config, global_state) -> None:
        # Whole models move (one segment) from the first round on; the mean of the local
        # models is only reported ("IndepAggr"), never trained from.
        super().__init__(config.replace(segments=1, stage1_rounds=0), global_state)

    def round_metrics(self, task) -> dict[str, float]:
        """Fig. 5: the local models' own test accuracy beside the IndepAggr one."""
        metrics = super().round_metrics(task)
        model = task.working_model()
        accuracies = []
        for state in self.local_states:
            model.load_state_dict(state)
            accuracies.append(task.evaluate(model, self.config.eval_batch_size)["accuracy"])
        model.load_state_dict(self.global_state)  # the engine evaluated this one before
        metrics.update(local_accuracy_mean=sum(accuracies) / len(accuracies),
                       local_accuracy_max=max(accuracies))
        return metrics
