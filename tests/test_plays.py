"""Play texts -> LEAF-style Shakespeare: both layouts, roles, windows, split, sample cap."""

from collections import Counter
from pathlib import Path

import pytest
import torch

from flnotes.data import leaf, load_dataset, natural, plays

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


def test_per_play_layout_roles_and_directions():
    found = plays.split_plays(PER_PLAY, "fallback")
    assert [t for t, _ in found] == ["THE TRAGEDY OF TESTING"]
    lines = found[0][1]
    assert plays.detect_layout(lines) == "alone"
    roles, dropped = plays.parse_roles(lines)
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
    found = plays.split_plays(INDENTED, "fallback")
    assert [t for t, _ in found] == ["THE FIRST PLAY", "THE SECOND PLAY"]
    first, second = (plays.parse_roles(lines) for _, lines in found)
    assert plays.detect_layout(found[0][1]) == "indented"
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
    assert natural.decode_ids(d.train_x[d.client_indices[0][0]]) == first[:5]


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
        train, test = plays.split_positions(n, 0.8, seq_len)
        ref_train, ref_test = _reference_split(n, 0.8, seq_len)
        assert (list(train), list(test)) == (ref_train, ref_test)
        if train and test:
            # Test inputs start at the last train target: no test window lies inside train text.
            assert test[0] == train[-1] + seq_len


def _demo_roles(folder: Path) -> dict[str, str]:
    """Client name -> role text of the demo play (title = file stem, as the loader names it)."""
    lines = plays.split_plays((folder / "demo_play_gut.txt").read_text(), "x")[0][1]
    roles = plays.parse_roles(lines)[0]
    return {f"demo_play_gut_{n.replace(' ', '_')}": t for n, t in roles.items()}


def test_windows_and_targets_follow_role_text(tmp_path):
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=3, speeches=6)
    d = leaf.load_shakespeare(folder, False, 0, seq_len=12)
    roles = _demo_roles(folder)
    assert len(d.client_indices) == 3 and d.num_classes == 80 and d.input_shape == (12,)
    for c, name in enumerate(d.client_names):
        role = roles[name]
        n = len(role) - 12
        train, test = plays.split_positions(n, 0.8, 12)
        rows = d.client_indices[c]
        assert len(rows) == len(train)
        for k, i in enumerate(train):
            assert natural.decode_ids(d.train_x[rows[k]]) == role[i : i + 12]
            assert natural.ALL_LETTERS[d.train_y[rows[k]]] == role[i + 12]
        test_rows = d.client_test_indices[c]
        assert len(test_rows) == len(test)
        for k, j in enumerate(test):
            assert natural.decode_ids(d.test_x[test_rows[k]]) == role[j : j + 12]
            assert natural.ALL_LETTERS[d.test_y[test_rows[k]]] == role[j + 12]
    assert d.test_x.shape == (d.stats["test_samples"], 12)


def test_min_samples_and_max_roles_is_a_fixed_subset(tmp_path):
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=6, speeches=5)
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


def _windows(d: natural.LeafData, c: int, test: bool) -> Counter:
    """A client's (input, target) windows as decoded strings, with multiplicity."""
    x, y, rows = ((d.test_x, d.test_y, d.client_test_indices[c]) if test
                  else (d.train_x, d.train_y, d.client_indices[c]))
    return Counter((natural.decode_ids(x[r]), natural.ALL_LETTERS[y[r]]) for r in rows.tolist())


@pytest.fixture
def capped_play(tmp_path):
    """A demo play, its uncapped build and a cap with roles both above and below it."""
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=5, speeches=6)
    full = leaf.load_shakespeare(folder, False, 0, seq_len=10)
    sizes = sorted(len(c) for c in full.client_indices)
    cap = sizes[1]
    assert sizes[0] <= cap < sizes[-1]  # the demo play's roles differ in length
    return folder, full, cap


def test_max_samples_caps_train_and_test_proportionally(capped_play):
    folder, full, cap = capped_play
    d = leaf.load_shakespeare(folder, False, 0, seq_len=10, max_samples=cap)
    assert d.client_names == full.client_names
    # Same roles in the same order: the token stream and so the train rows are shared.
    assert torch.equal(d.train_x, full.train_x) and torch.equal(d.train_y, full.train_y)
    capped = 0
    for c in range(len(full.client_names)):
        n_train, n_test = len(full.client_indices[c]), len(full.client_test_indices[c])
        rows, test_rows = d.client_indices[c], d.client_test_indices[c]
        if n_train <= cap:  # untouched: every window, in order
            assert torch.equal(rows, full.client_indices[c])
            assert torch.equal(d.test_x[test_rows], full.test_x[full.client_test_indices[c]])
            assert torch.equal(d.test_y[test_rows], full.test_y[full.client_test_indices[c]])
            continue
        capped += 1
        assert len(rows) == cap and len(set(rows.tolist())) == cap
        assert set(rows.tolist()) <= set(full.client_indices[c].tolist())
        assert rows.tolist() == sorted(rows.tolist())
        assert len(test_rows) == max(1, round(n_test * cap / n_train))
        # The kept test windows are some of the role's own test windows (nothing new).
        assert not _windows(d, c, test=True) - _windows(full, c, test=True)
    assert capped >= 1 and d.stats["capped_clients"] == capped
    assert d.stats["train_samples"] == sum(map(len, d.client_indices))
    assert d.stats["test_samples"] == len(d.test_y) == sum(map(len, d.client_test_indices))


def test_max_samples_draw_follows_subset_seed_only(capped_play):
    folder, full, cap = capped_play

    def load(seed: int, subset_seed: int) -> natural.LeafData:
        return leaf.load_shakespeare(folder, False, seed, seq_len=10, max_samples=cap,
                                     subset_seed=subset_seed)

    a, again, other_run_seed, other = load(0, 3), load(0, 3), load(9, 3), load(0, 4)
    for same in (again, other_run_seed):
        pairs = zip(a.client_indices, same.client_indices, strict=True)
        assert all(torch.equal(x, y) for x, y in pairs)
        assert torch.equal(a.test_x, same.test_x) and torch.equal(a.test_y, same.test_y)
    big = [c for c, rows in enumerate(full.client_indices) if len(rows) > cap]
    assert any(not torch.equal(a.client_indices[c], other.client_indices[c]) for c in big)


def test_max_samples_at_least_every_role_changes_nothing(capped_play):
    folder, full, _ = capped_play
    most = max(len(c) for c in full.client_indices)
    d = plays.build_shakespeare(plays.find_play_files(folder), seq_len=10, max_samples=most)
    assert d.stats["capped_clients"] == 0
    pairs = zip(d.client_indices, full.client_indices, strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert torch.equal(d.test_x, full.test_x) and torch.equal(d.test_y, full.test_y)


def test_max_samples_arrives_through_data_options(capped_play):
    """RunConfig.data_options reach the loader through the dataset registry."""
    folder, _, cap = capped_play
    d = load_dataset("shakespeare", folder, seq_len=10, max_samples=cap)
    assert max(len(c) for c in d.client_indices) == cap


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "10"])
def test_max_samples_must_be_a_positive_integer(tmp_path, bad):
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=2, speeches=2)
    with pytest.raises(ValueError, match="max_samples"):
        leaf.load_shakespeare(folder, False, 0, seq_len=10, max_samples=bad)
    with pytest.raises(ValueError, match="max_samples"):
        plays.build_shakespeare(plays.find_play_files(folder), seq_len=10, max_samples=bad)
    with pytest.raises(ValueError, match="max_samples"):  # before looking for any data
        leaf.load_shakespeare(tmp_path / "nothing", False, 0, max_samples=bad)


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_resplit_draws_only_the_kept_roles_training_windows(capped_play, partition):
    """max_roles / max_samples bound an iid or Dirichlet re-split too, and no client gets a
    window that is a test window (the texts hold both)."""
    from flnotes.config import RunConfig
    from flnotes.engine.tasks import build_task

    folder, _, cap = capped_play
    options = {"seq_len": 10, "max_roles": 3, "max_samples": cap}
    natural = load_dataset("shakespeare", folder, **options)
    config = RunConfig(dataset="shakespeare", model="lstm", partition=partition,
                       num_clients=2, clients_per_round=2, min_client_size=1,
                       data_dir=str(folder), data_options=options, device="cpu")
    task = build_task(config)
    dealt = torch.cat(task.client_indices).tolist()
    assert sorted(dealt) == sorted(torch.cat(natural.client_indices).tolist())
    assert len(dealt) == natural.stats["train_samples"] < len(natural.train_y)


def test_source_leaf_without_json_says_what_the_folder_holds(tmp_path):
    folder = plays.write_demo_plays(tmp_path / "plays", num_roles=2, speeches=2)
    with pytest.raises(FileNotFoundError, match="no LEAF JSON.*source='plays'"):
        leaf.load_shakespeare(folder, False, 0, source="leaf")
    with pytest.raises(ValueError, match="choose 'auto', 'leaf'"):
        leaf.load_shakespeare(folder, False, 0, source="json")
    assert leaf.load_shakespeare(folder, False, 0, source="plays", seq_len=10).client_names
