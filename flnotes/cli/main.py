"""The parser of ``python -m flnotes run|demo|presets|sweep|tables`` and its dispatch."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any

import yaml

from flnotes import __version__
from flnotes.algorithms import algorithm_class, algorithm_names, all_settings, settings_of
from flnotes.cli.field_help import FIELD_HELP
from flnotes.cli.run import (
    EXIT_INTERRUPTED,
    EXIT_READER_LEFT,
    EXIT_TERMINATED,
    exit_code,
    run_command,
    send_nowhere,
    terminate_like_ctrl_c,
    too_large,
)
from flnotes.config import (
    BACKENDS,
    COMPILE_MODES,
    PARTITIONS,
    WEIGHTINGS,
    RunConfig,
    common_field_names,
    field_names,
    model_names,
)
from flnotes.config.presets import describe, preset_names, preset_values, summary
from flnotes.config.runconfig import only_read
from flnotes.config.yaml_text import DuplicateKey, read_yaml
from flnotes.data.registry import dataset_names
from flnotes.engine.sim import RESUMABLE_CHANGES
from flnotes.engine.tracking import parse_loggers
from flnotes.messages import did_you_mean, one_line, os_error_line
from flnotes.repro import sweep as sweep_cli
from flnotes.repro.grid import __doc__ as grid_doc
from flnotes.repro.notebooks import copy_notebooks

DESCRIPTION = """\
Federated-learning methods to run, study and compare with their papers. Commands: run
(train one configuration), demo (the quick-start job), notebooks (copy the notebook series
into a folder), presets (the papers' settings), sweep (a YAML grid of notebook runs; --list
shows the grids that ship), tables (the papers' tables with our results beside them),
figures (the papers' figures from a sweep's results), results-page (FOLDER.md: a page) and
methods (every method, its module and paper tables).
`python -m flnotes COMMAND --help` lists a command's flags."""


def _parse_bool(text: str) -> bool:
    if text.lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        return text.lower() in {"1", "true", "yes", "on"}
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = read_yaml(value)  # (YAML 1.2 booleans: KEY=off is the text 'off')
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not YAML ({one_line(err)}); "
                                         "quote it, e.g. KEY='VALUE'") from None
    if isinstance(parsed, str):
        # YAML 1.1 reads 1e-3 (no dot) as text: take any number Python reads as a number.
        try:
            parsed = float(parsed)
        except ValueError:
            pass
    return key, parsed


def field_help(name: str, default: Any, choices: list[str] | None) -> str:
    """One flag's help: what it does, its choices and its default (None: said in the text)."""
    parts = [FIELD_HELP[name]]
    if choices:
        parts.append(f"choices: {', '.join(choices)}")
    if default is not None and name != "data_options":
        parts.append(f"default: {str(default).lower() if isinstance(default, bool) else default}")
    # argparse %-formats help strings.
    return "; ".join(parts).replace("%", "%%")


def _setting_help(setting, readers: list[str]) -> str:
    """A method setting's help: what it does, who reads it, its range, default and source."""
    parts = [setting.help]
    if len(readers) > 1:
        parts.append(f"read by {', '.join(readers)}")
    parts.append(setting.allowed())
    if setting.default is not None:
        default = setting.default
        parts.append(f"default: {str(default).lower() if isinstance(default, bool) else default}")
    if setting.source:
        parts.append(f"from: {setting.source}")
    return "; ".join(parts).replace("%", "%%")


def _setting_type(setting):
    """argparse type: the setting's own parse, with its message on a bad value."""
    def parse(text: str):
        try:
            return setting.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--{setting.name.replace('_', '-')}: {text!r} is not {setting.allowed()}"
            ) from None
    parse.__name__ = setting.name
    return parse


def add_config_flags(parser: argparse.ArgumentParser, only: str | None = None) -> None:
    """One flag per RunConfig field, defaulting to 'not given': the common fields, then one
    group per method with the settings it declares (``only``: that method's group alone)."""
    hints = typing.get_type_hints(RunConfig)
    # The allowed values of the common fields that take a name, for --help.
    choices = {"algorithm": algorithm_names(), "dataset": dataset_names(), "model": model_names(),
               "partition": list(PARTITIONS), "backend": list(BACKENDS),
               "compile": list(COMPILE_MODES), "weighting": list(WEIGHTINGS)}
    group = parser.add_argument_group("common settings (every method)")
    for name in common_field_names():
        f = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = field_help(f.name, default, choices.get(f.name))
        if f.name == "data_options":
            # Not given: absent, so a preset's data options stand (an empty dict here
            # silently replaced them, e.g. fedmut-official's normalize="fedmut-code").
            group.add_argument("--data-option", dest="data_options", action="append",
                               type=_parse_option, metavar="KEY=VALUE", help=text,
                               default=argparse.SUPPRESS)
            continue
        kind = {bool: _parse_bool, int: int, float: float}.get(base, str)
        metavar = "{true,false}" if base is bool else None
        group.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=metavar, help=text)
    declared = all_settings()
    placed: set[str] = set()
    for algorithm in ([only] if only else algorithm_names()):
        own = [s for n, s in settings_of(algorithm).items() if n not in placed or only]
        if not own:
            continue
        label = algorithm_class(algorithm).label or algorithm
        group = parser.add_argument_group(f"{label} settings (--algorithm {algorithm})")
        for setting in own:
            placed.add(setting.name)
            readers = list(declared.get(setting.name, {algorithm: setting}))
            metavar = ("{" + ",".join(setting.choices) + "}" if setting.choices else
                       "{true,false}" if setting.kind is bool else None)
            group.add_argument("--" + setting.name.replace("_", "-"), dest=setting.name,
                               type=_setting_type(setting), default=argparse.SUPPRESS,
                               metavar=metavar, help=_setting_help(setting, readers))
    if only:  # the other methods' flags still parse, so that using one says whose it is
        for name, by_method in declared.items():
            if name not in placed:
                setting = next(iter(by_method.values()))
                parser.add_argument("--" + name.replace("_", "-"), dest=name,
                                    type=_setting_type(setting), default=argparse.SUPPRESS,
                                    help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """RunConfig from a preset, a run folder's config (``--config``, ``--resume``) or the
    defaults, overridden by explicit flags.

    Flags are what the user typed: a method setting the chosen method does not read is a
    one-line error naming the methods that read it.
    """
    values = {k: v for k, v in vars(args).items() if k in set(field_names())}
    if "data_options" in values:
        values["data_options"] = dict(values["data_options"] or [])
    config_file = getattr(args, "config", None)
    if (resume := getattr(args, "resume", None)) is not None:
        return _resume_config(resume, values, args)
    if config_file is not None:
        if getattr(args, "preset", None) is not None:
            raise ValueError("--config and --preset both name a starting config; give one")
        stored = _stored_config(config_file, "--config")
        stored.pop("run_dir", None)  # a new run: its own folder, unless --run-dir says
        if "data_options" in values:  # KEY=VALUE adds to (or changes) the stored options
            values["data_options"] = {**(stored.get("data_options") or {}),
                                      **values["data_options"]}
        try:  # the file's own problems, named as the file's
            RunConfig.from_dict(_said(stored), strict=True)
        except ValueError as err:
            raise ValueError(f"--config {config_file}: {err}") from None
        algorithm = values.get("algorithm", stored.get("algorithm", "fedavg"))
        # The file's settings for another method are left out; a flag's are refused.
        return RunConfig.from_dict({**only_read(stored, algorithm), **values}, strict=True)
    if getattr(args, "preset", None) is not None:  # "" is an unknown preset, not none
        if "data_options" in values:  # KEY=VALUE adds to (or changes) the preset's options
            values["data_options"] = {**RunConfig.from_preset(args.preset).data_options,
                                      **values["data_options"]}
        return RunConfig.from_preset(args.preset, **values)
    return RunConfig.from_dict(values, strict=True)


def _said(stored: dict) -> dict:
    """A config file's values without the settings its method does not read that hold
    their default: a run folder written before settings belonged to methods holds every
    method's, at its default, and says nothing by them. Any other such setting stays, for
    the strict check to refuse as it refuses the flag."""
    algorithm = stored.get("algorithm", "fedavg")
    if algorithm not in algorithm_names():
        return stored  # refused by name, with the known ones
    read, declared = settings_of(algorithm), all_settings()
    return {k: v for k, v in stored.items()
            if k in read or k not in declared
            or all(v != s.default for s in declared[k].values())}


def _no_duplicates(pairs: list) -> dict:
    """json's object_pairs_hook: a key given twice is refused (json keeps the last)."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def _stored_config(path: str, flag: str) -> dict:
    """The values of a run folder's config.json (``path``: the file or its folder) or of a
    YAML or JSON file, or a one-line ValueError naming the file and what is wrong with it."""
    if not str(path).strip() or "\0" in str(path):
        raise ValueError(f"{flag} {str(path)!r:.80} is not a file's name; name a run "
                         "folder's config.json")
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise ValueError(f"{flag} {path}: {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise ValueError(f"{flag} {path}: cannot read {file} ({reason})") from None
    try:
        try:  # JSON first (YAML 1.1 would read json.dumps's 1e-05 as text), else YAML
            values = json.loads(text, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError:  # (which most JSON also is)
            values = read_yaml(text)
    except DuplicateKey as dup:
        where = f" (line {dup.again})" if dup.again else ""
        raise ValueError(f"{flag} {path}: {file} gives {dup.key!r} twice{where}; keep "
                         "one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{flag} {path}: {file} is damaged (not JSON or YAML: "
                         f"{one_line(err)}{where})") from None
    if not isinstance(values, dict):
        kind = {list: "a list", str: "a text", type(None): "an empty file"}.get(
            type(values), f"a {type(values).__name__}")
        raise ValueError(f"{flag} {path}: {file} is damaged ({kind}, not a mapping of "
                         "settings)")
    return values


def _resume_config(folder: str, flags: dict, args: argparse.Namespace) -> RunConfig:
    """The config that continues run folder ``folder``: its config.json, with only the flags
    that leave its results as they are (more --rounds, another device, ...)."""
    for other in ("config", "preset"):
        if getattr(args, other, None) is not None:
            raise ValueError(f"--resume continues {folder} under its own config; drop "
                             f"--{other} (or use --config {folder} to start a new run from it)")
    if "run_dir" in flags:
        raise ValueError(f"--resume {folder} is the run folder; drop --run-dir")
    if getattr(args, "seeds", None) is not None:
        raise ValueError(f"--resume continues the one run of {folder}; drop --seeds")
    if changed := sorted(k for k in flags if k not in RESUMABLE_CHANGES):
        named = ", ".join("--" + k.replace("_", "-") for k in changed)
        raise ValueError(f"--resume continues {folder} with its own settings, which {named} "
                         f"would change; start a new run with --config {folder} {named} ...")
    if not str(folder).strip() or "\0" in str(folder):
        raise ValueError(f"--resume {str(folder)!r:.80} is not a folder's name; name a run "
                         "folder")
    where = Path(folder)
    if not where.is_dir():
        what = "is a file, not a run folder" if where.exists() else "does not exist"
        raise ValueError(f"--resume {folder} {what}")
    if not (where / "config.json").exists():
        if seeds := sorted(p.name for p in where.glob("seed*") if (p / "config.json").exists()):
            raise ValueError(f"--resume {folder} holds the folders of a --seeds run "
                             f"({', '.join(seeds)}); continue it with --config "
                             f"{where / seeds[0]} --seeds ... --run-dir {folder}")
        raise ValueError(f"--resume {folder} holds no config.json: not a run folder (or "
                         "one stopped before it began; run its command again)")
    stored = _stored_config(str(where / "config.json"), "--resume")
    stored.update(flags, run_dir=str(where))
    try:
        return RunConfig.from_dict(stored)
    except ValueError as err:
        raise ValueError(f"--resume {folder}: {where / 'config.json'}: {err}") from None


def cmd_run(args: argparse.Namespace) -> int:
    """Run one configuration (``--seeds``: several), print each round, save a curve."""
    loggers = parse_loggers(args.logger)  # before a config is read
    seed = getattr(args, "seed", None)  # (a config flag: absent unless given)
    if args.seeds is not None and seed is not None:  # else --seed would be dropped
        raise ValueError(f"give --seed {seed} or --seeds {','.join(map(str, args.seeds))}, "
                         "not both (--seeds runs each seed it names)")
    return run_command(config_from_args(args), args.seeds, loggers=loggers,
                       logger_dir=args.logger_dir, threads=args.threads,
                       client_workers=args.client_workers)


def _positive_int(text: str) -> int:
    """A whole number >= 1 (argparse turns the error into its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _seed_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0,1,2, got {text!r}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    """The quick-start job: a small federated run on built-in defaults, with a plot."""
    from flnotes.cli.demo import main_job  # matplotlib: see build_parser

    if not str(args.out).strip() or "\0" in str(args.out):
        # Path("") is the current folder: the demo would write among whatever is there.
        raise ValueError(f"--out {str(args.out)!r:.80} is not a folder's name; name one, or "
                         "leave the flag out for out/demo")
    return main_job(Path(args.out), skip_notebooks=args.skip_notebooks, quick=args.quick)


def cmd_notebooks(args: argparse.Namespace) -> int:
    """Copy the notebook series into a folder to open in Jupyter."""
    copied = copy_notebooks(args.dest, force=args.force)  # checks the name: Path("") is "."
    dest = Path(args.dest)
    print(f"copied {len(copied)} files into {dest}; open them with: jupyter lab {dest}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """Every registered method, as the README's table (markdown)."""
    from flnotes.repro.paper_tables import methods_markdown  # pandas: see build_parser

    print(methods_markdown())
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    """List presets, or show one with the source of each value."""
    if args.name:
        if args.name not in preset_names():
            raise ValueError(f"unknown preset {args.name!r}"
                             f"{did_you_mean(args.name, preset_names())}; presets: "
                             f"{', '.join(preset_names())}")
        print(json.dumps(preset_values(args.name), indent=2))
        print(describe(args.name))
    else:
        width = max(map(len, preset_names()))
        for name in preset_names():
            print(f"{name:<{width}}  {summary(name)}")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, the problem and where the flags are listed, not
    the command's whole usage above it (run's is 85 lines)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} ({self.prog} --help lists the flags)\n")


def build_parser(only_algorithm: str | None = None) -> argparse.ArgumentParser:
    """The argument parser for all subcommands (``only_algorithm``: ``run``'s method flags
    are that method's alone, for ``run --algorithm NAME --help``)."""
    # Here, not at the top: they load pandas and matplotlib, which a sweep's workers never
    # need (spawned, they import flnotes.__main__, so this module, again).
    from flnotes.repro import figures as figures_cli
    from flnotes.repro import results_page as page_cli
    from flnotes.repro import tables as tables_cli

    # allow_abbrev=False everywhere: "--round 3" must not silently mean "--rounds 3".
    # named as the user called it: the `flnotes` command, or `python -m flnotes`
    prog = "flnotes" if Path(sys.argv[0]).name == "flnotes" else "python -m flnotes"
    parser = OneLineParser(prog=prog, description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"flnotes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands", parser_class=OneLineParser)
    def command(name: str, func, **kwargs) -> argparse.ArgumentParser:
        made = sub.add_parser(name, allow_abbrev=False, **kwargs)
        made.set_defaults(func=func, command_parser=made)
        return made

    p_run = command(
        "run", cmd_run,
        help="train one configuration (one flag per RunConfig field; --preset, --seeds)",
        description="Train one federated configuration. Every round's line is printed as it "
        "ends; the run folder (--run-dir) holds config, metrics and checkpoints, and the same "
        "command again resumes it. Ctrl-C stops it resumably.")
    p_run.add_argument("--preset", help="start from a named preset (see `presets`); flags "
                       "given as well override its values")
    p_run.add_argument("--seeds", type=_seed_list, metavar="S1,S2,...",
                       help="run these seeds and print mean +- std; with the vmap backend "
                            "(the default on a GPU) their clients train as one stack")
    p_run.add_argument("--config", metavar="FILE",
                       help="start from a run folder's config.json (or the folder), or a "
                            "JSON or YAML file of settings; flags given as well override its "
                            "values, and the run gets its own folder unless --run-dir names "
                            "one")
    p_run.add_argument("--resume", metavar="FOLDER",
                       help="continue a run folder under its own config.json; --rounds may "
                            "raise its rounds (--device, --backend and the like may change; "
                            "settings that change results may not)")
    p_run.add_argument("--logger", action="append", metavar="{tensorboard,mlflow}",
                       help="also log each round's metrics and the settings to TensorBoard "
                            "(RUN_DIR/tensorboard/) or a local MLflow store (RUN_DIR/mlruns/); "
                            "repeat it or give a comma list; metrics.jsonl stays the record")
    p_run.add_argument("--threads", type=_positive_int, metavar="N",
                       help="torch CPU threads for the run (default: one, or the idle cores "
                            "for a model as large as ResNet-18; more threads than free cores "
                            "run slower, not faster: flnotes/engine/threads.py)")
    p_run.add_argument("--client-workers", type=_positive_int, metavar="N",
                       help="train each round's clients in N processes of one thread each "
                            "(the same results bit for bit; 1: in turn; default: the idle "
                            "cores for a model of LeNet's size or more on a CPU, else 1; "
                            "flnotes/engine/client_workers.py)")
    p_run.add_argument("--logger-dir", metavar="DIR",
                       help="log into DIR/tensorboard/<run folder name>/ and DIR/mlruns/ "
                            "instead of the run folder (one place to compare runs)")
    add_config_flags(p_run, only=only_algorithm)
    p_demo = command("demo", cmd_demo,
                     help="the quick-start job: a small run and the toy notebooks")
    p_demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    p_demo.add_argument("--skip-notebooks", action="store_true", help="only the small run")
    p_demo.add_argument("--quick", action="store_true",
                        help="3 rounds and the first notebook only (a check that an install "
                        "works, in about half a minute)")
    p_nb = command("notebooks", cmd_notebooks,
                   help="copy the notebook series into a folder to open in Jupyter")
    p_nb.add_argument("dest", help="the folder to copy them into (made if missing)")
    p_nb.add_argument("--force", action="store_true",
                      help="replace notebooks already there (default: keep them)")
    # The help shows the grid file format too: it is what a user of the command writes.
    sweep_cli.add_arguments(command(
        "sweep", sweep_cli.cmd_sweep, help="run a YAML grid of notebooks with papermill (sweeps/)",
        description=f"{sweep_cli.__doc__}\n{grid_doc}",
        formatter_class=argparse.RawDescriptionHelpFormatter))
    for name, module, func, text in (
            ("tables", tables_cli, tables_cli.cmd_tables,
             "the papers' tables with the results of a folder of runs beside them"),
            ("figures", figures_cli, figures_cli.cmd_figures,
             "draw a paper's figure from a folder of runs (--list: which)"),
            ("results-page", page_cli, page_cli.cmd_results_page,
             "write a results page (FOLDER.md) from a sweep's run folders")):
        module.add_arguments(command(name, func, help=text))
    command("methods", cmd_methods, help="the registered methods: flag value, paper name, what "
            "it is, module, paper tables (the README's table)")
    command("presets", cmd_presets, help="list the named paper settings, or show one with "
            "where each value comes from").add_argument(
        "name", nargs="?", help="a preset to show (default: list them all)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, but an unknown flag gets a 'did you mean' (a one-line error)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = getattr(args, "command_parser", parser)
        flags = [s for action in command._actions for s in action.option_strings]
        named = [x + did_you_mean(x, flags) if x.startswith("-") else x for x in extras]
        command.error(f"unrecognized arguments: {' '.join(named)}")
    return args


def _help_algorithm(argv: list[str] | None) -> str | None:
    """NAME of ``run --algorithm NAME --help`` (a registered one), else None."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "run" or not {"-h", "--help"} & set(argv):
        return None
    for i, word in enumerate(argv):
        name = (argv[i + 1] if word == "--algorithm" and i + 1 < len(argv) else
                word.split("=", 1)[1] if word.startswith("--algorithm=") else None)
        if name in algorithm_names():
            return name
    return None


_IMPORTED = time.perf_counter()  # where the process's age is unknown: from this import on


def seconds_running() -> float:
    """Seconds since this process started, start-up and imports included (Linux: from
    /proc/self/stat's start time; elsewhere from when this module was imported)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: ticks since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        if 0 <= uptime - started < 10 * 365 * 86400:
            return uptime - started
    except (OSError, ValueError, IndexError):
        pass
    return time.perf_counter() - _IMPORTED


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m flnotes``."""
    args = parse_args(build_parser(_help_algorithm(argv)), argv)
    try:
        with terminate_like_ctrl_c():
            code = args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        send_nowhere()
        return 0
    except OSError as err:  # a folder that cannot be written, a disk that is full, ...
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print("interrupted", file=sys.stderr)
        return exit_code(stop)
    except Exception as err:  # a fault below (a CUDA error, a bug): one line, not a traceback
        typed = dict(getattr(args, "data_options", None) or [])
        huge = too_large(typed, err) if isinstance(err, MemoryError) else None
        if huge:  # a size the user typed that cannot fit: bad input, not a fault
            print(f"error: {huge}", file=sys.stderr)
            return 2
        print(f"error: {type(err).__name__}: {one_line(err)} (unexpected; set "
              "FLNOTES_TRACEBACK=1 to see where)", file=sys.stderr)
        if os.environ.get("FLNOTES_TRACEBACK"):
            raise
        return 1
    if argv is None and code not in (EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_READER_LEFT):
        try:
            # Only as the program (argv from the command line), as the user waited, start-up
            # included; on stderr: `methods > table.md` keeps the command's output alone, and
            # a caller from Python reads its own output and errors.
            took = seconds_running()
            sys.stdout.flush()
            print(f"done in {took:.1f} s", file=sys.stderr)
        except BrokenPipeError:  # the reader left after the work was done: it stands
            send_nowhere()
    return code

