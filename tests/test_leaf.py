"""LEAF loaders: play parsing in both layouts, windows, alphabet, split, JSON round trips."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from flnotes import data as data_module
from flnotes import leaf

# Per-play layout (Gutenberg texts): the speaker alone on a line ending in a period.
PER_PLAY = """THE TRAGEDY OF TESTING

by William Shakespeare



Persons Represented.

Alpha, a reader of logs.
Physician.
Beta, her friend.

SCENE: A laboratory.


ACT I.

Scene I. A bench.

[Enter Alpha and Beta.]

Alpha.
The kettle sings before
the water boils.

Beta.
[Aside.] Then let it sing; we wait for the boiling.

[Exit Alpha, in a hurry, with
her notebook.]

And so the morning goes.

GAMMA. I speak inline, as the old texts do.

1 Watch.
Stand, who goes there?

Mrs. Page.
A visitor with letters.

ACT II.

Gentle readers, this line has no speaker.
"""

# 1994 complete-works layout (LEAF's source): "  NAME. text", continuation "    text".
INDENTED = """THE FIRST PLAY

by William Shakespeare

  ALPHA. The tide is out, and the boats lie still
    upon the sand. [Aside] Quietly.
                                                  Exit
  BETA. Then we walk.

THE SECOND PLAY

by William Shakespeare

  Alpha. A different Alpha, in another play.
    She says more.
"""


def test_alphabet_is_leafs_80_symbols():
    assert len(leaf.ALL_LETTERS) == 80 == leaf.NUM_LETTERS
    assert len(set(leaf.ALL_LETTERS)) == 80
    assert set("azAZ09 .,;:!?'\"-&()[]>}\n") <= set(leaf.ALL_LETTERS)
    assert leaf.ALL_LETTERS[leaf.UNKNOWN_INDEX] == " "


def test_encode_round_trip_and_unknown_symbols_counted():
    known = "To be, or not to be: that is the question!"
    assert leaf.decode_ids(leaf.encode_text(known)) == known
    unknown = Counter()
    ids = leaf.encode_text("a{b*c\u00e9{", unknown)
    counts = dict(unknown)
    assert counts == {"{": 2, "*": 1, "\u00e9": 1}
    expected = [leaf.ALL_LETTERS.index("a"), leaf.UNKNOWN_INDEX, leaf.ALL_LETTERS.index("b"),
                leaf.UNKNOWN_INDEX, leaf.ALL_LETTERS.index("c"), leaf.UNKNOWN_INDEX,
                leaf.UNKNOWN_INDEX]
    assert ids.tolist() == expected


def test_per_play_layout_roles_and_directions():
    plays = leaf.split_plays(PER_PLAY, "fallback")
    assert [t for t, _ in plays] == ["THE TRAGEDY OF TESTING"]
    lines = plays[0][1]
    assert leaf.detect_layout(lines) == "alone"
    roles, dropped = leaf.parse_roles(lines)
    assert roles == {
        "ALPHA": "The kettle sings before the water boils.",
        # The bracketed aside and the two-line exit are dropped; the paragraph after the exit
        # continues Beta's speech.
        "BETA": "Then let it sing; we wait for the boiling. And so the morning goes.",
        "GAMMA": "I speak inline, as the old texts do.",
        "1 WATCH": "Stand, who goes there?",
        "MRS. PAGE": "A visitor with letters.",
    }
    assert "PHYSICIAN" not in roles  # the cast list before the first heading is skipped
    assert dropped == 1  # the paragraph after ACT II has no speaker


def test_indented_layout_two_plays():
    plays = leaf.split_plays(INDENTED, "fallback")
    assert [t for t, _ in plays] == ["THE FIRST PLAY", "THE SECOND PLAY"]
    first, second = (leaf.parse_roles(lines) for _, lines in plays)
    assert leaf.detect_layout(plays[0][1]) == "indented"
    assert first[0] == {
        "ALPHA": "The tide is out, and the boats lie still upon the sand. Quietly.",
        "BETA": "Then we walk.",
    }
    assert second[0] == {"ALPHA": "A different Alpha, in another play. She says more."}


def test_builder_reads_the_1994_layout_from_any_txt(tmp_path):
    (tmp_path / "complete_works.txt").write_text(INDENTED)
    d = leaf.load_shakespeare(tmp_path, False, 0, seq_len=5)
    # Beta's 13 characters give 8 windows: 6 train and no test window after the gap: dropped.
    assert d.client_names == ["THE_FIRST_PLAY_ALPHA", "THE_SECOND_PLAY_ALPHA"]
    assert d.stats["roles_found"] == 3 and d.stats["roles_too_small"] == 1
    first = "The tide is out, and the boats lie still upon the sand. Quietly."
    assert leaf.decode_ids(d.train_x[d.client_indices[0][0]]) == first[:5]


def _reference_split(n, frac, seq_len):
    """LEAF's split_data.py rule for Shakespeare, written out longhand."""
    if n < 2:
        n_train = min(n, 1)
    elif n == 2:
        n_train = 1
    else:
        n_train = max(1, int(frac * n))
    train = [i for i in range(n) if i < n_train]
    test = [i for i in range(n) if i >= n_train + seq_len - 1]
    return train, test


@pytest.mark.parametrize("seq_len", [5, 80])
def test_split_by_position_matches_leaf_rule(seq_len):
    for n in range(0, 600, 7):
        train, test = leaf.split_positions(n, 0.8, seq_len)
        ref_train, ref_test = _reference_split(n, 0.8, seq_len)
        assert (list(train), list(test)) == (ref_train, ref_test)
        if train and test:
            # Test inputs start at the last train target: no test window lies inside train text.
            assert test[0] == train[-1] + seq_len


def _demo_roles(folder: Path) -> dict[str, str]:
    """Client name -> role text of the demo play (title = file stem, as the loader names it)."""
    lines = leaf.split_plays((folder / "demo_play_gut.txt").read_text(), "x")[0][1]
    roles = leaf.parse_roles(lines)[0]
    return {f"demo_play_gut_{n.replace(' ', '_')}": t for n, t in roles.items()}


def test_windows_and_targets_follow_role_text(tmp_path):
    folder = leaf.write_demo_plays(tmp_path / "plays", num_roles=3, speeches=6)
    d = leaf.load_shakespeare(folder, False, 0, seq_len=12)
    roles = _demo_roles(folder)
    assert len(d.client_indices) == 3 and d.num_classes == 80 and d.input_shape == (12,)
    for c, name in enumerate(d.client_names):
        role = roles[name]
        n = len(role) - 12
        train, test = leaf.split_positions(n, 0.8, 12)
        rows = d.client_indices[c]
        assert len(rows) == len(train)
        for k, i in enumerate(train):
            assert leaf.decode_ids(d.train_x[rows[k]]) == role[i : i + 12]
            assert leaf.ALL_LETTERS[d.train_y[rows[k]]] == role[i + 12]
        test_rows = d.client_test_indices[c]
        assert len(test_rows) == len(test)
        for k, j in enumerate(test):
            assert leaf.decode_ids(d.test_x[test_rows[k]]) == role[j : j + 12]
            assert leaf.ALL_LETTERS[d.test_y[test_rows[k]]] == role[j + 12]
    assert d.test_x.shape == (d.stats["test_samples"], 12)


def test_min_samples_and_max_roles_is_a_fixed_subset(tmp_path):
    folder = leaf.write_demo_plays(tmp_path / "plays", num_roles=6, speeches=5)
    full = leaf.load_shakespeare(folder, False, 0, seq_len=10)
    assert len(full.client_names) == 6
    windows = {n: len(t) - 10 for n, t in _demo_roles(folder).items()}
    threshold = sorted(windows.values())[3]
    big = leaf.load_shakespeare(folder, False, 0, seq_len=10, min_samples=threshold)
    assert set(big.client_names) == {n for n, w in windows.items() if w >= threshold}
    a = leaf.load_shakespeare(folder, False, 0, seq_len=10, max_roles=3)
    b = leaf.load_shakespeare(folder, False, 7, seq_len=10, max_roles=3)  # run seed ignored
    assert a.client_names == b.client_names and len(a.client_names) == 3
    assert set(a.client_names) <= set(full.client_names)
    assert len(a.test_y) == sum(len(t) for t in a.client_test_indices)


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


@pytest.mark.parametrize("shuffle", [False, True])
def test_leaf_shakespeare_json_round_trip(tmp_path, shuffle):
    # LEAF's own 80-character windows: roles need a few hundred characters.
    built = leaf.load_shakespeare(leaf.write_demo_plays(tmp_path / "p", 3, 16), False, 0)
    assert built.input_shape == (80,) and len(built.client_names) == 3
    train, test = {}, {}
    rng = np.random.default_rng(0)
    for c, name in enumerate(built.client_names):
        rows = built.client_indices[c].tolist()
        if shuffle:  # windows out of order: the loader must not assume consecutive windows
            rows = rng.permutation(rows).tolist()
        train[name] = {"x": [leaf.decode_ids(built.train_x[i]) for i in rows],
                       "y": [leaf.ALL_LETTERS[built.train_y[i]] for i in rows]}
        t = built.client_test_indices[c].tolist()
        test[name] = {"x": [leaf.decode_ids(built.test_x[i]) for i in t],
                      "y": [leaf.ALL_LETTERS[built.test_y[i]] for i in t]}
    root = tmp_path / "leaf" / "data" / "shakespeare" / "data"
    _leaf_json(root / "train", train)
    _leaf_json(root / "test", test)
    loaded = leaf.load_shakespeare(tmp_path, False, 0)
    assert loaded.client_names == built.client_names
    for c, name in enumerate(built.client_names):
        got = [leaf.decode_ids(loaded.train_x[i]) for i in loaded.client_indices[c]]
        assert got == train[name]["x"]
        got_y = [leaf.ALL_LETTERS[loaded.train_y[i]] for i in loaded.client_indices[c]]
        assert got_y == train[name]["y"]
    assert torch.equal(loaded.test_x, built.test_x) and torch.equal(loaded.test_y, built.test_y)


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


def test_natural_split_trains_through_the_engine(tmp_path, monkeypatch):
    """Registered as a dataset, the natural split and the strided windows train an LSTM."""
    from flnotes.config import RunConfig
    from flnotes.sim import run

    monkeypatch.setitem(data_module.DATASETS, "shakespeare", leaf.load_shakespeare)
    folder = leaf.write_demo_plays(tmp_path / "plays", num_roles=3, speeches=4)
    config = RunConfig(dataset="shakespeare", model="lstm", partition="natural", num_clients=3,
                       clients_per_round=2, rounds=1, batch_size=20, lr=0.5, momentum=0.0,
                       data_dir=str(folder), data_options={"seq_len": 8}, device="cpu")
    history = run(config, progress=False)
    assert history.status == "completed" and 0 <= history.final_accuracy <= 1
