"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021): FedAvg whose clients
pull their representation towards the global model's and away from their own previous one.

The network is a base encoder, a projection head (two linear layers with a ReLU) and the
output layer; z = the projection head's output. On each local batch (Sec. 3.3, eq. 3-4):

    l_con = -log( e(z, z_glob) / (e(z, z_glob) + e(z, z_prev)) ),   e(u, v) = exp(sim(u, v) / tau)
    loss  = CE(outputs, y) + mu * mean_batch(l_con)

with sim the cosine similarity, z_glob the representation under the dispatched global model
and z_prev under the client's own local model of its last round (both fixed, eval mode).
The server is FedAvg's.

Decisions (the paper, and its authors' code, QinbinLi/MOON, where the paper is silent):

- The projection head: the model's classifier head (its last linear layer, d inputs) is
  replaced by Linear(d, d), ReLU, Linear(d, 256), and a new output layer Linear(256,
  classes) follows: the code's ``l1, l2, l3`` for every base network. So a MOON run trains
  its own architecture (:meth:`MOON.adapt_model`); FedAvg on a MOON task trains the same one,
  which is what "mu = 0 is FedAvg" compares.
- tau = 0.5, projection 256, one previous model (model_buffer_size 1): the paper's values.
  mu (``moon_mu``): 5 on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet (Sec. 4.1); None picks
  5 for cifar10 and 1 for any other data set (FedUp names none for its runs).
- The previous model: flnotes starts every client's previous model at the initial global
  model, so a client's z_prev comes from its last trained model, or from the initial
  global model if it has never been sampled; the engine's per-client store (on disk in a
  run folder) holds them. The authors' code differs for clients not yet sampled: it builds
  a separately, randomly initialised network per client (``init_nets(n_parties)``, apart
  from the global model's own ``init_nets(1)``) and its pool copies every client's network
  after each round, so such a client contrasts against its own initial network, which is
  not the initial global model. We keep one initial state per run (nothing per client to
  seed or store before a client is sampled); the two agree once a client has trained.
- Round 1: the code's pool is still empty, so the contrastive logits hold the positive pair
  alone and l_con is 0; we add no term in round 1 (FedAvg's round 1 bit for bit).
- A model without a classifier head (the 2-D toy) has no representation to contrast: MOON
  trains as FedAvg there, with FedAvg's training (stacked seeds, the batched backend), and
  says so once.
- Local training: the engine's reference loop (same batches, SGD, momentum and weight decay
  as every method); the batched backend falls back to it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory
from flnotes.engine.state import classifier_head, clone_state
from flnotes.engine.train import local_sgd
from flnotes.messages import fallback_warning

PROJECTION_DIM = 256  # the code's out_dim
HEAD = "head"  # the output layer of a MOON network


class ProjectedNet(nn.Module):
    """base encoder -> projection (Linear d-d, ReLU, Linear d-256) -> output layer."""

    def __init__(self, base: nn.Module, features: int, num_classes: int) -> None:
        super().__init__()
        self.base = base
        self.projection = nn.Sequential(nn.Linear(features, features), nn.ReLU(),
                                        nn.Linear(features, PROJECTION_DIM))
        self.head = nn.Linear(PROJECTION_DIM, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, ...) inputs -> (B, classes) logits."""
        return self.head(self.projection(self.base(x)))


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                     tau: float) -> torch.Tensor:
    """mean_b -log softmax([sim(z, z_glob), sim(z, z_prev)] / tau)[0] (eq. 3)."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1),
                          F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MOON(Strategy):
    """FedAvg with MOON's model-contrastive term on the projection head's output."""

    name = "moon"
    checkpointed = {"initial": "state", "store": ("object", "clients")}
    label = "MOON"
    runs_on_flower = False  # each client keeps its previous local model
    settings = (
        Setting("moon_mu", None, "MOON: weight mu of the model-contrastive loss", kind=float,
                minimum=0, none_means="5 on cifar10, 1 elsewhere, as its paper",
                source="MOON (Li et al. 2021) eq. 3 and Sec. 4.1"),
        Setting("moon_tau", 0.5, "MOON: temperature tau of the model-contrastive loss",
                minimum=0, open_minimum=True, source="MOON eq. 2; 0.5 its paper's value"),
    )
    default_weighting = "samples"
    custom_local_update = True  # three models per client step; the reference loop runs it

    @classmethod
    def uses_custom_update(cls, global_state) -> bool:
        """Only a model with a classifier head has a representation to contrast."""
        return classifier_head(global_state) is not None

    @staticmethod
    def adapt_model(model, config):
        """The task's model with MOON's projection head before a new output layer."""
        name = classifier_head(model.state_dict())
        if name is None:
            return model  # the toy: nothing to project (FedAvg, see __init__)
        old = model.get_submodule(name)
        model.set_submodule(name, nn.Identity())
        projected = ProjectedNet(model, old.in_features, old.out_features)
        return projected.to(device=old.weight.device, dtype=old.weight.dtype)

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        head = classifier_head(self.global_state)
        self.projected = head == HEAD and any(k.startswith("projection.")
                                              for k in self.global_state)
        if head is None:
            fallback_warning("flnotes: moon needs a model with a classifier head; this one "
                             "has none, so MOON trains as FedAvg", stacklevel=2)
        elif not self.projected:
            raise ValueError("moon: the task's model has no projection head; let run() build "
                             "the task, or build it with algorithm='moon' (build_task) so its "
                             "models get MOON's projection head")
        self.initial = clone_state(self.global_state)  # every previous model starts here
        device = next(iter(self.global_state.values())).device
        self.store = ClientStateStore(store_directory(self.config.run_dir, "moon"),
                                      self._initial_state, device=device)

    def _initial_state(self, client: int):
        """A client's previous model before its first round (a method, not a lambda: the
        strategy goes to client worker processes by pickle)."""
        return self.initial

    @property
    def mu(self) -> float:
        """moon_mu, or the paper's value for the data set (5 on CIFAR-10, 1 elsewhere)."""
        if self.config.moon_mu is not None:
            return self.config.moon_mu
        return 5.0 if self.config.dataset == "cifar10" else 1.0

    def dispatch(self, round: int, clients: list[int]):
        """The global model; the round's previous local models are read into memory."""
        if self.projected:
            self.store.hold(clients)
        return super().dispatch(round, clients)

    def _teachers(self, task) -> tuple[nn.Module, nn.Module]:
        """Two frozen copies of the working model (global and previous), built once per task."""
        if "moon-teachers" not in task.backend_cache:
            model = task.working_model()
            task.backend_cache["moon-teachers"] = tuple(
                copy.deepcopy(model).eval().requires_grad_(False) for _ in range(2))
        return task.backend_cache["moon-teachers"]

    def local_update(self, task, round: int, client: int, start, generator) -> ClientResult:
        """The engine's local SGD plus mu * l_con from round 2 on."""
        config = self.config
        model = task.working_model()
        x, y = task.client_data(client)
        active = self.projected and self.mu > 0 and round > 1 and len(y) > 0
        hooks, captured, term = [], {}, None
        if active:
            glob, prev = self._teachers(task)
            glob.load_state_dict(start)
            prev.load_state_dict(self.store.get(client))
            for key, net in (("z", model), ("z_glob", glob), ("z_prev", prev)):
                hooks.append(net.get_submodule(HEAD).register_forward_pre_hook(
                    lambda module, args, key=key: captured.__setitem__(key, args[0])))
            mu, tau = self.mu, config.moon_tau

            def term(net, inputs, targets, outputs):
                z = captured["z"]  # the live representation of this forward pass
                with torch.no_grad():
                    glob(inputs)
                    prev(inputs)
                return mu * contrastive_loss(z, captured["z_glob"], captured["z_prev"], tau)
        try:
            state, loss = local_sgd(
                model, start, x, y, epochs=config.local_epochs, batch_size=config.batch_size,
                lr=self.local_lr(round), momentum=config.momentum,
                weight_decay=config.weight_decay,
                generator=generator, loss_fn=task.loss_fn,
                batch_loss=term)
        finally:
            for hook in hooks:
                hook.remove()
        return ClientResult(client, state, len(y), loss)

    def aggregate(self, round: int, results: list[ClientResult]):
        """Each client's local model becomes its previous model; FedAvg's mean."""
        if self.projected:
            for r in results:
                if r.num_samples > 0:
                    self.store.put(r.client, r.state, round)
            self.store.release()
        return super().aggregate(round, results)

    # ---- checkpoints ---------------------------------------------------------------
