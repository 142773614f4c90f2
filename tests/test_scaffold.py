"""SCAFFOLD against FedAvg, its invariant and a hand computation of one corrected step."""

from collections import OrderedDict

import torch
from torch import nn

from flnotes.algorithms import build_strategy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.scaffold import CONTROL, control_penalty, trainable_layer_names
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.models import build_model


def test_round_one_with_zero_control_variates_equals_fedavg_bit_for_bit(tiny_config):
    config = tiny_config.replace(rounds=1, weighting="uniform")  # momentum 0.5 too
    fedavg = run(config, progress=False)
    scaffold = run(config.replace(algorithm="scaffold"), progress=False)
    assert states_allclose(fedavg.final_state, scaffold.final_state, rtol=0, atol=0)
    samples = config.replace(weighting="samples")
    assert states_allclose(run(samples, progress=False).final_state,
                           run(samples.replace(algorithm="scaffold"), progress=False).final_state,
                           rtol=0, atol=0)


def test_later_rounds_differ_from_fedavg(tiny_config):
    config = tiny_config.replace(rounds=3, weighting="uniform", momentum=0.0)
    fedavg = run(config, progress=False)
    scaffold = run(config.replace(algorithm="scaffold"), progress=False)
    assert not states_allclose(fedavg.final_state, scaffold.final_state, rtol=0, atol=1e-6)


def test_server_variate_is_the_mean_of_the_client_variates_under_full_participation(
        tiny_config):
    config = tiny_config.replace(algorithm="scaffold", clients_per_round=6, rounds=3,
                                 momentum=0.0)
    sim = Simulation(config)
    for rnd in range(1, 4):
        clients, starts = sim.begin_round(rnd)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        sim.end_round(rnd, clients, starts, results, 0.0)
    strategy = sim.strategy
    variates = strategy.store.hold(range(6))
    for n, c in strategy.control.items():
        mean = torch.stack([v[n] for v in variates]).mean(0)
        torch.testing.assert_close(c, mean, rtol=1e-5, atol=1e-6)
        assert c.abs().max() > 0


def test_corrected_local_step_matches_a_hand_computation():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    start = OrderedDict((n, t.detach().clone()) for n, t in model.state_dict().items())
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    c = {n: torch.randn_like(t) for n, t in start.items()}
    c_i = {n: torch.randn_like(t) for n, t in start.items()}
    anchor = {**start, **{CONTROL + n: c[n] - c_i[n] for n in start}}
    lr = 0.1
    got, _ = local_sgd(model, start, x, y, epochs=1, batch_size=4, lr=lr, momentum=0.0,
                       weight_decay=0.0, generator=torch.Generator().manual_seed(0),
                       loss_fn=nn.functional.cross_entropy, penalty=control_penalty,
                       anchor=anchor)
    # By hand: y <- y - lr (g_i(y) - c_i + c) (Alg. 1 l. 10), g_i by autograd on the batch.
    w = start["weight"].clone().requires_grad_()
    b = start["bias"].clone().requires_grad_()
    nn.functional.cross_entropy(x @ w.T + b, y).backward()
    torch.testing.assert_close(got["weight"], start["weight"] - lr * (w.grad - c_i["weight"]
                                                                      + c["weight"]))
    torch.testing.assert_close(got["bias"], start["bias"] - lr * (b.grad - c_i["bias"]
                                                                  + c["bias"]))


def test_option_two_variates_and_server_update_on_hand_made_results(tiny_config):
    config = tiny_config.replace(algorithm="scaffold", num_clients=4, clients_per_round=2,
                                 server_lr=0.5, local_epochs=2, batch_size=3, lr=0.1,
                                 momentum=0.0)  # the paper's option II (plain SGD)
    x = OrderedDict(w=torch.tensor([1.0, 2.0]))
    strategy = build_strategy(config, x)
    strategy.control = OrderedDict(w=torch.tensor([0.5, -0.5]))
    strategy.dispatch(1, [0, 3])
    strategy.store.put(3, OrderedDict(w=torch.tensor([1.0, 1.0])), 0)
    results = [ClientResult(0, OrderedDict(w=torch.tensor([0.0, 2.0])), 7, 0.0),
               ClientResult(3, OrderedDict(w=torch.tensor([1.0, 0.0])), 3, 0.0)]
    new_x = strategy.aggregate(1, results)
    c = torch.tensor([0.5, -0.5])
    k0, k3 = 2 * 3, 2 * 1  # epochs x ceil(n / B): 7 samples -> 3 batches, 3 -> 1
    c0 = 0 - c + (x["w"] - results[0].state["w"]) / (k0 * 0.1)
    c3 = torch.tensor([1.0, 1.0]) - c + (x["w"] - results[1].state["w"]) / (k3 * 0.1)
    held = strategy.store.hold([0, 3])
    torch.testing.assert_close(held[0]["w"], c0)
    torch.testing.assert_close(held[1]["w"], c3)
    mean_y = (results[0].state["w"] + results[1].state["w"]) / 2  # uniform by default
    torch.testing.assert_close(new_x["w"], x["w"] + 0.5 * (mean_y - x["w"]))
    change = (c0 - 0) + (c3 - torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(strategy.control["w"], c + change / 4)  # (|S|/N) mean = sum/N


def test_batchnorm_statistics_get_no_control_variate():
    model = build_model("resnet20", 10, (3, 16, 16))
    assert trainable_layer_names(model.state_dict()) == [n for n, _ in model.named_parameters()]


def test_option_two_with_momentum_divides_by_the_steps_momentum_takes():
    """K heavy-ball steps of a constant gradient move the model eta * S(K, m) * g: then
    option II's variate is that gradient exactly, with momentum as without."""
    from flnotes.algorithms.scaffold import effective_steps

    assert effective_steps(7, 0.0) == 7
    g, lr, m, k = torch.tensor([0.3, -1.2]), 0.1, 0.9, 12
    opt_param = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([opt_param], lr=lr, momentum=m)
    for _ in range(k):
        opt.zero_grad()
        (opt_param @ g).backward()  # constant gradient g
        opt.step()
    moved = -opt_param.detach()
    torch.testing.assert_close(moved / (lr * effective_steps(k, m)), g)


def test_learns_with_the_mutation_papers_momentum(tiny_config):
    """Momentum 0.9 (FedMut/FedMR's optimiser) no longer blows the variates up."""
    config = tiny_config.replace(algorithm="scaffold", momentum=0.9, rounds=4,
                                 clients_per_round=6, lr=0.05)
    history = run(config, progress=False)
    assert history.status == "completed"
    fedavg = run(config.replace(algorithm="fedavg", weighting="uniform"), progress=False)
    assert history.final_accuracy > 0.5 * fedavg.final_accuracy
