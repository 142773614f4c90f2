"""CluSamp (Fraboni, Vidal, Kameni, Lorenzi, "Clustered Sampling: Low-Variance and Improved
Representativity for Clients Selection in Federated Learning", ICML 2021), Algorithm 2:
clustered sampling based on the similarity of the clients' model updates.

Plain (multinomial) sampling draws the m = clients_per_round clients i.i.d. from p, p_i the
client's importance, and averages them with weight 1/m each. Clustered sampling draws them
from m different distributions r_1..r_m over the clients instead, one client from each,
under the constraint (the paper's Eq. 6, the condition of Proposition 1)

    sum_k r_(k,i) = m p_i         for every client i,

so that with the same aggregation weight 1/m per draw every client's expected aggregation
weight is still E[omega_i] = sum_k r_(k,i) / m = p_i (unbiased), while clients of one
cluster compete for one draw (lower variance, more representative rounds). Algorithm 2
builds the r_k from a hierarchical clustering of the clients' representative gradients:

1. every client keeps its last model update theta_i - theta (the local model minus the
   model it was dispatched), its representative gradient; a similarity matrix of these;
2. a Ward tree of the clients (Alg. 2 line 2); each merge's height is replaced by the
   merged group's importance, and the tree is cut at 1/m: the flat clusters are the largest
   subtrees whose importance is at most 1/m (so at least m of them);
3. the m most important clusters each fill one distribution r_k with mass m p_i per client;
   the clients of the other clusters fill the remaining room, Algorithm 1's way (clients
   in turn, one split over two distributions when it does not fit), until each r_k holds
   mass 1;
4. one client is drawn from each r_k; the new global model is sum_k theta_(l_k) / m.

Decisions where the paper leaves room (the authors' code is Accenture/Labs-Federated-
Learning, clustered_sampling; read for behaviour, nothing copied):

- Importance p_i: sample counts n_i / n (``weighting="samples"``, the paper's and the
  code's choice) or uniform 1/N (``weighting="uniform"``). Aggregation weight of a draw,
  ``clusamp_aggregation``: "draws" (default) is 1/m per draw (the paper's Eq. 3 with
  multinomial-type sampling): the importance enters through the distributions, not the
  aggregation weights. "samples" reproduces a quirk of the seed papers' code (the FedMR
  authors' repository HMHelloWorld/FedMR, main_fed.py ClusteredSampling): it draws
  ``idxs_users = sample_clients(distri_clusters)`` (l.146; utils/clustering.py l.227-237,
  one client per distribution, in distribution order, a repeat kept), appends
  ``lens.append(len(dict_users[idx]))`` for each draw (l.153) and averages with
  ``Aggregation(w_locals, lens)`` (l.160; models/Fed.py l.9-31: sum_k n_k w_k / sum_k n_k):
  each draw weighs its client's sample count n_(l_k), so the new model is
  sum_k n_(l_k) theta_(l_k) / sum_k n_(l_k). The importance n_i / n (l.111-112) then
  counts twice (in the distributions and in the weights), so E[omega_i] = p_i of
  Proposition 1 no longer holds; the default keeps the paper's 1/m.
- A client drawn by two distributions in one round trains once and enters the mean with
  weight 2/m (or 2 n_i with ``clusamp_aggregation="samples"``; the code trains it twice from
  different batches and counts each training once; the expected weights are the same, and
  the engine trains each client once a round).
- Similarity matrix, ``clusamp_similarity``: "full" (default, the paper's Alg. 2) computes
  every pair from the current representative gradients each round. "seed-code" reproduces a
  quirk of the seed papers' code: it computes the full matrix once, at iter 0 from the zero
  gradients (main_fed.py l.132-135), and afterwards updates the kept matrix with
  ``get_matrix_similarity_from_grads_new(gradients, ..., idx=idxs_users,
  metric_matrix=sim_matrix)`` (l.171-173). That function (utils/clustering.py l.118-130)
  loops ``for i in idx: for j in idx: if i == j: continue`` but writes
  ``metric_matrix[i, j] = get_similarity(...)`` after the inner loop (by its indentation),
  where Python's j is left at idx's last element: each round only the entries
  (i, last drawn client) of the drawn clients i change, in draw order, the (last, last)
  entry included (distance 0; for a client with itself flnotes writes 0 where the code's
  arccos of a rounded 1 may be a tiny number); every other entry keeps its old value and
  the matrix is no longer symmetric. ``linkage(sim_matrix, "ward")`` (l.138) takes its rows
  as observations, as ``ward_tree`` does. flnotes keeps the stored matrix in float64 (the
  code's numpy matrix) in every checkpoint and remembers each round's draws in draw order
  (the pick from r_m is the last), so a resumed run equals an uninterrupted one. It works
  with every distance and with the count sketch (the pairs come from whatever the server
  keeps of the updates).
- Distance between representative gradients ``clusamp_distance``: "cosine" (default) is the
  code's "cosine", the angle arccos of the cosine similarity; "l2" the squared Euclidean
  distance, "l1" the L1 distance (the code's other two). FedQP says CluSamp clusters "based
  on the cosine similarity between client gradient updates"; FedMut and FedMR say "model
  gradient similarity". The seed papers' code (the FedMR authors' repository, main_fed.py
  ClusteredSampling with utils/options.py --sim_type) defaults to "L1": the ``*-official``
  presets set ``clusamp_distance="l1"``, flnotes' default keeps the paper's angle.
- Ward linkage on the rows of the distance matrix as observation vectors (each client is
  described by its distances to all clients), as the authors' code calls
  ``scipy.cluster.hierarchy.linkage(matrix, "ward")``; Ward proper needs Euclidean
  points, which an arccos or L1 matrix is not.
- Representative gradient of a client never sampled yet: zero, as in the code; a zero
  gradient has cosine distance 0 to every client (the code's convention), so at round 1
  every client looks alike and the tree only groups by importance.
- Which layers: the trainable weights and every float layer but BatchNorm's running
  statistics (the code uses ``model.parameters()``); integer buffers are left out.
- The order in which the small clusters' clients fill the distributions (the code shuffles
  them with numpy's global state) only decides which client is split over two
  distributions; here it is by cluster importance, then client index, so the distributions
  are a function of the updates alone. Ties in importance are broken by the smallest client
  index. All masses are integers (m w_i against a capacity of sum_j w_j, with w_i the
  sample count or 1), so Eq. 6 holds exactly, not to float rounding, and each draw is an
  exact integer draw from the round's seeded sampling generator.
- A client whose own importance exceeds 1/m (it cannot fit one distribution) is spread over
  several, as Algorithm 1 does; the code would leave it in one (biased). Only the clusters
  that fit are kept whole.
- Memory: the server keeps one flat update per client (N x #parameters float32, saved in
  every checkpoint), as the code does; fine for the seed papers' CNNs at 100 clients, large
  for ResNet-18 (about 4.5 GB). Not in the paper, opt-in: ``clusamp_sketch`` = k > 0 keeps
  a count sketch of k numbers per update instead (each coordinate added, with a random sign,
  to one of k buckets, both fixed by the seed), whose inner products equal the updates' in
  expectation (variance of order |u||v|^2 / k), so the cosine and l2 distances are kept
  approximately; l1 is refused with it.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import is_float_layer, weighted_mean
from flnotes.rng import torch_generator

StateDict = OrderedDict[str, torch.Tensor]
DISTANCES = ("cosine", "l1", "l2")
RUNNING_STATS = ("running_mean", "running_var")  # BatchNorm's statistics: not an update
CHUNK = 1 << 18  # coordinates per slice when the distances are summed


def compared(name: str, tensor: torch.Tensor) -> bool:
    """Whether a layer is part of the representative gradient (float, not a statistic)."""
    return is_float_layer(tensor) and name.rsplit(".", 1)[-1] not in RUNNING_STATS


def flat_update(start: StateDict, local: StateDict) -> torch.Tensor:
    """theta_i - theta over the compared layers, as one float32 CPU vector."""
    parts = [(local[n].detach() - w0.detach()).reshape(-1).to("cpu", torch.float32)
             for n, w0 in start.items() if compared(n, w0)]
    return torch.cat(parts) if parts else torch.zeros(0)


def distance_matrix(updates: torch.Tensor, kind: str) -> torch.Tensor:
    """Pairwise distances (float64, N x N) between the rows of ``updates`` (the code's
    ``get_matrix_similarity_from_grads``)."""
    if kind not in DISTANCES:
        raise ValueError(f"clusamp_distance must be one of {DISTANCES}, got {kind!r}")
    n = updates.shape[0]
    total = torch.zeros(n, n, dtype=torch.float64)
    # In float64, a slice of coordinates at a time: a whole N x D float64 copy would be
    # twice the updates' own memory.
    for start in range(0, updates.shape[1], CHUNK):
        u = updates[:, start:start + CHUNK].double()
        total += torch.cdist(u, u, p=1) if kind == "l1" else u @ u.T
    if kind == "l1":
        return total
    sq = total.diagonal().clone()  # |u_i|^2 from the Gram matrix
    if kind == "l2":  # the code's "L2" is the squared distance
        return (sq[:, None] + sq[None, :] - 2.0 * total).clamp_min(0.0).fill_diagonal_(0.0)
    norms = sq.sqrt()
    cos = total / (norms[:, None] * norms[None, :]).clamp_min(1e-300)
    angle = torch.arccos(cos.clamp(-1.0, 1.0)).fill_diagonal_(0.0)
    zero = norms == 0
    angle[zero, :] = 0.0  # the code: a zero gradient is at distance 0 from everything
    angle[:, zero] = 0.0
    return angle


def ward_tree(distances: torch.Tensor):
    """Ward linkage matrix (N - 1 merges) of the rows of the distance matrix (Alg. 2 line 2,
    as the authors' code calls scipy)."""
    from scipy.cluster.hierarchy import ClusterWarning, linkage  # only where CluSamp runs

    with warnings.catch_warnings():
        # scipy warns that a square distance matrix looks like one passed by mistake; here
        # its rows are meant as observations (the authors' call).
        warnings.simplefilter("ignore", ClusterWarning)
        return linkage(distances.numpy(), method="ward")


def tree_cut(tree, weights: list[int], m: int) -> list[list[int]]:
    """Alg. 2's cut: the largest subtrees whose importance is at most 1/m, i.e. whose integer
    weight sum s satisfies m s <= sum(weights); a single client above 1/m is its own group.
    Each group is a sorted client list."""
    n, total = len(weights), sum(weights)
    if n == 1:
        return [[0]]
    members: list[list[int]] = [[i] for i in range(n)]
    mass = list(weights)
    children: list[tuple[int, int]] = []
    for a, b, *_ in tree.tolist():
        a, b = int(a), int(b)
        members.append(sorted(members[a] + members[b]))
        mass.append(mass[a] + mass[b])
        children.append((a, b))
    groups, stack = [], [2 * n - 2]  # from the root down to the subtrees that fit
    while stack:
        node = stack.pop()
        if node < n or m * mass[node] <= total:
            groups.append(members[node])
        else:
            stack.extend(children[node - n])
    return groups


def cluster_distributions(groups: list[list[int]], weights: list[int],
                          m: int) -> list[dict[int, int]]:
    """The m distributions r_k as integer masses {client: mass}, each summing to
    sum(weights), with sum_k r_(k,i) = m w_i (Eq. 6 in integer units)."""
    total = sum(weights)

    def importance(group):  # ties: the group with the smaller client index ranks higher
        return (sum(weights[i] for i in group), -group[0])

    order = sorted(groups, key=importance)  # ascending, as the code's pop_clusters
    fitting = [g for g in order if m * sum(weights[i] for i in g) <= total]
    kept = fitting[len(fitting) - min(m, len(fitting)):]  # the m most important that fit
    rows: list[dict[int, int]] = [{i: m * weights[i] for i in g} for g in kept]
    rows += [{} for _ in range(m - len(rows))]
    kept_ids = {id(g) for g in kept}
    k = 0
    for group in order:  # the rest fill the room left, Algorithm 1's way
        if id(group) in kept_ids:
            continue
        for client in group:
            left = m * weights[client]
            while left > 0:
                if k == m:  # cannot happen: the masses sum to m x the capacity
                    raise AssertionError("clustered sampling: distributions overfilled")
                room = total - sum(rows[k].values())
                if room == 0:
                    k += 1
                    continue
                put = min(room, left)
                rows[k][client] = rows[k].get(client, 0) + put
                left -= put
    return rows


def draw(rows: list[dict[int, int]], total: int, generator: torch.Generator) -> list[int]:
    """One client from each distribution, exactly with probability mass / total."""
    picks = []
    for row in rows:
        u = int(torch.randint(total, (1,), generator=generator))
        for client, mass in sorted(row.items()):
            if u < mass:
                picks.append(client)
                break
            u -= mass
    return picks


def count_sketch(num_coordinates: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed bucket and sign of every coordinate (from the run's seed alone, so they
    are rebuilt identically on resume and never saved)."""
    g = torch_generator(seed, "clusamp-sketch")
    buckets = torch.randint(k, (num_coordinates,), generator=g)
    signs = torch.randint(2, (num_coordinates,), generator=g).float().mul_(2.0).sub_(1.0)
    return buckets, signs


class CluSamp(Strategy):
    """FedAvg with clustered sampling by update similarity (Algorithm 2)."""

    name = "clusamp"
    # The seed-code distance matrix is a "state" ({"matrix": float64 tensor}, None with the
    # paper's full recomputation): the "tensor" kind would restore it as float32, and a
    # resumed run would then cluster from rounded distances.
    checkpointed = {"updates": "tensor", "kept_distances": "state"}
    label = "CluSamp"
    settings = (
        Setting("clusamp_distance", "cosine", "CluSamp: distance between clients' last updates "
                "(cosine: their angle; l1; l2: squared)", choices=("cosine", "l1", "l2"),
                source="Fraboni et al. 2021 Alg. 2 (arccos of the updates)"),
        Setting("clusamp_sketch", 0, "CluSamp: keep a k-number count sketch of each client's "
                "update instead of the whole update (0: whole, the paper; saves memory on "
                "large models)", minimum=0, source="not in the paper: a memory option"),
        Setting("clusamp_aggregation", "draws", "CluSamp: weight of each draw in the new "
                "global model (draws: 1/m each, the paper; samples: the drawn client's sample "
                "count, as the seed code's Aggregation(w_locals, lens))",
                choices=("draws", "samples"),
                source="Fraboni et al. 2021 Eq. 3 (1/m per draw); samples: HMHelloWorld/FedMR "
                       "main_fed.py l.146-160"),
        Setting("clusamp_similarity", "full", "CluSamp: distance matrix the tree is built "
                "from (full: every pair from the current updates each round, the paper; "
                "seed-code: a kept matrix, full at round 1, then each round only the entries "
                "(drawn client, last drawn client), as the seed code)",
                choices=("full", "seed-code"),
                source="Fraboni et al. 2021 Alg. 2; seed-code: HMHelloWorld/FedMR main_fed.py "
                       "l.132-173, utils/clustering.py l.118-130"),
    )

    @classmethod
    def config_problems(cls, config):
        """A count sketch keeps cosine and l2 distances, not l1."""
        if config.clusamp_sketch > 0 and config.clusamp_distance == "l1":
            yield (f"RunConfig.clusamp_sketch={config.clusamp_sketch!r} is invalid: a count "
                   "sketch keeps cosine and l2 distances, not l1")
    default_weighting = "samples"

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        size = sum(t.numel() for n, t in self.global_state.items() if compared(n, t))
        k = self.config.clusamp_sketch
        self.sketch = count_sketch(size, k, self.config.seed) if k > 0 else None
        # The representative gradients: zero until a client is first sampled (the code).
        self.updates = torch.zeros(self.config.num_clients, k if k > 0 else size)
        self.draw_counts: dict[int, int] = {}  # this round's draws per client
        self.picks: list[int] = []  # this round's draws in draw order (r_1's pick first)
        # clusamp_similarity="seed-code": the kept distance matrix, made at the first
        # selection and updated a few entries per round (None until then, and always with
        # "full").
        self.kept_distances: OrderedDict[str, torch.Tensor] | None = None
        self.num_groups = 0  # flat clusters of this round's tree cut (a metric)

    def importance(self, sizes: list[int]) -> list[int]:
        """Integer importance w_i, p_i = w_i / sum_j w_j."""
        if self.config.weighting == "samples":
            return [int(s) for s in sizes]
        return [1] * len(sizes)

    def distributions(self, sizes: list[int], m: int) -> list[dict[int, int]]:
        """This round's r_1..r_m from the current representative gradients."""
        weights = self.importance(sizes)
        distances = self.current_distances()
        groups = tree_cut(ward_tree(distances) if len(weights) > 1 else None, weights, m)
        self.num_groups = len(groups)
        return cluster_distributions(groups, weights, m)

    def select_clients(self, round: int, sizes: list[int], clients_per_round: int,
                       generator: torch.Generator) -> list[int]:
        """One draw from each of the m distributions; repeats counted for the weights."""
        rows = self.distributions(sizes, clients_per_round)
        picks = draw(rows, sum(self.importance(sizes)), generator)
        self.picks = picks  # the seed-code similarity needs the last one
        self.draw_counts = {c: picks.count(c) for c in sorted(set(picks))}
        return sorted(self.draw_counts)

    def current_distances(self) -> torch.Tensor:
        """The distance matrix this round's tree is built from: all pairs from the current
        updates ("full"), or the kept matrix ("seed-code"; the full one at the first round,
        as the code's iter 0)."""
        if self.config.clusamp_similarity == "full":
            return distance_matrix(self.updates, self.config.clusamp_distance)
        if self.kept_distances is None:
            full = distance_matrix(self.updates, self.config.clusamp_distance)
            self.kept_distances = OrderedDict(matrix=full)
        return self.kept_distances["matrix"]

    def update_kept_distances(self, picks: list[int]) -> None:
        """The seed code's update (utils/clustering.py l.118-130): for every draw i in draw
        order, only the entry (i, last drawn client) is recomputed from the new updates; the
        rest of the matrix keeps its values (it becomes asymmetric)."""
        matrix = self.kept_distances["matrix"]
        drawn = sorted(set(picks))
        last = drawn.index(picks[-1])
        pairs = distance_matrix(self.updates[drawn], self.config.clusamp_distance)
        for i in picks:  # a repeat writes the same entry again
            matrix[i, picks[-1]] = pairs[drawn.index(i), last]

    def aggregate(self, round: int, results: list[ClientResult]) -> StateDict:
        """theta <- sum_k theta_(l_k) / m (or sum_k n_(l_k) theta_(l_k) / sum_k n_(l_k) with
        clusamp_aggregation="samples"); then the clients' new representative gradients."""
        counts = [self.draw_counts.get(r.client, 1) for r in results]
        if self.config.clusamp_aggregation == "samples":
            # The seed code's Aggregation(w_locals, lens): n_i for each draw, a repeat twice.
            counts = [c * r.num_samples for c, r in zip(counts, results, strict=True)]
        new = weighted_mean([r.state for r in results], counts)
        for r in results:  # theta_i - theta, theta the model dispatched this round
            update = flat_update(self.global_state, r.state)
            if self.sketch is not None:
                buckets, signs = self.sketch
                update = torch.zeros(self.updates.shape[1]).index_add_(0, buckets,
                                                                       update * signs)
            self.updates[r.client] = update
        if self.config.clusamp_similarity == "seed-code" and self.picks:
            self.update_kept_distances(self.picks)
        self.global_state = new
        return self.global_state

    def round_metrics(self, task) -> dict[str, float]:
        """How many flat clusters the round's tree cut gave."""
        return {"clusters": float(self.num_groups)}

    # ---- checkpoints ------------------------------------------------------------
