"""FML: mutual learning of a meme and a personal model (FML Alg. 1, DML losses)."""

import io

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes

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
    result = strategy.local_update(task, 1, client, strategy.global_state,
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
    full, resumed = assert_resumes(config, tmp_path, stop_after=1)
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
        assert states_allclose(strategy.personal[client], state, rtol=0, atol=0)
    assert "personal_accuracy" in strategy.round_metrics(task)


def test_heterogeneous_personal_models_run_on_the_vmap_backend_as_on_the_loop(fml_config):
    config = fml_config.replace(rounds=2, personal_models="cnn,mlp")
    loop = run(config.replace(backend="loop"), progress=False)
    vmap = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=0, atol=0)


def test_per_architecture_personal_accuracy_matches_a_hand_evaluation(fml_config):
    """Fig. 5's curves: with several architectures, each one's mean personal accuracy,
    evaluated here by hand on each client's held-out rows; none with one architecture."""
    from flnotes.models import build_model

    config = fml_config.replace(personal_models="cnn,mlp,cnn")  # client i: entry i mod 3
    task, strategy, clients, _ = one_round(config.replace(clients_per_round=6))
    by_model = {"cnn": [], "mlp": []}
    for client in clients:
        name = ("cnn", "mlp", "cnn")[client % 3]
        personal = build_model(name, 10, (1, 28, 28))
        personal.load_state_dict(strategy.personal[client])
        x, y = task.client_test_data(client)
        with torch.no_grad():
            hits = personal(x).argmax(1) == y
        by_model[name].append(int(hits.sum()) / len(hits))
    metrics = strategy.round_metrics(task)
    assert len(by_model["cnn"]) == 4 and len(by_model["mlp"]) == 2
    for name, values in by_model.items():
        assert metrics[f"personal_model_accuracy_{name}"] == pytest.approx(
            sum(values) / len(values), abs=1e-12)
    assert metrics["personal_accuracy"] == pytest.approx(
        sum(by_model["cnn"] + by_model["mlp"]) / 6, abs=1e-12)
    for spec in (None, "mlp"):  # one architecture: the mean is its only curve
        own_task, one, _, _ = one_round(fml_config.replace(personal_models=spec))
        assert not any(k.startswith("personal_model_accuracy_")
                       for k in one.round_metrics(own_task))


def test_unknown_personal_model_is_one_line():
    from flnotes.config import RunConfig

    with pytest.raises(ValueError, match="personal_models.*did you mean 'lenet5'"):
        RunConfig(algorithm="fml", personal_models="cnn,lenet")


# ---- objective heterogeneity (Fig. 6): clients with different tasks, one shared model ---------


@pytest.fixture
def tasks_config(fml_config):
    """Two synthetic draws (different prototypes) as two tasks; client i holds task i mod 2."""
    return fml_config.replace(dataset="synthetic+synthetic")


def test_composed_dataset_joins_label_spaces_and_splits_each_task_among_its_clients(
        tasks_config):
    from flnotes.data import load_dataset

    task = build_task(tasks_config.replace(partition="iid"))
    assert (task.num_classes, task.task_classes, task.num_tasks) == (20, (10, 10), 2)
    plain = load_dataset("synthetic", seed=tasks_config.seed, **tasks_config.data_options)
    first = task.train_y < 10
    # Task 0 is the plain dataset; task 1 a draw with another seed, labels shifted by 10.
    assert torch.equal(task.train_x[first], plain.train_x)
    assert not torch.equal(task.train_x[~first], plain.train_x)
    assert sorted(task.train_y[~first].unique().tolist()) == list(range(10, 20))
    rows = {0: [], 1: []}
    for client in range(task.num_clients):
        lo, hi = task.class_range(client)
        assert (lo, hi) == ((0, 10) if client % 2 == 0 else (10, 20))
        for idx in (task.client_indices[client], task.client_test_indices[client]):
            y = task.train_y[idx]
            assert bool(((y >= lo) & (y < hi)).all())
            rows[client % 2].append(idx)
    for t, mask in ((0, first), (1, ~first)):  # each task's rows, all used, once
        assert torch.equal(torch.cat(rows[t]).sort().values, torch.nonzero(mask).flatten())


def test_one_task_through_the_multitask_path_is_plain_fml_bit_for_bit(fml_config, monkeypatch):
    """A composition of one dataset: same data, split, personal models and metrics."""
    import flnotes.engine.tasks as tasks
    from flnotes.data.multitask import load_multitask
    from flnotes.data.registry import DATASETS
    from flnotes.data.tensors import default_data_dir

    config = fml_config.replace(rounds=2)
    plain = run(config, progress=False)
    loaded = []

    def one_task(cfg):
        data = load_multitask(["synthetic"], DATASETS, default_data_dir(), False, cfg.seed,
                              **cfg.data_options)
        loaded.append(data)
        return data

    monkeypatch.setattr(tasks, "load_task_data", one_task)
    multitask = run(config, progress=False)
    assert loaded and loaded[0].task_classes == (10,)
    assert states_allclose(plain.final_state, multitask.final_state, rtol=0, atol=0)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(plain.rows) == strip(multitask.rows)


def test_meme_kl_and_ce_on_the_task_slice_match_a_hand_computation(tasks_config):
    """A task-1 client: the meme's logits 10..19 against the personal model's 10 logits."""
    from flnotes.models import build_model

    config = tasks_config.replace(personal_weight=0.4, meme_weight=0.7, local_epochs=2).resolved()
    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    client, rnd = 1, 1
    personal_start = clone_state(strategy.personal_state(task, client))
    result = strategy.local_update(task, 1, client, strategy.global_state,
                                   client_generator(config, rnd, client))

    meme = task.model_factory()  # the joint 20-class head
    personal = build_model("mlp", 10, (1, 28, 28))  # its task's 10 classes
    meme.load_state_dict(strategy.global_state)
    personal.load_state_dict(personal_start)
    opt_m = torch.optim.SGD(meme.parameters(), lr=config.lr, momentum=config.momentum)
    opt_p = torch.optim.SGD(personal.parameters(), lr=config.lr, momentum=config.momentum)
    x, y = task.client_data(client)
    a, b = config.personal_weight, config.meme_weight
    gen = client_generator(config, rnd, client)
    for idx in batch_schedule(len(y), config.local_epochs, config.batch_size, gen):
        out_p, out_m = personal(x[idx]), meme(x[idx])[:, 10:20]
        target = y[idx] - 10
        log_p, log_m = F.log_softmax(out_p, 1), F.log_softmax(out_m, 1)
        q_p, q_m = log_p.exp().detach(), log_m.exp().detach()
        kl_p = (q_m * (q_m.log() - log_p)).sum(1).mean()  # KL(meme slice || personal)
        kl_m = (q_p * (q_p.log() - log_m)).sum(1).mean()  # KL(personal || meme slice)
        ce_p = -log_p.gather(1, target[:, None]).mean()
        ce_m = -log_m.gather(1, target[:, None]).mean()  # CE over the slice's 10 classes
        opt_p.zero_grad()
        opt_m.zero_grad()
        (a * ce_p + (1 - a) * kl_p).backward()
        (b * ce_m + (1 - b) * kl_m).backward()
        opt_p.step()
        opt_m.step()
    assert states_allclose(result.state, meme.state_dict(), rtol=1e-5, atol=1e-6)
    assert states_allclose(strategy.personal[client], personal.state_dict(), rtol=1e-5, atol=1e-6)
    # The other task's head rows get no gradient: they leave this client as they came.
    head = [n for n in result.state if n.endswith("weight")][-1]
    assert result.state[head].shape[0] == 20
    assert torch.equal(result.state[head][:10], strategy.global_state[head][:10])
    assert not torch.equal(result.state[head][10:], strategy.global_state[head][10:])


def test_per_task_metrics_match_a_hand_evaluation(tasks_config):
    from flnotes.models import build_model

    task, strategy, clients, _ = one_round(tasks_config.replace(clients_per_round=4))
    model = task.model_factory()
    model.load_state_dict(strategy.global_state)
    row = task.evaluate(model)
    with torch.no_grad():
        logits = model(task.test_x)
    correct = 0
    for t, (lo, hi) in enumerate(((0, 10), (10, 20))):
        rows = (task.test_y >= lo) & (task.test_y < hi)
        hits = logits[rows][:, lo:hi].argmax(1) == task.test_y[rows] - lo
        label = "synthetic" if t == 0 else "synthetic-2"
        assert row[f"accuracy_{label}"] == int(hits.sum()) / len(hits)
        assert row[f"loss_{label}"] == pytest.approx(F.cross_entropy(
            logits[rows][:, lo:hi], task.test_y[rows] - lo).item(), rel=1e-5)
        correct += int(hits.sum())
    assert row["accuracy"] == correct / len(task.test_y)

    metrics = strategy.round_metrics(task)
    per_task = {0: [], 1: []}
    for client in clients:
        personal = build_model("mlp", 10, (1, 28, 28))
        personal.load_state_dict(strategy.personal[client])
        x, y = task.client_test_data(client)
        with torch.no_grad():
            hits = personal(x).argmax(1) == y - 10 * (client % 2)
        per_task[client % 2].append(int(hits.sum()) / len(hits))
    assert metrics["personal_clients"] == len(clients) == 4
    for t, label in ((0, "synthetic"), (1, "synthetic-2")):
        assert metrics[f"personal_accuracy_{label}"] == pytest.approx(
            sum(per_task[t]) / len(per_task[t]), abs=1e-12)
    assert metrics["personal_accuracy"] == pytest.approx(
        sum(per_task[0] + per_task[1]) / 4, abs=1e-12)


def test_independent_reference_trains_each_personal_model_on_its_own_task_alone(tasks_config):
    """personal_weight = 1 (Fig. 6's independent curves): plain SGD of a 10-class model on
    the client's own rows, labels of its own task."""
    from flnotes.algorithms.fml import initial_personal_state
    from flnotes.engine.train import local_sgd
    from flnotes.models import build_model

    config = tasks_config.replace(rounds=2, personal_weight=1.0).resolved()
    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    expected = {}
    for rnd in range(1, config.rounds + 1):
        clients = sample_clients(config, rnd)
        results = train_clients(task, strategy, rnd, clients, strategy.dispatch(rnd, clients),
                                config)
        strategy.aggregate(rnd, results)
        for client in clients:
            start = expected.get(client)
            if start is None:
                start = initial_personal_state(task, config.seed, client)
            x, y = task.client_data(client)
            expected[client], _ = local_sgd(
                build_model("mlp", 10, (1, 28, 28)), start, x, y - 10 * (client % 2),
                epochs=config.local_epochs, batch_size=config.batch_size, lr=config.lr,
                momentum=config.momentum, weight_decay=config.weight_decay,
                generator=client_generator(config, rnd, client), loss_fn=task.loss_fn)
    assert sorted(expected) == sorted(strategy.personal)
    for client, state in expected.items():
        assert states_allclose(strategy.personal[client], state, rtol=0, atol=0)


def test_resumed_multitask_run_equals_uninterrupted_run(tasks_config, tmp_path):
    config = tasks_config.replace(rounds=3, checkpoint_every=1)
    full, resumed = assert_resumes(config, tmp_path, stop_after=1)
    for name in ("personal_accuracy_synthetic", "personal_accuracy_synthetic-2",
                 "accuracy_synthetic-2"):
        assert resumed.metric(name) == full.metric(name) and len(full.metric(name)) == 3


@pytest.mark.parametrize("changes, words", [
    ({"dataset": "cifar10+cifar1000"}, ["'cifar1000'", "did you mean 'cifar100'"]),
    ({"dataset": "synthetic+toy"}, ["'toy'", "not a tensor dataset"]),
    ({"dataset": "mnist+femnist"}, ["'femnist'", "own client split"]),
    ({"dataset": "synthetic+synthetic", "algorithm": "fedavg"}, ["only algorithm='fml'"]),
    ({"dataset": "synthetic+synthetic", "partition": "natural"}, ["iid, dirichlet or shards"]),
    ({"dataset": "synthetic+synthetic+synthetic", "num_clients": 2, "clients_per_round": 2},
     ["3 tasks", "one client per task"]),
    ({"dataset": "synthetic+synthetic", "data_options": {"num_trian": 9}},
     ["did you mean 'num_train'"]),
])
def test_bad_compositions_are_one_line(fml_config, changes, words):
    with pytest.raises(ValueError) as err:
        fml_config.replace(**changes)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_personal_state_that_does_not_fit_its_task_is_one_line(tasks_config):
    from flnotes.models import build_model

    config = tasks_config.resolved()
    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    # A checkpoint's personal model with the joint 20 outputs, not its task's 10.
    strategy.load_state_dict({"global_state": strategy.global_state, "personal": {
        1: clone_state(build_model("mlp", 20, (1, 28, 28)).state_dict())}})
    for call in (lambda: strategy.round_metrics(task),
                 lambda: strategy.local_update(task, 1, 1, strategy.global_state,
                                               client_generator(config, 1, 1))):
        with pytest.raises(ValueError) as err:
            call()
        assert "\n" not in str(err.value) and "another dataset or personal_models" in str(
            err.value) and "10 classes" in str(err.value)


@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
    """Tiny CIFAR-10 and CIFAR-100 pickles in torchvision's layout (no md5 check, no cache)."""
    import pickle

    import numpy as np
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *args, **kwargs: True)
    monkeypatch.setenv("FLNOTES_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)

    def dump(path, obj):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(obj, protocol=2))

    def rows(n, classes):
        return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, classes, n).tolist()

    ten = tmp_path / "cifar-10-batches-py"
    for i in range(1, 6):
        x, y = rows(20, 10)
        dump(ten / f"data_batch_{i}", {"data": x, "labels": y})
    x, y = rows(30, 10)
    dump(ten / "test_batch", {"data": x, "labels": y})
    dump(ten / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    hundred = tmp_path / "cifar-100-python"
    for split, n in (("train", 120), ("test", 30)):
        x, y = rows(n, 100)
        dump(hundred / split, {"data": x, "fine_labels": y, "coarse_labels": [v // 5 for v in y]})
    dump(hundred / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                            "coarse_label_names": [f"s{i}" for i in range(20)]})
    return tmp_path


def test_fig6_preset_gives_each_task_its_output_size(fake_cifar):
    """fml-fig6 on fake CIFAR: LeNet5 personal models with 10 outputs for CIFAR-10 clients,
    CNN1 with 100 for CIFAR-100 clients, a shared model with 110."""
    from conftest import DEVICE

    from flnotes.config import RunConfig

    config = RunConfig.from_preset("fml-fig6", data_dir=str(fake_cifar), rounds=1,
                                   local_epochs=1, batch_size=32, device=DEVICE)
    task, strategy, clients, _ = one_round(config)
    assert (task.task_names, task.task_classes, clients) == (("cifar10", "cifar100"), (10, 100),
                                                             [0, 1])
    assert strategy.global_state["fc2.weight"].shape == (110, 512)  # cnn: the joint head
    assert strategy.personal[0]["fc3.weight"].shape == (10, 84)  # lenet-cifar on CIFAR-10
    assert strategy.personal[1]["fc2.weight"].shape == (100, 512)  # cnn on CIFAR-100
    model = task.model_factory()
    model.load_state_dict(strategy.global_state)
    row = {**task.evaluate(model), **strategy.round_metrics(task)}
    for key in ("accuracy_cifar10", "accuracy_cifar100", "personal_accuracy_cifar10",
                "personal_accuracy_cifar100"):
        assert 0 <= row[key] <= 1
    assert row["accuracy"] == pytest.approx(
        (row["accuracy_cifar10"] * 30 + row["accuracy_cifar100"] * 30) / 60)


def test_tasks_of_different_input_shapes_are_one_line(fml_config, fake_cifar):
    config = fml_config.replace(dataset="synthetic+cifar10", data_dir=str(fake_cifar),
                                data_options={})
    with pytest.raises(ValueError) as err:
        build_task(config)
    assert "\n" not in str(err.value) and "one input shape" in str(err.value)


def test_several_tasks_on_the_vmap_backend_train_as_on_the_loop(tasks_config):
    config = tasks_config.replace(rounds=2)
    loop = run(config.replace(backend="loop"), progress=False)
    vmap = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmap.final_state, rtol=0, atol=0)
    assert loop.metric("personal_accuracy_synthetic-2") == vmap.metric(
        "personal_accuracy_synthetic-2")


def test_multitask_manifest_round_trip_and_a_manifest_that_mixes_tasks(tasks_config, tmp_path):
    from flnotes.data.partition import save_manifest

    manifest = tmp_path / "split.json"
    config = tasks_config.replace(partition_manifest=str(manifest), client_test_fraction=0.0)
    written = build_task(config)
    reread = build_task(config)
    assert all(torch.equal(a, b) for a, b in zip(written.client_indices, reread.client_indices,
                                                 strict=True))
    swapped = [written.client_indices[1], written.client_indices[0],
               *written.client_indices[2:]]  # client 0 (task 0) given task 1's rows
    save_manifest(manifest, swapped, written.train_y)
    with pytest.raises(ValueError) as err:
        build_task(config)
    assert "\n" not in str(err.value) and "client 0 holds task 'synthetic'" in str(err.value)
