"""LEAF federated datasets: Shakespeare (LEAF's JSON or built from play texts) and FEMNIST.

Every loader returns a :class:`LeafData`: a TensorData plus the natural split, one client per
speaking role (Shakespeare) or writer (FEMNIST): ``client_indices`` (rows of train_x) and
``client_test_indices`` (rows of test_x). ``partition="natural"`` uses that split.

Shakespeare's alphabet is LEAF's 80 symbols (:data:`ALL_LETTERS`); any other symbol is mapped to
:data:`UNKNOWN_INDEX` (the space, which LEAF's first builder used for unknown characters) and
counted in ``stats["unknown_symbols"]``. Building it from play texts (roles, windows, LEAF's
split by position) is :mod:`flnotes.plays`; this module reads LEAF's JSON, packs windows into
tensors for both sources, and holds the loaders registered as datasets.

Training windows overlap by 79 characters, so train_x is a strided view over one token stream
(a few MB instead of 80 x 8 bytes per sample); test_x is materialised.
"""

from __future__ import annotations

import json
import numbers
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flnotes.data import TensorData
from flnotes.rng import numpy_rng

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
NUM_LETTERS = len(ALL_LETTERS)  # 80
UNKNOWN_INDEX = ALL_LETTERS.index(" ")
SEQ_LEN = 80
assert NUM_LETTERS == 80 and len(set(ALL_LETTERS)) == 80
# Code point -> token id for ASCII, -1 elsewhere (the last entry stands for every code >= 128).
_CODE_TABLE = np.full(129, -1, dtype=np.int64)
_CODE_TABLE[[ord(c) for c in ALL_LETTERS]] = np.arange(NUM_LETTERS)


@dataclass(repr=False)
class LeafData(TensorData):
    """TensorData plus LEAF's natural split: one client per role or writer."""

    client_indices: list[torch.Tensor] = field(default_factory=list)  # rows of train_x
    client_test_indices: list[torch.Tensor] = field(default_factory=list)  # rows of test_x
    client_names: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def encode_text(text: str, unknown: Counter | None = None) -> np.ndarray:
    """Token ids over ALL_LETTERS (int64); other symbols -> UNKNOWN_INDEX, counted in unknown."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = _CODE_TABLE[np.minimum(codes, len(_CODE_TABLE) - 1)]
    missing = ids < 0
    if missing.any():
        if unknown is not None:
            unknown.update(chr(c) for c in codes[missing].tolist())
        ids[missing] = UNKNOWN_INDEX
    return ids


def decode_ids(ids) -> str:
    """Inverse of encode_text for known symbols."""
    return "".join(ALL_LETTERS[int(i)] for i in ids)


# ---------------------------------------------------------------- packing into tensors


def _index_tensor(starts) -> torch.Tensor:
    if isinstance(starts, range):
        return torch.arange(starts.start, starts.stop, dtype=torch.int64)
    return torch.tensor(list(starts), dtype=torch.int64)


def _offsets(texts: list[str]) -> list[int]:
    return np.concatenate([[0], np.cumsum([len(t) for t in texts])])[:-1].astype(int).tolist()


def _consecutive(sizes: list[int]) -> list[torch.Tensor]:
    """Index tensors 0..a-1, a..a+b-1, ... for consecutive blocks of the given sizes."""
    bounds = np.cumsum([0] + list(sizes)).tolist()
    return [torch.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def pack_windows(texts: list[str], train_starts: list, test_starts: list, names: list[str],
                 seq_len: int, stats: dict, test_texts: list[str] | None = None) -> LeafData:
    """Clients' texts and window starts (client-relative) -> LeafData.

    Train windows are a strided view over the concatenated stream; ``test_texts`` (LEAF JSON)
    gives the test windows their own stream, else they come from the same texts.
    """
    unknown: Counter = Counter()

    def windows(text_list: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        stream = torch.from_numpy(encode_text("".join(text_list), unknown))
        return stream, stream.as_strided((max(len(stream) - seq_len, 0), seq_len), (1, 1))

    stream, train_x = windows(texts)
    test_stream, test_view = (stream, train_x) if test_texts is None else windows(test_texts)
    def shift(starts: list, offsets: list[int]) -> list[torch.Tensor]:
        return [_index_tensor(s) + o for s, o in zip(starts, offsets, strict=True)]

    train_idx = shift(train_starts, _offsets(texts))
    test_rows = shift(test_starts, _offsets(texts if test_texts is None else test_texts))
    all_test = torch.cat(test_rows) if test_rows else torch.zeros(0, dtype=torch.int64)
    stats = dict(stats, unknown_symbols=dict(sorted(unknown.items())),
                 unknown_total=int(sum(unknown.values())), clients=len(texts),
                 train_samples=int(sum(len(t) for t in train_idx)), test_samples=len(all_test))
    return LeafData(
        "shakespeare", train_x, stream[seq_len:], test_view[all_test],
        test_stream[all_test + seq_len], NUM_LETTERS, client_indices=train_idx,
        client_test_indices=_consecutive([len(r) for r in test_rows]),
        client_names=list(names), stats=stats)


def check_max_samples(max_samples: int | None) -> None:
    """Raise ValueError unless max_samples is None or an integer >= 1."""
    integer = isinstance(max_samples, numbers.Integral) and not isinstance(max_samples, bool)
    if max_samples is not None and not (integer and max_samples >= 1):
        raise ValueError(f"max_samples must be an integer >= 1 or None (no cap), "
                         f"got {max_samples!r}")


def cap_windows(num_train: int, num_test: int, max_samples: int | None, seed: int,
                name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Sorted train and test window ids a client keeps under max_samples (None: keep all).

    A client with more than ``max_samples`` train windows keeps ``max_samples`` of them, drawn
    without replacement, and the same fraction of its test windows (at least one), so its
    train/test proportion stays. The draw depends only on ``seed`` and the client's name: a
    client keeps the same windows whichever other clients are kept.
    """
    check_max_samples(max_samples)
    if max_samples is None or num_train <= max_samples:
        return None
    rng = numpy_rng(seed, "leaf-max-samples", name)
    keep_test = min(num_test, max(1, round(num_test * max_samples / num_train)))
    return (np.sort(rng.choice(num_train, max_samples, replace=False)),
            np.sort(rng.choice(num_test, keep_test, replace=False)))


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
    empty = {"x": [], "y": []}
    tests = [test.get(u, empty) for u in train_users]
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
                    client_indices=_consecutive([len(train[u]["y"]) for u in train_users]),
                    client_test_indices=_consecutive([len(t["y"]) for t in tests]),
                    client_names=list(train_users),
                    stats={"clients": len(tests), "train_samples": n, "test_samples": n_test})


# ---------------------------------------------------------------- registry loaders


def register() -> None:
    """Make 'shakespeare' and 'femnist' loadable by name (idempotent)."""
    from flnotes import data

    data.DATASETS.setdefault("shakespeare", load_shakespeare)
    data.DATASETS.setdefault("femnist", load_femnist)


def choose_subset(count: int, keep: int | None, seed: int) -> list[int]:
    """Sorted indices of a fixed random subset of clients (all of them when keep is None)."""
    if keep is None or keep >= count:
        return list(range(count))
    return sorted(numpy_rng(seed, "leaf-subset").choice(count, keep, replace=False).tolist())


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
        return _select_clients(data, [keep[i] for i in choose_subset(len(keep), max_roles,
                                                                     subset_seed)],
                               max_samples, subset_seed)
    # Imported here: flnotes.plays builds on this module's LeafData and packing.
    from flnotes.plays import build_shakespeare, find_play_files

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
            "flnotes.plays.write_demo_plays(folder) writes a tiny made-up play for smoke tests.")
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
                    client_test_indices=_consecutive([len(t) for t in tests]),
                    client_names=names, stats=stats)


def load_femnist(data_dir: Path, download: bool, seed: int, max_writers: int | None = None,
                 subset_seed: int = 0) -> LeafData:
    """FEMNIST from LEAF's JSON (run LEAF's preprocess.sh; there is no download here)."""
    root = find_leaf_root(Path(data_dir), "femnist")
    if root is None:
        raise FileNotFoundError(
            f"FEMNIST not found in {data_dir}: expected LEAF's JSON (train/*.json, test/*.json) "
            "made by LEAF's data/femnist/preprocess.sh; point data_dir at that data folder.")
    data = load_leaf_femnist(root)
    return _select_clients(data, choose_subset(len(data.client_indices), max_writers,
                                               subset_seed))

