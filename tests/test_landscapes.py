"""Toy landscapes: autograd derivatives vs finite differences, sharpness of known quadratics."""

import math

import pytest
import torch

from flnotes.toy import landscapes as L


def _points(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 2, generator=g, dtype=torch.float64) * 4 - 2


def _finite_gradient(fn, points, h=1e-6):
    cols = []
    for i in range(2):
        e = torch.zeros(2, dtype=torch.float64)
        e[i] = h
        cols.append((fn(points + e) - fn(points - e)) / (2 * h))
    return torch.stack(cols, dim=-1)


FEDERATION = L.make_federation("fedmut-fig1", num_clients=3)
FUNCTIONS = {
    "single": L.flat_and_sharp(),
    "global": FEDERATION.global_loss,
    "client 1": lambda p: FEDERATION.client_losses(p)[..., 1],
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_gradient_matches_finite_differences(name):
    fn, p = FUNCTIONS[name], _points()
    assert torch.allclose(L.gradient(fn, p), _finite_gradient(fn, p), atol=1e-6)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_hessian_matches_finite_differences_of_the_gradient(name):
    fn, p = FUNCTIONS[name], _points(seed=1)
    h = 1e-5
    rows = []
    for i in range(2):
        e = torch.zeros(2, dtype=torch.float64)
        e[i] = h
        rows.append((L.gradient(fn, p + e) - L.gradient(fn, p - e)) / (2 * h))
    numeric = torch.stack(rows, dim=-2)  # d/dp_i of the gradient: row i
    hess = L.hessian(fn, p)
    assert hess.shape == (7, 2, 2)
    assert torch.allclose(hess, numeric, atol=1e-5)
    assert torch.allclose(hess, hess.transpose(-1, -2), atol=1e-10)


def _rotated_quadratic(lam_top, lam_low, angle):
    """0.5 * (lam_top u^2 + lam_low v^2) in a frame rotated by ``angle``."""
    c, s = math.cos(angle), math.sin(angle)

    def fn(p):
        u = c * p[..., 0] + s * p[..., 1]
        v = -s * p[..., 0] + c * p[..., 1]
        return 0.5 * (lam_top * u**2 + lam_low * v**2)

    return fn


@pytest.mark.parametrize("angle", [0.0, math.pi / 6, 1.234])
def test_sharpness_of_a_known_quadratic(angle):
    lam, rho = 7.0, 0.3
    fn = _rotated_quadratic(lam, 0.5, angle)
    points = _points(5)
    top = L.top_eigenvalue(fn, points)
    assert torch.allclose(top, torch.full_like(top, lam), atol=1e-9)
    # The worst increase from the minimum is 0.5 * lambda * rho^2, along the top eigenvector;
    # sampling 3600 directions finds it to within cos^2 of half a step.
    worst = L.worst_increase(fn, torch.zeros(2, dtype=torch.float64), rho, num_angles=3600)
    assert worst.item() == pytest.approx(0.5 * lam * rho**2, rel=1e-5)
    if angle == math.pi / 6:  # an exactly sampled direction: exact
        exact = L.worst_increase(fn, torch.zeros(2, dtype=torch.float64), rho, num_angles=12)
        assert exact.item() == pytest.approx(0.5 * lam * rho**2, rel=1e-12)


def test_sharp_minimum_is_sharper_than_flat_one():
    fn = L.flat_and_sharp()
    minima = L.descend(fn, torch.tensor([[-1.5, 0.0], [1.5, 0.0]]), steps=1500, lr=0.03)
    assert torch.allclose(L.gradient(fn, minima), torch.zeros(2, 2, dtype=torch.float64),
                          atol=1e-6)
    sharp = L.sharpness(fn, minima, rho=0.2)
    assert sharp["top_eigenvalue"][1] > 10 * sharp["top_eigenvalue"][0]
    assert sharp["worst_increase"][1] > 5 * sharp["worst_increase"][0]


def test_global_is_the_mean_of_clients_and_shapes():
    p = _points(11).reshape(11, 1, 2)
    per_client = FEDERATION.client_losses(p)
    assert per_client.shape == (11, 1, 3)
    manual = torch.stack([c(p) for c in FEDERATION.clients], dim=-1)
    assert torch.allclose(per_client, manual, atol=1e-12)
    assert torch.allclose(FEDERATION.global_landscape(p), per_client.mean(-1), atol=1e-12)
    assert torch.allclose(FEDERATION.global_loss(p), per_client.mean(-1), atol=1e-12)


def test_flat_basins_overlap_sharp_ones_do_not():
    fed = L.make_federation("fedmut-fig1", num_clients=2, shift=1.0)
    sharp = [c.centers_of("sharp")[0] for c in fed.clients]
    flat = [c.centers_of("flat")[0] for c in fed.clients]
    own = fed.client_losses(torch.stack(sharp))  # row j: every client at client j's sharp well
    for j in range(2):
        other = 1 - j
        # At client j's sharp minimum, client j is far better off than the other client.
        assert own[j, j] < own[j, other] - 1.0
    # The flat wells sit well inside each other's flat basin, so both clients are good there.
    assert (flat[0] - flat[1]).norm() < 0.5 * fed.flat_radius
    at_flat = fed.client_losses(fed.flat_center.double())
    assert (at_flat < -0.8).all()
    assert fed.in_flat_basin(fed.flat_center.double())
    assert not fed.in_flat_basin(sharp[0]) and fed.in_sharp_basin(sharp[0])
    assert not fed.in_sharp_basin(fed.flat_center.double())


def test_shifted_landscape_moves_every_point():
    base = L.flat_and_sharp()
    delta = torch.tensor([0.3, -0.2], dtype=torch.float64)
    moved = base.shifted(delta.tolist())
    p = _points()
    assert torch.allclose(moved(p + delta), base(p), atol=1e-12)


def test_grid_and_slices_evaluate_the_function():
    fn = FUNCTIONS["single"]
    gx, gy, z = L.grid(fn, (-1, 1), (-2, 2), 9)
    assert z.shape == (9, 9)
    assert torch.allclose(z[3, 5], fn(torch.stack([gx[3, 5], gy[3, 5]])))
    t, losses = L.line_slice(fn, (-1.0, 0.0), (1.0, 0.0), num=5)
    assert torch.allclose(losses[2], fn(torch.zeros(2, dtype=torch.float64)))


def test_bad_inputs_are_reported():
    with pytest.raises(ValueError, match="unknown landscape"):
        L.make_federation("nope")
    with pytest.raises(ValueError, match="depth, width"):
        L.Landscape([L.Well((0.0, 0.0), depth=-1.0, width=1.0)])


@pytest.mark.parametrize("sharp_width", [0.1, 0.2, 0.6])
def test_flat_and_sharp_minima_are_converged_minima(sharp_width):
    # Notebook 01's table and its shift figure both read these points: they must be minima
    # (zero gradient) for every width the slider offers, the narrowest included.
    land = L.flat_and_sharp(sharp_width=sharp_width)
    minima = L.flat_and_sharp_minima(land)
    assert L.gradient(land, minima).abs().max() < 1e-8
    assert minima[0, 0] < 0 < minima[1, 0]  # flat well on the left, sharp on the right
    top = L.top_eigenvalue(land, minima)
    assert (top > 0).all() and top[0] < top[1]


def test_a_mistyped_landscape_option_names_the_accepted_ones():
    with pytest.raises(ValueError, match="no option 'shfit'.*shift"):
        L.make_federation("fedmut-fig1", shfit=0.5)
    # fig2 hands its other options to flat_and_sharp: those are listed (and accepted) too
    with pytest.raises(ValueError, match="no option 'sharp_widht'.*sharp_width"):
        L.make_federation("fedmut-fig2", sharp_widht=0.2)
    assert "sharp_width" in L.landscape_options("fedmut-fig2")
    assert "num_clients" not in L.landscape_options("fedmut-fig1")


def test_newton_refuses_a_point_that_is_not_a_minimum():
    # Between the wells the loss bends down every way (notebook 01's dark patches), and on
    # the ridge between them Newton's step heads for the saddle: neither is a minimum.
    land = L.flat_and_sharp()
    for start in ([0.55, 1.2], [0.3, 0.0]):
        with pytest.raises(ValueError, match="did not settle on a minimum"):
            L.newton_minima(land, torch.tensor([start], dtype=torch.float64))
    # From inside a well it lands where gradient descent does.
    minima = L.newton_minima(land, torch.tensor([[-1.2, 0.1]], dtype=torch.float64))
    descended = L.descend(land, torch.tensor([[-1.2, 0.1]]), steps=3000, lr=0.05)
    assert torch.allclose(minima, descended, atol=1e-6)


@pytest.mark.parametrize("num_clients", [1, 2, 5])
def test_fedmut_fig2_builds_for_any_number_of_clients(num_clients):
    fed = L.make_federation("fedmut-fig2", num_clients=num_clients, shift=0.3)
    base = L.flat_and_sharp()
    points = torch.tensor([[-1.5, 0.1], [1.5, -0.2], [0.0, 0.7]], dtype=torch.float64)
    dys = L.client_offsets(num_clients, 0.3)[:, 0].tolist()
    for client, dy in zip(fed.clients, dys, strict=True):
        # each client's wells moved by dy along y, over the base's own bowl
        assert [w.center for w in client.wells] == [
            (w.center[0], w.center[1] + dy) for w in base.wells]
        assert (client.bowl, client.bowl_center) == (base.bowl, base.bowl_center)
    # the global loss is the clients' mean
    mean = torch.stack([client(points) for client in fed.clients]).mean(0)
    assert torch.allclose(fed.global_landscape(points), mean, atol=1e-12)


def test_fig2_marks_its_basins_by_the_widths_it_was_built_with():
    # fig1's rule (flat basin 1.5 widths, sharp core 2.5 widths), read from the wells fig2
    # built, defaults or not: it once kept its own copy of flat_and_sharp's default widths.
    for widths in ({}, {"flat_width": 0.5, "sharp_width": 0.35}):
        fed = L.fedmut_fig2(**widths)
        flat, sharp = (min(w.width for w in fed.clients[0].wells if w.kind == kind)
                       for kind in ("flat", "sharp"))
        assert (fed.flat_radius, fed.sharp_radius) == (1.5 * flat, 2.5 * sharp)
