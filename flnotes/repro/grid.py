"""The YAML grid of a sweep: read, check against the notebook, expand into cells.

A grid file::

    notebook: notebooks/10_reproduce_cifar.ipynb  # relative to the grid, cwd or the repo
    paper_table: fedmut_table1       # optional: CSV in data/paper_tables the cells belong to
    labels: {dataset: CIFAR-10}      # optional: table labels shared by every cell
    fixed: {preset: fedmut-paper, rounds: 500}   # parameters of every cell
    grid:                            # axes crossed with each other
      algorithms: [fedavg, fedmut]   #   a parameter and its values (label = the value)
      heterogeneity:                 #   or labels -> bundles of parameters
        dir=0.1: {partition: dirichlet, dirichlet_alpha: 0.1}
        iid: {partition: iid}
        CIFAR-100/q=0.3: {dataset: cifar100, labels: {dataset: CIFAR-100}}  # more labels
    seeds: [0, 1, 2]                 # one cell per seed (injected as seeds=[s] or seed=s)
    stack_seeds: false               # true: one cell with seeds=[0, 1, 2], which the notebook
                                     #   runs stacked into one batched run (flnotes.engine.seeds)
    smoke: {fixed: {...}, grid: {...}, seeds: [0]}   # --smoke: overrides for a CPU check

Every other key is a RunConfig field by its name (any method's setting too: ``fedup_alpha:
0.03``), or one of the notebook's own parameters (``algorithms``, ``seeds``). A field the
notebook has a named parameter for is passed as that parameter; any other goes into the
notebook's one ``config`` dict (``extra`` in notebooks written before it; ``extra:`` or
``config:`` mappings in a grid are read as their keys, as grids wrote them before). A cell's
id hashes its settings flattened, so which of them a notebook names does not change it.
``preset`` (in fixed or in a bundle) expands to that preset's RunConfig fields
(``python -m flnotes presets NAME``) under everything set explicitly; the preset's
``algorithm`` is left to the grid.
``baselines: seed-code`` (in the grid or ``--set baselines=seed-code``) runs every baseline
as the seed papers' authors ran it (:func:`flnotes.config.presets.seed_code_baselines`, what
the ``*-official`` presets set) over each cell's preset; ``paper`` (the default) keeps each
baseline's own paper. ``tables`` marks the cells that ran the seed code's reading.
An axis's label is the cell's label for the axis name; the labels named dataset, model,
heterogeneity and method key the cell into the paper table (see flnotes.repro.tables).

Every parameter is checked against the notebook's parameters cell before anything runs
(:func:`load_grid`), and so is every cell's run: a key given twice in one mapping (YAML
itself would keep the last), a value or a seed listed twice, and a cell whose values
(``--set`` applied) RunConfig refuses, e.g. ``rounds: -3`` or ``--set lr=abc``, are each a
one-line GridError naming the key, the axis or the cell; ``sweep GRID --dry-run`` finds them
all before any kernel starts. flnotes.repro.sweep runs the cells.
"""

from __future__ import annotations

import ast  # the notebook defaults papermill reports, as literals
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flnotes.algorithms import algorithm_names, all_settings, settings_of
from flnotes.config import RunConfig, field_names, model_names
from flnotes.config.presets import (
    BASELINE_READING,
    SEED_REPOSITORY,
    preset_values,
    seed_code_baselines,
)
from flnotes.config.yaml_text import DuplicateKey, read_yaml
from flnotes.data.registry import dataset_names
from flnotes.messages import did_you_mean, one_line
from flnotes.repro import PACKAGE_DIR, SWEEP_DIR
from flnotes.repro.kernel import import_papermill

GRID_KEYS = {"name", "notebook", "paper_table", "labels", "fixed", "grid", "seeds", "smoke",
             "description", "stack_seeds"}
SMOKE_KEYS = {"fixed", "grid", "seeds", "labels", "stack_seeds"}
RESERVED = {"output_dir", "seeds", "seed"}  # set by the sweep itself
PSEUDO = {"preset", "labels", "baselines"}  # grid keys that are not notebook parameters
CATCH_ALL = ("config", "extra")  # a notebook's dict for any RunConfig field (extra: before)
# Notebook parameters renamed since cells were run (old name -> new), for cell.json files
# written before: notebook 12's list of Fig. 5 personal models is not RunConfig's field.
RENAMED = {"personal_models": "fig5_personal_models"}
BASELINE_READINGS = ("paper", "seed-code")  # the grid key baselines: whose reading to run
LOCATION_PARAMETERS = {"data_dir", "threads", "device"}  # left out of a cell's id


class GridError(ValueError):
    """A grid file that cannot run; the message lists every problem found."""


@dataclass
class Cell:
    """One notebook execution: parameters, table labels and its folder name."""
    id: str
    parameters: dict[str, Any]
    labels: dict[str, str]
    seed: int  # the cell's (first) seed
    seeds: list[int] = field(default_factory=list)  # every seed it runs (stack_seeds: several)


@dataclass
class Grid:
    """A validated grid file (one variant: paper scale or smoke)."""
    name: str
    path: Path
    notebook: Path
    variant: str
    cells: list[Cell] = field(default_factory=list)
    paper_table: str | None = None


def find_notebook(name: str, grid_path: Path) -> Path | None:
    """The notebook path: as given, or relative to the grid file, the cwd or the package
    (where ``notebooks/`` ships: a grid's ``notebook: notebooks/10_reproduce_cifar.ipynb``
    finds it in a clone and in an installed wheel alike)."""
    candidates = [Path(name)] if Path(name).is_absolute() else [
        grid_path.parent / name, Path.cwd() / name, PACKAGE_DIR / name]
    if grid_path.resolve().parent == SWEEP_DIR.resolve():  # a shipped grid: its own notebook,
        candidates.insert(0, PACKAGE_DIR / name)  # not a copy that happens to lie in the cwd
    return next((c.resolve() for c in candidates if c.is_file()), None)


def shipped_grids() -> dict[str, Path]:
    """The grids that ship with flnotes (``flnotes/sweeps``), by name (file stem)."""
    return {p.stem: p for p in sorted(SWEEP_DIR.glob("*.yaml"))}


def grid_summary(path: Path, width: int = 90) -> str:
    """The start of a grid's opening comment (what it reproduces), for ``sweep --list``."""
    lines = itertools.takewhile(lambda line: line.startswith("#"), path.read_text().splitlines())
    text = " ".join(word for line in lines for word in line.lstrip("#").split())
    return text if len(text) <= width else text[:width - 3].rsplit(" ", 1)[0] + " ..."


def resolve_grid(name: str | Path) -> Path:
    """The grid file ``name`` means: a path to a file, or the name of a shipped grid
    (``fedmut_table1``, ``fedmut_table1.yaml`` or ``sweeps/fedmut_table1.yaml`` from any
    folder, installed from a wheel or not)."""
    path = Path(name)
    if path.is_file():
        return path
    if path.exists():
        raise GridError(f"grid {name} is {'a folder' if path.is_dir() else 'not a regular file'}"
                        ": give a YAML grid file")
    if path.suffix != ".yaml" and path.with_name(path.name + ".yaml").is_file():
        return path.with_name(path.name + ".yaml")  # your own NAME.yaml before a shipped NAME
    shipped = shipped_grids()
    stem = path.name.removesuffix(".yaml")
    # a bare name, or the clone's relative sweeps/NAME.yaml; never another folder's path
    if stem in shipped and (len(path.parts) == 1 or path.parts == ("sweeps", path.name)):
        return shipped[stem]
    if len(path.parts) > 1 and path.parts[:-1] != ("sweeps",):
        raise GridError(f"grid file {name} not found")
    raise GridError(f"grid {str(name)!r} not found: no such file, and no shipped grid of that "
                    f"name{did_you_mean(stem, list(shipped))} (python -m flnotes sweep --list)")


def notebook_parameters(notebook: Path) -> set[str]:
    """Names defined in the notebook's cell tagged 'parameters'."""
    return set(import_papermill().inspect_notebook(str(notebook)))


def load_grid(path: str | Path, smoke: bool = False, overrides: dict | None = None,
              stack_seeds: bool | None = None) -> Grid:
    """Read and check a grid file; raise GridError naming every problem before anything runs.

    ``overrides`` (command line ``--set KEY=VALUE``) win over every value of the grid, and
    ``stack_seeds`` (``--stack-seeds``), when not None, over the grid's ``stack_seeds``.
    """
    path = resolve_grid(path)
    try:
        spec = read_yaml(path.read_text()) or {}
    except DuplicateKey as err:
        raise GridError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise GridError(f"{path}: not valid YAML{where}: {one_line(err)}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise GridError(f"cannot read grid file {path}: {err}") from None
    if not isinstance(spec, dict):
        raise GridError(f"{path}: a grid file is a YAML mapping, got {type(spec).__name__}")
    problems = [f"unknown key {k!r} (allowed: {sorted(GRID_KEYS)})"
                for k in spec if k not in GRID_KEYS]
    fixed, axes, labels = (_mapping(spec, key, problems) for key in ("fixed", "grid", "labels"))
    seeds = spec.get("seeds", [0])
    stack = spec.get("stack_seeds", False)
    if smoke:
        over = spec.get("smoke")
        if not isinstance(over, dict):
            problems.append("--smoke asked but the grid has no 'smoke' section")
            over = {}
        problems += [f"unknown key 'smoke.{k}' (allowed: {sorted(SMOKE_KEYS)})"
                     for k in over if k not in SMOKE_KEYS]
        # an axis given here replaces the same axis
        for layer, key in ((fixed, "fixed"), (axes, "grid"), (labels, "labels")):
            layer.update(_mapping(over, key, problems, "smoke."))
        seeds = over.get("seeds", seeds)
        stack = over.get("stack_seeds", stack)
    if stack_seeds is not None:
        stack = stack_seeds
    notebook = find_notebook(str(spec.get("notebook", "")), path)
    if not spec.get("notebook"):
        problems.append("no 'notebook' given")
    elif notebook is None:
        problems.append(f"notebook {spec['notebook']!r} not found (looked beside the grid, in "
                        f"the current folder and in {PACKAGE_DIR})")
    elif (unread := _not_a_notebook(notebook)) is not None:
        problems.append(unread)
        notebook = None
    table = spec.get("paper_table")
    if table is not None:
        from flnotes.repro.paper_tables import paper_table_names  # lazy: pandas, not for workers
        if table not in paper_table_names():
            problems.append(f"unknown paper_table {table!r}; known: {paper_table_names()}")
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        problems.append(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    else:
        problems += [f"'seeds' lists {s} {n} times (each seed runs once)"
                     for s, n in _repeats(seeds).items()]
    if not isinstance(stack, bool):
        problems.append(f"'stack_seeds' must be true or false, got {stack!r}")
    elif stack and notebook is not None and "seeds" not in notebook_parameters(notebook):
        problems.append(f"'stack_seeds' needs a notebook with a 'seeds' parameter; "
                        f"{notebook.name} takes one 'seed'")
    problems += _axis_problems(axes) + _label_problems("'labels'", labels)
    overrides = dict(overrides or {})
    if notebook is not None:
        problems += _parameter_problems(notebook, fixed, axes, overrides)
    if problems:
        raise GridError(f"{path}: " + "; ".join(dict.fromkeys(problems)))
    grid = Grid(name=str(spec.get("name") or path.stem), path=path, notebook=notebook,
                variant="smoke" if smoke else "paper", paper_table=table)
    known = notebook_parameters(notebook)
    seed_parameter = "seeds" if "seeds" in known else "seed"
    try:
        grid.cells = expand(fixed, axes, seeds, labels, seed_parameter=seed_parameter,
                            known=known, overrides=overrides, stack_seeds=stack)
    except ValueError as err:  # an unknown preset, or preset fields with nowhere to go
        raise GridError(f"{path}: {err}") from err
    problems = ([p for cell in grid.cells for p in _name_problems(cell)]
                or _same_cells(grid.cells)
                or _config_problems(grid.cells, notebook, fixed, axes, overrides))
    if problems:
        raise GridError(f"{path}: " + "; ".join(dict.fromkeys(problems)))
    return grid


def _repeats(values: list) -> dict[str, int]:
    """Values listed more than once (as written, e.g. 0 or [1, 2]) -> how many times."""
    keys = [json.dumps(value, sort_keys=True, default=str) for value in values]
    return {key: keys.count(key) for key in keys if keys.count(key) > 1}


def _same_cells(cells: list[Cell]) -> list[str]:
    """Cells that would run the very same parameters (e.g. --set fixing a grid axis)."""
    first: dict[str, str] = {}
    problems = []
    for cell in cells:
        key = json.dumps(cell.parameters, sort_keys=True, default=str)
        if key in first:
            problems.append(f"cells {first[key]} and {cell.id} run the same parameters; "
                            "two folders of one run would count as two")
        first.setdefault(key, cell.id)
    return problems


# ---------------------------------------------------------------- each cell's RunConfig

def _notebook_defaults(notebook: Path) -> dict[str, Any]:
    """The parameters cell's values that are Python literals (name -> value)."""
    defaults = {}
    for name, info in import_papermill().inspect_notebook(str(notebook)).items():
        try:
            defaults[name] = ast.literal_eval(str(info.get("default")))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return defaults


def _cell_configs(parameters: dict, defaults: dict, fields: set[str]
                  ) -> tuple[list[dict], set[str]]:
    """The RunConfig values each run of a cell would get (one per algorithm): its settings
    over the notebook's defaults, by name; and the fields the notebook computes itself (None
    by default there, e.g. num_clients from the data)."""
    params = {**flat_settings(defaults), **flat_settings(parameters)}
    values = {k: v for k, v in params.items() if k in fields}
    # None that is the notebook's own default: the notebook fills it in (num_clients = every
    # role of the data) or means "the method's default"; RunConfig's default stands for it
    computed = {k for k, v in values.items() if v is None and defaults.get(k, 0) is None}
    for key in computed | {"seed", "seeds", "run_dir"}:
        values.pop(key, None)
    seeds = params.get("seeds")
    seed = seeds[0] if isinstance(seeds, list) and seeds else params.get("seed")
    if seed is not None:
        values["seed"] = seed
    algorithms = params.get("algorithms", params.get("algorithm"))
    if algorithms is None:
        return [values], computed
    algorithms = [algorithms] if isinstance(algorithms, str) else list(algorithms)
    return [{**values, "algorithm": a} for a in algorithms], computed


def _config_problems(cells: list[Cell], notebook: Path, fixed: dict, axes: dict,
                     overrides: dict) -> list[str]:
    """Each cell's runs through RunConfig (what the notebook would build), before anything
    runs: one line per problem, naming the first cell, where the value came from and
    RunConfig's message."""
    fields = set(field_names())  # common fields and every method's settings
    defaults = _notebook_defaults(notebook)
    checked: dict[str, str | None] = {}
    found: dict[tuple[str, str], list[str]] = {}
    for cell in cells:
        configs, computed = _cell_configs(cell.parameters, defaults, fields)
        for values in configs:
            key = json.dumps(values, sort_keys=True, default=str)
            if key not in checked:
                try:
                    RunConfig.from_dict(values)
                    checked[key] = None
                except (ValueError, TypeError) as err:
                    message = one_line(err)
                    # a check against a value the notebook computes (num_clients of the
                    # data): not known here
                    unknown = any(f"{name}=" in message for name in computed)
                    checked[key] = None if unknown else message
            if checked[key] is not None:
                origin = _origin(checked[key], cell, fixed, axes, overrides)
                found.setdefault((origin, checked[key]), []).append(cell.id)
    problems = []
    for (origin, message), ids in found.items():
        ids = list(dict.fromkeys(ids))
        more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
        problems.append(f"cell {ids[0]}{more}: {origin}{message}")
    return problems


def _origin(message: str, cell: Cell, fixed: dict, axes: dict, overrides: dict) -> str:
    """'rounds=-3 (in fixed): ' etc.: where the field RunConfig refuses was set."""
    match = re.match(r"RunConfig\.(\w+)=", message)
    if not match:
        return ""
    name = match.group(1)
    wanted = {name, "algorithms"} if name == "algorithm" else {name}

    def sets(layer) -> bool:
        return isinstance(layer, dict) and bool(wanted & set(flat_settings(layer)))

    if sets(overrides):
        return "set by --set: "
    for axis in reversed(list(axes)):
        values, label = axes[axis], cell.labels.get(axis)
        if isinstance(values, dict):
            if sets(values.get(label)):
                return f"set by grid axis {axis!r}, label {label!r}: "
        elif axis in wanted:
            return f"set by grid axis {axis!r}: "
    if sets(fixed):
        return "set in fixed: "
    return ""  # a preset's value or the notebook's default


def _mapping(spec: dict, key: str, problems: list[str], prefix: str = "") -> dict:
    """spec[key] as a dict ({} if absent); a problem if it is there but not a mapping."""
    value = spec.get(key)
    if value is not None and not isinstance(value, dict):
        problems.append(f"'{prefix}{key}' must be a mapping (name: value, ...), got {value!r}")
    return dict(value) if isinstance(value, dict) else {}


def _name_problems(cell: Cell) -> list[str]:
    """Algorithm, dataset and model names of a cell that no run could take: found before
    anything runs (``--dry-run`` included), not in the first cell that reaches them."""
    params = flat_settings(cell.parameters)
    problems = []
    for key, known in (("algorithm", algorithm_names), ("algorithms", algorithm_names),
                       ("dataset", dataset_names), ("model", model_names)):
        value = params.get(key)
        names = [] if value is None else value if isinstance(value, list) else [value]
        for name in (str(n).strip() for n in names):
            if name not in known():
                problems.append(f"unknown {key.rstrip('s')} {name!r} (in cell {cell.id})"
                                f"{did_you_mean(name, known())}; known: {known()}")
    return problems


def _label_problems(where: str, labels: Any) -> list[str]:
    """A table's labels must map names to a text or a number (a table's cell is named by
    them)."""
    if labels is None or isinstance(labels, dict) and all(
            isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in labels.values()):
        return []  # (None: "labels:" left empty, no labels)
    return [f"{where} must map names to a text or a number each, got {labels!r}"]


def _not_a_notebook(path: Path) -> str | None:
    """Why ``path`` cannot be run as a notebook, or None when it can be read as one."""
    import_papermill()  # it imports nbformat without jsonschema's slow checker (see there)
    import nbformat  # imported by papermill just now: no cost

    try:
        nbformat.read(str(path), as_version=4)
    except Exception as err:  # nbformat raises JSON, validation and OS errors alike
        return f"notebook {str(path)!r} is not a Jupyter notebook ({one_line(err)})"
    return None


def _axis_problems(axes: dict) -> list[str]:
    problems = []
    for name, values in axes.items():
        if isinstance(values, dict):
            if not values:
                problems.append(f"grid axis {name!r} is empty")
            bundles: dict[str, str] = {}
            for label, bundle in values.items():
                key = json.dumps(bundle, sort_keys=True, default=str)
                if not isinstance(bundle, dict) or not bundle:
                    problems.append(f"grid axis {name!r}, label {label!r}: expected a non-empty "
                                    f"mapping of parameters, got {bundle!r}")
                elif key in bundles:
                    problems.append(f"grid axis {name!r}: labels {bundles[key]!r} and {label!r} "
                                    "set the same parameters (the same runs twice)")
                elif "labels" in bundle:
                    problems += _label_problems(f"grid axis {name!r}, label {label!r}: 'labels'",
                                                bundle["labels"])
                bundles.setdefault(key, label)
        elif not isinstance(values, list) or not values:
            problems.append(f"grid axis {name!r} must be a non-empty list of values or a mapping "
                            f"label -> parameters, got {values!r}")
        else:
            problems += [f"grid axis {name!r} lists {value} {n} times (each value runs once)"
                         for value, n in _repeats(values).items()]
    return problems


def _parameter_problems(notebook: Path, fixed: dict, axes: dict, overrides: dict) -> list[str]:
    """Every key the grid sets must be a parameter of the notebook's parameters cell or, where
    the notebook has a catch-all dict for them, a RunConfig field."""
    own = notebook_parameters(notebook)
    # a notebook with a `config` dict takes RunConfig's fields by name; an older one's
    # `extra` dict takes anything
    fields = set(field_names()) if "config" in own else set()
    known = own | PSEUDO | fields | set(CATCH_ALL)
    used, layers = [], [(fixed, "fixed"), (overrides, "--set")] + [
        (bundle, f"grid axis {name!r}") for name, values in axes.items()
        if isinstance(values, dict) for bundle in values.values()]
    for layer, where in layers:
        if isinstance(layer, dict):
            used += [(k, where) for k in (flat_settings(layer) if fields else layer)]
    used += [(name, "grid") for name, values in axes.items() if not isinstance(values, dict)]
    problems = [f"parameter {k!r} (in {where}) is set by the sweep itself" for k, where in used
                if k in RESERVED]
    if "labels" in overrides:  # (expand reads the grid's labels; --set's would be dropped)
        problems.append("'labels' (in --set) label a grid's cells: set them in the grid file")
    problems += [f"'config' (in {where}) must be a mapping of RunConfig fields, got "
                 f"{layer['config']!r}" for layer, where in layers
                 if isinstance(layer, dict) and not isinstance(layer.get("config", {}), dict)]
    for key, where in used:
        if key not in known and key not in RESERVED:
            hint = did_you_mean(key, sorted((own | fields) - RESERVED - set(CATCH_ALL)))
            problems.append(f"{key!r} (in {where}) is neither a parameter of {notebook.name} "
                            f"nor a RunConfig field{hint}" if fields else
                            f"parameter {key!r} (in {where}) is not a parameter of "
                            f"{notebook.name}; its parameters are {sorted(own - RESERVED)}{hint}")
    if "output_dir" not in known:
        problems.append(f"{notebook.name} has no 'output_dir' parameter to put run folders in")
    if not known & {"seeds", "seed"}:
        problems.append(f"{notebook.name} has no 'seeds' or 'seed' parameter")
    return problems


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-") or "x"


def expand(fixed: dict, axes: dict, seeds: list[int], labels: dict | None = None,
           seed_parameter: str = "seeds", known: set[str] | None = None,
           overrides: dict | None = None, stack_seeds: bool = False) -> list[Cell]:
    """Cross the axes (seeds outermost, so every setting's first seed runs first).

    With ``stack_seeds`` every setting is one cell that runs all the seeds.
    """
    choices = [[(name, str(label), dict(b)) for label, b in values.items()]
               if isinstance(values, dict) else [(name, _label(v), {name: v}) for v in values]
               for name, values in axes.items()]
    cells = []
    for group in [list(seeds)] if stack_seeds else [[seed] for seed in seeds]:
        for combo in itertools.product(*choices):
            cell_labels = dict(labels or {})
            for axis, label, bundle in combo:
                cell_labels[axis] = label
                cell_labels.update(bundle.get("labels") or {})
            layers = [fixed, *(bundle for _, _, bundle in combo), overrides or {}]
            params = resolve_parameters(layers, known)
            params[seed_parameter] = group if seed_parameter == "seeds" else group[0]
            digest = hashlib.sha256(json.dumps(hashed_settings(params), sort_keys=True,
                                               default=str).encode())
            name = "_".join(_slug(label) for _, label, _ in combo)
            seed_tag = "seed" + "+".join(map(str, group))
            cell_id = f"{name + '_' if name else ''}{seed_tag}-{digest.hexdigest()[:8]}"
            cells.append(Cell(cell_id, params, cell_labels, group[0], group))
    return cells


def resolve_parameters(layers: list[dict], known: set[str] | None = None) -> dict[str, Any]:
    """Notebook parameters of a cell: its preset's fields, then each layer in order on top.

    A key the notebook has a parameter for (``known``; None: every key) is passed as that
    parameter, any other into its catch-all dict (``config``, or ``extra`` in a notebook
    written before it); a layer's ``config:`` or ``extra:`` mapping counts as its keys.
    """
    preset = next((layer["preset"] for layer in reversed(layers) if "preset" in layer), None)
    reading = next((layer["baselines"] for layer in reversed(layers) if "baselines" in layer),
                   BASELINE_READING.get(preset, "paper"))
    if reading not in BASELINE_READINGS:
        raise ValueError(f"baselines: {reading!r} is not one of {list(BASELINE_READINGS)} "
                         "(paper: each baseline's own paper; seed-code: as the seed papers' "
                         "authors ran them)")
    catch_all = next((name for name in CATCH_ALL if known is None or name in known), None)
    params: dict[str, Any] = {}
    rest: dict[str, Any] = {}

    def place(key: str, value: Any) -> None:
        if known is None or key in known:
            params[key] = value
            rest.pop(key, None)
        else:
            rest[key] = value

    if preset is not None or reading == "seed-code":
        values = preset_values(preset) if preset is not None else {}
        if reading == "seed-code":  # over the preset's values, under everything set explicitly
            # The seed code picks some values by the dataset a cell finally runs (FedGen's in
            # the FedMR repository), so that of the last layer naming one.
            dataset = next((layer["dataset"] for layer in reversed(layers)
                            if "dataset" in layer), values.get("dataset"))
            values.update(seed_code_baselines(dataset, SEED_REPOSITORY.get(preset) or "FedMR"))
        values.pop("algorithm", None)  # the grid chooses the methods
        for key, value in values.items():
            place(key, value)
    for layer in layers:
        for key, value in layer.items():
            if key in CATCH_ALL and isinstance(value, dict):
                for inner, inner_value in value.items():
                    place(inner, inner_value)
            elif key not in PSEUDO:
                place(key, value)
    if rest:
        if catch_all is None:
            raise ValueError(f"{sorted(rest)} have no notebook parameter to go to (and the "
                             "notebook has no 'config' parameter)")
        params[catch_all] = rest
    return params


def flat_settings(parameters: dict[str, Any], rename: bool = True) -> dict[str, Any]:
    """A cell's parameters with its catch-all dict's keys at the top (and, with ``rename``,
    notebook 12's old parameter names renamed): the same settings compare equal however a
    notebook names them."""
    flat = {k: v for k, v in parameters.items() if k not in CATCH_ALL}
    for name in CATCH_ALL:
        inner = parameters.get(name)
        if isinstance(inner, dict):
            flat.update({k: v for k, v in inner.items() if k not in flat})
    for old, new in RENAMED.items() if rename else ():
        if isinstance(flat.get(old), list) and new not in flat:  # the list, not RunConfig's text
            flat[new] = flat.pop(old)
    return flat


def hashed_settings(parameters: dict[str, Any]) -> dict[str, Any]:
    """What a cell's id hashes: its flat settings without where the data lie and the threads
    (a sweep continued from another machine or clone keeps its ids), the sweep's own keys,
    and the method settings none of its algorithms read (an *-official preset's seed-code
    FedGen settings in a FedAvg cell would change an id and nothing a cell runs)."""
    flat = flat_settings(parameters, rename=False)
    values = {k: v for k, v in flat.items() if k not in LOCATION_PARAMETERS and k != "output_dir"}
    algorithms = flat.get("algorithms", flat.get("algorithm"))
    names = [algorithms] if isinstance(algorithms, str) else algorithms
    # unknown algorithms (or none) leave the values as they are (the grid's checks name them)
    if names is not None and all(isinstance(n, str) and n in algorithm_names() for n in names):
        read = {s for n in names for s in settings_of(n)}
        declared = all_settings()
        values = {k: v for k, v in values.items() if k not in declared or k in read}
    # renamed after: an old name that is also a method's setting went where that method ran
    return flat_settings(values)


def _label(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)
