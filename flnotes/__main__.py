"""Command line: ``python -m flnotes run|demo|presets ...`` (flags are RunConfig fields)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing
from pathlib import Path
from typing import Any

import yaml

from flnotes.config import RunConfig


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key, yaml.safe_load(value)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field (--clients-per-round ...), defaulting to 'not given'."""
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "data_options":
            parser.add_argument("--data-option", dest="data_options", action="append",
                                type=_parse_option, metavar="KEY=VALUE",
                                help="dataset loader option, repeatable (e.g. coarse=true)")
            continue
        kind = {bool: _parse_bool, int: int, float: float}.get(base, str)
        parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                            help=f"(default: {default})")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """RunConfig from a preset (if given) overridden by explicit flags."""
    values = {k: v for k, v in vars(args).items()
              if k in {f.name for f in dataclasses.fields(RunConfig)}}
    if "data_options" in values:
        values["data_options"] = dict(values["data_options"] or [])
    if getattr(args, "preset", None):
        return RunConfig.from_preset(args.preset, **values)
    return RunConfig.from_dict(values)


def cmd_run(args: argparse.Namespace) -> int:
    """Run one configuration, print accuracy per round, save a learning curve."""
    from flnotes.sim import run

    config = config_from_args(args)
    if getattr(args, "seeds", None):
        return _run_seeds(config, args.seeds)
    if config.run_dir is None:
        config = config.replace(run_dir=str(Path("runs") / default_run_name(config)))
    history = run(config)
    _print_rows(history)
    from flnotes.plots import plot_learning_curves

    fig = plot_learning_curves({config.algorithm: history})
    png = Path(config.run_dir) / "learning_curve.png"
    fig.savefig(png, dpi=120)
    print(f"status: {history.status}; run folder: {config.run_dir}; curve: {png}")
    return 0 if history.status == "completed" else 1


def _run_seeds(config: RunConfig, seeds: list[int]) -> int:
    """Several seeds stacked into one batched run; per-seed and mean +- std accuracy."""
    import numpy as np

    from flnotes.plots import plot_learning_curves
    from flnotes.seeds import run_seeds
    from flnotes.tables import run_metrics

    if config.run_dir is None:
        name = default_run_name(config).rsplit("-seed", 1)[0] + "-seeds"
        config = config.replace(run_dir=str(Path("runs") / name))
    histories = run_seeds(config, seeds)
    finals = []
    for seed, history in zip(seeds, histories, strict=True):
        metrics = run_metrics(history.metric("accuracy"))
        finals.append(metrics["last_mean"])
        print(f"seed {seed}: {history.status}, final accuracy {metrics['final']:.4f}, "
              f"mean of the last {metrics['evaluations']} evaluations "
              f"{metrics['last_mean']:.4f} +- {metrics['last_std']:.4f}")
    print(f"over {len(seeds)} seeds: {np.mean(finals):.4f} +- {np.std(finals):.4f} "
          f"(mean and std of each seed's last-evaluations mean)")
    fig = plot_learning_curves({f"seed {s}": h for s, h in zip(seeds, histories, strict=True)},
                               title=f"{config.algorithm}, {len(seeds)} seeds")
    png = Path(config.run_dir) / "learning_curves.png"
    fig.savefig(png, dpi=120)
    print(f"run folders: {config.run_dir}/seed<N>; curves: {png}")
    return 0 if all(h.status == "completed" for h in histories) else 1


def _seed_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0,1,2, got {text!r}") from None


def default_run_name(config: RunConfig) -> str:
    """A readable folder name for a config."""
    return f"{config.algorithm}-{config.dataset}-{config.partition}-seed{config.seed}"


def _print_rows(history) -> None:
    for row in history.rows:
        acc = f"{row['accuracy']:.4f}" if "accuracy" in row else "   -  "
        print(f"round {row['round']:4d}  train_loss {row['train_loss']:.4f}  accuracy {acc}"
              f"  ({row['seconds']:.2f} s)")


def cmd_demo(args: argparse.Namespace) -> int:
    """The quick-start job: a small federated run on built-in defaults, with a plot."""
    from flnotes.demo import main_job

    return main_job(Path(args.out), skip_notebooks=args.skip_notebooks)


def cmd_presets(args: argparse.Namespace) -> int:
    """List presets, or show one with the source of each value."""
    from flnotes.presets import describe, preset_names, preset_values

    if args.name:
        print(json.dumps(preset_values(args.name), indent=2))
        print(describe(args.name))
    else:
        for name in preset_names():
            print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    parser = argparse.ArgumentParser(prog="python -m flnotes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one federated training")
    p_run.add_argument("--preset", help="start from a named preset (see `presets`)")
    p_run.add_argument("--seeds", type=_seed_list, metavar="S1,S2,...",
                       help="run these seeds and print mean +- std; with the vmap backend "
                            "(the default on a GPU) their clients train as one stack")
    add_config_flags(p_run)
    p_run.set_defaults(func=cmd_run)
    p_demo = sub.add_parser("demo", help="the quick-start job (small run + toy notebooks)")
    p_demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    p_demo.add_argument("--skip-notebooks", action="store_true", help="only the small run")
    p_demo.set_defaults(func=cmd_demo)
    from flnotes import sweep as sweep_cli
    from flnotes import tables as tables_cli

    p_sweep = sub.add_parser("sweep", help="run a YAML grid of notebooks with papermill (sweeps/)")
    sweep_cli.add_arguments(p_sweep)
    p_sweep.set_defaults(func=sweep_cli.cmd_sweep)
    p_tab = sub.add_parser("tables", help="paper tables beside a results folder")
    tables_cli.add_arguments(p_tab)
    p_tab.set_defaults(func=tables_cli.cmd_tables)
    p_pre = sub.add_parser("presets", help="list presets or show one")
    p_pre.add_argument("name", nargs="?")
    p_pre.set_defaults(func=cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m flnotes``."""
    args = build_parser().parse_args(argv)
    tic = time.perf_counter()
    try:
        code = args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"done in {time.perf_counter() - tic:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
