"""CluSamp (clustered sampling, Algorithm 2): unbiased selection (the paper's Proposition 1,
exactly on the distributions and by Monte Carlo on the draws), clusters that follow the
update similarity, determinism, the 1/m aggregation, resume, the toy, the engine's hook."""

from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms import build_strategy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.clusamp import (
    DISTANCES,
    cluster_distributions,
    distance_matrix,
    draw,
    tree_cut,
    ward_tree,
)
from flnotes.config import RunConfig
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import Simulation, run, sample_clients
from flnotes.rng import torch_generator


def strategy_for(num_clients: int, m: int, dim: int = 5, **fields):
    """A CluSamp strategy around a one-layer state of ``dim`` weights (no training)."""
    config = RunConfig(algorithm="clusamp", num_clients=num_clients, clients_per_round=m,
                       **fields)
    return build_strategy(config, OrderedDict(w=torch.zeros(dim)))


def expected_weights(strategy, sizes, m, rounds, updates_for_round):
    """Monte Carlo mean of each client's aggregation weight (draws / m) over ``rounds``
    selections; the updates change every round as ``updates_for_round(r)`` says."""
    total = torch.zeros(len(sizes), dtype=torch.float64)
    for r in range(rounds):
        strategy.updates = updates_for_round(r)
        strategy.select_clients(r, sizes, m, torch_generator(7, "sample", r))
        for client, count in strategy.draw_counts.items():
            total[client] += count / m
    return total / rounds


def assert_unbiased(mean, p, rounds, m):
    """|mean - p_i| within 5 standard errors of plain multinomial sampling's estimate (an
    upper bound: clustered sampling's variance is no larger, the paper's Theorem 2)."""
    se = torch.sqrt(p * (1 - p) / (m * rounds))
    assert torch.all((mean - p).abs() <= 5 * se + 1e-12), (mean - p) / se


def test_distributions_satisfy_eq6_exactly_including_a_client_above_one_over_m():
    gen = torch.Generator().manual_seed(0)
    for distance in DISTANCES:
        for sizes in ([30, 5, 5, 12, 40, 3, 8, 9, 20, 1], [1] * 10, [200, 1, 1, 1, 1, 1, 1, 1,
                                                                        1, 1]):
            m = 4
            updates = torch.randn(10, 6, generator=gen)
            groups = tree_cut(ward_tree(distance_matrix(updates, distance)), sizes, m)
            assert sorted(c for g in groups for c in g) == list(range(10))  # a partition
            rows = cluster_distributions(groups, sizes, m)
            assert len(rows) == m
            assert all(sum(row.values()) == sum(sizes) for row in rows)  # each r_k sums 1
            for i in range(10):  # sum_k r_(k,i) = m p_i, in integer units
                assert sum(row.get(i, 0) for row in rows) == m * sizes[i]


def test_expected_aggregation_weight_equals_importance_monte_carlo():
    """Proposition 1: E[omega_i] = p_i, over 3000 rounds with fresh random updates."""
    sizes = [30, 5, 5, 12, 40, 3, 8, 9, 20, 1, 14, 7]
    m, rounds = 4, 3000
    strategy = strategy_for(len(sizes), m)
    gen = torch.Generator().manual_seed(1)
    # Three latent groups plus noise, redrawn each round, so the clusters keep changing.
    centers = torch.randn(3, 5, generator=gen) * 3

    def updates(r):
        return centers[torch.arange(len(sizes)) % 3] + torch.randn(len(sizes), 5,
                                                                   generator=gen)

    mean = expected_weights(strategy, sizes, m, rounds, updates)
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    assert_unbiased(mean, p, rounds, m)


@pytest.mark.parametrize("distance", DISTANCES)
def test_separated_update_groups_are_separate_clusters_and_each_gives_one_client(distance):
    n, m = 12, 3
    groups = [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]  # interleaved, not by index
    directions = torch.eye(5)[:3] * 10.0  # three orthogonal update directions
    gen = torch.Generator().manual_seed(2)
    updates = torch.zeros(n, 5)
    for g, members in enumerate(groups):
        updates[members] = directions[g] + 0.05 * torch.randn(len(members), 5, generator=gen)
    strategy = strategy_for(n, m)
    strategy.updates = updates
    cut = tree_cut(ward_tree(distance_matrix(updates, distance)), [1] * n, m)
    assert sorted(cut) == groups
    strategy.config = strategy.config.replace(clusamp_distance=distance)
    for r in range(200):
        chosen = strategy.select_clients(r, [1] * n, m, torch_generator(3, "sample", r))
        assert len(chosen) == m  # one per cluster, so never a repeat
        assert sorted(next(g for g, members in enumerate(groups) if c in members)
                      for c in chosen) == [0, 1, 2]


def test_uniform_importance_and_identical_updates_is_unbiased_and_seeded():
    n, m, rounds = 10, 3, 3000
    strategy = strategy_for(n, m)
    same = torch.ones(n, 5) * 0.3  # every client's update the same (also: all zero)
    mean = expected_weights(strategy, [1] * n, m, rounds,
                            lambda r: same if r % 2 else torch.zeros(n, 5))
    assert_unbiased(mean, torch.full((n,), 1.0 / n, dtype=torch.float64), rounds, m)
    for r in range(20):  # a seed gives the same selection; other rounds other ones
        a = strategy.select_clients(r, [1] * n, m, torch_generator(5, "sample", r))
        b = strategy.select_clients(r, [1] * n, m, torch_generator(5, "sample", r))
        assert a == b
    picks = {tuple(strategy.select_clients(r, [1] * n, m, torch_generator(5, "sample", r)))
             for r in range(20)}
    assert len(picks) > 1


def test_aggregation_weighs_each_draw_one_over_m_and_records_updates():
    strategy = strategy_for(4, 3, dim=2)
    strategy.draw_counts = {0: 2, 3: 1}  # client 0 drawn by two distributions
    results = [ClientResult(0, OrderedDict(w=torch.tensor([3.0, 0.0])), 10, 0.0),
               ClientResult(3, OrderedDict(w=torch.tensor([0.0, 3.0])), 99, 0.0)]
    new = strategy.aggregate(1, results)
    assert torch.allclose(new["w"], torch.tensor([2.0, 1.0]))  # (2 x0 + x3) / 3, not samples
    assert torch.equal(strategy.updates[0], torch.tensor([3.0, 0.0]))  # local - dispatched
    assert torch.equal(strategy.updates[3], torch.tensor([0.0, 3.0]))
    assert torch.equal(strategy.updates[1], torch.zeros(2))  # never sampled: zero


def test_engine_asks_the_strategy_and_others_keep_uniform_sampling(tiny_config):
    fedavg = Simulation(tiny_config)
    assert fedavg.begin_round(2)[0] == sample_clients(tiny_config, 2)
    clusamp = Simulation(tiny_config.replace(algorithm="clusamp"))
    calls = []
    clusamp.strategy.select_clients = lambda *args: calls.append(args) or [1, 4]
    assert clusamp.begin_round(2)[0] == [1, 4]
    rnd, sizes, m, _ = calls[0]
    assert (rnd, m) == (2, 3)
    assert sizes == [clusamp.task.num_samples(c) for c in range(6)]


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="clusamp", rounds=5, checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["accuracy"] for r in full.rows] == [r["accuracy"] for r in resumed.rows]
    saved = [torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)["strategy"]
             for d in ("full", "part")]
    assert torch.equal(saved[0]["updates"], saved[1]["updates"])  # the clustering's input
    assert saved[0]["updates"].abs().sum() > 0
    assert "kept_distances" not in saved[0]  # the default keeps no seed-code matrix


def test_runs_on_the_toy():
    config = toy.toy_config("clusamp", rounds=4, num_clients=4, clients_per_round=2)
    history = run(config, progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    assert all(torch.isfinite(t).all() for t in history.final_state.values())


def test_config_rejects_an_unknown_distance():
    with pytest.raises(ValueError, match="clusamp_distance"):
        RunConfig(algorithm="clusamp", clusamp_distance="manhattan").resolved()


def test_stacked_seeds_select_their_own_clients_as_separate_runs(tiny_config):
    """run_seeds goes through begin_round too: each seed's clustering is its own."""
    config = tiny_config.replace(algorithm="clusamp", rounds=3, backend="vmap")
    stacked = run_seeds(config, [1, 2], progress=False)
    for seed, history in zip([1, 2], stacked, strict=True):
        single = run(config.replace(seed=seed), progress=False)
        assert [r["clusters"] for r in history.rows] == [r["clusters"] for r in single.rows]
        for name, t in single.final_state.items():
            torch.testing.assert_close(history.final_state[name], t, atol=1e-5, rtol=1e-4)


def test_count_sketch_keeps_the_clusters_and_resumes(tiny_config, tmp_path):
    """The opt-in sketch: inner products kept in expectation (here: the same clusters of
    well separated updates), the buckets rebuilt from the seed on resume."""
    n, dim, k = 12, 4000, 256
    strategy = strategy_for(n, 3, dim=dim, clusamp_sketch=k)
    assert strategy.updates.shape == (n, k)
    groups = [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    gen = torch.Generator().manual_seed(4)
    directions = torch.randn(3, dim, generator=gen)
    for g, members in enumerate(groups):
        for c in members:
            strategy.draw_counts = {c: 1}
            local = directions[g] + 0.1 * torch.randn(dim, generator=gen)
            strategy.aggregate(1, [ClientResult(c, OrderedDict(w=strategy.global_state["w"]
                                                               + local), 1, 0.0)])
            strategy.global_state = OrderedDict(w=torch.zeros(dim))  # same start for all
    cut = tree_cut(ward_tree(distance_matrix(strategy.updates, "cosine")), [1] * n, 3)
    assert sorted(cut) == groups
    config = tiny_config.replace(algorithm="clusamp", clusamp_sketch=16, rounds=4,
                                 checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)


@pytest.mark.parametrize("distance", DISTANCES)
def test_distances_against_pair_by_pair_formulas(distance, monkeypatch):
    """The chunked float64 distances equal the code's definitions pair by pair (arccos of the
    cosine with 0 for a zero update, squared L2, L1), one chunk or many."""
    import math

    from flnotes.algorithms import clusamp

    u = torch.randn(5, 300, generator=torch.Generator().manual_seed(6))
    u[3] = 0.0  # a client never sampled

    def pair(a, b):
        a, b = a.tolist(), b.tolist()
        if distance == "l1":
            return sum(abs(x - y) for x, y in zip(a, b, strict=True))
        if distance == "l2":
            return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))
        na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
        if na == 0 or nb == 0:
            return 0.0
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return math.acos(max(-1.0, min(1.0, dot / (na * nb))))

    expected = torch.tensor([[pair(u[i], u[j]) if i != j else 0.0 for j in range(5)]
                             for i in range(5)], dtype=torch.float64)
    for chunk in (clusamp.CHUNK, 64):
        monkeypatch.setattr(clusamp, "CHUNK", chunk)
        torch.testing.assert_close(distance_matrix(u, distance), expected, rtol=1e-9,
                                   atol=1e-9)


# ---- the seed code's variant (HMHelloWorld/FedMR main_fed.py ClusteredSampling) ----------


def test_samples_aggregation_weighs_each_draw_by_its_size_as_the_seed_code():
    """clusamp_aggregation="samples": sum_k n_(l_k) theta_(l_k) / sum_k n_(l_k) over the
    draws, a repeat counted twice (the code's Aggregation(w_locals, lens)); the default
    stays 1/m per draw."""
    sizes = {0: 10, 2: 30, 3: 5}
    picks = [0, 2, 0, 3]  # client 0 drawn by two of the m = 4 distributions
    thetas = {0: torch.tensor([3.0, 0.0]), 2: torch.tensor([0.0, 6.0]),
              3: torch.tensor([1.0, 1.0])}
    results = [ClientResult(c, OrderedDict(w=thetas[c]), sizes[c], 0.0) for c in (0, 2, 3)]
    by_size = [sum(sizes[c] * thetas[c][d].item() for c in picks) / sum(sizes[c] for c in picks)
               for d in range(2)]
    by_draw = [sum(thetas[c][d].item() for c in picks) / len(picks) for d in range(2)]
    assert by_size != by_draw  # unequal sizes: the two readings differ here
    for aggregation, expected in (("samples", by_size), ("draws", by_draw), (None, by_draw)):
        fields = {} if aggregation is None else {"clusamp_aggregation": aggregation}
        strategy = strategy_for(4, 4, dim=2, **fields)
        strategy.draw_counts = {c: picks.count(c) for c in set(picks)}
        new = strategy.aggregate(1, results)
        torch.testing.assert_close(new["w"], torch.tensor(expected), rtol=1e-6, atol=1e-6)

    # Through a real selection: the weights follow the draws select_clients made.
    n, m = 6, 4
    all_sizes = [40, 3, 25, 7, 11, 2]
    strategy = strategy_for(n, m, dim=2, clusamp_aggregation="samples")
    chosen = strategy.select_clients(1, all_sizes, m, torch_generator(0, "sample", 1))
    assert sorted(set(strategy.picks)) == chosen and len(strategy.picks) == m
    locals_ = {c: torch.tensor([float(c), 1.0 + c * c]) for c in chosen}
    new = strategy.aggregate(1, [ClientResult(c, OrderedDict(w=locals_[c]), all_sizes[c], 0.0)
                                 for c in chosen])
    hand = sum(all_sizes[c] * locals_[c] for c in strategy.picks) / sum(all_sizes[c]
                                                                         for c in strategy.picks)
    torch.testing.assert_close(new["w"], hand)


def test_seed_code_similarity_updates_only_the_last_drawn_clients_column():
    """clusamp_similarity="seed-code": the full matrix at round 1 (zero updates: all zero),
    then each round only the entries (i, last draw) for the drawn i, in draw order, from the
    new updates (utils/clustering.py l.118-130); the next round's distributions come from
    that kept, asymmetric matrix, not from all pairs of the current updates."""
    n, m, dim = 8, 3, 4
    sizes = [30, 5, 12, 40, 8, 9, 20, 14]
    strategy = strategy_for(n, m, dim=dim, clusamp_similarity="seed-code",
                            clusamp_distance="l1")
    gen = torch.Generator().manual_seed(11)
    expected = torch.zeros(n, n, dtype=torch.float64)
    updates = {}

    def l1(a, b):
        return sum(abs(x - y) for x, y in zip(a.tolist(), b.tolist(), strict=True))

    for rnd in (1, 2):
        rows = cluster_distributions(tree_cut(ward_tree(expected), sizes, m), sizes, m)
        assert strategy.distributions(sizes, m) == rows  # from the kept matrix
        chosen = strategy.select_clients(rnd, sizes, m, torch_generator(3, "sample", rnd))
        picks = strategy.picks
        # draw order: one pick from each r_k, r_1's first (the hand draw from the same rows)
        assert picks == draw(rows, sum(sizes), torch_generator(3, "sample", rnd))
        assert chosen == sorted(set(picks))
        start = strategy.global_state["w"].clone()
        results = []
        for c in chosen:
            local = start + torch.randn(dim, generator=gen)
            updates[c] = local - start  # theta_i - theta, as the server sees it
            results.append(ClientResult(c, OrderedDict(w=local), sizes[c], 0.0))
        strategy.aggregate(rnd, results)
        last = picks[-1]
        for i in picks:  # the only entries that change this round
            expected[i, last] = l1(updates[i], updates[last])
        kept = strategy.kept_distances["matrix"]
        assert kept.dtype == torch.float64
        torch.testing.assert_close(kept, expected, rtol=1e-9, atol=1e-9)
    assert len(set(picks)) > 1 and not torch.equal(kept, kept.T)  # asymmetric
    # The next round's distributions come from the kept matrix; all pairs of the current
    # updates (the paper's reading) would give other ones here.
    rows = cluster_distributions(tree_cut(ward_tree(expected), sizes, m), sizes, m)
    assert strategy.distributions(sizes, m) == rows
    full = distance_matrix(strategy.updates, "l1")
    assert cluster_distributions(tree_cut(ward_tree(full), sizes, m), sizes, m) != rows
    # the default reads all pairs of the current updates and keeps no matrix
    paper = strategy_for(n, m, dim=dim, clusamp_distance="l1")
    paper.updates = strategy.updates.clone()
    assert paper.distributions(sizes, m) == cluster_distributions(
        tree_cut(ward_tree(full), sizes, m), sizes, m)
    assert paper.kept_distances is None and "kept_distances" not in paper.state_dict()


def test_seed_code_variant_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="clusamp", rounds=5, checkpoint_every=2,
                                 clusamp_aggregation="samples", clusamp_similarity="seed-code",
                                 clusamp_distance="l1")
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["accuracy"] for r in full.rows] == [r["accuracy"] for r in resumed.rows]
    assert [r["clusters"] for r in full.rows] == [r["clusters"] for r in resumed.rows]
    saved = [torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)["strategy"]
             for d in ("full", "part")]
    kept = [s["kept_distances"]["matrix"] for s in saved]
    assert kept[0].dtype == torch.float64 and torch.equal(kept[0], kept[1])
    assert kept[0].abs().sum() > 0 and not torch.equal(kept[0], kept[0].T)
    assert torch.equal(saved[0]["updates"], saved[1]["updates"])


@pytest.mark.parametrize("field, value", [("clusamp_aggregation", "mean"),
                                          ("clusamp_similarity", "sparse")])
def test_config_rejects_an_unknown_seed_code_choice(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfig(algorithm="clusamp", **{field: value}).resolved()
