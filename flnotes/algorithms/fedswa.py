"""FedSWA and FedMoSWA (Liu, Liu, Shang, Liu, Liu, Feng, ICML 2025, "Improving Generalization in
Federated Learning with Highly Heterogeneous Data via Momentum-Based Stochastic Controlled
Weight Averaging", arXiv:2507.20016; authors' code github.com/junkangLiu0/FedSWA).

FedSWA brings SWA's two ingredients to a round: a cyclical learning rate on the clients (it
restarts at eta_l every round and falls linearly within the round) and an averaging step on
the server that moves past the clients' mean (LookAhead-style). For client i with K local
steps k = 0, ..., K - 1 from the global model x (paper eq. 3 and Alg. 1):

    eta_k   = eta_l (1 - k/K) + (k/K) rho eta_l  =  eta_l (1 - (1 - rho) k/K)      (eq. 3)
    y_{k+1} = y_k - eta_k g_i(y_k)                                      (local step, l. 10)
    v       = (1/s) sum_{i in S} y_{i,K}                     (the mean of the final iterates)
    x      <- x + alpha (v - x)                                               (l. 17)

What is averaged, and where: each client's *final* local iterate y_{i,K} (not a running mean
of its trajectory), uniformly over the s sampled clients, on the server; the SWA-like
"averaging" is the server step alpha, which with alpha > 1 extrapolates past v. rho = 1 and
alpha = 1 is FedAvg (the paper's ablation says so; here bit for bit).

FedMoSWA adds SCAFFOLD-like control variates whose server part is a momentum (an EMA) of the
clients' fresh variates, so that the newest c_i weigh most under low participation:

    y_{k+1} = y_k - eta_k (g_i(y_k) - c_i + m)                                 (l. 10)
    c_i+    = c_i - m + (x - y_{i,K}) / sum_k eta_k                   (option II, l. 13)
    m      <- m + gamma (1/s) sum_{i in S} (c_i+ - m)                              (l. 16)
    x      <- x + alpha (v - x)                                                    (l. 17)

c_i and m start at zero, so round 1 is FedSWA's round 1 bit for bit; with the correction
removed every round is FedSWA's (tests/test_fedswa.py). With rho = alpha = gamma = 1 and every
client in every round it is SCAFFOLD (m is then the mean of the c_i, SCAFFOLD's c).

Sources. The equations above are the paper's eq. 3 and Algorithm 1 (FedSWA and FedMoSWA
in one listing; line numbers as cited by readers of the paper: l. 10 local step, l. 13 option
II, l. 16 server variate, l. 17 server model). The paper's text was not reachable from this
workplace; the equations and the CIFAR values rho = 0.1, alpha = 1.5, gamma = 0.2 (its
ablations' best) were taken from two independent readings of it, and agree with the
authors' code where that implements them. Check them against the PDF before quoting.

Decisions (the code is main_FedSWA.py of the authors' repository at its newest commit):

- K is the number of steps the client takes: local_epochs x ceil(n_i / B) (the engine's
  batch schedule). The code uses the same count for FedSWA's schedule (its
  i / (len(loader) E), l. 857); its SCAFFOLD-type updates stop at --K 50 steps instead.
- eta_k is computed as eta_l (1 - (1 - rho) k / K), the same number as eq. 3 in real
  arithmetic, so that rho = 1 gives exactly eta_l (FedAvg bit for bit) rather than a
  rounding of it. Step k + 1 uses eta_k (k from 0): the first step runs at eta_l and the
  last at eta_l (1 - (1 - rho)(K - 1)/K), never quite rho eta_l, as eq. 3 and the code
  (l. 845-857: the rate updated after each step, l. 857) both have it.
- rho: the paper's 0.1 (default). The code sets rho = 0 (the rate falls to 0, l. 842) and
  at its newest commit also doubles the rate (SGD lr = 2 lr, l. 840 and l. 848; its README:
  "FedSWA's learning rate is usually twice FedAvg's"); flnotes uses the configured lr as
  eta_l and leaves the factor to the preset's lr.
- alpha: the paper's 1.5 (default). The code's server step is --lg, default 1 (l. 1378):
  its runs average without extrapolating. alpha = 1 sets x to v directly (no x + (v - x)
  rounding).
- Aggregation: the uniform mean 1/s (``weighting="uniform"``, as Alg. 1 and the code's
  apply_weights_avg, l. 1365-1381); ``weighting="samples"`` weights the y_{i,K} by size.
  Every float entry is averaged and stepped, BatchNorm statistics included, as FedAvg
  averages them; integer buffers (num_batches_tracked) are the mean's (the first client's).
- Momentum and weight decay: the paper analyses plain SGD; the code's local SGD has no
  momentum and weight decay 1e-3 (l. 848). Here ``momentum`` is torch's heavy ball with the
  step's rate eta_k (the buffer is not rescaled when the rate changes, as a torch scheduler
  does it) and weight decay is part of the gradient, as in every other method. The code also
  clips each gradient to norm 10 (l. 855); flnotes does not clip (no method does).
- A client with no samples takes no step and returns its start model.
- The rate's per-round schedule across rounds: the code multiplies eta_l by a cosine decay
  over the rounds (--lr_decay 2, l. 1796-1800); flnotes keeps lr constant across rounds (no
  method here has a round schedule but FedSAM's SWA phase), so the presets do not have it.

FedMoSWA only:

- The code's ``--alg MoFedSWA`` runs update_scafplus (l. 957-1005): SCAFFOLD's corrected step
  at a constant rate (no cyclical schedule), c_i+ = c_i - m + (x - y)/(K eta_l) with K = 50,
  and m <- m + 0.4 mean(c_i+ - m) (gamma hard-coded 0.4, l. 1408) except in the first round,
  where m is set to mean(c_i+ - m), i.e. gamma = 1 once (l. 1399-1402); alpha = 1. Its
  update_FedMoSWA (l. 864-905, cyclical rate with rho = 0, correction applied after the SGD
  step, c_i+ divided by K times the mean rate) is registered under no name. flnotes follows
  the paper: the cyclical rate in every round, gamma in every round, alpha on the server.
- Option II divides by the client's own sum_k eta_k (eq. 3 summed over its K steps). With
  momentum mu, K heavy-ball steps of one constant gradient g move the model by
  sum_k eta_k (1 - mu^{k+1}) / (1 - mu) g, so that sum is the divisor (it is sum_k eta_k at
  mu = 0, the paper's formula, and SCAFFOLD's effective_steps x eta_l at rho = 1).
- The correction m - c_i enters the gradient before weight decay and momentum (as
  SCAFFOLD's here, and as update_scafplus adds it to .grad before SGD's weight decay).
- m is updated by the mean over the sampled clients that took a step (all of them unless a
  client holds no data); c_i of a client without steps stays as it was.
- Control variates cover trainable parameters only (named_parameters, as the code); BatchNorm
  statistics get none and are averaged like FedAvg's.
- Clients that sit a round out keep c_i in the engine's client state store
  (:mod:`flnotes.engine.client_state`), on disk in a run folder, one file per client.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.scaffold import local_steps, trainable_layer_names, zeros_like_layers
from flnotes.algorithms.settings import Setting
from flnotes.engine.client_state import ClientStateStore, store_directory
from flnotes.engine.state import clone_state, is_float_layer
from flnotes.engine.train import iter_batches


def cyclical_rates(lr: float, rho: float, steps: int) -> list[float]:
    """eta_k = eta_l (1 - (1 - rho) k / K) for k = 0, ..., K - 1 (eq. 3; exactly lr at rho = 1)."""
    return [lr * (1.0 - (1.0 - rho) * k / steps) for k in range(steps)]


def displacement_scale(rates: list[float], momentum: float) -> float:
    """How far the rates move the model along one constant unit gradient: sum_k eta_k at
    momentum 0 (option II's divisor), sum_k eta_k (1 - mu^{k+1}) / (1 - mu) with heavy ball."""
    if momentum == 0:
        return float(sum(rates))
    return float(sum(r * (1 - momentum ** (k + 1)) / (1 - momentum)
                     for k, r in enumerate(rates)))


class FedSWA(Strategy):
    """FedAvg with a cyclical local rate (eq. 3) and the server step x + alpha (mean - x)."""

    name = "fedswa"
    label = "FedSWA"
    settings = (
        Setting("fedswa_rho", 0.1, "FedSWA/FedMoSWA: within a round the local rate falls "
                "linearly from lr towards fedswa_rho * lr (1: constant)",
                source="Liu et al. 2025 eq. 3; 0.1 in its CIFAR runs (its ablation's best)",
                minimum=0, maximum=1),
        Setting("fedswa_alpha", 1.5, "FedSWA/FedMoSWA: server step alpha of x + alpha "
                "(mean - x) (1: the clients' mean)",
                source="Liu et al. 2025 Alg. 1 l. 17; 1.5 in its CIFAR runs (its ablation's "
                "best)", minimum=0, open_minimum=True),
    )
    default_weighting = "uniform"  # Alg. 1: v = (1/s) sum of the final iterates
    # The rate changes every step: the stacked step is built for one rate, so the whole
    # local update is the strategy's own (the vmap backend runs it on the loop).
    custom_local_update = True

    # ---- clients ----------------------------------------------------------------
    def correction(self, client: int) -> dict[str, torch.Tensor] | None:
        """A constant term added to every local gradient (FedMoSWA's m - c_i); None here."""
        return None

    def local_update(self, task, round: int, client: int, start, generator) -> ClientResult:
        """K SGD steps at the rates of eq. 3 (plus the correction, if any)."""
        config = self.config
        model = task.working_model()
        model.load_state_dict(start)
        model.train()
        params = dict(model.named_parameters())
        x, y = task.client_data(client)
        rates = cyclical_rates(self.local_lr(round), config.fedswa_rho,
                               local_steps(len(y), config.local_epochs, config.batch_size))
        correction = self.correction(client)
        opt = torch.optim.SGD(params.values(), lr=self.local_lr(round),
                              momentum=config.momentum, weight_decay=config.weight_decay)
        losses = []
        batches = iter_batches(len(y), config.local_epochs, config.batch_size, generator,
                               x.device)
        for rate, idx in zip(rates, batches, strict=True):
            opt.param_groups[0]["lr"] = rate
            loss = task.loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if correction is not None:
                with torch.no_grad():
                    for n, p in params.items():
                        if n in correction:
                            p.grad.add_(correction[n])
            opt.step()
            losses.append(loss.detach())
        mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")
        return ClientResult(client, clone_state(model.state_dict()), len(y), mean_loss)

    # ---- server -----------------------------------------------------------------
    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict:
        """x + alpha (v - x), v the mean of the clients' final iterates (l. 17)."""
        mean = self.average(results)
        alpha, x = self.config.fedswa_alpha, self.global_state
        if alpha != 1:  # integer buffers (num_batches_tracked) as the mean has them
            mean = OrderedDict((n, x[n] + alpha * (v - x[n]) if is_float_layer(v) else v)
                               for n, v in mean.items())
        self.global_state = mean
        return mean


class FedMoSWA(FedSWA):
    """FedSWA whose local gradients are corrected by m - c_i; m a momentum of the c_i+."""

    name = "fedmoswa"
    label = "FedMoSWA"
    checkpointed = {"control": "state", "store": ("object", "clients")}
    runs_on_flower = False  # clients keep control variates the server reads back
    settings = (
        Setting("moswa_gamma", 0.2, "FedMoSWA: momentum gamma of the server variate, m <- m "
                "+ gamma mean(c_i+ - m)", source="Liu et al. 2025 Alg. 1 l. 16; 0.2 in its "
                "CIFAR runs (its ablation's best)", minimum=0, maximum=1),
    )

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.layers = trainable_layer_names(self.global_state)
        self.control = zeros_like_layers(self.global_state, self.layers)  # m
        device = next(iter(self.global_state.values())).device
        self.store = ClientStateStore(store_directory(self.config.run_dir, "fedmoswa"),
                                      self._new_variate, device=device)

    def _new_variate(self, client: int) -> OrderedDict[str, torch.Tensor]:
        return zeros_like_layers(self.global_state, self.layers)  # c_i = 0

    def dispatch(self, round, clients):
        """The global model; the round's control variates are read into memory."""
        self.store.hold(clients)
        return super().dispatch(round, clients)

    def correction(self, client: int) -> dict[str, torch.Tensor]:
        """m - c_i (l. 10)."""
        c_i = self.store.get(client)
        return {n: self.control[n] - c_i[n] for n in self.layers}

    def aggregate(self, round: int, results: list[ClientResult]) -> OrderedDict:
        """Option II variates of the round's clients (l. 13), m (l. 16), then x (l. 17)."""
        x, config = self.global_state, self.config
        m = self.control
        change = OrderedDict((n, torch.zeros_like(t)) for n, t in m.items())
        counted = 0
        for r in results:
            steps = local_steps(r.num_samples, config.local_epochs, config.batch_size)
            if steps == 0:
                continue  # no step taken: nothing measured, c_i stays
            rates = cyclical_rates(self.local_lr(round), config.fedswa_rho, steps)
            scale = displacement_scale(rates, config.momentum)
            c_i = self.store.get(r.client)
            new_c_i = OrderedDict((n, c_i[n] - m[n] + (x[n] - r.state[n]) / scale)
                                  for n in self.layers)
            for n in self.layers:
                change[n] += new_c_i[n] - m[n]
            counted += 1
            self.store.put(r.client, new_c_i, round)
        self.store.release()
        if counted:
            gamma = config.moswa_gamma
            self.control = OrderedDict((n, t + gamma * (change[n] / counted))
                                       for n, t in m.items())
        return super().aggregate(round, results)
