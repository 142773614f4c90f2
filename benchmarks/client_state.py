"""The per-client state store at FedUp's Table 5 scale: disk, memory and time per round.

What it measures: :class:`flnotes.engine.client_state.ClientStateStore` on disk, with one
ResNet-18-sized state per client (its trainable layers, float32, as SCAFFOLD's c_i or
FedDyn's d_i), 1,000 clients and 10 sampled per round, no training. Each round does what a
strategy does: ``hold`` the round's clients (read from disk, or create zeros when first
sampled), ``put`` a new state for each (atomic write + fsync), ``release``, then
``state_dict`` (a checkpoint every round, the worst case: it also prunes superseded files).
A last round holds the first round's clients again, so every state is read from disk.

Columns: seconds of each phase; MB held in memory by the store after hold; the store's
files on disk; the whole process's peak resident set during the round (``VmHWM``, reset
through ``/proc/self/clear_refs`` where the kernel allows it), which includes the round's
new states (made outside the timing, as training would) and the model code. Only the sampled clients
are ever written, so the run needs about (rounds x sampled + sampled) x 45 MB of disk in a
temporary folder that is deleted at the end; the line under the table extrapolates the
disk to every client touched once.

    python benchmarks/client_state.py                 # 1,000 clients, 10 a round, 4 rounds
    python benchmarks/client_state.py --rounds 2 --sampled 5 --dir /some/disk
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flnotes.algorithms.scaffold import trainable_layer_names  # noqa: E402
from flnotes.engine.client_state import ClientStateStore  # noqa: E402
from flnotes.models import build_model  # noqa: E402
from flnotes.rng import torch_generator  # noqa: E402

MB = 2**20


def peak_rss_mb() -> float:
    """The process's peak resident set (VmHWM) in MB; nan where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak_rss() -> None:
    """Start a new VmHWM window (Linux: writing 5 to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--sampled", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--dir", default=None, help="parent folder of the temporary store")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    template = build_model(args.model, 10, (3, 32, 32)).state_dict()
    names = trainable_layer_names(template)
    shapes = OrderedDict((n, template[n].shape) for n in names)
    state_mb = sum(template[n].numel() * 4 for n in names) / MB
    free_gb = shutil.disk_usage(args.dir or tempfile.gettempdir()).free / 2**30
    need_gb = (args.rounds + 1) * args.sampled * state_mb / 1024
    if need_gb > 0.5 * free_gb:
        sys.exit(f"needs about {need_gb:.1f} GB of disk, only {free_gb:.1f} GB free; "
                 "use fewer --rounds or --sampled")

    def zeros(client: int):
        return OrderedDict((n, torch.zeros(s)) for n, s in shapes.items())

    folder = Path(tempfile.mkdtemp(prefix="client-state-bench-", dir=args.dir))
    rows = []
    try:
        store = ClientStateStore(folder / "states", zeros)
        schedule = [torch.randperm(args.clients, generator=torch_generator(0, "bench", r))
                    [: args.sampled].sort().values.tolist() for r in range(args.rounds)]
        schedule.append(schedule[0])  # the first round's clients come back: all reads
        for rnd, clients in enumerate(schedule, start=1):
            known = set(store.known_clients())
            # New states, drawn outside the timed phases (training would make them).
            new = [OrderedDict((n, torch.randn(s)) for n, s in shapes.items())
                   for _ in clients]
            reset_peak_rss()
            tic = time.perf_counter()
            store.hold(clients)
            hold_s = time.perf_counter() - tic
            held_mb = store.held_bytes() / MB
            tic = time.perf_counter()
            for c, s in zip(clients, new, strict=True):
                store.put(c, s, rnd)
            put_s = time.perf_counter() - tic
            store.release()
            tic = time.perf_counter()
            store.state_dict()
            checkpoint_s = time.perf_counter() - tic
            del new
            rows.append((rnd, sum(c in known for c in clients), hold_s, put_s, checkpoint_s,
                         held_mb, store.disk_bytes() / 2**30, peak_rss_mb()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"{args.model} state: {state_mb:.1f} MiB ({len(names)} trainable layers, float32); "
          f"{args.clients} clients, {args.sampled} sampled a round; torch {torch.__version__}")
    header = ("round", "read", "hold s", "put s", "ckpt s", "total s", "held MiB", "disk GiB",
              "peak RSS MiB")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for rnd, read, hold_s, put_s, ckpt_s, held, disk, rss in rows:
        print(f"| {rnd} | {read}/{args.sampled} | {hold_s:.2f} | {put_s:.2f} | {ckpt_s:.3f} | "
              f"{hold_s + put_s + ckpt_s:.2f} | {held:.0f} | {disk:.2f} | {rss:.0f} |")
    per_put = sum(r[3] for r in rows) / (len(rows) * args.sampled)
    print(f"every client touched once: {args.clients * state_mb / 1024:.1f} GiB on disk "
          f"(+ up to {args.sampled} superseded versions until the next checkpoint, "
          f"{args.sampled * state_mb / 1024:.2f} GiB); memory stays {args.sampled} states "
          f"({args.sampled * state_mb:.0f} MiB); {per_put:.2f} s per state written")


if __name__ == "__main__":
    main()
