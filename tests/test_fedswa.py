"""FedSWA and FedMoSWA (Liu et al., ICML 2025): the cyclical local rate, the server step and the
momentum control variates against hand computations; FedAvg, FedSWA and SCAFFOLD where they
reduce to them; resume; the vmap backend; the toy and the command line."""

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes
from torch import nn

from flnotes import toy
from flnotes.algorithms import build_strategy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedswa import FedMoSWA, cyclical_rates, displacement_scale
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import batch_schedule


class LinearTask:
    """What a strategy's local update reads of a task: one linear model, one client's data."""

    def __init__(self, x, y):
        torch.manual_seed(0)
        self.model = nn.Linear(x.shape[1], 2)
        self.x, self.y = x, y
        self.loss_fn = F.cross_entropy

    def working_model(self):
        return self.model

    def client_data(self, client):
        return self.x, self.y


def linear_config(**changes):
    values = dict(dataset="synthetic", model="mlp", num_clients=2, clients_per_round=1,
                  local_epochs=2, batch_size=2, lr=0.3, momentum=0.0, weight_decay=0.01)
    return RunConfig(**{**values, **changes})


def steps_by_hand(start, x, y, config, rates, correction=None):
    """w <- w - eta_k (grad L_B(w) + wd w + correction) on the engine's batches (plain SGD)."""
    w = {n: t.clone() for n, t in start.items()}
    generator = torch.Generator().manual_seed(7)
    batches = batch_schedule(len(y), config.local_epochs, config.batch_size, generator)
    assert len(batches) == len(rates)
    for rate, idx in zip(rates, batches, strict=True):
        leaves = {n: t.clone().requires_grad_() for n, t in w.items()}
        loss = F.cross_entropy(x[idx] @ leaves["weight"].T + leaves["bias"], y[idx])
        grads = torch.autograd.grad(loss, list(leaves.values()))
        for (n, t), g in zip(w.items(), grads, strict=True):
            d = g + config.weight_decay * t + (correction[n] if correction else 0)
            w[n] = t - rate * d
    return w


# ---- FedSWA -------------------------------------------------------------------------
def test_the_cyclical_rate_is_eq_3():
    # eta_k = eta_l (1 - k/K) + (k/K) rho eta_l, k = 0..K-1
    assert cyclical_rates(0.2, 0.1, 4) == pytest.approx([0.2, 0.155, 0.11, 0.065])
    assert cyclical_rates(0.05, 1.0, 7) == [0.05] * 7  # exactly the rate: FedAvg
    assert displacement_scale([0.2, 0.1], 0.0) == pytest.approx(0.3)
    # heavy ball: eta_0 * 1 + eta_1 * (1 + mu)
    assert displacement_scale([0.2, 0.1], 0.5) == pytest.approx(0.2 + 0.1 * 1.5)


def test_local_steps_follow_the_cyclical_rate_by_hand():
    torch.manual_seed(3)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    task = LinearTask(x, y)
    config = linear_config(algorithm="fedswa", fedswa_rho=0.1)
    start = OrderedDict((n, t.detach().clone()) for n, t in task.model.state_dict().items())
    strategy = build_strategy(config, start)
    result = strategy.local_update(task, 1, 0, start, torch.Generator().manual_seed(7))
    # K = 2 epochs x ceil(5 / 2) = 6 steps; eta_k = 0.3 (1 - 0.9 k / 6)
    rates = [0.3 * (1 - 0.9 * k / 6) for k in range(6)]
    expected = steps_by_hand(start, x, y, config, rates)
    for n in expected:
        torch.testing.assert_close(result.state[n], expected[n], rtol=1e-5, atol=1e-6)


def test_server_step_is_x_plus_alpha_times_the_mean_move():
    config = linear_config(algorithm="fedswa", fedswa_alpha=1.5, num_clients=3)
    x = OrderedDict(w=torch.tensor([1.0, 2.0]), n=torch.tensor(4))
    strategy = build_strategy(config, x)
    results = [ClientResult(0, OrderedDict(w=torch.tensor([2.0, 4.0]), n=torch.tensor(9)), 10, 0.0),
               ClientResult(1, OrderedDict(w=torch.tensor([4.0, 6.0]), n=torch.tensor(9)), 30, 0.0)]
    new = strategy.aggregate(1, results)
    # uniform mean v = (3, 5) (Alg. 1's 1/s, whatever the sizes); x + 1.5 (v - x) = (4, 6.5)
    torch.testing.assert_close(new["w"], torch.tensor([4.0, 6.5]))
    assert int(new["n"]) == 9  # an integer buffer is the mean's
    samples = build_strategy(config.replace(weighting="samples"), x).aggregate(1, results)
    torch.testing.assert_close(samples["w"], torch.tensor([1.0, 2.0]) + 1.5 * torch.tensor(
        [2.5, 3.5]))


def test_constant_rate_and_no_extrapolation_is_fedavg_bit_for_bit(tiny_config):
    config = tiny_config.replace(weighting="uniform", weight_decay=1e-3)  # momentum 0.5
    fedavg = run(config, progress=False)
    fedswa = run(config.replace(algorithm="fedswa", fedswa_rho=1.0, fedswa_alpha=1.0),
                 progress=False)
    assert states_allclose(fedavg.final_state, fedswa.final_state, rtol=0, atol=0)
    assert [r["train_loss"] for r in fedavg.rows] == [r["train_loss"] for r in fedswa.rows]
    for changes in ({"fedswa_rho": 0.1, "fedswa_alpha": 1.0},
                    {"fedswa_rho": 1.0, "fedswa_alpha": 1.5}):  # each part changes the run
        other = run(config.replace(algorithm="fedswa", **changes), progress=False)
        assert not states_allclose(fedavg.final_state, other.final_state, rtol=0, atol=1e-6)


def test_defaults_are_the_papers():
    config = RunConfig(algorithm="fedswa").resolved()
    assert (config.fedswa_rho, config.fedswa_alpha, config.weighting) == (0.1, 1.5, "uniform")


@pytest.mark.parametrize("algorithm", ["fedswa", "fedmoswa"])
def test_vmap_backend_trains_on_the_loop_with_the_same_result(tiny_config, algorithm):
    config = tiny_config.replace(algorithm=algorithm, rounds=2)
    loop = run(config.replace(backend="loop"), progress=False)
    vmap = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=0, atol=0)


@pytest.mark.parametrize("algorithm", ["fedswa", "fedmoswa"])
def test_resume_equals_the_uninterrupted_run(tiny_config, tmp_path, algorithm):
    config = tiny_config.replace(algorithm=algorithm, rounds=5, clients_per_round=2,
                                 checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)


@pytest.mark.parametrize("algorithm", ["fedswa", "fedmoswa"])
def test_runs_on_the_toy(algorithm):
    config = toy.toy_config(algorithm, rounds=4, num_clients=3, clients_per_round=2)
    assert run(config, progress=False).status == "completed"


@pytest.mark.parametrize("algorithm", ["fedswa", "fedmoswa"])
def test_runs_from_the_command_line_and_bad_values_are_one_line_errors(algorithm, capsys):
    from flnotes.cli.main import main

    small = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2", "--data-option",
             "num_train=400", "--data-option", "num_test=100", "--device", "cpu"]
    extra = ["--moswa-gamma", "0.3"] if algorithm == "fedmoswa" else []
    assert main(["run", "--algorithm", algorithm, "--fedswa-rho", "0.5", "--fedswa-alpha",
                 "1.2", *extra, *small]) == 0
    capsys.readouterr()
    assert main(["run", "--algorithm", algorithm, "--fedswa-rho", "1.5", *small]) == 2
    assert "fedswa_rho" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fedswa_alpha"):
        RunConfig(algorithm=algorithm, fedswa_alpha=0.0)


# ---- FedMoSWA -----------------------------------------------------------------------
def test_corrected_local_steps_match_a_hand_computation():
    torch.manual_seed(4)
    x, y = torch.randn(5, 3), torch.tensor([1, 0, 1, 0, 0])
    task = LinearTask(x, y)
    config = linear_config(algorithm="fedmoswa", fedswa_rho=0.2)
    start = OrderedDict((n, t.detach().clone()) for n, t in task.model.state_dict().items())
    strategy = build_strategy(config, start)
    strategy.control = OrderedDict((n, torch.randn_like(t)) for n, t in start.items())  # m
    c_i = OrderedDict((n, torch.randn_like(t)) for n, t in start.items())
    strategy.store.hold([0])
    strategy.store.put(0, c_i, 0)
    result = strategy.local_update(task, 1, 0, start, torch.Generator().manual_seed(7))
    rates = [0.3 * (1 - 0.8 * k / 6) for k in range(6)]
    correction = {n: strategy.control[n] - c_i[n] for n in start}  # g - c_i + m
    expected = steps_by_hand(start, x, y, config, rates, correction)
    for n in expected:
        torch.testing.assert_close(result.state[n], expected[n], rtol=1e-5, atol=1e-6)


def test_option_two_and_the_momentum_variate_on_hand_made_results():
    config = linear_config(algorithm="fedmoswa", num_clients=4, local_epochs=1, batch_size=2,
                           lr=0.5, fedswa_rho=0.5, fedswa_alpha=1.0, moswa_gamma=0.25)
    x = OrderedDict(w=torch.tensor([1.0, -1.0]))
    strategy = build_strategy(config, x)
    m = torch.tensor([0.2, 0.4])
    strategy.control = OrderedDict(w=m.clone())
    strategy.store.hold([0, 1])
    c0 = torch.tensor([1.0, 0.0])
    strategy.store.put(0, OrderedDict(w=c0), 0)  # client 1 keeps c_1 = 0
    y0, y1 = torch.tensor([0.0, 1.0]), torch.tensor([2.0, -3.0])
    results = [ClientResult(0, OrderedDict(w=y0), 4, 0.0),   # K = 2: rates 0.5, 0.375
               ClientResult(1, OrderedDict(w=y1), 6, 0.0)]   # K = 3: 0.5, 0.41667, 0.33333
    new_x = strategy.aggregate(1, results)
    c0_new = c0 - m + (x["w"] - y0) / 0.875
    c1_new = 0 - m + (x["w"] - y1) / 1.25
    torch.testing.assert_close(strategy.store.get(0)["w"], c0_new)
    torch.testing.assert_close(strategy.store.get(1)["w"], c1_new)
    # m <- m + gamma (1/s) sum (c_i+ - m)
    torch.testing.assert_close(strategy.control["w"],
                               m + 0.25 * ((c0_new - m) + (c1_new - m)) / 2)
    torch.testing.assert_close(new_x["w"], (y0 + y1) / 2)  # alpha = 1: the uniform mean


class NoCorrection(FedMoSWA):
    """FedMoSWA with its control variates kept but never applied."""

    def correction(self, client):
        return None


def test_round_one_and_without_the_correction_it_is_fedswa_bit_for_bit(tiny_config,
                                                                       monkeypatch):
    config = tiny_config.replace(weight_decay=1e-3)
    fedswa = run(config.replace(algorithm="fedswa", rounds=1), progress=False)
    fedmoswa = run(config.replace(algorithm="fedmoswa", rounds=1), progress=False)
    assert states_allclose(fedswa.final_state, fedmoswa.final_state, rtol=0, atol=0)
    three = config.replace(rounds=3)
    fedswa = run(three.replace(algorithm="fedswa"), progress=False)
    fedmoswa = run(three.replace(algorithm="fedmoswa"), progress=False)
    assert not states_allclose(fedswa.final_state, fedmoswa.final_state, rtol=0, atol=1e-6)
    monkeypatch.setattr(FedMoSWA, "correction", NoCorrection.correction)
    bare = run(three.replace(algorithm="fedmoswa"), progress=False)
    assert states_allclose(fedswa.final_state, bare.final_state, rtol=0, atol=0)


def test_constant_rate_full_participation_and_gamma_one_is_scaffold(tiny_config):
    # every client every round: m = mean of the fresh c_i = SCAFFOLD's c (its invariant)
    config = tiny_config.replace(clients_per_round=6, rounds=3, weighting="uniform")
    scaffold = run(config.replace(algorithm="scaffold"), progress=False)  # momentum 0.5
    fedmoswa = run(config.replace(algorithm="fedmoswa", fedswa_rho=1.0, fedswa_alpha=1.0,
                                  moswa_gamma=1.0), progress=False)
    assert states_allclose(scaffold.final_state, fedmoswa.final_state, rtol=1e-4, atol=1e-5)
    fedswa = run(config.replace(algorithm="fedswa", fedswa_rho=1.0, fedswa_alpha=1.0),
                 progress=False)
    assert not states_allclose(fedswa.final_state, fedmoswa.final_state, rtol=1e-4, atol=1e-5)


def test_fedmoswa_defaults_are_the_papers():
    config = RunConfig(algorithm="fedmoswa").resolved()
    assert (config.fedswa_rho, config.fedswa_alpha, config.moswa_gamma) == (0.1, 1.5, 0.2)
    with pytest.raises(ValueError, match="moswa_gamma"):
        RunConfig(algorithm="fedswa", moswa_gamma=0.2)  # FedSWA does not read it
