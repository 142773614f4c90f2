"""Helpers for what the commands print (one-line errors, progress bars only on a terminal),
shared by every layer (this module imports nothing of flnotes)."""

from __future__ import annotations

import difflib
import sys


def on_terminal() -> bool:
    """True when stderr (where progress bars go) is a terminal: bars only there, since a
    redirected log would fill with their \\r-redrawn lines."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def did_you_mean(name: str, known) -> str:
    """" (did you mean 'x'?)" naming the closest of ``known`` to a mistyped name, else ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
