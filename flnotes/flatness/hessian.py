"""Curvature of a trained model's loss: Hessian top eigenvalue, Hessian trace, SAM sharpness.

All three are computed over a *fixed* evaluation set ``(x, y)`` split into batches in
order, so the numbers are a deterministic function of the model, the data and the seed.
The loss is the sample-weighted mean over the batches, with the model in eval mode
(BatchNorm uses the model's running statistics), and derivatives are taken with respect
to every floating-point *parameter* (weights, biases, BatchNorm affine parameters);
buffers stay fixed. The model is called through ``torch.func.functional_call``, so the
module passed in is never changed.

- :func:`top_eigenvalue`: power iteration on Hessian-vector products (``grad`` of
  <``grad``, v>, one batch at a time so memory holds one batch's graph);
- :func:`hessian_trace`: Hutchinson's estimator E[v^T H v] with Rademacher v;
- :func:`sam_sharpness`: L(w + eps) - L(w) with eps = rho g / ||g|| (SAM's one-step
  solution of the worst case within the L2 ball of radius rho, Foret et al. 2021).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from flnotes.engine.batched.functional import VmapLSTM
from flnotes.rng import torch_generator

Tensors = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ModelLike = nn.Module | Callable[[], nn.Module]


# ---- shared helpers: a functional view of (model, state) ------------------------------------
def template_of(model: ModelLike, device: torch.device | str | None = None) -> nn.Module:
    """An eval-mode module to call functionally: a copy of the module, or one from a factory.

    LSTMs are swapped for :class:`flnotes.engine.batched.functional.VmapLSTM` (same parameter
    names), because the fused ``nn.LSTM`` kernel supports neither ``vmap`` nor forward-mode AD.
    """
    # A copy, so that moving it to a device and switching it to eval mode leave the caller's
    # module as it was.
    module = copy.deepcopy(model) if isinstance(model, nn.Module) else model()
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.LSTM):
            parent, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, leaf, VmapLSTM(child))
    if device is not None:
        module = module.to(device)
    return module.eval()


def split_state(template: nn.Module, state: Mapping[str, torch.Tensor],
                device: torch.device | str) -> tuple[Tensors, Tensors]:
    """(float parameters, everything else) of a state, on ``device``, detached."""
    param_names = {n for n, p in template.named_parameters() if torch.is_floating_point(p)}
    params, rest = {}, {}
    for name, t in state.items():
        (params if name in param_names else rest)[name] = t.detach().to(device)
    return params, rest


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int):
    """Consecutive (x, y) batches of the fixed evaluation set, in order."""
    for start in range(0, len(y), batch_size):
        yield x[start:start + batch_size], y[start:start + batch_size]


def _dot(a: Tensors, b: Tensors) -> torch.Tensor:
    return sum((a[n] * b[n]).sum() for n in a)


def _norm(a: Tensors) -> torch.Tensor:
    return _dot(a, a).sqrt()


def _scaled(a: Tensors, scale) -> Tensors:
    return {n: t * scale for n, t in a.items()}


class FunctionalLoss:
    """Loss of a model over a fixed batch set, as a function of its parameter dict."""

    def __init__(self, model: ModelLike, state: Mapping[str, torch.Tensor], x: torch.Tensor,
                 y: torch.Tensor, loss_fn: LossFn = F.cross_entropy, batch_size: int = 500,
                 device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else x.device
        self.template = template_of(model, self.device)
        self.params, self.buffers = split_state(self.template, state, self.device)
        self.loss_fn = loss_fn
        # (weight, x, y) per batch; weights n_b / n make the loss the mean over samples.
        self.batches = [(len(yb) / len(y), xb.to(self.device), yb.to(self.device))
                        for xb, yb in batches(x, y, batch_size)]

    def batch_loss(self, params: Tensors, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Loss of one batch at the given parameters (buffers fixed, eval mode)."""
        out = functional_call(self.template, (params, self.buffers), (xb,))
        return self.loss_fn(out, yb)

    def loss(self, params: Tensors | None = None) -> float:
        """Loss over the whole fixed set (default: at the model's own parameters)."""
        params = self.params if params is None else params
        with torch.no_grad():
            return float(sum(w * self.batch_loss(params, xb, yb)
                             for w, xb, yb in self.batches))

    def gradient(self, params: Tensors | None = None) -> Tensors:
        """Gradient of the loss over the fixed set."""
        params = self.params if params is None else params
        total = {n: torch.zeros_like(t) for n, t in params.items()}
        for w, xb, yb in self.batches:
            g = grad(self.batch_loss)(params, xb, yb)
            total = {n: total[n] + w * g[n] for n in total}
        return total

    def hvp(self, v: Tensors) -> Tensors:
        """Hessian-vector product H v at the model's parameters, batch by batch.

        H v = grad_w <grad_w L(w), v> (reverse over reverse). Forward over reverse (``jvp``
        of ``grad``) costs the same here, but its first call loads TorchScript
        decompositions (seconds, and a deprecation warning in torch 2.14).
        """
        total = {n: torch.zeros_like(t) for n, t in self.params.items()}
        for w, xb, yb in self.batches:
            def directional(p, xb=xb, yb=yb):
                return _dot(grad(self.batch_loss)(p, xb, yb), v)

            hv = grad(directional)(self.params)
            total = {n: total[n] + w * hv[n] for n in total}
        return total

    def random_like(self, kind: str, seed: int, *tags: object) -> Tensors:
        """Seeded Gaussian ("normal") or Rademacher vector shaped like the parameters."""
        g = torch_generator(seed, "hessian", kind, *tags)
        out = {}
        for n, t in self.params.items():  # drawn on the CPU: same numbers on every device
            if kind == "rademacher":
                draw = torch.randint(0, 2, t.shape, generator=g).to(t.dtype) * 2 - 1
            else:
                draw = torch.randn(t.shape, generator=g, dtype=t.dtype)
            out[n] = draw.to(t.device)
        return out


# ---- the three measures -------------------------------------------------------------------
def top_eigenvalue(model: ModelLike, state: Mapping[str, torch.Tensor], x: torch.Tensor,
                   y: torch.Tensor, *, loss_fn: LossFn = F.cross_entropy, batch_size: int = 500,
                   iters: int = 50, tol: float = 1e-4, seed: int = 0,
                   device: torch.device | str | None = None) -> dict[str, float]:
    """Largest-magnitude Hessian eigenvalue by power iteration: {eigenvalue, iterations}.

    At a minimum the Hessian is (nearly) positive semi-definite, so this is the top
    eigenvalue; at a saddle with stronger negative curvature it is that negative value.
    Stops when successive Rayleigh quotients differ by less than ``tol`` (relative).
    """
    f = FunctionalLoss(model, state, x, y, loss_fn, batch_size, device)
    v = f.random_like("normal", seed, "power")
    v = _scaled(v, 1.0 / _norm(v))
    eigenvalue, it = math.nan, 0
    for it in range(1, iters + 1):
        hv = f.hvp(v)
        new = float(_dot(v, hv))  # Rayleigh quotient v^T H v with ||v|| = 1
        norm = _norm(hv)
        if norm == 0:
            return {"eigenvalue": 0.0, "iterations": it}
        v = _scaled(hv, 1.0 / norm)
        done = abs(new - eigenvalue) <= tol * max(abs(new), 1e-12)
        eigenvalue = new
        if done:
            break
    return {"eigenvalue": eigenvalue, "iterations": it}


def hessian_trace(model: ModelLike, state: Mapping[str, torch.Tensor], x: torch.Tensor,
                  y: torch.Tensor, *, loss_fn: LossFn = F.cross_entropy, batch_size: int = 500,
                  samples: int = 20, seed: int = 0,
                  device: torch.device | str | None = None) -> dict[str, float]:
    """Hutchinson's trace estimate mean_k v_k^T H v_k (Rademacher v_k): {trace, stderr}."""
    f = FunctionalLoss(model, state, x, y, loss_fn, batch_size, device)
    draws = []
    for k in range(samples):
        v = f.random_like("rademacher", seed, "trace", k)
        draws.append(float(_dot(v, f.hvp(v))))
    values = torch.tensor(draws, dtype=torch.float64)
    stderr = float(values.std() / math.sqrt(samples)) if samples > 1 else math.nan
    return {"trace": float(values.mean()), "stderr": stderr}


def sam_sharpness(model: ModelLike, state: Mapping[str, torch.Tensor], x: torch.Tensor,
                  y: torch.Tensor, *, rho: float = 0.05, loss_fn: LossFn = F.cross_entropy,
                  batch_size: int = 500,
                  device: torch.device | str | None = None) -> dict[str, float]:
    """SAM-style worst-case increase in the L2 ball: {sharpness, loss, perturbed_loss}.

    eps = rho * g / ||g|| maximises the first-order Taylor expansion of L(w + eps) over
    ||eps|| <= rho (SAM, Foret et al. 2021, eq. 2); the reported increase L(w+eps) - L(w)
    is therefore a lower bound on the true worst case (exact to first order in rho).
    """
    f = FunctionalLoss(model, state, x, y, loss_fn, batch_size, device)
    g = f.gradient()
    norm = _norm(g)
    here = f.loss()
    if norm == 0:
        return {"sharpness": 0.0, "loss": here, "perturbed_loss": here}
    moved = {n: f.params[n] + (rho / norm) * g[n] for n in f.params}
    there = f.loss(moved)
    return {"sharpness": there - here, "loss": here, "perturbed_loss": there}

