"""FedMut (Hu et al., AAAI 2024): clients start from mutants of the global model.

After each aggregation the server keeps g = w_glb(r) - w_glb(r-1) and, next round, gives
each of the K sampled clients w_glb + alpha * v * g, with per-layer balanced signs
v in {1, -1 + beta_t} (Alg. 1-2, eq. 2-5; functions in :mod:`.mutation`).

Decisions where the paper leaves room:

- Round 1 has no g yet, so every client gets the initial model (Alg. 1 l.2).
- t in eq. 5 is not defined in the paper. We follow the official code, whose 0-based
  round counter makes the first mutation use t = 0 (beta_t = beta0): the mutants for
  round r (1-based) use t = r - 2, so beta reaches 0 from round T_b + 2 on.
- "Layer" is every float tensor of the state, BatchNorm running mean/var included, as in
  the official code, which mutates every state_dict entry. A mutated running variance can
  be negative; it is only an estimate (training uses batch statistics) and local training
  pulls it back, so we leave it. Integer buffers are never mutated (the official code
  mutates and truncates them; we copy them).
- Odd K: one mutant is the plain global model (Alg. 2 puts it first, the official code
  last), at a random position: the sampled clients arrive sorted, and a fixed slot would
  always give it to the same client rank.
- Aggregation is the uniform mean (official code), unless ``config.weighting`` says else.
- ``config.mutation="gaussian"`` swaps the sign mutation for a random direction of the
  same per-layer length (used to draw the circle next to FedQP's fan).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from flnotes.algorithms.base import ClientResult, Strategy
from flnotes.algorithms.mutation import beta_schedule, gaussian_mutations, sign_mutations
from flnotes.algorithms.settings import Setting
from flnotes.engine.state import state_sub
from flnotes.rng import torch_generator

StateDict = OrderedDict[str, torch.Tensor]


class FedMut(Strategy):
    """FedAvg whose clients train from stochastic mutants of the global model."""

    name = "fedmut"
    checkpointed = {"previous_state": "state"}
    label = "FedMut"
    default_weighting = "uniform"  # the official code averages with equal weights
    settings = (
        Setting("alpha", 4.0, "FedMut/FedQP mutation range: mutants at w + alpha v g",
                source="FedMut eq. 4; alpha = 4.0 throughout its Table 1", minimum=0),
        Setting("beta0", 0.3, "FedMut/FedQP initial preference beta_0 of the -1 + beta signs",
                source="FedMut eq. 5; 0.3 for CNN and VGG-16 (0.5 ResNet-18)",
                minimum=0, maximum=1),
        Setting("beta_rounds", 50, "FedMut T_b: rounds over which beta decays to 0",
                source="FedMut eq. 5; 50 as the official code's --mut_bound", minimum=1),
        Setting("mutation", "sign", "mutation: sign (FedMut's balanced signs) or gaussian (a "
                "random direction of the same length: the circle beside FedQP's fan)",
                choices=("sign", "gaussian"), source="FedMut Alg. 2 (sign); gaussian: ours"),
    )

    def __init__(self, config, global_state) -> None:
        super().__init__(config, global_state)
        # w_glb(r-1); None until the first aggregation, when there is no g yet.
        self.previous_state: StateDict | None = None

    # ---- mutation -------------------------------------------------------------
    def preference(self, round: int) -> float:
        """beta_t of the mutants dispatched in ``round`` (eq. 5 with t = round - 2)."""
        return beta_schedule(max(round - 2, 0), self.config.beta0, self.config.beta_rounds)

    def update(self) -> StateDict:
        """g = w_glb(r) - w_glb(r-1), the last aggregation's move (Alg. 2 l.1)."""
        if self.previous_state is None:
            raise RuntimeError("no global update before the first aggregation")
        return state_sub(self.global_state, self.previous_state)

    def mutants(self, round: int, num_models: int, update: StateDict) -> list[StateDict]:
        """The ``num_models`` mutated models of a round, drawn from (seed, 'mutation', round)."""
        generator = torch_generator(self.config.seed, "mutation", round)
        if self.config.mutation == "gaussian":
            return gaussian_mutations(self.global_state, update, num_models,
                                      self.config.alpha, generator)
        return sign_mutations(self.global_state, update, num_models, self.config.alpha,
                              self.preference(round), generator)

    # ---- one round ------------------------------------------------------------
    def dispatch(self, round: int, clients: list[int]) -> list[StateDict]:
        """Round 1: the initial model for all (Alg. 1 l.2); then one mutant per client."""
        if self.previous_state is None:
            return [self.global_state for _ in clients]
        return self.mutants(round, len(clients), self.update())

    def aggregate(self, round: int, results: list[ClientResult]) -> StateDict:
        """Mean of the local models (Alg. 1 l.8); the old global is kept for g."""
        self.previous_state = self.global_state
        self.global_state = self.average(results)
        return self.global_state

    # ---- checkpoints ------------------------------------------------------------
