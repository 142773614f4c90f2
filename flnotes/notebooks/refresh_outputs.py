"""Refresh a notebook's stored outputs: run it headless, keep what a reader should see.

    python notebooks/refresh_outputs.py notebooks/04_toy_race.ipynb notebooks/21_flatness.ipynb

The teaching notebooks (00-04 and 21, :data:`SHIPPED_WITH_FIGURES`) and the reproduction and
results notebooks (10-12, 20, 22; all of them: :data:`STORED_WHOLE`) are stored with every
output of a fresh run, figures included, so that a reader who opens one on GitHub or before
running it sees the lecture whole (each stays around 1 MB: the figures are PNGs at 100 dpi).
The other notebooks keep outputs only for cells containing ``# NBVAL_CHECK_OUTPUT``. Either
way, ``make test`` re-runs every notebook and compares the checked cells' outputs with the
stored ones (nbval), so a stored number that no longer matches a fresh run fails the suite.
After an intended change of results, this script re-runs each notebook given (working
directory notebooks/, as under pytest) and writes its outputs into the notebook in place.
Read the diff before committing: a changed number may need the notebook's prose changed too.

Notebook 04's race at its default setting ships as data (flnotes/toy/shipped.py); after a
change that moves a toy run (tests/test_toy.py says so), make it again, then re-store 04:

    python notebooks/refresh_outputs.py --ship-toy-race    # about 4 CPU-minutes

Each notebook's "**Code.**" paragraphs name the functions that compute a maths box's
equations, each a link to the line that defines it (../algorithms/mutation.py#L60). After
code moves, rewrite those links (tests/test_lessons.py fails until then):

    python notebooks/refresh_outputs.py --code-lines
"""

from __future__ import annotations

import ast
import base64
import io
import re
import sys
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from flnotes.repro.notebooks import TEACHING, quiet_kernel_manager
from flnotes.toy.experiments import ship_default_race

MARKER = "# NBVAL_CHECK_OUTPUT"
NOTEBOOKS = Path(__file__).resolve().parent
# The notebooks a reader should see whole without running them (stored with their figures).
SHIPPED_WITH_FIGURES = TEACHING
# Stored whole as well: the reproduction notebooks' default runs and the stored-results ones.
STORED_WHOLE = SHIPPED_WITH_FIGURES + ("10_reproduce_cifar", "11_reproduce_shakespeare",
                                       "12_reproduce_fml", "20_tables_vs_paper", "22_paper_figures")


def checked(cell) -> bool:
    """Whether nbval compares this cell's outputs."""
    return cell.cell_type == "code" and MARKER in cell.source


def palette_png(encoded: str) -> str:
    """A stored figure (base64 PNG) with a 256-colour palette: about a third of the bytes,
    the same picture to the eye (filled contours are a few dozen flat colours). Figures with
    transparency are quantised with their alpha channel."""
    from PIL import Image  # lazy: only for stored images

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
    smaller = base64.b64encode(buffer.getvalue()).decode("ascii")  # compared as stored
    return smaller if len(smaller) < len(encoded) else encoded


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _bar_text(model_id: str, state: dict) -> str | None:
    """A tqdm bar's last state as the text line tqdm prints outside a notebook, from the
    run's widget state (its box: description, progress, counts); None if not a bar."""
    box = state.get(model_id, {}).get("state", {})
    children = [str(c).removeprefix("IPY_MODEL_") for c in box.get("children", [])]
    parts = [state.get(c, {}) for c in children]
    bar = next((p["state"] for p in parts if p.get("model_name") == "FloatProgressModel"), None)
    if bar is None:
        return None
    texts = [p["state"].get("value", "") for p in parts if p.get("model_name") == "HTMLModel"]
    left, right = (texts + ["", ""])[:2]
    share = bar.get("value", 0) / bar["max"] if bar.get("max") else 0.0
    line = f"{left.strip()} {share:.0%}| {right.strip()}".strip()
    return re.sub(r"<[^>]+>|&nbsp;", " ", line).replace("  ", " ")


def store_as_text(outputs: list, state: dict) -> list:
    """``outputs`` with no widget view left: a reopened copy has no widget models, and
    JupyterLab shows "Error displaying widget: model not found" for each. An explorer's
    controls become their plain sentence (its text/plain), its figure the PNG beside the
    view, a tqdm bar the text line of its last state (or nothing, if its state was not
    recorded)."""
    kept = []
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_VIEW not in data:
            kept.append(output)
            continue
        text = _bar_text(data[WIDGET_VIEW]["model_id"], state)
        if text is None and re.search(r"\d+%\|", str(data.get("text/plain", ""))):
            continue  # a bar whose last state is unknown: its first state would mislead
        if text is not None:
            kept.append(nbformat.v4.new_output("stream", name="stderr", text=text + "\n"))
        else:  # what it holds beside the view: a sentence, an explorer's picture
            kept.append(nbformat.v4.new_output("display_data", data={
                k: v for k, v in data.items() if k != WIDGET_VIEW} or {"text/plain": ""}))
    return kept


def coalesce_streams(outputs: list) -> list:
    """Consecutive stream outputs of one stream as one output, each line as shown (how a
    cell's printed lines were split into messages depends on the machine's speed)."""
    kept = []
    for output in outputs:
        last = kept[-1] if kept else None
        if (output.get("output_type") == "stream" and last is not None
                and last.get("output_type") == "stream" and last["name"] == output["name"]):
            last["text"] = "".join(last["text"]) + "".join(output["text"])
        else:
            kept.append(output)
    for output in kept:
        if output.get("output_type") == "stream" and "\r" in "".join(output["text"]):
            # each line as a terminal shows it: what follows its last carriage return (a text
            # progress bar redraws its line so; stored, only its last state is kept)
            lines = "".join(output["text"]).split("\n")
            output["text"] = "\n".join(line.rsplit("\r", 1)[-1] if line.rstrip("\r") else line
                                       for line in lines)
    return kept


def shrink_figures(outputs: list) -> list:
    """``outputs`` with every PNG stored as :func:`palette_png` gives it."""
    for output in outputs:
        data = output.get("data", {})
        if "image/png" in data:
            data["image/png"] = palette_png(data["image/png"])
    return outputs


def kernel_metadata(stored, executed=None, kernel_name: str = "python3") -> None:
    """The kernel's metadata as JupyterLab writes it when the kernel starts: its spec's
    display name and the full language_info. Stored otherwise ("Python 3" for the spec's
    "Python 3 (ipykernel)", a language_info of its name only), a notebook was marked unsaved
    the moment it opened. No widget state is kept."""
    from jupyter_client.kernelspec import KernelSpecManager  # lazy: only to run notebooks

    spec = KernelSpecManager().get_kernel_spec(kernel_name)
    stored.metadata["kernelspec"] = {"display_name": spec.display_name,
                                     "language": spec.language, "name": kernel_name}
    if executed is not None and "language_info" in executed.metadata:
        stored.metadata["language_info"] = executed.metadata["language_info"]
    stored.metadata.pop("widgets", None)


def refresh(path: Path, timeout: int = 1800) -> int:
    """Re-run one notebook and store its outputs (all, or the checked cells' only); returns
    how many checked cells' outputs changed."""
    stored = nbformat.read(path, as_version=4)
    executed = nbformat.read(path, as_version=4)
    # The run's widget state is read (for the progress bars' last lines), never stored: the
    # explorers' figures are plain image outputs already, and their controls need a kernel.
    NotebookClient(executed, timeout=timeout, kernel_name="python3",
                   kernel_manager_class=quiet_kernel_manager(), store_widget_state=True,
                   record_timing=False, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    state = executed.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    keep_all = path.stem in STORED_WHOLE
    changed = 0
    for old, new in zip(stored.cells, executed.cells, strict=True):
        if old.cell_type != "code":
            continue
        keep = keep_all or checked(old)
        outputs, count = (new.outputs, new.execution_count) if keep else ([], None)
        outputs = coalesce_streams(store_as_text(outputs, state))
        if keep_all and not checked(old):  # a checked cell's output is compared: as it came
            outputs = shrink_figures(outputs)
        changed += checked(old) and old.outputs != outputs
        old.outputs, old.execution_count = outputs, count
    kernel_metadata(stored, executed)
    # nbformat's own layout plus the final newline the committed files have.
    path.write_text(nbformat.writes(stored) + "\n", encoding="utf-8")
    return changed


PACKAGE = NOTEBOOKS.parent
CODE_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)`")  # `name` or `Class.method`
# the link this script puts around such a name: to its line, relative to the notebook
CODE_LINK = re.compile(r"\[(`[^`]+`)\]\(\.\./[\w/]+\.py#L\d+\)")


def definitions() -> dict[str, list[str]]:
    """Each function, class and method of flnotes (``name``, ``Class.method``) -> where it is
    defined, as ``path/in/flnotes.py:line`` (the ``def`` or ``class`` line)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append(f"{where}:{node.lineno}")
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, ast.FunctionDef):
                        found.setdefault(f"{node.name}.{member.name}", []).append(
                            f"{where}:{member.lineno}")
    return found


def with_code_lines(text: str, defined: dict[str, list[str]]) -> str:
    """``text`` with each name in its "**Code.**" paragraphs that flnotes defines once made a
    link to its line (``[`sign_mutations`](../algorithms/mutation.py#L60)``: GitHub and
    JupyterLab open the file there); a name defined in several places, or nowhere, stays bare."""
    def link(match: re.Match) -> str:
        where = defined.get(match.group(1), [])
        if len(where) != 1:
            return match.group(0)
        path, line = where[0].rsplit(":", 1)
        return f"[`{match.group(1)}`](../{path}#L{line})"

    return "\n\n".join(CODE_NAME.sub(link, CODE_LINK.sub(r"\1", p))
                       if p.startswith("**Code.**") else p for p in text.split("\n\n"))


def write_code_lines() -> int:
    """Rewrite the code lines of every notebook's "**Code.**" paragraphs; how many changed."""
    defined, changed = definitions(), 0
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "markdown" and "**Code.**" in cell.source:
                new = with_code_lines(cell.source, defined)
                changed += new != cell.source
                cell.source = new
        path.write_text(nbformat.writes(notebook) + "\n", encoding="utf-8")
    return changed


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    if paths == ["--code-lines"]:
        print(f"{write_code_lines()} cell(s) with new code lines")
        return 0
    if paths == ["--ship-toy-race"]:
        torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is the fastest
        print(f"wrote {ship_default_race()}")
        return 0
    for name in paths:
        print(f"{name}: {refresh(Path(name).resolve())} checked cell(s) changed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
