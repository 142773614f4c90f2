"""LEAF loaders: alphabet, LEAF's JSON round trips (Shakespeare, FEMNIST), registry, engine."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from flnotes.data import leaf, natural, plays
from flnotes.data import registry as data_module


def test_alphabet_is_leafs_80_symbols():
    assert len(natural.ALL_LETTERS) == 80 == natural.NUM_LETTERS
    assert len(set(natural.ALL_LETTERS)) == 80
    assert set("azAZ09 .,;:!?'\"-&()[]>}\n") <= set(natural.ALL_LETTERS)
    assert natural.ALL_LETTERS[natural.UNKNOWN_INDEX] == " "


def test_encode_round_trip_and_unknown_symbols_counted():
    known = "To be, or not to be: that is the question!"
    assert natural.decode_ids(natural.encode_text(known)) == known
    unknown = Counter()
    ids = natural.encode_text("a{b*c\u00e9{", unknown)
    counts = dict(unknown)
    assert counts == {"{": 2, "*": 1, "\u00e9": 1}
    index, unknown_id = natural.ALL_LETTERS.index, natural.UNKNOWN_INDEX
    expected = [index("a"), unknown_id, index("b"), unknown_id, index("c"), unknown_id,
                unknown_id]
    assert ids.tolist() == expected


def test_missing_data_names_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="LEAF's JSON"):
        leaf.load_shakespeare(tmp_path, False, 0)
    with pytest.raises(FileNotFoundError, match="FEMNIST not found"):
        leaf.load_femnist(tmp_path, False, 0)


def _leaf_json(folder: Path, users: dict) -> None:
    folder.mkdir(parents=True)
    all_data = {"users": list(users), "num_samples": [len(v["y"]) for v in users.values()],
                "user_data": users}
    (folder / "all_data_0_niid_0_keep_0_train_8.json").write_text(json.dumps(all_data))


def _write_leaf_shakespeare(built: natural.LeafData, root: Path, shuffle: bool) -> dict:
    """Write a built dataset as LEAF's train/test JSON under root; return the train user data."""
    train, test = {}, {}
    rng = np.random.default_rng(0)
    for c, name in enumerate(built.client_names):
        rows = built.client_indices[c].tolist()
        if shuffle:  # windows out of order: the loader must not assume consecutive windows
            rows = rng.permutation(rows).tolist()
        train[name] = {"x": [natural.decode_ids(built.train_x[i]) for i in rows],
                       "y": [natural.ALL_LETTERS[built.train_y[i]] for i in rows]}
        t = built.client_test_indices[c].tolist()
        test[name] = {"x": [natural.decode_ids(built.test_x[i]) for i in t],
                      "y": [natural.ALL_LETTERS[built.test_y[i]] for i in t]}
    _leaf_json(root / "train", train)
    _leaf_json(root / "test", test)
    return train


@pytest.mark.parametrize("shuffle", [False, True])
def test_leaf_shakespeare_json_round_trip(tmp_path, shuffle):
    # LEAF's own 80-character windows: roles need a few hundred characters.
    built = leaf.load_shakespeare(plays.write_demo_plays(tmp_path / "p", 3, 16), False, 0)
    assert built.input_shape == (80,) and len(built.client_names) == 3
    root = tmp_path / "leaf" / "data" / "shakespeare" / "data"
    train = _write_leaf_shakespeare(built, root, shuffle)
    loaded = leaf.load_shakespeare(tmp_path, False, 0)
    assert loaded.client_names == built.client_names
    for c, name in enumerate(built.client_names):
        got = [natural.decode_ids(loaded.train_x[i]) for i in loaded.client_indices[c]]
        assert got == train[name]["x"]
        got_y = [natural.ALL_LETTERS[loaded.train_y[i]] for i in loaded.client_indices[c]]
        assert got_y == train[name]["y"]
    assert torch.equal(loaded.test_x, built.test_x) and torch.equal(loaded.test_y, built.test_y)


def test_leaf_shakespeare_json_max_samples_matches_play_texts(tmp_path):
    """Capped, LEAF's JSON keeps the same windows as the play texts it was written from."""
    folder = plays.write_demo_plays(tmp_path / "p", 3, 16)
    built = leaf.load_shakespeare(folder, False, 0)
    _write_leaf_shakespeare(built, tmp_path / "shakespeare" / "data", shuffle=False)
    cap = sorted(len(c) for c in built.client_indices)[1]
    from_plays = leaf.load_shakespeare(folder, False, 0, max_samples=cap, subset_seed=2)
    from_json = leaf.load_shakespeare(tmp_path, False, 0, max_samples=cap, subset_seed=2)
    assert "source" in from_json.stats and "source" not in from_plays.stats  # really the JSON
    assert from_json.stats["capped_clients"] == from_plays.stats["capped_clients"] >= 1
    assert from_json.client_names == from_plays.client_names
    for c in range(len(built.client_names)):
        rows, json_rows = from_plays.client_indices[c], from_json.client_indices[c]
        assert len(rows) == min(cap, len(built.client_indices[c]))
        assert ([natural.decode_ids(from_json.train_x[i]) for i in json_rows]
                == [natural.decode_ids(from_plays.train_x[i]) for i in rows])
        assert torch.equal(from_json.train_y[json_rows], from_plays.train_y[rows])
    assert torch.equal(from_json.test_x, from_plays.test_x)
    assert torch.equal(from_json.test_y, from_plays.test_y)
    assert from_json.stats["test_samples"] == len(from_json.test_y)


def test_leaf_femnist_json_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    sizes = {"f0001_01": (5, 2), "f0002_07": (3, 1), "f0003_12": (4, 2)}
    train, test = {}, {}
    for u, (n, m) in sizes.items():
        train[u] = {"x": rng.random((n, 784)).round(4).tolist(),
                    "y": rng.integers(0, 62, n).tolist()}
        test[u] = {"x": rng.random((m, 784)).round(4).tolist(),
                   "y": rng.integers(0, 62, m).tolist()}
    _leaf_json(tmp_path / "femnist" / "data" / "train", train)
    _leaf_json(tmp_path / "femnist" / "data" / "test", test)
    d = leaf.load_femnist(tmp_path, False, 0)
    assert d.train_x.shape == (12, 1, 28, 28) and d.test_x.shape == (5, 1, 28, 28)
    assert d.num_classes == 62 and d.client_names == list(sizes)
    for c, u in enumerate(sizes):
        rows = d.client_indices[c]
        assert torch.allclose(d.train_x[rows].reshape(-1, 784), torch.tensor(train[u]["x"]))
        assert d.train_y[rows].tolist() == train[u]["y"]
        t = d.client_test_indices[c]
        assert torch.allclose(d.test_x[t].reshape(-1, 784), torch.tensor(test[u]["x"]))
        assert d.test_y[t].tolist() == test[u]["y"]
    sub = leaf.load_femnist(tmp_path, False, 0, max_writers=2)
    assert len(sub.client_indices) == 2
    assert len(sub.test_y) == sum(map(len, sub.client_test_indices))
    # min_samples keeps the writers with at least that many training samples (FedMR: > 100),
    # with their own rows; max_writers then draws among those only.
    big = leaf.load_femnist(tmp_path, False, 0, min_samples=4)
    assert big.client_names == ["f0001_01", "f0003_12"]
    for c, u in enumerate(big.client_names):
        assert big.train_y[big.client_indices[c]].tolist() == train[u]["y"]
        assert big.test_y[big.client_test_indices[c]].tolist() == test[u]["y"]
    one = leaf.load_femnist(tmp_path, False, 0, min_samples=4, max_writers=1)
    assert one.client_names[0] in big.client_names and len(one.client_names) == 1
    with pytest.raises(ValueError, match="min_samples=6"):
        leaf.load_femnist(tmp_path, False, 0, min_samples=6)
    # pad=2 makes 32x32 images (VGG-16): the middle is the original image, each new border
    # pixel repeats the nearest original pixel, rows and labels stay as they were.
    padded = leaf.load_femnist(tmp_path, False, 0, min_samples=4, pad=2)
    assert padded.train_x.shape[1:] == (1, 32, 32) and padded.test_x.shape[1:] == (1, 32, 32)
    assert torch.equal(padded.train_x[..., 2:30, 2:30], big.train_x)
    assert torch.equal(padded.test_x[..., 2:30, 2:30], big.test_x)
    assert torch.equal(padded.train_x[..., 0, 2:30], big.train_x[..., 0, :])
    assert torch.equal(padded.train_x[..., 31, 31], big.train_x[..., 27, 27])
    assert torch.equal(padded.train_y, big.train_y)
    for bad in (-1, 2.5, True, 65):
        with pytest.raises(ValueError, match="pad must be an integer"):
            leaf.load_femnist(tmp_path, False, 0, pad=bad)


def test_natural_split_trains_through_the_engine(tmp_path, monkeypatch):
    """Registered as a dataset, the natural split and the strided windows train an LSTM."""
    from flnotes.config import RunConfig
    from flnotes.engine.sim import run

    monkeypatch.setitem(data_module.DATASETS, "shakespeare", leaf.load_shakespeare)
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=3, speeches=4)
    config = RunConfig(dataset="shakespeare", model="lstm", partition="natural", num_clients=3,
                       clients_per_round=2, rounds=1, batch_size=20, lr=0.5, momentum=0.0,
                       data_dir=str(folder), data_options={"seq_len": 8}, device="cpu")
    history = run(config, progress=False)
    assert history.status == "completed" and 0 <= history.final_accuracy <= 1

