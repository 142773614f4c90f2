"""FedSAM and FedASAM against references: FedAvg (rho = 0), SAM/ASAM steps by hand with
autograd, an uninterrupted run (resume), the loop (vmap falls back), the toy."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes
from torch import nn

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedsam import FedASAM, FedSAM
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.engine.train import local_sgd
from flnotes.rng import torch_generator


@pytest.mark.parametrize("algorithm", ["fedsam", "fedasam"])
def test_rho_zero_equals_fedavg(tiny_config, algorithm, monkeypatch):
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm=algorithm, sam_rho=0.0), progress=False)
    assert states_allclose(a.final_state, b.final_state, rtol=0, atol=0)
    # The two-pass path itself with a zero radius: the same point twice, still FedAvg.
    monkeypatch.setattr(FedSAM, "has_local_gradient", property(lambda self: True))
    c = run(tiny_config.replace(algorithm=algorithm, sam_rho=0.0), progress=False)
    assert states_allclose(a.final_state, c.final_state, rtol=0, atol=0)
    assert a.metric("accuracy") == c.metric("accuracy")


def test_defaults_and_a_positive_rho_changes_the_result(tiny_config):
    state = {"w": torch.zeros(2)}
    assert FedSAM(RunConfig(algorithm="fedsam"), state).rho == 0.05
    assert FedASAM(RunConfig(algorithm="fedasam"), state).rho == 0.5
    assert FedSAM(RunConfig(algorithm="fedsam", sam_rho=0.2), state).rho == 0.2
    a = run(tiny_config.replace(algorithm="fedavg"), progress=False)
    b = run(tiny_config.replace(algorithm="fedsam"), progress=False)
    assert not states_allclose(a.final_state, b.final_state)


def sam_steps_by_hand(weight, bias, x, y, steps, *, rho, eta, adaptive, lr, momentum, wd):
    """SAM / ASAM with SGD (momentum, weight decay) on a linear model, written out."""
    w, b = weight.clone(), bias.clone()
    bufs = None
    for _ in range(steps):
        wv, bv = w.clone().requires_grad_(), b.clone().requires_grad_()
        gw, gb = torch.autograd.grad(F.cross_entropy(x @ wv.T + bv, y), (wv, bv))
        tw = w.abs() + eta if adaptive else torch.ones_like(w)  # the bias keeps T = 1
        norm = torch.sqrt(((tw * gw) ** 2).sum() + (gb ** 2).sum()) + 1e-16
        ew, eb = rho * tw * tw * gw / norm, rho * gb / norm
        wp, bp = (w + ew).requires_grad_(), (b + eb).requires_grad_()
        sw, sb = torch.autograd.grad(F.cross_entropy(x @ wp.T + bp, y), (wp, bp))
        dw, db = sw + wd * w, sb + wd * b
        bufs = (dw, db) if bufs is None else (momentum * bufs[0] + dw, momentum * bufs[1] + db)
        w, b = w - lr * bufs[0], b - lr * bufs[1]
    return w, b


@pytest.mark.parametrize("algorithm", ["fedsam", "fedasam"])
def test_local_steps_match_sam_and_asam_by_hand(algorithm):
    g = torch_generator(0, "fedsam-test")
    model = nn.Linear(4, 3)
    start = {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    # asam_eta is FedASAM's alone: FedSAM's config leaves it out (from_dict, not strict)
    config = RunConfig.from_dict(dict(algorithm=algorithm, sam_rho=0.3, asam_eta=0.05, lr=0.1))
    strategy = FedASAM(config, start) if algorithm == "fedasam" else FedSAM(config, start)
    # Full batches, so the batch order cannot matter: three steps on the same 12 rows.
    state, _ = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                         weight_decay=1e-2, generator=torch_generator(0, "b"),
                         loss_fn=F.cross_entropy, local_gradient=strategy.local_gradient)
    w, b = sam_steps_by_hand(start["weight"], start["bias"], x, y, 3, rho=0.3, eta=0.05,
                             adaptive=algorithm == "fedasam", lr=0.1, momentum=0.5, wd=1e-2)
    assert torch.allclose(state["weight"], w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(state["bias"], b, rtol=1e-5, atol=1e-6)
    # And it is not plain SGD.
    plain, _ = local_sgd(model, start, x, y, epochs=3, batch_size=12, lr=0.1, momentum=0.5,
                         weight_decay=1e-2, generator=torch_generator(0, "b"),
                         loss_fn=F.cross_entropy)
    assert not torch.allclose(plain["weight"], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["fedsam", "fedasam"])
def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path, algorithm):
    config = tiny_config.replace(algorithm=algorithm, rounds=4, checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)


def test_vmap_backend_trains_the_two_pass_step_in_the_stack(tiny_config):
    """The vmap backend's SAM/ASAM step (Strategy.stacked_ascent) over whole runs: the loop's
    results to float32 tolerance, and no note of a fall-back to the loop. ASAM's ascent
    (rho 0.5) with momentum 0.9 magnifies float32 rounding to ~2e-5 in three rounds;
    tests/test_vmap.py compares a round in float64 on every model, to 1e-9."""
    _stack_trains_as_the_loop(tiny_config.replace(algorithm="fedasam", momentum=0.9,
                                                  weight_decay=1e-3))


def _stack_trains_as_the_loop(config: RunConfig) -> None:
    """``config`` on the vmap backend, with no note of a fall-back to the loop, gives the
    loop's final model and rows to float32 tolerance."""
    loop = run(config.replace(backend="loop"), progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vmapped = run(config.replace(backend="vmap"), progress=False)
    assert not [w for w in caught if "loop backend" in str(w.message)]
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=1e-3, atol=1e-4)
    for a, b in zip(loop.rows, vmapped.rows, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b.get("swa_models") == a.get("swa_models")


def test_runs_on_the_toy_where_asam_is_sam():
    # The toy's parameters are named x and y: no "weight", so ASAM's T_w is the identity.
    config = toy.toy_config("fedsam", rounds=3, num_clients=3, clients_per_round=2,
                            sam_rho=0.05)
    sam = run(config, progress=False)
    asam = run(config.replace(algorithm="fedasam"), progress=False)
    assert sam.status == asam.status == "completed"
    assert states_allclose(sam.final_state, asam.final_state, rtol=0, atol=0)


def test_a_second_pass_without_a_stacked_ascent_falls_back_once(tiny_config, monkeypatch):
    """A local_gradient the stack cannot compute (here FedSAM's, its stacked ascent taken
    away) trains on the loop, bit for bit, said once a process."""
    from flnotes.engine.batched import stacked

    monkeypatch.setattr(stacked, "_NOTED", set())
    monkeypatch.setattr(FedSAM, "stacked_ascent", None)
    config = tiny_config.replace(algorithm="fedsam", rounds=2)
    loop = run(config.replace(backend="loop"), progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vmapped = run(config.replace(backend="vmap"), progress=False)
        run(config.replace(backend="vmap", seed=1), progress=False)
    notes = [w for w in caught if "loop backend" in str(w.message)]
    assert len(notes) == 1 and "fedsam" in str(notes[0].message)
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=0, atol=0)


# ---- server-side SWA (the "+ SWA" rows; Caldarola et al. Sec. 4) -------------------------


def swa_config(**changes) -> RunConfig:
    values = dict(algorithm="fedsam", sam_rho=0.0, swa=True, rounds=9, lr=0.1,
                  swa_start=4, swa_cycle=3, swa_lr=1e-3, weighting="uniform")
    return RunConfig(**{**values, **changes})


def test_swa_learning_rate_cycles_from_lr_down_to_swa_lr():
    strategy = FedSAM(swa_config(), {"w": torch.zeros(2)})
    # t(r) = ((r - s) mod c + 1) / c, lr(r) = (1 - t) lr + t swa_lr, from s = 4 on
    for r in range(1, 10):
        t = None if r < 4 else ((r - 4) % 3 + 1) / 3
        expected = 0.1 if t is None else (1 - t) * 0.1 + t * 1e-3
        assert strategy.local_lr(r) == pytest.approx(expected, rel=1e-12)
    assert strategy.local_lr(6) == pytest.approx(1e-3)  # the end of a cycle: the lowest rate
    # c = 1 keeps the rate; the default start is the round after 3/4 of the rounds (int(0.75 R)
    # rounds counted from 0 in the authors' code); without swa nothing changes.
    one = FedSAM(swa_config(swa_cycle=1, swa_start=None, rounds=10), {"w": torch.zeros(2)})
    assert one.swa_start == 8 and {one.local_lr(r) for r in range(1, 11)} == {0.1}
    off = FedSAM(swa_config(swa=False), {"w": torch.zeros(2)})
    assert {off.local_lr(r) for r in range(1, 10)} == {0.1}


def test_swa_reports_the_mean_of_one_global_model_per_cycle():
    gen = torch.Generator().manual_seed(0)
    start = {"w": torch.zeros(3, dtype=torch.float64), "bn.num_batches_tracked": torch.tensor(0)}
    strategy = FedSAM(swa_config(), start)
    means, reported = [], []
    for r in range(1, 10):
        states = [{"w": torch.randn(3, generator=gen, dtype=torch.float64),
                   "bn.num_batches_tracked": torch.tensor(r)} for _ in range(2)]
        dispatched = strategy.dispatch(r, [0, 1])
        if means:  # clients always start from FedAvg's mean, never from the SWA mean
            assert all(torch.equal(d["w"], means[-1]) for d in dispatched)
        out = strategy.aggregate(r, [ClientResult(i, s, 5, 0.0) for i, s in enumerate(states)])
        means.append((states[0]["w"] + states[1]["w"]) / 2)
        reported.append(out["w"].clone())
        # integer entries are not averaged: they follow the last model folded into the mean
        assert out["bn.num_batches_tracked"] == (r if r < 6 else 6 if r < 9 else 9)
    # Cycles of 3 rounds from round 4: the ends are rounds 6 and 9. Before round 6 the
    # reported model is FedAvg's; from 6 on, the mean of the cycle ends' models so far.
    for r in range(1, 6):
        assert torch.allclose(reported[r - 1], means[r - 1], rtol=0, atol=1e-15)
    for r in (6, 7, 8):
        assert torch.allclose(reported[r - 1], means[5], rtol=0, atol=1e-15)
    assert torch.allclose(reported[8], (means[5] + means[8]) / 2, rtol=0, atol=1e-15)
    assert strategy.round_metrics(None) == {"swa_models": 2.0}


def test_swa_trains_the_round_with_its_learning_rate(tiny_config):
    from flnotes.engine.backends import train_clients
    from flnotes.engine.sim import Simulation
    from flnotes.engine.train import train_clients_loop

    config = tiny_config.replace(algorithm="fedsam", sam_rho=0.0, swa=True, swa_start=1,
                                 swa_cycle=4, swa_lr=1e-3)
    sim = Simulation(config)
    clients, starts = sim.begin_round(2)
    got = train_clients(sim.task, sim.strategy, 2, clients, starts, sim.config)
    lr = 0.5 * sim.config.lr + 0.5 * 1e-3  # t = 2/4 in the second round of the cycle
    want = train_clients_loop(sim.task, sim.strategy, 2, clients, starts,
                              sim.config.replace(lr=lr))
    plain = train_clients_loop(sim.task, sim.strategy, 2, clients, starts, sim.config)
    for a, b, c in zip(got, want, plain, strict=True):
        assert states_allclose(a.state, b.state, rtol=0, atol=0)
        assert not states_allclose(a.state, c.state)


def test_swa_with_rho_zero_and_one_round_cycles_is_the_mean_of_fedavgs_models(tiny_config):
    config = tiny_config.replace(rounds=5, record_states=True)
    fedavg = run(config.replace(algorithm="fedavg"), progress=False)
    swa = run(config.replace(algorithm="fedsam", sam_rho=0.0, swa=True, swa_start=3),
              progress=False)
    globals_ = [step["global"] for step in fedavg.trajectory]
    for step, other in zip(swa.trajectory, fedavg.trajectory, strict=True):
        for a, b in zip(step["dispatched"], other["dispatched"], strict=True):
            assert states_allclose(a, b, rtol=0, atol=0)  # FedAvg's run underneath
    expected = {k: sum(g[k] for g in globals_[2:]) / 3 if v.is_floating_point() else v
                for k, v in globals_[-1].items()}
    assert states_allclose(swa.final_state, expected, rtol=1e-6, atol=1e-7)


def test_swa_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedsam", rounds=6, checkpoint_every=2, swa=True,
                                 swa_start=2, swa_cycle=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=5)
    assert [r["swa_models"] for r in full.rows] == [r["swa_models"] for r in resumed.rows]


@pytest.mark.parametrize("cycle", [1, 2])
def test_swa_default_start_survives_a_resume_with_more_rounds(tiny_config, tmp_path, cycle):
    # A folder run to 4 rounds fixes the default start at int(0.75 * 4) + 1 = 4; extended to
    # 8 rounds it must keep 4 (not move to int(0.75 * 8) + 1 = 7 half way through), so it is
    # the uninterrupted 8-round run that starts SWA at round 4.
    config = tiny_config.replace(algorithm="fedsam", swa=True, swa_cycle=cycle, swa_lr=1e-3,
                                 checkpoint_every=2)
    folder = str(tmp_path / "extended")
    run(config.replace(rounds=4, run_dir=folder), progress=False)
    extended = run(config.replace(rounds=8, run_dir=folder), progress=False)
    reference = run(config.replace(rounds=8, swa_start=4), progress=False)
    assert [r["round"] for r in extended.rows] == list(range(1, 9))
    assert states_allclose(reference.final_state, extended.final_state, rtol=0, atol=0)
    assert [r["swa_models"] for r in extended.rows] == [r["swa_models"] for r in reference.rows]
    # The fresh 8-round run with the default start is a different run.
    fresh = run(config.replace(rounds=8), progress=False)
    assert not states_allclose(fresh.final_state, extended.final_state)


def test_swa_default_start_is_fixed_once_and_checkpointed():
    strategy = FedSAM(swa_config(swa_start=None, rounds=4), {"w": torch.zeros(2)})
    assert "default_swa_start" not in strategy.state_dict()  # not fixed before first use
    assert strategy.swa_start == 4
    saved = strategy.state_dict()
    assert saved["default_swa_start"] == 4
    longer = FedSAM(swa_config(swa_start=None, rounds=8), {"w": torch.zeros(2)})
    longer.load_state_dict(saved)
    assert longer.swa_start == 4 and longer.state_dict()["default_swa_start"] == 4
    # An explicit start wins over the saved default; a checkpoint without one (an older
    # folder) falls back to the rounds.
    explicit = FedSAM(swa_config(swa_start=6, rounds=8), {"w": torch.zeros(2)})
    explicit.load_state_dict(saved)
    assert explicit.swa_start == 6
    older = FedSAM(swa_config(swa_start=None, rounds=8), {"w": torch.zeros(2)})
    older.load_state_dict({k: v for k, v in saved.items() if k != "default_swa_start"})
    assert older.swa_start == 7


def test_swa_is_refused_for_other_methods_and_bad_values():
    with pytest.raises(ValueError, match="swa.*fedsam or fedasam"):
        RunConfig(algorithm="fedavg", swa=True)
    for field, value in [("swa_start", 0), ("swa_cycle", 0), ("swa_lr", 0.0), ("swa", "yes")]:
        with pytest.raises(ValueError, match=field):
            RunConfig(algorithm="fedsam", **{field: value})


def test_swa_settings_that_do_nothing_are_said_before_the_run(capsys):
    """--swa-start beyond --rounds (or SWA settings with swa off) do nothing: the
    command line says so in one line before the run, and the run still goes."""
    from flnotes.cli.main import main

    small = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2", "--data-option",
             "num_train=400", "--data-option", "num_test=100", "--device", "cpu"]
    assert main(["run", "--algorithm", "fedsam", "--swa", "true", "--swa-start", "5",
                 *small]) == 0
    out = capsys.readouterr()
    assert "swa_start=5 is after the last round" in out.out + out.err
    assert main(["run", "--algorithm", "fedsam", "--swa-start", "2", *small]) == 0
    out = capsys.readouterr()
    assert "swa is off" in out.out + out.err


def test_seeds_at_different_rates_each_train_at_their_own(tmp_path):
    """Seeds stacked in one round whose rates differ (seeds 1 and 2 resumed keep the SWA
    start their 4-round runs fixed, 3 starts afresh with its own) each train at their own
    rate: the stack splits by rate."""
    import warnings

    from flnotes.engine.seeds import run_seeds

    config = RunConfig(dataset="synthetic", model="mlp", num_clients=6, clients_per_round=3,
                       rounds=4, batch_size=32, lr=0.05, momentum=0.5, seed=1,
                       algorithm="fedsam", swa=True, swa_cycle=2, swa_lr=1e-3,
                       data_options={"num_train": 600, "num_test": 200}, device="cpu",
                       backend="vmap", run_dir=str(tmp_path / "seeds"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_seeds(config, [1, 2], progress=False, track=False)
        stacked = run_seeds(config.replace(rounds=8), [1, 2, 3], progress=False, track=False)
        alone = run(config.replace(seed=3, rounds=8, run_dir=None, backend="loop"),
                    progress=False)
    assert states_allclose(stacked[2].final_state, alone.final_state, rtol=1e-4, atol=1e-5)
    assert [r["train_loss"] for r in stacked[2].rows] == pytest.approx(
        [r["train_loss"] for r in alone.rows], rel=1e-4)


def test_swa_trains_in_the_stack_eagerly_and_on_the_loop_compiled():
    """SWA changes the rate every round of a cycle, a step per rate: eagerly a closure, so
    the stack trains SWA's clients; compiled, one compilation per rate, so they train on
    the loop. Without SWA the stack trains them either way (rho and eta as numbers)."""
    from flnotes.engine.batched.stacked import trains_in_stack

    for compile_mode in ("off", "default"):
        plain = FedSAM(swa_config(swa=False, sam_rho=0.05, backend="vmap",
                                  compile=compile_mode), {"w": torch.zeros(2)})
        assert trains_in_stack(plain) and plain.stacked_ascent is not None
    eager = FedSAM(swa_config(sam_rho=0.05, backend="vmap"), {"w": torch.zeros(2)})
    assert trains_in_stack(eager)
    compiled = FedSAM(swa_config(sam_rho=0.05, backend="vmap", compile="default"),
                      {"w": torch.zeros(2)})
    assert not trains_in_stack(compiled)
    # The one-time note gives that reason, not "has no batched training step".
    from flnotes.engine.batched import stacked

    stacked._NOTED.discard("fedsam")
    with pytest.warns(UserWarning, match="with SWA under --compile .* one compilation per "
                                         "rate.*loop backend"):
        assert not stacked.stacks(compiled)
    stacked._NOTED.discard("fedsam")


def test_swa_runs_in_the_stack_as_on_the_loop(tiny_config):
    """FedSAM + SWA on the vmap backend, no fall-back note: the loop's rows and final model
    (rates cycling through the SWA phase, the reported SWA mean) to float32 tolerance."""
    _stack_trains_as_the_loop(tiny_config.replace(
        algorithm="fedsam", sam_rho=0.05, swa=True, swa_start=2, swa_cycle=2, swa_lr=1e-3,
        rounds=5))
