"""The thread rule (flnotes/engine/threads.py): multiply-adds counted by hand, the choice
in each case, and runs that record the count they used and give the caller's back."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from flnotes import RunConfig, run
from flnotes.engine import threads as rule


def test_multiply_adds_of_each_layer_kind_by_hand():
    # Linear 10 -> 5: 50; Conv2d 3 -> 4, 3x3, on 8x8 without padding: 4 x 6 x 6 outputs,
    # each 3 x 3 x 3 multiply-adds = 3888; both in one model: 3888 + (4*6*6) * 7 = 4896.
    assert rule.multiply_adds(nn.Linear(10, 5), torch.randn(3, 10)) == 50
    conv = nn.Conv2d(3, 4, 3)
    assert rule.multiply_adds(conv, torch.randn(2, 3, 8, 8)) == 3888
    both = nn.Sequential(conv, nn.Flatten(), nn.Linear(144, 7))
    assert rule.multiply_adds(both, torch.randn(2, 3, 8, 8)) == 3888 + 144 * 7
    # LSTM, input 6, hidden 5, 2 layers (the second layer's input is 5 wide), 4 steps: the
    # count takes every layer at input + hidden = 11 wide: 4 * 2 * 20 * 11 = 1760
    lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True)
    assert rule.multiply_adds(lstm, torch.randn(1, 4, 6)) == 4 * 2 * 4 * 5 * (6 + 5)
    # No hook is left behind.
    assert not conv._forward_hooks


@pytest.mark.parametrize("load, idle", [(0.0, 2), (0.3, 2), (0.6, 1), (1.4, 1), (1.6, 1),
                                        (5.0, 1)])
def test_idle_cores_are_the_cores_the_load_leaves_rounded(monkeypatch, load, idle):
    monkeypatch.setattr(rule.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(rule.os, "getloadavg", lambda: (load, load, load))
    assert rule.idle_cores() == idle


def test_the_choice_in_each_case(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    never = lambda: pytest.fail("the model need not be looked at")  # noqa: E731
    assert rule.choose_threads(3, never) == 3  # the user's count, as given
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"):
            rule.choose_threads(bad, never)
    monkeypatch.setattr(rule, "idle_cores", lambda: 6)
    assert rule.choose_threads(None, lambda: 2e5) == 1  # MLP-size: one thread, idle or not
    assert rule.choose_threads(None, lambda: 6.5e5) == 6  # LeNet-size on idle cores
    assert rule.choose_threads(None, lambda: 5e8) == 6  # ResNet-18-size on idle cores
    monkeypatch.setattr(rule, "idle_cores", lambda: 64)
    assert rule.choose_threads(None, lambda: 5e8) == rule.MOST_THREADS
    monkeypatch.setattr(rule, "idle_cores", lambda: 1)  # busy cores: one thread
    assert rule.choose_threads(None, lambda: 5e8) == 1
    assert rule.choose_threads(None, never, on_gpu=True) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the environment chose: keep torch's
    assert rule.choose_threads(None, never) is None


def tiny(**changes) -> RunConfig:
    return RunConfig.from_preset("demo", rounds=1, **changes)


def test_a_run_records_the_count_it_used_and_gives_the_callers_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        history = run(tiny(), progress=False)  # an MLP: one thread
        assert history.environment["cpu_threads"] == 1
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert run(tiny(), progress=False, threads=2).environment["cpu_threads"] == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_thread_count_far_beyond_any_cpu_is_refused_before_torch_sees_it(tmp_path):
    """torch.set_num_threads(99999) and one matrix product end the process (SIGSEGV) with no
    message: the count is refused first, and no run folder is started."""
    from flnotes.engine.threads import MOST_REQUESTED

    with pytest.raises(ValueError, match=f"threads={MOST_REQUESTED + 1} is invalid: at most "
                       f"{MOST_REQUESTED}"):
        run(tiny(run_dir=str(tmp_path / "r")), progress=False, threads=MOST_REQUESTED + 1)
    assert not (tmp_path / "r").exists()


def test_run_threads_flag(tmp_path):
    folder = tmp_path / "r"
    done = subprocess.run([sys.executable, "-m", "flnotes", "run", "--preset", "demo",
                           "--rounds", "1", "--threads", "2", "--run-dir", str(folder)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    meta = json.loads((folder / "run.json").read_text())
    assert meta["environment"]["cpu_threads"] == 2
    bad = subprocess.run([sys.executable, "-m", "flnotes", "run", "--preset", "demo",
                          "--threads", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--threads" in bad.stderr.strip().splitlines()[-1]
