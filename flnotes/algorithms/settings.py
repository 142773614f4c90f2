"""A method's own settings, declared where the method is written.

Each strategy lists its hyperparameters as :class:`Setting` objects in its class attribute
``settings``: name, default, the check a value must pass, one line of help and the paper
(and equation) the default comes from. Everything else is derived from these declarations:
RunConfig's validation and defaults, the command line's flags and ``--help`` groups, the
settings hash of a run folder (a run hashes the settings its method reads, and no other
method's), Flower's run config, the toy widgets' controls and the paper-setting check.

A subclass inherits its parents' settings; declaring a setting of the same name replaces
the parent's declaration (FedQP's ``alpha`` default 2.0 over FedMut's 4.0), and
``settings_not_read`` drops inherited ones the subclass does not use.

Names are flat and unique in meaning: two methods share a name only when it means the same
thing in both (FedMut's and FedQP's mutation range ``alpha``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flnotes.messages import did_you_mean

_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a finite number",
               str: "a string"}
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: a model's numbers


def float32_overflow(value: Any) -> str | None:
    """'must be at most ...' for a finite number that float32 cannot hold: the optimizer
    turns it into a model's float32 and fails with an overflow deep in a round."""
    if (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value)) and abs(value) > FLOAT32_MAX):
        shown = f"{value:g}" if isinstance(value, float) else \
            f"about 1e{int(abs(value).bit_length() * math.log10(2))}"  # (no float holds it)
        return f"must be at most {FLOAT32_MAX:.3g} in size: float32 tensors cannot hold {shown}"
    return None


@dataclass(frozen=True)
class Setting:
    """One hyperparameter of one method: its name, default, check, help and source.

    ``kind`` is the value's type (taken from ``default`` when it is not None). A number must
    lie within [minimum, maximum]; ``open_minimum``/``open_maximum`` exclude the bound.
    ``choices``: the allowed strings. ``none_means`` says what None stands for when None is
    allowed (the default then depends on the data: MOON's mu); empty: None is refused.
    ``old_names``: names this setting had before (a value given under an old name for this
    method is an error that names the new one).
    """

    name: str
    default: Any
    help: str
    source: str = ""
    kind: type | None = None
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False
    open_maximum: bool = False
    choices: tuple[str, ...] = ()
    none_means: str = ""
    old_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        kind = self.kind or type(self.default)
        if kind not in _TYPE_WORDS:
            raise TypeError(f"Setting {self.name!r}: kind must be one of bool, int, float, str "
                            f"(give kind= when the default is None), got {kind!r}")
        object.__setattr__(self, "kind", kind)
        problem = self.problem(self.default)
        if problem:
            raise ValueError(f"Setting {self.name!r}: its default {self.default!r} {problem}")

    # ---- checks -----------------------------------------------------------------
    def allowed(self) -> str:
        """What a value must be, in words: 'a number in [0, 1)', 'one of cosine, l1, l2'."""
        if self.choices:
            text = f"one of {', '.join(self.choices)}"
        elif self.kind in (int, float) and self.maximum is not None and self.minimum is not None:
            text = (f"in {'(' if self.open_minimum else '['}{_num(self.minimum)}, "
                    f"{_num(self.maximum)}{')' if self.open_maximum else ']'}")
        elif self.kind in (int, float) and self.minimum is not None:
            word = "integer" if self.kind is int else "finite number"
            if self.minimum == 0 and not self.open_minimum:
                text = f"a non-negative {word}"
            elif (self.minimum == 0 and self.open_minimum) or (self.kind is int
                                                              and self.minimum == 1):
                text = f"a positive {word}"
            else:
                text = f"an {word} {'>' if self.open_minimum else '>='} {_num(self.minimum)}"
        elif self.kind in (int, float) and self.maximum is not None:
            word = "an integer" if self.kind is int else "a finite number"
            text = f"{word} {'<' if self.open_maximum else '<='} {_num(self.maximum)}"
        else:
            text = _TYPE_WORDS[self.kind]
        return text + (f" (or None: {self.none_means})" if self.none_means else "")

    def problem(self, value: Any) -> str | None:
        """'must be ...' if ``value`` is not allowed, else None."""
        if value is None:
            return None if self.none_means else f"must be {self.allowed()}"
        if self.kind is float and (overflow := float32_overflow(value)):
            return overflow
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind is float:  # (an int is finite; math.isfinite fails on a huge one)
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and (isinstance(value, int) or math.isfinite(value)))
        else:
            ok = isinstance(value, str)
        if ok and self.choices:
            ok = value in self.choices
        if ok and self.minimum is not None:
            ok = value > self.minimum if self.open_minimum else value >= self.minimum
        if ok and self.maximum is not None:
            ok = value < self.maximum if self.open_maximum else value <= self.maximum
        if ok:
            return None
        hint = did_you_mean(value, self.choices) if self.choices and isinstance(value, str) else ""
        return f"must be {self.allowed()}{hint}"

    def parse(self, text: str) -> Any:
        """A command-line or ``--set`` string as this setting's type (checked later)."""
        if self.none_means and text.strip().lower() in ("none", "null", ""):
            return None
        if self.kind is bool:
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {text!r}")
        if self.kind is int:
            return int(text)
        if self.kind is float:
            return float(text)
        return text


def _num(x: float) -> str:
    return f"{x:g}"


def declared_settings(cls) -> dict[str, Setting]:
    """A strategy class's settings by name: its own and its parents' (nearest wins)."""
    out: dict[str, Setting] = {}
    dropped: set[str] = set()
    for klass in cls.__mro__:  # nearest class first
        dropped |= set(klass.__dict__.get("settings_not_read", ()))
        for setting in klass.__dict__.get("settings", ()):
            if setting.name not in out and setting.name not in dropped:
                out[setting.name] = setting
    return out
