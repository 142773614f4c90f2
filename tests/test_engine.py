"""The engine against references: plain SGD, autograd, an uninterrupted run, itself twice."""

import json
from collections import OrderedDict
from pathlib import Path

import torch

from flnotes.algorithms import build_strategy
from flnotes.algorithms.fedprox import proximal_term
from flnotes.config import RunConfig
from flnotes.engine.history import History
from flnotes.engine.sim import initial_state, run, sample_clients
from flnotes.engine.state import state_is_finite, states_allclose
from flnotes.engine.tasks import build_task
from flnotes.engine.train import client_generator
from flnotes.rng import torch_generator


def test_fedavg_with_one_client_equals_plain_minibatch_sgd(tiny_config):
    config = tiny_config.replace(num_clients=1, clients_per_round=1, partition="iid",
                                 rounds=1, local_epochs=3, weight_decay=1e-3, min_client_size=1)
    task = build_task(config)
    start = initial_state(config.resolved(), task)
    history = run(config, progress=False, task=task)

    # Reference: torch SGD over the client's data with a hand-written epoch loop.
    model = task.model_factory()
    model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                          weight_decay=config.weight_decay)
    x, y = task.client_data(0)
    assert len(y) == len(task.train_y)  # one client holds all the data
    g = client_generator(config, 1, 0)
    for _ in range(config.local_epochs):
        perm = torch.randperm(len(y), generator=g)
        for s in range(0, len(y), config.batch_size):
            idx = perm[s : s + config.batch_size]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    assert states_allclose(history.final_state, model.state_dict(), rtol=0, atol=0)


def test_fedprox_mu_zero_equals_fedavg(tiny_config):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedprox", mu=0.0), progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == b.metric("accuracy")


def test_fedprox_penalty_changes_result_and_gradient_matches_autograd(tiny_config):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedprox", mu=1.0), progress=False)
    assert not states_allclose(a.final_state, b.final_state)

    g = torch_generator(0, "test")
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    anchor = torch.randn(5, 3, generator=g)
    mu = 0.7
    (grad,) = torch.autograd.grad(proximal_term({"w": w}, {"w": anchor}, mu), w)
    assert torch.allclose(grad, mu * (w - anchor).detach())  # d/dw mu/2||w-a||^2


def test_fedavg_weights_by_samples_and_uniform_option(tiny_config):
    config = tiny_config.resolved()
    task = build_task(config)
    start = initial_state(config, task)
    strategy = build_strategy(config, start)
    from flnotes.algorithms.base import ClientResult

    s1 = {k: torch.zeros_like(v) for k, v in start.items()}
    s2 = {k: torch.ones_like(v) for k, v in start.items()}
    results = [ClientResult(0, s1, 30, 0.0), ClientResult(1, s2, 10, 0.0)]
    weighted = strategy.aggregate(1, results)
    name = next(iter(start))
    assert torch.allclose(weighted[name], torch.full_like(start[name], 0.25))
    uniform = build_strategy(config.replace(weighting="uniform"), start).aggregate(1, results)
    assert torch.allclose(uniform[name], torch.full_like(start[name], 0.5))


def test_same_config_same_metrics(tiny_config):
    a = run(tiny_config, progress=False)
    b = run(tiny_config, progress=False)
    assert [r["accuracy"] for r in a.rows] == [r["accuracy"] for r in b.rows]
    assert [r["train_loss"] for r in a.rows] == [r["train_loss"] for r in b.rows]


def test_client_sampling_is_seeded_and_without_replacement(tiny_config):
    config = tiny_config.replace(num_clients=6, clients_per_round=4)
    rounds = [sample_clients(config, r) for r in range(1, 20)]
    assert all(len(set(c)) == 4 and all(0 <= i < 6 for i in c) for c in rounds)
    assert len({tuple(c) for c in rounds}) > 1
    assert rounds == [sample_clients(config, r) for r in range(1, 20)]


def test_resume_after_interruption_gives_same_final_state(tiny_config, tmp_path):
    config = tiny_config.replace(rounds=5, checkpoint_every=2)
    full = run(config.replace(run_dir=str(tmp_path / "full")), progress=False)

    # Stop after round 3 (checkpoint at 2), then resume with the full round count.
    part_dir = str(tmp_path / "part")
    run(config.replace(rounds=3, run_dir=part_dir), progress=False)
    resumed = run(config.replace(run_dir=part_dir), progress=False)
    assert states_allclose(full.final_state, resumed.final_state, rtol=0, atol=0)
    assert [r["accuracy"] for r in full.rows] == [r["accuracy"] for r in resumed.rows]
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4, 5]


def test_resume_after_crash_recomputes_rounds_after_the_checkpoint(
    tiny_config, tmp_path, monkeypatch
):
    """Killed in round 4 with a checkpoint at round 2: rounds 3-4 are redone identically."""
    import flnotes.engine.sim as sim

    config = tiny_config.replace(rounds=5, checkpoint_every=2)
    full = run(config.replace(run_dir=str(tmp_path / "full")), progress=False)

    real_train = sim.train_clients

    def crash_in_round_4(task, strategy, rnd, *args):
        if rnd == 4:
            raise KeyboardInterrupt("simulated kill")
        return real_train(task, strategy, rnd, *args)

    monkeypatch.setattr(sim, "train_clients", crash_in_round_4)
    folder = tmp_path / "killed"
    try:
        run(config.replace(run_dir=str(folder)), progress=False)
    except KeyboardInterrupt:
        pass
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 3  # rounds 1-3 logged
    monkeypatch.setattr(sim, "train_clients", real_train)
    resumed = run(config.replace(run_dir=str(folder)), progress=False)
    assert states_allclose(full.final_state, resumed.final_state, rtol=0, atol=0)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3, 4, 5]


def test_run_folders_load_onto_the_resuming_device(tiny_config, tmp_path, monkeypatch):
    """A folder written on a GPU must resume or open on a CPU: every load names a device."""
    folder = tmp_path / "r"
    config = tiny_config.replace(rounds=3, checkpoint_every=1, run_dir=str(folder))
    run(config.replace(rounds=2), progress=False)
    targets = []
    real_load = torch.load

    def load(path, *args, map_location=None, **kwargs):
        targets.append((Path(path).name, map_location))
        return real_load(path, *args, map_location=map_location, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    resumed = run(config, progress=False)
    History.load(folder)
    assert ("checkpoint.pt", torch.device("cpu")) in targets  # the run's own device
    assert ("global_model.pt", "cpu") in targets
    assert all(target is not None for _, target in targets)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3]


def test_finished_run_folder_is_reloaded_not_rerun(tiny_config, tmp_path):
    config = tiny_config.replace(run_dir=str(tmp_path / "r"))
    first = run(config, progress=False)
    again = run(config, progress=False)
    assert again.rows == first.rows and again.status == "completed"
    with_other_lr = config.replace(lr=0.2)
    try:
        run(with_other_lr, progress=False)
    except ValueError as err:
        assert "lr" in str(err) and "different run" in str(err)
    else:
        raise AssertionError("a folder holding another config must be refused")


def test_divergence_is_a_status_not_a_crash(tiny_config):
    history = run(tiny_config.replace(lr=1e6, momentum=0.0, rounds=5), progress=False)
    assert history.status == "diverged"
    assert len(history.rows) <= 5


def test_run_folder_contents(tiny_config, tmp_path):
    run(tiny_config.replace(run_dir=str(tmp_path / "r")), progress=False)
    folder = tmp_path / "r"
    for name in ("config.json", "metrics.jsonl", "run.json", "checkpoint.pt", "global_model.pt"):
        assert (folder / name).exists(), name
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "completed" and meta["environment"]["torch"] == torch.__version__
    state = torch.load(folder / "global_model.pt", weights_only=True)
    assert set(state) == set(initial_state(tiny_config.resolved(), build_task(tiny_config)))


def test_record_states_keeps_trajectory(tiny_config):
    history = run(tiny_config.replace(record_states=True), progress=False)
    assert len(history.trajectory) == tiny_config.rounds
    step = history.trajectory[0]
    assert len(step["dispatched"]) == len(step["local"]) == tiny_config.clients_per_round


def test_cli_run_prints_rounds(tmp_path, capsys):
    from flnotes.cli.main import main

    code = main(["run", "--algorithm", "fedprox", "--mu", "0.1", "--rounds", "2",
                 "--num-clients", "4", "--clients-per-round", "2",
                 "--data-option", "num_train=400", "--data-option", "num_test=100",
                 "--run-dir", str(tmp_path / "cli")])
    out = capsys.readouterr().out
    assert code == 0
    assert "round    2" in out and (tmp_path / "cli" / "learning_curve.png").exists()
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["mu"] == 0.1


def test_cli_bad_value_exits_with_message(capsys):
    from flnotes.cli.main import main

    assert main(["run", "--lr", "-1"]) == 2
    assert "lr" in capsys.readouterr().err


def test_config_rejects_unknown_field_via_preset():
    try:
        RunConfig.from_preset("demo", not_a_field=1)
    except ValueError as err:
        assert "not_a_field" in str(err)
    else:
        raise AssertionError


def test_natural_split_keeps_only_the_chosen_clients_test_rows(tmp_path):
    """LEAF-style data: the test set and FML's personal tests are the kept clients' rows."""
    from flnotes.data.leaf import load_shakespeare
    from flnotes.data.plays import write_demo_plays

    folder = write_demo_plays(tmp_path / "plays", num_roles=4, speeches=16)
    data = load_shakespeare(folder, False, 0, seq_len=10)
    config = RunConfig(algorithm="fml", dataset="shakespeare", data_dir=str(folder),
                       data_options={"seq_len": 10},
                       partition="natural", num_clients=2, clients_per_round=2, rounds=1,
                       batch_size=8, lr=0.5, momentum=0.0, min_client_size=1, device="cpu")
    task = build_task(config)
    kept = torch.cat([data.client_test_indices[c] for c in range(2)])
    assert torch.equal(task.test_y, data.test_y[kept])
    x, y = task.client_test_data(1)
    assert torch.equal(y, data.test_y[data.client_test_indices[1]])
    assert torch.equal(x, data.test_x[data.client_test_indices[1]])
    history = run(config, progress=False, task=task)
    assert "personal_accuracy" in history.rows[-1]


def test_too_many_clients_for_a_natural_split_says_how_many_there_are(tmp_path):
    from flnotes.data.leaf import load_shakespeare
    from flnotes.data.plays import write_demo_plays

    folder = write_demo_plays(tmp_path / "plays", num_roles=4, speeches=16)
    config = RunConfig(algorithm="fedavg", dataset="shakespeare", data_dir=str(folder),
                       data_options={"seq_len": 10}, partition="natural", num_clients=9,
                       clients_per_round=2, rounds=1, min_client_size=1, device="cpu")
    parts = len(load_shakespeare(folder, False, 0, seq_len=10).client_indices)
    try:
        build_task(config)
    except ValueError as err:
        assert str(err).endswith(f"has only {parts} natural clients but num_clients=9: set "
                                 f"num_clients to {parts} or fewer (--num-clients {parts})")
    else:
        raise AssertionError("9 clients from a split of fewer")


def test_state_is_finite_finds_any_bad_float_layer():
    good = OrderedDict([("w", torch.ones(3)), ("b", torch.zeros(())),
                        ("n", torch.tensor(2, dtype=torch.long))])
    assert state_is_finite(good) and state_is_finite(OrderedDict())
    bad_layers = {"w": torch.tensor([1.0, float("nan"), 0.0]), "b": torch.tensor(-float("inf"))}
    for name, bad in bad_layers.items():
        assert not state_is_finite(OrderedDict(good, **{name: bad}))


def test_history_to_frame_has_one_row_per_round(tiny_config):
    history = run(tiny_config.replace(rounds=2), progress=False)
    frame = history.to_frame()
    assert frame["round"].tolist() == [1, 2]
    assert frame["accuracy"].tolist() == history.metric("accuracy")
    assert set(frame["algorithm"]) == {tiny_config.algorithm}


def _interrupt_in_round(monkeypatch, stop_round):
    """Make the engine raise KeyboardInterrupt (Ctrl-C) when round stop_round trains."""
    import flnotes.engine.sim as sim

    real_train = sim.train_clients

    def train(task, strategy, rnd, *args):
        if rnd == stop_round:
            raise KeyboardInterrupt
        return real_train(task, strategy, rnd, *args)

    monkeypatch.setattr(sim, "train_clients", train)


def test_ctrl_c_marks_the_folder_interrupted_and_resuming_marks_it_running(
    tiny_config, tmp_path, monkeypatch
):
    from flnotes.engine.sim import interruption_report

    folder = tmp_path / "r"
    config = tiny_config.replace(rounds=5, checkpoint_every=2, run_dir=str(folder))
    _interrupt_in_round(monkeypatch, 4)
    try:
        run(config, progress=False)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt must reach the caller")
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["checkpoint_round"] == 2
    assert interruption_report(folder) == (
        "interrupted after round 3; run the same command again to resume from the last "
        "checkpoint (round 2)")
    monkeypatch.undo()
    rows = []
    history = run(config, progress=False, on_round=rows.append)
    assert [r["round"] for r in rows] == [3, 4, 5]  # each round reported as it ends
    assert history.status == "completed"
    assert json.loads((folder / "run.json").read_text())["status"] == "completed"


def test_interruption_before_the_first_checkpoint_says_it_starts_over(
    tiny_config, tmp_path, monkeypatch
):
    from flnotes.engine.sim import interruption_report

    folder = tmp_path / "r"
    _interrupt_in_round(monkeypatch, 2)
    try:
        run(tiny_config.replace(checkpoint_every=5, run_dir=str(folder)), progress=False)
    except KeyboardInterrupt:
        pass
    report = interruption_report(folder)
    assert "after round 1, before the first checkpoint" in report and "start over" in report
    assert "first round" in interruption_report(tmp_path / "never-started")


def test_finished_folders_are_reported_as_such_and_download_may_change(tiny_config, tmp_path):
    from flnotes.engine.sim import interruption_report

    folder = tmp_path / "r"
    config = tiny_config.replace(rounds=2, run_dir=str(folder))
    first = run(config, progress=False)
    # A seed that finished before Ctrl-C stopped its siblings is not "interrupted".
    assert interruption_report(folder) == "completed; nothing to resume"
    assert json.loads((folder / "run.json").read_text())["status"] == "completed"
    # Fetching the data or not changes no result: the folder is the same run.
    again = run(config.replace(download=not config.download), progress=False)
    assert again.rows == first.rows


def test_batches_are_drawn_lazily_and_equal_one_shuffle_per_epoch_up_front():
    """memory must not grow with the number of local steps. iter_batches draws the
    same shuffles as one randperm per epoch drawn up front (the reference below), across its
    chunk boundaries, and its first batch comes without drawing every epoch's."""
    import time

    from flnotes.engine.train import iter_batches
    from flnotes.rng import torch_generator

    size, epochs, batch = 300_001, 7, 70_000  # chunks of 3 epochs: 3 + 3 + 1
    reference_gen, lazy_gen = torch_generator(0, "x"), torch_generator(0, "x")
    order = torch.cat([torch.randperm(size, generator=reference_gen) for _ in range(epochs)])
    reference = [order[e * size + s: e * size + min(s + batch, size)]
                 for e in range(epochs) for s in range(0, size, batch)]
    lazy = list(iter_batches(size, epochs, batch, lazy_gen))
    assert len(lazy) == len(reference) and all(torch.equal(a, b)
                                               for a, b in zip(lazy, reference, strict=True))
    tic = time.perf_counter()
    first = next(iter(iter_batches(60, 10**8, 50, torch_generator(0, "y"))))  # 10^8 epochs
    assert len(first) == 50 and time.perf_counter() - tic < 10
