"""FedGloSS against references: FedAvg (no ascent, no ADMM) and FedSAM (local SAM only) bit
for bit, whole rounds by hand with autograd (server ascent, client SAM and ADMM terms, duals,
sigma, the server step), the rho warm-up, resume with clients skipped and resampled, vmap ==
loop, the toy and the command line."""

from collections import OrderedDict

import pytest
import torch
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.fedgloss import FedGloSS
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import Simulation, run
from flnotes.engine.state import states_allclose


@pytest.fixture
def gloss_config(tiny_config):
    return tiny_config.replace(algorithm="fedgloss", rounds=3)


def test_no_ascent_and_no_admm_is_fedavg_bit_for_bit(gloss_config):
    fedavg = run(gloss_config.replace(algorithm="fedavg"), progress=False)
    neutral = run(gloss_config.replace(gloss_rho=0.0, gloss_rho_local=0.0, gloss_admm=False),
                  progress=False)
    assert states_allclose(fedavg.final_state, neutral.final_state, rtol=0, atol=0)
    assert fedavg.metric("accuracy") == neutral.metric("accuracy")
    # Each part moves the result: the server's ascent alone, and ADMM alone.
    ascent = run(gloss_config.replace(gloss_rho_local=0.0, gloss_admm=False), progress=False)
    admm = run(gloss_config.replace(gloss_rho=0.0, gloss_rho_local=0.0), progress=False)
    for other in (ascent, admm):
        assert not states_allclose(fedavg.final_state, other.final_state)


def test_local_sam_alone_is_fedsam_bit_for_bit(gloss_config):
    fedsam = run(gloss_config.replace(algorithm="fedsam", sam_rho=0.07, backend="loop"),
                 progress=False)
    local = run(gloss_config.replace(gloss_rho=0.0, gloss_rho_local=0.07, gloss_admm=False),
                progress=False)
    assert states_allclose(fedsam.final_state, local.final_state, rtol=0, atol=0)
    assert [r["train_loss"] for r in fedsam.rows] == [r["train_loss"] for r in local.rows]


def rounds_by_hand(task, initial, sampled, n_total, *, rho, rho_l, beta, lr, steps):
    """FedGloSS's rounds (clients ``sampled[r]`` in round r + 1) written out with autograd:
    full-batch steps, no momentum or decay. Returns the global models and every client's
    dual after each round."""
    model = task.model_factory()
    names = [n for n, _ in model.named_parameters()]
    w = {n: initial[n].clone() for n in names}
    sigma = {n: torch.zeros_like(w[n]) for n in names}
    duals = {c: {n: torch.zeros_like(w[n]) for n in names} for c in range(n_total)}
    g_tilde = None
    out = []

    def grad_at(point, x, y):
        model.load_state_dict({**model.state_dict(), **point})
        loss = task.loss_fn(model(x), y)
        return dict(zip(names, torch.autograd.grad(loss, list(model.parameters())),
                        strict=True))

    for clients in sampled:
        if g_tilde is None:
            e = {n: torch.zeros_like(w[n]) for n in names}
        else:
            norm = torch.sqrt(sum((g ** 2).sum() for g in g_tilde.values()))
            e = {n: rho * g_tilde[n] / norm for n in names}
        w_tilde = {n: w[n] + e[n] for n in names}
        local, sizes = {}, {}
        for c in clients:
            x, y = task.client_data(c)
            v = dict(w_tilde)
            for _ in range(steps):
                g = grad_at(v, x, y)
                gn = torch.sqrt(sum((t ** 2).sum() for t in g.values())) + 1e-16
                g_sam = grad_at({n: v[n] + rho_l * g[n] / gn for n in names}, x, y)
                v = {n: v[n] - lr * (g_sam[n] - duals[c][n] + (v[n] - w_tilde[n]) / beta)
                     for n in names}
            local[c], sizes[c] = v, len(y)
            duals[c] = {n: duals[c][n] - (v[n] - w_tilde[n]) / beta for n in names}
        total = sum(sizes.values())
        delta = {n: sum(sizes[c] * (local[c][n] - w_tilde[n]) for c in clients) / total
                 for n in names}
        sigma = {n: sigma[n] - sum(local[c][n] - w_tilde[n] for c in clients)
                 / (beta * n_total * len(clients)) for n in names}
        w = {n: w[n] + delta[n] - beta * sigma[n] for n in names}
        g_tilde = {n: -delta[n] for n in names}
        out.append((dict(w), {c: dict(d) for c, d in duals.items()}))
    return out


def test_rounds_match_the_equations_by_hand(gloss_config):
    config = gloss_config.replace(num_clients=4, clients_per_round=2, batch_size=10_000,
                                  local_epochs=2, momentum=0.0, weight_decay=0.0, lr=0.1,
                                  gloss_rho=0.3, gloss_rho_local=0.05, gloss_beta=2.0,
                                  rounds=3, data_options={"num_train": 200, "num_test": 50})
    sim = Simulation(config)
    initial = OrderedDict((n, t.clone()) for n, t in sim.strategy.global_state.items())
    globals_, duals_, sampled = [], [], []
    for rnd in (1, 2, 3):
        clients, starts = sim.begin_round(rnd)
        results = train_clients(sim.task, sim.strategy, rnd, clients, starts, sim.config)
        sim.end_round(rnd, clients, starts, results, 0.0)
        sampled.append(list(clients))
        globals_.append(OrderedDict(sim.strategy.global_state))
        duals_.append(sim.strategy.duals.hold(range(4)))
        sim.strategy.duals.release()
    assert len(set(map(tuple, sampled))) > 1  # clients skipped and sampled again
    expected = rounds_by_hand(sim.task, initial, sampled, 4, rho=0.3, rho_l=0.05, beta=2.0,
                              lr=0.1, steps=2)
    for rnd in (1, 2, 3):
        w, duals = expected[rnd - 1]
        for n, t in w.items():
            torch.testing.assert_close(globals_[rnd - 1][n], t, rtol=1e-5, atol=1e-6)
        for c in range(4):
            for n, t in duals[c].items():
                torch.testing.assert_close(duals_[rnd - 1][c][n], t, rtol=1e-5, atol=1e-6)


def test_server_ascent_follows_the_previous_pseudo_gradient():
    """e = rho g~/||g~|| on trainable layers only, g~ = w~ - (sample-weighted) mean."""
    from flnotes.algorithms.base import ClientResult

    dt = torch.float64
    start = OrderedDict(w=torch.tensor([1.0, 2.0], dtype=dt),
                        **{"bn.running_mean": torch.zeros(2, dtype=dt)})
    strategy = FedGloSS(RunConfig(algorithm="fedgloss", gloss_rho=0.5, gloss_admm=False),
                        start)
    assert strategy.dispatch(1, [0, 1])[0] is strategy.global_state  # no ascent in round 1
    states = [OrderedDict(w=torch.tensor([0.0, 2.0], dtype=dt),
                          **{"bn.running_mean": torch.ones(2, dtype=dt)}),
              OrderedDict(w=torch.tensor([1.0, -1.0], dtype=dt),
                          **{"bn.running_mean": torch.full((2,), 3.0, dtype=dt)})]
    new = strategy.aggregate(1, [ClientResult(0, states[0], 3, 0.0),
                                 ClientResult(1, states[1], 1, 0.0)])
    mean = torch.tensor([0.25, 1.25], dtype=dt)  # (3 * [0, 2] + [1, -1]) / 4
    assert torch.allclose(new["w"], mean) and torch.allclose(new["bn.running_mean"],
                                                              torch.full((2,), 1.5, dtype=dt))
    g = torch.tensor([1.0, 2.0], dtype=dt) - mean
    sent = strategy.dispatch(2, [0])[0]
    assert torch.allclose(sent["w"], mean + 0.5 * g / g.norm(), rtol=0, atol=1e-15)
    assert torch.equal(sent["bn.running_mean"], new["bn.running_mean"])  # not perturbed
    # The descent is applied at w^t, not w~: clients that return w~ leave w^t unchanged.
    again = strategy.aggregate(2, [ClientResult(0, sent, 1, 0.0)])
    assert torch.allclose(again["w"], mean, rtol=0, atol=1e-15)


def test_the_clients_rho_warms_up_linearly():
    config = RunConfig(algorithm="fedgloss", gloss_rho_local=0.2, gloss_rho0=0.0,
                       gloss_warmup=4)
    strategy = FedGloSS(config, {"w": torch.zeros(2)})
    assert [strategy.local_rho(r) for r in range(1, 8)] == pytest.approx(
        [0.0, 0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    flat = FedGloSS(RunConfig(algorithm="fedgloss"), {"w": torch.zeros(2)})
    assert {flat.local_rho(r) for r in range(1, 5)} == {0.15}


def test_resume_with_clients_skipped_and_sampled_again(gloss_config, tmp_path):
    config = gloss_config.replace(rounds=5, clients_per_round=2, checkpoint_every=2,
                                  gloss_warmup=3)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["server_ascent_norm"] for r in full.rows] == [
        r["server_ascent_norm"] for r in resumed.rows]


def test_vmap_backend_gives_the_loop_results(gloss_config):
    loop = run(gloss_config.replace(backend="loop"), progress=False)
    vmapped = run(gloss_config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=0, atol=0)
    assert [r["train_loss"] for r in loop.rows] == [r["train_loss"] for r in vmapped.rows]


def test_runs_on_the_toy():
    config = toy.toy_config("fedgloss", rounds=4, num_clients=3, clients_per_round=2)
    history = run(config, progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    assert history.rows[0]["server_ascent_norm"] == 0.0
    assert history.rows[1]["server_ascent_norm"] == pytest.approx(0.15)


def test_runs_from_the_command_line(tmp_path, capsys):
    from flnotes.cli.main import main

    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "fedgloss", "--dataset", "toy", "--gloss-rho", "0.1",
                 "--gloss-beta", "5", "--rounds", "3", "--num-clients", "2",
                 "--clients-per-round", "2", "--device", "cpu", "--run-dir",
                 str(folder)]) == 0
    assert (folder / "metrics.jsonl").exists()
    assert main(["run", "--algorithm", "fedavg", "--gloss-rho", "0.1", "--dataset", "toy",
                 "--rounds", "1"]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("field,value", [("gloss_rho", -0.1), ("gloss_beta", 0.0),
                                         ("gloss_warmup", -1), ("gloss_admm", "yes")])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfig(algorithm="fedgloss", **{field: value})
