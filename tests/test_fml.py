"""FML: mutual learning of a meme and a personal model (FML Alg. 1, DML losses)."""

import io

import pytest
import torch
import torch.nn.functional as F

from flnotes.algorithms import build_strategy
from flnotes.algorithms.fml import FML, distillation_kl, mutual_losses
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import initial_state, run, sample_clients
from flnotes.engine.state import clone_state, states_allclose
from flnotes.engine.tasks import build_task
from flnotes.engine.train import batch_schedule, client_generator


@pytest.fixture
def fml_config(tiny_config):
    return tiny_config.replace(algorithm="fml", client_test_fraction=0.2)


def one_round(config, rnd=1, strategy=None, task=None):
    """Run a single round by hand; returns (task, strategy, clients, results)."""
    config = config.resolved()
    task = task if task is not None else build_task(config)
    if strategy is None:
        strategy = build_strategy(config, initial_state(config, task))
    clients = sample_clients(config, rnd)
    results = train_clients(task, strategy, rnd, clients, strategy.dispatch(rnd, clients), config)
    strategy.aggregate(rnd, results)
    return task, strategy, clients, results


def test_fml_defaults():
    assert FML.name == "fml" and FML.custom_local_update
    assert FML.default_weighting == "uniform"  # FML Alg. 1 l.5: (1/K) sum of memes
    assert FML.default_client_test_fraction == 0.1  # official code: val_ratio 0.1


def test_kl_gradient_matches_analytic_softmax_difference():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(7, 5, generator=gen, requires_grad=True)
    teacher = torch.randn(7, 5, generator=gen, requires_grad=True)
    distillation_kl(student, teacher).backward()
    expected = (F.softmax(student, 1) - F.softmax(teacher, 1)).detach() / 7
    torch.testing.assert_close(student.grad, expected)
    assert teacher.grad is None  # the teacher is detached


def test_kl_value_is_teacher_to_student_divergence():
    gen = torch.Generator().manual_seed(1)
    s, t = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    p_t, p_s = F.softmax(t, 1), F.softmax(s, 1)
    brute = (p_t * (p_t.log() - p_s.log())).sum(1).mean()  # KL(teacher || student)
    torch.testing.assert_close(distillation_kl(s, t), brute)


def test_personal_loss_gradient_is_weighted_ce_plus_kl():
    gen = torch.Generator().manual_seed(2)
    personal = torch.randn(6, 4, generator=gen, requires_grad=True)
    meme = torch.randn(6, 4, generator=gen, requires_grad=True)
    y = torch.randint(0, 4, (6,), generator=gen)
    a, b = 0.3, 0.8
    personal_loss, meme_loss, _, _ = mutual_losses(personal, meme, y, a, b)
    (personal_loss + meme_loss).backward()
    onehot = F.one_hot(y, 4).float()
    p_p, p_m = F.softmax(personal, 1).detach(), F.softmax(meme, 1).detach()
    torch.testing.assert_close(personal.grad, (a * (p_p - onehot) + (1 - a) * (p_p - p_m)) / 6)
    torch.testing.assert_close(meme.grad, (b * (p_m - onehot) + (1 - b) * (p_m - p_p)) / 6)


def test_local_update_matches_separate_dml_reference(fml_config):
    """Both models step once per batch on their own loss; reference written independently."""
    config = fml_config.replace(personal_weight=0.4, meme_weight=0.7, local_epochs=2).resolved()
    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    client, rnd = 2, 1
    personal_start = clone_state(strategy.personal_state(task, client))
    result = strategy.local_update(task, client, strategy.global_state,
                                   client_generator(config, rnd, client))

    meme, personal = task.model_factory(), task.model_factory()
    meme.load_state_dict(strategy.global_state)
    personal.load_state_dict(personal_start)
    opt_m = torch.optim.SGD(meme.parameters(), lr=config.lr, momentum=config.momentum)
    opt_p = torch.optim.SGD(personal.parameters(), lr=config.lr, momentum=config.momentum)
    x, y = task.client_data(client)
    a, b = config.personal_weight, config.meme_weight
    gen = client_generator(config, rnd, client)
    for idx in batch_schedule(len(y), config.local_epochs, config.batch_size, gen):
        out_p, out_m = personal(x[idx]), meme(x[idx])
        log_p, log_m = F.log_softmax(out_p, 1), F.log_softmax(out_m, 1)
        q_p, q_m = log_p.exp().detach(), log_m.exp().detach()
        kl_p = (q_m * (q_m.log() - log_p)).sum(1).mean()  # KL(meme || personal)
        kl_m = (q_p * (q_p.log() - log_m)).sum(1).mean()  # KL(personal || meme)
        loss_p = a * F.cross_entropy(out_p, y[idx]) + (1 - a) * kl_p
        loss_m = b * F.cross_entropy(out_m, y[idx]) + (1 - b) * kl_m
        opt_p.zero_grad()
        opt_m.zero_grad()
        loss_p.backward()
        loss_m.backward()
        opt_p.step()
        opt_m.step()
    assert states_allclose(result.state, meme.state_dict(), rtol=1e-5, atol=1e-6)
    assert states_allclose(strategy.personal[client], personal.state_dict(), rtol=1e-5, atol=1e-6)
    assert "personal_loss" in result.extra and result.num_samples == len(y)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_meme_with_b_equal_one_is_fedavg(fml_config, weighting):
    """a = b = 1: the meme trains on plain CE, so the global model is FedAvg's."""
    fml = fml_config.replace(personal_weight=1.0, meme_weight=1.0, weighting=weighting, rounds=2)
    fedavg = fml.replace(algorithm="fedavg")
    h_fml, h_avg = run(fml, progress=False), run(fedavg, progress=False)
    assert states_allclose(h_fml.final_state, h_avg.final_state, rtol=1e-6, atol=1e-7)
    assert h_fml.metric("train_loss") == pytest.approx(h_avg.metric("train_loss"), rel=1e-6)
    assert h_fml.metric("accuracy") == h_avg.metric("accuracy")


def test_personal_models_are_never_averaged(fml_config):
    task, strategy, clients, results = one_round(fml_config)
    glob = strategy.global_state
    assert sorted(strategy.personal) == clients
    personal = [strategy.personal[c] for c in clients]
    for i, state in enumerate(personal):
        assert not states_allclose(state, glob)
        assert not states_allclose(state, results[i].state)  # the meme went up, not this
        for other in personal[i + 1:]:
            assert not states_allclose(state, other)
    # The server averages the memes only (uniform: Alg. 1 l.5).
    mean = {n: torch.stack([r.state[n] for r in results]).mean(0) for n in glob}
    assert states_allclose(glob, mean)
    # Round 2: personal models of clients left out stay as they were; the others move on.
    before = {c: clone_state(s) for c, s in strategy.personal.items()}
    _, _, clients2, _ = one_round(fml_config, 2, strategy, task)
    for c, state in before.items():
        same = states_allclose(strategy.personal[c], state, rtol=0, atol=0)
        assert same == (c not in clients2)


def test_personal_accuracy_in_history_rows(fml_config):
    history = run(fml_config.replace(rounds=3), progress=False)
    rows = [r for r in history.rows if "accuracy" in r]
    assert len(rows) == 3
    for row in rows:
        assert 0.0 <= row["personal_accuracy"] <= 1.0
        assert 1 <= row["personal_clients"] <= fml_config.num_clients
    counts = history.metric("personal_clients")
    assert counts == sorted(counts)  # a client once seen keeps its personal model


def test_personal_accuracy_needs_held_out_data(fml_config):
    task, strategy, _, _ = one_round(fml_config.replace(client_test_fraction=0.0))
    assert task.client_test_indices is None
    with pytest.raises(ValueError, match="client_test_fraction > 0"):
        strategy.round_metrics(task)


def test_state_dict_round_trip_keeps_personal_models(fml_config):
    task, strategy, clients, _ = one_round(fml_config)
    buffer = io.BytesIO()
    torch.save(strategy.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    config = fml_config.resolved()
    fresh = build_strategy(config, initial_state(config, task))
    fresh.load_state_dict(saved)
    assert sorted(fresh.personal) == sorted(strategy.personal) == clients
    for c in clients:
        assert states_allclose(fresh.personal[c], strategy.personal[c], rtol=0, atol=0)
    assert states_allclose(fresh.global_state, strategy.global_state, rtol=0, atol=0)
    assert fresh.round_metrics(task) == strategy.round_metrics(task)


def test_resumed_run_equals_uninterrupted_run(fml_config, tmp_path):
    config = fml_config.replace(rounds=3, checkpoint_every=1)
    full = run(config, progress=False)
    run(config.replace(rounds=1, run_dir=str(tmp_path)), progress=False)
    resumed = run(config.replace(run_dir=str(tmp_path)), progress=False)
    assert states_allclose(resumed.final_state, full.final_state, rtol=0, atol=0)
    assert resumed.metric("personal_accuracy") == full.metric("personal_accuracy")


# ---- model heterogeneity (Fig. 5) and its independent-training reference ----------------------


def test_personal_models_naming_the_shared_architecture_change_nothing(fml_config):
    plain = run(fml_config.replace(rounds=2), progress=False)
    named = run(fml_config.replace(rounds=2, personal_models="mlp"), progress=False)
    assert states_allclose(plain.final_state, named.final_state, rtol=0, atol=0)
    assert plain.metric("personal_accuracy") == named.metric("personal_accuracy")


def test_heterogeneous_personal_models_with_a_equal_one_train_independently(fml_config):
    """personal_weight = 1 is Fig. 5's reference: each personal model, whatever its
    architecture, is plain local SGD on its own client from its own initialisation."""
    from flnotes.algorithms.fml import initial_personal_state
    from flnotes.engine.train import local_sgd
    from flnotes.models import build_model

    config = fml_config.replace(rounds=3, personal_weight=1.0, personal_models="cnn,mlp").resolved()
    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    expected = {}
    for rnd in range(1, config.rounds + 1):
        clients = sample_clients(config, rnd)
        results = train_clients(task, strategy, rnd, clients, strategy.dispatch(rnd, clients),
                                config)
        strategy.aggregate(rnd, results)
        for client in clients:
            arch = "cnn" if client % 2 == 0 else "mlp"
            start = expected.get(client)
            if start is None:
                start = initial_personal_state(task, config.seed, client, config.personal_models)
            x, y = task.client_data(client)
            expected[client], _ = local_sgd(
                build_model(arch, task.num_classes, tuple(x.shape[1:])), start, x, y,
                epochs=config.local_epochs, batch_size=config.batch_size, lr=config.lr,
                momentum=config.momentum, weight_decay=config.weight_decay,
                generator=client_generator(config, rnd, client), loss_fn=task.loss_fn)
    assert sorted(expected) == sorted(strategy.personal)
    for client, state in expected.items():
        assert any("conv" in name for name in state) == (
            client % 2 == 0)  # the architecture each client was given
        assert states_allclose(strategy.personal[client], state, rtol=1e-5, atol=1e-6)
    assert "personal_accuracy" in strategy.round_metrics(task)


def test_heterogeneous_personal_models_run_on_the_vmap_backend_as_on_the_loop(fml_config):
    config = fml_config.replace(rounds=2, personal_models="cnn,mlp")
    loop = run(config.replace(backend="loop"), progress=False)
    vmap = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=0, atol=0)


def test_unknown_personal_model_is_one_line():
    from flnotes.config import RunConfig

    with pytest.raises(ValueError, match="personal_models.*did you mean 'lenet5'"):
        RunConfig(algorithm="fml", personal_models="cnn,lenet")
