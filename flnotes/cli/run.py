"""The command line's ``run``: run folders, per-round lines, Ctrl-C, seeds, the curve.

Kept apart from :mod:`flnotes.cli.main`, which builds the parser and dispatches.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm

from flnotes.config import RunConfig
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import (  # noqa: F401 (the command line's exit statuses)
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    exit_code,
    ignored_settings,
    interruption_report,
    run,
    settings_hash,
    terminate_like_ctrl_c,
)
from flnotes.engine.stops import (  # noqa: F401 (EXIT_READER_LEFT, send_nowhere: main's)
    EXIT_READER_LEFT,
    reader_left,
    send_nowhere,
)
from flnotes.engine.tracking import Tracker, check_installed, logger_dir_problem
from flnotes.messages import on_terminal, one_line


def run_command(config: RunConfig, seeds: list[int] | None = None, *,
                loggers: list[str] | None = None, logger_dir: str | None = None,
                threads: int | None = None, client_workers: int | None = 1) -> int:
    """Run one configuration (or its seeds), print each round as it ends, save a curve.

    ``loggers`` (:data:`flnotes.engine.tracking.LOGGERS`) copy each round to TensorBoard or
    MLflow beside the run folder (``logger_dir``: into that folder instead). The progress
    bar is drawn only when stderr is a terminal; a log gets plain per-round lines.
    """
    if seeds is not None and not seeds:  # --seeds "": else one seed would run, silently
        raise ValueError("--seeds names no seed; give them like --seeds 0,1,2, or leave the "
                         "flag out to run the one --seed")
    if config.run_dir is not None and not str(config.run_dir).strip():
        # Else the run would save nothing and exit 0 (and put its curve in this folder).
        raise ValueError(f"--run-dir {config.run_dir!r} is empty; name a folder, or leave "
                         "the flag out to use runs/<algorithm>-<dataset>-...")
    if config.run_dir is not None and "\0" in str(config.run_dir):
        raise ValueError(f"--run-dir {str(config.run_dir)!r:.80} holds a NUL byte; name a "
                         "folder")
    if logger_dir is not None and not loggers:  # else silently not used (as sweep says)
        raise ValueError("--logger-dir says where --logger writes: add --logger tensorboard "
                         "(or mlflow)")

    if problem := logger_dir_problem(logger_dir):
        raise ValueError(problem)
    check_installed(loggers or [])  # before any data is loaded
    config.check_device()  # before any data is loaded
    if seeds:
        return _run_seeds(config, seeds, loggers or [], logger_dir, threads, client_workers)
    if config.run_dir is None:
        config = config.replace(run_dir=str(Path("runs") / default_run_name(config)))
    if config.dataset == "toy":
        print(TOY_NOTE)
    tracker = _tracker(config, loggers, logger_dir)
    progress = on_terminal()
    # What the run would print above its bar; the resume line waits for the first round
    # (below): the engine accepts the folder (lock, settings, checkpoint) inside run(), and
    # a folder it refuses must not be said to resume.
    resuming = _plain_start_lines(config) if not progress else None
    printed = []

    def on_round(row: dict) -> None:
        if resuming and not printed and row["round"] > 1:
            _write_line(resuming, progress)
        printed.append(row["round"])
        _write_line(_row_line(row, config.dataset), progress)
        if tracker:
            tracker.log_round(row)

    try:
        history = run(config, on_round=on_round, progress=progress, track=False,
                      threads=threads, client_workers=client_workers)
    except KeyboardInterrupt as stop:
        if tracker:
            tracker.close("interrupted")
        _say(interruption_report(config.run_dir))
        return exit_code(stop)
    except BaseException:
        if tracker:
            tracker.close("failed")
        raise
    if not printed and history.rows:  # a finished folder, reloaded: show what it holds
        go_on = ("raise --rounds to continue it, or delete the folder to run it again"
                 if history.status == "completed" else
                 "a diverged run is not continued: change a setting (e.g. --lr) or delete "
                 "the folder to run it again")
        # A logger asked for after the run gets the run's rows now, before the printing
        # (which a reader that leaves early would cut short).
        logged = tracker.backfill(history.rows) if tracker else []
        print(f"{config.run_dir} already holds this run ({history.status}, "
              f"{len(history.rows)} rounds): showing it; {go_on}")
        for row in history.rows:
            print(_row_line(row, config.dataset))
        for name in logged:
            print(f"{name}: logged the {len(history.rows)} rounds of metrics.jsonl")
    if tracker:
        tracker.close(history.status)
    png = _save_curve({config.algorithm: history}, _curve_title(config),
                      Path(config.run_dir) / "learning_curve.png")
    print(f"status: {history.status}; run folder: {config.run_dir}; curve: {png}")
    if tracker:
        print("; ".join(tracker.where()))
    return 0 if history.status == "completed" else 1


# A data option at or above this asks for more samples than any dataset here holds (CIFAR:
# 50,000; LEAF's Shakespeare: about 4 million): the likely cause of a MemoryError.
_HUGE = 10 ** 8


def too_large(data_options: dict, err: MemoryError) -> str | None:
    """A MemoryError as the one line naming the data option (as typed: ``--data-option``)
    that asked for it; None: no option that large, so not the user's input, and the error
    stays unexpected."""
    huge = [(k, v) for k, v in data_options.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) >= _HUGE]
    if not huge:
        return None
    named = ", ".join(f"--data-option {k}={v}" for k, v in huge)
    why = one_line(err)[:120] or "MemoryError"
    return f"{named} is too large: the data do not fit in memory ({why}); give a smaller value"


def _tracker(config: RunConfig, loggers: list[str] | None, logger_dir: str | None):
    """The run's Tracker (None without loggers): settings as the run records them."""
    return (Tracker(loggers, config.run_dir, config.resolved().to_dict(), logger_dir)
            if loggers else None)


def _plain_start_lines(config: RunConfig) -> str | None:
    """Without a progress bar the engine prints nothing before the first round: print the
    settings it will not use; return, for a run folder it would resume, the line saying
    from where (as it would), to print once the run has accepted the folder."""
    for line in ignored_settings(config):
        print(line, file=sys.stderr)
    run_dir = Path(config.run_dir)
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        held = int(meta.get("checkpoint_round") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # a new folder (or one the run will name as damaged)
    if meta.get("status") != "diverged" and 0 < held < config.rounds \
            and (run_dir / "checkpoint.pt").exists():
        return (f"resuming {run_dir} from round {held}, its last checkpoint (rounds "
                f"{held + 1}-{config.rounds} to run)")
    return None


# On the toy, "accuracy" is a yes/no about where the model ended, not a share of samples.
TOY_NOTE = ("toy task: flat_basin is 1 when the global model lies in the flat basin (the "
            "toy's 'accuracy'), else 0; train_loss is the clients' landscape loss plus "
            "gradient noise, so it can be negative")


def _run_seeds(config: RunConfig, seeds: list[int], loggers: list[str], logger_dir: str | None,
               threads: int | None, client_workers: int | None) -> int:
    """Several seeds stacked into one batched run; per-seed and mean +- std accuracy.

    Loggers get each seed's rows once the seeds end (the stacked run has no per-round
    callback), each seed folder its own TensorBoard folder and MLflow run.
    """
    from flnotes.repro.tables import LAST_EVALUATIONS, run_metrics, sample_std  # pandas

    if config.run_dir is None:
        config = config.replace(run_dir=str(Path("runs") / default_run_name(config, seeds=True)))
    for line in ignored_settings(config):
        print(line, file=sys.stderr)
    try:
        histories = run_seeds(config, seeds, progress=on_terminal(), track=False,
                              threads=threads, client_workers=client_workers)
    except KeyboardInterrupt as stop:
        _say("\n".join(f"seed {seed}: {interruption_report(Path(config.run_dir) / f'seed{seed}')}"
                        for seed in seeds))
        return exit_code(stop)
    # Everything is written (curves, loggers) before anything is printed: a reader that
    # leaves early (`run --seeds ... | head -1`) must not cost the curves or the logs.
    lines, finals = [], []
    for seed, history in zip(seeds, histories, strict=True):
        metrics = run_metrics(history.metric("accuracy"))
        finals.append(metrics["last_mean"])
        last = min(metrics["evaluations"], LAST_EVALUATIONS)
        lines.append(f"seed {seed}: {history.status}, final accuracy {metrics['final']:.4f}, "
                     f"mean +- std of the last {last} evaluations "
                     f"{metrics['last_mean']:.4f} +- {_number(metrics['last_std'])}")
    lines.append(f"mean +- std over {len(seeds)} seeds: {sum(finals) / len(finals):.4f} +- "
                 f"{_number(sample_std(finals))} (sample std, ddof=1, of each seed's "
                 "last-evaluations mean)")
    png = _save_curve({f"seed {s}": h for s, h in zip(seeds, histories, strict=True)},
                      f"{_curve_title(config)}, {len(seeds)} seeds",
                      Path(config.run_dir) / "learning_curves.png")
    lines.append(f"run folders: {config.run_dir}/seed<N>; curves: {png}")
    for seed, history in zip(seeds, histories, strict=True):
        tracker = _tracker(config.replace(seed=seed, run_dir=str(history.run_dir)), loggers,
                           logger_dir)
        if tracker:
            tracker.backfill(history.rows)
            tracker.close(history.status)
            lines.append(f"seed {seed}: {'; '.join(tracker.where())}")
    code = 0 if all(h.status == "completed" for h in histories) else 1
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left: the seeds' status stands
        send_nowhere()
    return code


def _save_curve(histories: dict, title: str, png: Path) -> str:
    """Draw the curves into png; a disk that refuses it is a warning (the run itself is saved)."""
    # matplotlib here, not at the top: a sweep's workers import this module and draw nothing
    import matplotlib.pyplot as plt

    from flnotes.plots import plot_learning_curves  # matplotlib too (see above)

    fig = plot_learning_curves(histories, title=title)
    try:
        fig.savefig(png, dpi=120)
    except OSError as err:
        print(f"warning: cannot write {png}: {err.strerror or err}; the run folder holds the "
              "metrics", file=sys.stderr)
        return "not written"
    finally:
        plt.close(fig)  # a long-lived process (a notebook, tests) would keep every figure
    return str(png)


def _number(value: float) -> str:
    # A std of one value is undefined (NaN): say so instead of printing "nan".
    return "n/a (one value)" if math.isnan(value) else f"{value:.4f}"


def settings_digest(config: RunConfig) -> str:
    """6 hex digits of the settings that make a run folder's results what they are.

    :func:`flnotes.engine.sim.settings_hash` without the seed (which is in the folder name):
    a rerun with more rounds, or on a GPU, finds the same folder, while another mu or lr
    gets a folder of its own. The checkpoint inside carries the full hash, seed included.
    """
    return settings_hash(config, seed=False)[:6]


def default_run_name(config: RunConfig, seeds: bool = False) -> str:
    """A readable folder name for a config: <algorithm>-<dataset>-<partition>-seed<N>-<digest>.

    With ``seeds`` the folder of a --seeds run (seed<N> subfolders inside), with the same
    digest as the single-seed folders of the same settings.
    """
    head = f"{config.algorithm}-{config.dataset}-{config.partition}"
    seed = "seeds" if seeds else f"seed{config.seed}"
    return f"{head}-{seed}-{settings_digest(config)}"


def _curve_title(config) -> str:
    """A learning curve's title: "fedmut on cifar10 (cnn), dirichlet 0.5, 10 of 100 clients"."""
    config = config.resolved()
    split = config.partition + (f" {config.dirichlet_alpha}" if config.partition == "dirichlet"
                                else "")
    return (f"{config.algorithm} on {config.dataset} ({config.model}), {split}, "
            f"{config.clients_per_round} of {config.num_clients} clients")


def _row_line(row: dict, dataset: str) -> str:
    """One round's printed line."""
    if dataset == "toy":
        score = f"flat_basin {row['accuracy']:.0f}" if "accuracy" in row else "flat_basin -"
    else:
        score = f"accuracy {row['accuracy']:.4f}" if "accuracy" in row else "accuracy    -  "
    return (f"round {row['round']:4d}  train_loss {row['train_loss']:.4f}  {score}"
            f"  ({row['seconds']:.2f} s)")


def _say(text: str) -> None:
    """A line for stderr that a closed stderr (`... 2>&1 | head`) does not turn into an
    error: it comes after the run stopped, whose exit status must stand."""
    try:
        print(text, file=sys.stderr)
    except BrokenPipeError:
        send_nowhere(sys.stderr)


def _write_line(line: str, above_bar: bool = True) -> None:
    """Print (above the progress bar, if one is drawn), and flush: a redirected log shows
    each round at once."""
    try:
        (tqdm.write if above_bar else print)(line)
        sys.stdout.flush()
    except BrokenPipeError:  # `run ... | head`: stop as on Ctrl-C, the folder resumable
        raise reader_left() from None
