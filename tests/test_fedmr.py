"""FedMR against its invariants: recombination is a per-layer permutation, stage 1 is FedAvg."""

import itertools
from collections import OrderedDict

import pytest
import torch

from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedmr import FedMR, layer_segments, recombine
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose, weighted_mean
from flnotes.rng import torch_generator


def random_states(num_models, shapes, seed=0, with_counter=True):
    """K states with distinct random float layers (and an integer buffer that differs)."""
    g = torch_generator(seed, "test-states")
    states = []
    for k in range(num_models):
        state = OrderedDict(
            (f"layer{j}", torch.randn(shape, generator=g)) for j, shape in enumerate(shapes)
        )
        if with_counter:
            state["bn.num_batches_tracked"] = torch.tensor(100 + k)
        states.append(state)
    return states


def strategy_with_locals(states, **config_changes):
    """A FedMR strategy that has just aggregated ``states`` as round 1's local models."""
    config = RunConfig(
        algorithm="fedmr", num_clients=len(states), clients_per_round=len(states), **config_changes
    )
    strategy = FedMR(config, states[0])
    strategy.aggregate(1, [ClientResult(k, s, 10 * (k + 1), 0.0) for k, s in enumerate(states)])
    return strategy


def sources(dispatched, local, name):
    """For each dispatched model, the index of the local model its layer ``name`` came from."""
    found = []
    for model in dispatched:
        matches = [k for k, s in enumerate(local) if torch.equal(model[name], s[name])]
        assert len(matches) == 1, f"layer {name} matches local models {matches}"
        found.append(matches[0])
    return tuple(found)


def float_names(state):
    return [n for n, t in state.items() if t.is_floating_point()]


def test_every_layer_is_a_permutation_of_the_local_layers():
    local = random_states(5, [(3, 4), (4,), (2, 2, 3), ()] * 3)
    strategy = strategy_with_locals(local)
    dispatched = strategy.dispatch(2, list(range(5)))
    assert len(dispatched) == 5
    for model in dispatched:
        assert list(model) == list(local[0])  # same layers in the same order
        # Integer buffers are not shuffled: they come from the first local model.
        assert torch.equal(model["bn.num_batches_tracked"], local[0]["bn.num_batches_tracked"])
    for name in float_names(local[0]):
        # Each local layer is used by exactly one dispatched model.
        assert sorted(sources(dispatched, local, name)) == list(range(5))


def test_layer_permutations_are_independent_and_uniform():
    local = random_states(4, [(2,)] * 20, with_counter=False)
    strategy = strategy_with_locals(local)
    names = float_names(local[0])
    perms = [sources(strategy.dispatch(2, list(range(4))), local, n) for n in names]
    assert len(set(perms)) > 1  # not one shared permutation for the whole model

    # Over many rounds, model 0's first and last layers come from the same local model
    # about 1/K of the time (always, if the layers shared a permutation), and every local
    # model feeds model 0's first layer about equally often.
    rounds = range(2, 402)
    same, counts = 0, [0] * 4
    for rnd in rounds:
        out = strategy.dispatch(rnd, list(range(4)))
        first, last = sources(out, local, names[0]), sources(out, local, names[-1])
        same += first[0] == last[0]
        counts[first[0]] += 1
    assert 60 <= same <= 140  # binomial(400, 1/4): mean 100, sd 8.7
    assert all(60 <= c <= 140 for c in counts)


def test_one_segment_dispatches_whole_local_models():
    local = random_states(6, [(3,), (2, 2), (5,), ()], with_counter=False)
    strategy = strategy_with_locals(local, segments=1)
    for rnd in (2, 3, 4):
        dispatched = strategy.dispatch(rnd, list(range(6)))
        used = []
        for model in dispatched:
            matches = [k for k, s in enumerate(local) if states_allclose(model, s, 0, 0)]
            assert len(matches) == 1  # the dispatched model is one local model entirely
            used.extend(matches)
        assert sorted(used) == list(range(6))


def test_segments_group_consecutive_layers():
    local = random_states(6, [(2,)] * 10, with_counter=False)
    names = float_names(local[0])
    strategy = strategy_with_locals(local, segments=3)
    # floor(j * 3 / 10): layers 0-3, 4-6 and 7-9.
    assert layer_segments(10, 3) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    for rnd in (2, 3):
        dispatched = strategy.dispatch(rnd, list(range(6)))
        perms = [sources(dispatched, local, n) for n in names]
        blocks = [len(list(group)) for _, group in itertools.groupby(perms)]
        assert blocks == [4, 3, 3]
        for perm in perms:
            assert sorted(perm) == list(range(6))
    # p equal to the number of layers is per-layer FedMR; more segments than layers is an error.
    assert layer_segments(10, 10) == layer_segments(10, 0) == list(range(10))
    with pytest.raises(ValueError, match="segments"):
        strategy_with_locals(local, segments=11)


def test_recombine_is_a_pure_function_of_the_generator():
    local = random_states(3, [(2,), (3,)])
    a = recombine(local, 0, torch_generator(5, "x"))
    b = recombine(local, 0, torch_generator(5, "x"))
    assert all(states_allclose(x, y, 0, 0) for x, y in zip(a, b, strict=True))


def test_stage1_equals_uniform_fedavg(tiny_config):
    fedmr = run(
        tiny_config.replace(algorithm="fedmr", stage1_rounds=tiny_config.rounds), progress=False
    )
    fedavg = run(tiny_config.replace(algorithm="fedavg", weighting="uniform"), progress=False)
    assert states_allclose(fedmr.final_state, fedavg.final_state, rtol=0, atol=0)
    assert fedmr.metric("accuracy") == fedavg.metric("accuracy")


def test_global_is_uniform_mean_and_stage2_recombines_last_locals(tiny_config):
    config = tiny_config.replace(algorithm="fedmr", stage1_rounds=1, rounds=3, record_states=True)
    history = run(config, progress=False)
    steps = history.trajectory
    k = config.clients_per_round
    for step in steps:
        # Reported global: the uniform mean of the round's local models.
        expected = weighted_mean(step["local"], [1.0] * k)
        assert states_allclose(step["global"], expected, rtol=0, atol=0)
    assert states_allclose(history.final_state, steps[-1]["global"], rtol=0, atol=0)
    # Round 1 (stage 1) dispatches one model to all.
    first = steps[0]["dispatched"]
    assert all(states_allclose(d, first[0], 0, 0) for d in first)
    # From round 2 (the first of stage 2) on: last round's locals, recombined; never the global.
    names = float_names(steps[0]["local"][0])
    for prev, step in zip(steps, steps[1:], strict=False):
        for name in names:
            assert sorted(sources(step["dispatched"], prev["local"], name)) == list(range(k))
        assert not any(states_allclose(d, prev["global"]) for d in step["dispatched"])


def test_checkpoint_round_trip_continues_identically(tiny_config, tmp_path):
    # Rounds 1-2 then 3 (which recombines round 2's kept models) against rounds 1-3.
    config = tiny_config.replace(algorithm="fedmr", rounds=3, checkpoint_every=1)
    straight = run(config, progress=False)
    run(config.replace(rounds=2, run_dir=str(tmp_path / "run")), progress=False)
    resumed = run(config.replace(run_dir=str(tmp_path / "run")), progress=False)
    assert states_allclose(resumed.final_state, straight.final_state, rtol=0, atol=0)
    assert resumed.metric("accuracy") == straight.metric("accuracy")

    # The checkpoint holds the kept local models and loads with weights_only=True.
    local = random_states(3, [(2, 3), ()])
    strategy = strategy_with_locals(local)
    torch.save(strategy.state_dict(), tmp_path / "s.pt")
    restored = FedMR(strategy.config, local[1])
    restored.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    a, b = strategy.dispatch(7, [0, 1, 2]), restored.dispatch(7, [0, 1, 2])
    assert all(states_allclose(x, y, 0, 0) for x, y in zip(a, b, strict=True))
    assert states_allclose(restored.global_state, strategy.global_state, 0, 0)


def test_two_layer_zero_dim_toy_state():
    init = OrderedDict(x=torch.tensor(1.0), y=torch.tensor(2.0))
    local = [
        OrderedDict(x=torch.tensor(float(10 + k)), y=torch.tensor(float(20 + k))) for k in range(3)
    ]
    config = RunConfig(algorithm="fedmr", num_clients=3, clients_per_round=3)
    strategy = FedMR(config, init)
    assert strategy.dispatch(1, [0, 1, 2])[0] is strategy.global_state  # round 1: global
    strategy.aggregate(1, [ClientResult(k, s, 1, 0.0) for k, s in enumerate(local)])
    assert torch.allclose(strategy.global_state["x"], torch.tensor(11.0))
    assert torch.allclose(strategy.global_state["y"], torch.tensor(21.0))
    pairs = set()
    for rnd in range(2, 30):
        out = strategy.dispatch(rnd, [0, 1, 2])
        assert sorted(float(m["x"]) for m in out) == [10.0, 11.0, 12.0]
        assert sorted(float(m["y"]) for m in out) == [20.0, 21.0, 22.0]
        pairs |= {(float(m["x"]), float(m["y"]) - 10) for m in out}
    assert any(x != y for x, y in pairs)  # x and y are shuffled independently
    whole = FedMR(config.replace(segments=1), init)
    whole.aggregate(1, [ClientResult(k, s, 1, 0.0) for k, s in enumerate(local)])
    for m in whole.dispatch(2, [0, 1, 2]):
        assert float(m["y"]) - float(m["x"]) == 10.0  # whole models move together
    with pytest.raises(ValueError, match="segments"):
        FedMR(config.replace(segments=3), init)


# ---- Fig. 6's model similarity and the Indep reference ----------------------------------------


def test_model_similarity_is_the_mean_pairwise_cosine_of_the_weights():
    """Against a pair-by-pair computation; BatchNorm running statistics are left out."""
    from flnotes.algorithms.fedmr import mean_pairwise_cosine

    states = random_states(4, [(3, 2), (5,)], seed=3)
    for k, state in enumerate(states):
        state["bn.running_var"] = torch.full((5,), 100.0 + k)  # would dominate the cosine
    flat = [torch.cat([s["layer0"].reshape(-1), s["layer1"]]).double() for s in states]
    pairs = [torch.nn.functional.cosine_similarity(a, b, dim=0)
             for a, b in itertools.combinations(flat, 2)]
    assert mean_pairwise_cosine(states) == pytest.approx(float(sum(pairs) / len(pairs)),
                                                         abs=1e-12)
    assert mean_pairwise_cosine([states[0], states[0]]) == pytest.approx(1.0)
    assert mean_pairwise_cosine(states[:1]) != mean_pairwise_cosine(states[:1])  # NaN


def test_fedmr_records_model_similarity_every_evaluated_round(tiny_config):
    history = run(tiny_config.replace(algorithm="fedmr", record_states=True), progress=False)
    from flnotes.algorithms.fedmr import mean_pairwise_cosine

    similarity = history.metric("model_similarity")
    assert len(similarity) == tiny_config.rounds
    for value, step in zip(similarity, history.trajectory, strict=True):
        assert value == pytest.approx(mean_pairwise_cosine(step["local"]), abs=1e-12)


def test_indep_is_fedmr_moving_whole_models_and_reports_indepaggr(tiny_config):
    config = tiny_config.replace(rounds=3, record_states=True)
    indep = run(config.replace(algorithm="indep", segments=0, stage1_rounds=2), progress=False)
    whole = run(config.replace(algorithm="fedmr", segments=1, stage1_rounds=0), progress=False)
    assert states_allclose(indep.final_state, whole.final_state, rtol=0, atol=0)
    assert indep.metric("accuracy") == whole.metric("accuracy")  # IndepAggr: the locals' mean
    # Each dispatched model (from round 2) is one of last round's local models, whole.
    for prev, step in zip(indep.trajectory, indep.trajectory[1:], strict=False):
        for sent in step["dispatched"]:
            assert any(states_allclose(sent, local, 0, 0) for local in prev["local"])
    # The local models' own accuracy, from evaluating each of them.
    from flnotes.engine.tasks import build_task

    task = build_task(config)
    model = task.working_model()
    accuracies = []
    for local in indep.trajectory[-1]["local"]:
        model.load_state_dict(local)
        accuracies.append(task.evaluate(model, config.eval_batch_size)["accuracy"])
    assert indep.metric("local_accuracy_max")[-1] == max(accuracies)
    mean = sum(accuracies) / len(accuracies)
    assert indep.metric("local_accuracy_mean")[-1] == pytest.approx(mean)


# ---- App. B: secure recombination ---------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 5])
def test_a_secure_exchange_is_a_permutation_the_server_cannot_see_through(k):
    """Every layer ends in exactly one model, and a model's layer may come from any client."""
    from flnotes.algorithms.fedmr import secure_exchange_sources

    g = torch_generator(0, "test-secure")
    seen = [set() for _ in range(k)]
    for _ in range(300):
        sources = secure_exchange_sources(k, g)
        assert sorted(sources) == list(range(k))
        for i, source in enumerate(sources):
            seen[i].add(source)
    assert all(len(s) == k for s in seen)  # every client's layer can land in every model


def test_secure_recombination_keeps_the_global_and_shuffles_the_kept_models(tiny_config):
    config = tiny_config.replace(algorithm="fedmr", rounds=2, secure_exchanges=2,
                                 record_states=True).resolved()
    from flnotes.algorithms import build_strategy
    from flnotes.engine.backends import train_clients
    from flnotes.engine.sim import initial_state, sample_clients
    from flnotes.engine.tasks import build_task

    task = build_task(config)
    strategy = build_strategy(config, initial_state(config, task))
    clients = sample_clients(config, 1)
    results = train_clients(task, strategy, 1, clients, strategy.dispatch(1, clients), config)
    uploaded = [r.state for r in results]
    strategy.aggregate(1, results)
    kept = strategy.local_states
    # The server's mean is the plain FedMR mean (a permutation changes only the sum order).
    assert states_allclose(strategy.global_state, weighted_mean(uploaded, [1.0] * len(kept)),
                           rtol=1e-6, atol=1e-7)
    for name in float_names(uploaded[0]):
        assert sorted(sources(kept, uploaded, name)) == list(range(len(kept)))
    assert any(not states_allclose(a, b, 0, 0) for a, b in zip(kept, uploaded, strict=True))
    # A whole run trains with it (the exchange draws from (seed, round): resumable).
    history = run(config.replace(record_states=False), progress=False)
    assert len(history.metric("accuracy")) == 2


def test_secure_recombination_dispatches_the_same_layers_as_plain_recombination(tiny_config):
    """App. B against plain FedMR on the same run: the server receives other models than the
    clients trained (it cannot tell whose layer it holds), yet the next round's recombined
    models are made of exactly the same layers, each used once, and the reported global
    model is the same mean."""
    config = tiny_config.replace(algorithm="fedmr", rounds=2, record_states=True)
    plain = run(config, progress=False).trajectory
    secure = run(config.replace(secure_exchanges=3), progress=False).trajectory
    uploaded = plain[0]["local"]  # round 1: both runs train the same models from the same start
    for a, b in zip(uploaded, secure[0]["local"], strict=True):
        assert states_allclose(a, b, rtol=0, atol=0)
    assert states_allclose(plain[0]["global"], secure[0]["global"], rtol=1e-6, atol=1e-7)
    # Round 2's dispatch: per layer, both runs hand out the round-1 layers, each exactly once.
    for name in float_names(uploaded[0]):
        plain_sources = sources(plain[1]["dispatched"], uploaded, name)
        secure_sources = sources(secure[1]["dispatched"], uploaded, name)
        assert sorted(plain_sources) == sorted(secure_sources) == list(range(len(uploaded)))
    # ... while the assignment differs somewhere: the exchange moved layers before upload.
    assert any(sources(plain[1]["dispatched"], uploaded, n)
               != sources(secure[1]["dispatched"], uploaded, n) for n in float_names(uploaded[0]))
