"""RunConfig validation: each bad value raises ValueError naming field, value and rule."""

import pytest

from flnotes.config import RunConfig, field_names
from flnotes.presets import preset_names


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"algorithm": "fedfoo"}, ["algorithm", "fedfoo", "fedavg", "fedprox"]),
        ({"dataset": "imagenet"}, ["dataset", "imagenet", "synthetic"]),
        ({"model": "gpt"}, ["model", "gpt", "resnet18"]),
        ({"partition": "zipf"}, ["partition", "zipf", "dirichlet"]),
        ({"num_clients": 5, "clients_per_round": 6}, ["clients_per_round", "6", "num_clients"]),
        ({"lr": 0.0}, ["lr", "positive"]),
        ({"lr": -1.0}, ["lr", "-1.0"]),
        ({"alpha": -0.5}, ["alpha", "-0.5", "non-negative"]),
        ({"mu": -1.0}, ["mu"]),
        ({"rounds": 0}, ["rounds", "positive integer"]),
        ({"batch_size": 2.5}, ["batch_size"]),
        ({"momentum": 1.0}, ["momentum", "[0, 1)"]),
        ({"beta0": 1.5}, ["beta0", "[0, 1]"]),
        ({"qp_prob": -0.1}, ["qp_prob"]),
        ({"dirichlet_alpha": 0}, ["dirichlet_alpha"]),
        ({"backend": "jax"}, ["backend", "loop", "vmap"]),
        ({"weighting": "median"}, ["weighting", "samples", "uniform"]),
        ({"mutation": "cauchy"}, ["mutation", "sign", "gaussian"]),
        ({"device": "tpu:banana"}, ["device"]),
        ({"client_test_fraction": 1.0}, ["client_test_fraction"]),
        ({"seed": -3}, ["seed", "non-negative"]),
    ],
)
def test_bad_values_raise_helpful_errors(changes, words):
    with pytest.raises(ValueError) as err:
        RunConfig(**changes)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"


def test_defaults_valid_and_resolution_fills_nones():
    config = RunConfig()
    resolved = config.resolved()
    assert config.model is None and resolved.model == "mlp"
    assert resolved.weighting == "samples"
    assert RunConfig(dataset="synthetic", model="lenet5").resolved().model == "lenet5"


def test_from_dict_rejects_unknown_fields_and_round_trips():
    config = RunConfig(algorithm="fedprox", mu=0.1, rounds=3)
    assert RunConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="clients_per_rnd"):
        RunConfig.from_dict({"clients_per_rnd": 3})


def test_config_is_frozen():
    config = RunConfig()
    with pytest.raises(AttributeError):
        config.lr = 0.1  # type: ignore[misc]


def test_presets_build_valid_configs():
    assert "demo" in preset_names()
    for name in preset_names():
        config = RunConfig.from_preset(name)
        assert set(config.to_dict()) == set(field_names())
    with pytest.raises(ValueError, match="unknown preset"):
        RunConfig.from_preset("no-such-preset")
