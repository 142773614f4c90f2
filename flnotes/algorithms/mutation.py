"""Pure mutation functions of FedMut and FedQP, written over states (name -> tensor).

FedMut (Hu et al., AAAI 2024) sends every sampled client a *mutant* of the global model:
each layer moves by ``alpha * v * g``, where ``g`` is the layer's last global update and
``v`` is +1 or -1 + beta (eq. 2 and 5). FedQP (Weng et al., SEKE 2024) then, with
probability p per layer, projects the layer's mutation onto the half-space of directions
that agree with ``g`` (its QP, eq. 2-5). Nothing here keeps state or touches the global
RNG: every random draw comes from the ``generator`` argument, so the toy notebooks can
call the same functions the strategies call.

``layerwise=False`` treats all float layers as one vector. The strategies never use it
(both papers mutate per layer); it is what a 2-parameter toy state with two 0-dim layers
needs to draw the textbook circle (Gaussian) and fan (Gaussian + projection) instead of
the per-coordinate corners and half-lines that per-layer mutation gives in 2-D.

Integer layers (``num_batches_tracked``) are copied from the global state unchanged.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import torch

from flnotes.engine.state import StateLike, float_layer_names, is_float_layer

State = OrderedDict[str, torch.Tensor]


def beta_schedule(round: int, beta0: float, beta_rounds: int) -> float:
    """FedMut eq. 5: beta_t = max(beta0 * (1 - t / T_b), 0) with t = ``round`` (t >= 0)."""
    if round < 0:
        raise ValueError(f"beta_schedule needs t >= 0, got {round}")
    if beta_rounds < 1:
        raise ValueError(f"beta_rounds (T_b) must be a positive integer, got {beta_rounds}")
    return max(beta0 * (1.0 - round / beta_rounds), 0.0)


def _layer_groups(state: StateLike, layerwise: bool) -> list[list[str]]:
    """The float layers mutated together: one per group, or all of them as one group."""
    names = float_layer_names(state)
    return [[n] for n in names] if layerwise else [names]


def _check_update(global_state: StateLike, update: StateLike) -> None:
    missing = [n for n in float_layer_names(global_state) if n not in update]
    if missing:
        raise ValueError(f"the update has no entry for float layer(s) {missing}")


def _moved(global_state: StateLike, steps: dict[str, torch.Tensor]) -> State:
    """global + step on the layers in ``steps``; every other layer is a copy of the global."""
    return OrderedDict(
        (n, t + steps[n] if n in steps else t.clone()) for n, t in global_state.items()
    )


def sign_mutations(
    global_state: StateLike,
    update: StateLike,
    num_models: int,
    alpha: float,
    beta: float,
    generator: torch.Generator,
    *,
    layerwise: bool = True,
) -> list[State]:
    """FedMut Alg. 2: ``num_models`` mutants w + alpha * v * g with balanced shuffled signs.

    Per layer the signs are floor(K/2) times +1 and floor(K/2) times -1 + beta, shuffled
    independently per layer (Alg. 2 l.7-11, eq. 4). For odd K one model is the plain global
    one (Alg. 2 l.3-5 puts it first, the official code last), at a random position drawn
    after the signs: the sampled clients arrive sorted, so a fixed position would always
    hand it to the highest-numbered client, where the paper's client list is in random order.
    """
    _check_update(global_state, update)
    pairs = num_models // 2
    signs = torch.tensor([1.0] * pairs + [-1.0 + beta] * pairs, dtype=torch.float64)
    coeffs: dict[str, list[float]] = {}
    for group in _layer_groups(global_state, layerwise):
        # One permutation per layer, drawn in state order so a seed fixes every sign.
        v = signs[torch.randperm(2 * pairs, generator=generator)].tolist()
        for name in group:
            coeffs[name] = v
    mutants = [
        _moved(global_state, {n: (alpha * v[i]) * update[n] for n, v in coeffs.items()})
        for i in range(2 * pairs)
    ]
    if num_models % 2 == 1:
        position = int(torch.randint(num_models, (1,), generator=generator))
        mutants.insert(position, _moved(global_state, {}))
    return mutants


def gaussian_mutations(
    global_state: StateLike,
    update: StateLike,
    num_models: int,
    alpha: float,
    generator: torch.Generator,
    *,
    layerwise: bool = True,
) -> list[State]:
    """``num_models`` mutants w + m, m a uniformly random direction of norm alpha * ||g_layer||.

    Not in either paper: the 'gaussian' option, whose mutants fill the sphere
    (the circle in 2-D) that FedMut's signs only sample at its corners. Every mutant is
    random (no plain global model for odd K) and beta is not used.
    """
    _check_update(global_state, update)
    groups = _layer_groups(global_state, layerwise)
    radii = [alpha * math.sqrt(sum(float(update[n].double().pow(2).sum()) for n in group))
             for group in groups]
    mutants = []
    for _ in range(num_models):
        steps: dict[str, torch.Tensor] = {}
        for group, radius in zip(groups, radii, strict=True):
            # A standard normal vector, normalised, is uniform on the unit sphere.
            draws = [torch.randn(global_state[n].shape, generator=generator, dtype=torch.float64)
                     for n in group]
            norm = math.sqrt(sum(float(d.pow(2).sum()) for d in draws))
            scale = radius / norm if norm > 0 else 0.0
            for name, d in zip(group, draws, strict=True):
                ref = global_state[name]
                steps[name] = (d * scale).to(device=ref.device, dtype=ref.dtype)
        mutants.append(_moved(global_state, steps))
    return mutants


def halfspace_multiplier(dot: torch.Tensor, g_sq: torch.Tensor) -> torch.Tensor:
    """FedQP eq. 5's minimiser lambda* = max(0, -<m, g> / ||g||^2); 0 when g = 0 (no NaN)."""
    positive = g_sq > 0
    safe = torch.where(positive, g_sq, torch.ones_like(g_sq))
    return torch.where(positive, (-dot / safe).clamp_min(0), torch.zeros_like(dot))


def project_halfspace(m: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The point of {x : <x, g> >= 0} nearest to m: m + max(0, -<m,g>/||g||^2) g (FedQP eq. 4).

    FedQP eq. 2 asks for argmin ||x - m||^2 subject to <x, g> >= 0. Its Lagrangian gives
    x = m + lambda g (eq. 4) and the one-dimensional dual min_{lambda >= 0}
    lambda^2 ||g||^2 / 2 + lambda <m, g> (eq. 5), solved by lambda* above; a single linear
    constraint needs no QP solver. If g = 0 every x is feasible and m is returned.
    """
    lam = halfspace_multiplier((m * g).sum(), (g * g).sum())
    return m + lam * g


def project_mutants(
    global_state: StateLike,
    mutants: Sequence[StateLike],
    update: StateLike,
    prob: float,
    generator: torch.Generator,
    *,
    layerwise: bool = True,
) -> list[State]:
    """FedQP Alg. 1 l.13-18: with probability ``prob`` per mutant and layer, project its mutation.

    The mutation is m = mutant - global; a projected layer becomes global + proj(m), computed
    as mutant + lambda* g so that layers already in the half-space keep their exact values.
    One uniform draw per (mutant, layer), mutants in order, layers in state order.
    """
    _check_update(global_state, update)
    groups = _layer_groups(global_state, layerwise)
    draws = torch.rand(len(mutants), len(groups), generator=generator, dtype=torch.float64)
    projected = []
    for mutant, row in zip(mutants, draws.tolist(), strict=True):
        new = OrderedDict(mutant.items())  # layers left alone keep their tensors
        for group, u in zip(groups, row, strict=True):
            if not group or not u < prob:
                continue
            diffs = {n: mutant[n] - global_state[n] for n in group}
            dot = sum((diffs[n] * update[n]).sum() for n in group)
            g_sq = sum((update[n] * update[n]).sum() for n in group)
            lam = halfspace_multiplier(dot, g_sq)
            for name in group:
                new[name] = mutant[name] + lam.to(mutant[name].dtype) * update[name]
        projected.append(new)
    return projected


def mutation_coefficients(
    global_state: StateLike, mutant: StateLike, update: StateLike
) -> dict[str, float]:
    """Per float layer, the c with mutant ~ global + c * g (least squares; nan where g = 0).

    For a FedMut mutant c = alpha * v, so dividing by alpha recovers the layer's sign.
    """
    out = {}
    for name, t in global_state.items():
        if not is_float_layer(t):
            continue
        g = update[name].double()
        g_sq = float((g * g).sum())
        diff = (mutant[name].double() - t.double())
        out[name] = float((diff * g).sum()) / g_sq if g_sq > 0 else float("nan")
    return out
