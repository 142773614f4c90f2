"""The package's layout: no import cycles, and no import that climbs the layers.

Read from the source with ``ast`` (every ``import``, at module level or inside a function),
so a lazy import that would close a cycle counts as much as a top-level one. Importing
``flnotes.a.b`` is an edge to that module only, not to the package ``flnotes.a``: a package's
``__init__`` that re-exports its submodules is not a cycle with them.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flnotes"

# Who may import whom, by top-level part of the module name (flnotes.<part>...). The layers,
# lowest first: messages, rng -> models, data -> algorithms, engine -> config -> toy, flatness,
# plots -> repro, flower -> cli. Each entry lists the parts a part must never import. flower
# (the methods on Flower, an optional extra) sits beside repro: it may use everything below
# it, and nothing imports it, so `import flnotes` never needs flwr.
FORBIDDEN = {
    "messages": {"*"},
    "rng": {"*"},
    "models": {"data", "algorithms", "engine", "config", "toy", "flatness", "plots", "repro",
               "flower", "cli"},
    "data": {"models", "algorithms", "engine", "config", "toy", "flatness", "plots", "repro",
             "flower", "cli"},
    "algorithms": {"config", "toy", "flatness", "plots", "repro", "flower", "cli"},
    "engine": {"config", "toy", "flatness", "plots", "repro", "flower", "cli"},
    "config": {"engine", "toy", "flatness", "plots", "repro", "flower", "cli"},
    "toy": {"repro", "flower", "cli"},
    "flatness": {"toy", "repro", "flower", "cli"},
    "plots": {"toy", "flatness", "repro", "flower", "cli"},
    "repro": {"toy", "flatness", "flower", "cli"},
    "flower": {"toy", "flatness", "plots", "repro", "cli"},
    "cli": {"flower"},
    # flnotes/__init__.py and __main__.py: the public face and `python -m flnotes` never
    # need flwr.
    "": {"flower"},
    "__main__": {"flower"},
}
# Modules allowed directly under flnotes/ (the issue's "about six"): the public face, the
# command-line entry, the lowest helpers, the architectures and the shared plots.
# fedavg_one_screen: the reading path, one file on purpose (FedAvg's loop on one screen)
TOP_LEVEL = {"__init__", "__main__", "messages", "rng", "models", "plots", "fedavg_one_screen"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the flnotes modules it imports (a name imported from a package that is a
    submodule counts as that submodule)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: use absolute imports"
                if not (node.module or "").startswith("flnotes"):
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("flnotes")}
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_climbs_the_layers():
    wrong = []
    for module, targets in import_graph().items():
        banned = FORBIDDEN.get(part(module), set())
        for target in targets:
            if part(target) != part(module) and ("*" in banned or part(target) in banned):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_few_modules_sit_directly_under_the_package():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"move {sorted(top - TOP_LEVEL)} into a subpackage"
    data = {"notebooks", "sweeps", "paper_tables"}  # shipped data, not code (no modules)
    for folder in PACKAGE.iterdir():
        if folder.is_dir() and folder.name not in {"__pycache__", *data}:
            assert (folder / "__init__.py").exists(), f"{folder.name}/ has no __init__.py"
    for name in data:  # a data folder holds no module a subpackage should hold
        modules = {p.name for p in (PACKAGE / name).glob("*.py")} - {"refresh_outputs.py"}
        assert not modules, f"{name}/ holds modules {sorted(modules)}"


def test_the_checks_catch_what_they_guard_against():
    """The checker itself: a made-up cycle and a made-up upward import are found."""
    assert find_cycle({"flnotes.a": {"flnotes.b"}, "flnotes.b": {"flnotes.c"},
                       "flnotes.c": {"flnotes.a"}}) == ["flnotes.a", "flnotes.b", "flnotes.c",
                                                        "flnotes.a"]
    assert find_cycle({"flnotes.a": {"flnotes.b"}, "flnotes.b": set()}) is None
    assert part("flnotes.engine.sim") == "engine" and part("flnotes") == ""
    assert "repro" in FORBIDDEN["engine"] and "engine" in FORBIDDEN["data"]
    # Nothing imports the optional Flower subpackage.
    assert all("flower" in banned or "*" in banned
               for part_name, banned in FORBIDDEN.items() if part_name != "flower")


@pytest.mark.parametrize("name", ["RunConfig", "run", "run_seeds", "History"])
def test_the_public_face_stays(name):
    import flnotes

    assert getattr(flnotes, name) is not None and name in flnotes.__all__


# engine and algorithms form one layer, meeting at documented modules only: the engine
# reaches strategies through the interface (algorithms.base) and the registry (algorithms),
# never a method's module; strategies use the engine's state arithmetic, the reference local
# step, the per-client store and the batched step (FML, FedGen), never the round loop.
ENGINE_READS_FROM_ALGORITHMS = {"flnotes.algorithms", "flnotes.algorithms.base"}
ALGORITHMS_READ_FROM_ENGINE = {"flnotes.engine.state", "flnotes.engine.train",
                               "flnotes.engine.client_state", "flnotes.engine.batched.schedule",
                               "flnotes.engine.batched.stacked"}


def test_engine_and_algorithms_meet_only_at_the_documented_modules():
    graph = import_graph()
    engine_to = {t for m, ts in graph.items() for t in ts
                 if part(m) == "engine" and part(t) == "algorithms"}
    algorithms_to = {t for m, ts in graph.items() for t in ts
                     if part(m) == "algorithms" and part(t) == "engine"}
    assert engine_to <= ENGINE_READS_FROM_ALGORITHMS, sorted(engine_to)
    assert algorithms_to <= ALGORITHMS_READ_FROM_ENGINE, sorted(algorithms_to)
    # and neither side reaches the other's internals through a module-level cycle
    assert find_cycle(graph) is None


def test_no_code_names_an_issue_number():
    """Code says why in its own words: an issue's number means nothing to a reader of the
    package (and the issue tracker is not shipped with it)."""
    pattern = re.compile(r"\b[Ii]ssues? ?#?\d+")
    found = [f"{path.relative_to(PACKAGE)}:{i}" for path in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


# An import sits inside a function only when importing it costs what most callers never need
# (a plotting, table or notebook library, an optional extra), and says so on its line or the
# line above. The package's own modules, the standard library and what `import flnotes`
# loads anyway belong at the top.
LOADED_ANYWAY = {*sys.stdlib_module_names, "flnotes", "torch", "numpy", "tqdm", "yaml"}
HEAVY_SUBMODULES = ("torch.utils.tensorboard",
                    # our own modules that load pandas or matplotlib at import
                    "flnotes.plots", "flnotes.cli.demo", "flnotes.repro.figures",
                    "flnotes.repro.results_page", "flnotes.repro.tables",
                    "flnotes.repro.paper_tables")


def unexplained_imports_in_functions(source: str) -> list[str]:
    """'line: module' for each import inside a function that is cheap or says no reason."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom):  # `from flnotes.repro import tables` too
                base = node.module or "flnotes"  # (relative: our own)
                modules = [f"{base}.{alias.name}" for alias in node.names]
            else:
                modules = [alias.name for alias in node.names]
            above = node.lineno - 2  # the line above the run of imports it stands in
            while above > 0 and lines[above].lstrip().startswith(("import ", "from ")):
                above -= 1
            said = any(_reason(text) for text in (lines[node.lineno - 1], lines[above]))
            for module in modules:
                cheap = (module.split(".")[0] in LOADED_ANYWAY
                         and not module.startswith(HEAVY_SUBMODULES))
                if cheap or not said:
                    found.append(f"{node.lineno}: {module}")
    return found


def _reason(line: str) -> bool:
    """Whether a line carries a comment in words (a bare ``# noqa: ...`` is no reason)."""
    comment = line.partition("#")[2].strip()
    return bool(comment) and not comment.startswith(("noqa", "type:"))


def test_imports_inside_functions_are_costly_ones_and_say_why():
    found = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             for line in unexplained_imports_in_functions(path.read_text())]
    assert not found, found
    made_up = ("def f():\n    import json  # why not\n    import pandas\n"
               "    import seaborn  # lazy: slow\n"
               "    from torch.utils.tensorboard import SummaryWriter  # optional\n"
               "    import scipy, os  # slow\n    import ray  # noqa: F401\n")
    assert unexplained_imports_in_functions(made_up) == [
        "2: json", "3: pandas", "6: os", "7: ray"]


def test_a_sweeps_workers_import_no_plotting_or_table_library():
    """A sweep's workers are spawned: each imports flnotes.__main__ (so the CLI) and the
    sweep module again, and runs one cell; pandas and matplotlib would cost each ~1 s."""
    code = ("import sys, flnotes.__main__, flnotes.repro.sweep; "
            "print(sorted({'pandas', 'matplotlib', 'papermill'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_package_names_no_path_of_the_machine_it_was_written_on():
    """flnotes/ (code, notebooks, grids) works in any clone or wheel: no /work/... or
    ../shared/... path of the workplace it was written in."""
    pattern = re.compile(r"/work/|\.\./shared|/tmp/data")
    found = [f"{path.relative_to(PACKAGE)}:{i}"
             for path in sorted(PACKAGE.rglob("*")) if path.suffix in (".py", ".ipynb", ".yaml")
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if pattern.search(line) and "image/png" not in line]
    assert not found, found
