"""A round's clients in worker processes (flnotes.engine.client_workers): the same run, bit for
bit, for every registered method; the methods that cannot say so and train in turn."""

import pytest
import torch

from flnotes.algorithms import algorithm_class, algorithm_names
from flnotes.cli.main import main
from flnotes.config import RunConfig
from flnotes.engine.client_workers import why_not
from flnotes.engine.sim import Simulation, run

SMALL = dict(dataset="synthetic", model="mlp", num_clients=6, clients_per_round=4, rounds=3,
             local_epochs=1, data_options={"num_train": 300, "num_test": 100}, seed=1,
             device="cpu")


def same_run(a, b) -> None:
    assert a.status == b.status == "completed"
    assert all(torch.equal(a.final_state[k], b.final_state[k]) for k in a.final_state)
    drop = {"seconds"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in a.rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in b.rows]


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_two_workers_train_every_method_as_the_loop_does(algorithm, capsys):
    config = RunConfig(algorithm=algorithm, **SMALL)
    in_turn = run(config, progress=False)
    workers = run(config, progress=True, client_workers=2)
    same_run(in_turn, workers)
    said = capsys.readouterr().err
    if algorithm_class(algorithm).parallel_clients:
        assert "client_workers" not in said
    else:  # one line, and the run goes on in the loop
        name = algorithm_class(algorithm).__name__
        assert (f"client_workers=2: the clients train in turn ({name}'s client code changes "
                "its strategy's own state)") in said


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_a_run_resumed_with_workers_equals_one_run_in_turn(algorithm, tmp_path):
    """Per-client state kept on disk (the run folder's client_states/) across a stop."""
    config = RunConfig(algorithm=algorithm, **{**SMALL, "rounds": 4, "checkpoint_every": 1})
    whole = run(config.replace(run_dir=str(tmp_path / "whole")), progress=False)
    part = tmp_path / "part"
    run(config.replace(rounds=2, run_dir=str(part)), progress=False, client_workers=2)
    resumed = run(config.replace(run_dir=str(part)), progress=False, client_workers=3)
    same_run(whole, resumed)


def test_where_workers_cannot_help_it_says_why():
    config = RunConfig(algorithm="fedavg", **SMALL)
    strategy = Simulation(config).strategy
    assert why_not(config, strategy, 1) is None and why_not(config, strategy, 2) is None
    assert "one client a round" in why_not(config.replace(clients_per_round=1), strategy, 2)
    assert "vmap" in why_not(config.replace(backend="vmap"), strategy, 2)
    with pytest.raises(ValueError, match="client_workers=0 is invalid"):
        run(config, progress=False, client_workers=0)


def test_the_command_line_flag_gives_the_same_run(tmp_path, capsys):
    flags = ["run", "--algorithm", "fedprox", "--num-clients", "6", "--clients-per-round", "4",
             "--rounds", "2", "--data-option", "num_train=300", "--data-option",
             "num_test=100", "--device", "cpu"]
    assert main([*flags, "--run-dir", str(tmp_path / "a")]) == 0
    assert main([*flags, "--run-dir", str(tmp_path / "b"), "--client-workers", "2"]) == 0
    a, b = (torch.load(tmp_path / n / "global_model.pt") for n in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit):
        main([*flags, "--client-workers", "0"])
    assert "--client-workers: '0' is not a whole number >= 1" in capsys.readouterr().err


def test_left_to_flnotes_a_run_takes_the_idle_cores_for_a_model_worth_it():
    from flnotes.engine.client_workers import default_workers

    config = RunConfig(algorithm="fedavg", **SMALL)  # 4 clients a round
    assert default_workers(config, 2e5, idle=8) == 1  # the MLP: sending costs more
    assert default_workers(config, 6.5e5, idle=2) == 2  # LeNet on two idle cores
    assert default_workers(config, 6.5e5, idle=8) == 4  # no more than the round's clients
    assert default_workers(config, 6.5e5, idle=1) == 1  # busy cores
    assert default_workers(config.replace(backend="vmap"), 6.5e5, idle=8) == 1


def test_a_run_left_to_flnotes_is_the_same_run_and_says_nothing(capsys, monkeypatch):
    from flnotes.engine import sim

    monkeypatch.setattr(sim, "idle_cores", lambda: 2)
    monkeypatch.setattr(sim, "task_multiply_adds", lambda task: 6.5e5)  # as if LeNet
    config = RunConfig(algorithm="fml", **SMALL)  # FML trains in turn: nothing said
    same_run(run(config, progress=False), run(config, progress=True, client_workers=None))
    assert "client_workers" not in capsys.readouterr().err
    pools = []
    real = sim.ClientWorkers
    monkeypatch.setattr(sim, "ClientWorkers", lambda task, n: pools.append(n) or real(task, n))
    config = RunConfig(algorithm="fedprox", **SMALL)
    same_run(run(config, progress=False), run(config, progress=False, client_workers=None))
    assert pools == [2]  # the idle cores, in workers
