"""The race of notebook 04's default setting, shipped with flnotes.

Notebook 04 races every method over 100 seeds on one toy federation. Sixteen methods train
their seeds as one stack in about 2 CPU-seconds; nine (FML, STEM, FedGloss, FedSMOO, FedSWA,
FedLESAM, FedNTD, MimeLite, FedMoSWA) have their own local update, run seed by seed and cost
13-23 CPU-seconds each: some 3 CPU-minutes before the notebook's first table, and as much again
in every test that runs the notebook. A run is a function of its config and seed, so the rows
of that one default race are computed once, here, and shipped (``shipped_races.json.gz``);
:func:`flnotes.toy.experiments.race` starts from them as from a race it ran itself. Any other
setting, seed or method runs as before.

The rows are checked against fresh runs (tests/test_toy.py: every method's first seeds run
again and compared to float tolerance), so a change to a method or to the engine that moves
a toy run fails that test until the file is made again:

    python flnotes/notebooks/refresh_outputs.py --ship-toy-race   # ~4 CPU-minutes

(the race itself runs in :func:`flnotes.toy.experiments.ship_default_race`; this module only
reads and writes the file, so the two do not import each other).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PATH = Path(__file__).with_name("shipped_races.json.gz")
SEEDS = 100
# Notebook 04's parameters cell: its race and its explorer's first picture use these.
DEFAULT = {"rounds": 15, "lr": 0.1, "num_clients": 4, "clients_per_round": 2,
           "data_options": {"start": [-0.3, -0.6], "start_jitter": 0.5}}


def class_path(cls) -> str:
    """The class a method name is registered to, by where it is defined: a method registered
    again (another class under the name) is not the method the rows were made with."""
    return f"{cls.__module__}.{cls.__qualname__}"


def entries(path: Path = PATH) -> list[dict]:
    """The shipped races: algorithm, class, overrides, seeds, stack and rows of each method;
    [] when the file is missing or unreadable (the race then runs, as it would anyway)."""
    try:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    return data.get("races", []) if isinstance(data, dict) else []


def write(races: list[dict], path: Path = PATH) -> Path:
    """Write ``races`` (the entries :func:`entries` reads) to ``path``, whole or not at all;
    the same rows give the same bytes."""
    text = json.dumps({"races": races}, sort_keys=True)
    tmp = path.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:  # mtime 0: the same rows, the same bytes
        f.write(text.encode())
    tmp.replace(path)
    return path
