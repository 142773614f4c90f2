"""Every registered method on one small federated task, the same split, seed and initial model:
does each run and learn? Prints one row per method (final and best accuracy, CPU seconds).

    python benchmarks/method_evidence.py                       # synthetic 28x28, MLP
    python benchmarks/method_evidence.py --rounds 40 --clients-per-round 4

Methods that bring their own momentum (MimeLite, STEM) run with the local SGD's momentum 0;
every other method with the given --momentum. Settings not named here are each method's
defaults. For CIFAR-10 use the sweep grid benchmarks/evidence_cifar10.yaml.
"""

from __future__ import annotations

import argparse
import time

import torch

from flnotes.algorithms import algorithm_class, algorithm_names
from flnotes.config import RunConfig
from flnotes.engine.sim import run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--clients-per-round", type=int, default=2)
    parser.add_argument("--dirichlet-alpha", type=float, default=0.3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = RunConfig(dataset="synthetic", model="mlp", partition="dirichlet",
                     dirichlet_alpha=args.dirichlet_alpha, num_clients=args.clients,
                     clients_per_round=args.clients_per_round, rounds=args.rounds,
                     local_epochs=1, batch_size=32, lr=args.lr, momentum=args.momentum,
                     seed=args.seed, device="cpu",
                     data_options={"num_train": 4000, "num_test": 1000})
    print(f"synthetic 28x28, MLP, {args.clients} clients, Dirichlet({args.dirichlet_alpha}), "
          f"{args.clients_per_round} per round, {args.rounds} rounds, seed {args.seed}")
    print(f"{'method':10s} {'status':10s} {'final':>6s} {'best':>6s} {'cpu_s':>6s}")
    for name in algorithm_names():
        momentum = 0.0 if algorithm_class(name).own_momentum else args.momentum
        tic = time.process_time()
        history = run(base.replace(algorithm=name, momentum=momentum), progress=False)
        accuracy = history.metric("accuracy")
        final = accuracy[-1] if accuracy else float("nan")
        best = max(accuracy) if accuracy else float("nan")
        print(f"{name:10s} {history.status:10s} {100 * final:6.1f} {100 * best:6.1f} "
              f"{time.process_time() - tic:6.1f}", flush=True)


if __name__ == "__main__":
    main()
