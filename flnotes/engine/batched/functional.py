"""Drop-in modules that make a model trainable under ``torch.func.vmap``, same parameter names.

``vmap_ready(model)`` returns a copy of a model in which

- every ``nn.LSTM`` is a hand-written LSTM (nn.LSTM's fused kernel has no vmap rule), over
  the same parameters ``weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ...``;
- every BatchNorm normalises with the statistics of the *real* rows of a padded batch and
  writes no buffer: in-place running-stat updates are not allowed inside vmap, so it hands
  the batch mean and unbiased variance to a :class:`StepContext`, and the caller updates
  the running buffers exactly as ``nn.BatchNorm`` would (:func:`running_stat_updates`).

Because names are unchanged, ``torch.func.functional_call`` takes the stacked state of the
original model as it is.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class StepContext:
    """Per-call scratch shared by the patched modules: row mask in, BatchNorm stats out."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None  # (B,) 1.0 for real rows, 0.0 for padding
        self.min_rows = 2  # fewest real rows of any model in this step (a CPU int)
        self.stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (mean, var)


class StatBatchNorm(nn.Module):
    """BatchNorm in train mode that reports its batch statistics instead of updating buffers."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, name: str, ctx: StepContext) -> None:
        super().__init__()
        self.name, self.ctx = name, ctx
        self.eps, self.bn_momentum = bn.eps, bn.momentum
        self.weight, self.bias = bn.weight, bn.bias  # same Parameters: same names
        for buffer in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(buffer, getattr(bn, buffer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise x (B, C, *spatial) over its real rows; record (mean, unbiased var)."""
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)  # broadcast a (C,) vector over x
        mask = self.ctx.mask
        if self.ctx.min_rows * x[0, 0].numel() == 1:  # as nn.BatchNorm: no variance of 1 value
            raise ValueError(f"Expected more than 1 value per channel when training, got a "
                             f"batch of 1 row of shape {tuple(x.shape[1:])} at {self.name}")
        # Hand-written normalisation over two-pass statistics, for full and padded batches
        # alike. (F.batch_norm under vmap once gave a float32 gradient 2% off where this and
        # nn.BatchNorm agreed; we could not reduce it to a standalone case, so we avoid it.)
        if mask is None:  # a full batch
            var_b, mean = torch.var_mean(x, dim=dims, correction=0)
            count = x.numel() // x.shape[1]  # rows x spatial positions
        else:  # a padded short batch: statistics of the real rows only
            real = mask.reshape([-1] + [1] * (x.dim() - 1)) > 0
            count = mask.sum() * (x[0, 0].numel())  # real rows x spatial positions
            # Padding rows enter as zeros, so they stay finite however deep the net is (and
            # can never turn a statistic into NaN); they get no gradient.
            x = torch.where(real, x, 0.0)
            mean = x.sum(dims) / count
            centred = torch.where(real, x - mean.reshape(shape), 0.0)
            var_b = (centred * centred).sum(dims) / count
        out = (x - mean.reshape(shape)) * torch.rsqrt(var_b + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        # Biased variance normalises; the unbiased one goes into running_var (as nn.BatchNorm).
        mean, var = mean.detach(), var_b.detach() * count / (count - 1)
        if self.running_mean is not None:
            self.ctx.stats[self.name] = (mean, var)
        return out


class VmapLSTM(nn.Module):
    """Multi-layer unidirectional LSTM written with plain tensor ops (gate order i, f, g, o)."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        if lstm.bidirectional or lstm.proj_size or (lstm.dropout and lstm.num_layers > 1):
            raise ValueError("VmapLSTM supports unidirectional LSTMs without proj or dropout")
        self.num_layers, self.hidden_size = lstm.num_layers, lstm.hidden_size
        self.batch_first, self.has_bias = lstm.batch_first, lstm.bias
        for name, p in lstm.named_parameters():  # weight_ih_l0, weight_hh_l0, bias_ih_l0, ...
            self.register_parameter(name, p)

    def forward(self, x: torch.Tensor, hx=None):
        """(B, L, in) if batch_first else (L, B, in) -> (output, (h_n, c_n)) like nn.LSTM."""
        if hx is not None:
            raise ValueError("VmapLSTM starts from zero states only")
        seq = x if self.batch_first else x.transpose(0, 1)  # (B, L, in)
        h_last, c_last = [], []
        for layer in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}")
            # Input projection of every time step at once; only h @ W_hh is sequential.
            gates_x = seq @ w_ih.T  # (B, L, 4H)
            if self.has_bias:
                gates_x = gates_x + getattr(self, f"bias_ih_l{layer}")
                gates_x = gates_x + getattr(self, f"bias_hh_l{layer}")
            h = c = seq.new_zeros(seq.shape[0], self.hidden_size)
            outputs = []
            # unbind, not gates_x[:, t]: each indexing's backward would zero-fill a whole
            # (B, L, 4H) gradient for one time step (L of them: 60% of an LSTM step's time);
            # unbind's backward is one stack.
            for gates_t in gates_x.unbind(1):
                gates = gates_t + h @ w_hh.T  # (B, 4H)
                # One sigmoid over all four gates (g's share is unused): fewer kernels.
                i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
                g = torch.tanh(gates[:, 2 * self.hidden_size : 3 * self.hidden_size])
                c = f * c + i * g
                h = o * torch.tanh(c)
                outputs.append(h)
            seq = torch.stack(outputs, dim=1)
            h_last.append(h)
            c_last.append(c)
        out = seq if self.batch_first else seq.transpose(0, 1)
        return out, (torch.stack(h_last), torch.stack(c_last))


def vmap_ready(model: nn.Module, ctx: StepContext) -> nn.Module:
    """A copy of ``model`` with BatchNorm and LSTM modules swapped for vmap-safe ones."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            _set_module(model, name, StatBatchNorm(module, name, ctx))
        elif isinstance(module, nn.LSTM):
            _set_module(model, name, VmapLSTM(module))
        elif isinstance(module, nn.RNNBase):
            raise ValueError(f"{type(module).__name__} at {name!r} has no vmap version")
    return model


def _set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


def running_stat_updates(running_mean: torch.Tensor, running_var: torch.Tensor,
                         tracked: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                         momentum: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.BatchNorm's buffer update for (K, C) stacked buffers; ``tracked`` already counts it.
    Momentum None: a cumulative average, factor 1 / num_batches_tracked per model."""
    factor = momentum if momentum is not None else (1.0 / tracked.to(mean.dtype)).reshape(-1, 1)
    return (1 - factor) * running_mean + factor * mean, (1 - factor) * running_var + factor * var
