"""FedSMOO against references: FedDyn (rho = 0), a local step and the duals by autograd by
hand, the server's global perturbation, resume with clients skipped and resampled, the toy."""

from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import states_allclose


@pytest.fixture
def smoo_config(tiny_config):
    return tiny_config.replace(algorithm="fedsmoo", rounds=3)


def test_rho_zero_is_feddyn_bit_for_bit(smoo_config):
    feddyn = run(smoo_config.replace(algorithm="feddyn", feddyn_alpha=0.1), progress=False)
    smoo = run(smoo_config.replace(smoo_rho=0.0, smoo_alpha=0.1), progress=False)
    assert states_allclose(feddyn.final_state, smoo.final_state, rtol=0, atol=0)
    assert not states_allclose(run(smoo_config, progress=False).final_state,
                               feddyn.final_state)


def step_by_hand(model, loss_fn, x, y, w, w_t, drift, mu, s, rho, alpha, lr):
    """One FedSMOO step on one batch, written out with autograd (plain SGD)."""
    names = list(w)

    def grads_at(point):
        model.load_state_dict({**model.state_dict(), **point})
        return dict(zip(names, torch.autograd.grad(loss_fn(model(x), y),
                                                   list(model.parameters())), strict=True))

    g = grads_at(w)
    ascent = {n: g[n] - mu[n] - s[n] for n in names}
    norm = torch.sqrt(sum((a ** 2).sum() for a in ascent.values())) + 1e-7
    e = {n: rho * ascent[n] / norm for n in names}
    new_mu = {n: mu[n] + e[n] - s[n] for n in names}
    g_sam = grads_at({n: w[n] + e[n] for n in names})
    new_w = {n: w[n] - lr * (g_sam[n] + alpha * (drift[n] + w[n] - w_t[n])) for n in names}
    return new_w, new_mu


def test_local_steps_duals_and_global_perturbation_by_hand(smoo_config):
    config = smoo_config.replace(num_clients=3, clients_per_round=3, batch_size=10_000,
                                 momentum=0.0, weight_decay=0.0, smoo_rho=0.3, smoo_alpha=0.2)
    sim = Simulation(config)
    model = sim.task.model_factory()
    names = [n for n, _ in model.named_parameters()]
    expected_mu = {}
    for rnd in (1, 2):
        clients, starts = sim.begin_round(rnd)
        held = {c: sim.strategy.store.get(c) for c in clients}
        mus = {c: sim.strategy.duals.get(c) for c in clients}
        s = OrderedDict((n, sim.strategy.perturbation[n].clone()) for n in names)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        for c, start, result in zip(clients, starts, results, strict=True):
            x, y = sim.task.client_data(c)
            w = {n: start[n] for n in names}  # one batch holds every sample: one step
            new_w, new_mu = step_by_hand(model, sim.task.loss_fn, x, y, w, w,
                                         {n: held[c][n] for n in names},
                                         {n: mus[c][n] for n in names}, s, 0.3, 0.2, config.lr)
            for n in names:
                torch.testing.assert_close(result.state[n], new_w[n], rtol=1e-5, atol=1e-6)
            expected_mu[c] = new_mu
        sim.end_round(rnd, clients, starts, results, 0.0)
        mean = {n: torch.stack([expected_mu[c][n] for c in clients]).mean(0) for n in names}
        norm = torch.sqrt(sum((m ** 2).sum() for m in mean.values())) + 1e-7
        for n in names:
            torch.testing.assert_close(sim.strategy.perturbation[n], 0.3 * mean[n] / norm,
                                       rtol=1e-5, atol=1e-7)
    stored = sim.strategy.duals.hold(range(3))
    for c in range(3):
        for n in names:
            torch.testing.assert_close(stored[c][n], expected_mu[c][n], rtol=1e-5, atol=1e-7)


def test_resume_with_clients_sampled_skipped_and_sampled_again(smoo_config, tmp_path):
    config = smoo_config.replace(rounds=5, clients_per_round=2, checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_runs_on_the_toy():
    config = toy.toy_config("fedsmoo", rounds=4, num_clients=3, clients_per_round=2)
    assert run(config, progress=False).status == "completed"


@pytest.mark.parametrize("field,value", [("smoo_rho", -0.1), ("smoo_alpha", float("nan"))])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfig(algorithm="fedsmoo", **{field: value})
