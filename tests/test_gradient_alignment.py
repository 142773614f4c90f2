"""FedUp Table 2's gradient alignment against closed-form gradients of least squares."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flnotes.config import RunConfig
from flnotes.engine.tasks import Task
from flnotes.engine.train import batch_schedule, client_generator
from flnotes.flatness.gradients import PAIRS, gradient_alignment


def least_squares_task() -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g, dtype=torch.float64)
    y = torch.randn(60, 1, generator=g, dtype=torch.float64)
    parts = [torch.arange(i * 20, i * 20 + 20) for i in range(3)]
    return Task("ls", lambda: nn.Linear(4, 1, bias=False).double(), x, y, parts, x[:5], y[:5],
                num_classes=1, loss_fn=F.mse_loss)


def cos(u, v):
    n = np.linalg.norm(u) * np.linalg.norm(v)
    return float(u @ v / n) if n > 0 else math.nan


def test_the_four_similarities_equal_a_closed_form_computation():
    task = least_squares_task()
    config = RunConfig(batch_size=5, lr=0.1, seed=3)
    w0 = np.array([[0.3, -0.2, 0.5, 0.1]])
    state = {"weight": torch.tensor(w0)}
    steps, clients = 6, [0, 1, 2]
    X, Y = task.train_x.numpy(), task.train_y.numpy()[:, 0]

    def gradient(w, rows):  # d/dw mean((x w - y)^2) = 2/n X^T (X w - y)
        xb, yb = X[rows], Y[rows]
        return 2 / len(rows) * xb.T @ (xb @ w - yb)

    batches = {c: list(batch_schedule(20, 2, 5, client_generator(config, 1, c), "cpu"))[:steps]
               for c in clients}
    rows = {c: [task.client_indices[c][b].numpy() for b in batches[c]] for c in clients}
    expected = {name: [] for name in PAIRS}
    for c in clients:
        w = w0[0].copy()
        values = {name: [] for name in PAIRS}
        for k in range(steps):
            a, b = gradient(w, rows[c][k]), gradient(w0[0], rows[c][k])
            cg = np.mean([gradient(w0[0], rows[j][k]) for j in clients], axis=0)
            for name, pair in PAIRS.items():
                values[name].append(cos(*pair(a, b, cg)))
            w = w - config.lr * a
        for name, v in values.items():
            expected[name].append(np.nanmean(v))
    got = gradient_alignment(task, config, state, clients, steps=steps)
    for name in PAIRS:
        assert got[name] == pytest.approx(float(np.mean(expected[name])), abs=1e-9), name
    # Step 0 has A = B: (A - B, C) is undefined there and left out, not counted as 0.
    assert not math.isnan(got["A - B and C (only -B)"])


def test_with_one_client_mime_changes_nothing():
    """One client: C is its own gradient at X^t, i.e. B, so A - B + C = A."""
    task = least_squares_task()
    config = RunConfig(batch_size=5, lr=0.1, seed=3)
    state = {"weight": torch.tensor([[0.3, -0.2, 0.5, 0.1]], dtype=torch.float64)}
    for client in range(3):
        one = gradient_alignment(task, config, state, [client], steps=5)
        assert one["A - B + C and C (Mime's correction)"] == pytest.approx(
            one["A and C (not correcting A)"], abs=1e-12)
        assert one["A and B (not correcting A)"] == pytest.approx(
            one["A and C (not correcting A)"], abs=1e-12)
        assert all(-1 <= v <= 1 for v in one.values())


def test_alignment_table_runs_a_config_beside_the_paper():
    from flnotes.flatness.gradients import FEDUP_TABLE2, alignment_table

    config = RunConfig(dataset="synthetic", model="mlp", num_clients=6, clients_per_round=3,
                       data_options={"num_train": 300, "num_test": 60}, batch_size=20, seed=1)
    table = alignment_table(config, steps=4)
    assert list(table.index) == list(PAIRS) == list(FEDUP_TABLE2)
    assert table["ours"].between(-1, 1).all()
    assert table.loc["A and B (not correcting A)", "paper FEMNIST"] == 0.7514
