"""FedGMT (Li, Liu, Cui, Hu, Li, ICML 2025, "One Arrow, Two Hawks: Sharpness-aware
Minimization for Federated Learning via Global Model Trajectory"): the global model's
sharpness measured along its own trajectory, at the cost of one extra forward pass and no
extra backward pass, with ADMM dual variables against client drift.

The idea: SAM's sharpness L(w + e) - L(w) is approximated, to first order, by the loss gap
between the global model and an exponential moving average e_t of the global models (the
trajectory), so each client pulls its predictions towards the EMA model's by a KL term.
Round t, global model w^t, clients m in N_t with K local steps:

    e_t       = alpha e_(t-1) + (1 - alpha) w^t                     (EMA of the global models)
    L_m(w)    = CE(f(w), y) + gamma tau^2 KL(softmax(f(e_t)/tau) || softmax(f(w)/tau))
    w_(k+1)   = w_k - eta (grad L_m(w_k) + d_m / beta)              (d_m: m's dual state)
    d_m       <- d_m + (w_(m,K) - w^t)                              (after local training)
    w^(t+1)   = mean_m w_(m,K) + (1/M) sum over all M clients of d_m

In the paper's notation the dual u_m = -d_m / beta, so the step is w - eta (g - u_m) and
u_m <- u_m - (w_K - w^t) / beta (the ADMM update), and the server adds -beta u_m.

Where this comes from. The paper's text was not reachable from this workplace beyond its
abstract (PMLR 267:35317) and a third-party summary of its update rule
(junaidaliop.github.io/zij/math/fedgmt); the rule above is read from the authors' code,
harrylee999/FL-SAM at 2c16149: ``system/flcore/clients/clientgmt.py`` (the local loss and
step), ``system/flcore/servers/servergmt.py`` (duals, aggregation, EMA), ``system/main.py``
and the README's FedGMT command (settings). Check against the paper before citing.

Decisions (default first):

1. The dual term in the server (``gmt_dual_mean``): the code adds the mean of *every*
   client's d_m (the whole table, ``torch.mean(self.dual_variable_list, dim=0)``; clients
   not sampled keep their old d_m), as FedDyn's server does; the third-party summary writes
   the mean over the round's clients, 1/|N_t| sum (w_(m,K) - beta u_m). Default: "all" (the
   code); "active" gives the summary's reading, whose mean is uniform: pair it with
   ``weighting="uniform"`` (the models' mean follows ``weighting``, the duals' is uniform).
2. The mean of the local models: by client size (the code's ``aggregate_parameters`` with
   ``uploaded_weights`` = sample shares; ``weighting`` changes it).
3. The EMA starts at the initial global model (the code deep-copies the same initial model)
   and is updated after each aggregation with the new global model, dual term included.
   It averages trainable tensors. On a model with BatchNorm (flnotes' resnet18, resnet20,
   vgg16) the teacher runs in eval mode with the dispatched model's running statistics,
   which were not computed for the EMA's weights; the code's EMA model stays in train mode
   and normalises each batch by its own statistics. The authors' models (a CNN without
   normalisation, a GroupNorm ResNet) and flnotes' LeNet do not tell the two apart.
4. The KL term is the code's ``KLDivLoss(reduction="batchmean")`` of the tempered log
   softmax against the EMA's tempered softmax, times gamma tau^2 (Hinton's scaling); the
   teacher runs in eval mode without gradients. A model with one output (the toy's per-row
   loss) has no distribution to match: the term is 0 there.
5. The linear dual term is differentiated with the loss, so momentum and weight decay act on
   the sum (the code's SGD steps on ``loss - <w, -d/beta>``). No quadratic proximal term
   (FedDyn has one; FedGMT's code and the summary have none).
6. Settings, the README's FedGMT command on CIFAR-10: gamma 1, alpha 0.95, tau 3, beta 10.
   The code's run settings (SGD momentum 0.9, weight decay 1e-5, lr 0.01 decaying by 0.998 a
   round, random crop and flip) belong to the preset; flnotes has no per-round decay or
   augmentation.
7. ``gmt_admm`` false drops the dual term from the clients and the server: with gamma 0
   too, FedGMT is FedAvg bit for bit.
8. Backends: the teacher model runs beside the student, which the stacked backend does not
   batch; clients train on the loop (said once). Not on Flower: the duals and the EMA are
   server state.

Server state kept in checkpoints: the EMA e_t, the mean dual D and every client's d_m
(a client-state store, on disk for many clients).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.scaffold import trainable_layer_names, zeros_like_layers
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory

DUAL = "dual:"  # anchor names of the client's d_m (a colon never appears in a module path)


def trajectory_loss(outputs: torch.Tensor, ema_outputs: torch.Tensor, gamma: float,
                    tau: float) -> torch.Tensor:
    """gamma tau^2 KL(softmax(f(e)/tau) || softmax(f(w)/tau)), the batch's mean."""
    if outputs.dim() != 2 or outputs.shape[1] < 2:  # no class distribution (the toy's (B, 1))
        return outputs.sum() * 0.0
    student = F.log_softmax(outputs / tau, dim=1)
    teacher = F.softmax(ema_outputs.detach() / tau, dim=1)
    return gamma * tau * tau * F.kl_div(student, teacher, reduction="batchmean")


def dual_penalty(params, anchor, beta: float) -> torch.Tensor:
    """<w, d_m> / beta over the trainable tensors (the code's ``loss -= <w, -d/beta>``)."""
    return sum((p * anchor[DUAL + n]).sum() for n, p in params.items()) / beta


class FedGMT(Strategy):
    """Clients distil from the EMA of the global models and carry ADMM duals."""

    name = "fedgmt"
    label = "FedGMT"
    checkpointed = {"ema": "state", "dual_mean": "state", "store": ("object", "clients")}
    runs_on_flower = False  # the duals and the EMA are server state
    settings = (
        Setting("gmt_alpha", 0.95, "FedGMT: EMA coefficient alpha of the global-model "
                "trajectory e = alpha e + (1 - alpha) w", minimum=0, maximum=1,
                open_maximum=True, source="FedGMT's code (harrylee999/FL-SAM): README, -al 0.95"),
        Setting("gmt_gamma", 1.0, "FedGMT: weight gamma of the trajectory (KL) loss "
                "(0: no distillation)", minimum=0, source="FedGMT's code: README, -ga 1.0"),
        Setting("gmt_tau", 3.0, "FedGMT: temperature tau of the trajectory loss",
                minimum=0, open_minimum=True, source="FedGMT's code: README, -tau 3.0"),
        Setting("gmt_beta", 10.0, "FedGMT: ADMM penalty beta (the dual enters the step "
                "divided by beta)", minimum=0, open_minimum=True,
                source="FedGMT's code: README, -be 10"),
        Setting("gmt_admm", True, "FedGMT: the ADMM dual variables (false: none; with "
                "gmt_gamma 0, FedAvg)", source="FedGMT's code (clientgmt.py, servergmt.py)"),
        Setting("gmt_dual_mean", "all", "FedGMT: whose duals the server adds: every "
                "client's (the code) or the round's (the summary of the paper)",
                choices=("all", "active"), source="servergmt.py; the zij summary of the paper"),
    )
    default_weighting = "samples"
    loop_reason = "distils from a teacher model, which the stacked step does not batch"

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.layers = trainable_layer_names(self.global_state)
        self.ema = OrderedDict((n, self.global_state[n].clone()) for n in self.layers)
        self.dual_mean = zeros_like_layers(self.global_state, self.layers)  # D
        device = next(iter(self.global_state.values())).device
        self.store = ClientStateStore(store_directory(self.config.run_dir, "fedgmt"),
                                      self._new_dual, device=device)

    def _new_dual(self, client: int) -> OrderedDict[str, torch.Tensor]:
        return zeros_like_layers(self.global_state, self.layers)

    @property
    def has_penalty(self) -> bool:
        return self.config.gmt_admm

    @property
    def has_teacher(self) -> bool:  # gamma = 0: no distillation, the teacher is not run
        return self.config.gmt_gamma > 0

    def dispatch(self, round, clients):
        """w^t; the round's clients' d_m are read into memory."""
        if self.config.gmt_admm:
            self.store.hold(clients)
        return super().dispatch(round, clients)

    def teacher_state(self, start, client):
        """The EMA e_t (BatchNorm statistics from the dispatched model)."""
        return OrderedDict((n, self.ema.get(n, t)) for n, t in start.items())

    def teacher_loss(self, outputs, targets, teacher_outputs):
        """gamma tau^2 KL(EMA || local) on the tempered softmax."""
        return trajectory_loss(outputs, teacher_outputs, self.config.gmt_gamma,
                               self.config.gmt_tau)

    def penalty_anchor(self, start, client):
        """The start and, under ``dual:`` names, the client's d_m."""
        d_m = self.store.get(client)
        return {**start, **{DUAL + n: d_m[n] for n in self.layers}}

    def local_penalty(self, params, anchor):
        """<w, d_m> / beta."""
        return dual_penalty(params, anchor, self.config.gmt_beta)

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict:
        """d_m, then w^(t+1) = mean + dual term, then the EMA."""
        start = self.global_state
        mean = self.average(results)
        if self.config.gmt_admm:
            moved = OrderedDict((n, torch.zeros_like(d)) for n, d in self.dual_mean.items())
            new_duals = []
            for r in results:
                d_m = self.store.get(r.client)
                d_m = OrderedDict((n, d_m[n] + r.state[n] - start[n]) for n in self.layers)
                self.store.put(r.client, d_m, round)
                new_duals.append(d_m)
                for n in self.layers:
                    moved[n] += r.state[n] - start[n]
            self.store.release()
            m = self.config.num_clients  # D = (1/M) sum over all clients of d_m
            self.dual_mean = OrderedDict((n, d + moved[n] / m) for n, d in self.dual_mean.items())
            if self.config.gmt_dual_mean == "all":
                added = self.dual_mean
            else:
                added = OrderedDict((n, sum(d[n] for d in new_duals) / len(new_duals))
                                    for n in self.layers)
            for n in self.layers:
                mean[n] = mean[n] + added[n]
        a = self.config.gmt_alpha
        self.ema = OrderedDict((n, a * e + (1 - a) * mean[n]) for n, e in self.ema.items())
        self.global_state = mean
        return mean
