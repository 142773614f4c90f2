"""Seeds stacked into one batched run equal the same seeds run one at a time."""

import json

import pytest
import torch
from conftest import DEVICE

import flnotes.engine.seeds as seeds_module
from flnotes.engine.backends import train_clients
from flnotes.engine.run_folder import lock_file, unlock_file
from flnotes.engine.seeds import run_seeds, seed_configs
from flnotes.engine.sim import run
from flnotes.engine.tasks import build_task

SEEDS = [3, 1, 4]


def assert_same_run(stacked, single):
    """Same rounds, metrics (float tolerance) and final model."""
    assert stacked.status == single.status
    assert [r["round"] for r in stacked.rows] == [r["round"] for r in single.rows]
    for a, b in zip(single.rows, stacked.rows, strict=True):
        for key in ("train_loss", "accuracy", "loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["round"], key)
    for name, t in single.final_state.items():
        torch.testing.assert_close(stacked.final_state[name], t, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("algorithm", ["fedprox", "fedmut", "fedup"])
def test_stacked_seeds_equal_separate_runs(tiny_config, algorithm, monkeypatch):
    # All three share one stack: fedmut with different starts per client, fedprox and fedup
    # with per-lane anchors (fedup's holds each run's own previous global model).
    config = tiny_config.replace(algorithm=algorithm, dirichlet_alpha=0.3, batch_size=16,
                                 momentum=0.9, weight_decay=1e-3, mu=0.1, backend="vmap")
    per_run = []
    monkeypatch.setattr(seeds_module, "train_clients",
                        lambda *args: per_run.append(args) or train_clients(*args))
    stacked = run_seeds(config, SEEDS, progress=False)
    assert not per_run  # nothing fell back to per-run training
    assert [h.config["seed"] for h in stacked] == SEEDS
    for seed, history in zip(SEEDS, stacked, strict=True):
        assert_same_run(history, run(config.replace(seed=seed), progress=False))
    # The seeds really differ: different partitions, samples and mutations.
    assert len({round(h.rows[-1]["train_loss"], 6) for h in stacked}) == len(SEEDS)


def test_a_stack_that_does_not_fit_trains_run_by_run(tiny_config, monkeypatch):
    tries = []

    def out_of_memory(*args, **kwargs):
        tries.append(args[1])
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(seeds_module, "train_supervised", out_of_memory)
    config = tiny_config.replace(algorithm="fedmut", rounds=2, backend="vmap")
    histories = run_seeds(config, [0, 1], progress=False)
    assert tries == [1]  # round 2 knew the stack would not fit
    for seed, history in zip([0, 1], histories, strict=True):
        assert_same_run(history, run(config.replace(seed=seed), progress=False))


def test_stacked_seeds_resume_from_their_own_folders(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedavg", backend="vmap", checkpoint_every=1,
                                 run_dir=str(tmp_path / "cell"))
    # Seed 1 already ran two rounds; seed 2 starts from scratch: lockstep from round 1,
    # seed 1 joins at round 3.
    run(config.replace(seed=1, rounds=2, run_dir=str(tmp_path / "cell" / "seed1")),
        progress=False)
    histories = run_seeds(config, [1, 2], progress=False)
    for seed, history in zip([1, 2], histories, strict=True):
        folder = tmp_path / "cell" / f"seed{seed}"
        assert json.loads((folder / "run.json").read_text())["status"] == "completed"
        assert (folder / "global_model.pt").exists()
        assert_same_run(history, run(config.replace(seed=seed, run_dir=None), progress=False))
    again = run_seeds(config, [1, 2], progress=False)  # finished folders: reloaded, not re-run
    assert [h.rows for h in again] == [h.rows for h in histories]


def test_seed_list_is_checked(tiny_config):
    with pytest.raises(ValueError, match="at least one seed"):
        seed_configs(tiny_config, [])
    with pytest.raises(ValueError, match="twice"):
        seed_configs(tiny_config, [1, 1])


@pytest.mark.skipif(DEVICE != "cpu", reason="auto means the loop only on a CPU")
def test_auto_on_a_cpu_runs_the_seeds_in_turn(tiny_config, monkeypatch):
    # "auto" resolves to the loop on a CPU (faster there): nothing is stacked, so the
    # results are the reference loop's to the bit.
    monkeypatch.setattr(seeds_module, "train_supervised", None)  # would fail if called
    histories = run_seeds(tiny_config.replace(rounds=2), [5, 6], progress=False)
    for seed, history in zip([5, 6], histories, strict=True):
        single = run(tiny_config.replace(rounds=2, seed=seed), progress=False)
        strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
        assert strip(history.rows) == strip(single.rows)


def test_cli_runs_seeds_and_reports_their_spread(tmp_path, capsys):
    from flnotes.cli.main import main
    from flnotes.engine.history import History
    from flnotes.repro.tables import run_metrics

    code = main(["run", "--seeds", "2,7", "--backend", "vmap", "--device", "cpu",
                 "--rounds", "2", "--num-clients", "4", "--clients-per-round", "2",
                 "--data-option", "num_train=400", "--data-option", "num_test=100",
                 "--run-dir", str(tmp_path / "cell")])
    out = capsys.readouterr().out
    assert code == 0
    means = []
    for seed in (2, 7):
        folder = tmp_path / "cell" / f"seed{seed}"
        assert json.loads((folder / "config.json").read_text())["seed"] == seed
        means.append(run_metrics(History.load(folder).metric("accuracy"))["last_mean"])
        assert f"seed {seed}: completed" in out
    # the sample std (ddof=1) of two values is their distance over sqrt(2)
    spread = f"over 2 seeds: {sum(means) / 2:.4f} +- {abs(means[0] - means[1]) / 2 ** 0.5:.4f}"
    assert spread in out and (tmp_path / "cell" / "learning_curves.png").exists()


def test_seeds_share_identical_data(tiny_config, monkeypatch):
    # A dataset read from files is the same whatever the seed: make the synthetic one so.
    import flnotes.data

    load = flnotes.data.load_dataset
    monkeypatch.setattr(flnotes.data, "load_dataset", lambda *a, **k: load(*a, **{**k, "seed": 0}))
    tasks = []
    for seed in (1, 2):
        tasks.append(seeds_module.share_identical_data(
            build_task(tiny_config.replace(seed=seed)), tasks[0] if tasks else None))
    assert tasks[1].train_x is tasks[0].train_x and tasks[1].test_y is tasks[0].test_y
    assert tasks[1].client_indices[0] is not tasks[0].client_indices[0]  # own partition
    # With shared data the stacked seeds still equal separate runs.
    config = tiny_config.replace(algorithm="fedmut", rounds=2, backend="vmap")
    for seed, history in zip([1, 2], run_seeds(config, [1, 2], progress=False), strict=True):
        assert_same_run(history, run(config.replace(seed=seed), progress=False))
    # Different data are never shared.
    monkeypatch.setattr(flnotes.data, "load_dataset", load)
    other = seeds_module.share_identical_data(build_task(tiny_config.replace(seed=3)), tasks[0])
    assert other.train_x is not tasks[0].train_x


def test_ctrl_c_marks_every_stacked_seed_interrupted(tiny_config, tmp_path, monkeypatch):
    def ctrl_c_in_round_2(plans, rnd):
        if rnd == 2:
            raise KeyboardInterrupt
        return real_train(plans, rnd)

    real_train = seeds_module.train_plans
    monkeypatch.setattr(seeds_module, "train_plans", ctrl_c_in_round_2)
    config = tiny_config.replace(algorithm="fedavg", backend="vmap", rounds=3,
                                 run_dir=str(tmp_path / "cell"))
    with pytest.raises(KeyboardInterrupt):
        run_seeds(config, [0, 1], progress=False)
    for seed in (0, 1):
        meta = json.loads((tmp_path / "cell" / f"seed{seed}" / "run.json").read_text())
        assert meta["status"] == "interrupted"


@pytest.mark.parametrize(("stop", "status"), [(KeyboardInterrupt, "interrupted"),
                                              (RuntimeError, "failed")])
def test_a_stop_ends_and_lets_go_of_every_stacked_seed(tiny_config, tmp_path, monkeypatch,
                                                        stop, status):
    # Seed 0 diverges in round 1 and sits out round 2, where Ctrl-C (or an error) stops seed
    # 1: seed 0 ends diverged, as alone, and both folders are let go at once (the caught
    # exception's traceback keeps the Simulations alive, so a lock left to garbage collection
    # would refuse the next run in this process).
    def diverge_then_stop(plans, rnd):
        if rnd == 2:
            raise stop
        trained = real_train(plans, rnd)
        for result in trained[0]:
            result.train_loss = float("nan")
        return trained

    real_train = seeds_module.train_plans
    monkeypatch.setattr(seeds_module, "train_plans", diverge_then_stop)
    config = tiny_config.replace(algorithm="fedavg", backend="vmap", rounds=3,
                                 run_dir=str(tmp_path / "cell"))
    with pytest.raises(stop) as caught:
        run_seeds(config, [0, 1], progress=False)
    statuses = [json.loads((tmp_path / "cell" / f"seed{s}" / "run.json").read_text())["status"]
                for s in (0, 1)]
    assert statuses == ["diverged", status]
    for seed in (0, 1):
        held = lock_file(tmp_path / "cell" / f"seed{seed}" / "run.lock")
        assert not isinstance(held, str), (seed, held)
        unlock_file(held)
    del caught
