"""Execute the teaching notebooks with papermill (the main job's second half)."""

from __future__ import annotations

from pathlib import Path

from flnotes.engine.client_state import write_atomically
from flnotes.engine.run_folder import NO_SPACE, disk_full
from flnotes.repro import NOTEBOOK_DIR
from flnotes.repro.kernel import current_kernel, import_papermill


def quiet_kernel_manager():
    """The kernel manager papermill should start kernels with.

    ipykernel >= 7.3 warns on every start over plain TCP ("Kernel is running over TCP without
    encryption"), once per notebook of a sweep; jupyter_client >= 8.10 can provision CurveZMQ
    keys for kernels that support them ('auto'), which silences it. Older versions: the plain
    manager.
    """
    from jupyter_client.manager import KernelManager  # lazy: ~0.5 s
    from traitlets import default  # lazy, with jupyter_client

    if "transport_encryption" not in KernelManager.class_trait_names():
        return KernelManager

    class EncryptedKernelManager(KernelManager):
        @default("transport_encryption")
        def _encrypt_when_the_kernel_can(self) -> str:
            return "auto"

    return EncryptedKernelManager


# The teaching notebooks, in course order: stored with their figures, driven in a browser by
# the tests. The first five are the toy-landscape course that `flnotes demo` executes.
TEACHING = ("00_quickstart", "01_flat_vs_sharp", "02_client_landscapes", "03_mutation_regions",
            "04_toy_race", "21_flatness")
TOY_COURSE = TEACHING[:5]


def teaching_notebooks(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The toy-landscape notebooks (TOY_COURSE), in course order."""
    return [folder / f"{name}.ipynb" for name in TOY_COURSE]


def run_teaching_notebooks(out: Path, parameters: dict | None = None,
                           first: int | None = None) -> list[Path]:
    """Run each teaching notebook (``first``: the first N) headless into ``out``; return the
    executed copies."""
    pm = import_papermill()

    notebooks = teaching_notebooks()[:first]
    if not notebooks:
        print(f"no teaching notebooks found in {NOTEBOOK_DIR}")
        return []
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for nb in notebooks:
        target = out / nb.name
        print(f"== notebook {nb.name} -> {target}")
        pm.execute_notebook(str(nb), str(target), parameters=parameters or {},
                            cwd=str(out), progress_bar=False, kernel_name=current_kernel(),
                            kernel_manager_class=quiet_kernel_manager())
        done.append(target)
    return done


def copy_notebooks(dest: Path, force: bool = False) -> list[Path]:
    """Copy the notebook series (and its README) into ``dest`` to open in Jupyter; a file
    already there is kept unless ``force`` (a student's edits are not overwritten).

    Each copy is written whole or not at all (a temporary file in ``dest``, then renamed):
    a half-written notebook would be "kept" by the next call as if it were the student's.
    A copy that fails is one error naming the file in ``dest``; the next call copies it.
    """
    if not str(dest).strip() or "\0" in str(dest):
        # Path("") is the current folder: the series would land among whatever is there.
        raise ValueError(f"{str(dest)!r:.80} is not a folder's name; name the folder to copy "
                         "the notebooks into")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file, not a folder; name a folder to copy the "
                         "notebooks into")
    sources = sorted(NOTEBOOK_DIR.glob("*.ipynb")) + [NOTEBOOK_DIR / "README.md"]
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for source in sources:
        target = dest / source.name
        if target.exists() and not force:
            print(f"kept {target} (already there; --force replaces it)")
            continue
        _copy(source, target)
        copied.append(target)
    return copied


def _copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` atomically; a failed write is an error about the target
    (the package's own file is not what the user can fix)."""
    data = source.read_bytes()
    try:
        write_atomically(target, lambda f: f.write(data))
    except OSError as err:
        if err.errno in NO_SPACE:
            raise disk_full(target, "run the same command again: the files copied stay and "
                            "the others are copied") from None
        raise OSError(err.errno, err.strerror or str(err), str(target)) from None
