"""FedGen (Zhu, Hong, Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021): FedAvg whose server learns a generator of classifier-input features
from the clients' classifier heads, and whose clients regularise with its features.

A model is a feature extractor and a classifier head h (its last linear layer). The
generator G_w(z | y) maps noise eps and a label y to a feature z of h's input size. Every
round (Alg. 1 of the paper; the authors' serverpFedGen.train):

- clients train from the global model; from round 2 on each local step adds

      alpha_t * (B_g / B) * mean_{y~ ~ U(labels)} CE(h(G(y~)), y~)        (eq. 8, teacher)
    + beta_t  * KL( softmax(h(G(y_b))) || softmax(f(x_b)) )               (eq. 8, latent)

  with B_g = ``fedgen_batch`` generated samples per step, B the batch size, y~ drawn
  uniformly from all labels, (x_b, y_b) the real batch, the target softmax(h(G(y_b)))
  held fixed, and alpha_t = max(1e-4, alpha 0.98^(t-1)), likewise beta_t (the code's decay);
- the server, before averaging, trains G for ``fedgen_steps`` Adam steps to make the
  sampled clients' heads agree with the label it was asked for (eq. 4-5):

      min_w  sum_k mean_y [ w_k(y) CE(h_k(G(y)), y) ]  +  diversity(eps, G(y))

  where w_k(y) is client k's share of the round's samples of label y, labels y drawn
  uniformly from those some client saw, and diversity(eps, z) = exp(-mean_{i,j}
  ||eps_i - eps_j||^2_mean * |z_i - z_j|_mean) keeps different noise on different
  features; then the clients' models are averaged as FedAvg does.

Decisions where the paper leaves room (the authors' code, zhuangdizhu/FedGen):

- G: Linear(noise + classes, hidden), BatchNorm1d, ReLU, Linear(hidden, feature size);
  hidden 512 with 64 noise numbers for 3-channel images (the code's CIFAR generator), 256
  with 32 otherwise (its MNIST/EMNIST one). The head is the model's last linear layer
  (every classifier in the registry ends in one); the feature size is its input size.
- Noise eps ~ N(0, I) as the paper states; the code draws torch.rand (uniform on [0, 1))
  under a comment that says Gaussian.
- Values: the code's MNIST/EMNIST run settings (it ships none for CIFAR): Adam lr 3e-4,
  weight decay 1e-2, lr x 0.98 per round, 50 generator steps per round (ensemble_epochs
  50 = 10 x 5 teacher iterations) of the clients' batch size; alpha = beta = 10 (its
  MNIST values), B_g = 32; ensemble_alpha = eta = 1, beta = 0 (no adversarial student term).
- The server's teacher loss has two readings, and flnotes takes the first by default
  (``fedgen_teacher_weighting``: ``per-sample`` or ``mean-product``):
  (a) per sample, the paper's eq. 4: mean_i [ w_k(y_i) CE(h_k(G(y_i)), y_i) ], each
      generated sample's cross-entropy weighted by its own label's share;
  (b) the product of means, what the authors' code (serverpFedGen.train_generator) and
      the seed code compute: torch.mean(CE * w) with CE of shape (B,) (NLLLoss with
      reduce=False) and w of shape (B, 1) broadcasts to a (B, B) table whose mean is
      mean_i CE_i x mean_j w_k(y_j), so a sample's weight is not tied to its label.
  The two agree when w_k(y) is the same for every label drawn (e.g. one client, or
  clients with equal label shares) and differ otherwise.
- Label shares w_k(y): the code counts the labels each client saw in its local steps,
  starting every count at 1; so do we (the counts of one round). A label is drawn for G's
  training when some client saw it more than once (the code's MIN_SAMPLES_PER_LABEL).
- G trains in train mode on the server (BatchNorm on the batch) and serves the clients in
  eval mode (its running statistics), as in the code; clients never update G.
- The regulariser starts in round 2 (the code's glob_iter > 0): round 1 has no generator
  trained yet. With alpha = beta = 0 no term is added at all: FedAvg bit for bit.
- A model without a classifier head (the 2-D toy, two numbers) has nothing to generate
  for: FedGen trains as FedAvg there, and says so once.
- The seed code: the seed papers' FedGen baseline (the FedMR authors' repository, read side
  by side; line numbers of that repository) differs from the authors' FedGen code and from
  the defaults above, and each of its choices is a setting (the ``*-official`` presets set
  them all):
  alpha = beta = 0.2 on CIFAR-10 (utils/model_config.py l.81-82), never decayed
  (``fedgen_decay=1``); noise uniform on [0, 1) with 100 numbers (models/generator.py l.72,
  CNN_GENERATORCONFIGS: ``fedgen_noise="uniform"``, ``fedgen_noise_dim=100``); a new Adam
  every round at a constant learning rate (Algorithm/Training_FedGen.py l.147:
  ``fedgen_fresh_optimizer=True``); 128 generated samples per server step and per client
  step, its --bs "test batch size" (l.157 and models/Update.py l.397:
  ``fedgen_server_batch=128``, ``fedgen_batch=128``) with gen_ratio = bs / bs = 1
  (models/Update.py l.407: ``fedgen_ratio_scaling=False``); label shares from each client's
  whole data, not from its steps (read_user_data, l.41: ``fedgen_label_counts="data"``); the
  teacher loss's broadcast (l.176-178: ``fedgen_teacher_weighting="mean-product"``).
- Random streams: the server's from (seed, round), each client's from (seed, round,
  client), so a resumed run repeats the uninterrupted one; G, its Adam state and learning
  rate are in the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import classifier_head as head_name
from flnotes.messages import fallback_warning
from flnotes.rng import seeded_cpu_rng, torch_generator

ADAM_WEIGHT_DECAY = 1e-2  # the code's RUNCONFIGS weight_decay for G's Adam
LR_DECAY = 0.98  # G's learning rate and alpha_t, beta_t decay per round (the code's 0.98)
MIN_WEIGHT = 1e-4  # alpha_t, beta_t never fall below this (the code's exp_lr_scheduler floor)
MIN_SAMPLES_PER_LABEL = 1  # a label trains G when some client saw it more often than this


def head_logits(state, name: str, features: torch.Tensor) -> torch.Tensor:
    """A state's classifier head applied to features: features @ W^T + b."""
    return F.linear(features, state[f"{name}.weight"], state.get(f"{name}.bias"))


class FeatureGenerator(nn.Module):
    """G(z | y): [eps, one-hot y] -> Linear -> BatchNorm1d -> ReLU -> Linear -> feature."""

    def __init__(self, num_classes: int, feature_dim: int, noise_dim: int, hidden: int) -> None:
        super().__init__()
        self.num_classes, self.noise_dim = num_classes, noise_dim
        self.hidden = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden),
                                    nn.BatchNorm1d(hidden), nn.ReLU())
        self.out = nn.Linear(hidden, feature_dim)

    def forward(self, labels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """(B,) labels and (B, noise_dim) noise -> (B, feature_dim) features."""
        onehot = F.one_hot(labels, self.num_classes).to(noise.dtype)
        return self.out(self.hidden(torch.cat([noise, onehot], dim=1)))


def teacher_loss(logits: torch.Tensor, labels: torch.Tensor, shares: torch.Tensor,
                 weighting: str) -> torch.Tensor:
    """One client head's term of the server's teacher loss on generated features.

    ``per-sample`` (eq. 4): mean_i w(y_i) CE_i. ``mean-product``: the authors' and the seed
    code's ``torch.mean(CE * w)`` with CE of shape (B,) and w of shape (B, 1), a (B, B)
    broadcast whose mean is mean_i CE_i x mean_j w(y_j).
    """
    ce = F.cross_entropy(logits, labels, reduction="none")
    if weighting == "per-sample":
        return (ce * shares).mean()
    return ce.mean() * shares.mean()


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """exp(-mean_{i,j} d2(eps_i, eps_j) d1(z_i, z_j)); d2 mean squared, d1 mean absolute."""
    noise_dist = (noise[:, None, :] - noise[None, :, :]).pow(2).mean(dim=2)
    feature_dist = (features[:, None, :] - features[None, :, :]).abs().mean(dim=2)
    return torch.exp(-(noise_dist * feature_dist).mean())


class FedGen(Strategy):
    """FedAvg with a server-trained feature generator that regularises the clients' heads."""

    name = "fedgen"
    # batch_loss records each client's label counts on the strategy (self.label_counts): its
    # clients train in the loop
    parallel_clients = False
    checkpointed = {"generator": "object", "optimizer": ("object", "generator_optimizer")}
    label = "FedGen"
    runs_on_flower = False  # the server trains a generator from the clients' heads
    settings = (
        Setting("fedgen_alpha", 10.0, "FedGen: weight of the cross-entropy on generated "
                "features (0: off)", minimum=0,
                source="FedGen (Zhu et al. 2021) eq. 8; the authors' MNIST/EMNIST config"),
        Setting("fedgen_beta", 10.0, "FedGen: weight of the KL to the head's output on "
                "generated features (0: off)", minimum=0,
                source="FedGen eq. 8; the authors' MNIST/EMNIST config"),
        Setting("fedgen_lr", 3e-4, "FedGen: Adam learning rate of the server's feature "
                "generator", minimum=0, open_minimum=True, source="the authors' code"),
        Setting("fedgen_steps", 50, "FedGen: generator training steps on the server per round",
                minimum=0, source="the authors' code (10 x 5)"),
        Setting("fedgen_batch", 32, "FedGen: generated samples per local step", minimum=1,
                source="the authors' code's gen_batch_size"),
        # The seed papers' FedGen (the FedMR authors' repository) chose otherwise; each of
        # these settings reaches its choice (module docstring, "seed code").
        Setting("fedgen_decay", LR_DECAY, "FedGen: per-round decay of alpha_t, beta_t and the "
                "generator's learning rate (1: constant)", minimum=0, maximum=1,
                open_minimum=True, source="the authors' code's 0.98; seed code: constant (1)"),
        Setting("fedgen_noise", "gaussian", "FedGen: the generator's noise, N(0, I) or "
                "uniform on [0, 1)", choices=("gaussian", "uniform"),
                source="FedGen Sec. 3.2 (Gaussian); both codes draw torch.rand (uniform)"),
        Setting("fedgen_noise_dim", 0, "FedGen: noise numbers per generated sample (0: 64 "
                "for colour images, 32 otherwise)", minimum=0,
                source="the authors' code's CIFAR/MNIST generators; seed code 100"),
        Setting("fedgen_fresh_optimizer", False, "FedGen: a new Adam for the generator every "
                "round (its moments and learning rate start over)",
                source="seed code Algorithm/Training_FedGen.py l.147"),
        Setting("fedgen_server_batch", 0, "FedGen: generated samples per generator step on "
                "the server (0: the clients' batch size)", minimum=0,
                source="the authors' code (batch_size); seed code 128 (its --bs)"),
        Setting("fedgen_ratio_scaling", True, "FedGen: scale the clients' teacher term by "
                "generated / real batch size (false: by 1)",
                source="the authors' code's gen_ratio; seed code models/Update.py l.407 (1)"),
        Setting("fedgen_label_counts", "steps", "FedGen: each client's label shares w_k(y) "
                "from the labels of its local steps (counts from 1) or its whole data",
                choices=("steps", "data"),
                source="the authors' code (steps); seed code read_user_data (data)"),
        Setting("fedgen_teacher_weighting", "per-sample", "FedGen: the server's teacher loss, "
                "each sample's CE times its label's share (eq. 4) or mean CE times mean share",
                choices=("per-sample", "mean-product"),
                source="FedGen eq. 4; the authors' and seed code's (B,)*(B,1) broadcast"),
    )
    default_weighting = "samples"

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.head = head_name(self.global_state)
        self.generator: FeatureGenerator | None = None
        self.optimizer: torch.optim.Adam | None = None
        self.label_counts: dict[int, torch.Tensor] = {}  # this round's, per client
        self.last_losses: dict[str, float] = {}
        if self.head is None:
            fallback_warning("flnotes: fedgen needs a model that ends in a linear "
                             "classifier head; this one has none, so FedGen trains as FedAvg",
                             stacklevel=2)
            return
        weight = self.global_state[f"{self.head}.weight"]
        self.num_classes, feature_dim = weight.shape
        wide = self._image_channels() == 3
        noise, hidden = (64, 512) if wide else (32, 256)
        noise = self.config.fedgen_noise_dim or noise
        with seeded_cpu_rng(self.config.seed, "fedgen-init"):
            generator = FeatureGenerator(self.num_classes, feature_dim, noise, hidden)
        self.generator = generator.to(device=weight.device, dtype=weight.dtype)
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=self.config.fedgen_lr,
                                          weight_decay=ADAM_WEIGHT_DECAY)

    def _image_channels(self) -> int | None:
        """The input channels of the first convolution, if the model has one."""
        for value in self.global_state.values():
            if value.dim() == 4:
                return int(value.shape[1])
        return None

    # ---- clients -----------------------------------------------------------------
    @property
    def has_batch_loss(self) -> bool:
        return self.generator is not None

    def weights_at(self, round: int) -> tuple[float, float]:
        """alpha_t and beta_t of a round (0 before round 2: no generator trained yet)."""
        if round < 2:
            return 0.0, 0.0
        decay = self.config.fedgen_decay ** (round - 1)
        return tuple(0.0 if w == 0 else max(MIN_WEIGHT, w * decay)  # type: ignore[return-value]
                     for w in (self.config.fedgen_alpha, self.config.fedgen_beta))

    def batch_loss(self, round: int, client: int) -> Callable:
        """Count the client's labels; from round 2, the generated-feature terms of eq. 8."""
        stream = torch_generator(self.config.seed, "fedgen", round, client)
        alpha, beta = self.weights_at(round)
        # The code starts every count at 1; kept on the batches' device (no host sync a step).
        # "data": the seed code's counts of the client's whole data, which every epoch's
        # steps see once each (divided by the epochs in label_weights).
        device = self.generator.out.weight.device
        start = torch.ones if self.config.fedgen_label_counts == "steps" else torch.zeros
        counts = start(self.num_classes, dtype=torch.float64, device=device)
        self.label_counts[client] = counts
        generator = self.generator

        def term(model, inputs, targets, outputs):
            counts.add_(torch.bincount(targets, minlength=self.num_classes))
            if alpha == 0 and beta == 0:
                return None
            head = model.get_submodule(self.head)
            generator.eval()
            total = None
            if beta > 0:  # the latent term: the batch's own labels through G and the head
                with torch.no_grad():
                    features = generator(targets, self._noise(len(targets), stream, outputs))
                    target_p = F.softmax(head(features), dim=1)
                total = beta * F.kl_div(F.log_softmax(outputs, dim=1), target_p,
                                        reduction="batchmean")
            if alpha > 0:  # the teacher term: labels drawn uniformly, their generated features
                count = self.config.fedgen_batch
                labels = torch.randint(self.num_classes, (count,), generator=stream)
                labels = labels.to(targets.device)
                with torch.no_grad():
                    features = generator(labels, self._noise(count, stream, outputs))
                teacher = F.cross_entropy(head(features), labels)
                ratio = count / self.config.batch_size if self.config.fedgen_ratio_scaling else 1
                scaled = alpha * ratio * teacher
                total = scaled if total is None else total + scaled
            return total

        return term

    def _noise(self, count: int, stream: torch.Generator, like: torch.Tensor) -> torch.Tensor:
        """eps ~ N(0, I) (or U[0, 1): ``fedgen_noise``), drawn on the CPU stream (the same on
        any device), moved to ``like``'s device."""
        draw = torch.randn if self.config.fedgen_noise == "gaussian" else torch.rand
        noise = draw(count, self.generator.noise_dim, generator=stream, dtype=torch.float64)
        return noise.to(device=like.device, dtype=self.generator.out.weight.dtype)

    # ---- server --------------------------------------------------------------------
    def aggregate(self, round: int, results: list[ClientResult]):
        """Train G on the round's client heads (before averaging, as the code), then FedAvg."""
        if self.generator is not None and results:
            self.last_losses = self.train_generator(round, results)
        return super().aggregate(round, results)

    def label_weights(self, results: list[ClientResult]) -> tuple[torch.Tensor, torch.Tensor]:
        """(classes, clients) shares w_k(y) of each label's samples, and the labels G trains on."""
        counts = torch.stack([self.label_counts.get(r.client, torch.ones(self.num_classes))
                              .cpu() for r in results], dim=1)
        if self.config.fedgen_label_counts == "data":  # every epoch saw each sample once
            counts = counts / self.config.local_epochs
        qualified = torch.nonzero(counts.max(dim=1).values > MIN_SAMPLES_PER_LABEL).flatten()
        return counts / counts.sum(dim=1, keepdim=True), qualified

    def train_generator(self, round: int, results: list[ClientResult]) -> dict[str, float]:
        """``fedgen_steps`` Adam steps on the heads' weighted cross-entropy plus diversity."""
        weights, qualified = self.label_weights(results)
        self.label_counts = {}
        if len(qualified) == 0 or self.config.fedgen_steps == 0:
            return {}
        generator, stream = self.generator, torch_generator(self.config.seed, "fedgen-server",
                                                            round)
        device = generator.out.weight.device
        heads = [{k: r.state[k].to(device) for k in (f"{self.head}.weight", f"{self.head}.bias")
                  if k in r.state} for r in results]
        weights = weights.to(device=device, dtype=generator.out.weight.dtype)
        if self.config.fedgen_fresh_optimizer:  # the seed code's new Adam every round
            self.optimizer = torch.optim.Adam(generator.parameters(), lr=self.config.fedgen_lr,
                                              weight_decay=ADAM_WEIGHT_DECAY)
        batch = self.config.fedgen_server_batch or self.config.batch_size
        generator.train()
        first = last = None
        for _ in range(self.config.fedgen_steps):
            pick = torch.randint(len(qualified), (batch,), generator=stream)
            labels = qualified[pick].to(device)
            noise = self._noise(len(labels), stream, weights).to(weights.dtype)
            features = generator(labels, noise)
            teacher = sum(teacher_loss(head_logits(h, self.head, features), labels,
                                       weights[labels, k], self.config.fedgen_teacher_weighting)
                          for k, h in enumerate(heads))
            diversity = diversity_loss(noise, features)
            loss = teacher + diversity  # ensemble_alpha = ensemble_eta = 1, no student term
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            last = float(teacher.detach())
            first = last if first is None else first
        for group in self.optimizer.param_groups:  # the code's ExponentialLR(0.98), per round
            group["lr"] *= self.config.fedgen_decay
        return {"generator_loss_first": first, "generator_loss": last,
                "generator_diversity": float(diversity.detach())}

    def round_metrics(self, task) -> dict[str, float]:
        """G's weighted cross-entropy at its first and last step of the round."""
        return dict(self.last_losses)

    # ---- checkpoints ---------------------------------------------------------------
