"""The seed papers' baselines two ways on real data: as their own papers (flnotes' defaults)
and as the seed authors' code ran them (the settings the ``*-official`` presets set).

FedExP: the server step eta_g of every round, with the FedExP paper's eps = 1e-3 and with
the seed code's eps = 0.1 added once per client (Algorithm/Training_FedExP.py l.83); FedGen:
the FedGen authors' settings (flnotes' defaults) against the seed code's choices
(flnotes/algorithms/fedgen.py lists them). Everything else is preset fedmut-official
(CIFAR-10, the code's LeNet, 100 clients, 10 per round, 5 local epochs, Dirichlet 0.5).

    python benchmarks/seed_code_baselines.py --data-dir FOLDER --rounds 20 \\
        --out results/seed-code-baselines/comparison.json

Writes per-round rows (accuracy every --eval-every rounds, server_step for FedExP) to the JSON
file that notebook 20 plots, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from flnotes.config import RunConfig
from flnotes.config.presets import preset_values
from flnotes.engine.sim import run

# The two readings of each baseline: (label, settings on top of fedmut-official's setup).
PAPER = {name: value for name, value in RunConfig(algorithm="fedgen").settings_read().items()}
VARIANTS = {
    "fedavg": [("FedAvg (reference)", {})],
    "fedexp": [("FedExP paper (eps 1e-3)", {"fedexp_eps": 1e-3, "fedexp_eps_per_client": False}),
               ("seed code (eps 0.1 x M)", {"fedexp_eps": 0.1, "fedexp_eps_per_client": True})],
    "fedgen": [("FedGen authors (flnotes default)", PAPER),
               ("seed code", {k: v for k, v in preset_values("fedmut-official").items()
                              if k.startswith("fedgen_")})],
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="fedavg,fedexp,fedgen")
    parser.add_argument("--out", default="results/seed-code-baselines/comparison.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    results["command"] = ("python benchmarks/seed_code_baselines.py --data-dir FOLDER "
                          f"--rounds {args.rounds} --eval-every {args.eval_every} "
                          f"--seed {args.seed}")
    results.setdefault("runs", {})
    print(f"{'method':8s} {'reading':34s} {'final acc':>9s} {'mean eta_g':>10s} {'cpu_s':>6s}")
    for method in args.methods.split(","):
        for label, settings in VARIANTS[method]:
            config = RunConfig.from_preset(
                "fedmut-official", algorithm=method, rounds=args.rounds, seed=args.seed,
                eval_every=args.eval_every, data_dir=args.data_dir, device="cpu", **settings)
            tic = time.process_time()
            history = run(config, progress=False)
            seconds = time.process_time() - tic
            rows = [{k: r[k] for k in ("round", "accuracy", "loss", "train_loss", "server_step")
                     if k in r} for r in history.rows]
            results["runs"][f"{method}/{label}"] = {"method": method, "reading": label,
                                                    "settings": settings, "rows": rows,
                                                    "status": history.status,
                                                    "cpu_seconds": round(seconds, 1)}
            accuracy = history.metric("accuracy")
            steps = [r["server_step"] for r in rows if "server_step" in r]
            mean_step = f"{sum(steps) / len(steps):10.3f}" if steps else f"{'-':>10s}"
            print(f"{method:8s} {label:34s} {100 * accuracy[-1]:9.2f} {mean_step} "
                  f"{seconds:6.0f}", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
