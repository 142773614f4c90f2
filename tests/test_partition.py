"""Partitioners and manifests: coverage, sizes, skew ordering, determinism, round trips."""

import json

import pytest
import torch

from flnotes.data.partition import (
    dirichlet_partition,
    iid_partition,
    label_skew,
    labels_hash,
    load_manifest,
    make_partition,
    save_manifest,
    shard_partition,
)


@pytest.fixture
def labels() -> torch.Tensor:
    """10 classes x 500 samples, shuffled so that label order carries no information."""
    g = torch.Generator().manual_seed(0)
    return torch.arange(5000)[torch.randperm(5000, generator=g)] % 10


def assert_exact_cover(parts: list[torch.Tensor], num_samples: int) -> None:
    """Every sample index appears in exactly one client."""
    for p in parts:
        assert p.dtype == torch.int64
        assert torch.equal(p, p.sort().values)
    all_idx = torch.cat(parts)
    assert len(all_idx) == num_samples
    assert torch.equal(all_idx.sort().values, torch.arange(num_samples))


def test_iid_covers_every_sample_once_with_near_equal_sizes():
    parts = iid_partition(1003, 10, seed=0)
    assert_exact_cover(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("alpha", [0.1, 0.5, 10.0])
def test_dirichlet_covers_every_sample_once_and_respects_min_size(labels, alpha):
    parts = dirichlet_partition(labels, 20, alpha, seed=3, min_size=10)
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 10


def test_lower_alpha_gives_more_label_skew(labels):
    skew = {
        a: label_skew(dirichlet_partition(labels, 20, a, seed=0), labels) for a in (0.1, 1.0, 100.0)
    }
    assert skew[0.1] > skew[1.0] + 0.1
    assert skew[1.0] > skew[100.0] + 0.1
    assert skew[100.0] < 0.1
    assert label_skew(iid_partition(len(labels), 20, seed=0), labels) < 0.15


def test_shards_give_equal_sizes_and_few_labels(labels):
    parts = shard_partition(labels, 20, 2, seed=0)
    assert_exact_cover(parts, len(labels))
    shard_size = len(labels) // 40
    for p in parts:
        assert len(p) == 2 * shard_size
        assert len(labels[p].unique()) <= 2


def test_shards_drop_the_remainder(labels):
    parts = shard_partition(labels[:4999], 7, 3, seed=0)  # 21 shards of 238, 1 sample left over
    assert [len(p) for p in parts] == [3 * 238] * 7
    assert len(torch.cat(parts).unique()) == 21 * 238


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_same_seed_same_partition_other_seed_different(labels, scheme):
    a = make_partition(labels, 20, scheme, seed=5)
    b = make_partition(labels, 20, scheme, seed=5)
    c = make_partition(labels, 20, scheme, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_make_partition_rejects_unknown_scheme(labels):
    with pytest.raises(ValueError, match="iid.*dirichlet.*shards"):
        make_partition(labels, 10, "pathological", seed=0)


def test_manifest_round_trip(tmp_path, labels):
    parts = make_partition(labels, 20, "dirichlet", seed=1, dirichlet_alpha=0.3)
    path = tmp_path / "sub" / "manifest.json"
    save_manifest(path, parts, labels, meta={"scheme": "dirichlet", "alpha": 0.3})
    raw = json.loads(path.read_text())
    assert raw["labels_sha256"] == labels_hash(labels)
    assert raw["num_samples"] == len(labels)
    assert raw["meta"] == {"scheme": "dirichlet", "alpha": 0.3}
    loaded = load_manifest(path, labels)
    assert len(loaded) == len(parts)
    assert all(
        torch.equal(x, y) and y.dtype == torch.int64 for x, y in zip(parts, loaded, strict=True)
    )


def test_manifest_against_other_labels_raises(tmp_path, labels):
    path = tmp_path / "manifest.json"
    save_manifest(path, iid_partition(len(labels), 5, seed=0), labels)
    other = labels.clone()
    other[0] = (other[0] + 1) % 10
    with pytest.raises(ValueError, match="different data") as err:
        load_manifest(path, other)
    assert labels_hash(labels) in str(err.value) and labels_hash(other) in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("edit, words", [
    (lambda c: [[len(c[0]) * 1000]] + c[1:], "sample index 1000000 is not one of the 5000"),
    (lambda c: [[-1, *c[0]]] + c[1:], "sample index -1 is not one of the 5000"),
    (lambda c: [c[0] + [c[1][0]]] + c[1:], "is given more than once"),
    (lambda c: [c[0], [0.5, *c[1]]] + c[2:], "client 1's samples must be a list of whole"),
    (lambda c: [[True]] + c[1:], "client 0's samples must be a list of whole sample indices"),
    (lambda c: [5] + c[1:], "client 0's samples must be a list of whole sample indices"),
    (lambda c: {"a": c}, "'clients' must hold one list of sample indices per client"),
])
def test_a_hand_edited_manifest_is_checked_not_trained_on(tmp_path, labels, edit, words):
    """Indices outside the data (a negative one counts from the end), a sample on two
    clients, fractions or booleans: an error naming the problem, never a run on other samples
    than the manifest seems to say."""
    import json

    path = tmp_path / "manifest.json"
    save_manifest(path, iid_partition(len(labels), 5, seed=0), labels)
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "clients": edit(manifest["clients"])}))
    with pytest.raises(ValueError, match=words):
        load_manifest(path, labels)


def test_a_manifest_with_an_empty_client_reads_back(tmp_path):
    """min_client_size 0 lets a Dirichlet split leave clients empty; save_manifest writes
    them and the next run must read its own manifest back."""
    y = torch.arange(10).repeat(20)
    parts = dirichlet_partition(y, 20, 0.05, seed=0, min_size=0)
    assert any(len(p) == 0 for p in parts)
    save_manifest(tmp_path / "m.json", parts, y)
    loaded = load_manifest(tmp_path / "m.json", y)
    assert all(torch.equal(a, b) for a, b in zip(parts, loaded, strict=True))


def test_labels_hash_ignores_dtype_but_not_values(labels):
    assert labels_hash(labels) == labels_hash(labels.to(torch.int32))
    assert labels_hash(labels) != labels_hash(labels.flip(0))


def test_unreachable_min_size_raises(labels):
    # More than the samples there are: impossible for any draw.
    with pytest.raises(ValueError, match="min_size=300 is unreachable"):
        dirichlet_partition(labels, 20, 0.5, seed=0, min_size=300)
    # Possible in principle (exactly 250 each) but no draw at alpha=0.05 gets there.
    with pytest.raises(ValueError, match=r"min_size=250.*alpha=0\.05.*max_tries=20"):
        dirichlet_partition(labels, 20, 0.05, seed=0, min_size=250, max_tries=20)
