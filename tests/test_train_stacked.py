"""The fixed-shape (compilable) vmap step and batched FML against the loop backend."""

import pytest
import torch
from conftest import DEVICE
from helpers import client_starts, max_difference, random_task
from torch import nn

import flnotes.engine.batched.stacked as train_stacked_module
import flnotes.engine.batched.vmap as train_vmap_module
from flnotes.algorithms import build_strategy
from flnotes.config import RunConfig
from flnotes.engine.batched.stacked import client_lanes, supervised_objective, train_stacked
from flnotes.engine.batched.vmap import train_clients_vmap
from flnotes.engine.sim import run, sample_clients
from flnotes.engine.tasks import Task
from flnotes.engine.train import train_clients_loop

BASE = dict(algorithm="fedprox", mu=0.1, num_clients=3, clients_per_round=3, local_epochs=2,
            batch_size=5, lr=0.05, momentum=0.9, weight_decay=1e-3, device=DEVICE,
            backend="vmap")


@pytest.mark.parametrize("shrink", [True, False])
@pytest.mark.parametrize("model", ["cnn", "resnet20", "lstm"])
def test_stacked_step_equals_loop_in_float64(model, shrink):
    # Unequal clients and short batches. shrink=True: finished clients leave the stack (the
    # eager path); False: they stay, frozen by the client mask (the compiled path's shape).
    # Either way weights, momentum and BatchNorm buffers must be exactly the loop's.
    task = random_task(model, 3, 36, torch.float64)
    config = RunConfig(**BASE).resolved()
    starts = client_starts(task, 3)
    strategy = build_strategy(config, starts[0])
    clients = [2, 0, 1]  # not sorted by size: train_stacked sorts, and answers in this order
    assert len({task.num_samples(c) for c in clients}) == 3
    loop = train_clients_loop(task, strategy, 1, clients, starts, config)
    states, means = train_stacked(
        task, client_lanes(task, config, 1, clients), {"": starts}, config, ("test", shrink),
        lambda: supervised_objective(task.loss_fn, strategy.local_penalty),
        anchors=[strategy.penalty_anchor(s, c) for s, c in zip(starts, clients, strict=True)],
        shrink=shrink)
    for k, reference in enumerate(loop):
        for name, t in reference.state.items():
            assert float((states[""][k][name].double() - t.double()).abs().max()) < 1e-9
        assert means[k][0] == pytest.approx(reference.train_loss, rel=1e-12)


def test_batched_fml_equals_loop_in_float64():
    task = random_task("cnn", 3, 36, torch.float64)
    task.client_test_indices = [torch.arange(2, device=DEVICE)] * 3  # FML's held-out rows
    config = RunConfig.from_dict({**BASE, "algorithm": "fml", "personal_weight": 0.3,
                                  "meme_weight": 0.6}).resolved()
    starts = client_starts(task, 3)
    loop_fml, batched_fml = build_strategy(config, starts[0]), build_strategy(config, starts[0])
    clients = [1, 2, 0]
    for rnd in (1, 2):  # round 2 starts from the personal models round 1 left behind
        loop = train_clients_loop(task, loop_fml, rnd, clients, starts, config)
        fast = train_clients_vmap(task, batched_fml, rnd, clients, starts, config)
        assert max_difference(loop, fast) < 1e-9  # the meme models
        for a, b in zip(loop, fast, strict=True):
            assert b.train_loss == pytest.approx(a.train_loss, rel=1e-12)
            assert b.extra["personal_loss"] == pytest.approx(a.extra["personal_loss"], rel=1e-12)
        for c in clients:
            for name, t in loop_fml.personal[c].items():
                assert torch.allclose(batched_fml.personal[c][name], t, atol=1e-9, rtol=0)
    # The batched path ran (a cached stacked step exists), not the loop fallback.
    assert any(key[0] == "stacked-step" and key[1] == "fml" for key in task.backend_cache)


def test_a_reused_task_never_trains_with_an_old_strategys_step(monkeypatch):
    # Steps are cached on the Task. Python reuses the id of a freed object, so a key by id
    # could hand FedProx the step a freed FedAvg left behind (no penalty). Make every id
    # collide: a key that holds the strategy itself must still tell them apart.
    for module in (train_vmap_module, train_stacked_module):
        monkeypatch.setattr(module, "id", lambda obj: 0, raising=False)
    task = random_task("cnn", 3, 36, torch.float64)
    starts = client_starts(task, 3)
    fedavg = RunConfig.from_dict({**BASE, "algorithm": "fedavg"}).resolved()  # mu left out
    first = build_strategy(fedavg, starts[0])
    train_clients_vmap(task, first, 1, [0, 1, 2], starts, fedavg)
    config = RunConfig(**{**BASE, "mu": 10.0}).resolved()  # a penalty that shows
    strategy = build_strategy(config, starts[0])
    loop = train_clients_loop(task, strategy, 1, [0, 1, 2], starts, config)
    fast = train_clients_vmap(task, strategy, 1, [0, 1, 2], starts, config)
    assert max_difference(loop, fast) < 1e-9


class TinyBatchNormNet(nn.Module):
    """Conv + BatchNorm + linear on 6x6 inputs: BatchNorm under compile, cheap to compile."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 6 * 6, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def tiny_bn_task(num_clients: int = 5) -> Task:
    """Unequal clients (6, 10, 14, ... rows: short last batches of 2 at batch size 4)."""
    g = torch.Generator().manual_seed(1)
    sizes = [6 + 4 * k for k in range(num_clients)]
    ends = torch.tensor(sizes).cumsum(0).tolist()
    x = torch.randn(ends[-1], 1, 6, 6, generator=g)
    y = torch.randint(0, 4, (ends[-1],), generator=g)
    parts = [torch.arange(end - size, end, device=DEVICE)
             for size, end in zip(sizes, ends, strict=True)]
    x, y = x.to(DEVICE), y.to(DEVICE)
    return Task("tiny", lambda: TinyBatchNormNet().to(DEVICE), x, y, parts, x[:8], y[:8], 4)


# CUDA graphs exist only on a GPU (FLNOTES_TEST_DEVICE=cuda); on a CPU the mode is "default".
MODES = ["default"] + (["reduce-overhead"] if DEVICE.startswith("cuda") else [])


@pytest.mark.parametrize("mode", MODES)
def test_compiled_step_equals_loop_over_rounds(monkeypatch, mode):
    # Different clients every round (so the round's data differ in size) must reuse the one
    # compiled step: a recompilation is an error here. (A round with a batch of ONE row
    # compiles a second variant, for BatchNorm's 1-row check; these clients have none.)
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    config = RunConfig(**{**BASE, "num_clients": 5, "rounds": 3, "batch_size": 4,
                          "compile": mode})
    task = tiny_bn_task()
    loop = run(config.replace(backend="loop", compile="off"), progress=False, task=tiny_bn_task())
    fast = run(config, progress=False, task=task)
    assert len({tuple(sample_clients(config, r)) for r in (1, 2, 3)}) > 1
    for a, b in zip(loop.rows, fast.rows, strict=True):
        for key in ("train_loss", "accuracy", "loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["round"], key)
    for name, t in loop.final_state.items():
        torch.testing.assert_close(fast.final_state[name], t, atol=1e-5, rtol=1e-4)
    steps = [v[0] for k, v in task.backend_cache.items() if k[0] == "stacked-step"]
    assert len(steps) == 1  # built and compiled once for the run
    assert hasattr(steps[0], "_torchdynamo_orig_callable")  # it is torch.compile's
    # Another setting on the same task: a step with its own code object, so compiled graphs
    # never pile up under one code object (torch._dynamo gives up after 8 of them).
    run(config.replace(lr=0.02, rounds=1), progress=False, task=task)
    steps = [v[0] for k, v in task.backend_cache.items() if k[0] == "stacked-step"]
    codes = [step._torchdynamo_orig_callable.__code__ for step in steps]
    assert len(steps) == 2 and codes[0] is not codes[1]  # (equal, but not the same object)


def test_compile_needs_the_vmap_backend():
    with pytest.raises(ValueError, match="compile"):
        RunConfig(backend="loop", compile="default")
    with pytest.raises(ValueError, match="compile"):
        RunConfig(compile="fast")
