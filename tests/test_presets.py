"""Paper presets: valid configs, documented sources, and the values the papers state."""

import re

import pytest
import torch

from flnotes.algorithms import algorithm_names
from flnotes.config import RunConfig, field_names
from flnotes.config.presets import describe, preset_names, preset_values
from flnotes.data.registry import composition_problem, dataset_names
from flnotes.models import build_model

# (input shape, number of classes) of each dataset a preset uses, so the preset's model can
# be built without the data.
SHAPES = {"cifar10": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100),
          "femnist": ((1, 28, 28), 62), "fashion-mnist": ((1, 28, 28), 10),
          "mnist": ((1, 28, 28), 10), "synthetic": ((1, 28, 28), 10),
          "shakespeare": ((80,), 80)}
PAPER_PRESETS = ["fedmut-paper", "fedmut-paper-resnet18", "fedmut-official",
                 "fedmut-official-cifar100", "fedqp-paper", "fedmr-paper",
                 "fedmr-paper-resnet20", "fml-paper", "fedup-paper", "fedup-paper-cifar100",
                 "fedup-paper-femnist"]


def test_required_presets_exist():
    assert set(PAPER_PRESETS + ["demo"]) <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_preset_builds_a_valid_config(name):
    values = preset_values(name)
    assert set(values) <= set(field_names()), f"{name} sets unknown fields"
    if values.get("algorithm", "fedavg") not in algorithm_names():
        pytest.skip(f"{name}: algorithm {values['algorithm']!r} is not registered yet")
    dataset = values.get("dataset", "synthetic")
    composed = "+" in dataset and composition_problem(dataset) is None  # "cifar10+cifar100"
    if dataset not in dataset_names() and not composed:
        pytest.skip(f"{name}: dataset {values['dataset']!r} has no loader yet")
    config = RunConfig.from_preset(name).resolved()
    assert config.clients_per_round <= config.num_clients
    # The model must fit the dataset: build it for the dataset's shape and run two inputs.
    # A composed dataset ("cifar10+cifar100"): the shared model has every task's classes,
    # each personal model (client i: entry i mod n) its own task's (client i: task i mod T).
    tasks = config.dataset.split("+")
    shape = SHAPES[tasks[0]][0]
    task_classes = [20 if config.data_options.get("coarse") else SHAPES[t][1] for t in tasks]
    assert all(SHAPES[t][0] == shape for t in tasks)
    builds = [(config.model, sum(task_classes))]
    if config.personal_models:
        names = config.personal_models.split(",")
        builds += [(names[i % len(names)], task_classes[i % len(tasks)])
                   for i in range(config.num_clients)]
    inputs = torch.zeros(2, *shape, dtype=torch.long if len(shape) == 1 else torch.float)
    for name, classes in builds:
        model = build_model(name, classes, shape)
        model.eval()
        with torch.no_grad():
            assert model(inputs).shape == (2, classes)


@pytest.mark.parametrize("name", preset_names())
def test_preset_docstring_cites_a_source(name):
    doc = describe(name)
    assert len(doc) > 40
    pattern = r"paper|official code|Table|Section|Alg\.|github\.com|from no\s+paper"
    assert re.search(pattern, doc), f"{name}'s docstring names no source"


def test_overrides_apply_and_presets_are_fresh_copies():
    config = RunConfig.from_preset("fedmut-paper", algorithm="fedprox", rounds=3)
    assert config.algorithm == "fedprox" and config.rounds == 3 and config.mu == 0.01
    first = preset_values("fedmut-official-cifar100")
    first["data_options"]["coarse"] = False
    assert preset_values("fedmut-official-cifar100")["data_options"]["coarse"] is True


def values(name, *fields):
    v = preset_values(name)
    return tuple(v[f] for f in fields)


COMMON = ("lr", "momentum", "batch_size", "local_epochs")


def test_fedmut_paper_values():
    # FedMut (AAAI 2024), "Settings": SGD lr 0.01, momentum 0.9, batch 50, 5 local epochs.
    assert values("fedmut-paper", *COMMON) == (0.01, 0.9, 50, 5)
    # "Comparison of Accuracy": alpha = 4.0; beta0 = 0.3 (CNN, VGG-16), 0.5 (ResNet-18).
    assert values("fedmut-paper", "algorithm", "alpha", "beta0") == ("fedmut", 4.0, 0.3)
    assert values("fedmut-paper-resnet18", "model", "beta0") == ("resnet18", 0.5)
    # "Baselines": FedProx mu = 0.01.
    assert preset_values("fedmut-paper")["mu"] == 0.01


def test_fedmut_official_values():
    # Official code (utils/options.py): momentum 0.5, T_b 50; CNNCifar; FedMut's uniform
    # Aggregation(w_locals, None) is its own default, so the preset sets no weighting (which
    # would reach every baseline: the code weights those by size).
    v = preset_values("fedmut-official")
    assert (v["momentum"], v["beta_rounds"], v["model"], "weighting" in v) == (
        0.5, 50, "lenet-cifar", False)
    assert RunConfig.from_preset("fedmut-official").resolved().weighting == "uniform"
    # utils/get_dataset.py scales inputs its own way: Normalize((0.5,)*3, (0.5,)*3) on CIFAR-10.
    assert v["data_options"] == {"normalize": "fedmut-code"}
    assert preset_values("fedmut-official-cifar100")["data_options"] == {
        "coarse": True, "normalize": "fedmut-code"}
    for name in ("fedmut-paper", "fedqp-paper", "fedmr-paper", "fml-paper", "fedup-paper"):
        assert preset_values(name).get("data_options", {}).get("normalize", "dataset") == (
            "dataset") and "normalize=\"dataset\"" in describe(name)


def test_fedqp_paper_values():
    # FedQP (SEKE 2024) IV-A: lr 0.01, momentum 0.5, batch 50, 5 epochs, 100 devices, 10%.
    assert values("fedqp-paper", *COMMON) == (0.01, 0.5, 50, 5)
    assert values("fedqp-paper", "algorithm", "num_clients", "clients_per_round") == (
        "fedqp", 100, 10)


def test_fedmr_paper_values():
    # FedMR (KDD 2024) 5.1: lr 0.01, momentum 0.9, batch 50, 5 epochs, 100 clients, 10%;
    # CNN recombined from the start, ResNet-20 after 100 rounds of FedAvg.
    assert values("fedmr-paper", *COMMON) == (0.01, 0.9, 50, 5)
    assert values("fedmr-paper", "num_clients", "clients_per_round", "stage1_rounds") == (
        100, 10, 0)
    assert values("fedmr-paper-resnet20", "model", "stage1_rounds") == ("resnet20", 100)


def test_fml_paper_values():
    # FML (FITEE 2023): K = 5 clients, all of them every round (Alg. 1), shards, 1/K merge.
    v = preset_values("fml-paper")
    assert (v["algorithm"], v["num_clients"], v["clients_per_round"]) == ("fml", 5, 5)
    assert (v["partition"], v["weighting"]) == ("shards", "uniform")
    assert v["client_test_fraction"] > 0  # personal accuracy needs held-out data


def test_fml_fig6_values():
    # FML Fig. 6: LeNet5 on CIFAR-10, CNN1 on CIFAR-100, the first 250 rounds; the rest is
    # fml-paper's (the letter's K = 5 aside: one client per task here, said in the docstring).
    v = preset_values("fml-fig6")
    assert (v["algorithm"], v["dataset"], v["rounds"]) == ("fml", "cifar10+cifar100", 250)
    config = RunConfig.from_preset("fml-fig6")
    names = config.personal_models.split(",")
    # client i holds task i mod 2 and personal model i mod 2: CIFAR-10 clients get LeNet5
    assert [names[i % len(names)] for i in range(config.num_clients)] == ["lenet-cifar", "cnn"]
    paper = preset_values("fml-paper")
    for name in COMMON + ("weight_decay", "personal_weight", "meme_weight",
                          "client_test_fraction", "weighting"):
        assert v[name] == paper[name]
    assert v["clients_per_round"] == v["num_clients"]  # Alg. 1 l.2: every client each round
    assert "normalize=\"dataset\"" in describe("fml-fig6")


def test_fedup_paper_values():
    # FedUp (Sci Sin Inform 2024) 6.1.3 and Table 4: 100 clients, 10% sampling, 1 epoch;
    # CIFAR-10: lr 0.2, batch 32, 1500 rounds; CIFAR-100: lr 0.2, batch 16, 1000 rounds;
    # FEMNIST: 3400 clients, lr 0.02, batch 20, 1000 rounds. ResNet18 with GroupNorm.
    fields = ("lr", "batch_size", "local_epochs", "rounds", "num_clients", "clients_per_round")
    assert values("fedup-paper", *fields) == (0.2, 32, 1, 1500, 100, 10)
    assert values("fedup-paper-cifar100", *fields) == (0.2, 16, 1, 1000, 100, 10)
    assert values("fedup-paper-femnist", *fields) == (0.02, 20, 1, 1000, 3400, 340)
    assert preset_values("fedup-paper")["model"] == "resnet18-gn"
    assert preset_values("fedup-paper-femnist")["model"] == "femnist-cnn"
    # eq. 3 (FedAvg) and Alg. 1 l.9 (FedUp) both aggregate with the uniform mean
    assert {preset_values(n).get("weighting") for n in
            ("fedup-paper", "fedup-paper-cifar100", "fedup-paper-femnist")} == {"uniform"}


def test_the_presets_issue_15_found_missing():
    # FedMut "Comparison of Accuracy": beta0 = 0.3 for VGG-16 (as for the CNN); FedQP: FedMut's.
    for name in ("fedmut-paper-vgg16", "fedqp-paper-vgg16"):
        assert values(name, "model", "beta0") == ("vgg16", 0.3)
    for name in preset_names():  # each VGG-16 preset says which head it is, once
        assert describe(name).count("4096-wide") == (preset_values(name).get("model") == "vgg16")
    assert values("fedqp-paper-vgg16", *COMMON) == values("fedqp-paper", *COMMON)
    # FedMR Sec. 5.1: FedProx mu 0.001 on CIFAR-100, 0.1 on FEMNIST; 180 FEMNIST clients with
    # more than 100 samples each.
    assert values("fedmr-paper-cifar100", "dataset", "mu", "num_clients") == ("cifar100", 0.001,
                                                                              100)
    femnist = preset_values("fedmr-paper-femnist")
    assert (femnist["dataset"], femnist["partition"], femnist["num_clients"], femnist["mu"]) == (
        "femnist", "natural", 180, 0.1)
    assert femnist["data_options"] == {"max_writers": 180, "min_samples": 101}
    RunConfig.from_preset("fedmr-paper-femnist")  # its data options are the loader's


def test_fedup_figure_presets():
    # Sec. 6.3 / Fig. 2: 500 and 1020 of FEMNIST's 3400 clients per round.
    for name, k in (("fedup-paper-femnist-500", 500), ("fedup-paper-femnist-1020", 1020)):
        assert values(name, "dataset", "num_clients", "clients_per_round") == ("femnist", 3400, k)
        assert values(name, "lr", "batch_size") == values("fedup-paper-femnist", "lr",
                                                          "batch_size")
    # Sec. 6.4 / Fig. 3: each role a client, a 2-layer LSTM with 100 hidden units.
    assert values("fedup-paper-shakespeare", "dataset", "model", "partition") == (
        "shakespeare", "lstm-100", "natural")



def test_every_paper_preset_says_how_it_scales_inputs():
    """each paper preset's docstring names the normalize rule it runs with (only
    the official-code presets leave the default), or says its data have no such option."""
    from flnotes.data.options import loader_options

    checked = 0
    for name in preset_names():
        if name == "demo":  # the synthetic smoke task: no paper, no pixels to scale
            continue
        v, doc = preset_values(name), " ".join(describe(name).split())
        tasks = v.get("dataset", "synthetic").split("+")
        if any("normalize" in loader_options(t) for t in tasks):
            rule = (v.get("data_options") or {}).get("normalize", "dataset")
            assert f'normalize="{rule}"' in doc, f"{name} does not say normalize={rule!r}"
            assert rule == ("fedmut-code" if "-official" in name else "dataset"), name
        else:  # FEMNIST (LEAF's [0, 1] pixels), Shakespeare (character ids)
            assert "no normalize option" in doc, f"{name} does not say how inputs are scaled"
        checked += 1
    assert checked >= 20


def _presets_named(node) -> set[str]:
    """Every value of a 'preset' key anywhere in a loaded YAML grid."""
    if isinstance(node, dict):
        found = {node["preset"]} if isinstance(node.get("preset"), str) else set()
        return found.union(*(_presets_named(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_presets_named(v) for v in node))
    return set()


def test_every_preset_a_sweep_grid_names_exists():
    """no grid (sweeps/ or benchmarks/, paper and smoke variants) names a preset
    that is not registered; the presets added for the grids are the ones they run."""
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parent.parent
    grids = sorted((repo / "sweeps").glob("*.yaml")) + sorted((repo / "benchmarks").glob("*.yaml"))
    named = {path.name: _presets_named(yaml.safe_load(path.read_text())) for path in grids}
    known = set(preset_names())
    missing = {f: sorted(n - known) for f, n in named.items() if n - known}
    assert not missing, f"grids name presets that do not exist: {missing}"
    assert named["fedmut_table1.yaml"] >= {"fedmut-paper-vgg16"}
    assert named["fedqp_tableI.yaml"] >= {"fedqp-paper-vgg16"}
    assert named["fedmr_table1.yaml"] >= {"fedmr-paper-femnist", "fedmr-paper-cifar100"}
    assert named["fedup_figures.yaml"] == {"fedup-paper-femnist-500", "fedup-paper-femnist-1020",
                                           "fedup-paper-shakespeare"}
    # the helper finds a preset however deep it sits
    assert _presets_named({"a": [{"b": {"preset": "x"}}], "preset": "y"}) == {"x", "y"}
