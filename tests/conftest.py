"""Shared fixtures: a tiny synthetic federation that trains in a fraction of a second."""

import pytest

from flnotes.config import RunConfig


@pytest.fixture
def tiny_config() -> RunConfig:
    """Six clients on a small synthetic task with an MLP."""
    return RunConfig(
        dataset="synthetic", model="mlp", num_clients=6, clients_per_round=3, rounds=3,
        local_epochs=1, batch_size=32, lr=0.05, momentum=0.5, seed=1,
        data_options={"num_train": 600, "num_test": 200}, device="cpu",
    )
