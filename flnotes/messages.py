"""Helpers for what the commands print (one-line errors, progress bars only on a terminal,
warnings a caller expects), shared by every layer (this module imports nothing of flnotes)."""

from __future__ import annotations

import contextlib
import difflib
import sys
import threading
import warnings


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


_EXPECTING = threading.local()  # .depth: how many expecting_fallbacks blocks this thread is in


def fallback_warning(text: str, stacklevel: int = 1) -> bool:
    """``warnings.warn(text)``, a method's note that it falls back (MOON as FedAvg on a model
    without a head, a loop instead of a batched step), unless this thread expects such notes
    (:func:`expecting_fallbacks`); returns whether it was given. ``stacklevel`` as for
    warnings.warn, counted from the caller."""
    if getattr(_EXPECTING, "depth", 0):
        return False
    warnings.warn(text, stacklevel=stacklevel + 1)
    return True


@contextlib.contextmanager
def expecting_fallbacks():
    """Within the block, this thread's :func:`fallback_warning` notes are not given (the
    toy's races, where every one is expected). Per thread, unlike warnings.catch_warnings,
    whose filters are the process's: an explorer's worker thread races while a cell may
    record warnings of its own."""
    _EXPECTING.depth = getattr(_EXPECTING, "depth", 0) + 1
    try:
        yield
    finally:
        _EXPECTING.depth -= 1
