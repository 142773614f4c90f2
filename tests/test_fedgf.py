"""FedGF against references: FedSAM (c = 0) and FedAvg (rho = c = 0), the perturbed global
model and the windowed c by hand, a local step by hand with autograd, resume, the loop
(vmap falls back), the toy and the command line."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_falls_back_to_loop, assert_resumes
from torch import nn

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedgf import FedGF, perturbed_global
from flnotes.algorithms.fedsam import GRAD_NORM_EPS
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.rng import torch_generator


def test_c_zero_is_fedsam_and_rho_zero_too_is_fedavg(tiny_config):
    config = tiny_config.replace(backend="loop")
    sam = run(config.replace(algorithm="fedsam", sam_rho=0.2), progress=False)
    gf = run(config.replace(algorithm="fedgf", gf_rho=0.2, gf_c=0.0), progress=False)
    assert states_allclose(sam.final_state, gf.final_state, rtol=0, atol=0)
    avg = run(config.replace(algorithm="fedavg"), progress=False)
    plain = run(config.replace(algorithm="fedgf", gf_rho=0.0, gf_c=0.0), progress=False)
    assert states_allclose(avg.final_state, plain.final_state, rtol=0, atol=0)
    # The default c = 0.3 acts from round 2 on: round 1 is SAM's.
    default = run(config.replace(algorithm="fedgf", gf_rho=0.2), progress=False)
    assert not states_allclose(default.final_state, gf.final_state)
    one = run(config.replace(algorithm="fedgf", gf_rho=0.2, rounds=1), progress=False)
    sam1 = run(config.replace(algorithm="fedsam", sam_rho=0.2, rounds=1), progress=False)
    assert states_allclose(one.final_state, sam1.final_state, rtol=0, atol=0)


def test_server_perturbs_the_global_model_and_reads_c_from_its_window():
    """w~ = w^t + rho_g d/||d||, d = w^(t-1) - w^t; c = share of the last W rounds whose
    mean client drift ||w^(t-1) - w_k|| exceeded T_D."""
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    start = {"w": torch.randn(2, 3, generator=g, dtype=dt), "b": torch.randn(3, generator=g,
             dtype=dt), "bn.running_mean": torch.zeros(3, dtype=dt)}
    config = RunConfig(algorithm="fedgf", gf_rho=0.1, gf_global_rho=0.4, gf_threshold=1.5,
                       gf_window=2, weighting="samples")
    strategy = FedGF(config, start)
    assert strategy.perturbed is None and strategy.c == 0.0
    flags = []
    for r, size in enumerate([0.1, 3.0, 0.1, 3.0, 3.0], start=1):
        prev = strategy.global_state
        states = [{k: v + size * torch.randn(v.shape, generator=g, dtype=dt)
                   for k, v in prev.items()} for _ in range(3)]
        drift = sum(torch.sqrt(sum(((prev[n] - s[n]) ** 2).sum() for n in ("w", "b")))
                    for s in states) / 3
        flags.append(float(drift > 1.5))
        # unequal sizes: the mean model is weighted, the drift is not
        sizes = (2, 5, 9)
        new = strategy.aggregate(r, [ClientResult(i, s, k, 0.0) for i, (s, k)
                                     in enumerate(zip(states, sizes, strict=True))])
        mean = {n: sum(k * s[n] for s, k in zip(states, sizes, strict=True)) / 16
                for n in ("w", "b")}
        assert all(torch.allclose(new[n], mean[n], rtol=1e-12) for n in mean)
        assert strategy.c == pytest.approx(sum(flags[-2:]) / len(flags[-2:]))
        d = {n: prev[n] - new[n] for n in ("w", "b")}
        norm = torch.sqrt(sum((t ** 2).sum() for t in d.values()))
        for n in ("w", "b"):
            assert torch.allclose(strategy.perturbed[n], new[n] + 0.4 * d[n] / norm, rtol=1e-12)
        assert torch.equal(strategy.perturbed["bn.running_mean"], new["bn.running_mean"])
    assert flags == [0.0, 1.0, 0.0, 1.0, 1.0]  # the drift sizes were chosen to cross T_D
    # Unset threshold: c is gf_c whatever the drift; a model that did not move: w~ = w.
    assert FedGF(config.replace(gf_threshold=None, gf_c=0.7), start).c == 0.7
    same = perturbed_global(start, start, 0.4)
    assert all(torch.equal(same[k], start[k]) for k in start)
    # The setting the rule for c does not read is named before the run.
    assert "gf_c=0.5 is not read" in FedGF.config_warnings(config.replace(gf_c=0.5))[0]
    assert "gf_window=5 is not read" in FedGF.config_warnings(
        config.replace(gf_threshold=None, gf_window=5))[0]
    assert FedGF.config_warnings(config) == []


def gf_steps_by_hand(w, b, x, y, steps, *, target, c, rho, lr, momentum, wd):
    """FedGF's local steps on a linear model: g at w, e = rho g/||g||, the gradient at
    c w~ + (1 - c)(w + e), an SGD step from w (momentum, weight decay at w)."""
    bufs, losses = None, []
    for _ in range(steps):
        w0, b0 = w.clone().requires_grad_(), b.clone().requires_grad_()
        loss = F.cross_entropy(x @ w0.T + b0, y)
        losses.append(float(loss.detach()))
        gw, gb = torch.autograd.grad(loss, (w0, b0))
        norm = torch.sqrt((gw ** 2).sum() + (gb ** 2).sum()) + GRAD_NORM_EPS
        wp = (c * target["weight"] + (1 - c) * (w + rho * gw / norm)).requires_grad_()
        bp = (c * target["bias"] + (1 - c) * (b + rho * gb / norm)).requires_grad_()
        gw, gb = torch.autograd.grad(F.cross_entropy(x @ wp.T + bp, y), (wp, bp))
        dw, db = gw + wd * w, gb + wd * b
        bufs = (dw, db) if bufs is None else (momentum * bufs[0] + dw, momentum * bufs[1] + db)
        w, b = w - lr * bufs[0], b - lr * bufs[1]
    return w, b, sum(losses) / len(losses)


def test_local_steps_match_the_interpolated_gradient_by_hand():
    g = torch_generator(0, "fedgf-test")
    model = nn.Linear(4, 3)
    start = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    target = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    strategy = FedGF(RunConfig(algorithm="fedgf", gf_rho=0.3, gf_c=0.4), start)
    strategy.perturbed = target
    state, loss = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                            weight_decay=1e-2, generator=torch_generator(0, "b"),
                            loss_fn=F.cross_entropy, local_gradient=strategy.local_gradient)
    w, b, mean_loss = gf_steps_by_hand(start["weight"], start["bias"], x, y, 3, target=target,
                                       c=0.4, rho=0.3, lr=0.1, momentum=0.5, wd=1e-2)
    assert torch.allclose(state["weight"], w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(state["bias"], b, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(mean_loss, rel=1e-5)  # the loss at w, as FedSAM reports


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedgf", rounds=4, checkpoint_every=1,
                                 backend="loop", gf_threshold=0.05, gf_window=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=2)
    assert [r["train_loss"] for r in full.rows] == [r["train_loss"] for r in resumed.rows]


def test_vmap_falls_back_to_the_loop_once_with_the_same_results(tiny_config, monkeypatch):
    assert_falls_back_to_loop(tiny_config.replace(algorithm="fedgf", rounds=3), monkeypatch,
                              "perturbed global model")


def test_runs_on_the_toy_and_from_the_command_line(tmp_path, capsys):
    from flnotes.cli.main import main

    config = toy.toy_config("fedgf", rounds=4, num_clients=3, clients_per_round=2, gf_rho=0.05)
    history = run(config, progress=False)
    fedsam = run(toy.toy_config("fedsam", rounds=4, num_clients=3, clients_per_round=2,
                                sam_rho=0.05), progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    assert not states_allclose(history.final_state, fedsam.final_state)
    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "fedgf", "--dataset", "toy", "--gf-c", "0.5",
                 "--rounds", "3", "--num-clients", "2", "--clients-per-round", "2",
                 "--device", "cpu", "--run-dir", str(folder)]) == 0
    assert (folder / "metrics.jsonl").exists()
    assert main(["run", "--algorithm", "fedgf", "--gf-c", "1.5", "--dataset", "toy",
                 "--rounds", "1"]) == 2
    capsys.readouterr()
