"""Put flnotes' JupyterLab pieces into the JupyterLab this Python runs (`make install`).

A wheel installs both itself (pyproject's data-files); pip's editable install did not
(setuptools 84), so a clone's `make install` calls this:
- flnotes-widget-state.json, a package default in JupyterLab's settings/overrides.d: the
  explorers' widget state is saved with a notebook, so a saved copy reopens with its controls
  rather than "Error displaying widget: model not found";
- labextension/, the prebuilt extension built from widget-state-extension/ (`make
  lab-extension`): restoring that saved state does not mark the notebook unsaved.
"""

import shutil
import sys
from pathlib import Path

from jupyterlab.commands import get_app_dir

HERE = Path(__file__).resolve().parent
NAME = "flnotes-widget-state"

overrides = Path(get_app_dir(), "settings", "overrides.d")
overrides.mkdir(parents=True, exist_ok=True)
shutil.copy(HERE / f"{NAME}.json", overrides)

extension = Path(sys.prefix, "share", "jupyter", "labextensions", NAME)
shutil.rmtree(extension, ignore_errors=True)  # a rebuilt one has new file names
shutil.copytree(HERE / "labextension", extension)
