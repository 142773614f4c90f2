"""Helpers for one-line error messages, shared by every layer (this module imports nothing)."""

from __future__ import annotations

import difflib


def did_you_mean(name: str, known) -> str:
    """" (did you mean 'x'?)" naming the closest of ``known`` to a mistyped name, else ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
