"""FedExP against references: the paper's step size on hand-made updates, the extrapolation
and the two-iterate mean by hand, FedAvg when the step is 1, resume, the toy."""

from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedexp import FedExP, server_step_size
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose


def paper_step(start, locals_, eps):
    """eta_g = max(1, sum_i ||D_i||^2 / (2 M (||mean D||^2 + eps))), uniform weights, in floats."""
    deltas = [[a - b for a, b in zip(w, start, strict=True)] for w in locals_]
    m = len(deltas)
    spread = sum(sum(d * d for d in delta) for delta in deltas)
    mean = [sum(col) / m for col in zip(*deltas, strict=True)]
    return max(1.0, spread / (2 * m * (sum(v * v for v in mean) + eps)))


def as_state(values):
    return OrderedDict(w=torch.tensor(values[:2], dtype=torch.float64),
                       b=torch.tensor(values[2:], dtype=torch.float64))


def test_step_size_is_the_papers_formula_on_hand_made_updates():
    start = [0.5, -1.0, 2.0]
    # Updates that disagree: a large step; updates that agree: max(1, .) gives 1.
    disagree = [[1.5, -1.0, 2.0], [-0.5, -0.8, 2.1], [0.6, -2.0, 1.7]]
    agree = [[0.6, -0.9, 2.1], [0.61, -0.9, 2.1], [0.6, -0.91, 2.09]]
    for locals_ in (disagree, agree):
        got = server_step_size(as_state(start), [as_state(w) for w in locals_], [1, 1, 1], 1e-3)
        assert got == pytest.approx(paper_step(start, locals_, 1e-3), rel=1e-12)
    assert paper_step(start, disagree, 1e-3) > 1.5
    assert paper_step(start, agree, 1e-3) == 1.0
    # Weights p_i: the same as repeating a client (p = 2/4, 1/4, 1/4).
    weighted = server_step_size(as_state(start), [as_state(w) for w in disagree], [2, 1, 1], 0.1)
    repeated = paper_step(start, [disagree[0], *disagree], 0.1)
    assert weighted == pytest.approx(repeated, rel=1e-12)


def test_aggregate_extrapolates_and_evaluates_the_mean_of_the_last_two_iterates():
    start = [0.5, -1.0, 2.0]
    locals_ = [[1.5, -1.0, 2.0], [-0.5, -0.8, 2.1], [0.6, -2.0, 1.7]]
    config = RunConfig(algorithm="fedexp", weighting="uniform", fedexp_eps=1e-3)
    strategy = FedExP(config, as_state(start))
    results = [ClientResult(i, as_state(w), 10, 0.0) for i, w in enumerate(locals_)]
    eta = paper_step(start, locals_, 1e-3)
    mean = [sum(col) / 3 for col in zip(*locals_, strict=True)]
    w1 = [s + eta * (m - s) for s, m in zip(start, mean, strict=True)]
    out = strategy.aggregate(1, results)  # round 1: no previous iterate, the model is w1
    assert states_allclose(out, as_state(w1), rtol=1e-12, atol=1e-12)
    assert strategy.round_metrics(None)["server_step"] == pytest.approx(eta)

    # Round 2 starts from w1 (not from a mean) and evaluates (w2 + w1) / 2.
    assert all(s is strategy.iterate for s in strategy.dispatch(2, [0, 1]))
    locals2 = [[w + d for w, d in zip(w1, delta, strict=True)]
               for delta in ([0.3, 0.1, -0.2], [-0.2, 0.2, 0.1])]
    results2 = [ClientResult(i, as_state(w), 10, 0.0) for i, w in enumerate(locals2)]
    eta2 = paper_step(w1, locals2, 1e-3)
    mean2 = [sum(col) / 2 for col in zip(*locals2, strict=True)]
    w2 = [s + eta2 * (m - s) for s, m in zip(w1, mean2, strict=True)]
    out2 = strategy.aggregate(2, results2)
    assert states_allclose(strategy.iterate, as_state(w2), rtol=1e-12, atol=1e-12)
    both = [(a + b) / 2 for a, b in zip(w1, w2, strict=True)]
    assert states_allclose(out2, as_state(both), rtol=1e-12, atol=1e-12)


def test_batchnorm_statistics_are_averaged_not_extrapolated():
    start = OrderedDict(weight=torch.zeros(2), **{"bn.running_var": torch.ones(2)})
    locals_ = [OrderedDict(weight=torch.tensor([1.0, 0.0]), **{"bn.running_var": torch.zeros(2)}),
               OrderedDict(weight=torch.tensor([-1.0, 0.2]), **{"bn.running_var": torch.ones(2)})]
    strategy = FedExP(RunConfig(algorithm="fedexp", weighting="uniform"), start)
    strategy.aggregate(1, [ClientResult(i, s, 5, 0.0) for i, s in enumerate(locals_)])
    assert strategy.last_step > 1
    assert torch.equal(strategy.iterate["bn.running_var"], torch.full((2,), 0.5))
    assert torch.allclose(strategy.iterate["weight"],
                          strategy.last_step * torch.tensor([0.0, 0.1]))


def test_step_one_without_averaging_is_fedavg_bit_for_bit(tiny_config):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    # A huge eps forces eta_g = 1 through the formula itself.
    b = run(tiny_config.replace(algorithm="fedexp", fedexp_eps=1e12, fedexp_average=False),
            progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == b.metric("accuracy")
    assert all(row["server_step"] == 1.0 for row in b.rows)
    c = run(tiny_config.replace(algorithm="fedexp"), progress=False)
    assert max(row["server_step"] for row in c.rows) > 1
    assert not states_allclose(a.final_state, c.final_state)


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedexp", rounds=4, checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["server_step"] for r in full.rows] == [r["server_step"] for r in resumed.rows]


def test_runs_on_the_toy():
    config = toy.toy_config("fedexp", rounds=3, num_clients=3, clients_per_round=2)
    history = run(config, progress=False)
    assert history.status == "completed"
    assert all(row["server_step"] >= 1 for row in history.rows)


def test_the_seed_codes_fedexp_step_is_its_formula_by_hand():
    """The seed papers' FedExP (Training_FedExP.py l.83): eta_g = max(1, 0.5 * sum_i p_i
    ||Delta_i||^2 / (||Delta_bar||^2 + M * 0.1)), with M the round's clients; the default
    keeps the FedExP paper's eps (added once)."""
    start = [0.0, 0.0, 0.0]
    locals_ = [[3.0, 0.0, 0.0], [-3.0, 0.2, 0.0], [0.1, -2.0, 1.0]]
    results = [ClientResult(i, as_state(w), 10, 0.0) for i, w in enumerate(locals_)]
    m = len(locals_)
    spread = sum(sum(x * x for x in w) for w in locals_) / m
    mean = [sum(col) / m for col in zip(*locals_, strict=True)]
    mean_sq = sum(x * x for x in mean)
    seed_code = max(1.0, 0.5 * spread / (mean_sq + m * 0.1))
    paper = max(1.0, 0.5 * spread / (mean_sq + 0.1))
    assert seed_code != pytest.approx(paper)  # the two readings differ on these updates
    for per_client, expected in ((True, seed_code), (False, paper)):
        config = RunConfig(algorithm="fedexp", weighting="uniform", fedexp_eps=0.1,
                           fedexp_eps_per_client=per_client)
        strategy = FedExP(config, as_state(start))
        strategy.aggregate(1, results)
        assert strategy.round_metrics(None)["server_step"] == pytest.approx(expected, rel=1e-12)
    assert RunConfig(algorithm="fedexp").fedexp_eps_per_client is False  # FedExP's own paper
