"""Per-client state that outlives the rounds a client sits out (SCAFFOLD's c_i, FedDyn's drift).

A :class:`ClientStateStore` maps client id -> state (name -> tensor). A strategy uses it in a
fixed rhythm each round:

    store.hold(clients)          # dispatch: read (or create) the round's clients' states
    store.get(client)            # penalty_anchor / aggregate: a held state
    store.put(client, state, r)  # aggregate: the client's new state after round r
    store.release()              # aggregate: forget them (disk mode)

and :meth:`state_dict` goes into the strategy's checkpoint.

Two modes:

- **in memory** (``directory=None``, a run without a run folder): every state lives in a
  dict and :meth:`state_dict` carries them all. Fine for the toy and tests.
- **on disk**: one file per (client, round the state was written), written atomically
  (``torch.save`` to a ``.tmp`` file, fsync, ``os.replace``), so a crash mid-write leaves the
  previous version whole. Only the held clients are in memory: FedUp's Table 5 (1,000
  clients x ResNet-18, about 45 MB each) would need 45 GB otherwise.

Why versions and not one file per client: the engine checkpoints every ``checkpoint_every``
rounds and a resumed run restarts from the last checkpoint. Had round r+1 overwritten a
client's only file, resuming from a checkpoint at round r would train with the state of
round r+1 and not repeat the uninterrupted run. So the store's ``state_dict`` is the map
client -> version (the round of its file) as of the checkpoint, and a file is deleted only
once no checkpoint that may still be on disk names it: at each :meth:`state_dict` call the
store keeps what this call and the previous call (or the loaded checkpoint) name, because
the engine's previous checkpoint file stays in place until the new one is renamed over it.
Consequence: call ``state_dict`` only to write a checkpoint (as the engine does), not to
peek. Files written after the last checkpoint by a run that then died are orphans: the
resumed run writes the same names again (``os.replace`` overwrites them) and the next
``state_dict`` prunes any left over.

A client's state is created (by the strategy's ``factory(client)``, e.g. zeros shaped like the
model) the first time it is held; it reaches the disk only when first put. States are
never changed in place: ``put`` replaces a client's entry, so a state_dict taken in memory
mode stays as it was.

This module imports nothing from the algorithms (the engine sits beside them, not above).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

State = dict[str, torch.Tensor]

_FILE = re.compile(r"^client(\d+)\.round(\d+)\.pt$")


def store_directory(run_dir: str | os.PathLike | None, name: str) -> Path | None:
    """Where a strategy's store lives in a run folder (None without a run folder)."""
    return None if run_dir is None else Path(run_dir) / "client_states" / name


class ClientStateStore:
    """States of every client that has been sampled, on disk or in memory (see module doc)."""

    def __init__(self, directory: str | os.PathLike | None,
                 factory: Callable[[int], State], *,
                 device: torch.device | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.factory = factory
        self.device = device  # where loaded states go (a run may resume on another device)
        # In memory mode: every client's state. On disk: the held clients' states only.
        self._held: dict[int, State] = {}
        # On disk: client -> round of its current file (clients never put have none).
        self._versions: dict[int, int] = {}
        # Version maps that a checkpoint on disk may name (the previous state_dict call's or
        # the loaded one); their files survive pruning.
        self._protected: dict[int, int] = {}

    # ---- the round's clients ---------------------------------------------------------
    @property
    def on_disk(self) -> bool:
        """True when states not in use are kept on disk."""
        return self.directory is not None

    def hold(self, clients: Iterable[int]) -> list[State]:
        """Read (or create) these clients' states into memory; on disk, drop the others."""
        clients = [int(c) for c in clients]
        if self.on_disk:
            self._held = {c: self._held[c] if c in self._held else self._read(c)
                          for c in clients}
        else:
            for c in clients:
                if c not in self._held:
                    self._held[c] = self.factory(c)
        return [self._held[c] for c in clients]

    def get(self, client: int) -> State:
        """A held client's state (hold it first; in memory mode it is created if new)."""
        client = int(client)
        if client not in self._held:
            if self.on_disk:
                raise KeyError(f"client {client}'s state is not held; call hold() first")
            self._held[client] = self.factory(client)
        return self._held[client]

    def put(self, client: int, state: State, round: int) -> None:
        """Replace a client's state with its state after ``round`` (atomic on disk)."""
        client, round = int(client), int(round)
        state = {n: t.detach() for n, t in state.items()}
        if self.on_disk:
            previous = self._versions.get(client)
            if previous is not None and round < previous:
                raise ValueError(f"client {client} already has a state of round {previous}; "
                                 f"cannot put one of round {round}")
            self._write(client, round, state)
            self._versions[client] = round  # only after the file is whole and in place
        self._held[client] = state

    def release(self) -> None:
        """Forget the held states (on disk: they are in their files; in memory: kept)."""
        if self.on_disk:
            self._held = {}

    def held_clients(self) -> list[int]:
        """Clients whose states are in memory now."""
        return sorted(self._held)

    def known_clients(self) -> list[int]:
        """Clients with a stored state (on disk: written at least once)."""
        return sorted(self._versions if self.on_disk else self._held)

    def held_bytes(self) -> int:
        """Bytes of tensor data held in memory."""
        return sum(t.numel() * t.element_size() for s in self._held.values() for t in s.values())

    def disk_bytes(self) -> int:
        """Bytes of the store's files on disk (0 in memory mode)."""
        if not self.on_disk or not self.directory.exists():
            return 0
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    # ---- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to return to the states as of now (see module doc)."""
        if not self.on_disk:
            # Shallow copies suffice: put() replaces states, never changes them in place.
            return {"states": {c: dict(s) for c, s in self._held.items()}}
        versions = dict(self._versions)
        self._prune(keep=[versions, self._protected])
        self._protected = versions
        return {"versions": versions}

    def load_state_dict(self, values: dict[str, Any]) -> None:
        """Return to the states a :meth:`state_dict` recorded."""
        self._held = {}
        if not self.on_disk:
            states = values.get("states", {})
            self._held = {int(c): dict(s) for c, s in states.items()}
            return
        if "versions" not in values:
            raise ValueError("this checkpoint was saved by an in-memory client state store; "
                             "resume it without a run folder")
        self._versions = {int(c): int(r) for c, r in values["versions"].items()}
        self._protected = dict(self._versions)
        missing = [c for c, r in self._versions.items() if not self._path(c, r).exists()]
        if missing:
            raise FileNotFoundError(f"{self.directory} lacks the states of clients "
                                    f"{missing[:5]} that the checkpoint names")

    # ---- files ---------------------------------------------------------------------------
    def _path(self, client: int, round: int) -> Path:
        return self.directory / f"client{client:07d}.round{round:07d}.pt"

    def _read(self, client: int) -> State:
        round = self._versions.get(client)
        if round is None:
            return self.factory(client)
        return torch.load(self._path(client, round), map_location=self.device,
                          weights_only=True)

    def _write(self, client: int, round: int, state: State) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(client, round)
        tmp = path.with_suffix(".pt.tmp")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)

    def _prune(self, keep: list[dict[int, int]]) -> None:
        """Delete files (and half-written .tmp files) that none of ``keep`` names."""
        if not self.directory.exists():
            return
        wanted = {(c, r) for versions in keep for c, r in versions.items()}
        for path in self.directory.iterdir():
            match = _FILE.match(path.name)
            if match and (int(match[1]), int(match[2])) in wanted:
                continue
            if match or path.name.endswith(".pt.tmp"):
                path.unlink(missing_ok=True)
