"""The app's own model and data: nothing here knows flnotes.

A small MLP with BatchNorm on a synthetic 4-class problem in 8 dimensions: class c's points
are Gaussian around a fixed centre. Each partition draws its labels mostly from one class
(label skew, the non-IID setting FedMut is about), from a seed and its partition-id alone,
so every node builds its own data without downloading anything.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES, CLASSES = 8, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                    nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _points(labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    return centres[labels] + 1.5 * torch.randn(len(labels), FEATURES, generator=generator)


def load_data(partition_id: int, num_partitions: int, size: int = 120, seed: int = 0):
    """(x, y) of one partition: 70% of its labels are class partition_id mod 4."""
    g = torch.Generator().manual_seed(1000 * seed + partition_id + 1)
    main = torch.full((size,), partition_id % CLASSES)
    other = torch.randint(CLASSES, (size,), generator=g)
    labels = torch.where(torch.rand(size, generator=g) < 0.7, main, other)
    return _points(labels, g), labels


def load_test_data(size: int = 400, seed: int = 0):
    """A balanced held-out set for the server's evaluation."""
    g = torch.Generator().manual_seed(1000 * seed)
    labels = torch.arange(size) % CLASSES
    return _points(labels, g), labels


def train(model: nn.Module, x, y, epochs: int, batch_size: int, lr: float,
          generator: torch.Generator) -> float:
    """Local SGD; the mean training loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    model.train()
    losses = []
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            if len(batch) < 2:  # BatchNorm needs two rows
                continue
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return sum(losses) / max(len(losses), 1)


@torch.no_grad()
def test(model: nn.Module, x, y) -> tuple[float, float]:
    """(loss, accuracy)."""
    model.eval()
    out = model(x)
    return float(nn.functional.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())
