"""Checks of a dataset loader's keyword options (``RunConfig.data_options``).

The accepted options, their types and defaults are read from the loader's signature, so a
loader documents its options once; a wrong key, type or range is refused with a message
that lists what the dataset takes, before any data are read.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from flnotes.data.registry import DATASETS
from flnotes.data.vision import NORMALIZATIONS
from flnotes.messages import did_you_mean

# Text options with a fixed set of values (a wrong one would otherwise surface as "data not
# found" or deep inside the loader).
OPTION_CHOICES = {"source": ("auto", "leaf", "plays"), "layout": ("auto", "indented", "alone"),
                  "normalize": NORMALIZATIONS}
# Integer options whose default is positive but for which 0 is meaningful too.
ZERO_ALLOWED = {"max_shift"}
# Fractions that must lie strictly between 0 and 1.
OPEN_UNIT_INTERVAL = {"train_fraction"}


@dataclass
class LoaderOption:
    """One keyword option of a dataset loader: its name, type and default."""

    name: str
    kind: type | None  # int, float, bool, str, or None when the loader does not say
    default: object
    optional: bool  # None is a valid value

    def describe(self) -> str:
        kind = f"{self.kind.__name__}{' or None' if self.optional else ''}" if self.kind else "any"
        return f"{self.name} ({kind}, default {self.default!r})"


def loader_options(name: str) -> dict[str, LoaderOption] | None:
    """The options a registered dataset's loader takes (None: it takes any, unchecked)."""
    loader = DATASETS[name]
    bound = set(loader.keywords) if isinstance(loader, partial) else set()
    func = loader.func if isinstance(loader, partial) else loader
    params = list(inspect.signature(func).parameters.values())[3:]  # after data_dir, download, seed
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        hints = {}
    options = {}
    for p in params:
        if p.name in bound or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        default = None if p.default is p.empty else p.default
        kind, optional = _option_type(hints.get(p.name), default)
        options[p.name] = LoaderOption(p.name, kind, default, optional)
    return options


def _option_type(hint, default) -> tuple[type | None, bool]:
    """(base type, None allowed) from an annotation like ``int | None``, else from the default."""
    args = typing.get_args(hint)
    optional = type(None) in args or default is None
    bases = [a for a in args if a is not type(None)] if args else [hint]
    base = bases[0] if len(bases) == 1 and bases[0] in (int, float, bool, str) else None
    if base is None and default is not None and type(default) in (int, float, bool, str):
        base = type(default)
    return base, optional


def data_option_problems(name: str, options: dict) -> Iterator[str]:
    """One message per bad loader option of a dataset: unknown key, wrong type or range."""
    if not options or name not in DATASETS:
        return  # none to check, or a dataset with its own task module (toy) that reads them
    known = loader_options(name)
    if known is None:
        return
    for key, value in options.items():
        option = known.get(key)
        if option is None:
            accepted = ", ".join(o.describe() for o in known.values()) or "none"
            yield (f"RunConfig.data_options[{key!r}] is invalid: dataset {name!r} has no option "
                   f"{key!r}{did_you_mean(key, known)}; its options are: {accepted}")
            continue
        rule = _option_rule(option, value)
        if rule:
            yield (f"RunConfig.data_options[{key!r}]={value!r} is invalid: {rule} "
                   f"(dataset {name!r}; default {option.default!r})")


def _option_rule(option: LoaderOption, value) -> str | None:
    """What a value breaks (as 'must be ...'), or None if the option accepts it."""
    if value is None:
        return None if option.optional else f"must be a {option.kind.__name__}, not None"
    kind, name = option.kind, option.name
    none = " or None" if option.optional else ""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind is int:
        # Sizes and counts: a default above 0 (or None, "no limit") means 0 makes no sense.
        least = 0 if option.default == 0 or name in ZERO_ALLOWED else 1
        if not is_int or value < least:
            return f"must be an integer >= {least}{none}"
    elif kind is float:
        if not (is_int or isinstance(value, float)) or not math.isfinite(value):
            return f"must be a finite number{none}"
        if name in OPEN_UNIT_INTERVAL and not 0 < value < 1:
            return "must lie strictly between 0 and 1"
        if isinstance(option.default, (int, float)) and option.default >= 0 and value < 0:
            return f"must be a non-negative number{none}"
    elif kind is bool and not isinstance(value, bool):
        return f"must be true or false{none}"
    elif kind is str:
        if not isinstance(value, str):
            return f"must be text{none}"
        if name in OPTION_CHOICES and value not in OPTION_CHOICES[name]:
            return f"must be one of {list(OPTION_CHOICES[name])}"
    return None
