"""Seconds per federated round, loop vs vmap backend, in FedMut's setting.

FedMut's setting: 10 clients x 5 local epochs x 500 samples each, batch 50, SGD lr 0.01
momentum 0.9, on random data of the right shape (CIFAR images; 80-character Shakespeare
windows for the LSTM). A round is dispatch + local training + aggregation. Every
(model, backend) pair runs in a fresh subprocess, so peak memory is its own.

    python benchmarks/round_time.py --device cpu --quick
    python benchmarks/round_time.py --device cuda --rounds 3

Models: cnn, resnet18, vgg16, lstm (FedMut's Table 1 and Shakespeare), resnet20 and
lenet-cifar (the seed authors' LeNet, in the CIFAR-10 evidence run's setting: momentum and
weighting of preset fedmut-official). ``--algorithm fedavg,fedmut`` measures each method.
An unknown model, backend or method is a one-line error before any work; a failed
measurement makes the exit status 1. ``--table FILE`` rewrites the table there after every
measurement, so a run cut short keeps what it measured.

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

from flnotes.algorithms import algorithm_names, build_strategy  # noqa: E402
from flnotes.config import RunConfig  # noqa: E402
from flnotes.config.presets import preset_values  # noqa: E402
from flnotes.engine.batched.functional import StepContext, vmap_ready  # noqa: E402
from flnotes.engine.batched.stacked import train_supervised  # noqa: E402
from flnotes.engine.batched.vmap import train_clients_vmap  # noqa: E402
from flnotes.engine.tasks import Task  # noqa: E402
from flnotes.engine.train import train_clients_loop  # noqa: E402
from flnotes.messages import did_you_mean  # noqa: E402
from flnotes.models import build_model  # noqa: E402

# backend name -> (RunConfig.backend, RunConfig.compile)
BACKENDS = {"loop": ("loop", "off"), "vmap": ("vmap", "off"),
            "compiled": ("vmap", "default"), "graphs": ("vmap", "reduce-overhead")}

# model -> (one sample's shape, number of classes)
SHAPES = {"cnn": ((3, 32, 32), 10), "resnet18": ((3, 32, 32), 10),
          "vgg16": ((3, 32, 32), 10), "lstm": ((80,), 80),
          "resnet20": ((3, 32, 32), 10), "lenet-cifar": ((3, 32, 32), 10)}

# The round's optimiser: FedMut's setting, except where a model's own run says otherwise.
DEFAULT_SETTINGS = {"lr": 0.01, "momentum": 0.9}
# lenet-cifar as the CIFAR-10 evidence run trains it (benchmarks/cifar10_lenet_evidence.yaml:
# preset fedmut-official, the seed authors' code: momentum 0.5, uniform aggregation).
PRESET_OF = {"lenet-cifar": "fedmut-official"}


def model_settings(model: str) -> dict:
    """lr, momentum (and weighting) of a round of ``model``."""
    settings = dict(DEFAULT_SETTINGS)
    if model in PRESET_OF:
        values = preset_values(PRESET_OF[model])
        assert values["model"] == model, (model, values["model"])
        settings.update({k: values[k] for k in ("lr", "momentum", "weighting") if k in values})
    return settings


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
                       batch_size=args.batch_size, device=args.device, backend=backend,
                       compile=compile_mode, **model_settings(args.model)).resolved()
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
    return {"model": args.model, "algorithm": args.algorithm, "backend": args.backend,
            "seconds": seconds, "warmup": warmup,
            "peak_mib": peak / 2**20, "tflops": flops / seconds / 1e12}


def fail(message: str) -> None:
    """A one-line error on stderr and exit status 2 (a wrong command line), before any work."""
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def names(text: str, known, what: str) -> list[str]:
    """A comma-separated list, each name one of ``known`` (else a one-line error)."""
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    if not chosen:
        fail(f"--{what} is empty; choose from {', '.join(known)}")
    for name in chosen:
        if name not in known:
            fail(f"unknown {what[:-1]} {name!r}{did_you_mean(name, known)}; "
                 f"choose from {', '.join(known)}")
    return chosen


def main() -> None:
    """Measure every (method, model, backend), each in a subprocess, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="cnn,resnet18,vgg16,lstm",
                        help=f"from {', '.join(SHAPES)}")
    parser.add_argument("--backends", default=None,
                        help=f"from {', '.join(BACKENDS)}; default all on a GPU, loop,vmap "
                             "on a CPU")
    parser.add_argument("--algorithm", default="fedavg",
                        help="method, or several comma-separated (fedavg,fedmut); fml: two "
                             "models per client")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds per round: loop runs them in turn, the others stack them")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up")
    parser.add_argument("--clients", type=int, default=None, help="default 10 (--quick: 4)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per client; default 500 (--quick: 100)")
    parser.add_argument("--epochs", type=int, default=None, help="default 5 (--quick: 1)")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--chunk-size", type=int, default=None, help="vmap: clients per stack")
    parser.add_argument("--quick", action="store_true",
                        help="4 clients x 1 epoch x 100 samples (for a CPU); --clients, "
                             "--epochs, --samples given too win")
    parser.add_argument("--table", default=None,
                        help="also write the markdown table to this file, after every "
                             "measurement")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process, not one subprocess per pair (quicker "
                             "to start; peak memory is then not each pair's own)")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, full, quick in (("clients", 10, 4), ("epochs", 5, 1), ("samples", 500, 100)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.backends is None:
        args.backends = ",".join(BACKENDS) if args.device.startswith("cuda") else "loop,vmap"
    backends = names(args.backends, list(BACKENDS), "backends")
    algorithms = names(args.algorithm, algorithm_names(), "algorithms")
    models = names(args.model or args.models, list(SHAPES), "models")
    if args.seeds < 1 or args.rounds < 1:
        fail("--seeds and --rounds must be at least 1")
    if args.seeds > 1 and "fml" in algorithms:
        fail("--seeds stacks one model per client; fml trains two")
    if args.model:  # worker: one measurement, one JSON line
        print(json.dumps(measure(args)))
        return

    peak = matmul_peak(torch.device(args.device))
    rows, failures = [], []
    # Method by method: a run cut short (gpu_check's time limit) loses the last method's rows.
    for algorithm in algorithms:
        for model in models:
            for backend in backends:
                what = f"{model}/{algorithm}/{backend}"
                row, error = (measure_here if args.in_process else measure_apart)(
                    args, model, algorithm, backend)
                if error is not None:
                    print(f"{what} failed:\n{error[-2000:]}", file=sys.stderr)
                    last = (error.strip().splitlines() or ["failed"])[-1]
                    failures.append(f"{what}: {last[:300]}")
                else:
                    rows.append(row)
                    print(f"  done {what}: {row['seconds']:.3f} s/round",
                          file=sys.stderr, flush=True)
                if args.table:
                    write_table(Path(args.table), table(rows, failures, peak, args))
    print(table(rows, failures, peak, args))
    if failures:
        print(f"{len(failures)} measurement(s) failed", file=sys.stderr)
        sys.exit(1)


def measure_apart(args: argparse.Namespace, model: str, algorithm: str,
                  backend: str) -> tuple[dict | None, str | None]:
    """One measurement in a fresh subprocess: (row, None), or (None, its stderr)."""
    cmd = [sys.executable, __file__, "--model", model, "--backend", backend,
           "--device", args.device, "--rounds", str(args.rounds),
           "--clients", str(args.clients), "--samples", str(args.samples),
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--algorithm", algorithm, "--seeds", str(args.seeds)]
    if args.chunk_size:
        cmd += ["--chunk-size", str(args.chunk_size)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        return None, out.stderr or f"exit status {out.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1]), None


def measure_here(args: argparse.Namespace, model: str, algorithm: str,
                 backend: str) -> tuple[dict | None, str | None]:
    """One measurement in this process (--in-process): (row, None), or (None, the error)."""
    import traceback

    try:
        return measure(argparse.Namespace(**{**vars(args), "model": model,
                                             "algorithm": algorithm, "backend": backend})), None
    except Exception:
        return None, traceback.format_exc()


def write_table(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a reader never sees half a table)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def table(rows: list[dict], failures: list[str], peak: float,
          args: argparse.Namespace) -> str:
    """Markdown table: seconds per round, peak memory, loop/backend ratio, TFLOP/s."""
    memory = "CUDA max_memory_allocated" if args.device.startswith("cuda") else "peak RSS growth"
    seeds = f"{args.seeds} seeds x " if args.seeds > 1 else ""
    optim = "; ".join(f"{m}: SGD " + ", ".join(f"{k} {v}" for k, v in model_settings(m).items())
                      for m in dict.fromkeys(r["model"] for r in rows))
    apart = "all in one process" if args.in_process else "each pair in its own process"
    lines = [f"\n{seeds}{args.clients} clients x {args.epochs} epochs x {args.samples} samples, "
             f"batch {args.batch_size}, {args.rounds} timed rounds after 1 warm-up, device "
             f"{args.device}, {apart}" + (f"\n{optim}" if optim else ""),
             f"float32 matmul peak measured in this run: {peak:.3f} TFLOP/s\n",
             f"| model | method | backend | s/round | warm-up s | peak MiB ({memory}) | "
             "loop/backend | TFLOP/s | % peak |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    loop_time = {(r["model"], r["algorithm"]): r["seconds"] for r in rows
                 if r["backend"] == "loop"}
    for r in rows:
        ratio = ""
        key = (r["model"], r["algorithm"])
        if r["backend"] != "loop" and key in loop_time:
            ratio = f"{loop_time[key] / r['seconds']:.2f}x"
        lines.append(f"| {r['model']} | {r['algorithm']} | {r['backend']} | {r['seconds']:.3f} | "
                     f"{r['warmup']:.1f} | {r['peak_mib']:.0f} | {ratio} | "
                     f"{r['tflops']:.4f} | {100 * r['tflops'] / peak:.1f} |")
    if failures:
        lines += ["", "Failed:", *(f"- {f}" for f in failures)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
