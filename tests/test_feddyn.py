"""FedDyn: its neutral case against FedAvg, its server formula, its local gradient."""

from collections import OrderedDict

import torch

from flnotes.algorithms import build_strategy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.feddyn import DRIFT, dynamic_penalty
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose, weighted_mean


def test_alpha_zero_clients_train_as_fedavg_and_the_server_adds_the_mean_drift(tiny_config):
    """alpha = 0: FedAvg's clients bit for bit; the server adds (1/m) sum(theta_i - theta^0)."""
    config = tiny_config.replace(rounds=1, clients_per_round=6, weighting="uniform",
                                 record_states=True)
    fedavg = run(config, progress=False)
    feddyn = run(config.replace(algorithm="feddyn", feddyn_alpha=0.0), progress=False)
    (avg_round,), (dyn_round,) = fedavg.trajectory, feddyn.trajectory
    for a, b in zip(avg_round["local"], dyn_round["local"], strict=True):
        assert states_allclose(a, b, rtol=0, atol=0)
    theta0, mean = dyn_round["dispatched"][0], avg_round["global"]
    for n, t in feddyn.final_state.items():
        if torch.is_floating_point(t):
            # Full participation: theta^1 = mean + (mean - theta^0) = 2 mean - theta^0.
            torch.testing.assert_close(t, 2 * mean[n] - theta0[n])
    assert not states_allclose(fedavg.final_state, feddyn.final_state, rtol=0, atol=1e-6)


def test_server_state_update_equals_its_formula_on_hand_made_updates(tiny_config):
    alpha, m = 0.1, 4
    config = tiny_config.replace(algorithm="feddyn", num_clients=m, clients_per_round=2,
                                 feddyn_alpha=alpha)
    theta = OrderedDict(w=torch.tensor([1.0, -1.0]))
    strategy = build_strategy(config, theta)
    h = torch.zeros(2)
    rounds = [([0, 2], [torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])]),
              ([2, 3], [torch.tensor([3.0, 3.0]), torch.tensor([-1.0, 0.5])])]
    grads = {c: torch.zeros(2) for c in range(m)}  # grad L_i(theta_i), the paper's state
    for rnd, (clients, models) in enumerate(rounds, start=1):
        strategy.dispatch(rnd, clients)
        results = [ClientResult(c, OrderedDict(w=w), 10, 0.0)
                   for c, w in zip(clients, models, strict=True)]
        new = strategy.aggregate(rnd, results)
        # Alg. 1 l. 7, 9, 10, written with the paper's h and gradients.
        for c, w in zip(clients, models, strict=True):
            grads[c] = grads[c] - alpha * (w - theta["w"])
        h = h - alpha / m * sum(w - theta["w"] for w in models)
        theta = OrderedDict(w=sum(models) / len(models) - h / alpha)
        torch.testing.assert_close(strategy.h["w"], h)
        torch.testing.assert_close(new["w"], theta["w"])
    held = strategy.store.hold(range(m))
    for c in range(m):
        torch.testing.assert_close(-alpha * held[c]["w"], grads[c])


def test_local_gradient_is_the_papers(tiny_config):
    """grad of the penalty = -grad L_i(theta_i^(t-1)) + alpha (theta - theta^(t-1))."""
    alpha = 0.3
    start = {"w": torch.tensor([1.0, 2.0])}
    d_i = torch.tensor([0.5, -1.0])  # grad L_i(theta_i^(t-1)) = -alpha d_i
    theta = torch.tensor([0.0, 3.0], requires_grad=True)
    dynamic_penalty({"w": theta}, {**start, DRIFT + "w": d_i}, alpha).backward()
    torch.testing.assert_close(theta.grad, alpha * d_i + alpha * (theta.detach() - start["w"]))


def test_samples_weighting_changes_only_the_mean(tiny_config):
    config = tiny_config.replace(algorithm="feddyn", num_clients=3, weighting="samples")
    theta = OrderedDict(w=torch.zeros(2))
    strategy = build_strategy(config, theta)
    strategy.dispatch(1, [0, 1])
    states = [OrderedDict(w=torch.tensor([1.0, 0.0])), OrderedDict(w=torch.tensor([0.0, 3.0]))]
    new = strategy.aggregate(1, [ClientResult(0, states[0], 1, 0.0),
                                 ClientResult(1, states[1], 3, 0.0)])
    drift = (states[0]["w"] + states[1]["w"]) / 3
    torch.testing.assert_close(new["w"], weighted_mean(states, [1, 3])["w"] + drift)
