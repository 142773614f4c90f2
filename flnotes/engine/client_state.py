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
  (:func:`write_atomically`: a ``.tmp`` file, fsync, ``os.replace``, with Ctrl-C and SIGTERM
  held until the file is in place or discarded), so a crash mid-write leaves the previous
  version whole. Only the held clients are in memory: FedUp's Table 5 (1,000 clients x
  ResNet-18, about 45 MB each) would need 45 GB otherwise.

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

What keeps a file the one the checkpoint means: each file holds, beside the
state, the client, the round and the run's settings hash (:attr:`ClientStateStore.settings_hash`,
set by the engine's :func:`bind_stores`), and ``state_dict`` records each file's sha256. On
:meth:`load_state_dict` (a resume, before its first round) every file the checkpoint names is
checked: a missing, damaged (unreadable, or another sha256), foreign (another run's settings
hash) or swapped (another client's or round's) file is a one-line :class:`ClientStateError`
naming the file and what to do; a file read later in the run is checked again. Checkpoints
written before the digests existed name plain state files: those are checked for being
readable only.

:func:`write_atomically` and :func:`deferred_signals` live here, the lowest module that
writes run-folder files, and the engine's own writes (checkpoint, run.json) use them too.

This module imports nothing from the algorithms (the engine sits beside them, not above).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from flnotes.messages import one_line

State = dict[str, torch.Tensor]

_FILE = re.compile(r"^client(\d+)\.round(\d+)\.pt$")
# The key that marks a file written with its header (client, round, settings hash).
_MARK = "flnotes_client_state"
_START_OVER = "delete the run folder to start the run over"


class ClientStateError(ValueError):
    """A client-state file that cannot be used (one line: the file, what is wrong, what to do)."""


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver them as they came.

    A Ctrl-C inside ``torch.save`` leaves its zip writer half-done and surfaces as
    ``RuntimeError: ... unexpected pos`` instead of a KeyboardInterrupt; held here, the write
    finishes (or fails and is discarded) and the signal then acts as it would have: the
    previous handler runs (KeyboardInterrupt, the command line's Terminated, or the default
    action). Outside the main thread signals cannot be handled here: the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    before = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not None:  # None: set outside Python, not put back
                before[sig] = signal.signal(sig, lambda signum, _: received.append(signum))
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):  # each once, in the order they came
            signal.raise_signal(sig)


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write a file whole or not at all: ``write(f)`` into ``PATH.tmp``, fsync, rename.

    Signals are held meanwhile (:func:`deferred_signals`); on any failure (a full disk, an
    interrupt that got through) the ``.tmp`` file is removed and the old file, if any, stays.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with deferred_signals():
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        with contextlib.suppress(OSError):  # the rename itself on disk (best effort)
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)


def _is_state(value: Any) -> bool:
    """A state: names -> tensors."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())


def bind_stores(strategy: Any, settings_hash: str) -> list[ClientStateStore]:
    """Give a strategy's stores (its attributes that are one) the run's settings hash."""
    stores = [v for v in vars(strategy).values() if isinstance(v, ClientStateStore)]
    for store in stores:
        store.settings_hash = settings_hash
    return stores


def store_directory(run_dir: str | os.PathLike | None, name: str) -> Path | None:
    """Where a strategy's store lives in a run folder (None without a run folder)."""
    return None if run_dir is None else Path(run_dir) / "client_states" / name


class ClientStateStore:
    """States of every client that has been sampled, on disk or in memory (see module doc)."""

    def __init__(self, directory: str | os.PathLike | None, factory: Callable[[int], State],
                 *, device: torch.device | str | None = None) -> None:
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
        # On disk: client -> sha256 (hex) of its current file (None: not known, a file named
        # by a checkpoint written before digests were recorded).
        self._digests: dict[int, str | None] = {}
        # The run's settings hash, written into each file and checked on reading (None: a
        # store used on its own; files then carry "" and any hash is accepted).
        self.settings_hash: str | None = None

    # ---- the round's clients ---------------------------------------------------------
    @property
    def on_disk(self) -> bool:
        """True when states not in use are kept on disk."""
        return self.directory is not None

    def hold(self, clients: Iterable[int]) -> list[State]:
        """Read (or create) these clients' states into memory; on disk, drop the others."""
        clients = [int(c) for c in clients]
        if self.on_disk:
            self._held = {c: self._held[c] if c in self._held else self._read(c) for c in clients}
        return [self.get(c) for c in clients]  # in memory: a new client's state is created

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
            digest = self._write(client, round, state)
            self._versions[client] = round  # only after the file is whole and in place
            self._digests[client] = digest
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
        return {"versions": versions, "digests": {c: self._digests.get(c) for c in versions}}

    def load_state_dict(self, values: dict[str, Any]) -> None:
        """Return to the states a :meth:`state_dict` recorded."""
        self._held = {}
        if not self.on_disk:
            self._held = {int(c): dict(s) for c, s in values.get("states", {}).items()}
            return
        if "versions" not in values:
            raise ValueError("this checkpoint was saved by an in-memory client state store; "
                             "resume it without a run folder")
        versions = {int(c): int(r) for c, r in values["versions"].items()}
        digests = {int(c): d for c, d in (values.get("digests") or {}).items()}
        # Every file the checkpoint names, checked now: before the first resumed round, not
        # when its client is next sampled, hours later.
        for client, round in sorted(versions.items()):
            self._verify(client, round, digests.get(client))
        self._versions = versions
        self._digests = {c: digests.get(c) for c in versions}
        self._protected = dict(versions)

    # ---- files ---------------------------------------------------------------------------
    def _path(self, client: int, round: int) -> Path:
        return self.directory / f"client{client:07d}.round{round:07d}.pt"

    def _read(self, client: int) -> State:
        round = self._versions.get(client)
        if round is None:
            return self.factory(client)
        data = self._verify(client, round, self._digests.get(client))
        record = self._load(self._path(client, round), data, self.device)
        return record["state"] if _MARK in record else record  # plain: from before headers

    def _write(self, client: int, round: int, state: State) -> str:
        """Write a client's state of a round (atomically); returns the file's sha256."""
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {_MARK: 1, "client": client, "round": round,
                  "settings_hash": self.settings_hash or "", "state": state}
        with deferred_signals():  # serialising too: torch.save must not be cut halfway
            buffer = io.BytesIO()
            torch.save(record, buffer)
            data = buffer.getbuffer()  # no second copy of a state that may be 45 MB
            write_atomically(self._path(client, round), lambda f: f.write(data))
        return hashlib.sha256(data).hexdigest()

    def _verify(self, client: int, round: int, digest: str | None) -> bytes:
        """The bytes of a client's file, checked (see module doc); ClientStateError if not."""
        path = self._path(client, round)
        what = f"client {client}'s state after round {round}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ClientStateError(f"{path} is missing ({what}, named by the run's checkpoint); "
                                   f"put it back, or {_START_OVER}") from None
        except OSError as err:
            raise ClientStateError(f"cannot read {path} ({what}): {err.strerror or err}; "
                                   f"make it readable, or {_START_OVER}") from None
        if digest is not None and hashlib.sha256(data).hexdigest() == digest:
            return data  # the very bytes written: nothing more to check
        record = self._load(path, data, "cpu")
        if isinstance(record, dict) and _MARK in record:
            theirs = record.get("settings_hash")
            if self.settings_hash and theirs and theirs != self.settings_hash:
                raise ClientStateError(
                    f"{path} belongs to another run (settings hash {str(theirs)[:12]}, this "
                    f"run's {self.settings_hash[:12]}); put back this run's file, or "
                    f"{_START_OVER}")
            if (record.get("client"), record.get("round")) != (client, round):
                raise ClientStateError(
                    f"{path} holds client {record.get('client')}'s state after round "
                    f"{record.get('round')}, not {what} (a swapped or renamed file); put back "
                    f"the right file, or {_START_OVER}")
            if not _is_state(record.get("state")):
                raise ClientStateError(f"{path} is damaged (no state in it); {_START_OVER}")
        elif digest is not None or not _is_state(record):
            raise ClientStateError(f"{path} is damaged (not a client-state file); {_START_OVER}")
        if digest is not None:
            raise ClientStateError(f"{path} is damaged (its sha256 differs from the one the "
                                   f"checkpoint recorded); {_START_OVER}")
        return data  # a file named by a checkpoint from before digests: readable

    @staticmethod
    def _load(path: Path, data: bytes, device) -> Any:
        """What a client-state file holds (tensors onto ``device``), or ClientStateError."""
        try:
            return torch.load(io.BytesIO(data), map_location=device, weights_only=True)
        except Exception as err:  # truncated, empty, garbage: torch raises many kinds
            reason = one_line(err)
            reason = f": {reason}" if 0 < len(reason) <= 80 else ""
            raise ClientStateError(f"{path} is damaged and cannot be read "
                                   f"({type(err).__name__}{reason}); {_START_OVER}") from None

    def _prune(self, keep: list[dict[int, int]]) -> None:
        """Delete files (and half-written .tmp files) that none of ``keep`` names."""
        if not self.directory.exists():
            return
        wanted = {(c, r) for versions in keep for c, r in versions.items()}
        for path in self.directory.iterdir():
            match = _FILE.match(path.name)
            kept = match and (int(match[1]), int(match[2])) in wanted
            if not kept and (match or path.name.endswith(".pt.tmp")):
                path.unlink(missing_ok=True)
