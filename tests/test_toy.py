"""The 2-parameter toy: every registered algorithm runs on it through the real engine."""

import math
import threading

import pytest
import torch

from flnotes import toy
from flnotes.algorithms import algorithm_names
from flnotes.engine.sim import run
from flnotes.engine.state import clone_state
from flnotes.engine.tasks import build_task
from flnotes.engine.train import local_sgd
from flnotes.toy import landscapes as L


def _config(algorithm="fedavg", **overrides):
    values = {"rounds": 3, "num_clients": 3, "clients_per_round": 2, "record_states": True,
              "data_options": {"start": [-0.4, -0.5]}}
    values.update(overrides)
    return toy.toy_config(algorithm, **values)


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_algorithm_runs_on_the_toy(algorithm):
    config = _config(algorithm)
    history = run(config, progress=False)
    assert history.status == "completed"
    assert len(history.rows) == config.rounds
    for row in history.rows:
        for key in ("loss", "accuracy", "sharpness", "x", "y", "train_loss"):
            assert math.isfinite(row[key]), (key, row)
        assert row["accuracy"] in (0.0, 1.0)
    points = toy.trajectory_points(history)
    assert points["global"].shape == (config.rounds + 1, 2)
    assert points["dispatched"].shape == (config.rounds, 2, 2)
    assert points["local"].shape == (config.rounds, 2, 2)
    assert torch.isfinite(points["global"]).all()
    # Round 1 starts every client at the initial model, the configured start point.
    # (A round that trains fewer clients, as CluSamp's with a client drawn twice, is padded
    # with NaN rows.)
    first = points["dispatched"][0]
    real = first[~first.isnan().any(1)]
    assert len(real) >= 1 and torch.allclose(real, torch.tensor([[-0.4, -0.5]] * len(real)))
    assert list(history.final_state) == ["x", "y"]
    assert toy.point_of(history.final_state) == pytest.approx(points["global"][-1].tolist())


def test_same_seed_same_run_other_seed_other_run():
    a = run(_config("fedmut", seed=3), progress=False)
    b = run(_config("fedmut", seed=3), progress=False)
    c = run(_config("fedmut", seed=4), progress=False)
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h.rows]  # noqa: E731
    assert strip(a) == strip(b)
    assert torch.equal(toy.trajectory_points(a)["local"], toy.trajectory_points(b)["local"])
    assert strip(a) != strip(c)


def test_minibatch_loss_is_the_landscape_plus_linear_noise():
    config = _config(data_options={"noise": 0.7, "samples_per_client": 10})
    task = build_task(config)
    model = task.model_factory()
    fed = task.federation
    p = model.point().detach()
    for client in range(config.num_clients):
        x, y = task.client_data(client)
        out = model(x)
        assert out.shape == (10, 1)
        want = fed.client_losses(p.double())[client].float() + x[:, 1:] @ p
        assert torch.allclose(out[:, 0], want, atol=1e-5)
        # Noise is centred per client, so the full-batch loss is the landscape exactly.
        assert task.loss_fn(out, y).item() == pytest.approx(
            float(fed.client_losses(p.double())[client]), abs=1e-5)


def test_stacked_losses_are_each_models_own_loss_and_its_gradient():
    """ToyTask.stacked_losses, K models on K batches at once, equals each model's own
    toy_loss (ToyModel.forward), padding rows left out, and its autograd gradient is each
    model's own."""
    task = build_task(_config(data_options={"noise": 0.7, "samples_per_client": 5}))
    points = torch.tensor([[-0.4, -0.5], [0.3, 0.1], [1.2, -0.8]])
    rows = torch.stack([task.client_data(c)[0] for c in (0, 1, 2)])  # (3, 5, 3)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]).float()
    params = {name: points[:, i].clone().requires_grad_() for i, name in enumerate("xy")}
    assert task.stacked_losses == task.losses_of_stack
    losses = task.stacked_losses(params, rows, None, mask)
    grads = torch.autograd.grad(losses.sum(), [params["x"], params["y"]])
    for k in range(3):
        model = task.model_factory()
        with torch.no_grad():
            model.x.fill_(points[k, 0])
            model.y.fill_(points[k, 1])
        real = rows[k][mask[k] > 0]
        own = task.loss_fn(model(real), None)
        own.backward()
        assert losses[k].item() == pytest.approx(own.item(), abs=1e-5)
        assert grads[0][k].item() == pytest.approx(model.x.grad.item(), abs=1e-5)
        assert grads[1][k].item() == pytest.approx(model.y.grad.item(), abs=1e-5)
    assert torch.allclose(task.stacked_losses(params, rows, None, None),
                          task.stacked_losses(params, rows, None, torch.ones(3, 5)))
    task.loss_fn = lambda out, target: out.square().mean()  # not the loss the hook computes
    assert task.stacked_losses is None


@pytest.mark.parametrize("algorithm", ["fedavg", "fedqp", "fedprox"])
def test_the_stacked_step_without_vmap_equals_vmaps(monkeypatch, algorithm):
    """The vmap backend's step on the toy takes every lane's gradient from one backward pass
    of ToyTask.stacked_losses (no vmap); runs equal the step with vmap (the task's hook
    removed) to float tolerance: uneven batches (padding rows), momentum, weight decay,
    FedQP's projection; FedProx (a penalty) keeps vmap's step, so it must not call the
    hook."""
    from flnotes.toy.task import ToyTask

    config = _config(algorithm, backend="vmap", rounds=4, num_clients=4, batch_size=3,
                     weight_decay=0.05,
                     data_options={"start": [-0.4, -0.5], "samples_per_client": 7})
    calls = []
    own = ToyTask.losses_of_stack

    def counted(self, *args):
        calls.append(1)
        return own(self, *args)

    monkeypatch.setattr(ToyTask, "losses_of_stack", counted)
    fast = run(config, progress=False)
    assert bool(calls) == (algorithm != "fedprox")
    monkeypatch.setattr(ToyTask, "stacked_losses", None)
    slow = run(config, progress=False)
    for a, b in zip(fast.rows, slow.rows, strict=True):
        for key in ("x", "y", "loss", "train_loss"):
            if key in a:
                assert a[key] == pytest.approx(b[key], abs=1e-5), (algorithm, key)
    assert fast.trajectory and len(fast.trajectory) == len(slow.trajectory)
    for a, b in zip(fast.trajectory, slow.trajectory, strict=True):
        for ours, theirs in zip([*a["local"], a["global"]], [*b["local"], b["global"]],
                                strict=True):
            assert toy.point_of(ours) == pytest.approx(toy.point_of(theirs), abs=1e-5)
    assert toy.point_of(fast.final_state) == pytest.approx(toy.point_of(slow.final_state),
                                                           abs=1e-5)


def test_local_sgd_is_gradient_descent_on_the_client_landscape():
    config = _config(data_options={"noise": 0.0, "samples_per_client": 4})
    task = build_task(config)
    model = task.model_factory()
    x, y = task.client_data(1)
    start = clone_state(model.state_dict())  # the model's own tensors change as it trains
    state, _ = local_sgd(model, start, x, y, epochs=3, batch_size=4, lr=0.05, momentum=0.0,
                         weight_decay=0.0, generator=torch.Generator().manual_seed(0),
                         loss_fn=task.loss_fn)
    client = lambda p: task.federation.client_losses(p)[..., 1]  # noqa: E731
    path = L.descend(client, torch.tensor(toy.point_of(start)), steps=3, lr=0.05)
    assert torch.allclose(torch.tensor(toy.point_of(state), dtype=torch.float64), path,
                          atol=1e-5)


def test_evaluation_reads_the_landscapes():
    task = build_task(_config(client_test_fraction=0.25))
    fed = task.federation
    model = task.model_factory()
    with torch.no_grad():
        model.x.copy_(fed.flat_center[0])
        model.y.copy_(fed.flat_center[1])
    row = task.evaluate(model)
    center = fed.flat_center.double()
    assert row["accuracy"] == 1.0 and row["sharp_basin"] == 0.0
    assert row["loss"] == pytest.approx(float(fed.global_loss(center)), abs=1e-6)
    assert row["sharpness"] == pytest.approx(float(L.top_eigenvalue(fed.global_loss, center)),
                                             rel=1e-4)
    sharp = fed.clients[0].centers_of("sharp")[0]
    with torch.no_grad():
        model.x.copy_(sharp[0])
        model.y.copy_(sharp[1])
    row = task.evaluate(model)
    assert row["accuracy"] == 0.0 and row["sharp_basin"] == 1.0
    # A client's held-out rows (what FML's personal metric uses) give that client's loss.
    assert task.client_test_indices is not None
    for client, idx in enumerate(task.client_test_indices):
        assert set(idx.tolist()).isdisjoint(task.client_indices[client].tolist())
        held = task.evaluate_on(model, task.train_x[idx], task.train_y[idx])
        assert held["loss"] == pytest.approx(float(fed.client_losses(sharp)[client]), abs=1e-5)


def test_start_point_and_jitter_come_from_the_config():
    def start(**overrides):
        return toy.point_of(build_task(_config(**overrides)).model_factory().state_dict())

    assert start(data_options={"start": [0.5, 0.25]}) == (0.5, 0.25)
    jitter = {"start": [0.5, 0.25], "start_jitter": 0.3}
    a, b = start(seed=1, data_options=jitter), start(seed=1, data_options=jitter)
    assert a == b != (0.5, 0.25)
    assert a != start(seed=2, data_options=jitter)


def test_mutation_points_use_the_strategies_mutations():
    center, g, alpha = (0.2, -0.1), (0.3, -0.2), 2.0
    corners = toy.mutation_points(center, g, kind="sign", alpha=alpha, num_models=4)
    offsets = (corners - torch.tensor(center)) / (alpha * torch.tensor(g))
    assert torch.allclose(offsets.abs(), torch.ones(4, 2), atol=1e-5)
    assert torch.allclose(offsets.sum(0), torch.zeros(2), atol=1e-5)  # balanced signs
    circle = toy.mutation_points(center, g, kind="gaussian", alpha=alpha, layerwise=False,
                                 num_models=50)
    radius = alpha * math.hypot(*g)
    assert torch.allclose((circle - torch.tensor(center)).norm(dim=1),
                          torch.full((50,), radius), atol=1e-5)
    fan = toy.mutation_points(center, g, kind="gaussian", alpha=alpha, layerwise=False,
                              num_models=50, qp_prob=1.0)
    assert ((fan - torch.tensor(center)) @ torch.tensor(g) >= -1e-6).all()


def test_race_rows_and_table():
    rows = toy.race(["fedavg", "fedmut"], seeds=2, rounds=2)
    assert [(r["algorithm"], r["seed"]) for r in rows] == [
        ("fedavg", 0), ("fedavg", 1), ("fedmut", 0), ("fedmut", 1)]
    again = toy.race(["fedmut"], seeds=[1], rounds=2)
    assert again[0] == rows[3]
    table = toy.race_table(rows)
    assert set(table.index) == {"fedavg", "fedmut"}
    assert (table["runs"] == 2).all()
    assert ((table["flat"] + table["sharp"] + table["elsewhere"]) - 1).abs().max() < 1e-12


def test_stacked_race_equals_runs_one_by_one():
    """The race stacks each method's seeds (vmap backend); every row must equal the seed's
    own run on the loop backend, for a stacking method (FedMut, FedMR), one whose clients
    fall back to the loop inside the stack (FedSAM), one that runs seed by seed (FML) and
    one whose own update the toy's model has no use for (MOON: FedAvg's training, stacked)."""
    methods = ["fedavg", "fedmut", "fedmr", "fedsam", "fml", "moon"]
    options = {"rounds": 4, "num_clients": 4, "clients_per_round": 2,
               "data_options": {"start": [-0.3, -0.6], "start_jitter": 0.5}}
    stacked = toy.race(methods, seeds=3, **options)
    alone = toy.race(methods, seeds=3, stack=False, **options)
    assert [(r["algorithm"], r["seed"]) for r in stacked] == \
        [(r["algorithm"], r["seed"]) for r in alone]
    for a, b in zip(stacked, alone, strict=True):
        assert a["status"] == b["status"] and a["accuracy"] == b["accuracy"]
        for key in ("x", "y", "loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), (a["algorithm"], key)


def test_race_in_worker_processes_gives_the_same_rows():
    toy.forget_races()
    serial = toy.race(["fedavg", "fedqp"], seeds=2, rounds=2)
    toy.forget_races()  # else the second race reads the first one's rows
    parallel = toy.race(["fedavg", "fedqp"], seeds=2, rounds=2, processes=2)
    assert parallel == serial


def test_a_race_keeps_each_methods_rows_for_the_same_setting(monkeypatch):
    """Notebook 04's explorer reads the table's race: a method's rows are kept per setting
    (its default alpha written out is the same setting); another setting runs."""
    from flnotes.toy import experiments

    toy.forget_races()
    first = toy.race(["fedavg", "fedqp"], seeds=2, rounds=2)
    ran = []
    real = experiments.method_rows
    monkeypatch.setattr(experiments, "method_rows",
                        lambda job: ran.append(job[0]) or real(job))
    own_alpha = toy.toy_config("fedqp").alpha
    assert toy.race(["fedqp"], seeds=2, rounds=2, alpha=own_alpha) == first[2:]
    assert toy.race(["fedavg"], seeds=2, rounds=2) == first[:2] and ran == []
    kept = toy.race(["fedqp"], seeds=2, rounds=2)
    kept[0]["x"] = 99.0  # a copy: the kept rows do not change
    assert toy.race(["fedqp"], seeds=2, rounds=2)[0] == first[2] and ran == []
    toy.race(["fedqp"], seeds=2, rounds=3)
    toy.race(["fedqp"], seeds=2, rounds=2, alpha=own_alpha + 1)
    assert ran == ["fedqp", "fedqp"]
    toy.forget_races()
    assert toy.race(["fedavg"], seeds=2, rounds=2) == first[:2] and ran[-1] == "fedavg"


def test_unknown_toy_options_are_named_with_what_the_toy_takes():
    with pytest.raises(ValueError, match=r"\['foo'\] unknown.*samples_per_client.*shift"):
        build_task(_config(data_options={"foo": 1}))
    with pytest.raises(ValueError, match="num_clients is RunConfig.num_clients"):
        build_task(_config(data_options={"num_clients": 3}))


def test_a_method_registered_again_races_again():
    """The kept races name the class that ran them: a method of the same name registered
    again (a student's edited strategy) is raced anew, not read back."""
    from flnotes.algorithms import register_algorithm, unregister_algorithm
    from flnotes.algorithms.fedavg import FedAvg

    class Mine(FedAvg):
        name = "mine-race-test"

    class Edited(FedAvg):
        name = "mine-race-test"

        def aggregate(self, round, results):  # FedAvg, then a step of +1 in x and y
            state = super().aggregate(round, results)
            for tensor in state.values():
                tensor.add_(1.0)
            return state

    toy.forget_races()
    register_algorithm(Mine)
    try:
        first = toy.race(["mine-race-test"], seeds=2, rounds=2)
        unregister_algorithm("mine-race-test")
        register_algorithm(Edited)
        again = toy.race(["mine-race-test"], seeds=2, rounds=2)
    finally:
        unregister_algorithm("mine-race-test")
        toy.forget_races()
    assert [r["x"] for r in again] != [r["x"] for r in first]


def test_a_race_that_writes_somewhere_is_never_read_back(monkeypatch, tmp_path):
    """Runs with a run folder or with loggers asked for in the environment write as they
    go; a kept race would skip that, so such races are not kept."""
    from flnotes.engine.tracking import ENV_LOGGERS
    from flnotes.toy import experiments

    assert experiments._race_key("fedavg", [0, 1], True, {"rounds": 2}) is not None
    assert experiments._race_key("fedavg", [0, 1], True,
                                 {"rounds": 2, "run_dir": str(tmp_path)}) is None
    monkeypatch.setenv(ENV_LOGGERS, "tensorboard")
    assert experiments._race_key("fedavg", [0, 1], True, {"rounds": 2}) is None
    assert not toy.kept_race("fedavg", 2, rounds=2)


def test_a_race_of_more_seeds_than_a_kept_one_runs_only_the_seeds_it_lacks(monkeypatch):
    """More seeds for the explorer's interval: the kept first seeds' rows are read back and
    only the others run (methods lacking the same seeds together); the whole equals a race
    of all the seeds from scratch to float tolerance."""
    from flnotes.toy import experiments

    toy.forget_races()
    try:
        fresh = toy.race(["fedavg", "fedqp"], seeds=6, rounds=3)
        toy.forget_races()
        first = toy.race(["fedavg", "fedqp"], seeds=4, rounds=3)
        ran = []
        real = experiments.method_rows
        monkeypatch.setattr(experiments, "method_rows",
                            lambda job: ran.append((job[0], list(job[1]))) or real(job))
        more = toy.race(["fedavg", "fedqp"], seeds=6, rounds=3)
        assert ran == [("fedavg", [4, 5]), ("fedqp", [4, 5])]
        assert [r["seed"] for r in more] == [0, 1, 2, 3, 4, 5] * 2
        assert more[:4] == first[:4] and more[6:10] == first[4:]  # read back as they were
        for a, b in zip(more, fresh, strict=True):
            assert (a["algorithm"], a["seed"], a["accuracy"]) == (
                b["algorithm"], b["seed"], b["accuracy"])
            for key in ("x", "y", "loss"):
                assert a[key] == pytest.approx(b[key], abs=1e-5)
        toy.race(["fedqp"], seeds=6, rounds=3)  # now kept whole
        toy.race(["fedqp"], seeds=[0, 1, 2, 3, 7], rounds=3)  # the kept head, then seed 7
        assert ran[2:] == [("fedqp", [7])]
    finally:
        toy.forget_races()


def test_a_race_of_the_first_seeds_reads_them_from_a_kept_longer_race(monkeypatch):
    """The explorer's quick picture (its first seeds) reads a kept race of more seeds: the
    same seeds' rows, equal to their own race to float tolerance, and nothing is run."""
    from flnotes.toy import experiments

    toy.forget_races()
    try:
        short = toy.race(["fedqp"], seeds=3, rounds=3)
        toy.forget_races()
        toy.race(["fedqp"], seeds=6, rounds=3)
        ran = []
        real = experiments.method_rows
        monkeypatch.setattr(experiments, "method_rows",
                            lambda job: ran.append(job[0]) or real(job))
        assert toy.kept_race("fedqp", 3, rounds=3)
        head = toy.race(["fedqp"], seeds=3, rounds=3)
        assert ran == [] and [r["seed"] for r in head] == [0, 1, 2]
        for a, b in zip(head, short, strict=True):
            assert a["accuracy"] == b["accuracy"]
            for key in ("x", "y", "loss"):
                assert a[key] == pytest.approx(b[key], abs=1e-5)
        toy.race(["fedqp"], seeds=[1, 2], rounds=3)  # not the head of the kept race: runs
        assert ran == ["fedqp"]
    finally:
        toy.forget_races()


def test_a_race_expects_its_methods_fallbacks_in_its_own_thread_only():
    """The toy's races expect MOON's and FedGen's "trains as FedAvg" and FedSAM's "no
    batched step" notes and do not give them; a run outside a race still does, and the
    expectation belongs to the thread that has it (an explorer's worker races while a cell
    records its own warnings: warnings.catch_warnings would be the process's)."""
    import threading
    import warnings

    from flnotes.messages import expecting_fallbacks, fallback_warning

    toy.forget_races()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        toy.race(["moon", "fedgen", "fedsam"], seeds=2, rounds=2)
        assert not [w for w in caught if "flnotes:" in str(w.message)]
        run(toy.toy_config("moon", rounds=1), progress=False)
        assert any("MOON trains as FedAvg" in str(w.message) for w in caught)
    inside, said, given = threading.Event(), threading.Event(), []

    def worker():
        with expecting_fallbacks():
            inside.set()
            said.wait(60)  # the main thread warns while this block is open
            given.append(fallback_warning("flnotes: expected here"))

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(60)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert fallback_warning("flnotes: said in the main thread")
        assert [str(w.message) for w in caught] == ["flnotes: said in the main thread"]
    finally:
        said.set()
        thread.join()
    assert given == [False]
    toy.forget_races()


def test_warm_up_runs_each_method_once_and_keeps_nothing(monkeypatch):
    """warm_up (the race explorer calls it when made) runs one round of one seed of each
    method not yet warmed: later calls run nothing, and no race is kept by it (a kept race
    would be read back as a real one)."""
    from flnotes.engine import seeds
    from flnotes.toy import experiments

    monkeypatch.setattr(experiments, "_WARMED", set())
    runs, own = [], seeds.run_seeds

    def counted(config, chosen, **kwargs):
        runs.append((config.algorithm, config.rounds, list(chosen)))
        return own(config, chosen, **kwargs)

    monkeypatch.setattr(experiments, "run_seeds", counted)
    kept = dict(experiments._RACES)
    experiments.warm_up(["fedavg", "fml", "clusamp"])
    experiments.warm_up(["fedavg", "fml", "fedsam"])
    assert runs == [("fedavg", 1, [0]), ("fml", 1, [0]), ("clusamp", 1, [0]),
                    ("fedsam", 1, [0])]
    assert experiments._RACES == kept
    # A worker racing in another thread holds the race lock: warm_up does not wait for it.
    held, release = threading.Event(), threading.Event()

    def racing():
        with experiments._RACING:
            held.set()
            release.wait(10)

    worker = threading.Thread(target=racing)
    worker.start()
    held.wait(10)
    experiments.warm_up(["fedprox"])
    release.set()
    worker.join()
    assert runs[-1][0] == "fedsam"
    # A method that fails to run is no error of the explorer's cell.
    monkeypatch.setattr(experiments, "run_seeds", lambda *a, **k: 1 / 0)
    experiments.warm_up(["fedmut"])


# ---- the shipped default race (flnotes/toy/shipped.py) ------------------------------------


def test_the_shipped_race_covers_every_method_at_notebook_04s_setting():
    from flnotes.algorithms import algorithm_class
    from flnotes.toy import shipped

    entries = {e["algorithm"]: e for e in shipped.entries()}
    assert sorted(entries) == sorted(algorithm_names()), (
        "a method was added or renamed: run python flnotes/notebooks/refresh_outputs.py "
        "--ship-toy-race")
    for name, entry in entries.items():
        assert entry["class"] == shipped.class_path(algorithm_class(name))
        assert entry["overrides"] == shipped.DEFAULT and entry["stack"] is True
        assert [r["seed"] for r in entry["rows"]] == list(range(shipped.SEEDS))
        assert {r["algorithm"] for r in entry["rows"]} == {name}


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_the_shipped_race_is_what_the_methods_do_now(algorithm):
    """Every method's first seeds run again, fresh: the shipped rows are theirs to float
    tolerance. A change that moves a toy run fails here: run
    python flnotes/notebooks/refresh_outputs.py --ship-toy-race."""
    from flnotes.toy import shipped

    (entry,) = [e for e in shipped.entries() if e["algorithm"] == algorithm]
    toy.forget_races()
    fresh = toy.race([algorithm], seeds=3, **shipped.DEFAULT)
    for new, old in zip(fresh, entry["rows"][:3], strict=True):
        assert (new["seed"], new["status"], new["accuracy"], new["sharp_basin"]) == \
            (old["seed"], old["status"], old["accuracy"], old["sharp_basin"]), algorithm
        for key in ("x", "y", "loss", "worst_client_loss", "sharpness"):
            assert new[key] == pytest.approx(old[key], abs=1e-4, nan_ok=True), (algorithm, key)


def test_a_race_at_the_shipped_setting_runs_nothing_and_another_setting_runs(monkeypatch,
                                                                              capsys):
    from flnotes.toy import experiments, shipped

    toy.forget_races()
    monkeypatch.setattr(experiments, "_SHIPPED_READ", [False])  # a fresh process
    ran = []
    real = experiments._run_races
    monkeypatch.setattr(experiments, "_run_races",
                        lambda algorithms, *a: ran.append(list(algorithms)) or real(
                            algorithms, *a))
    rows = toy.race(seeds=shipped.SEEDS, progress=True, **shipped.DEFAULT)
    assert ran == [] and "shipped with flnotes" in capsys.readouterr().out
    by_method = {e["algorithm"]: e["rows"] for e in shipped.entries()}
    assert rows == [row for name in algorithm_names() for row in by_method[name]]
    assert toy.race(["fedavg"], seeds=20, **shipped.DEFAULT) == by_method["fedavg"][:20]
    toy.race(["fedavg"], seeds=2, **{**shipped.DEFAULT, "lr": 0.2})
    assert ran == [["fedavg"]]
    toy.forget_races()


def test_the_path_animation_draws_each_round_of_each_method():
    """notebook 04's GIF: a frame per round, the picture changing as the lines grow."""
    import io

    from PIL import Image

    from flnotes.toy import landscapes, plots

    fed = landscapes.make_federation("fedmut-fig1", num_clients=2)
    paths = {name: toy.run_toy(name, rounds=4, seed=0)[1]["global"]
             for name in ("fedavg", "fedmut")}
    assert all(len(p) == 5 for p in paths.values())  # round 0 and 4 rounds
    gif = Image.open(io.BytesIO(plots.animate_paths(fed.global_loss, paths, federation=fed)))
    assert gif.format == "GIF" and gif.n_frames >= 5  # rounds 0-4 (equal frames may merge)
    first = gif.convert("RGB").tobytes()
    gif.seek(gif.n_frames - 1)
    assert gif.convert("RGB").tobytes() != first  # the lines moved
