"""Intra-op threads against one thread: local SGD steps per model at 1, 2, ... threads.

Prints, per model, the wall and CPU seconds of a local step (batch 50, the seed papers'
batch) at each thread count, the ratio of wall time to one thread's, and the load average
while it ran: the data behind flnotes' default thread rule (flnotes/engine/threads.py).
The last column is that rule's count for the model on this machine now (its size, the idle
cores at the start) and its ratio: what `flnotes run` would take, never above 1.0 if the
rule is right. Each thread count runs in its own process, so one count's pool does not
colour the next.

    python benchmarks/threads.py                      # every model, 1 and 2 threads
    python benchmarks/threads.py --models lenet-cifar,resnet18 --threads 1,2,4 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from flnotes.engine.threads import default_threads, multiply_adds
from flnotes.models import MODELS, build_model

SHAPES = {"lstm": ((80,), 80)}  # Shakespeare: 80 characters in, next of 80 out
IMAGE = ((3, 32, 32), 10)
GREY = {"mlp", "cnn"}  # the 28x28 models of the MNIST-style papers


def shape_of(model: str) -> tuple[tuple[int, ...], int]:
    return SHAPES.get(model, ((1, 28, 28), 10) if model in GREY else IMAGE)


def example(model_name: str, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    shape, classes = shape_of(model_name)
    model = build_model(model_name, classes, shape)
    if model_name == "lstm":
        return model, torch.randint(classes, (batch, *shape))
    return model, torch.randn(batch, *shape)


def measure(model_name: str, threads: int, steps: int, batch: int) -> dict:
    """Seconds per SGD step (wall and CPU) of ``model_name`` at ``threads`` threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, x = example(model_name, batch)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    y = torch.randint(shape_of(model_name)[1], (batch,))

    def step():
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()

    for _ in range(3):  # warm-up: allocator, first-call dispatch
        step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return {"wall": (time.perf_counter() - wall) / steps,
            "cpu": (time.process_time() - cpu) / steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,cnn,lenet-cifar,resnet20,lstm,resnet18")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # model:threads, in a child process
    args = parser.parse_args(argv)
    if args.one:
        model, threads = args.one.split(":")
        print(json.dumps(measure(model, int(threads), args.steps, args.batch)))
        return 0
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"error: unknown model(s) {unknown}; models: {sorted(MODELS)}", file=sys.stderr)
        return 2
    counts = [int(t) for t in args.threads.split(",")]
    load = os.getloadavg()[0]
    # the rule's count per model, fixed before any child runs (their load would count)
    rule = {m: default_threads(multiply_adds(*example(m, 1))) for m in models}
    print(f"cores: {os.cpu_count()}, load average at start: {load:.1f}; batch {args.batch}, "
          f"{args.steps} steps; ms per step, wall (CPU); ratio: wall / 1 thread's wall")
    print(f"{'model':12s}" + "".join(f"{t:>8d} thr {'ratio':>6s}" for t in counts)
          + "   the rule: threads, ratio")
    for model in models:
        cells, walls = [], {}
        for threads in sorted({1, *counts, rule[model]}):
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            done = subprocess.run([sys.executable, __file__, "--one", f"{model}:{threads}",
                                   "--steps", str(args.steps), "--batch", str(args.batch)],
                                  capture_output=True, text=True, env=env, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            walls[threads] = result["wall"]
            if threads in counts:
                cells.append(f"{1000 * result['wall']:7.1f} ({1000 * result['cpu']:.0f})"
                             f" {result['wall'] / walls[1]:5.2f}")
        print(f"{model:12s}" + "  ".join(cells)
              + f"   {rule[model]:>3d} {walls[rule[model]] / walls[1]:5.2f}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
