"""FedCross against hand computations: each selection strategy's collaborators and the
cross-aggregation on hand-made uploads, alpha = 1 as independent training, the global model
as the middleware models' mean, resume, and the one-line errors for bad settings."""

import math
from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedcross import FedCross, collaborators, cosine_matrix
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose, weighted_mean

# Four uploads whose weight vectors point at these angles (degrees), with distinct lengths:
# the cosine of two of them is the cosine of the angle between them.
ANGLES = (0.0, 30.0, 100.0, 210.0)


def uploads():
    """Hand-made uploads: a 2-vector at ANGLES, a bias, BatchNorm statistics (large, and left
    out of the similarity) and an integer buffer that differs per model."""
    states = []
    for k, degrees in enumerate(ANGLES):
        rad = math.radians(degrees)
        length = 1.0 + k
        states.append(OrderedDict(
            w=torch.tensor([length * math.cos(rad), length * math.sin(rad)]),
            b=torch.tensor(0.0),
            # Included in the similarity, these would make every pair's cosine about 1 and
            # rank the pairs by them instead.
            **{"bn.running_mean": torch.tensor([1000.0 + 7 * k * k, 1000.0 - 5 * k]),
               "bn.num_batches_tracked": torch.tensor(10 + k)}))
    return states


def angle_between(i, j):
    diff = abs(ANGLES[i] - ANGLES[j]) % 360
    return min(diff, 360 - diff)


# By hand from ANGLES: the smallest and the largest angle to each of the others.
HIGHEST = [1, 0, 1, 2]  # 30, 30, 70 and 110 degrees
LOWEST = [3, 3, 3, 1]  # 150, 180, 110 and 180 degrees
# In order: offset ((r - 1) mod (K - 1)) + 1 for round r, K = 4.
IN_ORDER = {1: [1, 2, 3, 0], 2: [2, 3, 0, 1], 3: [3, 0, 1, 2], 4: [1, 2, 3, 0]}


def strategy(selection="lowest-similarity", alpha=0.99, **changes):
    config = RunConfig(algorithm="fedcross", num_clients=6, clients_per_round=4,
                       cross_selection=selection, cross_alpha=alpha, **changes)
    init = OrderedDict((n, torch.zeros_like(t)) for n, t in uploads()[0].items())
    return FedCross(config, init)


def results(states):
    return [ClientResult(c, s, 10 * (c + 1), 0.0) for c, s in enumerate(states)]


def test_the_similarity_is_the_cosine_of_the_weights():
    sim = cosine_matrix(uploads())
    for i in range(4):
        for j in range(4):
            expected = math.cos(math.radians(angle_between(i, j)))
            assert float(sim[i, j]) == pytest.approx(expected, abs=1e-6)  # float32 weights


@pytest.mark.parametrize("selection,expected", [("highest-similarity", HIGHEST),
                                                ("lowest-similarity", LOWEST)])
def test_similarity_selection_picks_the_hand_computed_collaborator(selection, expected):
    assert collaborators(cosine_matrix(uploads()), selection, round=5) == expected


def test_in_order_selection_rotates_through_the_others():
    sim = cosine_matrix(uploads())
    for rnd, expected in IN_ORDER.items():
        assert collaborators(sim, "in-order", rnd) == expected
    # Over K - 1 rounds every model meets every other one once.
    met = {i: {collaborators(sim, "in-order", r)[i] for r in (1, 2, 3)} for i in range(4)}
    assert all(met[i] == set(range(4)) - {i} for i in range(4))


@pytest.mark.parametrize("selection,expected", [
    ("in-order", IN_ORDER[2]), ("highest-similarity", HIGHEST), ("lowest-similarity", LOWEST)])
def test_one_rounds_cross_aggregation_by_hand(selection, expected):
    alpha = 0.9
    fedcross = strategy(selection, alpha)
    local = uploads()
    fedcross.aggregate(2, results(local))
    middleware = fedcross.dispatch(3, [0, 2, 4, 5])
    assert len(middleware) == 4
    for i, model in enumerate(middleware):
        co = local[expected[i]]
        for name in ("w", "b", "bn.running_mean"):
            hand = alpha * local[i][name].double() + (1 - alpha) * co[name].double()
            assert torch.allclose(model[name].double(), hand, rtol=1e-6, atol=1e-6), (i, name)
        # The integer buffer is the model's own client's.
        assert torch.equal(model["bn.num_batches_tracked"], local[i]["bn.num_batches_tracked"])
    # The global model: the uniform mean of the middleware models, by hand.
    for name in ("w", "b", "bn.running_mean"):
        hand = sum(alpha * local[i][name].double() + (1 - alpha) * local[expected[i]][name]
                   .double() for i in range(4)) / 4
        assert torch.allclose(fedcross.global_state[name].double(), hand, rtol=1e-6, atol=1e-6)


def test_alpha_one_keeps_each_clients_own_model():
    fedcross = strategy("lowest-similarity", alpha=1.0)
    local = uploads()
    fedcross.aggregate(1, results(local))
    for model, own in zip(fedcross.dispatch(2, [0, 1, 2, 3]), local, strict=True):
        assert states_allclose(model, own, rtol=0, atol=0)


def test_alpha_one_run_trains_each_model_on_its_own(tiny_config):
    config = tiny_config.replace(algorithm="fedcross", cross_alpha=1.0, rounds=3,
                                 record_states=True)
    steps = run(config, progress=False).trajectory
    for prev, step in zip(steps, steps[1:], strict=False):
        for dispatched, own in zip(step["dispatched"], prev["local"], strict=True):
            assert states_allclose(dispatched, own, rtol=0, atol=0)
    # With the default alpha the dispatched models are not the uploads.
    fused = run(config.replace(cross_alpha=0.99), progress=False).trajectory
    assert not states_allclose(fused[1]["dispatched"][0], fused[0]["local"][0], 0, 0)


@pytest.mark.parametrize("selection", ["in-order", "lowest-similarity"])
def test_the_global_model_is_the_mean_of_the_middleware_models(tiny_config, selection):
    config = tiny_config.replace(algorithm="fedcross", cross_selection=selection, rounds=3,
                                 record_states=True)
    history = run(config, progress=False)
    steps = history.trajectory
    # Round 1 dispatches the initial model to every client.
    assert all(states_allclose(d, steps[0]["dispatched"][0], 0, 0)
               for d in steps[0]["dispatched"])
    # The next round dispatches the middleware models; the global is their uniform mean.
    for step, after in zip(steps, steps[1:], strict=False):
        k = len(after["dispatched"])
        assert states_allclose(step["global"], weighted_mean(after["dispatched"], [1.0] * k),
                               rtol=0, atol=0)
        assert not any(states_allclose(d, step["global"]) for d in after["dispatched"])
    assert states_allclose(history.final_state, steps[-1]["global"], rtol=0, atol=0)
    assert all(0 < row["model_similarity"] <= 1 for row in history.rows)


def test_resume_equals_an_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedcross", rounds=4, checkpoint_every=1)
    full, resumed = assert_resumes(config, tmp_path, stop_after=2)
    assert full.metric("accuracy") == resumed.metric("accuracy")


def test_checkpoint_holds_the_middleware_models(tmp_path):
    fedcross = strategy("in-order")
    fedcross.aggregate(1, results(uploads()))
    torch.save(fedcross.state_dict(), tmp_path / "s.pt")
    restored = strategy("in-order")
    restored.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    for a, b in zip(fedcross.dispatch(2, [0, 1, 2, 3]), restored.dispatch(2, [0, 1, 2, 3]),
                    strict=True):
        assert states_allclose(a, b, rtol=0, atol=0)
    assert restored.similarity == fedcross.similarity


def test_clients_per_round_must_stay_fixed():
    fedcross = strategy()
    fedcross.aggregate(1, results(uploads()))
    with pytest.raises(ValueError, match="clients_per_round must stay fixed"):
        fedcross.dispatch(2, [0, 1, 2])


def test_runs_on_the_toy():
    config = toy.toy_config("fedcross", rounds=3, num_clients=3, clients_per_round=2)
    history = run(config, progress=False)
    assert history.status == "completed" and len(history.rows) == 3


@pytest.mark.parametrize("field,value", [("cross_alpha", 1.5), ("cross_alpha", -0.1),
                                         ("cross_selection", "random")])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field) as error:
        RunConfig(algorithm="fedcross", **{field: value})
    assert "\n" not in str(error.value)


def test_sample_weighting_weights_each_middleware_model_by_its_client():
    fedcross = strategy("in-order", alpha=0.9, weighting="samples")
    local = uploads()
    fedcross.aggregate(1, results(local))  # clients 0..3 hold 10, 20, 30, 40 samples
    middleware = fedcross.dispatch(2, [0, 1, 2, 3])
    hand = sum(10 * (i + 1) * middleware[i]["w"].double() for i in range(4)) / 100
    assert torch.allclose(fedcross.global_state["w"].double(), hand, rtol=1e-6, atol=1e-7)
    uniform = sum(m["w"].double() for m in middleware) / 4
    assert not torch.allclose(hand, uniform)


def test_one_client_a_round_keeps_its_own_model():
    g = torch.Generator().manual_seed(0)
    one = [OrderedDict(w=torch.randn(200, generator=g), n=torch.tensor(3))]
    assert collaborators(cosine_matrix(one), "lowest-similarity", 1) == [0]
    assert collaborators(cosine_matrix(one), "in-order", 1) == [0]
    config = RunConfig(algorithm="fedcross", num_clients=2, clients_per_round=1)
    fedcross = FedCross(config, one[0])
    fedcross.aggregate(1, results(one))
    assert states_allclose(fedcross.dispatch(2, [1])[0], one[0], rtol=0, atol=0)
    assert math.isnan(fedcross.similarity)


def test_runs_from_the_command_line_and_the_preset_builds(tmp_path, capsys):
    from flnotes.cli.main import main

    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "fedcross", "--dataset", "toy", "--cross-alpha", "0.9",
                 "--cross-selection", "in-order", "--rounds", "2", "--num-clients", "3",
                 "--clients-per-round", "2", "--device", "cpu", "--run-dir",
                 str(folder)]) == 0
    assert (folder / "metrics.jsonl").exists()
    capsys.readouterr()
    config = RunConfig.from_preset("fedcross-paper")
    assert (config.algorithm, config.cross_alpha, config.cross_selection) == (
        "fedcross", 0.99, "lowest-similarity")
