"""flnotes as a researcher installs it. The wheel is built from the source, installed
into a fresh virtual environment (not editable, run from a folder that is not the repository)
and its commands find the notebooks, grids and paper tables it carries.

The venv sees this interpreter's packages (``--system-site-packages``: torch, Jupyter, ...,
which pip would otherwise fetch for minutes) but its own flnotes comes first; the test checks
that the flnotes it runs is the wheel's.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import flnotes

SOURCE = Path(flnotes.__file__).resolve().parents[1]


def _copy_source(dest: Path) -> Path:
    """The files a wheel is built from, without build leftovers (a stale build/ folder in a
    working copy would otherwise leak into the wheel)."""
    if not (SOURCE / "pyproject.toml").is_file():
        pytest.skip("flnotes is installed, not a source checkout: no wheel to build")
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(SOURCE / name, dest / name)
    shutil.copytree(SOURCE / "jupyter-config", dest / "jupyter-config")
    shutil.copytree(SOURCE / "flnotes", dest / "flnotes",
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "runs"))
    return dest


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """flnotes' wheel, built from the source."""
    root = tmp_path_factory.mktemp("build")
    source = _copy_source(root / "source")
    # Without build isolation where this interpreter has setuptools >= 64 (quick, offline);
    # else pip fetches it into an isolated build environment (a fresh Python 3.12 venv has none).
    try:
        isolation = (["--no-build-isolation"]
                     if int(version("setuptools").split(".")[0]) >= 64 else [])
    except (PackageNotFoundError, ValueError):  # not installed, or an odd version string
        isolation = []
    subprocess.run([*PIP, "wheel", str(source), "--no-deps", *isolation,
                    "-w", str(root / "dist")], check=True, cwd=root)
    return next((root / "dist").glob("flnotes-*.whl"))


def _needs_own_pip() -> bool:
    """pip >= 22.3 installs into another environment (--python); an older one needs its own
    copy in the venv (ensurepip, a few seconds more)."""
    return tuple(int(p) for p in version("pip").split(".")[:2] if p.isdigit()) < (22, 3)


def _installer(python: Path) -> list[str]:
    """pip for the venv of ``python``."""
    return ([str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
            if _needs_own_pip() else [*PIP, "--python", str(python)])


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    """(flnotes command, its environment, a work folder) of a fresh venv with the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    venv.EnvBuilder(system_site_packages=True, with_pip=_needs_own_pip()).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    installer = _installer(python)
    # --ignore-installed: into the venv, whatever flnotes the outer interpreter holds
    subprocess.run([*installer, "install", "--no-deps", "--no-index", "--ignore-installed",
                    str(wheel)], check=True, cwd=root)
    assert (root / "venv" / "bin" / "flnotes").is_file(), "pip did not install the wheel"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PATH=f"{root / 'venv' / 'bin'}{os.pathsep}{env['PATH']}")
    work = root / "work"
    work.mkdir()
    return root / "venv" / "bin" / "flnotes", env, work


def _run(installed, *args, timeout=300):
    command, env, work = installed
    done = subprocess.run([str(command), *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "\r" not in done.stderr  # no progress bar redrawn into a captured log
    return done.stdout


def test_the_wheel_carries_its_data_and_runs_from_the_venv(installed):
    command, env, work = installed
    where = subprocess.run([str(command.parent / "python"), "-c",
                            "import flnotes.repro as r; print(r.PACKAGE_DIR, r.REPO_ROOT)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True)
    package, repo = where.stdout.split()
    assert Path(package).is_relative_to(command.parents[1]) and repo == "None"
    assert {p.name for p in (Path(package) / "notebooks").glob("*.ipynb")} == {
        p.name for p in (SOURCE / "flnotes" / "notebooks").glob("*.ipynb")}
    # notebook 04's default race ships too (else its first table takes minutes)
    shipped = Path(package) / "toy" / "shipped_races.json.gz"
    assert shipped.read_bytes() == (SOURCE / "flnotes" / "toy" / shipped.name).read_bytes()


def test_demo_quick_finds_the_notebooks(installed):
    out = _run(installed, "demo", "--quick", "--out", "demo")
    demo = installed[2] / "demo"
    assert (demo / "learning_curve.png").is_file()
    assert (demo / "notebooks" / "00_quickstart.ipynb").is_file(), out


def test_sweep_by_name_and_tables_on_a_smoke_sweep(installed):
    listed = _run(installed, "sweep", "fml_table1", "--smoke", "--dry-run")
    cells = [line.split()[0] for line in listed.splitlines() if "_fedavg_" in line]
    assert "2 cells, notebook" in listed and len(cells) == 1
    summary = _run(installed, "sweep", "fml_table1", "--smoke", "--only", cells[0],
                   "--out", "smoke")
    ours = re.search(rf"{cells[0]} .* completed +[\d.]+ +([\d.]+)", summary)
    table = _run(installed, "tables", "smoke", "--table", "fml_table1")
    # the paper's FedAvg cell (CIFAR-10, CNN1, shards-3) with this run's accuracy beside it
    cell = re.search(r"CNN1 +iid[^\n]*\n[^\n]*\n[^\n]*\n +shards-3 +([\d.]+) / ([\d.]+)\*",
                     table)
    assert ours and cell, summary + table
    assert cell.group(2) == ours.group(1)
    paper = (SOURCE / "flnotes" / "paper_tables" / "fml_table1.csv").read_text()
    assert f"CIFAR-10,CNN1,shards-3,FedAvg,{cell.group(1)}," in paper


def test_notebooks_command_copies_the_series(installed):
    _run(installed, "notebooks", "course")
    copied = {p.name for p in (installed[2] / "course").glob("*.ipynb")}
    assert copied == {p.name for p in (SOURCE / "flnotes" / "notebooks").glob("*.ipynb")}


def test_the_wheel_installs_jupyterlabs_widget_state_default(installed):
    """The wheel puts its JupyterLab default (save the explorers' widget state, so a reopened
    copy shows no widget error) in the venv's JupyterLab settings/overrides.d, where a
    JupyterLab installed in that venv reads it (tests/test_packaging.py checks the reading)."""
    command, _, _ = installed
    prefix = command.parents[1]
    placed = prefix / "share/jupyter/lab/settings/overrides.d/flnotes-widget-state.json"
    assert placed.is_file(), "the wheel did not install its JupyterLab default"
    source = SOURCE / "jupyter-config" / "flnotes-widget-state.json"
    assert json.loads(placed.read_text()) == json.loads(source.read_text())


def test_the_wheel_installs_the_widget_state_extension(installed):
    """The wheel puts flnotes' prebuilt JupyterLab extension (a restored widget state does
    not mark the notebook unsaved) where a JupyterLab in that venv finds it: its package.json
    and every static file it loads, as built."""
    command, _, _ = installed
    placed = command.parents[1] / "share/jupyter/labextensions/flnotes-widget-state"
    built = SOURCE / "jupyter-config" / "labextension"
    package = json.loads((placed / "package.json").read_text())
    assert package == json.loads((built / "package.json").read_text())
    assert (placed / package["jupyterlab"]["_build"]["load"]).is_file()
    assert sorted(p.name for p in (placed / "static").iterdir()) == \
        sorted(p.name for p in (built / "static").iterdir())


def _stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel named like PyTorch's CPU builds (``+cpu``) holding an empty package: what pip
    sees of an installed CPU-only torch, without its few hundred MB."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: flnotes-test\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_the_readmes_cpu_only_install_keeps_the_cpu_torch(tmp_path, wheel):
    """The README's CPU-only path: PyTorch's CPU wheels first (torch 2.14.1+cpu, torchvision
    0.29.1+cpu), then the wheel with its dependencies. pip must keep both: nothing of torch,
    torchvision or NVIDIA's libraries in what it would install (a dry run over the package
    index; the CPU builds are stand-ins with the same names and versions)."""
    readme = (SOURCE / "README.md").read_text()
    pins = re.search(r"pip install torch==(\S+) torchvision==(\S+) --index-url \S+/whl/cpu",
                     readme)
    assert pins, "the README's CPU-only install line changed: update this test"
    torch_version, vision_version = pins.groups()
    venv.EnvBuilder(with_pip=_needs_own_pip()).create(tmp_path / "venv")
    installer = _installer(tmp_path / "venv" / "bin" / "python")
    # Without PYTHONPATH and away from the checkout: a source folder that pip can see holds
    # flnotes.egg-info, so pip would take flnotes as installed already and plan nothing (the
    # CI run of 2026-11-28 failed so).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    stand_ins = [_stand_in_wheel(tmp_path, "torch", f"{torch_version}+cpu"),
                 _stand_in_wheel(tmp_path, "torchvision", f"{vision_version}+cpu")]
    subprocess.run([*installer, "install", "--no-deps", "--no-index", *map(str, stand_ins)],
                   check=True, env=env, cwd=tmp_path)
    report = tmp_path / "report.json"
    subprocess.run([*installer, "install", "--dry-run", "--report", str(report), str(wheel)],
                   check=True, timeout=600, env=env, cwd=tmp_path)
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "flnotes" in planned, f"pip plans no flnotes: it sees one installed ({planned})"
    replaced = sorted(n for n in planned
                      if n in ("torch", "torchvision") or n.startswith("nvidia-"))
    assert not replaced, f"pip would replace the CPU torch: {replaced}"
