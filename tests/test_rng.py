"""Seeded generators: the same draws for the same (seed, tags), nobody else's state touched."""

import torch

from flnotes.rng import derive_seed, seeded_cpu_rng, torch_generator


def test_derived_seeds_depend_on_every_tag():
    assert derive_seed(0, "init") == derive_seed(0, "init")
    assert len({derive_seed(0, "a"), derive_seed(1, "a"), derive_seed(0, "b"),
                derive_seed(0, "a", 1)}) == 4
    a, b = torch_generator(3, "x", 2), torch_generator(3, "x", 2)
    assert torch.equal(torch.randn(5, generator=a), torch.randn(5, generator=b))


def test_seeded_cpu_rng_repeats_restores_and_leaves_gpus_alone(monkeypatch):
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: reseeded.append(seed))
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    reseeded.clear()
    with seeded_cpu_rng(7, "init"):
        first = torch.nn.Linear(4, 2).weight.detach().clone()
    with seeded_cpu_rng(7, "init"):
        again = torch.nn.Linear(4, 2).weight.detach().clone()
    assert torch.equal(first, again)  # the same initialisation for the same seed and tags
    assert torch.equal(torch.rand(3), expected_next)  # the caller's stream is untouched
    assert reseeded == []  # torch.manual_seed would have reseeded every GPU too
