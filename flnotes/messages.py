"""Helpers for what the commands print (one-line errors, progress bars only on a terminal,
warnings a caller expects), shared by every layer (this module imports nothing of flnotes)."""

from __future__ import annotations

import contextlib
import difflib
import errno
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


def bar_wanted() -> bool:
    """Whether a bar that no caller switches (the images' decoding) is drawn: on a terminal
    or in a notebook, whose output shows a redrawn bar in place; never into a log file."""
    ipython = sys.modules.get("IPython")  # imported already wherever a kernel runs
    shell = ipython.get_ipython() if ipython is not None else None
    return on_terminal() or type(shell).__name__ == "ZMQInteractiveShell"


def one_line(err) -> str:
    """An error's text (its ``problem`` when it carries one) on one line, for a table cell or a
    one-line message; "" for None."""
    return " ".join(str(getattr(err, "problem", None) or err or "").split())


def did_you_mean(name: str, known) -> str:
    """" (did you mean 'x'?)" naming the closest of ``known`` to a mistyped name, else ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


# What an OSError means for the path the user gave, in words (the errno's text follows).
OS_MEANINGS = {
    errno.EACCES: "no permission to write there; choose a folder you can write to",
    errno.EPERM: "not permitted there; choose a folder you can write to",
    errno.EROFS: "the file system is read-only; choose a folder on another one",
    errno.ENOTDIR: "a part of that path is a file, not a folder",
    errno.EISDIR: "that is a folder, where a file was expected",
    errno.ENOSPC: "the disk is full; free some space and run the same command again",
    errno.EDQUOT: "the disk quota is used up; free some space and run the same command again",
    errno.ENAMETOOLONG: "the name is too long for the file system",
    errno.ELOOP: "the path loops through symbolic links",
}


def os_error_line(err: OSError) -> str:
    """One line for an OSError met on a path: which path, what that means, the system's
    words ("cannot use /data/nb: no permission to write there; ... (Permission denied)")."""
    words = err.strerror or str(err)
    meaning = OS_MEANINGS.get(err.errno)
    if not err.filename:
        return f"{meaning} ({words})" if meaning else words
    return f"cannot use {err.filename}: {meaning} ({words})" if meaning else \
        f"cannot use {err.filename}: {words}"


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
