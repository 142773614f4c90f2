"""Rerun a committed run on another device, and compare the two round by round.

Used by benchmarks/gpu_check.sh (step c): the CIFAR-10 evidence cell dir=0.1 FedQP seed 0,
committed from a CPU run under results/cifar10-lenet/cells/, rerun on a GPU.

    python benchmarks/gpu_compare.py run RUN_FOLDER --device cuda --data-dir DIR --out NEW
    python benchmarks/gpu_compare.py compare RUN_FOLDER/metrics.jsonl NEW/metrics.jsonl

``run`` reads RUN_FOLDER/config.json, changes only the device, the data folder, the run
folder (and, if asked, the rounds, the backend, or the synthetic data of a quick check) and
runs it. ``compare`` prints a markdown table (round, the two accuracies, their difference)
for every round either run evaluated, then the largest absolute difference over the rounds
both evaluated; ``--scale`` adds the same number between two committed runs (another seed)
for scale. ``compare`` reads JSON only (no torch), so it is quick; so does ``tests``, which turns
pytest's ``--junitxml`` file into a markdown table (step b).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def read_rows(path: Path) -> dict[int, dict]:
    """metrics.jsonl as {round: row}; a resumed run's later row for a round wins."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["round"])] = row
    return rows


def run_info(metrics: Path) -> str:
    """Device, backend and torch of the run beside ``metrics`` (its run.json), in words."""
    try:
        info = json.loads((Path(metrics).parent / "run.json").read_text())
    except (OSError, ValueError):
        return "no run.json"
    env, config = info.get("environment", {}), info.get("config", {})
    tf32 = (f", TF32 conv {env['tf32_conv']} matmul {env.get('tf32_matmul')}"
            if "tf32_conv" in env else "")
    device = env.get("gpu") or env.get("device", "?")
    return (f"device {device}{tf32}, backend {config.get('backend', '?')}, "
            f"torch {env.get('torch', '?')}, code {info.get('code_version', '?')}, "
            f"data {config.get('dataset', '?')} ({env.get('data_source', '?')})")


def fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def differences(a: dict[int, dict], b: dict[int, dict], key: str) -> list[tuple[int, float]]:
    """(round, b - a) for every round where both rows hold a finite ``key``."""
    out = []
    for rnd in sorted(set(a) & set(b)):
        x, y = a[rnd].get(key), b[rnd].get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x == x and y == y:
            out.append((rnd, y - x))
    return out


def largest(diffs: list[tuple[int, float]]) -> str:
    if not diffs:
        return "none (no round where both have it)"
    rnd, d = max(diffs, key=lambda t: abs(t[1]))
    return f"{abs(d):.4g} at round {rnd} (over {len(diffs)} rounds)"


def compare(args: argparse.Namespace) -> int:
    """Print the round-by-round table; 1 when the two runs share no round."""
    a, b = read_rows(args.reference), read_rows(args.new)
    la, lb = args.labels.split(",")
    lines = [f"{la}: `{args.reference}` ({run_info(args.reference)})",
             f"{lb}: `{args.new}` ({run_info(args.new)})", ""]
    if args.note:
        lines += [args.note, ""]
    lines += [f"| round | {la} acc | {lb} acc | difference ({lb} - {la}) | "
              f"{la} train loss | {lb} train loss |", "|---:|---:|---:|---:|---:|---:|"]
    for rnd in sorted(set(a) | set(b)):
        ra, rb = a.get(rnd, {}), b.get(rnd, {})
        if "accuracy" not in ra and "accuracy" not in rb:
            continue
        xa, xb = ra.get("accuracy"), rb.get("accuracy")
        diff = f"{xb - xa:+.4f}" if xa is not None and xb is not None else "-"
        lines.append(f"| {rnd} | {fmt(xa)} | {fmt(xb)} | {diff} | "
                     f"{fmt(ra.get('train_loss'))} | {fmt(rb.get('train_loss'))} |")
    acc, loss = differences(a, b, "accuracy"), differences(a, b, "train_loss")
    lines += ["", f"Rounds: {la} {len(a)}, {lb} {len(b)}, both {len(set(a) & set(b))}.",
              f"Max abs accuracy difference: {largest(acc)}.",
              f"Max abs train-loss difference: {largest(loss)}."]
    if acc:
        last = acc[-1][0]
        lines.append(f"Last round both evaluated ({last}): {la} {a[last]['accuracy']:.4f}, "
                     f"{lb} {b[last]['accuracy']:.4f}.")
    if args.scale:
        other = read_rows(args.scale)
        lines.append(f"For scale, {la} against `{args.scale}`: max abs accuracy difference "
                     f"{largest(differences(a, other, 'accuracy'))}.")
    text = "\n".join(lines)
    print(text)
    if args.table:
        Path(args.table).write_text(text + "\n")
    if not (acc or loss):
        print("gpu_compare.py: error: the two runs share no round with a metric",
              file=sys.stderr)
        return 1
    return 0


def tests_table(args: argparse.Namespace) -> int:
    """pytest's JUnit XML as a markdown table: test, outcome, seconds; then the counts."""
    import xml.etree.ElementTree as ET

    lines = [args.note, ""] if args.note else []
    lines += ["| test | outcome | seconds |", "|---|---|---:|"]
    counts: dict[str, int] = {}
    for case in ET.parse(args.xml).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "FAILED", "error": "ERROR"}.get(child.tag, "skipped")
        counts[outcome] = counts.get(outcome, 0) + 1
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        lines.append(f"| {name.removeprefix('tests/')} | {outcome} | "
                     f"{float(case.get('time', 0)):.1f} |")
    lines += ["", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no tests ran"]
    text = "\n".join(lines)
    print(text)
    if args.table:
        Path(args.table).write_text(text + "\n")
    return 0


def rerun(args: argparse.Namespace) -> int:
    """Rerun the committed run folder's config on ``--device``."""
    import torch

    sys.path.insert(0, str(ROOT))
    from flnotes import RunConfig, run
    from flnotes.engine.backends import resolve_backend

    values = json.loads((Path(args.folder) / "config.json").read_text())
    config = RunConfig.from_dict(values).replace(device=args.device, run_dir=str(args.out))
    if args.data_dir:
        config = config.replace(data_dir=str(args.data_dir))
    if args.synthetic:  # a quick check without CIFAR: the sweep grids' smoke task
        config = config.replace(dataset="synthetic", model="mlp", num_clients=10,
                                clients_per_round=5,
                                data_options={"num_train": 1500, "num_test": 500})
    if args.rounds:
        config = config.replace(rounds=args.rounds)
    if args.backend:
        config = config.replace(backend=args.backend)
    if args.eval_every:
        config = config.replace(eval_every=args.eval_every)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tf32 = (f", TF32 cuDNN {torch.backends.cudnn.allow_tf32} matmul "
            f"{torch.backends.cuda.matmul.allow_tf32}" if device.type == "cuda" else "")
    print(f"rerun of {args.folder}: {config.dataset}/{config.model}/{config.algorithm} seed "
          f"{config.seed}, {config.rounds} rounds on {name} (backend {config.backend} -> "
          f"{resolve_backend(config)}{tf32}), torch {torch.__version__}", flush=True)
    tic = time.perf_counter()
    every = max(1, config.rounds // 10)

    def on_round(row: dict) -> None:
        if row["round"] % every == 0 or row["round"] == config.rounds:
            acc = f", accuracy {row['accuracy']:.4f}" if "accuracy" in row else ""
            print(f"  round {row['round']}/{config.rounds}: train loss {row['train_loss']:.4f}"
                  f"{acc} ({time.perf_counter() - tic:.0f} s)", flush=True)

    run(config, progress=False, on_round=on_round, track=False)
    print(f"done: {config.rounds} rounds in {time.perf_counter() - tic:.1f} s "
          f"(data loading included)", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="rerun a committed run folder on another device")
    r.add_argument("folder", type=Path, help="a run folder holding config.json")
    r.add_argument("--device", required=True)
    r.add_argument("--out", type=Path, required=True, help="the new run folder")
    r.add_argument("--data-dir", type=Path, default=None)
    r.add_argument("--rounds", type=int, default=None)
    r.add_argument("--backend", default=None, help="default: the committed run's (auto)")
    r.add_argument("--eval-every", type=int, default=None)
    r.add_argument("--threads", type=int, default=None, help="torch threads")
    r.add_argument("--synthetic", action="store_true",
                   help="the synthetic smoke task (MLP) instead of the run's data")
    c = sub.add_parser("compare", help="round-by-round table of two metrics.jsonl")
    c.add_argument("reference", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--labels", default="CPU,GPU", help="two names, comma-separated")
    c.add_argument("--scale", type=Path, default=None,
                   help="another metrics.jsonl (another seed) compared with the reference")
    c.add_argument("--note", default="", help="a line printed above the table")
    c.add_argument("--table", type=Path, default=None, help="also write the table here")
    t = sub.add_parser("tests", help="pytest's --junitxml file as a markdown table")
    t.add_argument("xml", type=Path)
    t.add_argument("--note", default="", help="a line printed above the table")
    t.add_argument("--table", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    if args.command == "compare" and len(args.labels.split(",")) != 2:
        parser.error("--labels takes two names, comma-separated")
    return {"run": rerun, "compare": compare, "tests": tests_table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
