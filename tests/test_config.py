"""RunConfig validation: each bad value raises ValueError naming field, value and rule."""

import json

import pytest

from flnotes.config import RunConfig, config_field_names, field_names
from flnotes.config.presets import preset_names


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
        # A run records the common fields and the settings its own method reads.
        assert set(config.to_dict()) == set(config_field_names(config.algorithm))
    with pytest.raises(ValueError, match="unknown preset"):
        RunConfig.from_preset("no-such-preset")


@pytest.mark.parametrize("changes, words", [
    ({"lr": float("nan")}, ["lr", "nan", "finite"]),
    ({"lr": float("inf")}, ["lr", "inf"]),
    ({"mu": float("nan")}, ["mu", "nan"]),
    ({"momentum": float("nan")}, ["momentum"]),
    ({"algorithm": "fedmutt"}, ["did you mean 'fedmut'"]),
    ({"data_options": {"num_trian": 100}}, ["data_options", "did you mean 'num_train'"]),
    ({"dataset": "shakespeare", "data_options": {"seq_len": -5}}, ["seq_len", "-5", ">= 1"]),
])
def test_non_finite_numbers_and_typos_are_refused(changes, words):
    with pytest.raises(ValueError) as err:
        RunConfig(**changes)
    for word in words:
        assert word in str(err.value), f"{word!r} missing from: {err.value}"


def test_cuda_without_a_gpu_is_refused_when_run_not_when_loaded(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = RunConfig(device="cuda")  # a GPU run's config still loads on a CPU machine
    with pytest.raises(ValueError, match=r"is_available\(\) is False; use --device cpu or auto"):
        config.check_device()
    RunConfig(device="cpu").check_device()
    RunConfig(device="auto").check_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="1 CUDA device"):
        RunConfig(device="cuda:3").check_device()


def test_preset_typo_suggests_the_closest_names():
    with pytest.raises(ValueError, match="did you mean 'fedmut-paper'"):
        RunConfig.from_preset("fedmut-papr")


def test_every_field_has_a_help_line():
    from flnotes.cli.field_help import FIELD_HELP

    assert set(FIELD_HELP) == set(field_names())
    assert all(text and "\n" not in text for text in FIELD_HELP.values())


def test_paths_and_numpy_values_are_taken_and_wrong_types_refused_in_one_line():
    """a pathlib.Path is the path it names, numpy numbers the numbers they hold
    (data options included); a wrong type is a one-line ValueError, never an AttributeError."""
    from pathlib import Path

    import numpy as np

    config = RunConfig(run_dir=Path("/tmp/somewhere"), data_dir=Path("/tmp/data"),
                       data_options={"num_train": np.int64(100)}, seed=np.int64(2))
    assert config.run_dir == "/tmp/somewhere" and config.data_dir == "/tmp/data"
    assert type(config.data_options["num_train"]) is int and type(config.seed) is int
    assert json.loads(config.to_json())["run_dir"] == "/tmp/somewhere"
    for changes in ({"run_dir": 123}, {"data_dir": 123}, {"partition_manifest": 123},
                    {"algorithm": "fml", "personal_models": ["mlp"]}, {"record_states": "no"},
                    {"download": "yes"}, {"dataset": None}, {"algorithm": 3}):
        with pytest.raises(ValueError) as err:
            RunConfig(**changes)
        named = [k for k in changes if k != "algorithm"] or ["algorithm"]
        assert "\n" not in str(err.value) and named[0] in str(err.value)
