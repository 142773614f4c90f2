"""Reproducing the papers: sweep grids over notebooks, the sweep runner, tables beside the
papers' numbers, and whether a run was in a paper's setting.

Top layer under the command line: it may use everything below (engine, config, data) and
nothing imports it but :mod:`flnotes.cli`.

The notebook series, the sweep grids and the papers' tables ship inside the package (so a wheel
has them): ``flnotes/notebooks``, ``flnotes/sweeps``, ``flnotes/paper_tables``. A clone has
``notebooks/``, ``sweeps/`` and ``data/paper_tables`` at its top as links to them.
"""

from importlib.resources import files
from pathlib import Path

# importlib.resources finds the package's files wherever it is installed (a wheel in
# site-packages, an editable clone); a wheel installs as plain files, so this is a real folder.
PACKAGE_DIR = Path(str(files("flnotes")))
NOTEBOOK_DIR = PACKAGE_DIR / "notebooks"
SWEEP_DIR = PACKAGE_DIR / "sweeps"
PAPER_TABLE_DIR = PACKAGE_DIR / "paper_tables"

# The source checkout this package lives in, or None when installed from a wheel.
REPO_ROOT: Path | None = (PACKAGE_DIR.parent
                          if (PACKAGE_DIR.parent / "pyproject.toml").is_file() else None)
