"""flnotes/fedavg_one_screen.py, the reading path: its plain-PyTorch FedAvg gives the engine's
global models round by round, bit for bit, on a small network and on the 2-D toy."""

import pytest
import torch

from flnotes import fedavg_one_screen as one
from flnotes.config import RunConfig
from flnotes.engine.sim import initial_state, run
from flnotes.engine.tasks import build_task


def _engine_and_one_screen(config):
    task = build_task(config)
    model = task.model_factory()
    model.load_state_dict(initial_state(config, task))
    clients = [task.client_data(k) for k in range(config.num_clients)]
    ours = one.fedavg(model, clients, rounds=config.rounds,
                      clients_per_round=config.clients_per_round,
                      epochs=config.local_epochs, batch_size=config.batch_size, lr=config.lr,
                      momentum=config.momentum, weight_decay=config.weight_decay,
                      seed=config.seed, loss_fn=task.loss_fn)
    history = run(config.replace(record_states=True), progress=False)
    return ours, [step["global"] for step in history.trajectory], history


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_one_screen_fedavg_is_the_engines_fedavg(model):
    config = RunConfig(algorithm="fedavg", dataset="synthetic", model=model,
                       data_options={"num_train": 600, "num_test": 100}, num_clients=6,
                       clients_per_round=3, rounds=3, local_epochs=2, batch_size=32, lr=0.05,
                       momentum=0.5, weight_decay=1e-4, seed=3, device="cpu", backend="loop")
    ours, engine, _ = _engine_and_one_screen(config)
    assert len(ours) == len(engine) == 3
    for t, (a, b) in enumerate(zip(ours, engine, strict=True), start=1):
        assert list(a) == list(b)
        for name in a:
            assert torch.equal(a[name], b[name]), (model, t, name)


def test_one_screen_fedavg_is_the_engines_fedavg_on_the_toy():
    from flnotes import toy

    config = toy.toy_config("fedavg", rounds=4, num_clients=4, clients_per_round=2,
                            lr=0.1, seed=1).replace(device="cpu", backend="loop")
    ours, engine, _ = _engine_and_one_screen(config)
    for a, b in zip(ours, engine, strict=True):
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(ours[0][n], ours[-1][n]) for n in ours[0])  # it moved


def test_one_screen_accuracy_is_the_engines():
    config = RunConfig(algorithm="fedavg", dataset="synthetic", model="mlp",
                       data_options={"num_train": 600, "num_test": 200}, num_clients=4,
                       clients_per_round=2, rounds=4, local_epochs=2, batch_size=20, lr=0.1,
                       seed=0, device="cpu", backend="loop")
    ours, _, history = _engine_and_one_screen(config)
    task = build_task(config)
    got = one.accuracy(task.model_factory(), ours[-1], (task.test_x, task.test_y))
    assert got == history.rows[-1]["accuracy"] and got > 0.2  # above chance (0.1)
