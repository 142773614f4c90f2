"""FedQP against a generic QP solver, the half-space invariant and FedMut (p = 0)."""

from collections import OrderedDict

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedqp import FedQP
from flnotes.algorithms.mutation import (
    gaussian_mutations,
    project_halfspace,
    project_mutants,
    sign_mutations,
)
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import state_is_finite, states_allclose
from flnotes.engine.tasks import build_task
from flnotes.rng import torch_generator


def model_like_state(seed: int) -> OrderedDict:
    """A small conv-net-like state: float layers, a 0-dim layer and an int buffer."""
    g = torch_generator(seed, "state")
    return OrderedDict([
        ("conv.weight", torch.randn(4, 2, 3, 3, generator=g)),
        ("conv.bias", torch.randn(4, generator=g)),
        ("bn.running_mean", torch.randn(4, generator=g)),
        ("bn.num_batches_tracked", torch.tensor(7, dtype=torch.int64)),
        ("fc.weight", torch.randn(3, 4, generator=g)),
        ("scale", torch.randn((), generator=g)),
    ])


def float_names(state):
    return [n for n, t in state.items() if t.is_floating_point()]


def inner(a, b) -> float:
    return float((a.double() * b.double()).sum())


def fedqp_strategy(previous, current, **changes) -> FedQP:
    values = dict(algorithm="fedqp", alpha=2.0, beta0=0.3, beta_rounds=10, seed=3,
                  num_clients=20, clients_per_round=8, qp_prob=0.5)
    values.update(changes)
    strategy = FedQP(RunConfig(**values), previous)
    strategy.aggregate(1, [ClientResult(0, OrderedDict(current), 10, 0.0)])
    return strategy


def test_projection_is_the_qp_solution_of_a_generic_solver():
    rng = np.random.default_rng(0)
    active = 0
    for dim in (1, 2, 3, 5, 8):
        for _ in range(6):
            m, g = rng.normal(size=dim), rng.normal(size=dim)
            # FedQP eq. 2: min ||x - m||^2 s.t. <x, g> >= 0, by SLSQP from a feasible start.
            reference = minimize(lambda x, m=m: float(((x - m) ** 2).sum()), x0=np.abs(g),
                                 jac=lambda x, m=m: 2 * (x - m), method="SLSQP",
                                 constraints=[{"type": "ineq", "fun": lambda x, g=g: x @ g,
                                               "jac": lambda x, g=g: g}],
                                 options={"ftol": 1e-14, "maxiter": 200})
            assert reference.success
            ours = project_halfspace(torch.tensor(m), torch.tensor(g)).numpy()
            assert ours @ g >= -1e-12
            np.testing.assert_allclose(ours, reference.x, atol=1e-6)
            active += int(m @ g < 0)
    assert 5 < active < 25  # both cases (constraint active / inactive) were exercised


def test_projection_is_nearest_by_brute_force_in_2d():
    m, g = torch.tensor([0.3, -1.2], dtype=torch.float64), torch.tensor([1.0, 2.0],
                                                                           dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(torch.linspace(-2, 2, 801, dtype=torch.float64),
                                      torch.linspace(-2, 2, 801, dtype=torch.float64),
                                      indexing="ij"), -1).reshape(-1, 2)
    feasible = grid[grid @ g >= 0]
    best = feasible[((feasible - m) ** 2).sum(1).argmin()]
    ours = project_halfspace(m, g)
    assert torch.allclose(ours, best, atol=6e-3)  # grid spacing 5e-3
    assert ((ours - m) ** 2).sum() <= ((best - m) ** 2).sum() + 1e-12


def test_projected_layers_are_in_the_halfspace_and_the_rest_untouched():
    w, g = model_like_state(0), model_like_state(1)
    mutants = gaussian_mutations(w, g, 10, 2.0, torch_generator(0, "m"))
    projected = project_mutants(w, mutants, g, 0.5, torch_generator(0, "qp"))
    changed = kept = 0
    for before, after in zip(mutants, projected, strict=True):
        assert torch.equal(after["bn.num_batches_tracked"], w["bn.num_batches_tracked"])
        for name in float_names(w):
            m_before, m_after = before[name] - w[name], after[name] - w[name]
            if torch.equal(after[name], before[name]):
                kept += 1
                continue
            changed += 1
            scale = float((w[name].norm() + m_before.norm()) * g[name].norm())
            assert inner(m_after, g[name]) >= -1e-6 * scale
            assert torch.allclose(m_after, project_halfspace(m_before, g[name]), atol=1e-5)
            assert inner(m_before, g[name]) < 0  # only a violating layer can move
    # Half the (mutant, layer) pairs are projected and half of those violate: ~25% move.
    assert 5 <= changed <= 25 and kept > 0


@pytest.mark.parametrize("mutation", ["sign", "gaussian"])
def test_p_one_puts_every_mutant_in_the_halfspace(mutation):
    w0, w1 = model_like_state(0), model_like_state(1)
    strategy = fedqp_strategy(w0, w1, qp_prob=1.0, mutation=mutation)
    g = strategy.update()
    mutants = strategy.dispatch(2, list(range(8)))
    assert len(mutants) == 8
    for m in mutants:
        for name in float_names(w1):
            step = m[name] - w1[name]
            # float32 rounding of the stored model: tolerance scales with ||w|| ||g||
            scale = float((w1[name].norm() + step.norm()) * g[name].norm())
            assert inner(step, g[name]) >= -1e-6 * scale
            if mutation == "sign":  # the +1 side kept (alpha * g), the other side zeroed
                assert (torch.allclose(step, 2.0 * g[name], atol=1e-5)
                        or torch.allclose(step, torch.zeros_like(step), atol=1e-5))
    if mutation == "gaussian":  # a fan, not a collapse onto g: directions still differ
        steps = [m["conv.weight"] - w1["conv.weight"] for m in mutants]
        assert not all(torch.allclose(steps[0], s, atol=1e-4) for s in steps[1:])


def test_p_zero_gaussian_mutants_have_norm_alpha_g_per_layer():
    w0, w1 = model_like_state(0), model_like_state(1)
    strategy = fedqp_strategy(w0, w1, qp_prob=0.0, mutation="gaussian")
    g = strategy.update()
    mutants = strategy.dispatch(2, list(range(7)))
    assert len(mutants) == 7
    for m in mutants:
        for name in float_names(w1):
            dist = float((m[name] - w1[name]).norm())
            assert dist == pytest.approx(2.0 * float(g[name].norm()), rel=1e-5)
    violating = sum(inner(m["fc.weight"] - w1["fc.weight"], g["fc.weight"]) < 0 for m in mutants)
    assert violating > 0  # without projection the mutants fill the whole circle


def test_zero_update_gives_no_nan():
    m = torch.tensor([1.0, -2.0, 0.5])
    out = project_halfspace(m, torch.zeros(3))
    assert torch.equal(out, m)
    assert float(project_halfspace(torch.tensor(-1.0), torch.tensor(0.0))) == -1.0
    w = model_like_state(0)
    zero = OrderedDict((n, torch.zeros_like(t)) for n, t in w.items())
    for mutants in (sign_mutations(w, zero, 4, 2.0, 0.3, torch_generator(0, "m")),
                    gaussian_mutations(w, zero, 4, 2.0, torch_generator(0, "m"))):
        for p in project_mutants(w, mutants, zero, 1.0, torch_generator(0, "qp")):
            assert state_is_finite(p) and states_allclose(p, w, rtol=0, atol=0)
    strategy = fedqp_strategy(w, w, qp_prob=1.0)  # the global model did not move: g = 0
    assert all(state_is_finite(s) for s in strategy.dispatch(2, list(range(5))))


def test_qp_draws_do_not_shift_the_sign_shuffles():
    w0, w1 = model_like_state(0), model_like_state(1)
    clients = list(range(6))
    base = fedqp_strategy(w0, w1, qp_prob=0.0).dispatch(4, clients)
    for p in (0.3, 1.0):
        projected = fedqp_strategy(w0, w1, qp_prob=p).dispatch(4, clients)
        for a, b in zip(base, projected, strict=True):
            for name in float_names(w1):
                if not torch.equal(a[name], b[name]):  # a projected layer: a (-1 + beta) one
                    assert torch.allclose(b[name], w1[name], atol=1e-5)
                    assert inner(a[name] - w1[name], w1[name] - w0[name]) < 0


def test_p_zero_is_fedmut(tiny_config):
    task = build_task(tiny_config)  # the data do not depend on the algorithm
    fedmut = run(tiny_config.replace(algorithm="fedmut"), progress=False, task=task)
    # (the same alpha: FedQP's own default, 2.0 from the CIFAR-10 scan, is not FedMut's 4.0)
    fedqp = run(tiny_config.replace(algorithm="fedqp", qp_prob=0.0, alpha=4.0), progress=False,
                task=task)
    assert states_allclose(fedmut.final_state, fedqp.final_state, rtol=0, atol=0)
    assert RunConfig(algorithm="fedqp").resolved().alpha == 2.0
    assert RunConfig(algorithm="fedmut").resolved().alpha == 4.0
    projected = run(tiny_config.replace(algorithm="fedqp", qp_prob=1.0), progress=False,
                    task=task)
    assert not states_allclose(fedmut.final_state, projected.final_state)


def test_whole_model_projection_draws_the_fan_on_a_two_parameter_state():
    w = OrderedDict(x=torch.tensor(0.5), y=torch.tensor(-1.0))
    g = OrderedDict(x=torch.tensor(0.6), y=torch.tensor(0.8))  # ||g|| = 1
    alpha = 2.0
    circle = gaussian_mutations(w, g, 40, alpha, torch_generator(0, "toy"), layerwise=False)
    fan = project_mutants(w, circle, g, 1.0, torch_generator(0, "qp"), layerwise=False)
    direction = torch.tensor([0.6, 0.8])
    moved = 0
    for before, after in zip(circle, fan, strict=True):
        m_before = torch.stack([before["x"] - w["x"], before["y"] - w["y"]])
        m_after = torch.stack([after["x"] - w["x"], after["y"] - w["y"]])
        assert float(m_after @ direction) >= -1e-6
        if float(m_before @ direction) >= 0:  # already in the fan: unchanged
            assert torch.equal(m_after, m_before)
        else:  # dropped onto the diameter orthogonal to g, inside the circle
            moved += 1
            assert float(m_after @ direction) == pytest.approx(0.0, abs=1e-6)
            assert float(m_after.norm()) <= alpha + 1e-6
    assert 5 < moved < 35
