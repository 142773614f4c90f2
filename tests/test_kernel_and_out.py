"""notebooks run in a kernel of this interpreter (never the user's "python3", never
an installed kernelspec), and a sweep's default (relative) output folder nests once."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import write_grid, write_notebook

from flnotes.repro import sweep
from flnotes.repro.grid import load_grid
from flnotes.repro.kernel import KERNEL_NAME, current_kernel

REPO = Path(__file__).resolve().parent.parent
BODY = """
import sys
from pathlib import Path
out = Path(output_dir)
(out / "runs" / "r").mkdir(parents=True, exist_ok=True)
(out / "runs" / "r" / "python.txt").write_text(sys.executable)
"""


def test_the_kernel_is_this_interpreter_whatever_the_users_python3(tmp_path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    # A user kernel named python3 pointing at another Python: never used, never overwritten.
    user = tmp_path / "home" / "kernels" / "python3"
    user.mkdir(parents=True)
    theirs = {"argv": ["/usr/bin/not-this-python", "-m", "ipykernel_launcher", "-f",
                       "{connection_file}"], "display_name": "theirs", "language": "python"}
    (user / "kernel.json").write_text(json.dumps(theirs))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "home"))
    current_kernel.cache_clear()
    name = current_kernel()
    spec = KernelSpecManager().get_kernel_spec(name)
    assert name == KERNEL_NAME and spec.argv[0] == sys.executable
    assert json.loads((user / "kernel.json").read_text()) == theirs


# A process that makes the kernel folder, in a spawned worker (as a parallel sweep's) and
# itself, and then fails; each folder's path goes to a file so the test can look for it.
MAKES_FOLDERS = """
import multiprocessing
import os
import sys
from pathlib import Path

from flnotes.repro.kernel import current_kernel


def folder():
    current_kernel()
    made = Path(os.environ["JUPYTER_PATH"].split(os.pathsep)[0])
    assert (made / "kernels").is_dir()
    return made


def worker(record):
    Path(record).write_text(str(folder()))


if __name__ == "__main__":
    here = Path(sys.argv[1])
    child = multiprocessing.get_context("spawn").Process(target=worker,
                                                         args=(str(here / "child.txt"),))
    child.start()
    child.join()
    assert child.exitcode == 0
    assert not Path((here / "child.txt").read_text()).exists()  # gone as the worker ended
    (here / "parent.txt").write_text(str(folder()))
    raise RuntimeError("the run fails")
"""


def test_the_kernel_folder_is_removed_when_the_process_ends(tmp_path):
    """Each process's flnotes-jupyter-* folder is gone once it ends: a sweep's spawned
    worker, and a process that ends on an exception."""
    script = tmp_path / "makes_folders.py"
    script.write_text(textwrap.dedent(MAKES_FOLDERS))
    temp = tmp_path / "tmp"
    temp.mkdir()
    root = str(Path(__file__).resolve().parent.parent)
    environment = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert "the run fails" in done.stderr, done.stderr
    assert (tmp_path / "child.txt").exists(), done.stderr  # the worker made its folder
    made = Path((tmp_path / "parent.txt").read_text())
    assert made.parent == temp and made.name.startswith("flnotes-jupyter-")
    assert list(temp.iterdir()) == []


def test_a_released_kernel_folder_is_gone_and_the_next_one_is_fresh(monkeypatch):
    """release_kernel (a Ray task's end, a stopped worker): the folder is removed and taken
    off JUPYTER_PATH, the user's own entries kept; the next cell gets a new folder."""
    from flnotes.repro.kernel import release_kernel

    monkeypatch.setenv("JUPYTER_PATH", "/users/own")
    current_kernel.cache_clear()
    current_kernel()
    first = Path(os.environ["JUPYTER_PATH"].split(os.pathsep)[0])
    assert (first / "kernels" / KERNEL_NAME / "kernel.json").is_file()
    release_kernel()
    assert not first.exists() and os.environ["JUPYTER_PATH"] == "/users/own"
    assert current_kernel() == KERNEL_NAME
    second = Path(os.environ["JUPYTER_PATH"].split(os.pathsep)[0])
    assert second != first and (second / "kernels" / KERNEL_NAME / "kernel.json").is_file()
    release_kernel()


def test_a_sweep_with_the_default_out_nests_its_run_folders_once(tmp_path, monkeypatch):
    notebook = write_notebook(tmp_path, BODY)
    grid = load_grid(write_grid(tmp_path, {"notebook": notebook.name, "grid": {"x": [1]},
                                           "seeds": [0]}))
    monkeypatch.chdir(tmp_path)
    sweep.run_sweep(grid, None, progress=False)  # the default: runs/sweeps/<name>-<variant>
    found = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("python.txt"))
    assert len(found) == 1 and found[0].parts[:3] == ("runs", "sweeps", f"{grid.name}-paper")
    assert found[0].parts.count("runs") == 2  # runs/sweeps/.../cells/ID/runs/r: one nesting
    assert (tmp_path / found[0]).read_text() == sys.executable


PAPERMILL_PROBE = """
import sys
if {first!r}:
    import rfc3987_syntax
from flnotes.repro.kernel import SLOW_FORMAT_CHECKER, import_papermill
pm = import_papermill()
import nbformat
print(SLOW_FORMAT_CHECKER in sys.modules and sys.modules[SLOW_FORMAT_CHECKER] is not None)
good = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
nbformat.validate(good)  # a notebook still validates against its schema ...
bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
bad.cells[0].source = 1
try:
    nbformat.validate(bad)  # ... and a broken one is still refused
    print("accepted")
except Exception:  # nbformat's or jsonschema's ValidationError
    print("refused")
import rfc3987_syntax  # the hidden package imports again afterwards
print(pm.execute_notebook.__name__)
"""


def test_papermill_is_imported_without_the_slow_format_checker_and_validates_notebooks():
    pytest.importorskip("rfc3987_syntax", reason="jsonschema's IRI checker is not installed")
    for first, still_there in ((False, "False"), (True, "True")):  # hidden only if not loaded
        done = subprocess.run([sys.executable, "-c", PAPERMILL_PROBE.format(first=first)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [still_there, "refused", "execute_notebook"]
