"""Reproducing the papers: sweep grids over notebooks, the sweep runner, tables beside the
papers' numbers, and whether a run was in a paper's setting.

Top layer under the command line: it may use everything below (engine, config, data) and
nothing imports it but :mod:`flnotes.cli`.
"""

from pathlib import Path

# The repository checkout this package lives in: sweeps/, notebooks/ and data/paper_tables.
REPO_ROOT = Path(__file__).resolve().parents[2]
