"""MimeLite against references: FedAvg (beta = 0, and round 1), the server momentum and a
client's steps by hand, resume with clients skipped and resampled, the toy, bad settings."""

from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.mimelite import full_batch_gradient
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import states_allclose


@pytest.fixture
def mime_config(tiny_config):
    return tiny_config.replace(algorithm="mimelite", momentum=0.0, rounds=3)


def test_beta_zero_and_round_one_are_fedavg_bit_for_bit(mime_config):
    fedavg = run(mime_config.replace(algorithm="fedavg"), progress=False)
    zero = run(mime_config.replace(mime_beta=0.0), progress=False)
    assert states_allclose(fedavg.final_state, zero.final_state, rtol=0, atol=0)
    first = run(mime_config.replace(rounds=1), progress=False)
    avg_first = run(mime_config.replace(algorithm="fedavg", rounds=1), progress=False)
    assert states_allclose(first.final_state, avg_first.final_state, rtol=0, atol=0)
    assert not states_allclose(run(mime_config, progress=False).final_state,
                               fedavg.final_state)


def test_server_momentum_and_client_steps_by_hand(mime_config):
    config = mime_config.replace(num_clients=4, clients_per_round=2, local_epochs=1,
                                 batch_size=10_000, mime_beta=0.8, weight_decay=1e-3)
    sim = Simulation(config)
    x0 = OrderedDict((k, v.clone()) for k, v in sim.strategy.global_state.items())
    clients, starts = sim.begin_round(1)
    results = train_clients(sim.task, sim.strategy, 1, clients, starts, sim.config)
    sim.end_round(1, clients, starts, results, 0.0)

    # m after round 1: the sample-weighted mean loss gradient at x0 over the sampled clients
    model = sim.task.model_factory()
    model.load_state_dict(x0)
    xs = torch.cat([sim.task.client_data(c)[0] for c in clients])
    ys = torch.cat([sim.task.client_data(c)[1] for c in clients])
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(sim.task.loss_fn(model(xs), ys), list(model.parameters()))
    m1 = dict(zip(names, grads, strict=True))
    for n in names:
        torch.testing.assert_close(sim.strategy.momentum[n], m1[n], rtol=1e-5, atol=1e-6)

    # round 2: one full-batch local step y = x1 - lr (g + wd x1 + beta m1) per client
    clients, starts = sim.begin_round(2)
    results = train_clients(sim.task, sim.strategy, 2, clients, starts, sim.config)
    for client, start, result in zip(clients, starts, results, strict=True):
        model.load_state_dict(start)
        x, y = sim.task.client_data(client)
        g = torch.autograd.grad(sim.task.loss_fn(model(x), y), list(model.parameters()))
        for n, gn in zip(names, g, strict=True):
            step = gn + 1e-3 * start[n] + 0.8 * m1[n]
            torch.testing.assert_close(result.state[n], start[n] - config.lr * step,
                                       rtol=1e-5, atol=1e-6)
    sim.end_round(2, clients, starts, results, 0.0)
    # m after round 2: c_bar at x1 + beta m1
    model.load_state_dict(starts[0])
    xs = torch.cat([sim.task.client_data(c)[0] for c in clients])
    ys = torch.cat([sim.task.client_data(c)[1] for c in clients])
    g2 = torch.autograd.grad(sim.task.loss_fn(model(xs), ys), list(model.parameters()))
    for n, gn in zip(names, g2, strict=True):
        torch.testing.assert_close(sim.strategy.momentum[n], gn + 0.8 * m1[n],
                                   rtol=1e-5, atol=1e-6)


def test_full_batch_gradient_is_n_times_the_mean_gradient(mime_config):
    sim = Simulation(mime_config)
    model = sim.task.model_factory()
    x, y = sim.task.client_data(0)
    total = full_batch_gradient(model, sim.strategy.global_state, x, y, sim.task.loss_fn, 7)
    mean = torch.autograd.grad(sim.task.loss_fn(model(x), y), list(model.parameters()))
    for (n, _), g in zip(model.named_parameters(), mean, strict=True):
        torch.testing.assert_close(total[n] / len(y), g, rtol=1e-5, atol=1e-6)


def test_resume_with_clients_sampled_skipped_and_sampled_again(mime_config, tmp_path):
    config = mime_config.replace(rounds=5, clients_per_round=2, checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_runs_on_the_toy():
    # the toy's teaching momentum 0.5 gives way to MimeLite's own (the race runs it so)
    config = toy.toy_config("mimelite", rounds=4, num_clients=3, clients_per_round=2)
    assert config.momentum == 0.0
    assert run(config, progress=False).status == "completed"


@pytest.mark.parametrize("changes", [{"mime_beta": 1.0}, {"mime_beta": -0.1},
                                     {"momentum": 0.9}])
def test_bad_settings_are_one_line_errors(changes):
    with pytest.raises(ValueError, match="mime_beta|momentum"):
        RunConfig(algorithm="mimelite", **changes)
