"""FedSAM and FedASAM (Caldarola, Caputo, Ciccone, ECCV 2022): FedAvg whose clients take
sharpness-aware steps, so the local models and their average sit in flatter regions.

Each local step on a batch B takes two forward-backward passes (SAM: Foret et al. 2021;
ASAM: Kwon et al., ICML 2021, eq. 9-10 there):

    g      = grad L_B(w)                                   (first pass, the reported loss)
    e      = rho * T_w^2 g / ||T_w g||                     (ascent to the worst nearby point)
    g_sam  = grad L_B(w + e)                               (second pass)
    w      <- SGD step from w (not from w + e) with g_sam  (momentum and weight decay as usual)

FedSAM is SAM: T_w = I, so e = rho g / ||g||. FedASAM is ASAM: T_w = diag(|w| + eta)
elementwise, which makes the neighbourhood scale with the weights. The server is FedAvg's
(the weighted mean of the local models).

Decisions where the papers leave room (we follow the authors' code, debcaldarola/fedsam,
whose minimizers are ASAM's own):

- T_w = |w| + eta applies to tensors whose name contains "weight" (layer and BatchNorm
  weights); biases, and every other parameter, use T_w = 1 (ASAM's code does the same).
  On the 2-parameter toy, whose parameters are named x and y, FedASAM is therefore FedSAM.
- ||T_w g|| gets 1e-16 added (as the code), so a zero gradient gives no step, not 0/0.
- The ascent direction uses the loss gradient only: weight decay and momentum belong to the
  descent step, which the configured SGD takes at the unperturbed weights.
- The weights are put back by copying the saved tensors (the code subtracts e, which is
  the same up to float rounding).
- Both passes run in train mode, so BatchNorm's running statistics move twice per step, the
  second time with the perturbed weights (as the code's two forward calls do).
- rho: the papers tune it per data set. Defaults (``sam_rho`` None): FedSAM 0.05 (SAM's
  default, Foret et al.), FedASAM 0.5 with eta 0.01 (ASAM's defaults, also the defaults of
  the FedSAM code's ASAM minimizer). rho = 0 is exactly FedAvg: the strategy then skips the
  second pass.

Server-side SWA (``swa``; the paper's "+ SWA" rows, Sec. 4 there, after Izmailov et al. 2018):
in the last rounds the server keeps a running mean of the global models, one per cycle of
c rounds, and reports that mean; the clients go on training from FedAvg's mean. Within a
cycle the clients' learning rate falls linearly from lr to swa_lr:

    t(r)  = (((r - s) mod c) + 1) / c        for rounds r >= s (s = swa_start)
    lr(r) = (1 - t(r)) lr + t(r) swa_lr
    w_SWA <- (n w_SWA + w) / (n + 1)         after the last round of each cycle (t = 1)

Decisions (the authors' code, main.py and fedavg_server.py, where the paper is silent):

- s defaults to the round after three quarters of the rounds (the code's int(0.75 R),
  counted from 0), c to 1 (then the rate stays lr and every round's model is averaged),
  swa_lr to 1e-4. The paper's CIFAR runs use c = 10.
- The default s is computed once, from ``rounds`` as the run first uses it, and saved in
  the strategy's checkpoint; a run folder resumed with a larger ``rounds`` keeps the s its
  first rounds used. Reason: ``rounds`` is the one setting a resume may change, and a start
  recomputed from it would move the schedule half way through a run (a folder taken to 4
  rounds and extended to 8 would have averaged round 4, then skipped rounds 5-6 waiting for
  a start of 7), giving a model that no uninterrupted run gives. Kept, the extended run is
  exactly the uninterrupted run with that s. The code recomputes int(0.75 R) at every
  launch, so its resumed runs have the defect. For a start after 75% of the new count, set
  ``swa_start`` (an explicit value always wins over the saved one) or start a fresh
  folder. Folders checkpointed before the start was saved fall back to the current rounds.
- The model is averaged after each cycle's last round, r = s + c - 1, s + 2c - 1, ...,
  where the rate is lowest, as the paper's and SWA's schedule intends. The code averages
  one round later, after rounds s + c, s + 2c, ... (its test i > S and (i - S) mod c == 0,
  with 0-based i and S = s - 1): after the first, high-rate round of the next cycle (its
  rate phase is (i mod c + 1) / c, counted from round 0, so its cycles line up with ours
  only when S is a multiple of c, as in the paper's runs). This holds at c = 1 too, where
  the rates agree: flnotes averages the global models of rounds s, s + 1, ..., R, the
  code those of rounds s + 1, ..., R, one model fewer (it never averages round s's). So
  flnotes with swa_start = s + 1 gives the code's final mean with start s.
- The reported model is FedAvg's global model until the first cycle ends (the code
  reports, from round s until its first average after round s + c, a copy of the global
  model that round s starts from; that first average replaces the copy, weight 1).
- Every float entry is averaged, BatchNorm statistics included, as FedAvg averages them;
  the code averages the parameters only and keeps the statistics of round s.
- The seed papers' FedASAM (the FedMR authors' repository, Algorithm/Training_FedASAM.py)
  hard-codes rho = 0.1 and eta = 0 where ASAM and the FedASAM authors' script use rho 0.5,
  eta 0.01 (flnotes' defaults); the ``*-official`` presets set ``sam_rho=0.1, asam_eta=0``.
  That shipped script also reads ``args.ensemble_alpha``, which its own FedASAM path never
  sets, and stops with AttributeError before training as published.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import is_float_layer

GRAD_NORM_EPS = 1e-16  # added to ||T_w g|| as in the authors' code


def adaptive_scale(name: str, weight: torch.Tensor, eta: float) -> torch.Tensor | None:
    """ASAM's T_w for one tensor: |w| + eta for weights, None (identity) for the rest."""
    return weight.abs() + eta if "weight" in name else None


@torch.no_grad()
def ascent_offsets(params: dict[str, torch.Tensor], rho: float, adaptive: bool,
                   eta: float) -> dict[str, torch.Tensor]:
    """e = rho T^2 g / ||T g|| from the gradients in ``.grad`` (T = I unless adaptive)."""
    scales, scaled = {}, {}
    for n, p in params.items():
        if p.grad is None:  # a parameter the loss does not use is not perturbed
            continue
        scales[n] = adaptive_scale(n, p, eta) if adaptive else None
        scaled[n] = p.grad if scales[n] is None else scales[n] * p.grad  # T g
    if not scaled:
        return {}
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t) for t in scaled.values()])) + GRAD_NORM_EPS
    return {n: (t if scales[n] is None else scales[n] * t) * (rho / norm)  # T (T g)
            for n, t in scaled.items()}


def stacked_ascent_offsets(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                           rho: float, adaptive: bool, eta: float) -> dict[str, torch.Tensor]:
    """:func:`ascent_offsets` for K lanes at once (tensors (K, ...)): each lane's
    e = rho T^2 g / ||T g||, its norm over that lane's tensors only."""
    scaled, squares = {}, 0.0
    for n, g in grads.items():
        scale = adaptive_scale(n, params[n], eta) if adaptive else None
        scaled[n] = (g if scale is None else scale * g, scale)
        squares = squares + scaled[n][0].reshape(len(g), -1).square().sum(1)  # (K,)
    factor = rho / (squares.sqrt() + GRAD_NORM_EPS)  # (K,)
    return {n: (t if scale is None else scale * t)
            * factor.reshape([-1] + [1] * (t.dim() - 1))
            for n, (t, scale) in scaled.items()}


def gradient_at(params: dict[str, torch.Tensor], closure: Callable[[], torch.Tensor],
                moved: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run ``closure`` (its gradient into ``.grad``) with each weight named in ``moved`` set
    to that value, then put the weights back; return the closure's loss. The step of every
    method that takes its gradient away from w (SAM's w + e, FedLESAM's, FedGF's, FedSMOO's)."""
    saved = {}
    with torch.no_grad():
        for n, value in moved.items():
            saved[n] = params[n].detach().clone()
            params[n].copy_(value)
    loss = closure()
    with torch.no_grad():
        for n, w in saved.items():
            params[n].copy_(w)
    return loss


def sharpness_aware_gradient(params: dict[str, torch.Tensor], closure: Callable[[], torch.Tensor],
                             rho: float, adaptive: bool, eta: float) -> torch.Tensor:
    """Leave the gradient at w + e in ``.grad`` with the weights back at w; the loss at w."""
    loss = closure()  # g at w
    with torch.no_grad():
        moved = {n: params[n] + e for n, e in ascent_offsets(params, rho, adaptive, eta).items()}
    gradient_at(params, closure, moved)  # g at w + e replaces g
    return loss


class FedSAM(Strategy):
    """FedAvg with SAM's two-pass local step (``adaptive`` False) or ASAM's (True)."""

    name = "fedsam"
    checkpointed = {"iterate": "state", "swa_models": "int", "swa_state": "state",
                    "default_swa_start": "int"}
    label = "FedSAM"
    settings = (
        Setting("sam_rho", 0.05, "FedSAM/FedASAM: ascent radius rho of the local SAM step",
                source="SAM (Foret et al. 2021): 0.05", minimum=0),
        Setting("swa", False, "FedSAM/FedASAM: server-side stochastic weight averaging in "
                "the last rounds", source="Caldarola et al. 2022 Sec. 4 (+ SWA rows)"),
        Setting("swa_start", None, "SWA: first round of the averaging phase", kind=int,
                minimum=1, none_means="after 75% of the rounds, fixed when the run starts",
                source="Caldarola et al. 2022 Sec. 4 (75% of training)"),
        Setting("swa_cycle", 1, "SWA: rounds per learning-rate cycle; one model averaged per "
                "cycle", minimum=1, source="Caldarola et al. 2022 Sec. 4 (c; 10 on CIFAR)"),
        Setting("swa_lr", 1e-4, "SWA: the cycle's lowest learning rate (it falls from lr to "
                "this)", minimum=0, open_minimum=True, source="the authors' code's default"),
    )
    default_weighting = "samples"
    adaptive = False

    @classmethod
    def config_warnings(cls, config) -> list[str]:
        """SWA settings that do nothing in this run: swa off, or a start after the last round."""
        lines = []
        if not config.swa and (config.swa_start is not None or config.swa_cycle != 1):
            lines.append("warning: swa_start/swa_cycle are set but swa is off: no averaging "
                         "happens (add --swa true)")
        elif config.swa and config.swa_start is not None and config.swa_start > config.rounds:
            lines.append(f"warning: swa_start={config.swa_start} is after the last round "
                         f"(rounds={config.rounds}): this run never averages (lower "
                         "--swa-start or raise --rounds)")
        return lines
    default_rho = 0.05  # SAM's default (Foret et al. 2021)

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        self.iterate = self.global_state  # FedAvg's mean: what the clients train from
        self.swa_state: OrderedDict | None = None  # w_SWA, None before the first cycle ends
        self.swa_models = 0  # n: models averaged into w_SWA
        self.default_swa_start: int | None = None  # s from the rounds, fixed at first use

    @property
    def rho(self) -> float:
        """The neighbourhood radius: ``sam_rho``, or this method's default when None."""
        return self.default_rho if self.config.sam_rho is None else self.config.sam_rho

    @property
    def has_local_gradient(self) -> bool:  # rho = 0 is exactly FedAvg: one pass is enough
        return self.rho > 0

    def local_gradient(self, params, closure):
        """The gradient at the ascent point w + e, applied from w."""
        return sharpness_aware_gradient(params, closure, self.rho, self.adaptive,
                                        self.config.asam_eta)

    @property
    def stacked_ascent(self):
        """e for a stack of clients (the vmap backend's two-pass step), its rho and eta
        fixed as numbers (a compiled step does not trace the config). None with SWA under
        torch.compile: SWA's rate changes every round of a cycle and a step is built per
        rate, which eagerly is a closure (the stack trains them) but compiled would be c
        compilations, so those clients train on the loop."""
        if self._compiled_per_rate:
            return None
        rho, adaptive, eta = self.rho, self.adaptive, float(self.config.asam_eta)
        return lambda params, grads: stacked_ascent_offsets(params, grads, rho, adaptive, eta)

    @property
    def loop_reason(self) -> str | None:
        """The one-time note's reason when SWA's clients train on the loop (under compile)."""
        if self._compiled_per_rate:
            return ("with SWA under --compile (its rate changes every round of a cycle: one "
                    "compilation per rate)")
        return None

    @property
    def _compiled_per_rate(self) -> bool:
        """SWA under torch.compile: a stacked step would be compiled once per rate."""
        return bool(self.config.swa) and self.config.compile != "off"

    # ---- server-side SWA ----------------------------------------------------------
    @property
    def swa_start(self) -> int:
        """s: the first round of the SWA phase (1-based).

        ``swa_start`` when set; otherwise the round after three quarters of ``rounds`` as the
        run first saw them, fixed at first use and kept in the checkpoint, so that a run
        resumed with more rounds keeps the schedule it began with.
        """
        if self.config.swa_start is not None:
            return self.config.swa_start
        if self.default_swa_start is None:
            # the code's int(0.75 R), counted from 0
            self.default_swa_start = int(0.75 * self.config.rounds) + 1
        return self.default_swa_start

    def swa_phase(self, round: int) -> float | None:
        """t(r) in (0, 1] during the SWA phase, None before it (or without SWA)."""
        if not self.config.swa or round < self.swa_start:
            return None
        cycle = self.config.swa_cycle
        return (((round - self.swa_start) % cycle) + 1) / cycle

    def local_lr(self, round: int) -> float:
        """lr before the SWA phase; within each cycle, linear from lr down to swa_lr."""
        t = self.swa_phase(round)
        if t is None or self.config.swa_cycle == 1:
            return self.config.lr
        return (1.0 - t) * self.config.lr + t * self.config.swa_lr

    def dispatch(self, round: int, clients: list[int]):
        """FedAvg's global model (not the reported SWA mean)."""
        return [self.iterate for _ in clients]

    def aggregate(self, round: int, results: list[ClientResult]):
        """FedAvg's mean; at the end of each SWA cycle, fold it into the running mean."""
        self.iterate = self.average(results)
        if self.swa_phase(round) == 1.0:
            n = self.swa_models
            if self.swa_state is None:
                self.swa_state = OrderedDict((k, v.clone()) for k, v in self.iterate.items())
            else:
                self.swa_state = OrderedDict(
                    (k, (v * n + self.iterate[k]) / (n + 1) if is_float_layer(v)
                     else self.iterate[k].clone())
                    for k, v in self.swa_state.items())
            self.swa_models = n + 1
        self.global_state = self.iterate if self.swa_state is None else self.swa_state
        return self.global_state

    def round_metrics(self, task) -> dict[str, float]:
        """With SWA: how many models the reported mean holds."""
        return {"swa_models": float(self.swa_models)} if self.config.swa else {}



class FedASAM(FedSAM):
    """FedSAM with ASAM's adaptive neighbourhood T_w = |w| + eta."""

    name = "fedasam"
    label = "FedASAM"
    settings = (
        Setting("sam_rho", 0.5, "FedSAM/FedASAM: ascent radius rho of the local SAM step",
                source="ASAM (Kwon et al. 2021): 0.5, the FedSAM code's ASAM minimizer",
                minimum=0),
        Setting("asam_eta", 0.01, "FedASAM: eta in the adaptive scale T_w = |w| + eta",
                source="ASAM (Kwon et al. 2021) eq. 7; 0.01 its default", minimum=0),
    )
    adaptive = True
    default_rho = 0.5  # ASAM's default (Kwon et al. 2021; the FedSAM code's ASAM minimizer)
