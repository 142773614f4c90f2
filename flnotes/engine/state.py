"""Model state as an ordered mapping of layer name -> tensor, and the arithmetic on it.

Every algorithm is written over states, so the same code runs on a 2-parameter toy
model and on a ResNet. "Layer" means one entry of a ``state_dict``.
Integer buffers (BatchNorm's ``num_batches_tracked``) are never mixed: they are copied
from the first state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

State = "OrderedDict[str, torch.Tensor]"
StateLike = Mapping[str, torch.Tensor]


def is_float_layer(tensor: torch.Tensor) -> bool:
    """True for floating-point layers, the only ones algorithms mix or mutate."""
    return torch.is_floating_point(tensor)


def clone_state(state: StateLike) -> OrderedDict[str, torch.Tensor]:
    """A deep copy of a state, detached from any autograd graph."""
    return OrderedDict((name, t.detach().clone()) for name, t in state.items())


def float_layer_names(state: StateLike) -> list[str]:
    """Names of the floating-point layers, in state order."""
    return [name for name, t in state.items() if is_float_layer(t)]


def classifier_head(state: StateLike) -> str | None:
    """The module name of a state's classifier head: its last 2-D ``*.weight`` (None: none).

    The registry's models create their parameters in forward order and end in one linear
    layer (tests/test_fedgen.py checks each), so that layer is the last matrix of the state.
    """
    heads = [k[: -len(".weight")] for k, v in state.items()
             if k.endswith(".weight") and v.dim() == 2]
    return heads[-1] if heads else None


def state_sub(a: StateLike, b: StateLike) -> OrderedDict[str, torch.Tensor]:
    """a - b on float layers; integer layers are taken from a."""
    return OrderedDict(
        (n, a[n] - b[n] if is_float_layer(a[n]) else a[n].clone()) for n in a
    )


def state_add(a: StateLike, b: StateLike, scale: float = 1.0) -> OrderedDict[str, torch.Tensor]:
    """a + scale * b on float layers; integer layers are taken from a."""
    return OrderedDict(
        (n, a[n] + scale * b[n] if is_float_layer(a[n]) else a[n].clone()) for n in a
    )


def weighted_mean(
    states: Sequence[StateLike], weights: Sequence[float] | None = None
) -> OrderedDict[str, torch.Tensor]:
    """Weighted mean of float layers (weights normalised to sum 1); integers from states[0]."""
    if not states:
        raise ValueError("weighted_mean needs at least one state")
    if weights is None:
        weights = [1.0] * len(states)
    if len(weights) != len(states):
        raise ValueError(f"got {len(states)} states but {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    coeffs = [float(w) / total for w in weights]
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    on_device = {}  # the weights copied once per (dtype, device), not once per layer
    for name, first in states[0].items():
        if is_float_layer(first):
            stacked = torch.stack([s[name] for s in states])  # (K, *layer_shape)
            where = (first.dtype, first.device)
            if where not in on_device:
                on_device[where] = torch.tensor(coeffs, dtype=first.dtype, device=first.device)
            out[name] = torch.tensordot(on_device[where], stacked, dims=1)
        else:
            out[name] = first.clone()
    return out


def states_allclose(a: StateLike, b: StateLike, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """True when two states have the same layers and all tensors are close."""
    if list(a) != list(b):
        return False
    return all(torch.allclose(a[n].float(), b[n].float(), rtol=rtol, atol=atol) for n in a)


def state_is_finite(state: StateLike) -> bool:
    """False if any float layer holds NaN or inf (a diverged model)."""
    checks = [torch.isfinite(t).all() for t in state.values() if is_float_layer(t)]
    # One reduction and one transfer, not one device sync per layer (it runs every round).
    return bool(torch.stack(checks).all()) if checks else True
