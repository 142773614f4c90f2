"""FedGen against references: FedAvg (alpha = beta = 0), the local terms and the diversity
loss by hand, the generator's loss falling on fixed heads, label shares, every registry
model's head, resume, the loop (vmap falls back), the toy."""

import math
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_resumes

from flnotes import toy
from flnotes.algorithms.base import ClientResult
from flnotes.algorithms.fedgen import (
    FeatureGenerator,
    FedGen,
    diversity_loss,
    head_name,
    teacher_loss,
)
from flnotes.config import RunConfig
from flnotes.engine.sim import run
from flnotes.engine.state import states_allclose
from flnotes.models import build_model, model_names
from flnotes.rng import torch_generator

SHAPES = {"lstm": (80,), "lstm-100": (80,), "lenet5": (1, 28, 28), "femnist-cnn": (1, 28, 28),
          "mlp": (5,)}


@pytest.mark.parametrize("name", model_names())
def test_head_is_the_layer_that_gives_every_models_logits(name):
    shape = SHAPES.get(name, (3, 32, 32))
    model = build_model(name, 7, shape).eval()
    head = head_name(model.state_dict())
    module = model.get_submodule(head)
    assert isinstance(module, torch.nn.Linear) and module.out_features == 7
    seen = {}
    module.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    x = (torch.randint(0, 7, (2, *shape)) if name.startswith("lstm")
         else torch.randn(2, *shape))
    with torch.no_grad():
        logits = model(x)
    assert torch.equal(seen["out"], logits)  # the head's output is the model's output
    assert seen["x"].shape == (2, module.in_features)


def test_no_head_on_the_toy_trains_as_fedavg():
    config = toy.toy_config("fedavg", rounds=3, num_clients=3, clients_per_round=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen = run(config.replace(algorithm="fedgen"), progress=False)
    assert any("no" in str(w.message) and "FedAvg" in str(w.message) for w in caught)
    avg = run(config, progress=False)
    assert gen.status == "completed"
    assert states_allclose(gen.final_state, avg.final_state, rtol=0, atol=0)


def test_weights_zero_equals_fedavg_bit_for_bit(tiny_config):
    config = tiny_config.replace(rounds=3)
    avg = run(config.replace(algorithm="fedavg"), progress=False)
    gen = run(config.replace(algorithm="fedgen", fedgen_alpha=0.0, fedgen_beta=0.0),
              progress=False)
    assert states_allclose(avg.final_state, gen.final_state, rtol=0, atol=0)
    assert avg.metric("accuracy") == gen.metric("accuracy")
    # the generator still trains (round metrics), and a positive weight changes the run
    assert all("generator_loss" in row for row in gen.rows)
    on = run(config.replace(algorithm="fedgen"), progress=False)
    assert not states_allclose(avg.final_state, on.final_state)


def weights_by_hand(alpha, round):
    return 0.0 if round < 2 else max(1e-4, alpha * 0.98 ** (round - 1))


def test_local_terms_match_eq8_by_hand():
    config = RunConfig(algorithm="fedgen", dataset="synthetic", model="mlp", batch_size=4,
                       fedgen_alpha=3.0, fedgen_beta=2.0, fedgen_batch=6, seed=5)
    model = build_model("mlp", 5, (3,)).double()
    strategy = FedGen(config, OrderedDict((k, v.detach().clone())
                                          for k, v in model.state_dict().items()))
    assert strategy.head == "fc3" and strategy.generator.noise_dim == 32
    x = torch.randn(4, 3, dtype=torch.float64)
    y = torch.tensor([0, 2, 2, 4])
    round, client = 3, 1
    term = strategy.batch_loss(round, client)
    out = model(x)
    got = term(model, x, y, out)
    # The same draws, in the same order, from the client's stream; eq. 8 written out.
    stream = torch_generator(5, "fedgen", round, client)
    generator = strategy.generator.eval()
    with torch.no_grad():
        z = generator(y, torch.randn(4, 32, generator=stream, dtype=torch.float64))
        h = model.fc3(z)
        labels = torch.randint(5, (6,), generator=stream)
        z2 = generator(labels, torch.randn(6, 32, generator=stream, dtype=torch.float64))
    alpha, beta = weights_by_hand(3.0, round), weights_by_hand(2.0, round)
    kl = 0.0
    for b in range(4):
        target = [math.exp(v) / sum(math.exp(u) for u in h[b].tolist()) for v in h[b].tolist()]
        logp = [v - math.log(sum(math.exp(u) for u in out[b].tolist()))
                for v in out[b].tolist()]
        kl += sum(t * (math.log(t) - lp) for t, lp in zip(target, logp, strict=True))
    logits = model.fc3(z2)
    ce = sum(math.log(sum(math.exp(u) for u in logits[i].tolist())) - logits[i, labels[i]].item()
             for i in range(6)) / 6
    expected = beta * kl / 4 + alpha * (6 / 4) * ce
    assert got.item() == pytest.approx(expected, rel=1e-9)
    # the term's gradient reaches the model (head and body), never the generator
    got.backward()
    assert model.fc3.weight.grad.abs().sum() > 0 and model.fc1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in generator.parameters())
    # the labels the client saw are counted (from 1, as the authors' code)
    assert strategy.label_counts[client].tolist() == [2.0, 1.0, 3.0, 1.0, 2.0]
    # round 1: no term, only the counts
    first = strategy.batch_loss(1, 0)
    assert first(model, x, y, out) is None


def test_diversity_loss_against_a_double_loop():
    g = torch_generator(0, "div")
    noise, feats = torch.randn(5, 3, generator=g), torch.randn(5, 4, generator=g)
    total = 0.0
    for i in range(5):
        for j in range(5):
            d_noise = sum((noise[i, k] - noise[j, k]).item() ** 2 for k in range(3)) / 3
            d_feat = sum(abs((feats[i, k] - feats[j, k]).item()) for k in range(4)) / 4
            total += d_noise * d_feat
    assert diversity_loss(noise, feats).item() == pytest.approx(math.exp(-total / 25), rel=1e-6)


def hand_state(num_classes, feature_dim, seed):
    g = torch_generator(seed, "heads")
    return OrderedDict([("body.weight", torch.randn(feature_dim, 3, generator=g)),
                        ("head.weight", torch.randn(num_classes, feature_dim, generator=g)),
                        ("head.bias", torch.randn(num_classes, generator=g))])


def test_label_shares_and_qualified_labels():
    config = RunConfig(algorithm="fedgen", dataset="synthetic", model="mlp")
    strategy = FedGen(config, hand_state(4, 6, 0))
    strategy.label_counts = {3: torch.tensor([1.0, 5.0, 1.0, 2.0]),
                             8: torch.tensor([1.0, 1.0, 1.0, 6.0])}
    results = [ClientResult(c, hand_state(4, 6, c), 10, 0.0) for c in (3, 8)]
    weights, qualified = strategy.label_weights(results)
    assert torch.allclose(weights, torch.tensor([[0.5, 0.5], [5 / 6, 1 / 6], [0.5, 0.5],
                                                 [0.25, 0.75]]))
    assert qualified.tolist() == [1, 3]  # a label some client saw more than once


def test_generator_loss_falls_over_its_server_steps():
    config = RunConfig(algorithm="fedgen", dataset="synthetic", model="mlp", batch_size=64,
                       fedgen_steps=200, fedgen_lr=1e-2, seed=2)
    strategy = FedGen(config, hand_state(4, 6, 0))
    results = [ClientResult(c, hand_state(4, 6, 10 + c), 10, 0.0) for c in range(3)]
    for c in range(3):
        strategy.label_counts[c] = torch.full((4,), 5.0)
    losses = strategy.train_generator(1, results)
    assert losses["generator_loss"] < 0.5 * losses["generator_loss_first"]
    assert 0 < losses["generator_diversity"] <= 1
    # what it learnt: features the heads (weighted) read as the asked-for label
    generator = strategy.generator.eval()
    labels = torch.arange(4).repeat(25)
    with torch.no_grad():
        z = generator(labels, torch.randn(100, generator.noise_dim))
        votes = sum(F.softmax(F.linear(z, r.state["head.weight"], r.state["head.bias"]), 1)
                    for r in results)
    assert (votes.argmax(1) == labels).float().mean() > 0.9
    assert strategy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.98)


def test_generator_architecture_follows_the_authors_configs():
    wide = FedGen(RunConfig(algorithm="fedgen"), OrderedDict(
        [("conv.weight", torch.zeros(8, 3, 5, 5)), ("fc.weight", torch.zeros(10, 84)),
         ("fc.bias", torch.zeros(10))]))
    assert isinstance(wide.generator, FeatureGenerator)
    assert (wide.generator.noise_dim, wide.generator.hidden[0].out_features,
            wide.generator.out.out_features) == (64, 512, 84)
    narrow = FedGen(RunConfig(algorithm="fedgen"), hand_state(62, 50, 0))
    assert (narrow.generator.noise_dim, narrow.generator.hidden[0].out_features) == (32, 256)


def test_resume_gives_the_uninterrupted_run(tiny_config, tmp_path):
    config = tiny_config.replace(algorithm="fedgen", rounds=4, checkpoint_every=2)
    full, resumed = assert_resumes(config, tmp_path, stop_after=3)
    assert [r["generator_loss"] for r in full.rows] == [r["generator_loss"] for r in resumed.rows]


def test_vmap_backend_falls_back_to_the_loop(tiny_config):
    config = tiny_config.replace(algorithm="fedgen", rounds=2)
    loop = run(config.replace(backend="loop"), progress=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        vmapped = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, vmapped.final_state, rtol=0, atol=0)


@pytest.mark.parametrize("field,value", [("fedgen_alpha", -1.0), ("fedgen_beta", float("nan")),
                                         ("fedgen_lr", 0.0), ("fedgen_steps", -1),
                                         ("fedgen_batch", 0), ("fedgen_steps", 2.5)])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfig(algorithm="fedgen", **{field: value})


def test_teacher_weightings_against_the_paper_and_the_seed_codes_broadcast():
    """per-sample is eq. 4; mean-product is the seed code's torch.mean(CE * w) with CE of shape
    (B,) and w of shape (B, 1) (Training_FedGen.py l.176-178), written here as that code does."""
    g = torch_generator(3, "teacher")
    logits, labels = torch.randn(6, 4, generator=g), torch.tensor([0, 1, 1, 3, 2, 0])
    shares = torch.tensor([0.1, 0.7, 0.7, 0.2, 0.5, 0.1])
    ce = torch.stack([-F.log_softmax(logits[i], 0)[labels[i]] for i in range(6)])
    per_sample = sum(ce[i] * shares[i] for i in range(6)) / 6
    broadcast = torch.mean(ce * shares.reshape(-1, 1))  # (B,) * (B, 1) -> (B, B)
    assert teacher_loss(logits, labels, shares, "per-sample") == pytest.approx(float(per_sample))
    assert teacher_loss(logits, labels, shares, "mean-product") == pytest.approx(
        float(broadcast))
    assert float(broadcast) == pytest.approx(float(ce.mean() * shares.mean()))
    assert float(per_sample) != pytest.approx(float(broadcast))  # unequal shares: they differ
    same = torch.full((6,), 0.4)  # one share for every label: the readings agree
    assert teacher_loss(logits, labels, same, "per-sample") == pytest.approx(
        float(teacher_loss(logits, labels, same, "mean-product")))


def test_defaults_follow_the_fedgen_code_and_paper_the_seed_variant_its_code():
    default = RunConfig(algorithm="fedgen")
    assert (default.fedgen_decay, default.fedgen_noise, default.fedgen_fresh_optimizer,
            default.fedgen_ratio_scaling, default.fedgen_label_counts,
            default.fedgen_teacher_weighting) == (0.98, "gaussian", False, True, "steps",
                                                  "per-sample")
    seed = RunConfig.from_preset("fedmut-official", algorithm="fedgen")
    assert (seed.fedgen_alpha, seed.fedgen_beta, seed.fedgen_decay, seed.fedgen_noise,
            seed.fedgen_noise_dim, seed.fedgen_fresh_optimizer, seed.fedgen_server_batch,
            seed.fedgen_batch, seed.fedgen_ratio_scaling, seed.fedgen_label_counts,
            seed.fedgen_teacher_weighting) == (0.2, 0.2, 1.0, "uniform", 100, True, 128, 128,
                                               False, "data", "mean-product")


def test_seed_code_variant_constant_weights_fresh_adam_data_shares_uniform_noise():
    config = RunConfig(algorithm="fedgen", dataset="synthetic", model="mlp", batch_size=8,
                       local_epochs=3, fedgen_decay=1.0, fedgen_fresh_optimizer=True,
                       fedgen_label_counts="data", fedgen_noise="uniform", fedgen_noise_dim=7,
                       fedgen_server_batch=16, fedgen_steps=3, fedgen_lr=1e-2,
                       fedgen_ratio_scaling=False)
    strategy = FedGen(config, hand_state(4, 6, 0))
    assert strategy.generator.noise_dim == 7
    assert strategy.weights_at(2) == strategy.weights_at(40) == (10.0, 10.0)  # no decay
    noise = strategy._noise(500, torch_generator(0, "n"), torch.zeros(1))
    assert noise.min() >= 0 and noise.max() < 1 and abs(float(noise.mean()) - 0.5) < 0.05
    # Shares from the data: three epochs of steps over labels (2, 0, 1, 1) count each thrice.
    term = strategy.batch_loss(1, 5)
    targets = torch.tensor([2, 0, 1, 1])
    for _ in range(3):
        term(None, None, targets, None)
    strategy.label_counts[6] = torch.tensor([9.0, 0.0, 0.0, 27.0])  # three epochs' steps
    results = [ClientResult(c, hand_state(4, 6, c), 10, 0.0) for c in (5, 6)]
    weights, qualified = strategy.label_weights(results)
    # client 5's data holds labels 0, 1, 1, 2; client 6's three 0s and nine 3s
    assert torch.allclose(weights.float(), torch.tensor([[0.25, 0.75], [1.0, 0.0], [1.0, 0.0],
                                                         [0.0, 1.0]]))
    assert qualified.tolist() == [0, 1, 3]  # seen more than once by some client (its data)
    # A new Adam each round: moments start over and the learning rate stays.
    for round in (1, 2):
        strategy.label_counts = {5: torch.full((4,), 6.0), 6: torch.full((4,), 6.0)}
        strategy.train_generator(round, results)
        assert strategy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)
        steps = {int(s["step"]) for s in strategy.optimizer.state.values()}
        assert steps == {3}
