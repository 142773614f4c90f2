"""Experiment trackers beside the run folder: TensorBoard event files and a local MLflow store.

``metrics.jsonl`` stays the source of truth; a tracker is a copy for browsing and comparing
runs, fed from :func:`flnotes.engine.sim.run`'s per-round callback. Each round's row becomes
scalars at step = round (every number in it: accuracy, loss, train_loss, seconds, a method's
own such as server_step), and the run's settings become TensorBoard hparams and MLflow params.
Both stores are files, no server:

- ``tensorboard``: ``<run folder>/tensorboard/`` (with a logger folder D:
  ``D/tensorboard/<run folder's name>/``); ``tensorboard --logdir`` either;
- ``mlflow``: ``<run folder>/mlruns/`` (with D: ``D/mlruns/``, one store for many runs),
  experiment ``flnotes``, one MLflow run per run folder (tag ``flnotes.run_dir``); browse with
  ``mlflow ui --backend-store-uri file://<that folder>``.

A resumed run continues its tracker run: TensorBoard drops the events of the rounds after the
checkpoint (``purge_step``), MLflow appends them again (its metric history then holds those
rounds twice; metrics.jsonl holds them once). A tracker that fails mid-run (a full disk)
prints one warning and stops; the run goes on. The packages are optional
(``pip install 'flnotes[tensorboard]'``, ``'flnotes[mlflow]'``) and imported only here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from flnotes.engine.history import read_metrics, read_run_json
from flnotes.messages import did_you_mean, one_line

LOGGERS = ("tensorboard", "mlflow")  # each the package it needs, and the extra installing it
EXPERIMENT = "flnotes"
RUN_DIR_TAG = "flnotes.run_dir"


class TrackingError(ValueError):
    """A logger that cannot be used (unknown name, package missing): one line."""


def parse_loggers(values: Iterable[str] | None) -> list[str]:
    """The logger names of ``--logger`` (repeated, or comma lists), in order, once each."""
    names: list[str] = []
    for value in values or []:
        for part in str(value).split(","):
            name = part.strip().lower()
            if not name:
                continue
            if name not in LOGGERS:
                raise TrackingError(f"unknown logger {part.strip()!r}"
                                    f"{did_you_mean(name, list(LOGGERS))}; choices: "
                                    f"{', '.join(LOGGERS)}")
            if name not in names:
                names.append(name)
    if values and not names:
        raise TrackingError(f"--logger names no logger; choices: {', '.join(LOGGERS)}")
    return names


def check_installed(names: Iterable[str]) -> None:
    """TrackingError naming the pip command for every logger whose package is missing."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise TrackingError(f"--logger {','.join(missing)} needs the {' and '.join(missing)} "
                            f"package{'s' if len(missing) > 1 else ''}: "
                            f"pip install 'flnotes[{','.join(missing)}]'")


def scalars(row: dict) -> dict[str, float]:
    """The numbers of a metrics row but its round (bools as 0/1; text and lists left out)."""
    return {k: float(v) for k, v in row.items() if k != "round" and isinstance(v, (int, float))}


def _flat_settings(settings: dict) -> dict[str, object]:
    """Settings as numbers, bools and text (a dict or list as its JSON); None left out."""
    return {k: v if isinstance(v, (bool, int, float, str))
            else json.dumps(v, sort_keys=True, default=str)
            for k, v in settings.items() if v is not None}


class TensorBoardLogger:
    """Event files in one folder: a scalar per metric per round, the settings as hparams."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, settings: dict) -> None:
        self.log_dir = Path(log_dir)
        self.settings = settings
        self._writer = None

    def has_data(self) -> bool:
        """True when the folder already holds event files (a backfill would repeat them)."""
        return self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))

    def _open(self, first_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional logger: lazy
        from torch.utils.tensorboard.summary import hparams  # optional logger: lazy

        # A resumed run recomputes the rounds after its checkpoint: the events of those
        # rounds from the earlier start are hidden from TensorBoard.
        purge = first_round if first_round > 1 else None
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)
        if purge is None:
            flat = _flat_settings(self.settings)
            for summary in hparams(flat, {"accuracy": 0.0, "loss": 0.0, "train_loss": 0.0}):
                self._writer.file_writer.add_summary(summary)
            text = json.dumps(self.settings, indent=2, sort_keys=True, default=str)
            self._writer.add_text("config", "```\n" + text + "\n```")

    def log_round(self, row: dict) -> None:
        step = int(row["round"])
        if self._writer is None:
            self._open(step)
        for key, value in scalars(row).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # a TensorBoard watching the folder sees each round

    def close(self, status: str) -> None:
        if self._writer is not None:
            self._writer.add_text("status", status)
            self._writer.close()
            self._writer = None


class MLflowLogger:
    """One MLflow run in a local file store (``mlruns/``), continued when the folder resumes."""

    name = "mlflow"

    def __init__(self, store: Path, settings: dict, run_dir: str, run_name: str,
                 known: set[str] | None = None) -> None:
        self.store = Path(store)
        self.settings = settings
        self.run_dir = str(Path(run_dir).resolve())
        self.run_name = run_name
        self.known = known  # the run folders the store holds, when read beforehand
        self._client = None
        self._run_id: str | None = None

    @property
    def uri(self) -> str:
        return self.store.resolve().as_uri()

    def _connect(self):
        if self._client is None:
            # MLflow 3 refuses a file store unless told to allow it: a folder is what this
            # logger is for (no server, no database); a user's own setting is kept.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            from mlflow.tracking import MlflowClient  # optional logger: lazy

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _experiment_id(self, create: bool) -> str | None:
        client = self._connect()
        experiment = client.get_experiment_by_name(EXPERIMENT)
        if experiment is not None:
            return experiment.experiment_id
        if not create:
            return None
        try:
            return client.create_experiment(EXPERIMENT)
        except Exception:  # another process made it between our look and our create
            experiment = client.get_experiment_by_name(EXPERIMENT)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _runs(self, **order):
        """Every run of the store's experiment, page by page (none without a store)."""
        experiment_id = self._experiment_id(create=False) if self.store.is_dir() else None
        token = None
        while experiment_id is not None:
            page = self._connect().search_runs([experiment_id], max_results=1000,
                                               page_token=token, **order)
            yield from page
            token = page.token
            if not token:
                return

    def _existing_run(self):
        """The store's run of this run folder (the newest, if several), or None."""
        if self.known is not None and self.run_dir not in self.known:
            return None
        # compared here, not in a filter string: a path may hold quotes
        return next((run for run in self._runs(order_by=["attributes.start_time DESC"])
                     if run.data.tags.get(RUN_DIR_TAG) == self.run_dir), None)

    def has_data(self) -> bool:
        if self.known is not None:
            return self.run_dir in self.known
        return self._existing_run() is not None

    def run_dirs(self) -> set[str]:
        """Every run folder the store holds a run of (one pass over the store)."""
        return {run.data.tags.get(RUN_DIR_TAG) for run in self._runs()} - {None}

    def _open(self) -> None:
        from mlflow.entities import Param  # optional logger: lazy

        client = self._connect()
        found = self._existing_run()
        if found is not None:  # a resumed run folder: its MLflow run goes on
            self._run_id = found.info.run_id
            client.update_run(self._run_id, status="RUNNING")
            known = found.data.params
        else:
            run = client.create_run(self._experiment_id(create=True), run_name=self.run_name,
                                    tags={RUN_DIR_TAG: self.run_dir})
            self._run_id = run.info.run_id
            known = {}
        # MLflow params cannot change: a resumed run keeps its first values (a raised
        # --rounds is in metrics.jsonl's rows and config.json).
        params = [Param(k, str(v)) for k, v in _flat_settings(self.settings).items()
                  if k not in known]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params
            client.log_batch(self._run_id, params=params[start:start + 100])

    def log_round(self, row: dict) -> None:
        from mlflow.entities import Metric  # optional logger: lazy

        if self._run_id is None:
            self._open()
        now = int(time.time() * 1000)
        step = int(row["round"])
        metrics = [Metric(k, v, now, step) for k, v in scalars(row).items()]
        if metrics:
            self._connect().log_batch(self._run_id, metrics=metrics)

    def close(self, status: str) -> None:
        if self._run_id is None:
            return
        client = self._connect()
        client.set_tag(self._run_id, "flnotes.status", status)
        end = {"completed": "FINISHED", "diverged": "FINISHED", "interrupted": "KILLED"}
        client.set_terminated(self._run_id, status=end.get(status, "FAILED"))
        self._run_id = None


class Tracker:
    """The loggers of one run folder, fed round by round; a failing logger is dropped with
    one warning line on stderr (the run and its metrics.jsonl go on)."""

    def __init__(self, names: Iterable[str], run_dir: str | Path, settings: dict,
                 logger_dir: str | Path | None = None, label: str | None = None,
                 mlflow_known: set[str] | None = None) -> None:
        names = list(names)
        check_installed(names)
        run_dir = Path(run_dir)
        base = Path(logger_dir) if logger_dir else run_dir
        # the run's name in a shared store (logger_dir): its folder's name unless told
        label = (label or run_dir.name) if logger_dir else ""
        self.loggers: list = [
            TensorBoardLogger(base / "tensorboard" / label, settings) if name == "tensorboard"
            else MLflowLogger(base / "mlruns", settings, str(run_dir), label or run_dir.name,
                              known=mlflow_known)
            for name in names]

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def _each(self, action: str, *args) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, action)(*args)
            except Exception as err:  # a tracker is a copy: it must not stop the run
                self.loggers.remove(logger)
                reason = one_line(err)[:200]
                print(f"warning: the {logger.name} logger stopped ({type(err).__name__}: "
                      f"{reason}); metrics.jsonl keeps every round", file=sys.stderr)

    def log_round(self, row: dict) -> None:
        """One round's row, as it ends."""
        self._each("log_round", row)

    def backfill(self, rows: list[dict]) -> list[str]:
        """Log the rows of a finished run to each logger that holds nothing of it yet (a run
        reloaded, or a --seeds run's folders); returns those loggers' names."""
        fresh = [logger for logger in self.loggers if not _holds_data(logger)]
        kept = [logger for logger in self.loggers if logger not in fresh]
        self.loggers = fresh
        for row in rows:
            self.log_round(row)
        done = [logger.name for logger in self.loggers]
        self.loggers = kept + self.loggers  # a dropped one stays dropped
        return done

    def close(self, status: str) -> None:
        """End each logger's run with the run's status (completed, interrupted, ...)."""
        self._each("close", status)

    def where(self) -> list[str]:
        """Where each logger writes, for the run's last line."""
        return [f"tensorboard: {logger.log_dir}" if isinstance(logger, TensorBoardLogger)
                else f"mlflow: {logger.uri}" for logger in self.loggers]


def _run_label(run_dir: Path, base: Path) -> str:
    """A run's name in a sweep's shared store: its path below the sweep's folder
    (``cells/<id>/runs/fedmut/seed0``: unique), else its folder's name."""
    try:
        label = run_dir.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return run_dir.name
    return label if label != "." else run_dir.name


# What ``sweep --logger`` sets for the kernels of its cells: every run made there logs, into
# one store (the logger folder), each run named by its path below the sweep's folder.
ENV_LOGGERS = "FLNOTES_LOGGERS"
ENV_LOGGER_DIR = "FLNOTES_LOGGER_DIR"
ENV_LOGGER_BASE = "FLNOTES_LOGGER_BASE"


def environment_loggers() -> list[str]:
    """The logger names ``FLNOTES_LOGGERS`` asks for ([] when unset); a bad one is one line."""
    value = os.environ.get(ENV_LOGGERS)
    return parse_loggers([value]) if value else []


def logger_dir_problem(logger_dir: str | Path | None) -> str | None:
    """Why ``logger_dir`` cannot hold the loggers' files, in one line (None: it can, or it
    is not given): an empty name, a NUL byte, or a file where it or a folder above it
    should be."""
    if logger_dir is None:
        return None
    text = str(logger_dir)
    if not text.strip() or "\0" in text:
        return (f"--logger-dir {text!r:.80} is not a folder's name; name one, or leave the "
                "flag out to log beside the runs")
    path = Path(text).expanduser().absolute()
    folder = next((f for f in (path, *path.parents) if f.exists()), None)
    if folder is not None and not folder.is_dir():
        return f"--logger-dir {text}: {folder} is a file, not a folder"
    return None


def logger_environment(loggers: Iterable[str], logger_dir: str, base: str) -> dict[str, str]:
    """The variables that make every run of a process (a sweep's kernel) log: ``loggers``
    into ``logger_dir``, each run named by its path below ``base``."""
    return {ENV_LOGGERS: ",".join(loggers), ENV_LOGGER_DIR: str(logger_dir),
            ENV_LOGGER_BASE: str(base)}


def _mlflow_store(logger_dir: str | Path) -> MLflowLogger:
    """A logger of no run, for what concerns the whole MLflow store under ``logger_dir``."""
    return MLflowLogger(Path(logger_dir) / "mlruns", {}, str(logger_dir), "")


def mlflow_run_dirs(logger_dir: str | Path) -> set[str]:
    """The run folders that the MLflow store under ``logger_dir`` holds runs of."""
    return _mlflow_store(logger_dir).run_dirs()


def prepare_store(loggers: Iterable[str], logger_dir: str | Path) -> None:
    """Make, once and before a sweep's workers start, what their runs would otherwise race
    to make in one shared store: MLflow's experiment (two processes creating it at once in
    a fresh file store could leave two experiments of one name, or one logger dropped)."""
    if "mlflow" in loggers:
        _mlflow_store(logger_dir)._experiment_id(create=True)


def log_finished_folder(names: Iterable[str], run_dir: str | Path, logger_dir: str | Path,
                        base: str | Path, mlflow_known: set[str] | None = None) -> list[str]:
    """A finished run folder's rounds (metrics.jsonl) into the loggers' shared store, each
    logger that holds nothing of it yet (``sweep --logger`` over cells finished before);
    returns the loggers that got them. ValueError for a damaged folder (one line).
    ``mlflow_known``: the run folders the MLflow store holds (:func:`mlflow_run_dirs`, read
    once for many folders instead of a search of the store per folder)."""
    run_dir = Path(run_dir)
    meta = read_run_json(run_dir / "run.json")
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:  # nothing to copy (a run stopped before its first round)
        return []
    tracker = Tracker(names, run_dir, meta["config"], logger_dir,
                      label=_run_label(run_dir, Path(base)), mlflow_known=mlflow_known)
    done = tracker.backfill(rows)
    tracker.close(meta["status"])
    return done


def environment_tracker(config) -> Tracker | None:
    """The Tracker that ``FLNOTES_LOGGERS`` (a comma list), ``FLNOTES_LOGGER_DIR`` and
    ``FLNOTES_LOGGER_BASE`` ask for, for ``config``'s run folder (None when unset or the run
    has no folder): how runs inside a sweep's notebooks log without a flag of their own."""
    names = environment_loggers()
    if not names or config.run_dir is None:
        return None
    logger_dir = os.environ.get(ENV_LOGGER_DIR) or None
    base = os.environ.get(ENV_LOGGER_BASE) or logger_dir
    label = _run_label(Path(config.run_dir), Path(base)) if base else None
    return Tracker(names, config.run_dir, config.resolved().to_dict(), logger_dir, label=label)


def _holds_data(logger) -> bool:
    """Whether a logger's store holds this run already (unreadable: no, so that writing
    it says what is wrong)."""
    try:
        return logger.has_data()
    except Exception:
        return False
