"""The command line, ``python -m flnotes``: the parser and its commands (run, demo, presets,
sweep, tables). The top layer: nothing in the library imports it.
"""

from flnotes.cli.main import main

__all__ = ["main"]
