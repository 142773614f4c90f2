"""FedLESAM against references: its local step and server state by hand, FedAvg (rho = 0),
an uninterrupted run (resume), the loop (vmap falls back, said once), the toy and the CLI."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_falls_back_to_loop, assert_resumes
from torch import nn

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedlesam import FedLESAM, global_offsets
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.rng import torch_generator


def test_rho_zero_equals_fedavg(tiny_config, monkeypatch):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedlesam", lesam_rho=0.0), progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == b.metric("accuracy")
    # The perturbed path itself with a zero radius: an offset of zeros, still FedAvg.
    monkeypatch.setattr(FedLESAM, "has_local_gradient", property(lambda self: True))
    c = run(tiny_config.replace(algorithm="fedlesam", lesam_rho=0.0, backend="loop"),
            progress=False)
    assert states_allclose(a.final_state, c.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == c.metric("accuracy")


def test_default_and_a_positive_rho_changes_the_result(tiny_config):
    assert FedLESAM(RunConfig(algorithm="fedlesam"), {"w": torch.zeros(2)}).rho == 0.1
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedlesam", backend="loop"), progress=False)
    assert not states_allclose(a.final_state, b.final_state)
    # Round 1 has no previous global model: plain SGD, FedAvg's round bit for bit.
    one = run(tiny_config.replace(algorithm="fedlesam", rounds=1), progress=False)
    avg = run(tiny_config.replace(algorithm="fedavg", rounds=1), progress=False)
    assert states_allclose(one.final_state, avg.final_state, rtol=0, atol=0)


def test_the_server_keeps_the_previous_global_model_and_fixes_the_offset():
    """e = rho (w^(t-1) - w^t) / (||w^(t-1) - w^t|| + 1e-7) over trainable layers only."""
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    start = {"w": torch.randn(2, 3, generator=g, dtype=dt), "b": torch.randn(3, generator=g,
             dtype=dt), "bn.running_mean": torch.zeros(3, dtype=dt),
             "bn.num_batches_tracked": torch.tensor(0)}
    strategy = FedLESAM(RunConfig(algorithm="fedlesam", lesam_rho=0.3, weighting="uniform"),
                        start)
    strategy.dispatch(1, [0, 1])
    assert not strategy.offsets  # no previous model in round 1
    globals_ = [start]
    for r in range(1, 4):
        states = [{k: (v + torch.randn(v.shape, generator=g, dtype=dt)
                       if v.is_floating_point() else v) for k, v in start.items()}
                  for _ in range(2)]
        new = strategy.aggregate(r, [ClientResult(i, s, 5, 0.0) for i, s in enumerate(states)])
        globals_.append(new)
        dispatched = strategy.dispatch(r + 1, [0, 1])
        assert all(d is new for d in dispatched)
        prev, cur = globals_[-2], globals_[-1]
        dw, db = prev["w"] - cur["w"], prev["b"] - cur["b"]
        norm = torch.sqrt((dw ** 2).sum() + (db ** 2).sum())
        assert set(strategy.offsets) == {"w", "b"}  # no BatchNorm statistics
        assert torch.allclose(strategy.offsets["w"], 0.3 * dw / (norm + 1e-7), rtol=1e-12)
        assert torch.allclose(strategy.offsets["b"], 0.3 * db / (norm + 1e-7), rtol=1e-12)
    # A global model that did not move: no offset (1e-7 keeps 0/0 away).
    same = global_offsets(start, start, 0.3)
    assert all(torch.count_nonzero(t) == 0 for t in same.values())


def lesam_steps_by_hand(weight, bias, x, y, steps, *, offsets, lr, momentum, wd):
    """FedLESAM's local steps with SGD (momentum, weight decay) on a linear model."""
    w, b = weight.clone(), bias.clone()
    bufs, losses = None, []
    for _ in range(steps):
        wp = (w + offsets["weight"]).requires_grad_()
        bp = (b + offsets["bias"]).requires_grad_()
        loss = F.cross_entropy(x @ wp.T + bp, y)  # the loss at w + e
        losses.append(float(loss.detach()))
        gw, gb = torch.autograd.grad(loss, (wp, bp))
        dw, db = gw + wd * w, gb + wd * b  # the step from w, weight decay at w
        bufs = (dw, db) if bufs is None else (momentum * bufs[0] + dw, momentum * bufs[1] + db)
        w, b = w - lr * bufs[0], b - lr * bufs[1]
    return w, b, sum(losses) / len(losses)


def test_local_steps_match_the_perturbed_gradient_by_hand():
    g = torch_generator(0, "fedlesam-test")
    model = nn.Linear(4, 3)
    previous = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    start = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    strategy = FedLESAM(RunConfig(algorithm="fedlesam", lesam_rho=0.4), start)
    strategy.previous = previous
    strategy.dispatch(2, [0])
    dw, db = previous["weight"] - start["weight"], previous["bias"] - start["bias"]
    norm = torch.sqrt((dw ** 2).sum() + (db ** 2).sum()) + 1e-7
    offsets = {"weight": 0.4 * dw / norm, "bias": 0.4 * db / norm}
    calls = []

    def counting(params, closure):
        def once():
            calls.append(1)
            return closure()
        return strategy.local_gradient(params, once)

    # Full batches, so the batch order cannot matter: three steps on the same 12 rows.
    state, loss = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                            weight_decay=1e-2, generator=torch_generator(0, "b"),
                            loss_fn=F.cross_entropy, local_gradient=counting)
    w, b, mean_loss = lesam_steps_by_hand(start["weight"], start["bias"], x, y, 3, offsets=offsets,
                               lr=0.1, momentum=0.5, wd=1e-2)
    assert len(calls) == 3  # one forward-backward pass a step
    assert torch.allclose(state["weight"], w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(state["bias"], b, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(mean_loss, rel=1e-5)  # the one pass's loss, at w + e
    plain, _ = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                         weight_decay=1e-2, generator=torch_generator(0, "b"),
                         loss_fn=F.cross_entropy)
    assert not torch.allclose(plain["weight"], w, rtol=1e-5, atol=1e-6)


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedlesam", rounds=4, checkpoint_every=2,
                                 backend="loop")
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["train_loss"] for r in full.rows] == [r["train_loss"] for r in resumed.rows]


def test_vmap_falls_back_to_the_loop_once_with_the_same_results(tiny_config, monkeypatch):
    assert_falls_back_to_loop(tiny_config.replace(algorithm="fedlesam", rounds=3), monkeypatch,
                              "fedlesam", "offset from the global models")


def test_runs_on_the_toy():
    config = toy.toy_config("fedlesam", rounds=4, num_clients=3, clients_per_round=2,
                            lesam_rho=0.05)
    history = run(config, progress=False)
    fedavg = run(toy.toy_config("fedavg", rounds=4, num_clients=3, clients_per_round=2),
                 progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    assert not states_allclose(history.final_state, fedavg.final_state)


def test_runs_from_the_command_line(tmp_path, capsys):
    from flnotes.cli.main import main

    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "fedlesam", "--dataset", "toy", "--lesam-rho", "0.2",
                 "--rounds", "3", "--num-clients", "2", "--clients-per-round", "2",
                 "--device", "cpu", "--run-dir", str(folder)]) == 0
    assert (folder / "metrics.jsonl").exists()
    assert main(["run", "--algorithm", "fedavg", "--lesam-rho", "0.2", "--dataset", "toy",
                 "--rounds", "1"]) == 2  # a setting FedAvg does not read
    assert main(["run", "--algorithm", "fedlesam", "--lesam-rho", "-1", "--dataset", "toy",
                 "--rounds", "1"]) == 2
    capsys.readouterr()
