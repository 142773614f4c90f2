"""Analytic 2-D loss landscapes built from wells: flat and sharp basins, per-client shifts.

A landscape is a gentle quadratic bowl minus Gaussian wells,
``L(p) = bowl/2 * ||p - bowl_center||^2 - sum_w depth_w * exp(-||p - c_w||^2 / (2 width_w^2))``.
A wide well is a flat basin (curvature at its bottom about depth / width^2 is small), a
narrow one a sharp basin. A :class:`Federation` gives every client its own landscape: the
wells are shifted (and rescaled) per client so that the clients' flat basins overlap while
their sharp basins do not, as in FedMut's Figure 1; the global landscape is the clients'
mean. Everything is pure torch and vectorised over points of shape ``(..., 2)``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

LossFn = Callable[[torch.Tensor], torch.Tensor]  # points (..., 2) -> losses (...)


@dataclass(frozen=True)
class Well:
    """One Gaussian well: where it is, how deep and how wide; ``kind`` is flat or sharp."""

    center: tuple[float, float]
    depth: float
    width: float
    kind: str = "flat"


class Landscape:
    """A quadratic bowl minus Gaussian wells; call it on points (..., 2) to get losses (...)."""

    def __init__(self, wells: Sequence[Well], bowl: float = 0.05,
                 bowl_center: tuple[float, float] = (0.0, 0.0), name: str = "") -> None:
        self.wells = tuple(wells)
        if not self.wells or any(w.depth <= 0 or w.width <= 0 for w in self.wells):
            raise ValueError("a landscape needs at least one well, each with depth, width > 0")
        self.bowl = float(bowl)
        self.bowl_center = (float(bowl_center[0]), float(bowl_center[1]))
        self.name = name
        self.centers = torch.tensor([w.center for w in self.wells], dtype=torch.float64)
        self.depths = torch.tensor([w.depth for w in self.wells], dtype=torch.float64)
        self.widths = torch.tensor([w.width for w in self.wells], dtype=torch.float64)

    def __call__(self, points: torch.Tensor) -> torch.Tensor:
        """Loss at each point: (..., 2) -> (...), in the points' dtype."""
        dtype, device = points.dtype, points.device
        centers = self.centers.to(dtype=dtype, device=device)  # (W, 2)
        inv = (0.5 / self.widths**2).to(dtype=dtype, device=device)  # (W,)
        sq = (points.unsqueeze(-2) - centers).pow(2).sum(-1)  # (..., W)
        wells = (self.depths.to(dtype=dtype, device=device) * torch.exp(-sq * inv)).sum(-1)
        bowl_c = torch.tensor(self.bowl_center, dtype=dtype, device=device)
        return 0.5 * self.bowl * (points - bowl_c).pow(2).sum(-1) - wells

    def centers_of(self, kind: str) -> torch.Tensor:
        """Centres (n, 2) of the wells of one kind ("flat" or "sharp")."""
        return self.centers[[i for i, w in enumerate(self.wells) if w.kind == kind]]

    def shifted(self, delta: Sequence[float]) -> Landscape:
        """The same landscape moved by ``delta`` (e.g. a test loss next to the train loss)."""
        dx, dy = float(delta[0]), float(delta[1])
        wells = [Well((w.center[0] + dx, w.center[1] + dy), w.depth, w.width, w.kind)
                 for w in self.wells]
        return Landscape(wells, self.bowl, (self.bowl_center[0] + dx, self.bowl_center[1] + dy),
                         name=f"{self.name} shifted")


def mean_landscape(landscapes: Sequence[Landscape], name: str = "global") -> Landscape:
    """The exact mean of landscapes that share one bowl: all wells, depths divided by n."""
    n = len(landscapes)
    bowl, center = landscapes[0].bowl, landscapes[0].bowl_center
    if any(la.bowl != bowl or la.bowl_center != center for la in landscapes):
        raise ValueError("mean_landscape needs landscapes with the same bowl")
    wells = [Well(w.center, w.depth / n, w.width, w.kind) for la in landscapes for w in la.wells]
    return Landscape(wells, bowl, center, name=name)


class Federation:
    """Client landscapes, their mean (the global loss) and the flat basin that counts as good."""

    def __init__(self, clients: Sequence[Landscape], flat_radius: float, sharp_radius: float,
                 name: str = "") -> None:
        self.clients = list(clients)
        self.name = name
        self.global_landscape = mean_landscape(self.clients)
        # The good region: a disc around the mean of the clients' flat-well centres.
        self.flat_center = torch.stack([c.centers_of("flat").mean(0) for c in self.clients]).mean(0)
        self.flat_radius = float(flat_radius)
        # The bad regions: discs around every client's sharp-well centre.
        self.sharp_centers = torch.unique(
            torch.cat([c.centers_of("sharp") for c in self.clients]), dim=0)
        self.sharp_radius = float(sharp_radius)
        # Stacked parameters (C, W, ...) so all clients are evaluated in one vectorised call.
        self._centers = torch.stack([c.centers for c in self.clients])  # (C, W, 2)
        self._log_depths = torch.stack([c.depths for c in self.clients]).log()  # (C, W)
        self._neg_inv = -0.5 / torch.stack([c.widths for c in self.clients]) ** 2  # (C, W)
        self._bowl = self.clients[0].bowl
        self._bowl_center = torch.tensor(self.clients[0].bowl_center, dtype=torch.float64)
        self._cache: dict = {}

    @property
    def num_clients(self) -> int:
        """How many client landscapes."""
        return len(self.clients)

    def _params(self, dtype: torch.dtype, device: torch.device) -> tuple:
        key = (dtype, device)
        if key not in self._cache:  # converting once keeps the toy's forward cheap
            self._cache[key] = tuple(t.to(dtype=dtype, device=device) for t in (
                self._centers, self._log_depths, self._neg_inv, self._bowl_center))
        return self._cache[key]

    def client_losses(self, points: torch.Tensor) -> torch.Tensor:
        """Every client's loss at each point: (..., 2) -> (..., C)."""
        centers, log_depths, neg_inv, bowl_c = self._params(points.dtype, points.device)
        # Few, fused ops: this is the toy model's forward pass, run at every SGD step.
        sq = (points[..., None, None, :] - centers).square().sum(-1)  # (..., C, W)
        wells = torch.addcmul(log_depths, sq, neg_inv).exp().sum(-1)  # sum_w d_w e^{-r^2/2s^2}
        bowl = (points - bowl_c).square().sum(-1, keepdim=True)
        return torch.add(-wells, bowl, alpha=0.5 * self._bowl)

    def global_loss(self, points: torch.Tensor) -> torch.Tensor:
        """The global loss (mean over clients) at each point: (..., 2) -> (...)."""
        return self.client_losses(points).mean(-1)

    def in_flat_basin(self, points: torch.Tensor) -> torch.Tensor:
        """True where a point lies within ``flat_radius`` of the flat basin's centre."""
        center = self.flat_center.to(dtype=points.dtype, device=points.device)
        return (points - center).norm(dim=-1) <= self.flat_radius

    def in_sharp_basin(self, points: torch.Tensor) -> torch.Tensor:
        """True where a point lies within ``sharp_radius`` of some client's sharp-well centre."""
        centers = self.sharp_centers.to(dtype=points.dtype, device=points.device)
        dist = (points.unsqueeze(-2) - centers).norm(dim=-1)  # (..., S)
        return dist.min(-1).values <= self.sharp_radius


# ---- builders ------------------------------------------------------------------------------
def client_offsets(num_clients: int, shift: float) -> torch.Tensor:
    """Offsets (C, 2) spread evenly along x from -shift to +shift (0 for a single client)."""
    if num_clients == 1:
        return torch.zeros(1, 2, dtype=torch.float64)
    xs = torch.linspace(-shift, shift, num_clients, dtype=torch.float64)
    return torch.stack([xs, torch.zeros_like(xs)], dim=-1)


def fedmut_fig1(num_clients: int = 2, shift: float = 1.0, flat_center=(0.0, 1.2),
                sharp_center=(0.0, -1.0), flat_depth: float = 1.0, flat_width: float = 0.9,
                sharp_depth: float = 1.2, sharp_width: float = 0.2,
                shoulder_depth: float = 0.35, shoulder_width: float = 0.6,
                flat_spread: float = 0.25, depth_spread: float = 0.2,
                bowl: float = 0.05) -> Federation:
    """FedMut Fig. 1: flat basin on top, sharp basin below; clients shift the sharp one more.

    Client k moves its sharp well (a narrow core inside a wider shoulder, so that a
    gradient step notices it from a distance) by ``shift * u_k`` and its flat well by only
    ``flat_spread * shift * u_k``: the flat basins overlap, the sharp ones do not once
    ``shift`` exceeds a couple of sharp widths. ``depth_spread`` makes the clients' sharp
    wells unequally deep (client 0 deepest), so the mean landscape prefers one of them.
    """
    clients = []
    for k, (ox, oy) in enumerate(client_offsets(num_clients, shift).tolist()):
        scale = 1.0 + depth_spread * (1.0 - 2.0 * k / max(num_clients - 1, 1))
        wells = flat_and_sharp(
            (flat_center[0] + flat_spread * ox, flat_center[1] + flat_spread * oy),
            (sharp_center[0] + ox, sharp_center[1] + oy), flat_depth, flat_width,
            sharp_depth * scale, sharp_width, shoulder_depth * scale, shoulder_width).wells
        clients.append(Landscape(wells, bowl, name=f"client {k}"))
    return Federation(clients, flat_radius=1.5 * flat_width, sharp_radius=2.5 * sharp_width,
                      name="fedmut-fig1")


def flat_and_sharp(flat_center=(-1.5, 0.0), sharp_center=(1.5, 0.0), flat_depth: float = 1.0,
                   flat_width: float = 0.9, sharp_depth: float = 1.2, sharp_width: float = 0.2,
                   shoulder_depth: float = 0.35, shoulder_width: float = 0.6,
                   bowl: float = 0.05) -> Landscape:
    """One landscape with a flat basin on the left and a sharp one on the right (FedMut Fig. 2)."""
    return Landscape([
        Well(tuple(flat_center), flat_depth, flat_width, "flat"),
        Well(tuple(sharp_center), sharp_depth, sharp_width, "sharp"),
        Well(tuple(sharp_center), shoulder_depth, shoulder_width, "sharp"),
    ], bowl, name="flat and sharp")


def flat_and_sharp_minima(landscape: Landscape) -> torch.Tensor:
    """The (flat, sharp) minima (2, 2) of a :func:`flat_and_sharp` landscape.

    Newton's method from the first flat and the first sharp well's centre, where the well's
    curvature dominates the bowl's: three or four steps reach float64 precision (gradient
    about 1e-15), where 1,500 steps of gradient descent took a slider's redraw a quarter
    of a second. A point where the Hessian is not positive definite would be a saddle, not
    a minimum: that raises instead of being returned.
    """
    starts = torch.stack([landscape.centers_of("flat")[0], landscape.centers_of("sharp")[0]])
    return newton_minima(landscape, starts)


def newton_minima(fn: LossFn, points, steps: int = 50, tol: float = 1e-14) -> torch.Tensor:
    """Newton's method p <- p - H(p)^-1 grad(p) from every point (n, 2) at once; the end
    points, checked to be minima (positive definite Hessian)."""
    p = torch.as_tensor(points, dtype=torch.float64).clone()
    # Reverse over reverse: torch.func.hessian's forward mode loads TorchScript decompositions
    # on first use (a second, and a deprecation warning in the notebook).
    hessians = torch.func.vmap(torch.func.jacrev(torch.func.jacrev(fn)))
    converged = False
    for _ in range(steps):
        step = torch.linalg.solve(hessians(p), gradient(fn, p).unsqueeze(-1)).squeeze(-1)
        p = p - step
        if not torch.isfinite(p).all():
            break
        if step.abs().max() < tol:
            converged = True
            break
    # Every check is written so that NaN fails it.
    if not converged or not (torch.linalg.eigvalsh(hessians(p))[..., 0] > 0).all():
        raise ValueError("Newton's method did not settle on a minimum (it diverged, or ended "
                         "where the loss does not curve up every way): start it nearer one, "
                         "inside the well")
    return p


def fedmut_fig2(num_clients: int = 2, shift: float = 0.3, **kwargs) -> Federation:
    """Flat left, sharp right (FedMut Fig. 2), every client's wells shifted a little along y.

    The bowl stays where it is for every client (a global loss is a mean over one bowl, as in
    :func:`fedmut_fig1`): moving it with the wells made two or more clients unbuildable.
    """
    base = flat_and_sharp(**kwargs)
    offsets = client_offsets(num_clients, shift)
    clients = [Landscape(base.shifted((0.0, float(offsets[k, 0]))).wells, base.bowl,
                         base.bowl_center, name=f"client {k}") for k in range(num_clients)]
    flat, sharp = base.wells[:2]  # flat_and_sharp's order; its widths, defaults included
    return Federation(clients, flat_radius=1.5 * flat.width, sharp_radius=2.5 * sharp.width,
                      name="fedmut-fig2")


LANDSCAPES: dict[str, Callable[..., Federation]] = {
    "fedmut-fig1": fedmut_fig1,
    "fedmut-fig2": fedmut_fig2,
}


def make_federation(name: str = "fedmut-fig1", **options) -> Federation:
    """A named federation of client landscapes (see ``LANDSCAPES``) with options passed on."""
    if name not in LANDSCAPES:
        raise ValueError(f"unknown landscape {name!r}; choose one of {sorted(LANDSCAPES)}")
    unknown = sorted(set(options) - set(landscape_options(name)) - {"num_clients"})
    if unknown:  # a typo in data_options: say what the landscape takes
        raise ValueError(f"landscape {name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"its options are {', '.join(landscape_options(name))}")
    return LANDSCAPES[name](**options)


def landscape_options(name: str) -> list[str]:
    """The shape options a named federation takes (num_clients aside: the run sets it)."""
    builder = LANDSCAPES[name]
    names = []
    for param in inspect.signature(builder).parameters.values():
        if param.kind is param.VAR_KEYWORD:  # fedmut-fig2 hands the rest to flat_and_sharp
            names += list(inspect.signature(flat_and_sharp).parameters)
        elif param.name != "num_clients":
            names.append(param.name)
    return names


# ---- evaluation, derivatives and sharpness ----------------------------------------------------
def grid(fn: LossFn, xlim=(-3.0, 3.0), ylim=(-3.0, 3.0), num: int = 121):
    """Evaluate ``fn`` on a num x num grid: returns X, Y, Z as (num, num) tensors."""
    xs = torch.linspace(xlim[0], xlim[1], num, dtype=torch.float64)
    ys = torch.linspace(ylim[0], ylim[1], num, dtype=torch.float64)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    with torch.no_grad():
        z = fn(torch.stack([gx, gy], dim=-1))
    return gx, gy, z


def line_slice(fn: LossFn, start, end, num: int = 201, extend: float = 0.0):
    """Loss along the segment start -> end (extended by ``extend`` of its length each side)."""
    a = torch.as_tensor(start, dtype=torch.float64)
    b = torch.as_tensor(end, dtype=torch.float64)
    t = torch.linspace(-extend, 1.0 + extend, num, dtype=torch.float64)
    with torch.no_grad():
        losses = fn(a + t[:, None] * (b - a))
    return t, losses


def gradient(fn: LossFn, points: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
    """Autograd gradient of the loss at each point: (..., 2) -> (..., 2).

    Points do not interact, so the gradient of the summed loss is every point's gradient.
    """
    with torch.enable_grad():
        p = points.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(p).sum(), p, create_graph=create_graph)
    return g if create_graph else g.detach()


def hessian(fn: LossFn, points: torch.Tensor) -> torch.Tensor:
    """Autograd Hessian at each point: (..., 2) -> (..., 2, 2), rows by double backward."""
    with torch.enable_grad():
        p = points.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(p).sum(), p, create_graph=True)
        rows = [torch.autograd.grad(g[..., i].sum(), p, retain_graph=True)[0] for i in range(2)]
    return torch.stack(rows, dim=-2).detach()


def top_eigenvalue(fn: LossFn, points: torch.Tensor) -> torch.Tensor:
    """Sharpness as the largest Hessian eigenvalue at each point: (..., 2) -> (...)."""
    return torch.linalg.eigvalsh(hessian(fn, points))[..., -1]


def worst_increase(fn: LossFn, points: torch.Tensor, rho: float, num_angles: int = 360,
                   num_radii: int = 16) -> torch.Tensor:
    """Sharpness as the worst loss increase within radius rho, by sampling the disc densely."""
    angles = torch.arange(num_angles, dtype=points.dtype) * (2 * math.pi / num_angles)
    radii = torch.linspace(0.0, rho, num_radii + 1, dtype=points.dtype)[1:]
    unit = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)  # (A, 2)
    offsets = (radii[:, None, None] * unit).reshape(-1, 2)  # (R*A, 2)
    with torch.no_grad():
        around = fn(points.unsqueeze(-2) + offsets)  # (..., R*A)
        here = fn(points)
    return (around.max(-1).values - here).clamp_min(0.0)


def sharpness(fn: LossFn, points: torch.Tensor, rho: float = 0.1) -> dict[str, torch.Tensor]:
    """Both sharpness measures at each point: top Hessian eigenvalue and worst increase."""
    return {"top_eigenvalue": top_eigenvalue(fn, points),
            "worst_increase": worst_increase(fn, points, rho)}


def descend(fn: LossFn, points, steps: int = 2000, lr: float = 0.02,
            return_path: bool = False) -> torch.Tensor:
    """Plain gradient descent from every point (..., 2) at once; the end points, or the path.

    With ``return_path`` the result is (steps + 1, ..., 2), the start included.
    """
    p = torch.as_tensor(points, dtype=torch.float64).clone()
    path = [p]
    for _ in range(steps):
        p = p - lr * gradient(fn, p)
        if return_path:
            path.append(p)
    return torch.stack(path) if return_path else p
