"""The Jupyter kernel that papermill runs notebooks in: this interpreter, whatever kernels the
user has installed.

A kernelspec named ``python3`` in the user's Jupyter folders can point at another Python (and
``ipykernel install --user --name python3`` would overwrite the user's own). flnotes never
installs one: it writes a kernelspec for ``sys.executable`` into a folder of its own, puts that
folder first on ``JUPYTER_PATH`` for this process and the kernels it starts, and asks papermill
for that name.

That folder lives as long as the process that made it (``JUPYTER_PATH`` names it, and every
notebook the process runs starts its kernel from it) and is removed when that process ends,
whether it ends normally or on an exception; only a process killed outright (SIGKILL, or a
sweep worker stopped by SIGTERM, which leaves by ``os._exit``) leaves it behind.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from functools import cache
from multiprocessing.util import Finalize
from pathlib import Path

KERNEL_NAME = "flnotes-python"


@cache
def current_kernel() -> str:
    """The name of a kernelspec that starts ``sys.executable`` (made once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="flnotes-jupyter-"))
    # Removed at exit. multiprocessing's finalizer, not atexit: a sweep's workers are
    # multiprocessing processes, which run these finalizers as they end but leave by
    # os._exit, skipping atexit. It runs only in the process that made the folder (a forked
    # child that inherits the name leaves it to its parent).
    Finalize(None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
             exitpriority=0)
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
