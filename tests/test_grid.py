"""Sweep grids: expansion, presets, validation before anything runs, the shipped grids."""

from pathlib import Path

import pytest
from helpers import write_grid, write_notebook

from flnotes.cli.main import main as cli_main
from flnotes.data.options import data_option_problems
from flnotes.repro import grid as grids

REPO = Path(__file__).resolve().parent.parent
GRIDS = sorted((REPO / "sweeps").glob("*.yaml"))


@pytest.fixture
def notebook(tmp_path) -> Path:
    """The tiny notebook; grids only read its parameters cell."""
    return write_notebook(tmp_path)


def test_expansion_crosses_axes_bundles_and_seeds(tmp_path, notebook):
    spec = {"notebook": notebook.name, "paper_table": "fedmut_table1",
            "labels": {"dataset": "CIFAR-10"}, "fixed": {"lr": 0.5},
            "grid": {"x": [1, 2, 3],
                     "heterogeneity": {"dir=0.1": {"lr": 0.2, "labels": {"model": "CNN"}},
                                       "iid": {"extra": {"partition": "iid"}}}},
            "seeds": [0, 1],
            "smoke": {"grid": {"x": [7]}, "seeds": [5]}}
    grid = grids.load_grid(write_grid(tmp_path, spec))
    assert len(grid.cells) == 3 * 2 * 2 and grid.paper_table == "fedmut_table1"
    assert len({c.id for c in grid.cells}) == 12
    assert [c.seed for c in grid.cells[:6]] == [0] * 6  # seeds outermost
    by_key = {(c.parameters["x"], c.labels["heterogeneity"], c.seed): c for c in grid.cells}
    cell = by_key[2, "dir=0.1", 1]
    assert cell.parameters == {"lr": 0.2, "x": 2, "seeds": [1]}  # bundles win over fixed
    assert cell.labels == {"dataset": "CIFAR-10", "x": "2", "heterogeneity": "dir=0.1",
                           "model": "CNN"}
    assert by_key[3, "iid", 0].parameters == {"lr": 0.5, "x": 3, "extra": {"partition": "iid"},
                                              "seeds": [0]}
    smoke = grids.load_grid(write_grid(tmp_path, spec), smoke=True)
    assert sorted((c.parameters["x"], c.seed) for c in smoke.cells) == [(7, 5), (7, 5)]
    forced = grids.load_grid(write_grid(tmp_path, spec), overrides={"lr": 9.0})
    assert {c.parameters["lr"] for c in forced.cells} == {9.0}  # --set wins over everything


def test_preset_fields_fill_parameters_and_extra(tmp_path, notebook):
    from flnotes.config.presets import preset_values

    spec = {"notebook": str(notebook), "fixed": {"preset": "demo", "x": 4}}
    (cell,) = grids.load_grid(write_grid(tmp_path, spec)).cells
    demo = preset_values("demo")
    assert cell.parameters["lr"] == demo["lr"] and cell.parameters["x"] == 4
    # Preset fields the notebook has no parameter for go to 'extra'; 'algorithm' is dropped.
    expected_extra = {k: v for k, v in demo.items() if k not in {"lr", "algorithm"}}
    assert cell.parameters["extra"] == expected_extra


@pytest.mark.parametrize("change,message", [
    ({"fixed": {"lrr": 1}}, "parameter 'lrr' (in fixed) is not a parameter of tiny.ipynb"),
    ({"grid": {"y": [1, 2]}}, "parameter 'y' (in grid) is not a parameter"),
    ({"grid": {"h": {"a": {"zz": 1}}}}, "parameter 'zz' (in grid axis 'h')"),
    ({"grid": {"x": []}}, "grid axis 'x' must be a non-empty list"),
    ({"grid": {"h": {}}}, "grid axis 'h' is empty"),
    ({"grid": {"h": {"a": None}}}, "grid axis 'h', label 'a'"),
    ({"notebook": "nowhere.ipynb"}, "notebook 'nowhere.ipynb' not found"),
    ({"seeds": []}, "'seeds' must be a non-empty list of integers"),
    ({"fixed": {"output_dir": "/x"}}, "'output_dir' (in fixed) is set by the sweep itself"),
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"paper_table": "nope"}, "unknown paper_table 'nope'"),
    ({"fixed": {"preset": "no-such-preset"}}, "no-such-preset"),
    ({"stack_seeds": "yes"}, "'stack_seeds' must be true or false"),
    ({"grid": {"h": {"a": {"x": 1, "labels": 5}}}},
     "grid axis 'h', label 'a': 'labels' must map names to a text or a number each, got 5"),
    ({"labels": {"dataset": [1, 2]}}, "'labels' must map names to a text or a number each"),
    ({"notebook": "plain.txt"}, "is not a Jupyter notebook (Notebook does not appear to be JSON"),
])
def test_bad_grids_fail_before_anything_runs(tmp_path, notebook, change, message):
    (tmp_path / "plain.txt").write_text("not a notebook")
    spec = {"notebook": notebook.name, "grid": {"x": [1, 2]}, "seeds": [0]}
    spec.update(change)
    path = write_grid(tmp_path, spec)
    with pytest.raises(grids.GridError, match=message.replace("(", r"\(").replace(")", r"\)")):
        grids.load_grid(path)
    out = tmp_path / "out"
    assert cli_main(["sweep", str(path), "--out", str(out)]) == 2
    assert not out.exists()  # nothing ran


def test_stack_seeds_makes_one_cell_per_setting(tmp_path, notebook):
    spec = {"notebook": notebook.name, "grid": {"x": [1, 2]}, "seeds": [4, 0, 9],
            "stack_seeds": True, "smoke": {"seeds": [1], "stack_seeds": False}}
    grid = grids.load_grid(write_grid(tmp_path, spec))
    assert [c.parameters["seeds"] for c in grid.cells] == [[4, 0, 9], [4, 0, 9]]
    assert [(c.seed, c.seeds) for c in grid.cells] == [(4, [4, 0, 9])] * 2
    assert len({c.id for c in grid.cells}) == 2 and all("seed4+0+9" in c.id for c in grid.cells)
    unstacked = grids.load_grid(write_grid(tmp_path, {**spec, "stack_seeds": False}))
    assert sorted(c.parameters["seeds"] for c in unstacked.cells) == [[0], [0], [4], [4], [9], [9]]
    smoke = grids.load_grid(write_grid(tmp_path, spec), smoke=True)
    assert [c.parameters["seeds"] for c in smoke.cells] == [[1], [1]]
    forced = grids.load_grid(write_grid(tmp_path, {**spec, "stack_seeds": False}),
                             stack_seeds=True)  # the command line's --stack-seeds
    assert [c.seeds for c in forced.cells] == [[4, 0, 9]] * 2
    # A notebook that runs one `seed` cannot take a stack of them.
    one_seed = tmp_path / "one"
    one_seed.mkdir()
    book = write_notebook(one_seed)
    book.write_text(book.read_text().replace("seeds = [0]", "seed = 0"))
    with pytest.raises(grids.GridError, match="'stack_seeds' needs a notebook with a 'seeds'"):
        grids.load_grid(write_grid(one_seed, {**spec, "notebook": str(book)}))


def test_unknown_override_and_missing_smoke_section(tmp_path, notebook):
    path = write_grid(tmp_path, {"notebook": notebook.name})
    with pytest.raises(grids.GridError, match="'nope' \\(in --set\\)"):
        grids.load_grid(path, overrides={"nope": 1})
    # neither dropped silently: --set labels=5 (labels are the grid's), --set config=5
    with pytest.raises(grids.GridError, match="'labels' \\(in --set\\) label a grid's cells"):
        grids.load_grid(path, overrides={"labels": 5})
    with pytest.raises(grids.GridError, match="'config' \\(in --set\\) must be a mapping"):
        grids.load_grid(path, overrides={"config": 5})
    with pytest.raises(grids.GridError, match="no 'smoke' section"):
        grids.load_grid(path, smoke=True)


# The column heads of FedMR's Table 1 (Sec. 5.3; FedGen's cells stay "not run" until it lands).
FEDMR_TABLE1_METHODS = {"FedAvg", "FedProx", "FedGen", "CluSamp", "FedExP", "FedASAM", "FedMut",
                        "FedMR"}


def test_shipped_grids_are_valid_in_both_variants():
    assert {g.stem for g in GRIDS} >= {"fedmut_table1", "fedmut_table2", "fedqp_tableI",
                                       "fedqp_tableII", "fml_table1", "fedup_table4",
                                       "fedup_table5", "fedmr_table1"}
    from flnotes.repro.paper_tables import METHOD_LABELS, load_paper_table, paper_table_names

    # FedMR's Table 1 lost its numbers and its Dirichlet alphas in the source text: the CSV
    # keeps only the two values the prose quotes (keyed dir=?), so its cells cannot land on
    # rows; they must still key the table's structure (its datasets, models and methods).
    lost_settings = {"fedmr_table1"}

    for path in GRIDS:
        paper = grids.load_grid(path)
        smoke = grids.load_grid(path, smoke=True)
        assert len(smoke.cells) <= 6 < len(paper.cells)
        if path.stem.endswith("_figures") or path.stem not in paper_table_names():
            # A paper's figures, or a comparison no paper's table holds (the flat-minima
            # methods published since): no table rows to land on.
            assert paper.paper_table is None
        else:
            assert paper.paper_table == path.stem
            table = load_paper_table(path.stem)
            rows = set(zip(table["dataset"], table["model"], table["heterogeneity"],
                           strict=True))
            for cell in paper.cells + smoke.cells:
                # Every cell (the smoke ones too) lands on a row of its paper table.
                key = tuple(cell.labels.get(k) for k in ("dataset", "model", "heterogeneity"))
                if path.stem in lost_settings:
                    assert key[0] in {"CIFAR-10", "CIFAR-100", "FEMNIST"}, (cell.id, key)
                    assert key[1] in {"CNN", "ResNet-20", "VGG-16"}, (cell.id, key)
                    method = METHOD_LABELS[cell.parameters["algorithms"]]
                    assert method in FEDMR_TABLE1_METHODS, (cell.id, method)
                    continue
                assert key in rows, (path.name, cell.id, key)
        for cell in paper.cells:
            # The notebooks' default data_options are the synthetic task's sizes: a paper
            # cell names its own, and its dataset's loader takes them.
            options = cell.parameters.get("data_options")
            assert isinstance(options, dict), (path.name, cell.id)
            # (notebook 11 has no dataset parameter: it trains Shakespeare only)
            dataset = cell.parameters.get("dataset") or {
                "11_reproduce_shakespeare.ipynb": "shakespeare"}[paper.notebook.name]
            assert not list(data_option_problems(dataset, options)), (
                path.name, cell.id, options)


def test_fedup_figures_grid_runs_the_methods_each_figure_compares():
    """FedUp Sec. 6.3: Fig. 2 compares every Table 4 method but FedDyn, at 500 and 1020
    clients per round; Sec. 6.4: Fig. 3 compares FedUp with FedAvg only."""
    paper = grids.load_grid(REPO / "sweeps" / "fedup_figures.yaml")
    table4 = grids.load_grid(REPO / "sweeps" / "fedup_table4.yaml")
    table4_methods = {c.parameters["algorithms"] for c in table4.cells}
    runs: dict[tuple, set] = {}
    for cell in paper.cells:
        key = (cell.parameters["dataset"], cell.parameters["clients_per_round"])
        runs.setdefault(key, set()).add(cell.parameters["algorithms"])
    assert runs == {("femnist", 500): table4_methods - {"feddyn"},
                    ("femnist", 1020): table4_methods - {"feddyn"},
                    ("shakespeare", 14): {"fedavg", "fedup"}}
    assert len(table4_methods) == 10
