"""Split a dataset's sample indices among federated clients, and save/load the split.

Every partitioner returns one sorted int64 index tensor per client. All randomness comes from
``np.random.default_rng(seed)``, so the same arguments always give the same partition.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

SCHEMES = ("iid", "dirichlet", "shards")


def _labels_numpy(labels: Any) -> np.ndarray:
    """Labels as a 1-D int64 numpy array (accepts tensors, arrays and lists)."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def _to_tensors(index_lists: Sequence[Any]) -> list[torch.Tensor]:
    """Sorted int64 tensors: order inside a client means nothing, sorting makes it canonical."""
    return [torch.from_numpy(np.sort(np.asarray(ix, dtype=np.int64))) for ix in index_lists]


def _check_num_clients(num_samples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_samples:
        raise ValueError(f"num_clients={num_clients} > num_samples={num_samples}: some clients "
                         "would be empty")


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[torch.Tensor]:
    """Shuffle all indices and deal them into num_clients parts whose sizes differ by <= 1."""
    _check_num_clients(num_samples, num_clients)
    rng = np.random.default_rng(seed)
    return _to_tensors(np.array_split(rng.permutation(num_samples), num_clients))


def dirichlet_partition(labels: torch.Tensor, num_clients: int, alpha: float, seed: int,
                        min_size: int = 10, max_tries: int = 1000) -> list[torch.Tensor]:
    """Label-skewed split: per class, client shares drawn from Dir(alpha), with a size cap.

    This is the per-class scheme of FedML / NIID-Bench (Li et al. 2022), which FedMut's
    official code uses and FedUp 6.1.1 describes: for each class, shares over the clients
    are drawn from Dir(alpha) and clients already holding N/K or more samples take no more.
    (Hsu et al. 2019, often cited for it, draw a class mix per client instead.) The whole
    draw is repeated until every client has at least ``min_size`` samples.
    """
    y = _labels_numpy(labels)
    n = len(y)
    _check_num_clients(n, num_clients)
    if alpha <= 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    classes = np.unique(y)
    settings = (f"num_samples={n}, num_clients={num_clients}, min_size={min_size}, "
                f"alpha={alpha}, classes={len(classes)}")
    if min_size * num_clients > n:
        # No draw can ever succeed: fail at once instead of after max_tries draws.
        raise ValueError(f"min_size={min_size} is unreachable: {num_clients} clients x "
                         f"{min_size} samples > {n} samples ({settings}); lower min_size or "
                         "num_clients")
    rng = np.random.default_rng(seed)
    class_indices = [np.flatnonzero(y == c) for c in classes]
    cap = n / num_clients
    for _ in range(max_tries):
        client_lists: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        ok = True
        for idx_k in class_indices:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))
            # As in FedLab 'hetero_dir' / FedMut's code: clients already holding >= N/K samples
            # take no more, which keeps client sizes from exploding at small alpha.
            p = p * (sizes < cap)
            total = p.sum()
            if total <= 0:
                # Tiny alpha can underflow every eligible share to 0; count it as a failed draw.
                ok = False
                break
            cuts = (np.cumsum(p / total) * len(idx_k)).astype(np.int64)[:-1]
            for j, part in enumerate(np.split(idx_k, cuts)):
                client_lists[j].append(part)
                sizes[j] += len(part)
        if ok and sizes.min() >= min_size:
            return _to_tensors([np.concatenate(parts) for parts in client_lists])
    raise ValueError(f"min_size={min_size} is unreachable with these settings ({settings}): "
                     f"no draw in max_tries={max_tries} gave every client >= {min_size} samples; "
                     "raise alpha, lower min_size or num_clients, or raise max_tries")


def shard_partition(labels: torch.Tensor, num_clients: int, shards_per_client: int,
                    seed: int) -> list[torch.Tensor]:
    """McMahan et al. 2017 shards: sort by label, cut equal shards, deal them out at random.

    The N % (num_clients * shards_per_client) samples left after cutting equal shards (the tail of
    the label-sorted order, i.e. from the highest labels) are dropped and belong to no client.
    """
    y = _labels_numpy(labels)
    if num_clients < 1 or shards_per_client < 1:
        raise ValueError(f"num_clients={num_clients} and shards_per_client={shards_per_client} "
                         "must be >= 1")
    num_shards = num_clients * shards_per_client
    shard_size = len(y) // num_shards
    if shard_size == 0:
        raise ValueError(f"{num_shards} shards ({num_clients} clients x {shards_per_client}) > "
                         f"{len(y)} samples")
    rng = np.random.default_rng(seed)
    order = np.argsort(y, kind="stable")[: num_shards * shard_size]
    shards = order.reshape(num_shards, shard_size)
    shard_ids = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _to_tensors([shards[ids].reshape(-1) for ids in shard_ids])


def make_partition(labels: Any, num_clients: int, scheme: str, *, seed: int,
                   dirichlet_alpha: float = 0.5, shards_per_client: int = 2,
                   min_size: int = 10) -> list[torch.Tensor]:
    """Partition by scheme name ("iid", "dirichlet" or "shards")."""
    if scheme == "iid":
        return iid_partition(len(_labels_numpy(labels)), num_clients, seed)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients, dirichlet_alpha, seed, min_size=min_size)
    if scheme == "shards":
        return shard_partition(labels, num_clients, shards_per_client, seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")


def label_skew(parts: list[torch.Tensor], labels: torch.Tensor) -> float:
    """Mean over clients of the total-variation distance between client and global label mix."""
    y = _labels_numpy(labels)
    num_classes = int(y.max()) + 1 if len(y) else 0
    global_p = np.bincount(y, minlength=num_classes) / max(len(y), 1)
    distances = []
    for part in parts:
        if len(part) == 0:
            continue  # an empty client has no label distribution
        counts = np.bincount(y[_labels_numpy(part)], minlength=num_classes)
        distances.append(0.5 * np.abs(counts / counts.sum() - global_p).sum())
    return float(np.mean(distances)) if distances else 0.0


def labels_hash(labels: torch.Tensor) -> str:
    """SHA-256 hex digest of the labels as little-endian int64 bytes."""
    # Fixed byte order so a manifest's hash matches on every platform.
    return hashlib.sha256(_labels_numpy(labels).astype("<i8").tobytes()).hexdigest()


def save_manifest(path: str | Path, parts: list[torch.Tensor], labels: torch.Tensor,
                  meta: dict | None = None) -> None:
    """Write a partition as JSON with the labels' hash, so it can be reused exactly."""
    path = Path(path)
    n = len(_labels_numpy(labels))
    clients = [_labels_numpy(p).tolist() for p in parts]
    for j, c in enumerate(clients):
        if c and (min(c) < 0 or max(c) >= n):
            raise ValueError(f"client {j} has indices outside 0..{n - 1}")
    head = {"labels_sha256": labels_hash(labels), "num_samples": n, "meta": meta or {}}
    # One client per line: readable, and small diffs when a manifest is committed.
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    body = ",\n".join("    " + json.dumps(c) for c in clients)
    text = "{\n" + "\n".join(lines) + '\n  "clients": [\n' + body + "\n  ]\n}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def load_manifest(path: str | Path, labels: torch.Tensor) -> list[torch.Tensor]:
    """Read a manifest written by save_manifest, checking it was made from these labels."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"partition manifest {path} cannot be read: {err}") from None
    if not isinstance(manifest, dict) or not {"labels_sha256", "clients"} <= set(manifest):
        raise ValueError(f"partition manifest {path} is not one save_manifest wrote: it needs "
                         "'labels_sha256' and 'clients'")
    lists = manifest["clients"]
    if not isinstance(lists, list) or not lists:
        raise ValueError(f"partition manifest {path}: 'clients' must hold one list of sample "
                         "indices per client")
    for k, ix in enumerate(lists):  # (numpy would cut 0.5 to sample 0, read True as sample 1)
        if not isinstance(ix, list) or not all(type(i) is int for i in ix):
            raise ValueError(f"partition manifest {path}: client {k}'s samples must be a list "
                             f"of whole sample indices, got {json.dumps(ix)[:60]}")
    clients = _to_tensors(lists)
    expected, actual = manifest["labels_sha256"], labels_hash(labels)
    if expected != actual:
        raise ValueError(f"manifest {path} was made from different data: its labels_sha256 "
                         f"is {expected}, the given labels hash to {actual}")
    every = torch.cat(clients)  # (a client may be empty, as save_manifest writes it)
    outside = every[(every < 0) | (every >= len(labels))]
    if len(outside):  # (a negative index would count from the end: a silent wrong sample)
        raise ValueError(f"partition manifest {path}: sample index {int(outside[0])} is not "
                         f"one of the {len(labels)} training samples (0 to {len(labels) - 1})")
    values, counts = torch.unique(every, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"partition manifest {path}: sample {int(values[counts > 1][0])} is "
                         "given more than once; a partition gives each sample to one client")
    return clients
