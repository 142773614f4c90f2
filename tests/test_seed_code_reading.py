"""The seed-code reading of the baselines: each method aggregates as the seed authors' code
does (HMHelloWorld/FedMR and /FedMut: FedMut, FedQP and FedMR uniformly, the baselines by
client size), and the two routes to it, an ``*-official`` preset and ``baselines:
seed-code`` over the matching ``*-paper`` preset, give every method the same settings."""

from collections import OrderedDict

import pytest
import torch

from flnotes.algorithms import algorithm_names, build_strategy
from flnotes.algorithms.base import ClientResult
from flnotes.config import RunConfig
from flnotes.config.presets import preset_values, seed_code_baselines
from flnotes.config.runconfig import only_read
from flnotes.data.partition import dirichlet_partition
from flnotes.models import build_model
from flnotes.repro.grid import resolve_parameters
from flnotes.repro.paper_setting import baseline_reading

# Each *-official preset beside the *-paper preset of the same table and model.
ROUTES = [("fedmut-official", "fedmut-paper"), ("fedqp-official", "fedqp-paper"),
          ("fedmr-official", "fedmr-paper"), ("fedmr-official-resnet20", "fedmr-paper-resnet20"),
          ("fedmr-official-vgg16", "fedmr-paper-vgg16")]
# A tiny stand-in for the papers' task, so that strategies can be built and run here.
TINY = dict(dataset="synthetic", model="mlp", num_clients=8, clients_per_round=4,
            data_options={})


def by_grid(paper_preset: str, algorithm: str, **cell) -> RunConfig:
    """A grid cell's config: the paper preset, ``baselines: seed-code``, the cell's values."""
    params = resolve_parameters([{"preset": paper_preset, **cell}, {"baselines": "seed-code"}])
    values = {**params, **params.pop("extra", {}), "algorithm": algorithm}
    return RunConfig.from_dict(only_read(values, algorithm))


def method_reading(config: RunConfig) -> dict:
    resolved = config.resolved()
    return {"weighting": resolved.weighting, **resolved.settings_read()}


@pytest.mark.parametrize("official, paper", ROUTES)
def test_both_routes_give_every_method_the_same_settings_and_weights(official, paper):
    compared = 0
    # The paper's own method is not a baseline: its paper preset follows its paper (FedMR's
    # first stage counts one round less in the code, fedmr-official says why).
    for algorithm in set(algorithm_names()) - {preset_values(official)["algorithm"]}:
        try:
            preset = RunConfig.from_preset(official, algorithm=algorithm)
        except ValueError as refused:  # e.g. MimeLite brings its own momentum: both refuse
            with pytest.raises(ValueError, match=str(refused).split(":")[0].split("=")[0]):
                by_grid(paper, algorithm, momentum=preset_values(official)["momentum"])
            continue
        grid = by_grid(paper, algorithm)
        assert method_reading(preset) == method_reading(grid), algorithm
        compared += 1
    assert compared >= len(algorithm_names()) - 3


def test_the_seed_methods_average_uniformly_the_baselines_by_size():
    expected = {"fedmut": "uniform", "fedqp": "uniform", "fedmr": "uniform",
                "fedavg": "samples", "fedprox": "samples", "clusamp": "samples",
                "fedgen": "samples", "fedasam": "samples", "fedexp": "samples"}
    for official, paper in ROUTES:
        for algorithm, weighting in expected.items():
            assert RunConfig.from_preset(official, algorithm=algorithm).resolved().weighting \
                == weighting, (official, algorithm)
            assert by_grid(paper, algorithm).resolved().weighting == weighting


@pytest.mark.parametrize("preset, dataset, values", [
    # FedMR repository utils/model_config.py FedGenRUNCONFIGS: alpha, beta, ensemble_lr.
    ("fedmr-paper", "cifar10", (0.2, 0.2, 3e-4)),
    ("fedmr-paper-cifar100", "cifar100", (10.0, 1.0, 1e-4)),
    ("fedmr-paper-femnist", "femnist", (10.0, 10.0, 3e-4)),
    # The FedMut repository's Training_FedGen.py hard-codes 'cifar10'.
    ("fedmut-paper", "cifar100", (0.2, 0.2, 3e-4)),
])
def test_fedgen_takes_the_seed_codes_values_of_the_dataset_the_cell_runs(preset, dataset,
                                                                          values):
    config = by_grid(preset, "fedgen", dataset=dataset)
    assert (config.fedgen_alpha, config.fedgen_beta, config.fedgen_lr) == values
    assert baseline_reading(config.to_dict()).startswith("FedGen as the seed code ran it")


def test_official_presets_take_their_repositorys_fedgen_values():
    assert preset_values("fedmut-official-cifar100")["fedgen_alpha"] == 0.2  # hard-coded
    assert seed_code_baselines("cifar100", "FedMR")["fedgen_beta"] == 1.0
    with pytest.raises(ValueError, match="repository"):
        seed_code_baselines("cifar10", "Elsewhere")


# ---- the seed code's aggregation by hand ------------------------------------------------

def seed_code_aggregation(states: list[OrderedDict], lens: list[float]) -> OrderedDict:
    """models/Fed.py Aggregation(w, lens): sum_i lens_i w_i / sum_i lens_i, layer by layer."""
    total = sum(lens)
    return OrderedDict((k, sum(s[k].double() * n for s, n in zip(states, lens, strict=True))
                        / total) for k in states[0])


def round_of_results(global_state: OrderedDict, sizes: list[int]) -> list[ClientResult]:
    g = torch.Generator().manual_seed(3)
    return [ClientResult(i, OrderedDict((k, v + 0.1 * torch.randn(v.shape, generator=g))
                                        for k, v in global_state.items()), n, 0.0)
            for i, n in enumerate(sizes)]


def dirichlet_sizes(num_clients: int) -> list[int]:
    labels = torch.arange(600) % 10
    return [len(p) for p in dirichlet_partition(labels, num_clients, 0.1, seed=0)]


def both_routes(algorithm: str):
    yield RunConfig.from_preset("fedmr-official", algorithm=algorithm, **TINY)
    yield by_grid("fedmr-paper", algorithm, **TINY)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedgen", "fedasam"])
def test_baselines_aggregate_as_the_seed_codes_size_weighted_mean(algorithm):
    sizes = dirichlet_sizes(4)
    assert max(sizes) > 1.3 * min(sizes)  # unequal clients: uniform and by-size differ
    state = OrderedDict(build_model("mlp", 10, (1, 28, 28)).state_dict())
    for config in both_routes(algorithm):
        strategy = build_strategy(config.replace(fedgen_steps=2) if algorithm == "fedgen"
                                  else config, state)
        results = round_of_results(state, sizes)
        new = strategy.aggregate(1, results)
        hand = seed_code_aggregation([r.state for r in results], sizes)
        for k in hand:
            torch.testing.assert_close(new[k].double(), hand[k], rtol=1e-6, atol=1e-7)
        uniform = seed_code_aggregation([r.state for r in results], [1.0] * len(sizes))
        assert not torch.allclose(new["fc1.weight" if "fc1.weight" in new else k].double(),
                                  uniform["fc1.weight" if "fc1.weight" in new else k])


def test_fedexp_steps_as_the_seed_code_with_data_shares():
    """Training_FedExP.py l.31-36 and 56-83: p_i = n_i / n; grad_avg = sum p_i D_i / sum p_i;
    eta_g = max(1, 0.5 (sum p_i |D_i|^2 / sum p_i) / (|grad_avg|^2 + m 0.1)); the new iterate
    w + eta_g grad_avg."""
    sizes = dirichlet_sizes(4)
    g = torch.Generator().manual_seed(1)
    start = OrderedDict(w=torch.zeros(5))
    results = [ClientResult(i, OrderedDict(w=torch.randn(5, generator=g) * (i + 1)), n, 0.0)
               for i, n in enumerate(sizes)]
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    deltas = [r.state["w"].double() for r in results]
    grad_avg = sum(pi * d for pi, d in zip(p, deltas, strict=True)) / p.sum()
    spread = sum(pi * d.square().sum() for pi, d in zip(p, deltas, strict=True)) / p.sum()
    eta = max(1.0, float(0.5 * spread / (grad_avg.square().sum() + len(sizes) * 0.1)))
    assert eta > 1.0  # the extrapolation is exercised
    for config in both_routes("fedexp"):
        strategy = build_strategy(config, start)
        strategy.aggregate(1, results)
        assert strategy.round_metrics(None)["server_step"] == pytest.approx(eta, rel=1e-9)
        torch.testing.assert_close(strategy.iterate["w"].double(), eta * grad_avg,
                                   rtol=1e-6, atol=1e-7)


def test_clusamp_draws_by_data_share_and_averages_by_size_as_the_seed_code():
    """main_fed.py l.111-112 (importance n_i / n), l.146-160 (the drawn clients, a repeat
    twice, averaged by Aggregation(w_locals, lens)); clustering by L1 with the code's
    one-entry similarity update."""
    sizes = dirichlet_sizes(8)
    state = OrderedDict(build_model("mlp", 10, (1, 28, 28)).state_dict())
    for config in both_routes("clusamp"):
        assert (config.clusamp_distance, config.clusamp_aggregation,
                config.clusamp_similarity) == ("l1", "samples", "seed-code")
        strategy = build_strategy(config, state)
        chosen = strategy.select_clients(1, sizes, 4, torch.Generator().manual_seed(0))
        assert strategy.importance(sizes) == sizes  # p_i = n_i / n
        results = round_of_results(state, [sizes[c] for c in chosen])
        results = [ClientResult(c, r.state, r.num_samples, 0.0)
                   for c, r in zip(chosen, results, strict=True)]
        new = strategy.aggregate(1, results)
        lens = [sizes[c] for c in strategy.picks]  # every draw, repeats included
        states = {r.client: r.state for r in results}
        hand = seed_code_aggregation([states[c] for c in strategy.picks], lens)
        for k in hand:
            torch.testing.assert_close(new[k].double(), hand[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dataset", ["cifar100", "femnist"])
def test_an_official_preset_on_another_dataset_takes_that_datasets_values(dataset):
    """run --preset fedmr-official --dataset D: the seed code's values for D, as a grid cell
    of that preset and dataset gets them."""
    preset = RunConfig.from_preset("fedmr-official", dataset=dataset, algorithm="fedgen",
                                   data_options={})
    grid = by_grid("fedmr-official", "fedgen", dataset=dataset, data_options={})
    expected = seed_code_baselines(dataset, "FedMR")
    assert (preset.fedgen_alpha, preset.fedgen_beta) == (expected["fedgen_alpha"],
                                                         expected["fedgen_beta"])
    assert method_reading(preset) == method_reading(grid)
    # The caller's own value still wins.
    assert RunConfig.from_preset("fedmr-official", dataset=dataset, algorithm="fedgen",
                                 data_options={}, fedgen_alpha=1.0).fedgen_alpha == 1.0
