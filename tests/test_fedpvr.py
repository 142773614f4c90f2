"""FedPVR against its two ends (no variance-reduced layer: FedAvg; every layer: SCAFFOLD), the
layers it picks, its corrected and plain steps, the server invariant, resume and the toy."""

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms import build_strategy
from flnotes.algorithms.fedpvr import last_layers
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.models import build_model


def test_no_layer_is_fedavg_and_every_layer_is_scaffold_bit_for_bit(tiny_config):
    config = tiny_config.replace(rounds=3, weighting="uniform")
    fedavg = run(config, progress=False)
    none = run(config.replace(algorithm="fedpvr", pvr_layers=0), progress=False)
    assert states_allclose(fedavg.final_state, none.final_state, rtol=0, atol=0)
    scaffold = run(config.replace(algorithm="scaffold"), progress=False)
    every = run(config.replace(algorithm="fedpvr", pvr_layers=99), progress=False)
    assert states_allclose(scaffold.final_state, every.final_state, rtol=0, atol=0)
    head = run(config.replace(algorithm="fedpvr"), progress=False)
    assert not states_allclose(head.final_state, fedavg.final_state)
    assert not states_allclose(head.final_state, scaffold.final_state)


def test_the_layers_counted_from_the_output():
    state = build_model("resnet20", 10, (3, 32, 32)).state_dict()
    assert last_layers(state, 1) == ["fc.weight", "fc.bias"]
    two = last_layers(state, 2)  # the last block's second norm layer joins (no statistics)
    assert two == ["layers.2.2.norm2.weight", "layers.2.2.norm2.bias", "fc.weight", "fc.bias"]
    assert last_layers(state, 0) == []
    mlp = build_model("mlp", 10, (5,)).state_dict()
    assert last_layers(mlp, 99) == list(mlp)  # every trainable layer


def test_only_the_head_is_corrected_in_a_local_step():
    """One client's local SGD: the head moves by g - c_i + c, the body by g alone."""
    config = RunConfig(algorithm="fedpvr", dataset="synthetic", model="mlp", lr=0.1,
                       momentum=0.0, batch_size=8, local_epochs=1)
    model = build_model("mlp", 3, (4,))
    start = OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
    strategy = build_strategy(config, start)
    assert strategy.layers == ["fc3.weight", "fc3.bias"]
    strategy.control = OrderedDict((n, torch.full_like(start[n], 0.5)) for n in strategy.layers)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    g = torch.Generator().manual_seed(0)
    corrected, _ = local_sgd(model, start, x, y, epochs=1, batch_size=8, lr=0.1, momentum=0.0,
                             weight_decay=0.0, generator=g, loss_fn=F.cross_entropy,
                             penalty=strategy.local_penalty,
                             anchor=strategy.penalty_anchor(start, client=0))
    plain, _ = local_sgd(model, start, x, y, epochs=1, batch_size=8, lr=0.1, momentum=0.0,
                         weight_decay=0.0, generator=torch.Generator().manual_seed(0),
                         loss_fn=F.cross_entropy)
    for n in start:
        if n in strategy.layers:  # c - c_i = 0.5 everywhere (c_i = 0 for a new client)
            torch.testing.assert_close(corrected[n], plain[n] - 0.1 * 0.5)
        else:
            assert torch.equal(corrected[n], plain[n])


def test_server_variate_is_the_mean_of_the_client_variates_under_full_participation(
        tiny_config):
    config = tiny_config.replace(algorithm="fedpvr", clients_per_round=6, rounds=3,
                                 momentum=0.0)
    sim = Simulation(config)
    for rnd in range(1, 4):
        clients, starts = sim.begin_round(rnd)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        sim.end_round(rnd, clients, starts, results, 0.0)
    strategy = sim.strategy
    assert list(strategy.control) == strategy.layers == ["fc3.weight", "fc3.bias"]
    variates = strategy.store.hold(range(6))
    for n, c in strategy.control.items():
        mean = torch.stack([v[n] for v in variates]).mean(0)
        torch.testing.assert_close(c, mean, rtol=1e-5, atol=1e-6)
        assert c.abs().max() > 0


def test_resume_with_clients_sampled_skipped_and_sampled_again(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedpvr", rounds=5, clients_per_round=2,
                                 checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_the_batched_backend_gives_the_loop_s_models(tiny_config):
    config = tiny_config.replace(algorithm="fedpvr", rounds=3)
    loop = run(config.replace(backend="loop"), progress=False)
    vmap = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=1e-4, atol=1e-5)


def test_runs_on_the_toy():
    history = run(toy.toy_config("fedpvr", rounds=4, num_clients=3, clients_per_round=2),
                  progress=False)
    assert history.status == "completed"


def test_bad_layer_count_is_a_one_line_error():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="pvr_layers"):
            RunConfig(algorithm="fedpvr", pvr_layers=bad)
