"""Datasets with a natural client split (LEAF's Shakespeare and FEMNIST), held as tensors.

:class:`LeafData` is a TensorData plus the natural split, one client per speaking role
(Shakespeare) or writer (FEMNIST): ``client_indices`` (rows of train_x) and
``client_test_indices`` (rows of test_x). ``partition="natural"`` uses that split.

Shakespeare's alphabet is LEAF's 80 symbols (:data:`ALL_LETTERS`); any other symbol is mapped to
:data:`UNKNOWN_INDEX` (the space, which LEAF's first builder used for unknown characters) and
counted in ``stats["unknown_symbols"]``. This module holds what both sources of Shakespeare
share (LEAF's JSON, :mod:`flnotes.data.leaf`; play texts, :mod:`flnotes.data.plays`): the
alphabet, packing windows into tensors, and the per-client caps and subsets.

Training windows overlap by 79 characters, so train_x is a strided view over one token stream
(a few MB instead of 80 x 8 bytes per sample); test_x is materialised.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from flnotes.data.tensors import TensorData
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


def consecutive_blocks(sizes: list[int]) -> list[torch.Tensor]:
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
    def shift(starts: list, text_list: list[str]) -> list[torch.Tensor]:
        # Client-relative starts -> rows of the stream: add each client's offset in it.
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in text_list])])[:-1].astype(int)
        return [_index_tensor(s) + o for s, o in zip(starts, offsets.tolist(), strict=True)]

    train_idx = shift(train_starts, texts)
    test_rows = shift(test_starts, texts if test_texts is None else test_texts)
    all_test = torch.cat(test_rows) if test_rows else torch.zeros(0, dtype=torch.int64)
    stats = dict(stats, unknown_symbols=dict(sorted(unknown.items())),
                 unknown_total=int(sum(unknown.values())), clients=len(texts),
                 train_samples=int(sum(len(t) for t in train_idx)), test_samples=len(all_test))
    return LeafData("shakespeare", train_x, stream[seq_len:], test_view[all_test],
                    test_stream[all_test + seq_len], NUM_LETTERS, client_indices=train_idx,
                    client_test_indices=consecutive_blocks([len(r) for r in test_rows]),
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


def choose_subset(count: int, keep: int | None, seed: int) -> list[int]:
    """Sorted indices of a fixed random subset of clients (all of them when keep is None)."""
    if keep is None or keep >= count:
        return list(range(count))
    return sorted(numpy_rng(seed, "leaf-subset").choice(count, keep, replace=False).tolist())
