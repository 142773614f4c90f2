"""A round's clients in N worker processes (``run --client-workers N``) against in turn.

Prints, per N, the wall seconds of a round (rounds after the first), the CPU seconds of the
whole run (this process and its workers), the wall time as a ratio to CPU-s / N (1.0: the
N cores fully used; the goal is <= 1.2 on an idle machine) and to N = 1's wall time, and the
load average while it ran. Every N trains the same run (the results are checked equal).

    python benchmarks/client_workers.py                         # synthetic 28x28, the CNN
    python benchmarks/client_workers.py --dataset cifar10 --model lenet-cifar --data-dir DIR
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from flnotes.config import RunConfig
from flnotes.engine.sim import run


def measure(config: RunConfig, workers: int) -> dict:
    before = os.times()
    load = os.getloadavg()[0]
    tic = time.perf_counter()
    history = run(config, progress=False, client_workers=workers)
    wall = time.perf_counter() - tic
    after = os.times()  # the workers are reaped by now: their CPU is in children_*
    cpu = sum(getattr(after, f) - getattr(before, f)
              for f in ("user", "system", "children_user", "children_system"))
    rounds = [r["seconds"] for r in history.rows if r["round"] > 1]
    return {"workers": workers, "round": sum(rounds) / len(rounds), "wall": wall, "cpu": cpu,
            "load": (load + os.getloadavg()[0]) / 2, "state": history.final_state}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--data-dir")
    parser.add_argument("--workers", default="1,2", help="comma list of N")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {"num_train": 6000, "num_test": 500} if args.dataset == "synthetic" else {}
    config = RunConfig(dataset=args.dataset, model=args.model, data_dir=args.data_dir,
                       data_options=options, num_clients=100,
                       clients_per_round=args.clients_per_round, rounds=args.rounds,
                       local_epochs=args.local_epochs, batch_size=50, lr=0.01, momentum=0.5,
                       eval_every=args.rounds, device="cpu")
    rows = [measure(config, int(n)) for n in args.workers.split(",")]
    first = rows[0]
    print(f"{args.dataset} / {args.model}: {args.clients_per_round} clients a round, "
          f"{args.local_epochs} local epoch(s), {args.rounds} rounds, {os.cpu_count()} cores")
    print("| N | s / round | run wall s | run CPU s | wall / (CPU s / N) | wall vs N=1 | load |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        same = all(torch.equal(row["state"][k], first["state"][k]) for k in first["state"])
        assert same, f"N={row['workers']} trained another model than N={first['workers']}"
        print(f"| {row['workers']} | {row['round']:.2f} | {row['wall']:.1f} | {row['cpu']:.1f} "
              f"| {row['wall'] / (row['cpu'] / row['workers']):.2f} "
              f"| {row['wall'] / first['wall']:.2f} | {row['load']:.1f} |")


if __name__ == "__main__":
    main()
