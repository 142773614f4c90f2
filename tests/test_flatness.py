"""Flatness measures against references: known Hessians, brute-force grids, analytic landscapes."""


import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flnotes.engine.state import state_add
from flnotes.flatness.hessian import hessian_trace, sam_sharpness, top_eigenvalue
from flnotes.flatness.surfaces import (
    evaluate_points,
    interpolation_path,
    loss_plane,
    loss_slice,
    model_directions,
    random_direction,
    sharpness_table,
)


class Quadratic(nn.Module):
    """Loss 0.5 w^T A w for every row (output (B, 1)): Hessian A, gradient A w."""

    def __init__(self, a: torch.Tensor, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("a", a)
        self.w = nn.Parameter(w.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = 0.5 * self.w @ self.a @ self.w
        return value.expand(len(x), 1)


def mean_out(out, target):
    return out.mean()


def half_mse(out, target):
    return 0.5 * (out.squeeze(1) - target).pow(2).mean()


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3))


def cnn_with_stats() -> tuple[nn.Module, dict, torch.Tensor, torch.Tensor]:
    """A small conv/BN/linear model whose BN running stats are not the defaults."""
    model = small_cnn()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(37, 2, 6, 6, generator=g), torch.randint(0, 3, (37,), generator=g)
    model.train()
    with torch.no_grad():
        model(x * 2 + 1)  # moves running_mean / running_var away from 0 / 1
    return model, model.state_dict(), x, y


def spd_matrix(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.tensor([6.0, 2.5, 1.5, 1.0, 0.7, 0.5, 0.2, 0.1][:n], dtype=torch.float64)
    return (q * eig) @ q.T


# ---- directions ------------------------------------------------------------------------------
def test_filter_normalised_directions_match_filter_norms_and_skip_bias_bn():
    model, state, _, _ = cnn_with_stats()
    (d,) = model_directions(model, state, 1, seed=3)
    for name, w in state.items():
        if w.dim() >= 2:  # conv kernel (4, 2, 3, 3) and linear weight (3, 64): per filter/row
            rows_d = d[name].reshape(len(w), -1).norm(dim=1)
            rows_w = w.reshape(len(w), -1).norm(dim=1)
            assert torch.allclose(rows_d, rows_w, rtol=1e-5)
            assert not torch.equal(d[name], w)  # random, not the weights themselves
        else:  # biases, BN weight/bias, running stats, num_batches_tracked
            assert not d[name].any(), name
    # Seeded: the same seed gives the same direction, another index another one.
    (again,) = model_directions(model, state, 1, seed=3)
    assert all(torch.equal(d[n], again[n]) for n in d)
    other = random_direction(state, seed=3, index=1)
    assert not torch.equal(other["0.weight"], d["0.weight"])
    # ignore_1d=False keeps 1-D parameters (whole layer = one filter) but never buffers.
    kept = random_direction(state, seed=3, ignore_1d=False,
                            buffers=[n for n, _ in model.named_buffers()])
    for name in ("0.bias", "1.weight", "1.bias", "4.bias"):
        assert torch.isclose(kept[name].norm(), state[name].norm(), rtol=1e-5)
    assert not kept["1.running_var"].any() and not kept["1.num_batches_tracked"].any()


def planes_of(model, states, x, y, norm):
    """The loss plane around each state, with directions drawn from one seed."""
    return [loss_plane(model, s, x, y, num=5, seed=2,
                       directions=[random_direction(s, seed=2, index=k, norm=norm,
                                                    buffers=[n for n, _ in model.named_buffers()])
                                   for k in range(2)])["loss"] for s in states]


def test_normalised_planes_ignore_relu_layer_rescaling():
    """Li et al. Sec. 4.1: a ReLU layer times 10 and the next layer over 10 is the same net."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    state = model.state_dict()
    scaled = dict(state)
    scaled["0.weight"], scaled["0.bias"] = state["0.weight"] * 10, state["0.bias"] * 10
    scaled["2.weight"] = state["2.weight"] / 10
    for norm in ("filter", "layer"):
        a, b = planes_of(model, (state, scaled), x, y, norm)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), norm
    a, b = planes_of(model, (state, scaled), x, y, "none")
    assert torch.isclose(a[2, 2], b[2, 2], rtol=1e-5) and not torch.allclose(a, b, rtol=1e-2)


def test_filter_normalised_plane_ignores_per_filter_scale_before_batchnorm():
    """Conv filter i times c_i (BN statistics adjusted) is the same net; only per-filter
    normalisation gives the same plane, one scale per layer cannot follow c_i."""
    model, state, x, y = cnn_with_stats()
    c = torch.tensor([0.3, 0.7, 1.5, 3.0])
    scaled = dict(state)
    scaled["0.weight"] = state["0.weight"] * c[:, None, None, None]
    scaled["0.bias"] = state["0.bias"] * c
    scaled["1.running_mean"] = state["1.running_mean"] * c
    scaled["1.running_var"] = state["1.running_var"] * c**2
    a, b = planes_of(model, (state, scaled), x, y, "filter")
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    for norm in ("layer", "none"):
        a, b = planes_of(model, (state, scaled), x, y, norm)
        assert torch.isclose(a[2, 2], b[2, 2], rtol=1e-4) and not torch.allclose(a, b, rtol=1e-2)


# ---- batched surfaces ------------------------------------------------------------------------
def pointwise_losses(model, state, directions, coords, x, y):
    """Reference: load every perturbed state into the module and run it in eval mode."""
    model.eval()
    losses, accs = [], []
    for c in coords.tolist():
        s = dict(state)
        for k, d in enumerate(directions):
            s = state_add(s, d, scale=c[k])
        model.load_state_dict(s)
        with torch.no_grad():
            out = model(x)
        losses.append(float(F.cross_entropy(out, y)))
        accs.append(float((out.argmax(1) == y).float().mean()))
    model.load_state_dict(state)
    return torch.tensor(losses, dtype=torch.float64), torch.tensor(accs, dtype=torch.float64)


def test_batched_plane_equals_one_point_at_a_time():
    model, state, x, y = cnn_with_stats()
    state = {n: t.clone() for n, t in state.items()}
    plane = loss_plane(model, state, x, y, num=5, span=0.8, seed=4, batch_size=10,
                       chunk_size=7)  # uneven data batches and chunks
    dirs = model_directions(model, state, 2, seed=4)
    bb, aa = torch.meshgrid(plane["betas"], plane["alphas"], indexing="ij")
    coords = torch.stack([aa.reshape(-1), bb.reshape(-1)], 1)
    ref_loss, ref_acc = pointwise_losses(model, state, dirs, coords, x, y)
    assert torch.allclose(plane["loss"].reshape(-1), ref_loss, rtol=1e-5, atol=1e-6)
    assert torch.allclose(plane["accuracy"].reshape(-1), ref_acc)
    assert plane["loss"].std() > 0  # the grid really moves the model
    # The centre of the plane and of a slice is the model itself.
    sl = loss_slice(model, state, x, y, num=5, seed=4)
    centre = pointwise_losses(model, state, [], torch.zeros(1, 0), x, y)[0]
    assert torch.isclose(plane["loss"][2, 2], centre[0], rtol=1e-5)
    assert torch.isclose(sl["loss"][2], centre[0], rtol=1e-5)


def test_interpolation_endpoints_equal_the_two_models():
    model_a, state_a, x, y = cnn_with_stats()
    model_b = small_cnn()
    torch.manual_seed(5)
    for p in model_b.parameters():
        p.data.normal_()
    model_b.train()
    with torch.no_grad():
        model_b(x - 1)  # other running statistics than model a
    state_b = model_b.state_dict()
    path = interpolation_path(model_a, state_a, state_b, x, y, ts=[-0.5, 0.0, 0.5, 1.0, 1.5])
    for t, state in ((0.0, state_a), (1.0, state_b)):
        ref = pointwise_losses(model_a, state, [], torch.zeros(1, 0), x, y)
        i = path["t"].tolist().index(t)
        assert torch.isclose(path["loss"][i], ref[0][0], rtol=1e-5)
        assert torch.isclose(path["accuracy"][i], ref[1][0])
    default = interpolation_path(model_a, state_a, state_b, x, y)
    assert default["t"][0] == -0.5 and default["t"][-1] == 1.5


def test_toy_plane_equals_the_analytic_landscape():
    from flnotes.config import RunConfig
    from flnotes.toy import build_task, state_of

    task = build_task(RunConfig(dataset="toy", num_clients=3, clients_per_round=3))
    fed = task.federation
    rows = torch.tensor([[c, 0.0, 0.0] for c in range(3)])  # noise-free: the mean landscape
    zeros = torch.zeros(3, dtype=torch.long)
    center = state_of((-0.3, 0.4))
    unit = [state_of((1.0, 0.0)), state_of((0.0, 1.0))]
    plane = loss_plane(task.model_factory, center, rows, zeros, directions=unit, span=1.5,
                       num=7, loss_fn=task.loss_fn)
    bb, aa = torch.meshgrid(plane["betas"], plane["alphas"], indexing="ij")
    points = torch.stack([aa - 0.3, bb + 0.4], dim=-1)
    assert torch.allclose(plane["loss"], fed.global_loss(points), atol=1e-5)
    # Random directions: the toy's two 0-D layers are kept (ignore_1d=False).
    dirs = model_directions(task.model_factory, center, 2, seed=1, ignore_1d=False)
    d = torch.tensor([[float(v["x"]), float(v["y"])] for v in dirs], dtype=torch.float64)
    assert torch.allclose(d.abs(), torch.tensor([[0.3, 0.4]] * 2, dtype=torch.float64))
    plane = loss_plane(task.model_factory, center, rows, zeros, directions=dirs, num=5,
                       loss_fn=task.loss_fn)
    bb, aa = torch.meshgrid(plane["betas"], plane["alphas"], indexing="ij")
    points = torch.tensor([-0.3, 0.4]) + aa[..., None] * d[0] + bb[..., None] * d[1]
    assert torch.allclose(plane["loss"], fed.global_loss(points), atol=1e-5)


# ---- curvature -------------------------------------------------------------------------------
def test_eigenvalue_and_trace_match_linear_regression_hessian():
    """0.5 * mean squared error of a linear model with bias: H = Z^T Z / n, Z = [X, 1]."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=g) * torch.tensor([3.0, 1.5, 1.0, 1.0, 0.5, 0.2])
    y = torch.randn(50, generator=g)
    model = nn.Linear(6, 1)
    z = torch.cat([x, torch.ones(50, 1)], 1).double()
    h = z.T @ z / 50
    opts = {"loss_fn": half_mse, "batch_size": 16}  # 16, 16, 16, 2: weighted batches
    eig = top_eigenvalue(model, model.state_dict(), x, y, iters=100, tol=1e-7, **opts)
    assert eig["eigenvalue"] == pytest.approx(float(torch.linalg.eigvalsh(h)[-1]), rel=1e-4)
    tr = hessian_trace(model, model.state_dict(), x, y, samples=100, seed=2, **opts)
    assert abs(tr["trace"] - float(h.trace())) < 4 * tr["stderr"]
    assert tr["stderr"] < 0.1 * float(h.trace())


def test_quadratic_eigenvalue_trace_and_sam_are_exact():
    a = spd_matrix(8)
    w = torch.linspace(-1.0, 1.0, 8)
    model = Quadratic(a.float(), w)
    x, y = torch.zeros(10, 1), torch.zeros(10)
    opts = {"loss_fn": mean_out, "batch_size": 4}
    eig = top_eigenvalue(model, model.state_dict(), x, y, iters=100, tol=1e-8, **opts)
    assert eig["eigenvalue"] == pytest.approx(6.0, rel=1e-4)
    # Diagonal A: v^T A v = trace(A) for every Rademacher v, so Hutchinson is exact.
    diag = Quadratic(torch.diag(torch.arange(1.0, 9.0)), w)
    tr = hessian_trace(diag, diag.state_dict(), x, y, samples=3, **opts)
    assert tr["trace"] == pytest.approx(36.0, rel=1e-6) and tr["stderr"] < 1e-6
    # SAM: L(w + eps) - L(w) = rho ||g|| + rho^2/2 g^T A g / ||g||^2 with g = A w.
    wd, ad = w.double(), a
    gvec = ad @ wd
    for rho in (0.01, 0.1):
        exact = rho * gvec.norm() + 0.5 * rho**2 * (gvec @ ad @ gvec) / (gvec @ gvec)
        sam = sam_sharpness(model, model.state_dict(), x, y, rho=rho, **opts)
        assert sam["sharpness"] == pytest.approx(float(exact), rel=1e-3)
        assert sam["loss"] == pytest.approx(float(0.5 * wd @ ad @ wd), rel=1e-5)
    first_order = 0.01 * float(gvec.norm())  # the estimate is rho ||g|| + O(rho^2)
    small = sam_sharpness(model, model.state_dict(), x, y, rho=0.01, **opts)["sharpness"]
    assert small == pytest.approx(first_order, rel=0.01)


def test_sharpness_table_matches_the_known_quadratic():
    a = torch.diag(torch.tensor([4.0, 1.0, 0.5]))
    model = Quadratic(a, torch.zeros(3))
    states = {"near": {"a": a, "w": torch.tensor([0.1, 0.2, 0.3])},
              "far": {"a": a * 2, "w": torch.tensor([1.0, -1.0, 2.0])}}
    x, y = torch.zeros(6, 1), torch.zeros(6, dtype=torch.long)
    table = sharpness_table(states, model, x, y, loss_fn=mean_out, rho=0.05, trace_samples=2)
    assert list(table.index) == ["near", "far"]
    for name, s in states.items():
        row = table.loc[name]
        wd, ad = s["w"].double(), s["a"].double()
        assert row["loss"] == pytest.approx(float(0.5 * wd @ ad @ wd), rel=1e-5)
        assert row["top_eigenvalue"] == pytest.approx(float(ad.diagonal().max()), rel=1e-3)
        assert row["trace"] == pytest.approx(float(ad.trace()), rel=1e-5)
        gvec = ad @ wd
        sam = 0.05 * gvec.norm() + 0.5 * 0.05**2 * (gvec @ ad @ gvec) / (gvec @ gvec)
        assert row["sam_rho=0.05"] == pytest.approx(float(sam), rel=1e-3)
        assert row["accuracy"] == 1.0  # one output column, label 0


def test_evaluate_points_checks_coordinate_shape():
    model, state, x, y = cnn_with_stats()
    dirs = model_directions(model, state, 2)
    with pytest.raises(ValueError, match="columns"):
        evaluate_points(model, state, dirs, torch.zeros(3, 1), x, y)


# ---- figures ---------------------------------------------------------------------------------
def test_surface_windows_follow_each_model_and_the_typical_rise():
    import numpy as np

    from flnotes.flatness.plots import surface_windows

    bowl = np.add.outer(np.linspace(-1, 1, 5) ** 2, np.linspace(-1, 1, 5) ** 2)
    arrays = [1.0 + bowl, 1.1 + bowl, 5.0 + 20 * bowl]  # the last: higher and sharper
    floors, height = surface_windows(arrays)
    assert floors == pytest.approx([1.0, 1.1, 5.0])
    assert height == pytest.approx(np.percentile(bowl, 98))  # the typical rise, not the outlier's


def test_surfaces_cut_values_above_the_window_instead_of_flattening_them(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from mpl_toolkits.mplot3d import Axes3D

    from flnotes.flatness.plots import plot_surfaces

    drawn = []
    original = Axes3D.plot_surface

    def spy(self, x, y, z, *args, **kwargs):
        drawn.append(np.asarray(z))
        return original(self, x, y, z, *args, **kwargs)

    monkeypatch.setattr(Axes3D, "plot_surface", spy)
    axis = torch.linspace(-1, 1, 5)
    bowl = axis[:, None] ** 2 + axis[None, :] ** 2
    planes = {name: {"alphas": axis, "betas": axis, "loss": base + scale * bowl}
              for name, base, scale in [("a", 1.0, 1.0), ("b", 1.1, 1.0), ("sharp", 5.0, 2.0)]}
    fig = plot_surfaces(planes)
    plt.close(fig)
    sharp = drawn[2]
    top = fig.axes[2].get_zlim()[1]
    assert fig.axes[2].get_zlim()[0] == pytest.approx(5.0)  # its own floor, not the others'
    # Points above the window are left out (NaN), not set to the ceiling (a flat lid).
    expected = (5.0 + 2.0 * bowl).numpy() <= top + 1e-12
    assert (np.isfinite(sharp) == expected).all() and 0 < expected.sum() < expected.size
    assert np.nanmax(sharp) <= top
