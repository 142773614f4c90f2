"""MOON against references: FedAvg on the same network (mu = 0, and round 1), eq. 3 by hand,
a local step by autograd, the previous models kept per client, resume, the toy."""

import math
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.moon import MOON, contrastive_loss
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import classifier_head, states_allclose
from flnotes.engine.tasks import build_task
from flnotes.models import build_model, model_names
from flnotes.rng import torch_generator

SHAPES = {"lstm": (80,), "lstm-100": (80,), "lenet5": (1, 28, 28), "femnist-cnn": (1, 28, 28),
          "mlp": (5,)}


@pytest.mark.parametrize("name", model_names())
def test_every_model_gets_a_projection_head_before_a_new_output_layer(name):
    shape = SHAPES.get(name, (3, 32, 32))
    plain = build_model(name, 7, shape).eval()
    old_head = plain.get_submodule(classifier_head(plain.state_dict()))
    seen = {}
    old_head.register_forward_pre_hook(lambda m, args: seen.update(features=args[0]))
    net = MOON.adapt_model(build_model(name, 7, shape), None).eval()
    # same encoder weights: the base is the plain model without its head
    for key, value in plain.state_dict().items():
        if not key.startswith(classifier_head(plain.state_dict()) + "."):
            net.state_dict()["base." + key].copy_(value)
    x = (torch.randint(0, 7, (2, *shape)) if name.startswith("lstm")
         else torch.randn(2, *shape))
    with torch.no_grad():
        plain(x)
        features = net.base(x)
        logits = net(x)
    assert torch.equal(features, seen["features"])
    assert net.projection[2].out_features == 256 and logits.shape == (2, 7)
    assert classifier_head(net.state_dict()) == "head"
    assert net.projection[0].in_features == net.projection[0].out_features == old_head.in_features


def test_contrastive_loss_is_eq3_by_hand():
    g = torch_generator(0, "moon")
    z, zg, zp = (torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    total = 0.0
    for b in range(4):
        def cos(u, v):
            return float(u @ v / (u.norm() * v.norm()))
        pos, neg = math.exp(cos(z[b], zg[b]) / 0.5), math.exp(cos(z[b], zp[b]) / 0.5)
        total += -math.log(pos / (pos + neg))
    assert contrastive_loss(z, zg, zp, 0.5).item() == pytest.approx(total / 4, rel=1e-12)
    # the same representation as the global one and an orthogonal previous one: small loss
    assert contrastive_loss(z, z, zp, 0.5) < contrastive_loss(z, zp, z, 0.5)


@pytest.fixture
def moon_config(tiny_config):
    return tiny_config.replace(algorithm="moon", rounds=3)


def test_mu_zero_and_round_one_are_fedavg_on_the_same_network(moon_config):
    task = build_task(moon_config)
    fedavg = run(moon_config.replace(algorithm="fedavg"), progress=False, task=task)
    zero = run(moon_config.replace(moon_mu=0.0), progress=False, task=task)
    assert states_allclose(fedavg.final_state, zero.final_state, rtol=0, atol=0)
    assert fedavg.metric("accuracy") == zero.metric("accuracy")
    one = run(moon_config.replace(rounds=1), progress=False, task=task)
    avg_one = run(moon_config.replace(algorithm="fedavg", rounds=1), progress=False, task=task)
    assert states_allclose(one.final_state, avg_one.final_state, rtol=0, atol=0)
    on = run(moon_config, progress=False, task=task)
    assert not states_allclose(on.final_state, fedavg.final_state)
    assert MOON(moon_config, zero.final_state).mu == 1.0  # synthetic: the non-CIFAR-10 value
    assert MOON(RunConfig(algorithm="moon", dataset="cifar10"), zero.final_state).mu == 5.0


def test_a_local_step_is_ce_plus_mu_times_l_con_by_autograd(moon_config):
    config = moon_config.replace(num_clients=3, clients_per_round=3, batch_size=10_000,
                                 momentum=0.0, weight_decay=0.0, moon_mu=2.0, moon_tau=0.7)
    sim = Simulation(config)
    clients, starts = sim.begin_round(1)
    sim.end_round(1, clients, starts,
                  train_clients(sim.task, sim.strategy, 1, clients, starts, sim.config), 0.0)
    previous = OrderedDict((k, v.clone()) for k, v in sim.strategy.store.hold([0])[0].items())
    clients, starts = sim.begin_round(2)
    results = train_clients(sim.task, sim.strategy, 2, clients, starts, sim.config)
    # one batch (the whole client), one step by hand
    net = sim.task.model_factory()
    net.load_state_dict(starts[0])
    glob, prev = sim.task.model_factory().eval(), sim.task.model_factory().eval()
    glob.load_state_dict(starts[0])
    prev.load_state_dict(previous)
    x, y = sim.task.client_data(0)
    order = torch.randperm(len(y), generator=torch_generator(config.seed, "batches", 2, 0))
    x, y = x[order], y[order]

    def represent(model, inputs):
        return model.projection(model.base(inputs))

    z = represent(net, x)
    with torch.no_grad():
        zg, zp = represent(glob, x), represent(prev, x)
    sim_g, sim_p = F.cosine_similarity(z, zg), F.cosine_similarity(z, zp)
    l_con = -(sim_g / 0.7 - torch.logsumexp(torch.stack([sim_g, sim_p]) / 0.7, dim=0)).mean()
    loss = F.cross_entropy(net.head(z), y) + 2.0 * l_con
    grads = torch.autograd.grad(loss, list(net.parameters()))
    for (name, p), g in zip(net.named_parameters(), grads, strict=True):
        torch.testing.assert_close(results[0].state[name], p.detach() - config.lr * g,
                                   rtol=1e-5, atol=1e-6)


def test_previous_models_are_each_clients_last_local_model(moon_config):
    config = moon_config.replace(num_clients=4, clients_per_round=2, rounds=5,
                                 record_states=True)
    sim = Simulation(config)
    for rnd in range(1, 6):
        clients, starts = sim.begin_round(rnd)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        sim.end_round(rnd, clients, starts, results, 0.0)
    last = {}
    for step in sim.history.trajectory:
        for client, state in zip(step["clients"], step["local"], strict=True):
            last[client] = state
    assert len(last) >= 3  # some clients sat rounds out and came back
    held = sim.strategy.store.hold(range(4))
    for client in range(4):
        expected = last.get(client, sim.strategy.initial)
        assert states_allclose(held[client], expected, rtol=0, atol=0), client


def test_resume_gives_the_uninterrupted_run(moon_config, tmp_path):
    config = moon_config.replace(rounds=5, clients_per_round=2, checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_the_batched_backend_falls_back_to_the_loop(moon_config):
    loop = run(moon_config.replace(backend="loop"), progress=False)
    vmap = run(moon_config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=0, atol=0)


def test_a_task_built_for_another_method_is_refused_in_one_line(tiny_config):
    task = build_task(tiny_config)  # FedAvg's: no projection head
    with pytest.raises(ValueError, match="no projection head"):
        run(tiny_config.replace(algorithm="moon"), progress=False, task=task)


def test_no_head_on_the_toy_trains_as_fedavg():
    config = toy.toy_config("fedavg", rounds=3, num_clients=3, clients_per_round=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moon = run(config.replace(algorithm="moon"), progress=False)
    assert any("FedAvg" in str(w.message) for w in caught)
    assert states_allclose(moon.final_state, run(config, progress=False).final_state,
                           rtol=0, atol=0)


def test_without_a_head_moon_trains_as_fedavg_does_so_its_seeds_stack(moon_config):
    """Known before a run: MOON's own update needs a classifier head. Without one (the toy)
    its clients train by FedAvg's training, on any backend, and its seeds stack; with one
    they run MOON's update."""
    from flnotes.toy.experiments import stacks_seeds
    from flnotes.toy.task import state_of

    assert not MOON.uses_custom_update(state_of((0.0, 0.0)))
    task = build_task(moon_config)
    assert MOON.uses_custom_update(task.working_model().state_dict())
    config = toy.toy_config("moon", rounds=3, num_clients=3, clients_per_round=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = Simulation(config).strategy
        loop = run(config.replace(backend="loop"), progress=False)
        vmap = run(config.replace(backend="vmap"), progress=False)
    assert strategy.custom_local_update is False and MOON.custom_local_update is True
    assert stacks_seeds("moon") and not stacks_seeds("fml")
    assert states_allclose(loop.final_state, vmap.final_state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("field,value", [("moon_mu", -1.0), ("moon_tau", 0.0),
                                         ("moon_tau", float("inf"))])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfig(algorithm="moon", **{field: value})
