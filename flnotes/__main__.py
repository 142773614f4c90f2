"""``python -m flnotes``: the command line (:mod:`flnotes.cli`)."""

import sys

from flnotes.cli import main

if __name__ == "__main__":
    sys.exit(main())
