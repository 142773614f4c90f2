"""FedMut against its paper's invariants (Alg. 2, eq. 2-6) and against FedAvg."""

import io
from collections import OrderedDict

import pytest
import torch

from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedmut import FedMut
from flnotes.algorithms.mutation import (
    beta_schedule,
    gaussian_mutations,
    mutation_coefficients,
    project_halfspace,
    sign_mutations,
)
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.tasks import build_task
from flnotes.rng import torch_generator


def model_like_state(seed: int) -> OrderedDict:
    """A state shaped like a small conv net with BatchNorm, a 0-dim layer and an int buffer."""
    g = torch_generator(seed, "state")
    return OrderedDict([
        ("conv.weight", torch.randn(4, 2, 3, 3, generator=g)),
        ("conv.bias", torch.randn(4, generator=g)),
        ("bn.weight", torch.randn(4, generator=g)),
        ("bn.running_mean", torch.randn(4, generator=g)),
        ("bn.running_var", torch.rand(4, generator=g) + 0.5),
        ("bn.num_batches_tracked", torch.tensor(7 + seed, dtype=torch.int64)),
        ("scale", torch.randn((), generator=g)),
    ])


def float_names(state):
    return [n for n, t in state.items() if t.is_floating_point()]


def recovered_coefficient(global_state, mutant, update, name):
    """c with mutant = global + c * g on one layer (least squares), checked to be exact."""
    diff = (mutant[name] - global_state[name]).double()
    g = update[name].double()
    c = float((diff * g).sum() / (g * g).sum())
    assert torch.allclose(diff, c * g, atol=1e-5), f"{name} did not move along g"
    return c


def strategy_with_update(config, previous, current, cls=FedMut):
    """A strategy whose previous global is ``previous`` and current global ``current``."""
    strategy = cls(config, previous)
    strategy.aggregate(1, [ClientResult(0, OrderedDict(current), 10, 0.0)])
    return strategy


def fedmut_config(**changes) -> RunConfig:
    values = dict(algorithm="fedmut", alpha=2.0, beta0=0.3, beta_rounds=10, seed=3,
                  num_clients=20, clients_per_round=8)
    values.update(changes)
    return RunConfig(**values)


# ---- pure mutation functions ---------------------------------------------------------
@pytest.mark.parametrize("num_models", [2, 6, 10])
def test_beta0_even_k_mutants_average_to_global_at_distance_alpha_g(num_models):
    w, g = model_like_state(0), model_like_state(1)
    alpha = 2.5
    mutants = sign_mutations(w, g, num_models, alpha, 0.0, torch_generator(0, "t"))
    assert len(mutants) == num_models
    for name in float_names(w):
        mean = torch.stack([m[name] for m in mutants]).mean(0)
        assert torch.allclose(mean, w[name], atol=1e-5)  # eq. 3
        for m in mutants:  # eq. 6: ||w_mut - w||^2 = alpha^2 ||g||^2, here per layer
            dist = float((m[name] - w[name]).norm())
            assert dist == pytest.approx(alpha * float(g[name].norm()), rel=1e-5)


def test_signs_are_balanced_per_layer_and_shuffled_independently():
    w, g = model_like_state(0), model_like_state(1)
    alpha, beta, k = 1.5, 0.3, 8
    mutants = sign_mutations(w, g, k, alpha, beta, torch_generator(5, "t"))
    patterns = []
    for name in float_names(w):
        v = [recovered_coefficient(w, m, g, name) / alpha for m in mutants]
        assert sorted(v) == pytest.approx([-1 + beta] * (k // 2) + [1.0] * (k // 2))
        patterns.append(tuple(x > 0 for x in v))
        helper = [mutation_coefficients(w, m, g)[name] / alpha for m in mutants]
        assert helper == pytest.approx(v)  # the notebooks' helper agrees
    assert len(set(patterns)) > 1  # each layer has its own shuffle (Alg. 2 l.8-11)


def test_odd_k_includes_one_plain_global_model_at_a_random_position():
    w, g = model_like_state(0), model_like_state(1)
    positions = []
    for seed in range(12):
        mutants = sign_mutations(w, g, 5, 2.0, 0.0, torch_generator(seed, "t"))
        assert len(mutants) == 5
        plain = [i for i, m in enumerate(mutants) if states_allclose(m, w, rtol=0, atol=0)]
        assert len(plain) == 1
        positions.append(plain[0])
        others = [m for i, m in enumerate(mutants) if i != plain[0]]
        for name in float_names(w):  # the other four are balanced (eq. 4)
            v = [recovered_coefficient(w, m, g, name) / 2.0 for m in others]
            assert sum(v) == pytest.approx(0.0, abs=1e-6)
    # Sampled clients arrive sorted: a fixed slot would always go to the same client rank.
    assert len(set(positions)) >= 3


def test_beta_schedule_follows_eq5():
    assert beta_schedule(0, 0.3, 50) == pytest.approx(0.3)
    assert beta_schedule(25, 0.3, 50) == pytest.approx(0.15)
    assert beta_schedule(49, 0.3, 50) == pytest.approx(0.3 / 50)
    assert beta_schedule(50, 0.3, 50) == 0.0
    assert beta_schedule(80, 0.3, 50) == 0.0
    values = [beta_schedule(t, 0.5, 10) for t in range(15)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    with pytest.raises(ValueError):
        beta_schedule(-1, 0.3, 50)


def test_dispatched_signs_follow_the_schedule_from_round_two():
    w0, w1 = model_like_state(0), model_like_state(1)
    config = fedmut_config(beta0=0.4, beta_rounds=4)
    strategy = strategy_with_update(config, w0, w1)
    g = strategy.update()
    name = "conv.weight"
    # Mutants for round r use t = r - 2: beta0 in round 2, 0 from round T_b + 2 = 6 on.
    for rnd, beta in [(2, 0.4), (3, 0.3), (5, 0.1), (6, 0.0), (9, 0.0)]:
        mutants = strategy.dispatch(rnd, list(range(8)))
        v = sorted(recovered_coefficient(w1, m, g, name) / config.alpha for m in mutants)
        assert v == pytest.approx([-1 + beta] * 4 + [1.0] * 4, abs=1e-6)


def test_mutation_works_on_a_two_parameter_0dim_state():
    w = OrderedDict(x=torch.tensor(1.0), y=torch.tensor(-2.0))
    g = OrderedDict(x=torch.tensor(0.5), y=torch.tensor(-0.25))
    alpha = 2.0
    mutants = sign_mutations(w, g, 4, alpha, 0.0, torch_generator(0, "toy"))
    for m in mutants:
        assert m["x"].shape == () and m["y"].shape == ()
        assert float(m["x"]) in (pytest.approx(2.0), pytest.approx(0.0))  # 1 +- 2 * 0.5
        assert float(m["y"]) in (pytest.approx(-2.5), pytest.approx(-1.5))
    assert sorted(float(m["x"]) for m in mutants) == pytest.approx([0.0, 0.0, 2.0, 2.0])
    # Gaussian, whole model as one vector: points on the circle of radius alpha * ||g||.
    circle = gaussian_mutations(w, g, 16, alpha, torch_generator(0, "toy"), layerwise=False)
    radius = alpha * (0.5**2 + 0.25**2) ** 0.5
    for m in circle:
        step = torch.stack([m["x"] - w["x"], m["y"] - w["y"]])
        assert float(step.norm()) == pytest.approx(radius, rel=1e-5)
    assert len({round(float(m["x"]), 4) for m in circle}) > 4  # not just the corners
    # Per layer, a 0-dim layer's random direction is +-1: |step| = alpha * |g_layer|.
    for m in gaussian_mutations(w, g, 6, alpha, torch_generator(1, "toy")):
        assert abs(float(m["x"] - w["x"])) == pytest.approx(alpha * 0.5)
    projected = project_halfspace(torch.tensor(-1.0), torch.tensor(0.5))
    assert projected.shape == () and float(projected) == 0.0


def test_integer_buffers_are_never_mutated():
    w, g = model_like_state(0), model_like_state(1)
    assert int(g["bn.num_batches_tracked"]) != 0  # a nonzero "update" on the int layer
    generator = torch_generator(0, "t")
    for mutants in (sign_mutations(w, g, 5, 3.0, 0.2, generator),
                    gaussian_mutations(w, g, 4, 3.0, generator)):
        for m in mutants:
            assert m["bn.num_batches_tracked"].dtype == torch.int64
            assert torch.equal(m["bn.num_batches_tracked"], w["bn.num_batches_tracked"])
        moved = [not torch.equal(m["conv.weight"], w["conv.weight"]) for m in mutants]
        assert sum(moved) >= len(mutants) - 1  # all but sign mutation's one plain model


def test_batchnorm_running_stats_are_mutated_like_any_float_layer():
    w, g = model_like_state(0), model_like_state(1)
    mutants = sign_mutations(w, g, 4, 2.0, 0.0, torch_generator(0, "t"))
    for name in ("bn.running_mean", "bn.running_var"):
        v = sorted(recovered_coefficient(w, m, g, name) for m in mutants)
        assert v == pytest.approx([-2.0, -2.0, 2.0, 2.0])


# ---- the strategy ----------------------------------------------------------------------
def test_round_one_dispatches_the_initial_model():
    w0 = model_like_state(0)
    strategy = FedMut(fedmut_config(), w0)
    starts = strategy.dispatch(1, [0, 3, 5])
    assert len(starts) == 3
    assert all(states_allclose(s, w0, rtol=0, atol=0) for s in starts)


def test_defaults_are_the_papers():
    config = fedmut_config(alpha=None, weighting=None).resolved()
    assert config.alpha == 4.0 and config.weighting == "uniform"


def test_dispatch_is_deterministic_for_a_seed_and_differs_across_rounds():
    w0, w1 = model_like_state(0), model_like_state(1)
    clients = list(range(8))
    a = strategy_with_update(fedmut_config(), w0, w1)
    b = strategy_with_update(fedmut_config(), w0, w1)
    first, again = a.dispatch(2, clients), b.dispatch(2, clients)
    assert all(states_allclose(x, y, rtol=0, atol=0) for x, y in zip(first, again, strict=True))
    later = a.dispatch(3, clients)
    assert not all(states_allclose(x, y) for x, y in zip(first, later, strict=True))
    other_seed = strategy_with_update(fedmut_config(seed=4), w0, w1).dispatch(2, clients)
    assert not all(states_allclose(x, y) for x, y in zip(first, other_seed, strict=True))


def fake_round(strategy, rnd, clients):
    """Dispatch, 'train' each client by a deterministic nudge, aggregate."""
    starts = strategy.dispatch(rnd, clients)
    results = []
    for client, start in zip(clients, starts, strict=True):
        g = torch_generator(0, "fake-train", rnd, client)
        state = OrderedDict(
            (n, t + 0.1 * torch.randn(t.shape, generator=g) if t.is_floating_point() else t + 1)
            for n, t in start.items())
        results.append(ClientResult(client, state, 10 + client, 0.0))
    return starts, strategy.aggregate(rnd, results)


def test_checkpoint_round_trip_continues_identically():
    config = fedmut_config(clients_per_round=5)
    clients = [1, 4, 6, 9, 12]
    w0 = model_like_state(0)
    original = FedMut(config, w0)
    for rnd in (1, 2):
        fake_round(original, rnd, clients)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    restored = FedMut(config, w0)  # a fresh strategy around the initial model
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for rnd in (3, 4):
        starts_a, global_a = fake_round(original, rnd, clients)
        starts_b, global_b = fake_round(restored, rnd, clients)
        assert all(states_allclose(x, y, rtol=0, atol=0)
                   for x, y in zip(starts_a, starts_b, strict=True))
        assert states_allclose(global_a, global_b, rtol=0, atol=0)


def test_checkpoint_before_the_first_aggregation_round_trips():
    w0 = model_like_state(0)
    strategy = FedMut(fedmut_config(), w0)
    buffer = io.BytesIO()
    torch.save(strategy.state_dict(), buffer)
    buffer.seek(0)
    restored = FedMut(fedmut_config(), model_like_state(2))
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.previous_state is None
    assert all(states_allclose(s, w0, rtol=0, atol=0) for s in restored.dispatch(1, [0, 1]))


def test_alpha_zero_is_fedavg_with_uniform_weighting(tiny_config):
    task = build_task(tiny_config)  # the data do not depend on the algorithm
    fedavg = run(tiny_config.replace(algorithm="fedavg", weighting="uniform"), progress=False,
                 task=task)
    fedmut = run(tiny_config.replace(algorithm="fedmut", alpha=0.0), progress=False, task=task)
    assert states_allclose(fedavg.final_state, fedmut.final_state, rtol=0, atol=0)
    # ... and a nonzero alpha really changes the run.
    mutated = run(tiny_config.replace(algorithm="fedmut"), progress=False, task=task)
    assert not states_allclose(fedavg.final_state, mutated.final_state)


def test_resumed_run_ends_where_an_uninterrupted_one_does(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedmut", clients_per_round=4)
    assert config.rounds == 3  # stopped after round 2, so round 3 mutates from the checkpoint
    task = build_task(config)
    whole = run(config, progress=False, task=task)
    run(config.replace(rounds=2, run_dir=str(tmp_path)), progress=False, task=task)
    resumed = run(config.replace(run_dir=str(tmp_path)), progress=False, task=task)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3]
    assert states_allclose(whole.final_state, resumed.final_state, rtol=0, atol=0)
