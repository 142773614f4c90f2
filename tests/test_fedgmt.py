"""FedGMT against references: FedAvg (gamma 0 without duals), the trajectory loss written
out, a local step by hand with autograd (EMA teacher and dual term), the duals, the server's
dual term and the EMA by hand, resume, the loop (vmap falls back), the toy and the CLI."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_falls_back_to_loop, assert_resumes
from torch import nn

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedgmt import DUAL, FedGMT, trajectory_loss
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.rng import torch_generator


def test_without_distillation_and_duals_it_is_fedavg(tiny_config):
    avg = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    gmt = run(tiny_config.replace(algorithm="fedgmt", gmt_gamma=0.0, gmt_admm=False),
              progress=False)
    assert states_allclose(avg.final_state, gmt.final_state, rtol=0, atol=0)
    assert avg.metric("accuracy") == gmt.metric("accuracy")
    for change in ({"gmt_gamma": 0.5, "gmt_admm": False}, {"gmt_gamma": 0.0}):
        other = run(tiny_config.replace(algorithm="fedgmt", **change), progress=False)
        assert not states_allclose(avg.final_state, other.final_state)


def test_trajectory_loss_is_the_tempered_kl_written_out():
    g = torch_generator(0, "fedgmt-kl")
    student = torch.randn(5, 4, generator=g, dtype=torch.float64)
    teacher = torch.randn(5, 4, generator=g, dtype=torch.float64)
    gamma, tau = 0.7, 3.0
    total = 0.0
    for zs, zt in zip(student.tolist(), teacher.tolist(), strict=True):
        ns = sum(math.exp(v / tau) for v in zs)
        nt = sum(math.exp(v / tau) for v in zt)
        for a, b in zip(zs, zt, strict=True):
            p, q = math.exp(b / tau) / nt, math.exp(a / tau) / ns
            total += p * math.log(p / q)  # KL(EMA || local)
    expected = gamma * tau * tau * total / len(student)
    assert float(trajectory_loss(student, teacher, gamma, tau)) == pytest.approx(expected,
                                                                                  rel=1e-10)
    assert float(trajectory_loss(student[:, :1], teacher[:, :1], gamma, tau)) == 0.0


def test_local_steps_match_the_objective_by_hand():
    """Steps on CE + gamma tau^2 KL(f(e) || f(w)) + <w, d>/beta, with momentum and decay."""
    g = torch_generator(0, "fedgmt-step")
    model, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    start = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    ema = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    dual = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    config = RunConfig(algorithm="fedgmt", gmt_gamma=0.8, gmt_tau=2.0, gmt_beta=4.0)
    strategy = FedGMT(config, start)
    strategy.ema = dict(ema)
    strategy.store.put(0, dual, 1)
    teacher.load_state_dict(strategy.teacher_state(start, 0))
    teacher.eval().requires_grad_(False)
    state, _ = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                         weight_decay=1e-2, generator=torch_generator(0, "b"),
                         loss_fn=F.cross_entropy, penalty=strategy.local_penalty,
                         anchor=strategy.penalty_anchor(start, 0), teacher=teacher,
                         teacher_loss=strategy.teacher_loss)
    w, b, bufs = start["weight"].clone(), start["bias"].clone(), None
    target = F.softmax((x @ ema["weight"].T + ema["bias"]) / 2.0, dim=1)
    for _ in range(3):
        wv, bv = w.clone().requires_grad_(), b.clone().requires_grad_()
        out = x @ wv.T + bv
        kl = (target * (target.log() - F.log_softmax(out / 2.0, dim=1))).sum() / len(x)
        loss = (F.cross_entropy(out, y) + 0.8 * 4.0 * kl
                + ((wv * dual["weight"]).sum() + (bv * dual["bias"]).sum()) / 4.0)
        gw, gb = torch.autograd.grad(loss, (wv, bv))
        dw, db = gw + 1e-2 * w, gb + 1e-2 * b
        bufs = (dw, db) if bufs is None else (0.5 * bufs[0] + dw, 0.5 * bufs[1] + db)
        w, b = w - 0.1 * bufs[0], b - 0.1 * bufs[1]
    assert torch.allclose(state["weight"], w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(state["bias"], b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dual_mean", ["all", "active"])
def test_server_duals_dual_term_and_ema_by_hand(dual_mean):
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    start = {"w": torch.randn(2, 3, generator=g, dtype=dt), "b": torch.randn(3, generator=g,
             dtype=dt)}
    config = RunConfig(algorithm="fedgmt", num_clients=4, clients_per_round=2,
                       weighting="samples", gmt_alpha=0.9,
                       gmt_dual_mean=dual_mean)
    strategy = FedGMT(config, start)
    duals = {c: {n: torch.zeros_like(t) for n, t in start.items()} for c in range(4)}
    ema = {n: t.clone() for n, t in start.items()}
    for r, clients in enumerate([[0, 1], [1, 2], [0, 3]], start=1):
        w = strategy.global_state
        strategy.dispatch(r, clients)
        sizes = [3, 7]
        states = [{n: t + torch.randn(t.shape, generator=g, dtype=dt) for n, t in w.items()}
                  for _ in clients]
        new = strategy.aggregate(r, [ClientResult(c, s, k, 0.0)
                                     for c, s, k in zip(clients, states, sizes, strict=True)])
        for c, s in zip(clients, states, strict=True):
            duals[c] = {n: duals[c][n] + s[n] - w[n] for n in w}
        whose = range(4) if dual_mean == "all" else clients
        for n in w:
            mean = (3 * states[0][n] + 7 * states[1][n]) / 10
            added = sum(duals[c][n] for c in whose) / len(whose)
            assert torch.allclose(new[n], mean + added, rtol=1e-12)
            ema[n] = 0.9 * ema[n] + 0.1 * new[n]
            assert torch.allclose(strategy.ema[n], ema[n], rtol=1e-12)
        for c in range(4):
            anchor = strategy.penalty_anchor(new, c)
            assert torch.allclose(anchor[DUAL + "w"], duals[c]["w"], rtol=1e-12)


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedgmt", rounds=4, checkpoint_every=1)
    full, resumed = assert_resumes(config, tmp_path, stop_after=2)
    assert [r["train_loss"] for r in full.rows] == [r["train_loss"] for r in resumed.rows]


def test_vmap_falls_back_to_the_loop_once_with_the_same_results(tiny_config, monkeypatch):
    assert_falls_back_to_loop(tiny_config.replace(algorithm="fedgmt", rounds=3), monkeypatch,
                              "fedgmt")


def test_runs_on_the_toy_and_from_the_command_line(tmp_path, capsys):
    from flnotes.cli.main import main

    history = run(toy.toy_config("fedgmt", rounds=4, num_clients=3, clients_per_round=2),
                  progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "fedgmt", "--dataset", "toy", "--gmt-beta", "5",
                 "--rounds", "3", "--num-clients", "2", "--clients-per-round", "2",
                 "--device", "cpu", "--run-dir", str(folder)]) == 0
    assert (folder / "metrics.jsonl").exists()
    assert main(["run", "--algorithm", "fedgmt", "--gmt-dual-mean", "some", "--dataset",
                 "toy", "--rounds", "1"]) == 2
    capsys.readouterr()
