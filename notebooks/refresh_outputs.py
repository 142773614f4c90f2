"""Refresh a notebook's stored outputs: run it headless, keep what a reader should see.

    python notebooks/refresh_outputs.py notebooks/04_toy_race.ipynb notebooks/21_flatness.ipynb

The teaching notebooks (00-04 and 21, :data:`SHIPPED_WITH_FIGURES`) are stored with every
output of a fresh run, figures included, so that a reader who opens one on GitHub or before
running it sees the lecture whole (each stays around 1 MB: the figures are PNGs at 100 dpi).
The other notebooks keep outputs only for cells containing ``# NBVAL_CHECK_OUTPUT``. Either
way, ``make test`` re-runs every notebook and compares the checked cells' outputs with the
stored ones (nbval), so a stored number that no longer matches a fresh run fails the suite.
After an intended change of results, this script re-runs each notebook given (working
directory notebooks/, as under pytest) and writes its outputs into the notebook in place.
Read the diff before committing: a changed number may need the notebook's prose changed too.
"""

from __future__ import annotations

import base64
import io
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from flnotes.repro.notebooks import quiet_kernel_manager

MARKER = "# NBVAL_CHECK_OUTPUT"
NOTEBOOKS = Path(__file__).resolve().parent
# The notebooks a reader should see whole without running them (issue 14).
SHIPPED_WITH_FIGURES = ("00_quickstart", "01_flat_vs_sharp", "02_client_landscapes",
                        "03_mutation_regions", "04_toy_race", "21_flatness")


def checked(cell) -> bool:
    """Whether nbval compares this cell's outputs."""
    return cell.cell_type == "code" and MARKER in cell.source


def palette_png(encoded: str) -> str:
    """A stored figure (base64 PNG) with a 256-colour palette: about a third of the bytes,
    the same picture to the eye (filled contours are a few dozen flat colours). Figures with
    transparency are quantised with their alpha channel."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
        image.load()
    opaque = image.mode == "RGB" or (image.mode == "RGBA"
                                     and image.getchannel("A").getextrema()[0] == 255)
    if opaque:
        quantised = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    else:
        quantised = image.convert("RGBA").quantize(256, method=Image.Quantize.FASTOCTREE)
    buffer = io.BytesIO()
    quantised.save(buffer, format="png", optimize=True)
    smaller = buffer.getvalue()
    return base64.b64encode(smaller).decode("ascii") if len(smaller) < len(encoded) else encoded


def shrink_figures(outputs: list) -> list:
    """``outputs`` with every PNG stored as :func:`palette_png` gives it, and without tqdm's
    progress bars: a stored bar's text is its first state ("0%"), which a reader would take
    for a run that never went on (the line the cell prints when done says how long it took)."""
    kept = []
    for output in outputs:
        data = output.get("data", {})
        if "image/png" in data:
            data["image/png"] = palette_png(data["image/png"])
        widget = "application/vnd.jupyter.widget-view+json" in data
        if widget and re.search(r"\d+%\|", str(data.get("text/plain", ""))):
            continue
        kept.append(output)
    return kept


def refresh(path: Path, timeout: int = 1800) -> int:
    """Re-run one notebook and store its outputs (all, or the checked cells' only); returns
    how many checked cells' outputs changed."""
    stored = nbformat.read(path, as_version=4)
    executed = nbformat.read(path, as_version=4)
    # No widget state in the file: the explorers' figures are plain image outputs already,
    # and their controls need a kernel anyway.
    NotebookClient(executed, timeout=timeout, kernel_name="python3",
                   kernel_manager_class=quiet_kernel_manager(), store_widget_state=False,
                   record_timing=False,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    keep_all = path.stem in SHIPPED_WITH_FIGURES
    changed = 0
    for old, new in zip(stored.cells, executed.cells, strict=True):
        if old.cell_type != "code":
            continue
        keep = keep_all or checked(old)
        outputs, count = (new.outputs, new.execution_count) if keep else ([], None)
        if keep_all and not checked(old):  # a checked cell's output is compared: as it came
            outputs = shrink_figures(outputs)
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
