"""A reproduction notebook's parameters started from a preset (``-p preset NAME`` in notebooks
10-12): which values the preset gives, which the user set, and what it prints about them."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from flnotes.config.presets import PRESETS, preset_names, preset_values
from flnotes.config.runconfig import RunConfig
from flnotes.messages import did_you_mean


class PresetError(ValueError):
    """A preset a notebook cannot use; IPython shows it as one line, not a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"PresetError: {self}"]


def notebook_parameters(name: str | None, current: dict[str, Any], cell: dict[str, Any],
                        keep: tuple[str, ...] = (), dataset: str | None = None,
                        ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A reproduction notebook's parameters started from preset ``name`` (``-p preset NAME``).

    ``current``: each parameter's value now, ``cell``: as the parameters cell sets it.
    Papermill cannot say which parameters were passed, so one whose value differs from the
    cell's counts as set and wins over the preset. Any other parameter that is a RunConfig
    field takes the preset's value, or RunConfig's own default where the preset sets none
    (as ``flnotes run --preset`` does; the cell's values are CPU smoke values), except a cell
    value of None (the notebook's own choice) and the names in ``keep`` (what the notebook
    fixes itself). ``dataset``: the one dataset the notebook trains (another preset's is
    refused). A list parameter takes a preset's comma list as a list.

    Returns (the parameters' new values, the preset's fields no parameter takes, for
    ``extra``, the lines saying where each value came from).
    """
    given = [n for n, value in cell.items() if current[n] != value and n != "preset"]
    lines = []
    updates: dict[str, Any] = {}
    leftover: dict[str, Any] = {}
    if name is not None:
        if name not in PRESETS:
            raise PresetError(f"unknown preset {name!r}{did_you_mean(name, preset_names())}; "
                              "list them with `python -m flnotes presets`")
        values = preset_values(name)
        values.pop("algorithm", None)  # the methods a notebook runs are its `algorithms`
        if dataset is not None and values.get("dataset", dataset) != dataset:
            raise PresetError(f"preset {name!r} is for {values['dataset']}; this notebook "
                              f"trains {dataset}")
        for fixed in keep:
            values.pop(fixed, None)
        defaults = {f.name: f.default if f.default_factory is MISSING else f.default_factory()
                    for f in fields(RunConfig)}
        taken, reset = [], []
        for param, value in cell.items():
            if param in given:
                values.pop(param, None)
            elif param in values:
                new = values.pop(param)
                if isinstance(value, list) and isinstance(new, str):
                    new = new.split(",")
                updates[param] = new
                taken.append(param)
            elif (param in defaults and param not in keep and value is not None
                  and value != defaults[param]):
                updates[param] = defaults[param]
                reset.append(param)
        leftover = values
        lines.append(f"from preset {name}: "
                     + ", ".join(f"{n}={updates[n]!r}" for n in taken))
        if reset:
            lines.append("RunConfig's defaults (the preset sets none; the cell's are CPU smoke "
                         "values): " + ", ".join(f"{n}={updates[n]!r}" for n in reset))
        if leftover:
            lines.append("from the preset into extra: "
                         + ", ".join(f"{n}={v!r}" for n, v in leftover.items()))
    if given:
        lines.append("set as parameters" + (", over the preset" if name is not None else "")
                     + ": " + ", ".join(f"{n}={current[n]!r}" for n in given))
    return updates, leftover, lines
