"""Rebuild labextension/ from widget-state-extension/ (`make lab-extension`, maintainers only).

Needs node and npm (npm fetches @jupyterlab/builder into a temporary folder, never into the
repo). The built files are committed, so users and CI need neither. The builder is run on the
installed JupyterLab's own core package list (its staging/ folder), as `jupyter labextension
build` did before it began to look the list up online. labextension/source.sha256 records the
source it was built from (tests/test_packaging.py checks it is the current one).
"""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jupyterlab

HERE = Path(__file__).resolve().parent
SOURCE, BUILT = HERE / "widget-state-extension", HERE / "labextension"


def source_digest() -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "index.js"):
        digest.update((SOURCE / name).read_bytes())
    return digest.hexdigest()


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        shutil.copy(SOURCE / "index.js", work)
        package = json.loads((SOURCE / "package.json").read_text())
        package["jupyterlab"]["outputDir"] = "built"  # inside the temporary folder
        (work / "package.json").write_text(json.dumps(package, indent=2) + "\n")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=work,
                       check=True)
        core = Path(jupyterlab.__file__).parent / "staging"
        builder = work / "node_modules/@jupyterlab/builder/lib/build-labextension.js"
        subprocess.run(["node", str(builder), "--core-path", str(core), "."], cwd=work,
                       check=True, env={**os.environ, "NODE_ENV": "production"})
        shutil.rmtree(BUILT, ignore_errors=True)
        shutil.copytree(work / "built", BUILT)
    (BUILT / "source.sha256").write_text(source_digest() + "\n")
    print(f"built {BUILT} from {SOURCE}")


if __name__ == "__main__":
    main()
