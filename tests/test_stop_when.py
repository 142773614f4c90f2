"""A caller's stop (flnotes.engine.stops.stop_when) stops runs as Ctrl-C does: between
rounds, the run folder marked interrupted, and the run resumes to what an uninterrupted run
gives. A notebook explorer's worker thread relies on it to drop a race a newer move made
stale."""

import json
import threading

import pytest
import torch

import flnotes.engine.seeds as seeds_module
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import run
from flnotes.engine.stops import Stopped, check_stop, stop_when


def test_a_stop_lands_between_rounds_and_the_run_resumes_as_if_never_stopped(tiny_config,
                                                                             tmp_path):
    config = tiny_config.replace(algorithm="fedavg", rounds=4, checkpoint_every=1,
                                 run_dir=str(tmp_path / "run"))
    stop = threading.Event()

    def after_round(row):
        if row["round"] == 2:
            stop.set()

    with pytest.raises(Stopped), stop_when(stop):
        run(config, progress=False, on_round=after_round)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "interrupted"
    logged = [json.loads(line)["round"]
              for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]  # round 3 never began
    resumed = run(config, progress=False)
    whole = run(config.replace(run_dir=None), progress=False)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3, 4]
    for name, tensor in whole.final_state.items():
        assert torch.equal(resumed.final_state[name], tensor), name


def test_stacked_seeds_stop_together(tiny_config, tmp_path, monkeypatch):
    stop = threading.Event()
    real_train = seeds_module.train_plans

    def train_then_stop(plans, rnd):
        if rnd == 2:
            stop.set()  # the stop arrives during round 2: round 2 ends, round 3 never begins
        return real_train(plans, rnd)

    monkeypatch.setattr(seeds_module, "train_plans", train_then_stop)
    config = tiny_config.replace(algorithm="fedavg", backend="vmap", rounds=3,
                                 run_dir=str(tmp_path / "cell"))
    with pytest.raises(Stopped), stop_when(stop):
        run_seeds(config, [0, 1], progress=False)
    for seed in (0, 1):
        folder = tmp_path / "cell" / f"seed{seed}"
        assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
        rounds = [json.loads(line)["round"]
                  for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert rounds == [1, 2]


def test_a_stop_set_before_the_block_starts_nothing(tiny_config, tmp_path):
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped), stop_when(stop):
        run(tiny_config.replace(run_dir=str(tmp_path / "run")), progress=False)
    assert not (tmp_path / "run").exists()


def test_a_stop_belongs_to_the_thread_that_asked_for_it(tiny_config):
    """While a worker's block is open and its event set, the main thread's runs go on (the
    stop is the worker's alone); the worker's stop ends with its block."""
    stop, inside, main_done = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def worker():
        with stop_when(stop):
            inside.set()
            main_done.wait(120)  # the block stays open while the main thread runs
            try:
                check_stop()
            except Stopped:
                seen.append("stopped")
        check_stop()  # outside the block: nothing to stop
        seen.append("after")

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(60)
    stop.set()
    try:
        history = run(tiny_config.replace(rounds=2), progress=False)  # not stopped
    finally:
        main_done.set()
        thread.join()
    assert seen == ["stopped", "after"] and history.status == "completed"
    assert isinstance(Stopped(), KeyboardInterrupt)  # every Ctrl-C cleanup applies to it


def test_stop_when_wants_an_event():
    with pytest.raises(TypeError, match="stop_when needs a threading.Event, got bool True"):
        with stop_when(True):
            pass
