"""LEAF-style Shakespeare built from play texts: one client per speaking role of each play.

Conventions follow LEAF's preprocessing (TalwalkarLab/leaf, data/shakespeare):
- two layouts: the 1994 complete works LEAF reads ("  NAME. text", continued by "    text") and
  per-play Gutenberg texts (the speaker alone on a line); :func:`detect_layout` picks one;
- a role's text is its speech lines joined by single spaces (LEAF turns newlines into spaces and
  collapses runs of spaces); one sample per position: 80 characters and the next one;
- split by position, per role (LEAF's split_data.py for Shakespeare): the first
  ``max(1, int(0.8 n))`` windows train, the test windows start ``seq_len - 1`` positions after
  the last train window so test inputs never overlap train targets; roles left with no train or
  no test window are dropped, as LEAF drops them.

The alphabet, the encoding and the packing into a :class:`~flnotes.data.natural.LeafData` are shared
with LEAF's JSON and live in :mod:`flnotes.data.natural`.
"""

from __future__ import annotations

import re
from pathlib import Path

from flnotes.data.natural import (
    SEQ_LEN,
    LeafData,
    cap_windows,
    check_max_samples,
    choose_subset,
    pack_windows,
)
from flnotes.rng import numpy_rng

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
    triples = zip([""] + lines[:-1], lines, lines[1:] + [""], strict=True)
    alone = sum(1 for prev, line, nxt in triples
                if not prev.strip() and nxt.strip() and _is_alone_speaker(line.strip()))
    return "indented" if indented > alone else "alone"


def _is_alone_speaker(line: str, lone: bool = False) -> bool:
    """A speaker line: capitalised words (or particles such as 'of'), ending in a period.

    ``lone``: the name has no speech lines under it (some texts put a blank line after the
    name); then only ALL-CAPS names count, so a short sentence like "Away." is not a role.
    """
    if (len(line) > 40 or not _ALONE_SPEAKER.match(line) or _HEADING.match(line)
            or _ROMAN.match(line)):
        return False
    if not all(w[0].isupper() or w[0].isdigit() or w in _PARTICLES for w in line[:-1].split()):
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


# ---------------------------------------------------------------- building the dataset


def build_shakespeare(files: list[Path], seq_len: int = SEQ_LEN, train_fraction: float = 0.8,
                      min_samples: int = 0, max_roles: int | None = None, subset_seed: int = 0,
                      layout: str = "auto", max_samples: int | None = None) -> LeafData:
    """Parse play texts into roles (clients), 80-char windows, LEAF's split by position.

    ``max_samples`` keeps at most that many train windows per role, drawn with ``subset_seed``
    (see :func:`flnotes.data.natural.cap_windows`); ``min_samples`` is checked before the cap.
    """
    check_max_samples(max_samples)
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
    names, texts = [c[0] for c in clients], [c[1] for c in clients]
    train_starts, test_starts = [c[2][0] for c in clients], [c[2][1] for c in clients]
    capped = 0
    for i, name in enumerate(names):
        keep = cap_windows(len(train_starts[i]), len(test_starts[i]), max_samples, subset_seed,
                           name)
        if keep is not None:  # capped before packing: unused test windows are never built
            capped += 1
            train_starts[i] = [train_starts[i][k] for k in keep[0].tolist()]
            test_starts[i] = [test_starts[i][k] for k in keep[1].tolist()]
    if max_samples is not None:
        stats["capped_clients"] = capped
    return pack_windows(texts, train_starts, test_starts, names, seq_len, stats)


def find_play_files(data_dir: Path) -> list[Path]:
    """Play texts: *_gut.txt (per-play layout) or any other *.txt (e.g. the 1994 edition)."""
    skip = {"metadata.txt", "copying.txt", "readme.txt"}
    for d in (data_dir, data_dir / "shakespeare-plays", data_dir / "shakespeare"):
        files = sorted(d.glob("*_gut.txt")) or [
            f for f in sorted(d.glob("*.txt")) if f.name.lower() not in skip]
        if files:
            return files
    return []


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
