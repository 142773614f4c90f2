"""STEM against an independent implementation of its Algorithm 1 (functional gradients), its
a = 1 reading (d is then the plain stochastic gradient), resume, the toy, bad settings."""

import pytest
import torch
from helpers import assert_resumes
from torch.func import functional_call, grad

from flnotes import toy
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.train import batch_schedule, client_generator


@pytest.fixture
def stem_config(tiny_config):
    return tiny_config.replace(algorithm="stem", momentum=0.0, rounds=2, clients_per_round=3,
                               stem_a=0.3, weight_decay=1e-3)


def reference_rounds(config, rounds):
    """Algorithm 1 written out on parameter dicts: the global x and d after each round."""
    sim = Simulation(config)  # only for its task, sampling and start state
    task, model = sim.task, sim.task.model_factory()
    names = [n for n, _ in model.named_parameters()]
    x = {n: sim.strategy.global_state[n].clone() for n in names}

    def g(w, xb, yb):  # gradient of loss + wd/2 |w|^2 at w
        def loss(p):
            return task.loss_fn(functional_call(model, p, (xb,)), yb)
        out = grad(loss)(w)
        return {n: out[n] + config.weight_decay * w[n] for n in names}

    d_server, out = None, []
    for rnd in range(1, rounds + 1):
        clients, _ = sim.begin_round(rnd)
        xs, ds, ns = [], [], []
        for c in clients:
            xc, yc = task.client_data(c)
            batches = batch_schedule(len(yc), config.local_epochs, config.batch_size,
                                     client_generator(config, rnd, c))
            w = dict(x)
            d = d_server if d_server is not None else g(w, xc[batches[0]], yc[batches[0]])
            for idx in batches:
                w_next = {n: w[n] - config.lr * d[n] for n in names}
                g1, g0 = g(w_next, xc[idx], yc[idx]), g(w, xc[idx], yc[idx])
                d = {n: g1[n] + (1 - config.stem_a) * (d[n] - g0[n]) for n in names}
                w = w_next
            xs.append(w)
            ds.append(d)
            ns.append(len(yc))
        x = {n: sum(w[n] for w in xs) / len(xs) for n in names}  # uniform (1/K)
        d_server = {n: sum(d[n] for d in ds) / len(ds) for n in names}
        out.append((x, d_server))
    return out


def test_matches_algorithm_one_written_out(stem_config):
    expected = reference_rounds(stem_config, 2)
    sim = Simulation(stem_config)
    for rnd in (1, 2):
        clients, starts = sim.begin_round(rnd)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        sim.end_round(rnd, clients, starts, results, 0.0)
        x, d = expected[rnd - 1]
        for n in x:
            torch.testing.assert_close(sim.strategy.global_state[n], x[n], rtol=1e-4,
                                       atol=1e-6)
            torch.testing.assert_close(sim.strategy.direction[n], d[n], rtol=1e-4, atol=1e-6)


def test_a_one_makes_d_the_plain_stochastic_gradient(stem_config):
    """With a = 1 every d is the last batch's gradient at the point reached, so the server's
    d is the mean of those gradients, computed here directly."""
    config = stem_config.replace(stem_a=1.0, rounds=1)
    sim = Simulation(config)
    clients, starts = sim.begin_round(1)
    results = train_clients(sim.task, sim.strategy, 1, clients, starts, sim.config)
    sim.end_round(1, clients, starts, results, 0.0)
    model = sim.task.model_factory()
    grads = []
    for c, r in zip(clients, results, strict=True):
        xc, yc = sim.task.client_data(c)
        last = batch_schedule(len(yc), 1, config.batch_size, client_generator(config, 1, c))[-1]
        model.load_state_dict(r.state)
        out = torch.autograd.grad(sim.task.loss_fn(model(xc[last]), yc[last]),
                                  list(model.parameters()))
        grads.append({n: gn + config.weight_decay * p.detach()
                      for (n, p), gn in zip(model.named_parameters(), out, strict=True)})
    for n in grads[0]:
        torch.testing.assert_close(sim.strategy.direction[n],
                                   sum(gr[n] for gr in grads) / len(grads),
                                   rtol=1e-4, atol=1e-6)


def test_resume_with_clients_sampled_skipped_and_sampled_again(stem_config, tmp_path):
    config = stem_config.replace(rounds=5, clients_per_round=2, checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_runs_on_the_toy():
    config = toy.toy_config("stem", rounds=4, num_clients=3, clients_per_round=2)
    assert config.momentum == 0.0
    assert run(config, progress=False).status == "completed"


@pytest.mark.parametrize("changes", [{"stem_a": 0.0}, {"stem_a": 1.5}, {"momentum": 0.5}])
def test_bad_settings_are_one_line_errors(changes):
    with pytest.raises(ValueError, match="stem_a|momentum"):
        RunConfig(algorithm="stem", **changes)
