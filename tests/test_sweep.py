"""Sweeps: grid expansion, validation before running, resume, failures, papermill injection."""

import json
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from flnotes import sweep

REPO = Path(__file__).resolve().parent.parent
GRIDS = sorted((REPO / "sweeps").glob("*.yaml"))

# The cell writes a fake run folder (the format flnotes.sim.run writes) and counts executions.
BODY = """import json
from pathlib import Path
out = Path(output_dir)
with open(out / "executions.txt", "a") as f:
    f.write("x\\n")
if fail:
    raise RuntimeError(f"boom at x={x}")
for seed in seeds:
    run = out / "runs" / f"fedavg-seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    config = {"algorithm": "fedavg", "dataset": "cifar10", "model": "cnn", "partition": "iid",
              "seed": seed, "lr": lr, **extra}
    (run / "run.json").write_text(json.dumps({"config": config, "status": "completed"}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": x / 100}) + "\\n")
"""


@pytest.fixture
def notebook(tmp_path) -> Path:
    """A tiny notebook with a parameters cell, like the reproduction notebooks."""
    params = new_code_cell('x = 1\nlr = 0.1\nfail = False\nextra = {}\nseeds = [0]\n'
                           'output_dir = None')
    params.metadata["tags"] = ["parameters"]
    book = new_notebook(cells=[params, new_code_cell(BODY)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                   "language": "python"}
    path = tmp_path / "tiny.ipynb"
    nbformat.write(book, path)
    return path


def _grid(tmp_path: Path, spec: dict, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_expansion_crosses_axes_bundles_and_seeds(tmp_path, notebook):
    spec = {"notebook": notebook.name, "paper_table": "fedmut_table1",
            "labels": {"dataset": "CIFAR-10"}, "fixed": {"lr": 0.5},
            "grid": {"x": [1, 2, 3],
                     "heterogeneity": {"dir=0.1": {"lr": 0.2, "labels": {"model": "CNN"}},
                                       "iid": {"extra": {"partition": "iid"}}}},
            "seeds": [0, 1],
            "smoke": {"grid": {"x": [7]}, "seeds": [5]}}
    grid = sweep.load_grid(_grid(tmp_path, spec))
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
    smoke = sweep.load_grid(_grid(tmp_path, spec), smoke=True)
    assert sorted((c.parameters["x"], c.seed) for c in smoke.cells) == [(7, 5), (7, 5)]
    forced = sweep.load_grid(_grid(tmp_path, spec), overrides={"lr": 9.0})
    assert {c.parameters["lr"] for c in forced.cells} == {9.0}  # --set wins over everything


def test_preset_fields_fill_parameters_and_extra(tmp_path, notebook):
    from flnotes.presets import preset_values

    spec = {"notebook": str(notebook), "fixed": {"preset": "demo", "x": 4}}
    (cell,) = sweep.load_grid(_grid(tmp_path, spec)).cells
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
])
def test_bad_grids_fail_before_anything_runs(tmp_path, notebook, change, message):
    spec = {"notebook": notebook.name, "grid": {"x": [1, 2]}, "seeds": [0]}
    spec.update(change)
    path = _grid(tmp_path, spec)
    with pytest.raises(sweep.GridError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sweep.load_grid(path)
    out = tmp_path / "out"
    assert sweep.main([str(path), "--out", str(out)]) == 2
    assert not out.exists()  # nothing ran


def test_unknown_override_and_missing_smoke_section(tmp_path, notebook):
    path = _grid(tmp_path, {"notebook": notebook.name})
    with pytest.raises(sweep.GridError, match="'nope' \\(in --set\\)"):
        sweep.load_grid(path, overrides={"nope": 1})
    with pytest.raises(sweep.GridError, match="no 'smoke' section"):
        sweep.load_grid(path, smoke=True)


def test_device_slots_round_robin():
    assert sweep.device_slots(3) == [None, None, None]
    assert sweep.device_slots(5, gpu_count=2) == ["0", "1", "0", "1", "0"]
    assert sweep.device_slots(3, visible="4,6") == ["4", "6", "4"]


def test_run_records_failures_and_resumes(tmp_path, notebook):
    spec = {"notebook": notebook.name, "paper_table": "fedmut_table1",
            "labels": {"model": "CNN", "heterogeneity": "iid"},
            "grid": {"x": [40, 50], "fail": {"ok": {"fail": False}, "broken": {"fail": True}}},
            "seeds": [0]}
    grid = sweep.load_grid(_grid(tmp_path, spec))
    # Three cells: x = 40 and 50 that work, x = 40 that raises.
    grid.cells = [c for c in grid.cells if not (c.parameters["x"] == 50 and c.parameters["fail"])]
    out = tmp_path / "out"
    summary = sweep.run_sweep(grid, out, progress=False)
    status = dict(zip(summary["cell"], summary["status"], strict=True))
    assert sorted(status.values()) == ["completed", "completed", "failed"]
    failed = next(c for c in grid.cells if c.parameters["fail"])
    record = json.loads((out / "cells" / failed.id / "cell.json").read_text())
    assert record["status"] == "failed" and "boom at x=40" in record["error"]
    assert (out / "cells" / failed.id / "notebook.ipynb").exists()  # kept for debugging
    ok = summary[summary["status"] == "completed"].set_index("x")
    assert ok.loc["40", "acc_last10"] == 40.0 and ok.loc["50", "acc_last10"] == 50.0
    assert (out / "summary.csv").exists()

    # Re-run: completed cells are skipped, the failed one runs again (and fails again).
    again = sweep.run_sweep(grid, out, progress=False)
    assert sorted(again["status"]) == ["failed", "skipped (done)", "skipped (done)"]
    runs = {c.id: (out / "cells" / c.id / "executions.txt").read_text().count("x")
            for c in grid.cells}
    assert runs == {c.id: 2 if c.parameters["fail"] else 1 for c in grid.cells}


def test_shipped_grids_are_valid_in_both_variants():
    assert {g.stem for g in GRIDS} >= {"fedmut_table1", "fedmut_table2", "fedqp_tableI",
                                       "fedqp_tableII", "fml_table1", "fedup_table4",
                                       "fedup_table5"}
    from flnotes.tables import load_paper_table

    for path in GRIDS:
        paper = sweep.load_grid(path)
        smoke = sweep.load_grid(path, smoke=True)
        assert paper.paper_table == path.stem and len(smoke.cells) <= 6 < len(paper.cells)
        table = load_paper_table(path.stem)
        rows = set(zip(table["dataset"], table["model"], table["heterogeneity"], strict=True))
        for cell in paper.cells + smoke.cells:
            # Every cell (the smoke ones too) lands on a row of its paper table.
            key = tuple(cell.labels.get(k) for k in ("dataset", "model", "heterogeneity"))
            assert key in rows, (path.name, cell.id, key)


def test_reproduction_notebook_takes_injected_parameters(tmp_path):
    """Papermill injects smoke-size values into notebook 10; the run folder records them."""
    out = tmp_path / "cell"
    params = {"algorithms": "fedavg", "rounds": 1, "num_clients": 4, "clients_per_round": 2,
              "lr": 0.07, "data_options": {"num_train": 400, "num_test": 100},
              "extra": {"eval_every": 1, "weighting": "uniform"}, "seeds": [0]}
    record = sweep.run_cell(str(REPO / "notebooks" / "10_reproduce_cifar.ipynb"),
                            {"id": "c", "parameters": params, "labels": {}, "seed": 0},
                            str(out), {})
    assert record["status"] == "completed", record.get("error")
    config = json.loads((out / "runs" / "fedavg-seed0" / "config.json").read_text())
    assert (config["lr"], config["num_clients"], config["rounds"]) == (0.07, 4, 1)
    assert config["weighting"] == "uniform"
    assert len((out / "runs" / "fedavg-seed0" / "metrics.jsonl").read_text().splitlines()) == 1
