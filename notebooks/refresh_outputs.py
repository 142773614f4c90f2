"""Refresh the outputs that nbval checks: run notebooks headless, keep only the checked cells'.

    python notebooks/refresh_outputs.py notebooks/04_toy_race.ipynb notebooks/21_flatness.ipynb

A committed notebook keeps outputs only for cells containing ``# NBVAL_CHECK_OUTPUT`` (what
``make test`` compares after re-running it); every other cell is stored without outputs and
execution count. After an intended change of results, this script re-runs each notebook given
(working directory notebooks/, as under pytest), writes the new outputs of the checked cells
into the notebook in place and strips the rest. Read the diff before committing: a changed
number may need the notebook's prose changed too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from flnotes.repro.notebooks import quiet_kernel_manager

MARKER = "# NBVAL_CHECK_OUTPUT"
NOTEBOOKS = Path(__file__).resolve().parent


def checked(cell) -> bool:
    """Whether nbval compares this cell's outputs."""
    return cell.cell_type == "code" and MARKER in cell.source


def refresh(path: Path, timeout: int = 1800) -> int:
    """Re-run one notebook and store only its checked outputs; returns how many changed."""
    stored = nbformat.read(path, as_version=4)
    executed = nbformat.read(path, as_version=4)
    NotebookClient(executed, timeout=timeout, kernel_name="python3",
                   kernel_manager_class=quiet_kernel_manager(),
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    changed = 0
    for old, new in zip(stored.cells, executed.cells, strict=True):
        if old.cell_type != "code":
            continue
        outputs, count = (new.outputs, new.execution_count) if checked(old) else ([], None)
        changed += checked(old) and old.outputs != outputs
        old.outputs, old.execution_count = outputs, count
    # nbformat's own layout plus the final newline the committed files have.
    path.write_text(nbformat.writes(stored) + "\n", encoding="utf-8")
    return changed


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    for name in paths:
        print(f"{name}: {refresh(Path(name).resolve())} checked cell(s) changed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
