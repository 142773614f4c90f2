"""FedNTD against references: FedAvg (beta = 0), the not-true distillation loss written
out class by class, a local step by hand with the dispatched model as teacher, resume,
the loop (vmap falls back), the toy."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.fedntd import FedNTD, not_true_logits, ntd_loss
from flnotes.config import RunConfig
from flnotes.engine.sim import initial_state, run
from flnotes.engine.state import states_allclose
from flnotes.engine.tasks import build_task
from flnotes.engine.train import client_generator
from flnotes.rng import torch_generator


def ntd_by_hand(logits, teacher, targets, tau):
    """tau^2 (1/B) sum_b sum_{c != y_b} q_g(c) log(q_g(c) / q_l(c)), softmaxes over c != y_b
    (the tau^2 of the authors' NTD_Loss)."""
    total = 0.0
    for zl, zg, y in zip(logits.tolist(), teacher.tolist(), targets.tolist(), strict=True):
        others = [c for c in range(len(zl)) if c != y]
        norm_l = sum(math.exp(zl[c] / tau) for c in others)
        norm_g = sum(math.exp(zg[c] / tau) for c in others)
        for c in others:
            ql, qg = math.exp(zl[c] / tau) / norm_l, math.exp(zg[c] / tau) / norm_g
            total += qg * math.log(qg / ql)
    return tau * tau * total / len(targets)


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_loss_matches_the_formula_and_its_gradient(tau):
    g = torch_generator(0, "fedntd-test")
    logits = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(7, 5, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 5, (7,), generator=g)
    loss = ntd_loss(logits, teacher, targets, tau)
    assert loss.item() == pytest.approx(ntd_by_hand(logits, teacher, targets, tau), rel=1e-10)
    # Gradient against autograd through an independent dense formula (true class masked).
    mask = F.one_hot(targets, 5).bool()
    log_ql = F.log_softmax((logits / tau).masked_fill(mask, -math.inf), dim=1)
    qg = F.softmax((teacher / tau).masked_fill(mask, -math.inf), dim=1)
    dense = tau * tau * torch.where(mask, 0.0, qg * (qg.log() - log_ql)).sum() / 7
    (grad,) = torch.autograd.grad(loss, logits)
    (ref,) = torch.autograd.grad(dense, logits)
    assert torch.allclose(grad, ref, rtol=1e-9, atol=1e-12)
    assert torch.all(grad[mask] == 0)  # the true class's logit is not distilled
    # Identical predictions: nothing to distil.
    assert ntd_loss(teacher, teacher, targets, tau).item() == pytest.approx(0.0, abs=1e-12)
    assert not_true_logits(teacher, targets).shape == (7, 4)


def test_beta_zero_equals_fedavg_and_beta_positive_differs(tiny_config):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedntd", ntd_beta=0.0), progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == b.metric("accuracy")
    assert not FedNTD(RunConfig(algorithm="fedntd", ntd_beta=0.0), {}).has_teacher
    c = run(tiny_config.replace(algorithm="fedntd", ntd_beta=1.0), progress=False)
    assert not states_allclose(a.final_state, c.final_state)


def test_local_training_distils_from_the_dispatched_model(tiny_config):
    """One client, two rounds: round 2's teacher is round 1's global model, held fixed."""
    config = tiny_config.replace(algorithm="fedntd", num_clients=1, clients_per_round=1,
                                 partition="iid", rounds=2, ntd_beta=0.7, ntd_tau=2.0,
                                 weight_decay=1e-3, min_client_size=1)
    task = build_task(config)
    start = initial_state(config.resolved(), task)
    history = run(config, progress=False, task=task)

    model = task.model_factory()
    model.load_state_dict(start)
    x, y = task.client_data(0)
    for rnd in (1, 2):
        teacher = task.model_factory()
        teacher.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                              weight_decay=config.weight_decay)
        perm = torch.randperm(len(y), generator=client_generator(config, rnd, 0))
        for s in range(0, len(y), config.batch_size):
            idx = perm[s : s + config.batch_size]
            out = model(x[idx])
            with torch.no_grad():
                t_out = teacher(x[idx])
            mask = F.one_hot(y[idx], out.shape[1]).bool()
            log_ql = F.log_softmax((out / 2.0).masked_fill(mask, -math.inf), dim=1)
            qg = F.softmax((t_out / 2.0).masked_fill(mask, -math.inf), dim=1)
            kl = 4.0 * torch.where(mask, 0.0, qg * (qg.log() - log_ql)).sum() / len(idx)  # tau^2
            opt.zero_grad()
            (F.cross_entropy(out, y[idx]) + 0.7 * kl).backward()
            opt.step()
    assert states_allclose(history.final_state, model.state_dict(), rtol=1e-5, atol=1e-6)


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedntd", rounds=4, checkpoint_every=2)
    assert_resumes(config, tmp_path, stop_after=3)


def test_vmap_backend_falls_back_to_the_loop(tiny_config):
    config = tiny_config.replace(algorithm="fedntd")
    loop = run(config.replace(backend="loop"), progress=False)
    with pytest.warns(UserWarning, match="loop") if _first_note() else _no_check():
        vmapped = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=0, atol=0)


def _first_note() -> bool:
    from flnotes.engine.batched import stacked

    return "fedntd" not in stacked._NOTED


class _no_check:  # the note was already given earlier in this process
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_runs_on_the_toy_as_fedavg():
    # The toy's output is one number per row: no not-true class, so no distillation.
    config = toy.toy_config("fedntd", rounds=3, num_clients=3, clients_per_round=2)
    ntd = run(config, progress=False)
    avg = run(config.replace(algorithm="fedavg"), progress=False)
    assert ntd.status == "completed"
    assert states_allclose(ntd.final_state, avg.final_state, rtol=0, atol=0)


def test_stacked_seeds_fall_back_run_by_run(tiny_config):
    """run_seeds on the vmap backend stacks seeds; FedNTD's go through the loop instead."""
    from flnotes.engine.seeds import run_seeds

    config = tiny_config.replace(algorithm="fedntd", rounds=2, backend="vmap")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stacked = run_seeds(config, [1, 2], progress=False)
    for seed, history in zip([1, 2], stacked, strict=True):
        alone = run(config.replace(seed=seed, backend="loop"), progress=False)
        assert states_allclose(history.final_state, alone.final_state, rtol=0, atol=0)
