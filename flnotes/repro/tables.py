"""Results -> tables beside the papers' numbers.

Table metric (the papers do not say how they computed their +-): for each run, the mean and
the sample standard deviation (ddof=1) of the global test accuracy over its last 10
evaluations; then, per table cell, the mean of those means and of those stds over seeds, and
``seed_std``, the sample std of the per-seed means (the usual "mean +- std over runs"). The
final and the best accuracy of each run are kept too, averaged the same way. Accuracies are in
percent, like the papers' tables. A std of a single value is undefined: NaN.

A run is found by its folder (``run.json`` + ``metrics.jsonl``, written by
``flnotes.engine.sim.run``); the sweep's ``cell.json`` in a parent folder gives the paper table and
the labels of the cell. Labels not given there are derived from the run's config (``cifar10`` ->
``CIFAR-10``, ``dirichlet`` with alpha 0.5 -> ``dir=0.5``, ``fedmut`` -> ``FedMut``).

A cell whose runs differ from the paper's setting is marked: the setting of each table cell is
the paper-scale expansion of the table's grid in sweeps/ (its preset, then the cell's values),
and a run's config is checked against it (:mod:`flnotes.repro.paper_setting`).

What is left out, always with a one-line warning or note (never a traceback, never a NaN
averaged in):

- a metrics row that cannot be read (:func:`read_metric_rows`): one warning per file naming
  it and the line numbers; the rest of the run counts;
- the same run twice: two folders with the same settings hash (run.json ``settings_hash``,
  or, where none is stored, the same config but for ``run_dir``), seed included, are one run,
  its completed folder kept before one that stopped early or failed (:func:`one_per_run`,
  which ``figures`` and ``results-page`` use too); a warning names every folder;
- a run that lands in no cell of a printed table (a dataset, model, heterogeneity or method
  the table does not have, or a run made by another table's sweep): ``tables`` says why in
  one line per run, or per group of runs with the same reason (:func:`unplaced`);
- failed runs (run.json ``"status": "failed"``): never averaged in; ``tables`` lists them
  apart and says how many were left out. A ``running`` run counts as not completed (the
  cell is marked partial), as an interrupted or diverged one does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flnotes.engine.history import read_run_json
from flnotes.messages import one_line
from flnotes.repro.paper_setting import paper_settings, setting_differences
from flnotes.repro.paper_tables import KEY, load_paper_table, paper_table_names, run_labels
from flnotes.repro.reading import claim_line, diverged_note, read

LAST_EVALUATIONS = 10
SETTING = ("dataset", "model", "heterogeneity")  # a table's row: KEY without the method
FAILED = "failed"  # run.json status of a run that raised (left out of every table)
METRIC_KEYS = ("accuracy", "personal_accuracy")  # per-row values that must be finite numbers


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1), as papers report mean +- std; NaN for < 2 values."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1)) if values.size >= 2 else float("nan")


def run_metrics(accuracies: Sequence[float], last: int = LAST_EVALUATIONS) -> dict[str, float]:
    """Mean and sample std over the last evaluations, plus final and best accuracy."""
    values = np.asarray(accuracies, dtype=float)
    if values.size == 0:
        nan = float("nan")
        return {"last_mean": nan, "last_std": nan, "final": nan, "best": nan, "evaluations": 0}
    tail = values[-last:]
    return {"last_mean": float(tail.mean()), "last_std": sample_std(tail),
            "final": float(values[-1]), "best": float(values.max()),
            "evaluations": int(values.size)}


def _cell_info(run_dir: Path, root: Path) -> dict:
    """The sweep's cell.json of the nearest parent folder up to root, if any."""
    for folder in [run_dir, *run_dir.parents]:
        cell = folder / "cell.json"
        if cell.exists():
            try:
                info = json.loads(cell.read_text())
            except (OSError, ValueError) as err:
                raise ValueError(f"{cell} is damaged ({one_line(err)})") from None
            if not isinstance(info, dict):
                raise ValueError(f"{cell} is damaged (not a JSON object)")
            labels = info.get("labels", {})
            if not isinstance(labels, dict) or not all(
                    v is None or isinstance(v, (str, int, float)) and not isinstance(v, bool)
                    for v in labels.values()):
                raise ValueError(f"{cell} is damaged (its labels must map names to a text or "
                                 f"a number each, not {json.dumps(labels)[:80]})")
            table = info.get("paper_table")
            if table is not None and table not in paper_table_names():
                print(f"warning: {cell} names paper table {table!r}, which flnotes does not "
                      "have: its runs are read as runs of no table", file=sys.stderr)
                info = {**info, "paper_table": None}
            return info
        if folder == root:
            break
    return {}


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and bool(np.isfinite(value))


def read_metric_rows(path: Path, running: bool = False) -> list[dict]:
    """metrics.jsonl's readable rows; one warning naming the file and the line numbers of the
    rows left out (not JSON, not a round's row, an accuracy that is null, text or not finite).

    With ``running``, a half-written last line (a run writing it now) is left out quietly.
    ValueError only when the file itself cannot be read.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}"
                         ) from None
    rows, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if not (running and number == len(lines)):
                bad.append(f"line {number} (not JSON)")
            continue
        if not isinstance(row, dict) or "round" not in row:
            bad.append(f"line {number} (not a round's metrics)")
            continue
        wrong = [key for key in METRIC_KEYS if key in row and not _is_finite_number(row[key])]
        if wrong:
            bad.append(f"line {number} (" + ", ".join(
                f"{key} {json.dumps(row[key], default=str)}" for key in wrong) + ")")
            continue
        rows.append(row)
    if bad:
        print(f"warning: {path}: skipped {len(bad)} unreadable metrics "
              f"row{'s' if len(bad) != 1 else ''}: {', '.join(bad)}", file=sys.stderr)
    return rows


def _settings_key(meta: dict, config: dict) -> str:
    """What makes two folders one run: the stored settings hash, or else the config (seed
    included) without its run_dir."""
    stored = meta.get("settings_hash")
    if isinstance(stored, str) and stored:
        return "hash:" + stored
    return "config:" + json.dumps({k: v for k, v in config.items() if k != "run_dir"},
                                  sort_keys=True, default=str)


def _written(*files: Path) -> float:
    """When the folder was last written: the latest mtime of its files (0 if unknown)."""
    times = []
    for file in files:
        try:
            times.append(file.stat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


# Which folder of a run counts, best first: a completed run; one that stopped early (still
# running, interrupted, diverged), used only where no completed folder exists and marked
# partial; a failed one, which no table averages in. A rerun that fails or is stopped must not
# hide the run that completed before it.
_PREFERENCE = {"completed": 2, FAILED: 0}  # any other status: 1


def one_per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs without repeats: folders with the same settings and seed are one run, not two
    seeds. Of them a completed folder is kept, else one that stopped early, else a failed one;
    among equals the newest. A warning names every folder of the run.

    The one choice of ``tables``, ``figures`` and ``results-page`` (through :func:`load_runs`).
    """
    if not len(runs) or "settings_key" not in runs:
        return runs
    keep = []
    for _, group in runs.groupby("settings_key", sort=False):
        group = group.assign(_preference=[_PREFERENCE.get(s, 1) for s in group["status"]])
        group = group.sort_values(["_preference", "written", "run_dir"], kind="stable")
        kept = group.iloc[-1]
        keep.append(kept.name)
        if len(group) > 1:
            others = list(group["run_dir"].iloc[:-1])
            newest = group.sort_values(["written", "run_dir"], kind="stable").iloc[-1]
            why = (f"the newer {kept['run_dir']}" if newest.name == kept.name else
                   f"the {kept['status']} {kept['run_dir']} over the newer {newest['status']} "
                   f"{newest['run_dir']}")
            print(f"warning: run folders {', '.join(others)} and {kept['run_dir']} hold the "
                  f"same run (same settings, seed {kept['seed']}): counted once, keeping "
                  f"{why}", file=sys.stderr)
    return runs.loc[sorted(keep)]


def _status(meta_file: Path) -> str | None:
    """A run.json's status, or None where it cannot be read."""
    try:
        return read_run_json(meta_file).get("status")
    except (ValueError, TypeError, AttributeError, OSError):
        return None


def collect_runs(root: str | Path) -> pd.DataFrame:
    """One row per run folder under root: table key, seed, status, run metrics and config."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"results folder {root} not found; give a folder holding run "
                                "folders, e.g. runs or a sweep's output runs/sweeps/<name>")
    rows = []
    for meta_file in sorted(root.rglob("run.json")):
        run_dir = meta_file.parent
        metrics_file = run_dir / "metrics.jsonl"
        if not metrics_file.exists():  # a run not yet at its first round, unless it says more
            if metrics_file.is_symlink() or _status(meta_file) not in ("running", None):
                print(f"warning: skipping run folder {run_dir}: its metrics.jsonl is missing"
                      + (" (a link to nothing)" if metrics_file.is_symlink() else ""),
                      file=sys.stderr)
            continue
        try:
            meta = read_run_json(meta_file)
            config = meta["config"]
            records = read_metric_rows(metrics_file, running=meta["status"] == "running")
            cell = _cell_info(run_dir, root)
            labels = run_labels(config, cell.get("labels", {}),
                                cell.get("parameters", {}).get("algorithms"))
        except (ValueError, TypeError, AttributeError, KeyError) as err:
            # One damaged folder must not hide every other result.
            print(f"warning: skipping run folder {run_dir}: {one_line(err)}",
                  file=sys.stderr)
            continue
        if not records and meta.get("status") == "completed":
            # A completed run always wrote its rounds: an empty file was emptied or lost.
            print(f"warning: skipping run folder {run_dir}: it says completed but its "
                  "metrics.jsonl holds no round (emptied or damaged); run it again",
                  file=sys.stderr)
            continue
        acc = run_metrics([100 * r["accuracy"] for r in records if "accuracy" in r])
        personal = run_metrics([100 * r["personal_accuracy"] for r in records
                                if "personal_accuracy" in r])
        seconds = [r["seconds"] for r in records if _is_finite_number(r.get("seconds"))]
        environment = meta.get("environment", {})
        rows.append({"paper_table": cell.get("paper_table"), **labels,
                     "algorithm": config.get("algorithm"), "seed": config.get("seed"),
                     "status": meta.get("status"), "rounds": len(records),
                     "planned_rounds": config.get("rounds"),
                     **{f"acc_{k}": v for k, v in acc.items()},
                     "personal_last_mean": personal["last_mean"],
                     "seconds_per_round": float(np.mean(seconds)) if seconds else float("nan"),
                     "run_dir": str(run_dir),
                     # the paper setting a stand-in's cells are read beside (results page)
                     "paper_labels": {k: str(v) for k, v in cell.get("labels", {}).items()
                                      if k.startswith("paper_")},
                     "settings_key": _settings_key(meta, config), "rows": records,
                     "written": _written(meta_file, metrics_file),
                     "error": one_line(meta.get("error")),
                     # (the results page's settings and cost: the sweep and the machine)
                     "grid_file": cell.get("grid_file"), "variant": cell.get("variant"),
                     "environment": environment,
                     # (where the data came from: a lossy copy is marked, paper_setting)
                     "config": {**config, "data_source": environment.get("data_source", "")}})
    columns = ["paper_table", *KEY, "algorithm", "seed", "status", "rounds", "planned_rounds",
               "acc_last_mean", "acc_last_std", "acc_final", "acc_best", "acc_evaluations",
               "personal_last_mean", "seconds_per_round", "run_dir", "paper_labels",
               "settings_key", "rows", "written", "error", "grid_file", "variant", "environment",
               "config"]
    return pd.DataFrame(rows, columns=columns)


@dataclass
class Run:
    """One run folder: its table labels, config and curve rows."""

    labels: dict
    config: dict
    seed: int
    status: str
    rows: list[dict]
    run_dir: str
    paper_table: str | None = None  # the table its grid lands on (cell.json), if any
    grid_file: str | None = None  # the grid its cell names (cell.json), if any
    variant: str | None = None  # that grid's variant ("paper", "smoke"), if any
    environment: dict = field(default_factory=dict)  # run.json's: device, threads

    def value(self, key: str):
        """A label (dataset, model, heterogeneity, method) or else a config field; None if
        the run has neither (a method that does not read that setting)."""
        return self.labels[key] if key in self.labels else self.config.get(key)

    @property
    def setting(self) -> tuple[str, str, str]:
        return tuple(str(self.labels[k]) for k in SETTING)

    def curve(self, metrics: tuple[str, ...] = ("accuracy",)) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the first metric of ``metrics`` the run records; accuracies in
        percent."""
        for metric in metrics:
            points = [(r["round"], r[metric]) for r in self.rows
                      if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
            if points:
                rounds, values = (np.asarray(v, dtype=float) for v in zip(*points, strict=True))
                return rounds, values * (100.0 if "accuracy" in metric else 1.0)
        return np.zeros(0), np.zeros(0)


def _as_runs(runs: pd.DataFrame) -> list[Run]:
    """:func:`collect_runs` rows as Runs, failed runs left out."""
    out = []
    for _, row in runs[runs["status"] != FAILED].iterrows():
        labels = {**{k: row[k] for k in KEY}, **(row["paper_labels"] or {})}
        table, grid, variant = (v if isinstance(v, str) and v else None for v in
                                (row.get("paper_table"), row.get("grid_file"), row.get("variant")))
        out.append(Run(labels, dict(row["config"]), int(row["seed"]), str(row["status"]),
                       row["rows"], row["run_dir"], table, grid, variant, row["environment"]))
    return out


def load_runs(results: str | Path) -> list[Run]:
    """Every run folder under ``results`` (failed runs left out, a run found twice counted
    once, its completed folder before a newer failed or stopped one: :func:`one_per_run`),
    with its metrics rows; what ``figures`` and ``results-page`` draw and read."""
    return _as_runs(one_per_run(collect_runs(results)))


# config fields that say where or how a run was kept, not what it computed: no two runs
# differ by them (by_setting) and a results page does not list them
NOT_SETTINGS = {"run_dir", "data_dir", "data_source", "download", "checkpoint_every",
                "record_states", "device", "backend", "compile", "eval_batch_size", "seed",
                "partition_manifest"}


def _differing(runs: list[Run], ignored: set[str]) -> list[str]:
    """The config fields, but ``ignored``, whose values are not the same in all ``runs``."""
    return sorted(k for k in {k for run in runs for k in run.config} - ignored
                  if len({json.dumps(run.config.get(k), sort_keys=True, default=str)
                          for run in runs}) > 1)


def _tag(run: Run, keys: list[str]) -> str:
    return ", ".join(f"{k} {run.config.get(k)}" for k in keys)


def _repeats_a_seed(runs: list[Run]) -> bool:
    return len({run.seed for run in runs}) < len(runs)


def _two_runs(method: str, setting: tuple, runs: list[Run], keys: list[str]):
    """Raise the error that names two runs of ``method`` of one seed and how they differ."""
    seeds = [run.seed for run in runs]
    seed = next(s for s in seeds if seeds.count(s) > 1)
    a, b = [run.run_dir for run in runs if run.seed == seed][:2]
    raise ValueError(f"two runs of {method}, seed {seed}, in {', '.join(setting)}: {a} and {b}"
                     + (f" (they differ in {', '.join(keys)})" if keys else "")
                     + "; move one away")


def by_setting(runs: list[Run]) -> dict[tuple, dict[str, list[Run]]]:
    """setting -> method -> runs (by seed), everything sorted, FedAvg first; never two runs of
    one method and seed read as one.

    Where FedAvg, which every reading compares with, has two runs of a seed (two studies in
    one folder: 200 and 400 rounds), the setting is split by the settings those runs differ
    in, every method's runs with them ('dir=0.1, rounds 400'). Where another method has (a
    setting swept within a cell, an old folder beside a rerun), it is split by name, 'FedMut
    (alpha 2.0)'. Runs that differ in nothing but their folder are an error."""
    grouped: dict[tuple, dict[str, list[Run]]] = {}
    for run in sorted(runs, key=lambda r: (r.setting, str(r.labels["method"]), r.seed)):
        grouped.setdefault(run.setting, {}).setdefault(str(run.labels["method"]), []).append(run)
    out: dict[tuple, dict[str, list[Run]]] = {}
    for setting, by_method in grouped.items():
        base = by_method.get(BASELINE, [])
        keys = _differing(base, NOT_SETTINGS) if _repeats_a_seed(base) else []
        studies = {_tag(run, keys) for run in base}
        if keys and any(_tag(r, keys) not in studies for rs in by_method.values() for r in rs):
            _two_runs(BASELINE, setting, base, keys)  # not two studies: runs FedAvg lacks
        for method, method_runs in by_method.items():
            for run in method_runs:
                where = (*setting[:2], f"{setting[2]}, {_tag(run, keys)}") if keys else setting
                out.setdefault(where, {}).setdefault(method, []).append(run)
    for setting, by_method in out.items():
        for method, method_runs in list(by_method.items()):
            if not _repeats_a_seed(method_runs):
                continue
            # any field but the folder and the seed: one_per_run kept both as two runs
            keys = _differing(method_runs, {"run_dir", "seed"})
            if method == BASELINE or not keys:
                _two_runs(method, setting, method_runs, keys)
            del by_method[method]
            for run in method_runs:
                by_method.setdefault(f"{method} ({_tag(run, keys)})", []).append(run)
    return {k: dict(sorted(v.items(), key=lambda kv: (kv[0] != BASELINE, kv[0])))
            for k, v in sorted(out.items())}


def diverged(by_method: dict[str, list[Run]], *methods: str) -> str:
    """The reading's note on runs of ``methods`` that diverged (reading.diverged_note)."""
    return diverged_note({m: {r.seed: max((row["round"] for row in r.rows), default=0)
                              for r in by_method.get(m, []) if r.status == "diverged"}
                          for m in methods})


def aggregate(runs: pd.DataFrame, by: Sequence[str] = ("paper_table", *KEY)) -> pd.DataFrame:
    """Per table cell: means over seeds of each run's last-10 mean and std, final and best.

    Failed runs are left out, and a run found in several folders counts once (:func:`one_per_run`).
    """
    by = list(by)
    runs = one_per_run(runs)
    runs = runs[runs["status"] != FAILED].copy()
    runs["paper_table"] = runs["paper_table"].fillna("")
    runs["completed"] = runs["status"] == "completed"
    grouped = runs.groupby(by, sort=False, dropna=False)
    columns = dict(accuracy_mean=("acc_last_mean", "mean"), accuracy_std=("acc_last_std", "mean"),
                   seed_std=("acc_last_mean", sample_std), final_mean=("acc_final", "mean"),
                   best_mean=("acc_best", "mean"), personal_mean=("personal_last_mean", "mean"),
                   seeds=("seed", "nunique"), completed=("completed", "sum"),
                   runs=("seed", "size"), seconds_per_round=("seconds_per_round", "mean"))
    if "config" in runs:  # kept to check each cell against the paper's setting
        columns["configs"] = ("config", list)
    return grouped.agg(**columns).reset_index()


def compare(paper: pd.DataFrame, ours: pd.DataFrame | None, table: str | None = None
            ) -> pd.DataFrame:
    """Paper rows with our aggregated numbers beside them; cells without runs are 'not run'."""
    out = paper[KEY + ["accuracy_mean", "accuracy_std"]].rename(
        columns={"accuracy_mean": "paper", "accuracy_std": "paper_std"})
    kept = KEY + ["ours", "ours_std", "seeds", "runs", "completed", "setting"]
    empty = pd.DataFrame(columns=kept)
    if ours is not None and len(ours):
        tag = ours["paper_table"].fillna("") if "paper_table" in ours else pd.Series("", ours.index)
        # Runs of this table's sweep first, then runs made outside any sweep (table None: all).
        keep = (tag == table) | (tag == "") if table is not None else tag == tag
        mine = ours[keep].assign(_own=tag[keep] != (table or ""))
        mine = mine.sort_values("_own", kind="stable").groupby(KEY, sort=False).first()
        mine = mine.reset_index().rename(columns={"accuracy_mean": "ours",
                                                  "accuracy_std": "ours_std"})

        settings = paper_settings(table) if table is not None else {}
        mine["setting"] = [
            setting_differences(configs, settings.get(tuple(row[k] for k in KEY)))
            if isinstance(configs, list) else []
            for configs, (_, row) in zip(mine.get("configs", [None] * len(mine)),
                                         mine.iterrows(), strict=True)]
        empty = mine[kept]
    merged = out.merge(empty, on=KEY, how="left")
    merged["setting"] = [v if isinstance(v, list) else [] for v in merged["setting"]]
    merged["difference"] = merged["ours"] - merged["paper"]
    merged["status"] = np.where(merged["ours"].isna(), "not run",
                                np.where(merged["completed"] < merged["runs"], "partial",
                                         "done"))
    return merged


def _listed(values) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def _named(what: str, label, raw) -> str:
    """'dataset Fashion-MNIST (fashion-mnist)': the table's label, and the config's name where
    it differs."""
    return f"{what} {label}" + (f" ({raw})" if raw not in (None, "", label) else "")


def _miss(run: pd.Series, paper: pd.DataFrame, table: str) -> str | None:
    """Why a run's table key is no cell of ``table``: the first of dataset, model,
    heterogeneity and method that the table has no row or column for; None if it is one."""
    config = run["config"] if isinstance(run.get("config"), dict) else {}
    dataset, model, split = run["dataset"], run["model"], run["heterogeneity"]
    if dataset not in set(paper["dataset"]):
        return (f"{_named('dataset', dataset, config.get('dataset'))} is in no row of {table} "
                f"(its datasets: {_listed(paper['dataset'])})")
    rows = paper[paper["dataset"] == dataset]
    if model not in set(rows["model"]):
        return (f"{_named('model', model, config.get('model'))} is in no {dataset} row of "
                f"{table} (its models there: {_listed(rows['model'])})")
    rows = rows[rows["model"] == model]
    if split not in set(rows["heterogeneity"]):
        return (f"heterogeneity {split} is in no {dataset} / {model} row of {table} (there: "
                f"{_listed(rows['heterogeneity'])})")
    rows = rows[rows["heterogeneity"] == split]
    if run["method"] not in set(paper["method"]):
        return (f"method {run['method']} is in no column of {table} (its methods: "
                f"{_listed(paper['method'])})")
    if run["method"] not in set(rows["method"]):
        return f"{table} has no {run['method']} cell for {dataset} / {model} / {split}"
    return None


def _grouped(reasons: dict[str, list[str]]) -> list[str]:
    """One line per reason: the run folder, or how many and the first two."""
    lines = []
    for reason, folders in reasons.items():
        if len(folders) == 1:
            lines.append(f"not placed: run {folders[0]}: {reason}")
            continue
        shown = ", ".join(folders[:2]) + (f" and {len(folders) - 2} more"
                                          if len(folders) > 2 else "")
        lines.append(f"not placed: {len(folders)} runs ({shown}): {reason}")
    return lines


def unplaced(paper: pd.DataFrame, runs: pd.DataFrame, table: str,
             untagged: bool = True) -> list[str]:
    """Why runs land in no cell of ``table``: one line per run, or per group of runs with the
    same reason, so a table of 'not run' cells never leaves the reader guessing.

    ``runs`` are :func:`collect_runs` rows, one per run (:func:`one_per_run`); failed runs
    are listed apart and skipped here. As in :func:`compare`, a table takes its own sweep's
    runs and runs made outside any sweep (no cell.json); runs of other tables' sweeps are
    named once per table. With ``untagged=False`` only the table's own sweep's runs are
    checked (printing every table, an untagged run is not reported under each).
    """
    if runs is None or not len(runs):
        return []
    runs = runs[runs["status"] != FAILED]
    tag = runs["paper_table"].fillna("")
    reasons: dict[str, list[str]] = {}
    own_keys = {tuple(run[k] for k in KEY) for _, run in runs[tag == table].iterrows()}
    for (_, run), run_tag in zip(runs.iterrows(), tag, strict=True):
        if run_tag not in (table, "") or (run_tag == "" and not untagged):
            continue
        reason = _miss(run, paper, table)
        if reason is None and run_tag == "" and tuple(run[k] for k in KEY) in own_keys:
            reason = (f"its cell ({' / '.join(str(run[k]) for k in KEY)}) holds runs of "
                      f"{table}'s own sweep, which come first")
        if reason is not None:
            reasons.setdefault(reason, []).append(str(run["run_dir"]))
    lines = _grouped(reasons)
    if untagged:
        for other, count in tag[~tag.isin([table, ""])].value_counts(sort=False).items():
            lines.append(f"not placed: {count} run{'s' if count != 1 else ''} made for "
                         f"{other} (its sweep's cell.json): a table takes its own sweep's "
                         "runs and runs made outside any sweep")
    return lines


def placed_nowhere(papers: dict[str, pd.DataFrame], runs: pd.DataFrame) -> list[str]:
    """Runs made outside any sweep that land in no cell of any of ``papers``: one line per
    table key, naming the runs."""
    if runs is None or not len(runs):
        return []
    loose = runs[(runs["status"] != FAILED) & (runs["paper_table"].fillna("") == "")]
    reasons: dict[str, list[str]] = {}
    for _, run in loose.iterrows():
        if all(_miss(run, paper, name) is not None for name, paper in papers.items()):
            key = " / ".join(str(run[k]) for k in KEY)
            reasons.setdefault(f"no printed table has a cell {key}", []).append(
                str(run["run_dir"]))
    return _grouped(reasons)


BASELINE = "FedAvg"  # what every method's reading compares against


def readings(runs: pd.DataFrame) -> list[str]:
    """Each method against FedAvg in every setting (dataset, model, heterogeneity) that has
    both, by the reading rule (flnotes.repro.reading: each seed's late difference, "holds"
    only when every seed leads by more than the seeds disagree): one line per claim, as the
    results page and the notebooks read it. Failed runs are left out; a running one counts
    with the evaluations it has. ``runs``: :func:`collect_runs`, after :func:`one_per_run`."""
    lines = []
    for setting, by_method in by_setting(_as_runs(runs)).items():
        # each method's curve per seed (of two runs of one seed, the later in ``runs``)
        curves = {m: {r.seed: c for r in rs if len((c := r.curve())[0])}
                  for m, rs in by_method.items()}
        if curves.get(BASELINE):
            lines += [claim_line(setting, f"{m} > {BASELINE}", read(curves[m], curves[BASELINE]),
                                 diverged(by_method, m, BASELINE))
                      for m in by_method if m != BASELINE and curves[m]]
    return lines


PARTIAL_MARK = "~"  # not every run of the cell completed
SETTING_MARK = "*"  # some run of the cell differs from the paper's setting
MIXED_MARK = "+"  # more runs than seeds: the cell averages runs of different settings


def side_by_side(comparison: pd.DataFrame, run_only: bool = False) -> pd.DataFrame:
    """Wide view: one row per setting, per method 'paper / ours (difference)' or 'not run'.

    Our number carries PARTIAL_MARK when some run of the cell has not completed and SETTING_MARK
    when some run differs from the paper's setting (see :func:`legend`). With ``run_only``, only
    the cells with a run: the settings and methods that have one, and an empty string where such
    a row and column meet without a run (a table of a few hundred cells of which a handful ran
    is otherwise mostly "not run"); no cell run, no rows and no columns.
    """
    def cell(row) -> str:
        paper = "-" if pd.isna(row["paper"]) else f"{row['paper']:.2f}"
        if row["status"] == "not run":
            return f"{paper} / not run"
        mark = ("" if row["status"] == "done" else PARTIAL_MARK) + (
            SETTING_MARK if row.get("setting") else "") + (
            MIXED_MARK if row["runs"] > row["seeds"] else "")
        return f"{paper} / {row['ours']:.2f}{mark} ({row['difference']:+.2f})"

    shown = comparison[comparison["status"] != "not run"] if run_only else comparison
    if not len(shown):  # (apply over no rows gives a frame, not the column of cells)
        return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=KEY[:3]))
    frame = shown.assign(cell=shown.apply(cell, axis=1))
    wide = frame.pivot_table(index=KEY[:3], columns="method", values="cell", aggfunc="first",
                             sort=False)
    wide = wide[list(dict.fromkeys(shown["method"]))]
    return wide.fillna("") if run_only else wide


def legend(comparison: pd.DataFrame) -> list[str]:
    """Lines under a printed table: which number is whose, and what the marks mean."""
    lines = [f"cells: paper / ours (ours - paper), test accuracy in %; ours = mean over seeds "
             f"of each run's mean over its last {LAST_EVALUATIONS} evaluations"]
    if (comparison["status"] == "partial").any():
        lines.append(f"{PARTIAL_MARK} not every run of the cell completed (running, "
                     "interrupted or diverged)")
    if (comparison["runs"] > comparison["seeds"]).any():
        lines.append(f"{MIXED_MARK} more runs than seeds: the cell averages runs of different "
                     "settings (two studies, e.g. 200 and 400 rounds); the readings below take "
                     "them apart")
    notes = [n for cell in comparison.get("setting", []) if isinstance(cell, list) for n in cell]
    if notes:
        marked = int(sum(bool(c) for c in comparison["setting"] if isinstance(c, list)))
        cells = f"{marked} cell{'s' if marked != 1 else ''}"
        lines.append(f"{SETTING_MARK} not the paper's setting ({cells}): "
                     + "; ".join(dict.fromkeys(notes)))
    return lines


def plot_comparison(comparison: pd.DataFrame, title: str | None = None):
    """Our accuracy against the paper's, one point per run cell, with the y = x line."""
    import matplotlib.pyplot as plt  # lazy: tables need no plots

    done = comparison.dropna(subset=["ours", "paper"])
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for method, part in done.groupby("method", sort=False):
        ax.errorbar(part["paper"], part["ours"], yerr=part["ours_std"], fmt="o", ms=4,
                    label=method, capsize=2)
    values = pd.concat([done["paper"], done["ours"]]) if len(done) else pd.Series([0, 100])
    lo, hi = float(values.min()) - 2, float(values.max()) + 2
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
    ax.set_xlabel("paper accuracy (%)")
    ax.set_ylabel("our accuracy (%), last-10 mean")
    ax.set_title(title or f"{len(done)} of {len(comparison)} cells run")
    if len(done):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``tables`` subcommand."""
    parser.add_argument("results", nargs="?", help="folder of run folders (a sweep's output)")
    parser.add_argument("--table", action="append", help="paper table(s); default: all")


def cmd_tables(args: argparse.Namespace) -> int:
    """Print each paper table with our numbers beside it, and a legend under it."""
    ours = None
    if args.results:
        runs = collect_runs(args.results)
        if not len(runs):
            print(f"warning: no run folders (run.json + metrics.jsonl) under {args.results}: "
                  "every cell is 'not run'", file=sys.stderr)
        runs = one_per_run(runs)
        failed = runs[runs["status"] == FAILED]
        ours = aggregate(runs)
    names = args.table or paper_table_names()
    papers = {name: load_paper_table(name) for name in names}  # a wrong name fails first
    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.max_rows", 500):
        for name, paper in papers.items():
            result = compare(paper, ours, table=name)
            done = int((result["status"] != "not run").sum())
            print(f"== {name}: {done} of {len(result)} cells run")
            print(side_by_side(result).to_string())
            print("\n".join(legend(result)))
            if args.results:
                # Asked for by name, a table accounts for every run it could take; printing
                # them all, each its own sweep's, and the loose runs once below.
                for line in unplaced(paper, runs, name, untagged=bool(args.table)):
                    print(line)
    if args.results and not args.table:
        for line in placed_nowhere(papers, runs):
            print(line)
    if args.results:
        claims = readings(runs)
        if claims:
            print("== readings: each method against FedAvg of the same seed, mean difference "
                  "over the last quarter of the evaluations; holds only when every seed leads "
                  "by more than the seeds disagree (flnotes/repro/reading.py)")
            print("\n".join(claims))
    if args.results and len(failed):  # failed runs apart: how many were left out, and which
        count = len(failed)
        print(f"== failed: {count} run{'s' if count != 1 else ''} left out of every table")
        for _, run in failed.iterrows():
            error = f": {run['error'][:160]}" if run.get("error") else ""
            print(f"  {run['run_dir']} ({run['method']}, seed {run['seed']}){error}")
    return 0
