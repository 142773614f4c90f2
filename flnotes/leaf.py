"""LEAF federated datasets: Shakespeare (LEAF's JSON or built from play texts) and FEMNIST.

Every loader returns a :class:`LeafData`: a TensorData plus the natural split, one client per
speaking role (Shakespeare) or writer (FEMNIST): ``client_indices`` (rows of train_x) and
``client_test_indices`` (rows of test_x). ``partition="natural"`` uses that split.

Shakespeare conventions, following LEAF's preprocessing (TalwalkarLab/leaf, data/shakespeare):
- alphabet: LEAF's 80 symbols (:data:`ALL_LETTERS`); any other symbol is mapped to
  :data:`UNKNOWN_INDEX` (the space, which LEAF's first builder used for unknown characters) and
  counted in ``stats["unknown_symbols"]``;
- a role's text is its speech lines joined by single spaces (LEAF turns newlines into spaces and
  collapses runs of spaces); one sample per position: 80 characters and the next one;
- split by position, per role (LEAF's split_data.py for Shakespeare): the first
  ``max(1, int(0.8 n))`` windows train, the test windows start ``seq_len - 1`` positions after
  the last train window so test inputs never overlap train targets; roles left with no train or
  no test window are dropped, as LEAF drops them.

Training windows overlap by 79 characters, so train_x is a strided view over one token stream
(a few MB instead of 80 x 8 bytes per sample); test_x is materialised.
"""

from __future__ import annotations

import json
import re
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
_LOOKUP = {c: i for i, c in enumerate(ALL_LETTERS)}
assert NUM_LETTERS == 80 and len(_LOOKUP) == 80
# Code point -> token id for ASCII, -1 elsewhere (the last entry stands for every code >= 128).
_CODE_TABLE = np.full(129, -1, dtype=np.int64)
_CODE_TABLE[[ord(c) for c in ALL_LETTERS]] = np.arange(NUM_LETTERS)

# 1994 complete-works layout (LEAF's source): "  NAME. text", continued by "    text".
_INDENTED_SPEAKER = re.compile(r"^  ([A-Za-z][A-Za-z ]*)\.(?: (.*))?$")
_INDENTED_CONTINUATION = re.compile(r"^    (\S.*)$")
# Per-play layout (Gutenberg texts of the `shakespeare` package): "Kent." alone on a line.
_ALONE_SPEAKER = re.compile(r"^([A-Z0-9][A-Za-z'-]*\.?(?: [A-Za-z'-]+\.?){0,4})\.$")
_INLINE_SPEAKER = re.compile(r"^([A-Z][A-Z'-]+(?: [A-Z'-]+){0,3})\. (\S.*)$")
_HEADING = re.compile(r"^(ACT|SCENE)\b", re.IGNORECASE)
_ROMAN = re.compile(r"^[IVXLC]+\.$")
_PARTICLES = {"and", "of", "the", "de", "la"}
_AUTHOR_LINE = re.compile(r"by William Shakespeare", re.IGNORECASE)


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


# ---------------------------------------------------------------- play texts -> roles


def split_plays(text: str, default_title: str) -> list[tuple[str, list[str]]]:
    """Cut a text into (title, lines) per play at each 'by William Shakespeare' line."""
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if _AUTHOR_LINE.search(line)]
    if not marks:
        return [(default_title, lines)]
    # As in LEAF: the title is the nearest non-blank line a few lines above the author line.
    title_at = [next((j for j in range(i - 1, max(i - 8, -1), -1) if lines[j].strip()), i)
                for i in marks]
    ends = title_at[1:] + [len(lines)]
    return [(lines[t].strip() if t != i else default_title, lines[i + 1 : end])
            for i, t, end in zip(marks, title_at, ends, strict=True)]


def detect_layout(lines: list[str]) -> str:
    """'indented' (1994 complete works) or 'alone' (speaker alone on a line), by counting cues."""
    indented = sum(bool(_INDENTED_SPEAKER.match(line)) for line in lines)
    alone = sum(
        1 for prev, line, nxt in zip([""] + lines[:-1], lines, lines[1:] + [""], strict=True)
        if not prev.strip() and nxt.strip() and _is_alone_speaker(line.strip())
    )
    return "indented" if indented > alone else "alone"


def _is_alone_speaker(line: str, lone: bool = False) -> bool:
    """A speaker line: capitalised words (or particles such as 'of'), ending in a period.

    ``lone``: the name has no speech lines under it (some texts put a blank line after the
    name); then only ALL-CAPS names count, so a short sentence like "Away." is not a role.
    """
    if (len(line) > 40 or not _ALONE_SPEAKER.match(line) or _HEADING.match(line)
            or _ROMAN.match(line)):
        return False
    words = line[:-1].split()
    if not all(w[0].isupper() or w[0].isdigit() or w in _PARTICLES for w in words):
        return False
    return not lone or line.upper() == line


def _alone_blocks(lines: list[str]):
    """Yield (role or None, speech text) per paragraph of the per-play layout.

    Parsing starts at the first ACT/SCENE heading (before it: title and cast list; a text
    without one is a poem and yields nothing). A paragraph opens with the speaker alone on a
    line (``Kent.``; or ``KENT. text`` inline, or the name alone followed by a blank line); a
    paragraph without a speaker continues the current one (speeches broken by a stage
    direction or a song); headings end the current speech.
    """
    blocks, block = [], []
    for line in lines + [""]:
        if line.strip():
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    # No heading at all: a poem, not a play (the sonnets and poems have no roles).
    first = next((i for i, b in enumerate(blocks) if _HEADING.match(b[0].strip())), len(blocks))
    current = None
    for block in blocks[first:]:
        head = block[0].strip()
        inline = _INLINE_SPEAKER.match(head)
        if _HEADING.match(head):
            current, speech = None, []
        elif _is_alone_speaker(head, lone=len(block) == 1):
            current, speech = _role_name(head[:-1]), block[1:]
        elif inline:
            current, speech = _role_name(inline.group(1)), [inline.group(2)] + block[1:]
        else:
            speech = block
        text = _drop_directions("\n".join(speech))
        if text.strip():
            yield current, text


def _role_name(name: str) -> str:
    return " ".join(name.upper().split())


def _drop_directions(text: str) -> str:
    """Remove stage directions in brackets (possibly over several lines)."""
    text = re.sub(r"\[[^\]]*\]", " ", text)
    return re.sub(r"\[.*", " ", text, flags=re.DOTALL).replace("]", " ")


def parse_roles(lines: list[str], layout: str = "auto") -> tuple[dict[str, str], int]:
    """Speech text per role name (upper-cased, as LEAF does) and the count of dropped blocks."""
    layout = detect_layout(lines) if layout == "auto" else layout
    roles: dict[str, list[str]] = {}
    dropped = 0
    if layout == "indented":
        current = None
        for line in lines:
            m = _INDENTED_SPEAKER.match(line)
            if m:
                current = m.group(1).strip().upper()
                roles.setdefault(current, []).append(m.group(2) or "")
                continue
            m = _INDENTED_CONTINUATION.match(line)
            if m and current is not None:
                roles[current].append(m.group(1))
            # Other lines (blank, deeper-indented stage directions) end nothing, as in LEAF.
    elif layout == "alone":
        for name, speech in _alone_blocks(lines):
            if name is None:
                dropped += 1
            else:
                roles.setdefault(name, []).append(speech)
    else:
        raise ValueError(f"unknown layout {layout!r}; use 'auto', 'indented' or 'alone'")
    # Directions are dropped over a role's whole text, so a bracket may span lines.
    cleaned = {name: role_text(_drop_directions("\n".join(parts))) for name, parts in roles.items()}
    return {n: t for n, t in cleaned.items() if t}, dropped


def role_text(text: str) -> str:
    """A role's speech as one line: whitespace runs -> one space (LEAF: newlines -> spaces)."""
    return re.sub(r"\s+", " ", text).strip()


def split_positions(num_windows: int, train_fraction: float = 0.8,
                    seq_len: int = SEQ_LEN) -> tuple[range, range]:
    """LEAF's by-position split of one role's windows: (train window ids, test window ids)."""
    n_train = max(1, int(train_fraction * num_windows))
    if num_windows == 2:
        n_train = 1
    return range(min(n_train, num_windows)), range(n_train + seq_len - 1, num_windows)


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


def _pack(texts: list[str], train_starts: list, test_starts: list, names: list[str],
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


def build_shakespeare(files: list[Path], seq_len: int = SEQ_LEN, train_fraction: float = 0.8,
                      min_samples: int = 0, max_roles: int | None = None, subset_seed: int = 0,
                      layout: str = "auto") -> LeafData:
    """Parse play texts into roles (clients), 80-char windows, LEAF's split by position."""
    clients: list[tuple[str, str, tuple[range, range]]] = []
    stats = {"plays": 0, "roles_found": 0, "roles_too_small": 0, "dropped_blocks": 0}
    for path in sorted(files):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for title, lines in split_plays(text, Path(path).stem):
            roles, dropped = parse_roles(lines, layout)
            stats["plays"] += bool(roles)
            stats["dropped_blocks"] += dropped
            for name, joined in roles.items():
                stats["roles_found"] += 1
                n = len(joined) - seq_len
                train, test = split_positions(max(n, 0), train_fraction, seq_len)
                if n < max(min_samples, 1) or not train or not test:
                    stats["roles_too_small"] += 1
                    continue
                # LEAF's user id: play and role with non-word characters as underscores.
                clients.append((re.sub(r"\W+", "_", f"{title}_{name}"), joined, (train, test)))
    if not clients:
        raise ValueError(f"no speaking role with enough text in {[str(f) for f in files]}")
    clients = [clients[i] for i in choose_subset(len(clients), max_roles, subset_seed)]
    return _pack([c[1] for c in clients], [c[2][0] for c in clients],
                 [c[2][1] for c in clients], [c[0] for c in clients], seq_len, stats)


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
    return _pack(texts, train_starts, test_starts, train_users, seq_len,
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


def find_play_files(data_dir: Path) -> list[Path]:
    """Play texts: *_gut.txt (per-play layout) or any other *.txt (e.g. the 1994 edition)."""
    skip = {"metadata.txt", "copying.txt", "readme.txt"}
    for d in (data_dir, data_dir / "shakespeare-plays", data_dir / "shakespeare"):
        files = sorted(d.glob("*_gut.txt")) or [
            f for f in sorted(d.glob("*.txt")) if f.name.lower() not in skip]
        if files:
            return files
    return []


def load_shakespeare(data_dir: Path, download: bool, seed: int, source: str = "auto",
                     max_roles: int | None = None, min_samples: int = 0, subset_seed: int = 0,
                     seq_len: int = SEQ_LEN, train_fraction: float = 0.8,
                     layout: str = "auto") -> LeafData:
    """LEAF Shakespeare: LEAF's JSON if data_dir holds it, else built from play texts.

    ``max_roles`` keeps a fixed random subset of roles (drawn with ``subset_seed``, not the run
    seed, so every seed of a sweep sees the same clients); ``min_samples`` drops roles with
    fewer windows (LEAF's ``-k``).
    """
    data_dir = Path(data_dir)
    root = find_leaf_root(data_dir, "shakespeare") if source in ("auto", "leaf") else None
    if root is not None:
        data = load_leaf_shakespeare(root)
        keep = [i for i, c in enumerate(data.client_indices) if len(c) >= max(min_samples, 1)]
        return _select_clients(data, [keep[i] for i in choose_subset(len(keep), max_roles,
                                                                     subset_seed)])
    files = find_play_files(data_dir) if source in ("auto", "plays") else []
    if not files:
        hint = " (there is no download: LEAF's scripts need the internet)" if download else ""
        raise FileNotFoundError(
            f"Shakespeare not found in {data_dir}{hint}: expected LEAF's JSON (train/*.json and "
            "test/*.json, from LEAF's preprocess.sh) or play texts (*_gut.txt, or the 1994 "
            "complete works as a .txt). Point data_dir (or $FLNOTES_DATA) at one of them; "
            "flnotes.leaf.write_demo_plays(folder) writes a tiny made-up play for smoke tests.")
    return build_shakespeare(files, seq_len, train_fraction, min_samples, max_roles,
                             subset_seed, layout)


def _select_clients(data: LeafData, keep: list[int]) -> LeafData:
    """The same data restricted to some clients (test rows re-indexed, train view kept)."""
    if len(keep) == len(data.client_indices):
        return data
    tests = [data.client_test_indices[i] for i in keep]
    rows = torch.cat(tests) if tests else torch.zeros(0, dtype=torch.int64)
    return LeafData(data.name, data.train_x, data.train_y, data.test_x[rows], data.test_y[rows],
                    data.num_classes, client_indices=[data.client_indices[i] for i in keep],
                    client_test_indices=_consecutive([len(t) for t in tests]),
                    client_names=[data.client_names[i] for i in keep],
                    stats=dict(data.stats, clients=len(keep)))


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


def write_demo_plays(folder: str | Path, num_roles: int = 4, speeches: int = 8,
                     seed: int = 0) -> Path:
    """Write a made-up play in the per-play layout (each role has its own small vocabulary)."""
    rng = numpy_rng(seed, "demo-play")
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = [["".join(rng.choice(letters, size=int(rng.integers(2, 6)))) for _ in range(6)]
             for _ in range(num_roles)]
    out = ["THE DEMO PLAY", "", "ACT I.", "", "Scene I. A bare stage.", "", "[Enter all.]", ""]
    for _ in range(speeches):
        for role in rng.permutation(num_roles).tolist():
            lines = []
            for _ in range(int(rng.integers(1, 3))):
                words = rng.choice(vocab[role], size=int(rng.integers(5, 9))).tolist()
                lines.append(" ".join(words).capitalize() + rng.choice([",", ".", "!", "?"]))
            out += [f"Speaker {chr(65 + role)}.", *lines, ""]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo_play_gut.txt"
    path.write_text("\n".join(out) + "\n")
    return folder
