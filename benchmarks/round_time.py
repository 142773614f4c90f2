"""Seconds per federated round, loop vs vmap backend, in FedMut's setting.

FedMut's setting: 10 clients x 5 local epochs x 500 samples each, batch 50, SGD lr 0.01
momentum 0.9, on random data of the right shape (CIFAR images; 80-character Shakespeare
windows for the LSTM). A round is dispatch + local training + aggregation. Every
(model, backend) pair runs in a fresh subprocess, so peak memory is its own.

    python benchmarks/round_time.py --device cpu --quick
    python benchmarks/round_time.py --device cuda --rounds 3

Backends: ``loop`` (reference), ``vmap`` (eager), ``compiled`` (vmap with
``compile="default"``: one torch.compile'd fixed-shape step) and ``graphs`` (vmap with
``compile="reduce-overhead"``: the same step replayed as CUDA graphs; GPU only). The
warm-up column is the first round, compilation included.

Peak memory: CUDA ``max_memory_allocated`` on a GPU; on CPU the growth of the process's
peak resident set (VmHWM, reset through /proc/self/clear_refs) over the rounds.
TFLOP/s: FLOPs of one training step of one client (torch.utils.flop_counter), times the
round's steps, over the measured time; the peak is a large float32 matmul timed in the
same run on the same device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flnotes.algorithms import build_strategy  # noqa: E402
from flnotes.config import RunConfig  # noqa: E402
from flnotes.engine.batched.functional import StepContext, vmap_ready  # noqa: E402
from flnotes.engine.batched.stacked import train_supervised  # noqa: E402
from flnotes.engine.batched.vmap import train_clients_vmap  # noqa: E402
from flnotes.engine.tasks import Task  # noqa: E402
from flnotes.engine.train import train_clients_loop  # noqa: E402
from flnotes.models import build_model  # noqa: E402

# backend name -> (RunConfig.backend, RunConfig.compile)
BACKENDS = {"loop": ("loop", "off"), "vmap": ("vmap", "off"),
            "compiled": ("vmap", "default"), "graphs": ("vmap", "reduce-overhead")}

# model -> (one sample's shape, number of classes)
SHAPES = {"cnn": ((3, 32, 32), 10), "resnet18": ((3, 32, 32), 10),
          "vgg16": ((3, 32, 32), 10), "lstm": ((80,), 80)}


def random_task(model: str, clients: int, samples: int, device: torch.device) -> Task:
    """Random data of the model's input shape; every client holds ``samples`` rows."""
    shape, classes = SHAPES[model]
    g = torch.Generator().manual_seed(0)
    n = clients * samples
    if model == "lstm":
        x = torch.randint(0, classes, (n, *shape), generator=g)
    else:
        x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    parts = [torch.arange(c * samples, (c + 1) * samples, device=device) for c in range(clients)]
    x, y = x.to(device), y.to(device)

    def factory():
        return build_model(model, classes, shape).to(device)

    return Task("random", factory, x, y, parts, x[:100], y[:100], classes)


def step_flops(task: Task, batch_size: int) -> int:
    """FLOPs of one forward + backward of one model on one batch (counted by aten op)."""
    from torch.utils.flop_counter import FlopCounterMode

    # The vmap-ready copy: its LSTM is made of matmuls the counter sees (nn.LSTM's fused
    # kernel is not counted); both backends do this arithmetic.
    model = vmap_ready(task.model_factory(), StepContext())
    model.train()
    x, y = task.train_x[:batch_size], task.train_y[:batch_size]
    with FlopCounterMode(display=False) as counter:
        task.loss_fn(model(x), y).backward()
    return counter.get_total_flops()


def matmul_peak(device: torch.device) -> float:
    """Measured float32 matmul TFLOP/s on this device (best of a few runs)."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(4):
        sync(device)
        tic = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - tic)
    return 2 * n**3 / best / 1e12


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_reset() -> int:
    """Reset the kernel's peak-RSS counter; return the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS") * 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure(args: argparse.Namespace) -> dict:
    """Time ``args.rounds`` rounds of one (model, backend) after one warm-up round."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    task = random_task(args.model, args.clients, args.samples, device)
    backend, compile_mode = BACKENDS[args.backend]
    config = RunConfig(algorithm=args.algorithm, num_clients=args.clients,
                       clients_per_round=args.clients, local_epochs=args.epochs,
                       batch_size=args.batch_size, lr=0.01, momentum=0.9, device=args.device,
                       backend=backend, compile=compile_mode).resolved()
    init = task.model_factory().state_dict()
    configs = [config.replace(seed=seed) for seed in range(args.seeds)]
    strategies = [build_strategy(c, init) for c in configs]
    clients = list(range(args.clients))

    def one_round(rnd: int) -> None:
        """One round of every seed: in turn (loop, or vmap with 1 seed) or stacked."""
        starts = [s.dispatch(rnd, clients) for s in strategies]
        if backend == "loop":
            results = [train_clients_loop(task, s, rnd, clients, st, c)
                       for s, st, c in zip(strategies, starts, configs, strict=True)]
        elif args.seeds == 1:
            results = [train_clients_vmap(task, strategies[0], rnd, clients, starts[0],
                                          config, chunk_size=args.chunk_size)]
        else:
            # All seeds' clients as one stack, as flnotes.engine.seeds.run_seeds does each round.
            results = train_supervised(
                [(task, s, c, clients, st)
                 for s, c, st in zip(strategies, configs, starts, strict=True)], rnd)
        for strategy, trained in zip(strategies, results, strict=True):
            strategy.aggregate(rnd, trained)
        sync(device)

    tic = time.perf_counter()
    one_round(1)  # warm-up: kernel selection, allocator, compilation, first-call overheads
    warmup = time.perf_counter() - tic
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = peak_rss_reset()
    tic = time.perf_counter()
    for rnd in range(2, 2 + args.rounds):
        one_round(rnd)
    seconds = (time.perf_counter() - tic) / args.rounds
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _status_kb("VmHWM") * 1024 - base
    steps = args.seeds * args.clients * args.epochs * -(-args.samples // args.batch_size)
    models = 2 if args.algorithm == "fml" else 1  # FML trains a meme and a personal model
    flops = step_flops(task, args.batch_size) * steps * models
    return {"model": args.model, "backend": args.backend, "seconds": seconds, "warmup": warmup,
            "peak_mib": peak / 2**20, "tflops": flops / seconds / 1e12}


def main() -> None:
    """Run every (model, backend) pair in a subprocess and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="cnn,resnet18,vgg16,lstm")
    parser.add_argument("--backends", default=None,
                        help=f"from {list(BACKENDS)}; default all on a GPU, loop,vmap on a CPU")
    parser.add_argument("--algorithm", default="fedavg", help="fml: two models per client")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds per round: loop runs them in turn, the others stack them")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500, help="samples per client")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--chunk-size", type=int, default=None, help="vmap: clients per stack")
    parser.add_argument("--quick", action="store_true",
                        help="4 clients x 1 epoch x 100 samples (for a CPU)")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.epochs, args.samples = 4, 1, 100
    if args.backends is None:
        args.backends = ",".join(BACKENDS) if args.device.startswith("cuda") else "loop,vmap"
    unknown = set(args.backends.split(",")) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {list(BACKENDS)}")
    if args.seeds > 1 and args.algorithm == "fml":
        parser.error("--seeds stacks one model per client; fml trains two")
    if args.model:  # worker: one measurement, one JSON line
        print(json.dumps(measure(args)))
        return

    peak = matmul_peak(torch.device(args.device))
    rows = []
    for model in args.models.split(","):
        for backend in args.backends.split(","):
            cmd = [sys.executable, __file__, "--model", model, "--backend", backend,
                   "--device", args.device, "--rounds", str(args.rounds),
                   "--clients", str(args.clients), "--samples", str(args.samples),
                   "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
                   "--algorithm", args.algorithm, "--seeds", str(args.seeds)]
            if args.chunk_size:
                cmd += ["--chunk-size", str(args.chunk_size)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if out.returncode != 0:
                print(f"{model}/{backend} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  done {model}/{backend}: {rows[-1]['seconds']:.3f} s/round",
                  file=sys.stderr, flush=True)
    print_table(rows, peak, args)


def print_table(rows: list[dict], peak: float, args: argparse.Namespace) -> None:
    """Markdown table: seconds per round, peak memory, loop/vmap ratio, TFLOP/s."""
    memory = "CUDA max_memory_allocated" if args.device.startswith("cuda") else "peak RSS growth"
    seeds = f"{args.seeds} seeds x " if args.seeds > 1 else ""
    print(f"\n{args.algorithm}, {seeds}{args.clients} clients x {args.epochs} epochs x "
          f"{args.samples} samples, batch {args.batch_size}, {args.rounds} timed rounds after "
          f"1 warm-up, device {args.device}")
    print(f"float32 matmul peak measured in this run: {peak:.3f} TFLOP/s\n")
    print(f"| model | backend | s/round | warm-up s | peak MiB ({memory}) | loop/backend | "
          "TFLOP/s | % peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    loop_time = {r["model"]: r["seconds"] for r in rows if r["backend"] == "loop"}
    for r in rows:
        ratio = ""
        if r["backend"] != "loop" and r["model"] in loop_time:
            ratio = f"{loop_time[r['model']] / r['seconds']:.2f}x"
        print(f"| {r['model']} | {r['backend']} | {r['seconds']:.3f} | {r['warmup']:.1f} | "
              f"{r['peak_mib']:.0f} | "
              f"{ratio} | {r['tflops']:.4f} | {100 * r['tflops'] / peak:.1f} |")


if __name__ == "__main__":
    main()
