"""The browser test's second half: notebooks 01, 03 and 04 in Chromium, exactly as
tests/test_browser.py drives 00, 02 and 21 (that file holds the machinery and says what is
checked). A file of its own, so that make test's two workers run the halves side by side;
its own JupyterLab and Chromium (the fixtures are module-scoped)."""

from __future__ import annotations

import pytest
from test_browser import (  # noqa: F401
    CHECKED_HERE,
    HERE,
    TEACHING,
    browser,
    drive_notebook,
    lab,
)

THERE = [name for name in TEACHING if name not in HERE]


@pytest.mark.parametrize("name", THERE)
def test_notebook_runs_and_every_control_redraws(browser, lab, name):  # noqa: F811
    drive_notebook(browser, lab, name)


def test_the_two_halves_drive_every_teaching_notebook():
    assert sorted(HERE + THERE) == sorted(TEACHING) and not set(HERE) & set(THERE)
