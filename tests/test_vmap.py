"""The vmap backend against the loop backend (the reference): same models, same metrics."""


import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE
from helpers import SHAPES, client_starts, max_difference, random_task

from flnotes.algorithms import algorithm_names, build_strategy
from flnotes.config import RunConfig
from flnotes.engine.batched.schedule import build_schedule
from flnotes.engine.batched.vmap import train_clients_vmap
from flnotes.engine.sim import run
from flnotes.engine.train import batch_schedule, client_generator, train_clients_loop


def compare(model: str, dtype, chunk_size=None, **overrides):
    """Train one round with both backends from the same (per-client) starts."""
    k = 3  # odd on purpose
    task = random_task(model, k, 36, dtype)
    values = dict(algorithm="fedprox", mu=0.1, num_clients=k, clients_per_round=k,
                  local_epochs=2, batch_size=4, lr=0.05, momentum=0.9, weight_decay=1e-3,
                  device=DEVICE)
    # mu is FedProx's: a comparison under another algorithm leaves it out (from_dict)
    config = RunConfig.from_dict({**values, **overrides}).resolved()
    starts = client_starts(task, k)
    strategy = build_strategy(config, starts[0])
    clients = [2, 0, 1]
    loop = train_clients_loop(task, strategy, 1, clients, starts, config)
    fast = train_clients_vmap(task, strategy, 1, clients, starts, config, chunk_size=chunk_size)
    return task, loop, fast


@pytest.mark.parametrize("model", list(SHAPES))
def test_vmap_equals_loop_per_client_in_float32(model):
    # Batches of 6 rows: every short batch has >= 2 rows. A batch of ONE row normalised over
    # ResNet's 4x4 last stage makes BatchNorm statistics rounding-dominated in float32, and
    # there both backends drift from their float64 runs by up to 0.3 (chaos, not a bug); the
    # float64 test below covers batches of one row exactly.
    task, loop, fast = compare(model, torch.float32, batch_size=6, lr=0.01)
    sizes = sorted(task.num_samples(c) for c in range(3))
    assert sizes[0] < sizes[-1] and any(s % 6 for s in sizes)  # unequal, short batches
    for a, b in zip(loop, fast, strict=True):
        assert a.client == b.client and a.num_samples == b.num_samples
        assert list(a.state) == list(b.state)
        for name in a.state:
            torch.testing.assert_close(b.state[name], a.state[name], atol=1e-5, rtol=1e-4)
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)
    print(f"{model}: max |loop - vmap| = {max_difference(loop, fast):.2e}")


@pytest.mark.parametrize("model", list(SHAPES))
def test_vmap_equals_loop_in_float64(model):
    # In float64 rounding cannot hide a wrong step: padding, masks, BatchNorm buffers and
    # the momentum of exhausted clients must all be exactly the loop's.
    _, loop, fast = compare(model, torch.float64, batch_size=5)
    assert max_difference(loop, fast) < 1e-9


@pytest.mark.parametrize("algorithm", ["fedsam", "fedasam"])
@pytest.mark.parametrize("model", list(SHAPES))
def test_sharpness_aware_steps_stack_and_equal_the_loop_in_float64(model, algorithm):
    """FedSAM's and FedASAM's two-pass step (gradient at w + e, applied from w) trains in
    the stack, not on the loop fallback, and equals the loop's (Strategy.local_gradient) in
    float64: each lane's own ascent norm, ASAM's |w| + eta on weights only, BatchNorm's
    statistics moved by both passes, padding rows, momentum and weight decay."""
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _, loop, fast = compare(model, torch.float64, batch_size=5, algorithm=algorithm,
                                sam_rho=0.5)
    assert not [w for w in said if "no batched training step" in str(w.message)]
    assert max_difference(loop, fast) < 1e-9


def test_plain_sgd_fedavg_in_chunks():
    _, loop, fast = compare("lstm", torch.float64, chunk_size=2, algorithm="fedavg",
                            momentum=0.0, weight_decay=0.0)
    assert max_difference(loop, fast) < 1e-9


def test_groups_that_run_out_of_memory_are_halved_and_remembered(tiny_config, monkeypatch):
    """Out of memory: retried in halves, same results, and later rounds start at the size
    that fitted instead of running out again."""
    import flnotes.engine.batched.vmap as train_vmap_module

    real_group, tried = train_vmap_module.train_group, []

    def small_device(task, strategy, round, clients, *args):
        tried.append((round, len(clients)))
        if len(clients) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_group(task, strategy, round, clients, *args)

    config = tiny_config.replace(algorithm="fedprox", mu=0.1, rounds=2, clients_per_round=5,
                                 backend="vmap")
    reference = run(config, progress=False)
    monkeypatch.setattr(train_vmap_module, "train_group", small_device)
    halved = run(config, progress=False)
    assert tried == [(1, 5), (1, 3), (1, 2), (1, 2), (1, 1), (2, 2), (2, 2), (2, 1)]
    assert [r["accuracy"] for r in halved.rows] == pytest.approx(
        [r["accuracy"] for r in reference.rows], abs=1e-6)


def test_schedule_reproduces_batch_schedule():
    config = RunConfig(num_clients=4, clients_per_round=4, device="cpu", seed=5)
    counts, offsets = [13, 9, 4, 8], [0, 13, 22, 26]  # 8: whole batches only
    gens = [client_generator(config, 2, c) for c in range(4)]
    schedule = build_schedule(counts, offsets, 2, 4, gens)
    assert schedule.steps == [8, 6, 2, 4]
    for k, (n, off) in enumerate(zip(counts, offsets, strict=True)):
        ref = batch_schedule(n, 2, 4, client_generator(config, 2, k))
        for t, idx in enumerate(ref):
            assert schedule.sizes[k, t] == len(idx)
            assert torch.equal(schedule.rows[k, t, : len(idx)], idx + off)
            assert (schedule.rows[k, t, len(idx):] == off).all()  # pads with its own row
        assert (schedule.sizes[k, len(ref):] == 0).all()
        assert (schedule.rows[k, len(ref):] == off).all()
    # A client with no rows pads with a row that exists (its offset is past the data).
    sorted_schedule = build_schedule(counts[:3], offsets[:3], 2, 4, gens[:3])
    assert [sorted_schedule.active(t) for t in range(8)] == [3, 3, 2, 2, 2, 2, 1, 1]
    empty = build_schedule([13, 0], [0, 13], 1, 4, gens[:2])
    assert empty.steps == [4, 0] and int(empty.rows.max()) < 13


def test_custom_loss_is_averaged_over_real_rows():
    task = random_task("lstm", 3, 36, torch.float64)
    task.loss_fn = lambda out, y: F.cross_entropy(out, y, label_smoothing=0.2)
    config = RunConfig(num_clients=3, clients_per_round=3, local_epochs=1, batch_size=5,
                       lr=0.05, momentum=0.5, device=DEVICE).resolved()
    starts = client_starts(task, 3)
    strategy = build_strategy(config, starts[0])
    loop = train_clients_loop(task, strategy, 1, [0, 1, 2], starts, config)
    fast = train_clients_vmap(task, strategy, 1, [0, 1, 2], starts, config)
    assert max_difference(loop, fast) < 1e-9


ROUND_ALGORITHMS = [a for a in ("fedavg", "fedprox", "fedmut", "fedup", "fml")
                    if a in algorithm_names()]


@pytest.mark.parametrize("algorithm", ROUND_ALGORITHMS)
def test_same_metrics_over_rounds(tiny_config, algorithm):
    config = tiny_config.replace(algorithm=algorithm, num_clients=5, clients_per_round=5,
                                 dirichlet_alpha=0.1, batch_size=16, weight_decay=1e-3,
                                 mu=0.1, momentum=0.9, rounds=3)
    loop = run(config.replace(backend="loop"), progress=False)
    fast = run(config.replace(backend="vmap"), progress=False)
    for a, b in zip(loop.rows, fast.rows, strict=True):
        for key in ("train_loss", "accuracy", "loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["round"], key)
    for name, t in loop.final_state.items():
        torch.testing.assert_close(fast.final_state[name], t, atol=1e-5, rtol=1e-4)
