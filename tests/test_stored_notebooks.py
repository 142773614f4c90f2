"""The teaching notebooks are stored as a reader should meet them: whole, figures included.

A reader who opens 00-04 or 21 on GitHub, or in JupyterLab before running anything, must see
the lecture with its pictures. ``notebooks/refresh_outputs.py`` stores them so;
these checks fail when a notebook is committed stripped, half run, with an error, or too big
to open comfortably. That the stored numbers still match a fresh run is nbval's part: ``make
test`` re-runs every notebook and compares the checked cells.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
MAX_BYTES = 1_200_000  # "around 1 MB or less"


def _refresh_module():
    spec = importlib.util.spec_from_file_location("refresh_outputs",
                                                  NOTEBOOKS / "refresh_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHIPPED = _refresh_module().SHIPPED_WITH_FIGURES  # the teaching notebooks, with explorers
STORED_WHOLE = _refresh_module().STORED_WHOLE  # those and the reproduction/results ones


def _draws(source: str) -> bool:
    """Whether a cell's code draws a figure (a plot function, an explorer, plt)."""
    return any(call in source for call in ("plots.plot_", "_explorer(", "plt.subplots"))


@pytest.mark.parametrize("name", STORED_WHOLE)
def test_notebook_is_stored_whole_with_its_figures(name):
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.stat().st_size <= MAX_BYTES, f"{name}: {path.stat().st_size} bytes"
    notebook = json.loads(path.read_text())
    assert "widgets" not in notebook["metadata"], f"{name}: widget state stored"
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    # One fresh run, top to bottom: every code cell ran, in order.
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), name
    figures = 0
    for index, cell in enumerate(code):
        source = "".join(cell["source"])
        outputs = cell.get("outputs", [])
        assert not [o for o in outputs if o["output_type"] == "error"], f"{name} cell {index}"
        pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
        if _draws(source):
            assert pngs, f"{name}: code cell {index} draws a figure but stores none"
        for png in pngs:
            from PIL import Image

            with Image.open(io.BytesIO(base64.b64decode(png))) as image:
                assert min(image.size) > 100, f"{name} cell {index}: {image.size}"
        figures += len(pngs)
    assert figures >= (2 if name in SHIPPED else 1), f"{name}: {figures} figures stored"


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "21_flatness"])
def test_every_explorer_stores_a_picture_and_says_how_to_revive_its_controls(name):
    """Without a kernel the controls cannot draw: the explorer's cell keeps its figure, the
    line saying to run the cell, and a text stand-in for the controls."""
    notebook = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    explorers = [c for c in notebook["cells"]
                 if c["cell_type"] == "code" and "_explorer(" in "".join(c["source"])]
    assert explorers, f"{name} has no explorer"
    for cell in explorers:
        kinds = [next(iter(k for k in ("image/png", "text/html", "text/plain")
                           if k in o.get("data", {})), None) for o in cell["outputs"]]
        assert kinds == ["image/png", "text/html", "text/plain"]
        note, controls = cell["outputs"][1]["data"], cell["outputs"][2]["data"]
        assert "run this cell" in "".join(note["text/html"])
        assert "run this cell" in "".join(controls["text/plain"])


@pytest.mark.parametrize("name", STORED_WHOLE)
def test_no_widget_view_is_stored_and_the_kernel_metadata_is_whole(name):
    """Reopened, a stored widget view has no model ("Error displaying widget: model not
    found"): controls are stored as a sentence, progress bars as text. The full
    language_info keeps JupyterLab from marking the notebook unsaved as it opens."""
    notebook = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), \
                f"{name} cell {index}"
    info = notebook["metadata"]["language_info"]
    assert {"name", "version", "mimetype", "file_extension"} <= set(info), name
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(notebook["metadata"]["kernelspec"]["name"])
    assert notebook["metadata"]["kernelspec"]["display_name"] == spec.display_name, name


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "21_flatness"])
def test_every_explorer_cell_runs_alone(name):
    """'Run this cell' on a fresh kernel: every name an explorer cell reads is imported or
    assigned in the cell itself (or is a builtin)."""
    import ast
    import builtins

    notebook = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or "_explorer(" not in source:
            continue
        tree = ast.parse(source)
        defined = set(dir(builtins))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        assert read <= defined, f"{name}: the explorer cell needs {sorted(read - defined)}"


def test_the_notebooks_readme_lists_every_notebook_under_its_own_title():
    """notebooks/README.md (copied with the series by `flnotes notebooks DEST`) names each
    notebook by the title its first cell gives, so the two cannot drift apart."""
    readme = (NOTEBOOKS / "README.md").read_text()
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        heading = "".join(json.loads(path.read_text())["cells"][0]["source"]).splitlines()[0]
        title = heading.split("· ", 1)[1]
        assert f"| `{path.stem}` | {title} |" in readme, path.stem
