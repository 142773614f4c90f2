"""The teaching notebooks as lessons: each has a maths box whose code it names, questions to
predict before moving a control, and exercises with their answers folded below them."""

import json
import re
from pathlib import Path

import pytest

from flnotes.repro.notebooks import NOTEBOOK_DIR, TEACHING

REPO = Path(__file__).resolve().parent.parent


def markdown(name: str) -> list[str]:
    notebook = json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("name", TEACHING)
def test_each_lesson_has_maths_its_code_prompts_and_exercises(name):
    cells = markdown(name)
    boxes = [c for c in cells if c.startswith("**Maths box")]
    assert boxes, f"{name}: no maths box"
    for box in boxes:
        assert box.count("$$") >= 2, f"{name}: a maths box without a displayed equation"
        assert "Symbols" in box or "symbols" in box, f"{name}: a maths box defines no symbols"
        code = box.split("**Code.**", 1)
        assert len(code) == 2, f"{name}: a maths box does not say which code computes it"
        paths = re.findall(r"`(flnotes/[\w/]+\.py)`", code[1])
        assert paths and all((REPO / p).is_file() for p in paths), (name, paths)
    assert sum(c.startswith("**Predict, then check.**") for c in cells) >= 2, name
    exercises = [c for c in cells if re.match(r"\*\*Exercise \d", c)]
    assert len(exercises) >= 3, f"{name}: {len(exercises)} exercises"
    assert all("<details><summary>Answer" in c for c in exercises), name


# [`name`](../path.py#LN): a maths box's code, linked to the line that defines it
CODE_LINK = re.compile(r"\[`([\w.]+)`\]\(\.\./([\w/]+\.py)#L(\d+)\)")


@pytest.mark.parametrize("name", TEACHING)
def test_a_maths_box_links_its_code_to_the_line_that_defines_it(name):
    """Each "**Code.**" paragraph links its functions to their lines, and each link lands on
    that function's ``def`` (or ``class``) line today: read here from the file itself, not
    from the script that writes the links (``refresh_outputs.py --code-lines``)."""
    paragraphs = [p for cell in markdown(name) for p in cell.split("\n\n")
                  if p.startswith("**Code.**")]
    assert paragraphs, name
    for paragraph in paragraphs:
        links = CODE_LINK.findall(paragraph)
        assert links, f"{name}: a Code paragraph links no line: {paragraph[:80]!r}"
        for qualified, path, line in links:
            source = (REPO / "flnotes" / path).read_text().splitlines()[int(line) - 1]
            defined = qualified.rsplit(".", 1)[-1]
            assert re.match(rf"\s*(async def|def|class) {defined}\b", source), \
                (f"{name}: {qualified} links {path} line {line}, which reads {source!r}: run "
                 "python notebooks/refresh_outputs.py --code-lines")
