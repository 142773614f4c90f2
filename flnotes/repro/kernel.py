"""The Jupyter kernel that papermill runs notebooks in: this interpreter, whatever kernels the
user has installed.

A kernelspec named ``python3`` in the user's Jupyter folders can point at another Python (and
``ipykernel install --user --name python3`` would overwrite the user's own). flnotes never
installs one: it writes a kernelspec for ``sys.executable`` into a folder of its own, puts that
folder first on ``JUPYTER_PATH`` for this process and the kernels it starts, and asks papermill
for that name.

That folder lives as long as the process that made it (``JUPYTER_PATH`` names it, and every
notebook the process runs starts its kernel from it) and is removed when that process ends,
whether it ends normally or on an exception; a sweep worker stopped by SIGTERM removes it
before it kills its process group, and a Ray task after its cell (Ray ends its workers
without their exit handlers): :func:`release_kernel`. Only a process killed outright
(SIGKILL) leaves it behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from functools import cache
from multiprocessing.util import Finalize
from pathlib import Path

KERNEL_NAME = "flnotes-python"
_REMOVERS: list[tuple[str, Finalize]] = []  # (folder, its removal: at exit, or released)
# An optional package of jsonschema's that builds a grammar when imported (see import_papermill)
SLOW_FORMAT_CHECKER = "rfc3987_syntax"


@cache
def current_kernel() -> str:
    """The name of a kernelspec that starts ``sys.executable`` (made once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="flnotes-jupyter-"))
    # Removed at exit. multiprocessing's finalizer, not atexit: a sweep's workers are
    # multiprocessing processes, which run these finalizers as they end but leave by
    # os._exit, skipping atexit. It runs only in the process that made the folder (a forked
    # child that inherits the name leaves it to its parent).
    _REMOVERS.append((str(folder), Finalize(None, shutil.rmtree, args=(folder,),
                                            kwargs={"ignore_errors": True}, exitpriority=0)))
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


def release_kernel() -> None:
    """Remove this process's kernelspec folder now and take it off ``JUPYTER_PATH`` (the next
    :func:`current_kernel` makes a new one): where the process may end without its exit
    handlers (a sweep worker killing its own process group, a Ray worker)."""
    while _REMOVERS:
        folder, remove = _REMOVERS.pop()
        remove()  # a Finalize runs once: at exit it does nothing more
        paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
                 if p and p != folder]
        if paths:
            os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
        else:
            os.environ.pop("JUPYTER_PATH", None)
    current_kernel.cache_clear()


def import_papermill():
    """papermill, imported a second sooner: without jsonschema's IRI format check.

    papermill imports nbformat, nbformat jsonschema, and jsonschema's format checkers import
    rfc3987_syntax where it is installed (Jupyter's extras install it), which builds a Lark
    grammar on import: 1.2 s of papermill's 2.2 s on a CPU of the 2-core CI machine, paid by
    each sweep worker and command. The notebook format's schemas check no IRI, so the
    checker is not needed to run notebooks. The package is hidden during this import only
    (a later ``import rfc3987_syntax`` works), and only where nothing has imported it yet.
    """
    hidden = SLOW_FORMAT_CHECKER not in sys.modules
    if hidden:
        sys.modules[SLOW_FORMAT_CHECKER] = None  # importing it raises ImportError: skipped
    try:
        import papermill  # costly (~1 s even so): only where a notebook runs
    finally:
        if hidden and sys.modules.get(SLOW_FORMAT_CHECKER, False) is None:
            del sys.modules[SLOW_FORMAT_CHECKER]
    return papermill


@contextlib.contextmanager
def kernel_environment(**values: str):
    """Set environment variables for the block (a kernel started in it inherits them), then
    restore them (a sweep worker or Ray task runs other cells after this one)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
