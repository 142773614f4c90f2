"""FedUp against references: FedAvg (alpha = 0), FedProx (round 1), autograd, eq. 6's gradient."""

from collections import OrderedDict

import torch
from helpers import assert_resumes

from flnotes.algorithms import settings_of
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedup import FedUp, upper_bound_penalty
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.rng import torch_generator


def test_defaults_and_alpha_zero_has_no_penalty():
    config = RunConfig(algorithm="fedup").resolved()
    assert config.fedup_alpha == settings_of("fedup")["fedup_alpha"].default > 0
    assert config.weighting == "uniform"  # Alg. 1 l.9: X^(t+1) = sum (1/m) X_i
    state = OrderedDict(w=torch.zeros(2))
    assert FedUp(config, state).has_penalty
    assert not FedUp(config.replace(fedup_alpha=0.0), state).has_penalty


def test_alpha_zero_equals_fedavg_with_uniform_weighting(tiny_config):
    a = run(tiny_config.replace(algorithm="fedavg", weighting="uniform"), progress=False)
    b = run(tiny_config.replace(algorithm="fedup", fedup_alpha=0.0), progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == b.metric("accuracy")


def test_round_one_equals_fedprox_then_differs(tiny_config):
    # X^(-1) = X^0, so round 1 has no linear term and is FedProx with mu = alpha.
    one = tiny_config.replace(rounds=1, mu=0.5, weighting="uniform")
    prox = run(one.replace(algorithm="fedprox"), progress=False)
    up = run(one.replace(algorithm="fedup", fedup_alpha=0.5), progress=False)
    assert states_allclose(prox.final_state, up.final_state, rtol=0, atol=0)

    # From round 2, X^(t-1) != X^t and the linear term changes the result.
    two = tiny_config.replace(rounds=2, mu=0.5, weighting="uniform", record_states=True)
    prox = run(two.replace(algorithm="fedprox"), progress=False)
    up = run(two.replace(algorithm="fedup", fedup_alpha=0.5), progress=False)
    assert states_allclose(prox.trajectory[0]["global"], up.trajectory[0]["global"], 0, 0)
    assert not states_allclose(prox.final_state, up.final_state)


def closed_form(w, start, previous, alpha, lr):
    """Eq. 6 without F_i, for one tensor, written out independently of the module."""
    return (alpha / lr) * torch.dot((previous - start).flatten(), (w - start).flatten()) + (
        alpha / 2
    ) * torch.sum((w - start) ** 2)


def test_penalty_gradient_matches_autograd_and_analytic_gradient():
    g = torch_generator(0, "fedup-test")
    alpha, lr = 0.3, 0.05
    shapes = {"conv.weight": (4, 3, 2), "conv.bias": (4,), "scale": ()}
    start = OrderedDict((n, torch.randn(s, generator=g)) for n, s in shapes.items())
    previous = OrderedDict((n, torch.randn(s, generator=g)) for n, s in shapes.items())
    # A buffer in the state that is not a trainable parameter: the penalty must ignore it.
    start["bn.running_mean"] = torch.randn(4, generator=g)
    previous["bn.running_mean"] = torch.randn(4, generator=g)
    params = {n: torch.randn(s, generator=g, requires_grad=True) for n, s in shapes.items()}

    strategy = FedUp(RunConfig(algorithm="fedup", fedup_alpha=alpha, lr=lr), previous)
    strategy.aggregate(1, [ClientResult(0, start, 10, 0.0)])  # now X^(t-1) = previous, X^t = start
    assert states_allclose(strategy.previous_global, previous, 0, 0)
    penalty = strategy.local_penalty(params, strategy.penalty_anchor(start, 0))
    reference = sum(closed_form(params[n], start[n], previous[n], alpha, lr) for n in params)
    assert torch.allclose(penalty, reference, rtol=1e-5, atol=1e-6)
    assert torch.allclose(
        upper_bound_penalty(params, start, previous, alpha, lr), reference, rtol=1e-5, atol=1e-6
    )

    grads = torch.autograd.grad(penalty, list(params.values()))
    ref_grads = torch.autograd.grad(reference, list(params.values()))
    for (n, w), grad, ref in zip(params.items(), grads, ref_grads, strict=True):
        analytic = (alpha / lr) * (previous[n] - start[n]) + alpha * (w.detach() - start[n])
        assert torch.allclose(grad, ref, rtol=1e-5, atol=1e-6)
        assert torch.allclose(grad, analytic, rtol=1e-5, atol=1e-6)

    # Sign check: one SGD step (lr) on the penalty alone, from X^t, moves by
    # alpha * (X^t - X^(t-1)): along the last global update, as an estimate of -grad F.
    at_start = {n: start[n].clone().requires_grad_(True) for n in shapes}
    step = torch.autograd.grad(strategy.local_penalty(at_start, strategy.penalty_anchor(start, 0)),
                               list(at_start.values()))
    for n, grad in zip(shapes, step, strict=True):
        assert torch.allclose(-lr * grad, alpha * (start[n] - previous[n]), rtol=1e-5, atol=1e-6)


def test_checkpoint_keeps_previous_global_and_resume_is_exact(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedup", fedup_alpha=0.5, checkpoint_every=1)
    assert_resumes(config, tmp_path, stop_after=2)
    saved = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["strategy"]
    assert set(saved) == {"global_state", "previous_global"}
    assert not states_allclose(saved["global_state"], saved["previous_global"])
