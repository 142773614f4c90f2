"""Seeded random generators derived from (seed, round, purpose).

Every random draw of a run comes from a generator named by what it is for, never from a
shared running stream, so a run resumed from a checkpoint draws exactly what an
uninterrupted run would, and the loop and vmap backends see the same batches.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def derive_seed(seed: int, *tags: object) -> int:
    """A 63-bit seed that depends on the run seed and any tags (round, client, purpose)."""
    key = repr((int(seed),) + tuple(tags)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def torch_generator(seed: int, *tags: object) -> torch.Generator:
    """A CPU torch.Generator for the given seed and tags."""
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *tags))
    return g


def numpy_rng(seed: int, *tags: object) -> np.random.Generator:
    """A numpy Generator for the given seed and tags."""
    return np.random.default_rng(derive_seed(seed, *tags))


@contextmanager
def seeded_cpu_rng(seed: int, *tags: object) -> Iterator[None]:
    """Run a block (a model's initialisation) with the CPU's global generator seeded.

    The generator is restored afterwards. Only the CPU's: models are built on the CPU, and
    torch.manual_seed would also reseed every GPU's generator, which fork_rng(devices=[])
    leaves changed. One thread at a time: the generator is the process's (a notebook
    explorer's worker thread builds models while a cell may build others).
    """
    with _CPU_RNG, torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(derive_seed(seed, *tags))
        yield


_CPU_RNG = threading.RLock()  # held while seeded_cpu_rng has torch's CPU generator seeded


@contextmanager
def seeded_numpy_global(seed: int) -> Iterator[None]:
    """Run a block with numpy's global generator seeded (a library that draws from it, such
    as seaborn's jitter), its state restored afterwards."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)
