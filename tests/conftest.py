"""Shared fixtures: a tiny synthetic federation that trains in a fraction of a second."""

import os
import signal
from pathlib import Path

import pytest
import torch

from flnotes.config import RunConfig

# The models in tests are tiny: one thread is faster than two fighting over two cores,
# and it keeps CPU results independent of the machine's core count.
torch.set_num_threads(1)

# A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and Python
# then leaves it so: the Ctrl-C tests (and the commands they start, which inherit it) would
# never see one. Ctrl-C as a terminal delivers it, here and in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The backend-equality tests (test_vmap, test_compiled, test_stacked) also run on a GPU:
# FLNOTES_TEST_DEVICE=cuda python -m pytest tests/test_vmap.py ... CI runs them on the CPU.
DEVICE = os.environ.get("FLNOTES_TEST_DEVICE", "cpu")
if DEVICE.startswith("cuda"):
    # TF32 convolutions/matmuls round to 10 mantissa bits: loop and vmap would then differ
    # by about 1e-3, far beyond the float32 tolerance the equality tests hold them to.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture
def tiny_config() -> RunConfig:
    """Six clients on a small synthetic task with an MLP."""
    return RunConfig(
        dataset="synthetic", model="mlp", num_clients=6, clients_per_round=3, rounds=3,
        local_epochs=1, batch_size=32, lr=0.05, momentum=0.5, seed=1,
        data_options={"num_train": 600, "num_test": 200}, device=DEVICE,
    )


# The longest files first: with two workers (make test), each takes a long file at the start
# instead of one worker running the browser test alone at the end.
LONGEST_FIRST = ("test_browser.py", "test_browser_b.py", "test_sweep_ray.py")
BROWSER_DRIVE = "test_notebook_runs_and_every_control_redraws"


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """Longest files first; and a teaching notebook the browser test drives in this session,
    comparing its checked outputs as nbval does (its CHECKED_HERE), is not also run by nbval:
    its nbval cells are deselected. Only under --nbval-lax with the suite's sanitize file,
    which is what the browser test reproduces (--nbval compares every cell: nbval runs them
    all then); where the browser cannot run, its module is skipped at collection, and nbval
    runs the notebook as before."""
    sanitize = config.getoption("nbval_sanitize_with", None) or config.getoption(
        "sanitize_with", None)
    lax = (config.getoption("nbval_lax", False) and not config.getoption("nbval", False)
           and sanitize is not None
           and Path(sanitize).resolve() == Path(__file__).with_name("nbval_sanitize.cfg"))
    driven = set() if not lax else {item.callspec.params["name"] for item in items
              if getattr(item, "originalname", None) == BROWSER_DRIVE
              and item.callspec.params["name"] in getattr(item.module, "CHECKED_HERE", ())}
    twice = [item for item in items if item.path.suffix == ".ipynb" and item.path.stem in driven]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if item not in twice]

    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's own order is kept
