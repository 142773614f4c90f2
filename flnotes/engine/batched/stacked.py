"""Train a stack of client models: one batched SGD step over K clients, optionally compiled.

A step's gradients come from vmap over the clients, or, where the task computes every
lane's loss at once (``Task.stacked_losses``: the toy) and the objective has no penalty,
from one backward pass of the lanes' summed losses. SAM's step (FedSAM, FedASAM) takes two
gradient passes, the second at the ascent point (``Strategy.stacked_ascent``).

Every step runs the K clients (lanes) of a stack on a (K, B) batch with

- a row mask, 1.0 on real rows, that the loss and the BatchNorm statistics respect
  (a short last batch is padded with the client's own rows);
- a client mask, 1.0 while the client still has steps, that freezes finished clients:
  their weights and BatchNorm buffers keep their values, so each client does exactly the
  steps it would do alone.

Lanes are sorted by their number of steps, so the lanes still training are a prefix.
Eagerly (``compile="off"``) finished lanes leave the stack as soon as they finish. With
``compile`` set the stack keeps its shape (finished lanes frozen by the mask): a round is
then T calls of one function on tensors of the same shapes, so torch.compile compiles it
once per run (the step is cached on the Task) and, with ``compile="reduce-overhead"`` on a
GPU, CUDA graphs replay it without Python in the loop.

A lane is one client's (data, batch-order generator); the lanes of a stack may come from
several runs (:mod:`flnotes.engine.seeds`), and a lane may train several models (FML's meme and
personal model, ``prefixes``). Results equal the loop backend's to float tolerance
(tests/test_train_stacked.py, tests/test_vmap.py).

Assumption: every parameter gets a gradient (true of every model in the registry).
torch.optim.SGD skips a parameter whose gradient is None; torch.func.grad returns zeros,
so with weight decay such a parameter would still decay here.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.func import functional_call, grad_and_value, vmap
from tqdm.auto import tqdm

from flnotes.algorithms.base import ClientResult
from flnotes.engine.batched.functional import (
    StatBatchNorm,
    StepContext,
    running_stat_updates,
    vmap_ready,
)
from flnotes.engine.batched.schedule import build_schedule, masked_loss, step_means
from flnotes.engine.train import client_generator, train_clients_loop
from flnotes.messages import fallback_warning


def supervised_objective(loss_fn: Callable, penalty: Callable | None) -> Callable:
    """The objective of every method but FML: loss on the batch + the strategy's penalty."""

    def objective(forward, params, anchor, xb, yb, mask):
        loss = masked_loss(loss_fn, forward("", xb), yb, mask)
        extra = penalty(params, anchor) if penalty is not None else None
        return (loss if extra is None else loss + extra), loss.detach()[None]

    return objective


def train_supervised(groups: list[tuple], round: int) -> list[list[ClientResult]]:
    """Train groups of (task, strategy, config, clients, starts) as one stack of clients.

    One group is a round of one run (the vmap backend); several are the same round of
    several seeds of one config (flnotes.engine.seeds), whose first strategy's objective serves
    all: each lane brings its own data, batch order and penalty anchor.
    """
    settings = [(g[2].lr, g[2].momentum, g[2].weight_decay) for g in groups]
    if len(set(settings)) > 1:
        # The step is built for one learning rate: seeds whose rounds' rates differ (a
        # resumed seed of FedSAM+SWA keeps the schedule it began with) train in one stack
        # per rate.
        out = [None] * len(groups)
        for setting in dict.fromkeys(settings):
            chosen = [i for i, s in enumerate(settings) if s == setting]
            for i, results in zip(chosen, train_supervised([groups[i] for i in chosen], round),
                                  strict=True):
                out[i] = results
        return out
    task, strategy, config = groups[0][:3]
    if not stacks(strategy):  # FedNTD, FedGen: their groups train on the reference loop
        return [train_clients_loop(*group[:2], round, group[3], group[4], group[2])
                for group in groups]
    penalty = strategy.local_penalty if strategy.has_penalty else None
    lanes, starts, anchors = [], [], []
    for group_task, group_strategy, group_config, clients, group_starts in groups:
        lanes += client_lanes(group_task, group_config, round, clients)
        starts += group_starts
        anchors += [group_strategy.penalty_anchor(s, c)
                    for s, c in zip(group_starts, clients, strict=True)]
    states, means = train_stacked(
        task, lanes, {"": starts}, config, ("supervised", strategy),
        lambda: supervised_objective(task.loss_fn, penalty),
        anchors=anchors if penalty is not None else None,
        ascent=strategy.stacked_ascent if strategy.has_local_gradient else None,
        # the task's losses of a whole stack are the objective only without a penalty
        stacked_losses=task.stacked_losses if penalty is None else None)
    out, lane = [], 0
    for group_task, _, _, clients, _ in groups:
        out.append([ClientResult(c, states[""][lane + k], group_task.num_samples(c),
                                 means[lane + k][0]) for k, c in enumerate(clients)])
        lane += len(clients)
    return out


_NOTED: set[str] = set()  # strategies whose fall-back to the loop was already announced


def trains_in_stack(strategy) -> bool:
    """Whether the stacked step can train this strategy's clients (a strategy or its class).

    It takes a second gradient pass per step only for an ascent it can compute for the
    whole stack (``Strategy.stacked_ascent``: FedSAM's and FedASAM's, not another
    ``local_gradient``), and has neither a teacher model (``Strategy.teacher_loss``, FedNTD)
    nor a term from the live model (``Strategy.batch_loss``, FedGen).
    """
    return not (strategy.has_teacher or strategy.has_batch_loss) and (
        not strategy.has_local_gradient or strategy.stacked_ascent is not None)


def stacks(strategy) -> bool:
    """Whether the stack trains this strategy's clients (:func:`trains_in_stack`); if not,
    say once that the loop backend does (whose results the stack would only reproduce)."""
    if trains_in_stack(strategy):
        return True
    why = strategy.loop_reason or "has no batched training step"
    if strategy.name not in _NOTED and fallback_warning(
            f"flnotes: {strategy.name} {why}; its clients train on the loop backend (the "
            "reference, same results)", stacklevel=3):
        _NOTED.add(strategy.name)  # once a process: said, not merely expected by a race
    return False


def client_lanes(task, config, round: int, clients: list[int]) -> list[tuple]:
    """(x, y, batch-order generator) of each client: what one lane of the stack trains on."""
    return [(*task.client_data(c), client_generator(config, round, c)) for c in clients]


def train_stacked(task, lanes: list[tuple], starts: dict[str, list], config, key: tuple,
                  make_objective: Callable[[], Callable], *, anchors: list[dict] | None = None,
                  shrink: bool | None = None, ascent: Callable | None = None,
                  stacked_losses: Callable | None = None,
                  ) -> tuple[dict[str, list[OrderedDict]], list[list[float]]]:
    """Train K lanes (clients), each with one model per prefix of ``starts``, in one stack.

    ``lanes`` holds each client's (x, y, generator) (:func:`client_lanes`; several runs'
    clients may share a stack, :mod:`flnotes.engine.seeds`). ``starts`` maps a prefix ("" for one
    model; FML: "meme." and "personal.") to the K start states. ``make_objective()`` gives
    ``objective(forward, params, anchor, xb, yb, mask) -> (total loss, reported values)``,
    where ``forward(prefix, x)`` runs that model. Returns the trained states per prefix and,
    per lane, the mean of each reported value over its steps. ``task`` gives the model and
    keeps the step, built (and compiled) once per ``key`` and shape; a key holds the objects
    the objective depends on (the strategy itself, never its id, which Python reuses).
    ``anchors``: each lane's ``penalty_anchor`` (None: the objective has no penalty).
    ``shrink``: whether finished lanes leave the stack (default: only when not compiling).
    ``ascent``: a strategy's ``stacked_ascent`` (SAM): each step applies the gradient at
    the parameters plus the ascent's offsets (a second pass), from the parameters.
    ``stacked_losses``: the task's (``Task.stacked_losses``), where it is the objective: the
    step then takes the lanes' gradients without vmap.
    """
    step, model, ctx = _cached_step(task, config, len(lanes), tuple(starts), key,
                                    make_objective, ascent, stacked_losses)
    # Most samples (so most steps) first: the lanes still training are always a prefix.
    order = sorted(range(len(lanes)), key=lambda i: -len(lanes[i][1]))
    lanes = [lanes[i] for i in order]
    starts = {prefix: [group[i] for i in order] for prefix, group in starts.items()}
    anchors = [anchors[i] for i in order] if anchors else None
    names = list(model.state_dict().keys())
    param_names = {n for n, _ in model.named_parameters()}
    device = next(iter(model.state_dict().values())).device
    stack = {prefix + n: torch.stack([s[n] for s in group]).to(device)
             for prefix, group in starts.items() for n in names}
    params = {n: t for n, t in stack.items() if _unprefixed(n, starts) in param_names}
    buffers = {n: t for n, t in stack.items() if n not in params}
    # What the local penalty (FedProx, FedUp) measures each lane against; unused otherwise.
    # An anchor entry that is the lanes' start tensors reuses their stack (steps never
    # change a tensor in place), so FedProx keeps no third copy of the start models.
    anchor = {}
    for n in anchors[0] if anchors else ():
        if n in buffers:
            continue  # penalties measure trainable parameters only
        shared = "" in starts and n in stack and all(
            a[n] is s[n] for a, s in zip(anchors, starts[""], strict=True))
        anchor[n] = stack[n] if shared else torch.stack([a[n] for a in anchors]).to(device)
        if shared and n in params:
            # The first step's own copy: a compiled step is specialised on its inputs not
            # aliasing each other, and from the second step on they do not.
            params[n] = params[n].clone()
    del stack  # params and buffers are replaced after the first step
    # SGD without momentum keeps no buffers (the step never reads them).
    momentum_bufs = ({n: torch.zeros_like(p) for n, p in params.items()}
                     if config.momentum != 0 else {})

    xs, ys, generators = zip(*lanes, strict=True)
    x_all, y_all = torch.cat(xs).to(device), torch.cat(ys).to(device)
    counts = [len(y) for y in ys]
    schedule = build_schedule(counts, [sum(counts[:k]) for k in range(len(counts))],
                              config.local_epochs, config.batch_size, generators)
    total_steps = max(schedule.steps, default=0)
    # Fewest real rows of any step any client takes: nn.BatchNorm refuses a 1-row batch.
    # StatBatchNorm checks it at trace time, so a round with a 1-row batch compiles a second
    # variant of the step (once; both stay cached).
    ctx.min_rows = min(2, int(schedule.sizes[schedule.sizes > 0].min())) if total_steps else 2
    rows = schedule.rows.to(device)
    real = torch.arange(config.batch_size) < schedule.sizes[..., None]  # (K, T, B)
    # A finished client trains on (frozen) full batches of its own rows: no empty batch,
    # so no 0/0 anywhere, even in the results that the client mask throws away.
    row_masks = torch.where((schedule.sizes == 0)[..., None], True, real).float().to(device)
    active = (schedule.sizes > 0).float().to(device)  # (K, T)
    reported = None  # (K, T, R) once the first step tells R
    shrink = config.compile == "off" if shrink is None else shrink
    width, finished = len(lanes), []  # finished: states of lanes that left, latest last

    for t in range(total_steps):
        if shrink and schedule.active(t) < width:
            new_width = schedule.active(t)
            # Copies, not views: a view would keep this step's whole stack alive.
            finished.append({n: v[new_width:width].clone()
                             for n, v in {**params, **buffers}.items()})
            params, buffers, anchor, momentum_bufs = (
                {n: v[:new_width] for n, v in d.items()}
                for d in (params, buffers, anchor, momentum_bufs))
            width = new_width
        # The gather stays outside the step: the round's data (x_all) changes size with the
        # sampled clients, and a compiled step must only ever see the same shapes.
        step_rows = rows[:width, t]
        row_mask = row_masks[:width, t].contiguous()
        if shrink and bool((schedule.sizes[:width, t] == config.batch_size).all()):
            # Every batch full (checked on the CPU: no sync): no mask, so the loss and
            # BatchNorm take their plain, cheaper form. A compiled step keeps one form.
            row_mask = None
        params, buffers, momentum_bufs, values = step(
            params, buffers, anchor, momentum_bufs, x_all[step_rows], y_all[step_rows],
            row_mask, active[:width, t].contiguous())
        if reported is None:
            reported = values.new_zeros(len(lanes), total_steps, values.shape[1])
        reported[:width, t] = values

    del anchor, momentum_bufs
    # Lanes in stack order: those still there, then each group that left, latest first.
    # Each lane's tensors are cloned out of its part (no concatenation, one copy): a clone
    # owns its memory, and a compiled step's CUDA graph overwrites its outputs next replay.
    parts = [{**params, **buffers}, *reversed(finished)]
    located = [(part, row) for part in parts for row in range(len(next(iter(part.values()))))]
    means = step_means(reported, schedule.steps)
    place = {lane: k for k, lane in enumerate(order)}  # caller's index -> stack position
    states = {prefix: [OrderedDict((n, located[place[i]][0][prefix + n]
                                    [located[place[i]][1]].detach().clone()) for n in names)
                       for i in range(len(lanes))] for prefix in starts}
    return states, [means[place[i]] for i in range(len(lanes))]


def _unprefixed(name: str, starts: dict) -> str:
    """The model's own name of a stacked tensor (the prefix taken off)."""
    for prefix in starts:
        if prefix and name.startswith(prefix):
            return name[len(prefix):]
    return name


def _cached_step(task, config, num_clients: int, prefixes: tuple, key: tuple, make_objective,
                 ascent: Callable | None = None, stacked_losses: Callable | None = None):
    """The (compiled) step for this task, objective and setting, built on first use (the key
    holds the strategy, whose ``ascent`` it is; the cache is the task's, whose
    ``stacked_losses`` it is)."""
    full_key = ("stacked-step", *key, num_clients, prefixes, config.compile, config.lr,
                config.momentum, config.weight_decay, config.batch_size)
    if full_key not in (cache := task.backend_cache):
        ctx = StepContext()
        model = vmap_ready(task.model_factory(), ctx).train()
        step = make_step(model, ctx, make_objective(), prefixes, lr=config.lr, ascent=ascent,
                         momentum=config.momentum, weight_decay=config.weight_decay,
                         stacked_losses=stacked_losses)
        if config.compile != "off":
            # The first call compiles: 20 s (CNN) to 4 min (LSTM) on a 2-core CPU.
            tqdm.write(f"flnotes: compiling the training step of {num_clients} clients "
                       f"(torch.compile mode {config.compile!r}; once per run)")
            step = torch.compile(_own_code(step), mode=config.compile, dynamic=False)
        cache[full_key] = (step, model, ctx)
    return cache[full_key]


def _own_code(fn: Callable) -> Callable:
    """fn with a code object of its own.

    torch.compile caches compiled graphs per code object, and every step that make_step
    builds shares one; each setting (lr, penalty, ...) would be one more entry under it,
    and past torch._dynamo's recompile limit (8) later runs would silently train uncompiled.
    """
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def make_step(model: torch.nn.Module, ctx: StepContext, objective: Callable,
              prefixes: tuple[str, ...] = ("",), *, lr: float, momentum: float,
              weight_decay: float, ascent: Callable | None = None,
              stacked_losses: Callable | None = None) -> Callable:
    """A pure function: one SGD step of K stacked clients, with row and client masks.

    With ``ascent`` (SAM: a strategy's ``stacked_ascent``) the step takes the gradient at
    the parameters, the offsets e = ascent(params, gradient), and applies the gradient at
    params + e from params (as ``Strategy.local_gradient`` on the loop); the loss reported is
    the first pass's, and BatchNorm's running statistics move once per pass, as the loop's
    two forward passes move them. With ``stacked_losses`` (the objective, computed for the
    whole stack at once) and a model of one prefix without BatchNorm, the gradients come
    from one backward pass of the lanes' summed losses instead of vmap.
    """
    bn_modules = {n: m for n, m in model.named_modules() if isinstance(m, StatBatchNorm)}

    def client_loss(params, buffers, anchor, xb, yb, mask):
        """One client's objective on its batch (under vmap: one client, one batch)."""
        stats = {}

        def forward(prefix: str, x: torch.Tensor) -> torch.Tensor:
            """The client's model ``prefix`` on x; its BatchNorm statistics go to stats."""
            ctx.mask, ctx.stats = mask, {}
            own = {n[len(prefix):]: t for n, t in params.items() if n.startswith(prefix)}
            own_buffers = {n[len(prefix):]: t for n, t in buffers.items() if n.startswith(prefix)}
            out = functional_call(model, (own, own_buffers), (x,))
            stats.update({(prefix, name): value for name, value in ctx.stats.items()})
            ctx.mask, ctx.stats = None, {}
            return out

        total, reported = objective(forward, params, anchor, xb, yb, mask)
        return total, (reported, stats)

    grad_fn = grad_and_value(client_loss, has_aux=True)
    per_client_grads = vmap(grad_fn)
    full_batch_grads = vmap(grad_fn, in_dims=(0, 0, 0, 0, 0, None))  # row_mask None
    if bn_modules or prefixes != ("",):
        stacked_losses = None

    def summed_grads(params, buffers, anchor, xb, yb, mask):
        """Every lane's gradient from one backward pass of the sum of the lanes' losses,
        which the task computes for the whole stack at once (the toy: a step is then a few
        small tensor ops, not vmap's fixed cost). Lanes share no parameter, so the sum's
        gradient is each lane's own, as vmap's (tests/test_toy.py compares them)."""
        with torch.enable_grad():
            leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
            losses = stacked_losses(leaves, xb, yb, mask)  # (K,)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), (None, (losses.detach()[:, None], {}))

    def step(params, buffers, anchor, momentum_bufs, xb, yb, row_mask, active):
        """(params, buffers, momentum buffers, reported values) after one step on (K, B) rows.

        ``row_mask`` None: every batch is full.
        """
        grads_of = (summed_grads if stacked_losses is not None
                    else per_client_grads if row_mask is not None else full_batch_grads)
        grads, (_, (reported, stats)) = grads_of(params, buffers, anchor, xb, yb, row_mask)
        passes = [stats]
        if ascent is not None:  # SAM: the gradient at params + e replaces the gradient
            offsets = ascent(params, grads)
            shifted = {n: p + offsets[n] if n in offsets else p for n, p in params.items()}
            grads, (_, (_, stats)) = grads_of(shifted, buffers, anchor, xb, yb, row_mask)
            passes.append(stats)
        on = {}  # the client mask broadcast to each tensor's rank, built once per rank

        def keep(new, old):
            """new where the client trains, old where it has finished."""
            if old.dim() not in on:
                on[old.dim()] = active.reshape([-1] + [1] * (old.dim() - 1)) > 0
            return torch.where(on[old.dim()], new, old)

        new_params, new_bufs = {}, {}
        for n, p in params.items():  # torch.optim.SGD: d = g + wd p; b = m b + d; p -= lr b
            d = grads[n] + weight_decay * p if weight_decay != 0 else grads[n]
            if momentum != 0:
                # Buffers start at zero, so the first step gives b = d exactly, as SGD's.
                # A finished client's buffer may change: it is never read again.
                d = momentum * momentum_bufs[n] + d
                new_bufs[n] = d
            new_params[n] = keep(p - lr * d, p)
        new_buffers = dict(buffers)
        for stats in passes:  # each forward pass moves nn.BatchNorm's running stats
            for (prefix, name), (mean, var) in stats.items():
                base = prefix + name
                tracked = new_buffers[f"{base}.num_batches_tracked"]
                tracked_now = tracked + active.to(tracked.dtype)
                rm, rv = new_buffers[f"{base}.running_mean"], new_buffers[f"{base}.running_var"]
                new_mean, new_var = running_stat_updates(
                    rm, rv, tracked_now, mean, var, bn_modules[name].bn_momentum)
                new_buffers[f"{base}.num_batches_tracked"] = tracked_now
                new_buffers[f"{base}.running_mean"] = keep(new_mean, rm)
                new_buffers[f"{base}.running_var"] = keep(new_var, rv)
        return new_params, new_buffers, new_bufs if momentum != 0 else momentum_bufs, reported

    return step
