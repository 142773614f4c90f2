"""The Jupyter kernel that papermill runs notebooks in: this interpreter, whatever kernels the
user has installed.

A kernelspec named ``python3`` in the user's Jupyter folders can point at another Python (and
``ipykernel install --user --name python3`` would overwrite the user's own). flnotes never
installs one: it writes a kernelspec for ``sys.executable`` into a folder of its own, puts that
folder first on ``JUPYTER_PATH`` for this process and the kernels it starts, and asks papermill
for that name.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from functools import cache
from pathlib import Path

KERNEL_NAME = "flnotes-python"


@cache
def current_kernel() -> str:
    """The name of a kernelspec that starts ``sys.executable`` (made once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="flnotes-jupyter-"))
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    # As ipykernel's own spec: its metadata lets the kernel manager use CurveZMQ (without it
    # every kernel warns that it runs over TCP without encryption).
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"flnotes ({Path(sys.executable).name})", "language": "python",
        "metadata": {"debugger": True, "supported_encryption": ["curve"]},
        "kernel_protocol_version": "5.5",
    }))
    paths = [str(folder), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    return KERNEL_NAME
