"""LEAF's federated datasets, Shakespeare and FEMNIST: reading LEAF's JSON, and the loaders.

Shakespeare comes from LEAF's JSON when the data folder holds it, else it is built from play
texts (:mod:`flnotes.data.plays`). Both become a :class:`~flnotes.data.natural.LeafData`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from flnotes.data.natural import (
    SEQ_LEN,
    LeafData,
    cap_windows,
    check_max_samples,
    choose_subset,
    consecutive_blocks,
    pack_windows,
)
from flnotes.data.plays import build_shakespeare, find_play_files

# ---------------------------------------------------------------- LEAF JSON


def read_leaf_json(folder: Path) -> tuple[list[str], dict]:
    """Users (in file order) and user_data merged over the *.json files of a folder."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no LEAF *.json files in {folder}")
    users, user_data = [], {}
    for f in files:
        with open(f) as fh:
            d = json.load(fh)
        for key in ("users", "user_data"):
            if key not in d:
                raise ValueError(f"{f} is not LEAF all_data JSON: no {key!r} key")
        users += [u for u in d["users"] if u not in user_data]
        user_data.update(d["user_data"])
    return users, user_data


def _join_windows(xs: list[str], ys: list[str], seq_len: int) -> tuple[str, list[int]]:
    """A text and window starts such that text[s:s+L] == x and text[s+L] == y for each sample."""
    parts, starts, length, expected = [], [], 0, None
    for x, y in zip(xs, ys, strict=True):
        if len(x) != seq_len or len(y) != 1:
            raise ValueError(f"LEAF sample with x of length {len(x)} (expected {seq_len}) "
                             f"or y of length {len(y)} (expected 1)")
        if x == expected:  # the next window of the same text: one new character
            starts.append(starts[-1] + 1)
            parts.append(y)
            length += 1
        else:
            starts.append(length)
            parts += [x, y]
            length += seq_len + 1
        expected = x[1:] + y
    return "".join(parts), starts


def load_leaf_shakespeare(root: Path) -> LeafData:
    """LEAF's Shakespeare JSON (root/train/*.json, root/test/*.json) as token ids."""
    train_users, train = read_leaf_json(root / "train")
    _, test = read_leaf_json(root / "test")
    seq_len = next((len(d["x"][0]) for d in train.values() if d["x"]), SEQ_LEN)
    texts, train_starts, test_texts, test_starts = [], [], [], []
    for u in train_users:
        text, starts = _join_windows(train[u]["x"], train[u]["y"], seq_len)
        t = test.get(u, {"x": [], "y": []})
        test_text, t_starts = _join_windows(t["x"], t["y"], seq_len)
        texts.append(text)
        train_starts.append(starts)
        test_texts.append(test_text)
        test_starts.append(t_starts)
    return pack_windows(texts, train_starts, test_starts, train_users, seq_len,
                        {"source": str(root)}, test_texts=test_texts)


def load_leaf_femnist(root: Path) -> LeafData:
    """LEAF's FEMNIST JSON (x: 784 floats, y: 0-61) as (N,1,28,28), one client per writer."""
    train_users, train = read_leaf_json(root / "train")
    _, test = read_leaf_json(root / "test")
    tests = [test.get(u, {"x": [], "y": []}) for u in train_users]
    xs = [x for u in train_users for x in train[u]["x"]]
    test_xs = [x for t in tests for x in t["x"]]
    ys = [y for u in train_users for y in train[u]["y"]]
    test_ys = [y for t in tests for y in t["y"]]
    n, n_test = len(ys), len(test_ys)

    def images(rows: list) -> torch.Tensor:
        arr = np.asarray(rows, dtype=np.float32).reshape(-1, 784)
        return torch.from_numpy(arr).view(-1, 1, 28, 28)

    labels = torch.tensor(ys + test_ys, dtype=torch.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= 62):
        raise ValueError(f"FEMNIST labels must lie in 0..61, found {labels.min()}..{labels.max()}")
    return LeafData("femnist", images(xs), labels[:n], images(test_xs), labels[n:], 62,
                    client_indices=consecutive_blocks([len(train[u]["y"]) for u in train_users]),
                    client_test_indices=consecutive_blocks([len(t["y"]) for t in tests]),
                    client_names=list(train_users),
                    stats={"clients": len(tests), "train_samples": n, "test_samples": n_test})


# ---------------------------------------------------------------- registry loaders


def find_leaf_root(data_dir: Path, name: str) -> Path | None:
    """The folder holding LEAF's train/ and test/ JSON for a dataset, if any."""
    for root in (data_dir, data_dir / name, data_dir / name / "data",
                 data_dir / "leaf" / "data" / name / "data"):
        if (root / "test").is_dir() and any((root / "train").glob("*.json")):
            return root
    return None


def load_shakespeare(data_dir: Path, download: bool, seed: int, source: str = "auto",
                     max_roles: int | None = None, min_samples: int = 0, subset_seed: int = 0,
                     seq_len: int = SEQ_LEN, train_fraction: float = 0.8,
                     layout: str = "auto", max_samples: int | None = None) -> LeafData:
    """LEAF Shakespeare: LEAF's JSON if data_dir holds it, else built from play texts.

    ``max_roles`` keeps a fixed random subset of roles (drawn with ``subset_seed``, not the run
    seed, so every seed of a sweep sees the same clients); ``min_samples`` drops roles with
    fewer windows (LEAF's ``-k``). ``max_samples`` caps each role at that many train windows,
    a random sample drawn with ``subset_seed``, and keeps the same fraction of its test windows
    (None: no cap; roles at or below the cap are untouched; ``min_samples`` is checked first).
    """
    check_max_samples(max_samples)
    if source not in ("auto", "leaf", "plays"):
        raise ValueError(f"source={source!r}: choose 'auto', 'leaf' (LEAF's JSON) or 'plays'")
    data_dir = Path(data_dir)
    root = find_leaf_root(data_dir, "shakespeare") if source in ("auto", "leaf") else None
    if root is not None:
        data = load_leaf_shakespeare(root)
        keep = [i for i, c in enumerate(data.client_indices) if len(c) >= max(min_samples, 1)]
        chosen = [keep[i] for i in choose_subset(len(keep), max_roles, subset_seed)]
        return _select_clients(data, chosen, max_samples, subset_seed)

    if source == "leaf":
        plays_hint = (" It holds play texts: use source='plays' (or 'auto') for them."
                      if find_play_files(data_dir) else "")
        raise FileNotFoundError(
            f"source='leaf' but {data_dir} holds no LEAF JSON (train/*.json and test/*.json, "
            f"from LEAF's preprocess.sh).{plays_hint}")
    files = find_play_files(data_dir)
    if not files:
        hint = " (there is no download: LEAF's scripts need the internet)" if download else ""
        raise FileNotFoundError(
            f"Shakespeare not found in {data_dir}{hint}: expected LEAF's JSON (train/*.json and "
            "test/*.json, from LEAF's preprocess.sh) or play texts (*_gut.txt, or the 1994 "
            "complete works as a .txt). Point data_dir (or $FLNOTES_DATA) at one of them; "
            "flnotes.data.plays.write_demo_plays(folder) writes a tiny made-up play for smoke "
            "tests.")
    return build_shakespeare(files, seq_len, train_fraction, min_samples, max_roles,
                             subset_seed, layout, max_samples)


def _select_clients(data: LeafData, keep: list[int], max_samples: int | None = None,
                    seed: int = 0) -> LeafData:
    """The same data restricted to some clients, each capped by cap_windows (train view kept)."""
    if len(keep) == len(data.client_indices) and max_samples is None:
        return data
    trains = [data.client_indices[i] for i in keep]
    tests = [data.client_test_indices[i] for i in keep]
    names = [data.client_names[i] for i in keep]
    capped = 0
    for c, name in enumerate(names):
        picked = cap_windows(len(trains[c]), len(tests[c]), max_samples, seed, name)
        if picked is not None:
            capped += 1
            trains[c] = trains[c][torch.from_numpy(picked[0])]
            tests[c] = tests[c][torch.from_numpy(picked[1])]
    rows = torch.cat(tests) if tests else torch.zeros(0, dtype=torch.int64)
    stats = dict(data.stats, clients=len(keep), train_samples=int(sum(len(t) for t in trains)),
                 test_samples=len(rows))
    if max_samples is not None:
        stats["capped_clients"] = capped
    return LeafData(data.name, data.train_x, data.train_y, data.test_x[rows], data.test_y[rows],
                    data.num_classes, client_indices=trains,
                    client_test_indices=consecutive_blocks([len(t) for t in tests]),
                    client_names=names, stats=stats)


def load_femnist(data_dir: Path, download: bool, seed: int, max_writers: int | None = None,
                 subset_seed: int = 0, min_samples: int = 0, pad: int = 0) -> LeafData:
    """FEMNIST from LEAF's JSON (run LEAF's preprocess.sh; there is no download here).

    ``min_samples`` keeps only writers with at least that many training samples (FedMR's
    180 clients each "host more than 100 local data samples": 101); ``max_writers`` then
    keeps a fixed random subset of them, drawn with ``subset_seed``. ``pad`` widens every
    28x28 image by that many pixels on each side (2: 32x32, for VGG-16, which FedMR's
    Table 1 also runs on FEMNIST), repeating the border pixels, which are background.
    """
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad <= 64:
        raise ValueError(f"FEMNIST option pad must be an integer in 0..64; got {pad!r}")
    root = find_leaf_root(Path(data_dir), "femnist")
    if root is None:
        raise FileNotFoundError(
            f"FEMNIST not found in {data_dir}: expected LEAF's JSON (train/*.json, test/*.json) "
            "made by LEAF's data/femnist/preprocess.sh; point data_dir at that data folder.")
    data = load_leaf_femnist(root)
    eligible = [i for i, rows in enumerate(data.client_indices) if len(rows) >= min_samples]
    if not eligible:
        raise ValueError(f"no FEMNIST writer in {root} has min_samples={min_samples} training "
                         "samples; lower min_samples")
    chosen = choose_subset(len(eligible), max_writers, subset_seed)
    data = _select_clients(data, [eligible[i] for i in chosen])
    if pad:
        # replicate: LEAF's images have a uniform background at the border, so the new
        # pixels continue it instead of drawing a frame of zeros around every character.
        data.train_x = F.pad(data.train_x, (pad,) * 4, mode="replicate")
        data.test_x = F.pad(data.test_x, (pad,) * 4, mode="replicate")
    return data

