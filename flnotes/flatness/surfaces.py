"""Loss surfaces of trained models: filter-normalised slices and planes, interpolation paths.

Method of Li et al. 2018 ("Visualizing the Loss Landscape of Neural Nets", Sec. 4): draw a
Gaussian direction d with the model's shapes and rescale every *filter* of it to the norm
of the matching filter of the weights, d_i <- d_i / ||d_i|| * ||w_i||, where a filter is
one slice along the first (output) dimension: an output channel of a conv kernel, a row of
a linear weight. Then plot L(w + a d1 + b d2). Because a ReLU network computes the same
function after a filter is scaled by c and the next layer by 1/c, raw directions would make
small-weight models look sharp; filter normalisation makes planes of different models
comparable (Li et al. Sec. 4.1).

Choices (Li et al.'s ``ignore='biasbn'`` default):
- 1-D and 0-D layers (biases, BatchNorm weights and biases) get a zero direction: they are
  few and their scale is not tied to a filter. ``ignore_1d=False`` keeps them, each layer
  normalised as one filter (its direction gets the layer's norm); the 2-parameter toy
  (two 0-D layers x, y) needs this.
- Buffers (BatchNorm running mean/var, num_batches_tracked) never move along a random
  direction; every model is evaluated in eval mode, so BatchNorm normalises with the centre
  model's running statistics. On an interpolation path the float buffers are interpolated
  too (both end models carry their own statistics).

Every surface is a set of points w + sum_k c_k d_k, evaluated by :func:`evaluate_points`
in chunks: ``torch.func.vmap`` over a stack of perturbed parameter sets runs one forward
pass per (chunk of points, data batch), which is what makes a 21x21 ResNet-18 plane on
2,000 images a matter of minutes on a GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from flnotes.engine.state import clone_state
from flnotes.flatness.hessian import (
    LossFn,
    ModelLike,
    batches,
    hessian_trace,
    sam_sharpness,
    template_of,
    top_eigenvalue,
)
from flnotes.rng import torch_generator

StateT = Mapping[str, torch.Tensor]
NORMS = ("filter", "layer", "none")


# ---- directions ------------------------------------------------------------------------
def random_direction(state: StateT, *, seed: int = 0, index: int = 0, norm: str = "filter",
                     ignore_1d: bool = True,
                     buffers: Sequence[str] = ()) -> OrderedDict[str, torch.Tensor]:
    """A seeded Gaussian direction over a state's layers, normalised to the weights (Li et al.).

    ``norm``: "filter" (each output filter/row scaled to the weights' filter norm), "layer"
    (each layer scaled to the layer's norm) or "none" (raw N(0, 1)). Layers with fewer than
    2 dimensions are zero unless ``ignore_1d=False``; names in ``buffers`` and integer
    layers are always zero. ``index`` picks independent directions from one seed.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    g = torch_generator(seed, "direction", index)
    skip = set(buffers)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, w in state.items():
        if not torch.is_floating_point(w):
            out[name] = torch.zeros_like(w)
            continue
        # Drawn for every float layer, in state order, on the CPU: the same seed gives the
        # same direction whatever is skipped and on whatever device the model lives.
        d = torch.randn(w.shape, generator=g, dtype=torch.float32).to(w.device, w.dtype)
        if name in skip or (ignore_1d and w.dim() <= 1):
            d = torch.zeros_like(w)
        elif norm != "none":  # "layer", and a kept 1-D/0-D layer under "filter": one filter
            rows = len(w) if norm == "filter" and w.dim() >= 2 else 1  # "filter": one per row
            d = _match_rows(d.reshape(rows, -1), w.reshape(rows, -1)).reshape(w.shape)
        out[name] = d
    return out


def _match_rows(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Scale each row of d (n, m) to the norm of the same row of w (Li et al. eq. 1)."""
    return d * (w.norm(dim=1, keepdim=True) / (d.norm(dim=1, keepdim=True) + 1e-10))


def model_directions(model: ModelLike, state: StateT, count: int = 2, *, seed: int = 0,
                     norm: str = "filter",
                     ignore_1d: bool = True) -> list[OrderedDict[str, torch.Tensor]]:
    """``count`` independent filter-normalised directions for a model's state (buffers zero)."""
    buffer_names = [n for n, _ in template_of(model).named_buffers()]
    return [random_direction(state, seed=seed, index=k, norm=norm, ignore_1d=ignore_1d,
                             buffers=buffer_names) for k in range(count)]


# ---- batched evaluation of perturbed models --------------------------------------------------
@torch.no_grad()
def evaluate_points(model: ModelLike, center: StateT, directions: Sequence[StateT],
                    coords: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *,
                    loss_fn: LossFn = F.cross_entropy, batch_size: int = 500, chunk_size: int = 16,
                    device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Loss and accuracy (P,) at the P points center + coords[p] @ directions, over (x, y).

    ``coords`` is (P, D) for D directions. Points are evaluated ``chunk_size`` at a time: the
    perturbed states of a chunk are stacked (chunk_size copies of the varying layers) and
    one vmapped ``functional_call`` evaluates them all on a data batch. Layers whose
    directions are all zero are shared, not copied. Accuracy is argmax(out, 1) == y.
    """
    device = torch.device(device) if device is not None else x.device
    template = template_of(model, device)
    coords = torch.as_tensor(coords, dtype=torch.float32).reshape(len(coords), -1)
    if coords.shape[1] != len(directions):
        raise ValueError(f"coords has {coords.shape[1]} columns for {len(directions)} directions")
    base = {name: t.detach().to(device) for name, t in center.items()}
    moving: dict[str, torch.Tensor] = {}  # name -> (D, *shape) directions of varying layers
    for name, t in base.items():
        stack = [d[name].to(device, t.dtype) for d in directions] if t.is_floating_point() else []
        if stack and any(bool(s.any()) for s in stack):
            moving[name] = torch.stack(stack)
    fixed = {n: t for n, t in base.items() if n not in moving}

    def point_metrics(params, xb, yb):
        out = functional_call(template, (params, fixed), (xb,))
        correct = (out.argmax(dim=1) == yb).sum()
        return loss_fn(out, yb), correct

    batched = vmap(point_metrics, in_dims=(0, None, None))
    data = [(xb.to(device), yb.to(device)) for xb, yb in batches(x, y, batch_size)]
    losses, accs = [], []
    for chunk in coords.to(device).split(chunk_size):
        # (P, *shape) = centre + sum_k c[p, k] * d_k for every varying layer.
        params = {n: base[n] + torch.tensordot(chunk.to(d.dtype), d, dims=1)
                  for n, d in moving.items()}
        loss_sum = torch.zeros(len(chunk), dtype=torch.float64, device=device)
        correct = torch.zeros(len(chunk), dtype=torch.float64, device=device)
        for xb, yb in data:
            # Nothing varies (all directions zero): every point is the centre, no vmap.
            loss, right = batched(params, xb, yb) if moving else point_metrics({}, xb, yb)
            loss_sum += loss.double() * len(yb)
            correct += right.double()
        losses.append(loss_sum / len(y))
        accs.append(correct / len(y))
    return {"loss": torch.cat(losses).cpu(), "accuracy": torch.cat(accs).cpu()}


def loss_slice(model: ModelLike, state: StateT, x: torch.Tensor, y: torch.Tensor, *,
               direction: StateT | None = None, span: float = 1.0, num: int = 21,
               seed: int = 0, ignore_1d: bool = True, **eval_options) -> dict[str, torch.Tensor]:
    """1-D slice L(w + a d), a in [-span, span]: {alphas, loss, accuracy}; d random by default."""
    if direction is None:
        (direction,) = model_directions(model, state, 1, seed=seed, ignore_1d=ignore_1d)
    alphas = torch.linspace(-span, span, num, dtype=torch.float64)
    out = evaluate_points(model, state, [direction], alphas[:, None], x, y, **eval_options)
    return {"alphas": alphas, **out}


def loss_plane(model: ModelLike, state: StateT, x: torch.Tensor, y: torch.Tensor, *,
               directions: Sequence[StateT] | None = None, span: float = 1.0, num: int = 21,
               seed: int = 0, ignore_1d: bool = True, **eval_options) -> dict[str, torch.Tensor]:
    """2-D plane L(w + a d1 + b d2) on a num x num grid: {alphas, betas, loss, accuracy}.

    ``loss[i, j]`` is at (a = alphas[j], b = betas[i]) (rows follow the second direction,
    as ``meshgrid(indexing="ij")`` of (betas, alphas) and matplotlib's contour expect).
    """
    if directions is None:
        directions = model_directions(model, state, 2, seed=seed, ignore_1d=ignore_1d)
    alphas = betas = torch.linspace(-span, span, num, dtype=torch.float64)
    bb, aa = torch.meshgrid(betas, alphas, indexing="ij")
    coords = torch.stack([aa.reshape(-1), bb.reshape(-1)], dim=1)
    out = evaluate_points(model, state, directions, coords, x, y, **eval_options)
    return {"alphas": alphas, "betas": betas,
            **{k: v.reshape(num, num) for k, v in out.items()}}


def interpolation_path(model: ModelLike, state_a: StateT, state_b: StateT, x: torch.Tensor,
                       y: torch.Tensor, *, ts: Sequence[float] | torch.Tensor | None = None,
                       **eval_options) -> dict[str, torch.Tensor]:
    """Loss and accuracy along (1 - t) a + t b (default t in [-0.5, 1.5], 41 points): {t, ...}.

    Float buffers (BatchNorm statistics) are interpolated with the weights; integer
    buffers come from ``a``. Beyond [0, 1] the path extrapolates.
    """
    # Default: steps of 0.05 that hit t = 0 and t = 1 exactly (linspace would miss them).
    ts = torch.arange(-10, 31, dtype=torch.float64) / 20 if ts is None else \
        torch.as_tensor(ts, dtype=torch.float64)
    delta = OrderedDict((n, state_b[n].to(a.device) - a if a.is_floating_point()
                         else torch.zeros_like(a)) for n, a in state_a.items())
    out = evaluate_points(model, state_a, [delta], ts[:, None], x, y, **eval_options)
    return {"t": ts, **out}


# ---- one table of numbers per model -------------------------------------------------------------
def sharpness_table(models: Mapping[str, StateT], model_factory: ModelLike, x: torch.Tensor,
                    y: torch.Tensor, *, loss_fn: LossFn = F.cross_entropy, rho: float = 0.05,
                    hessian_samples: int | None = None, power_iters: int = 50,
                    trace_samples: int = 20, batch_size: int = 500, seed: int = 0,
                    device: torch.device | str | None = None) -> pd.DataFrame:
    """Loss, accuracy, top Hessian eigenvalue, Hessian trace and SAM sharpness per model.

    Loss and accuracy use all of (x, y); the curvature measures use its first
    ``hessian_samples`` rows (default all), the same rows and seed for every model, so
    rows of the table differ only by the model.
    """
    hx, hy = (x, y) if hessian_samples is None else (x[:hessian_samples], y[:hessian_samples])
    common = {"loss_fn": loss_fn, "batch_size": batch_size, "device": device}
    rows = []
    for name, state in models.items():
        state = clone_state(state)
        here = evaluate_points(model_factory, state, [], torch.zeros(1, 0), x, y, **common)
        eig = top_eigenvalue(model_factory, state, hx, hy, iters=power_iters, seed=seed, **common)
        trace = hessian_trace(model_factory, state, hx, hy, samples=trace_samples, seed=seed,
                              **common)
        sam = sam_sharpness(model_factory, state, hx, hy, rho=rho, **common)
        rows.append({"model": name, "loss": float(here["loss"][0]),
                     "accuracy": float(here["accuracy"][0]),
                     "top_eigenvalue": eig["eigenvalue"], "trace": trace["trace"],
                     "trace_stderr": trace["stderr"], f"sam_rho={rho:g}": sam["sharpness"]})
    return pd.DataFrame(rows).set_index("model")
