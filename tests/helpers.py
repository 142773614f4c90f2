"""Builders shared by several test modules: random tasks and starts for the engine tests,
tiny notebooks and grid files for the sweep tests."""

import json
import os
import re
from collections import OrderedDict
from pathlib import Path

import nbformat
import torch
import yaml
from conftest import DEVICE
from nbformat.v4 import new_code_cell, new_notebook

from flnotes.data.partition import dirichlet_partition
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.tasks import Task
from flnotes.models import build_model
from flnotes.rng import torch_generator

# model -> one sample's shape (small inputs keep the ResNet and the LSTM cheap)
SHAPES = {"cnn": (1, 28, 28), "resnet20": (3, 16, 16), "lstm": (6,)}


def random_task(model: str, num_clients: int, num_samples: int, dtype=torch.float32) -> Task:
    """Random inputs of the model's shape, split over clients by a Dirichlet(0.1) partition."""
    g = torch_generator(0, "test-vmap", model)
    shape, classes = SHAPES[model], 10
    if model == "lstm":
        x = torch.randint(0, classes, (num_samples, *shape), generator=g)
    else:
        x = torch.randn(num_samples, *shape, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (num_samples,), generator=g)
    parts = dirichlet_partition(y, num_clients, alpha=0.1, seed=3, min_size=2)
    x, y, parts = x.to(DEVICE), y.to(DEVICE), [p.to(DEVICE) for p in parts]

    def factory():
        return build_model(model, classes, shape).to(DEVICE, dtype)

    return Task("random", factory, x, y, parts, x[:8], y[:8], classes)


def client_starts(task: Task, num_clients: int) -> list[OrderedDict]:
    """A different start state per client (as FedMut's mutants), integer buffers included."""
    torch.manual_seed(0)
    base = task.model_factory().state_dict()
    starts = []
    for k in range(num_clients):
        g = torch_generator(0, "start", k)
        starts.append(OrderedDict(
            (n, t + 0.01 * torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
             if t.is_floating_point() else t + k)
            for n, t in base.items()))
    return starts


def max_difference(a, b) -> float:
    """Largest |loop - vmap| over every client and every layer."""
    return max(float((ra.state[n].double() - rb.state[n].double()).abs().max())
               for ra, rb in zip(a, b, strict=True) for n in ra.state)



def write_notebook(folder: Path, body: str = "pass") -> Path:
    """A tiny notebook with a parameters cell, like the reproduction notebooks."""
    params = new_code_cell('x = 1\nlr = 0.1\nfail = False\nextra = {}\nseeds = [0]\n'
                           'output_dir = None')
    params.metadata["tags"] = ["parameters"]
    book = new_notebook(cells=[params, new_code_cell(body)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                   "language": "python"}
    path = folder / "tiny.ipynb"
    nbformat.write(book, path)
    return path


def write_grid(tmp_path: Path, spec: dict, name: str = "grid.yaml") -> Path:
    """The grid spec as a YAML file."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def write_blocked_sweep(tmp_path: Path, body: str) -> tuple[Path, Path, Path]:
    """(grid, block file, output folder) of a three-cell sweep (x = 1, 2, 3) whose notebook
    ``body`` makes the cells x > 1 wait while the block file exists: the signal tests stop
    a sweep while two cells run and one has finished."""
    notebook = write_notebook(tmp_path, body)
    block = tmp_path / "block"
    block.write_text("")
    grid = write_grid(tmp_path, {"notebook": notebook.name,
                                 "fixed": {"extra": {"block": str(block)}},
                                 "grid": {"x": [1, 2, 3]}, "seeds": [0]})
    out = tmp_path / "out"
    (out / "cells").mkdir(parents=True)
    return grid, block, out


def assert_resumes(config, folder: Path, stop_after: int):
    """Resume equals uninterrupted: ``config`` run to its end in one go, and stopped after
    ``stop_after`` rounds then run again in the same folder (which resumes its checkpoint);
    the final models must be equal bit for bit. Returns (uninterrupted, resumed) Histories
    for the method's own checks (its metrics, its checkpointed state)."""
    assert 0 < stop_after < config.rounds
    full = run(config.replace(run_dir=str(folder / "full")), progress=False)
    part = folder / "part"
    run(config.replace(rounds=stop_after, run_dir=str(part)), progress=False)
    resumed = run(config.replace(run_dir=str(part)), progress=False)
    starts = json.loads((part / "run.json").read_text())["environment"]["starts"]
    assert [s["round"] for s in starts][-1] > 1, "the second run started over, not resumed"
    assert states_allclose(full.final_state, resumed.final_state, rtol=0, atol=0)
    return full, resumed


def _pixels(png: bytes):
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)


def ink_at_the_edge(png: bytes, frame: int = 2) -> int:
    """Dark pixels (a glyph, a line) in the outer ``frame`` pixels of a picture: a caption,
    label or tick cut off at the canvas's edge leaves some there; a figure whose every mark
    lies inside leaves none (its edge is background)."""
    import numpy as np

    a = _pixels(png)
    edge = np.concatenate([a[:frame].reshape(-1, 3), a[-frame:].reshape(-1, 3),
                           a[:, :frame].reshape(-1, 3), a[:, -frame:].reshape(-1, 3)])
    return int((edge.sum(-1) < 300).sum())


def red_pixels(png: bytes) -> int:
    """Pixels of a saturated red (matplotlib's "red" is 255, 0, 0): a filled red marker shows
    its face; a hollow one shows only its black edge."""
    a = _pixels(png)
    return int(((a[..., 0] > 200) & (a[..., 1] < 70) & (a[..., 2] < 70)).sum())


def assert_falls_back_to_loop(config, monkeypatch, *words: str) -> None:
    """``config`` under the vmap backend runs the loop: one warning for the process (a second
    run, of another seed, says nothing more) that names each of ``words``, and the same
    final state and losses as the loop backend, bit for bit."""
    import warnings

    from flnotes.engine.batched import stacked

    monkeypatch.setattr(stacked, "_NOTED", set())
    loop = run(config.replace(backend="loop"), progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vmapped = run(config.replace(backend="vmap"), progress=False)
        run(config.replace(backend="vmap", seed=config.seed + 1), progress=False)
    notes = [str(w.message) for w in caught if "loop backend" in str(w.message)]
    assert len(notes) == 1, notes
    assert all(word in notes[0] for word in words), notes[0]
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=0, atol=0)
    assert [r["train_loss"] for r in loop.rows] == [r["train_loss"] for r in vmapped.rows]


def fail_halfway(monkeypatch, module, point: int, code: int) -> None:
    """``module``'s point-th ``write_atomically`` fails with OSError(``code``) halfway through
    its file (a full disk, a folder made read-only), the others write as usual."""
    real, count = module.write_atomically, [0]

    def failing(path, write):
        count[0] += 1
        if count[0] != point:
            return real(path, write)

        def half(f):
            f.write(b"half a file")
            raise OSError(code, os.strerror(code))
        return real(path, half)

    monkeypatch.setattr(module, "write_atomically", failing)


# The browser test (tests/test_browser.py) drives HERE, tests/test_browser_b.py the rest: two
# files, so that make test's two workers run them side by side.
HERE = ["00_quickstart", "02_client_landscapes", "21_flatness"]
# Saved, reloaded and reopened on a fresh kernel: one notebook of each half, whose explorers
# hold every kind of control any teaching notebook shows (test_widgets.py keeps it so); what
# is checked there (JupyterLab saved the widget state, flnotes' extension keeps the copy
# unmarked) is the same machinery for every notebook. FLNOTES_BROWSER_THOROUGH=1: all.
REOPENED = ("02_client_landscapes", "03_mutation_regions")


def explorers_in(name: str) -> list[str]:
    """The explorers a teaching notebook shows (``widgets.<name>_explorer(`` in its cells)."""
    path = Path(__file__).resolve().parents[1] / "flnotes" / "notebooks" / f"{name}.ipynb"
    notebook = json.loads(path.read_text())
    return [found for cell in notebook["cells"] if cell["cell_type"] == "code"
            for found in re.findall(r"widgets\.(\w+_explorer)\(", "".join(cell["source"]))]
