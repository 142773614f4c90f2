"""The results page (flnotes.repro.results_page) on a synthetic sweep output laid out like
results/cifar10-lenet: its numbers against a hand computation from the metrics files, the
papers' cells beside them, the generated reading, and the same page when regenerated."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from flnotes.cli.main import main as cli_main
from flnotes.repro import results_page
from flnotes.repro.evidence import STUDIES as STUDY_NAMES
from flnotes.repro.figures import Run, load_runs

ROUNDS = 200
# accuracy of (setting, method, seed) at round r: 0.2 + r/1000 + seed/200 + OFFSET
OFFSET = {("dir=0.1", "fedavg"): (0.0, 0.0), ("dir=0.1", "fedmut"): (0.02, 0.03),
          ("dir=0.1", "fedqp"): (0.01, -0.03), ("iid", "fedavg"): (0.0, 0.0),
          ("iid", "fedmut"): (-0.01, -0.02), ("iid", "fedqp"): (0.01, 0.02)}
STOPPED = ("iid", "fedqp", 1)  # a run still going: 110 of its 200 rounds
OURS, DIFFERENCES = "Our test accuracy", "Differences to FedAvg, beside the papers'"
PAPERS = "The papers' cells beside our final accuracy"
LABEL = {"fedavg": "FedAvg", "fedmut": "FedMut", "fedqp": "FedQP"}


def accuracy(setting: str, method: str, seed: int, r: int) -> float:
    return 0.2 + r / 1000 + seed / 200 + OFFSET[setting, method][seed]


@pytest.fixture
def results(tmp_path) -> Path:
    """tmp/results/evidence/cells/<cell-id>/runs/<alg>/seed<N>/ + cell.json, like a sweep."""
    root = tmp_path / "results" / "evidence"
    for (setting, method), _ in OFFSET.items():
        for seed in (0, 1):
            cell = root / "cells" / f"{setting}_{LABEL[method]}_seed{seed}-0000000{seed}"
            run_dir = cell / "runs" / method / f"seed{seed}"
            run_dir.mkdir(parents=True)
            last = 110 if (setting, method, seed) == STOPPED else ROUNDS
            config = {"algorithm": method, "dataset": "cifar10", "model": "lenet-cifar",
                      "partition": "iid" if setting == "iid" else "dirichlet",
                      "dirichlet_alpha": 0.1, "rounds": ROUNDS, "seed": seed,
                      "eval_every": 5, "run_dir": str(run_dir)}
            (run_dir / "config.json").write_text(json.dumps(config))
            (run_dir / "run.json").write_text(json.dumps(
                {"config": config, "status": "running" if last < ROUNDS else "completed"}))
            rows = [{"round": r, "train_loss": 1.0,
                     **({"accuracy": accuracy(setting, method, seed, r), "loss": 1.5}
                        if r % 5 == 0 else {})} for r in range(1, last + 1)]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (cell / "cell.json").write_text(json.dumps(
                {"paper_table": "fedmut_table1", "labels": {
                    "dataset": "CIFAR-10", "model": "CNN", "heterogeneity": setting,
                    "method": LABEL[method]}, "status": "completed"}))
    return root


def read_accuracies(root: Path, setting: str, method: str) -> dict[int, dict[int, float]]:
    """seed -> round -> accuracy (%), straight from the metrics files."""
    out = {}
    for file in root.glob(f"cells/{setting}_*/runs/{method}/seed*/metrics.jsonl"):
        rows = [json.loads(line) for line in file.read_text().splitlines()]
        out[int(file.parent.name[4:])] = {r["round"]: 100 * r["accuracy"] for r in rows
                                          if "accuracy" in r}
    return out


def by_hand(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f}"


def row_of(page: str, section: str, *cells: str) -> str:
    """The table row starting with ``cells`` in the section headed ``## section``."""
    part = page.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in part.splitlines()
              if line.startswith("| " + " | ".join(cells) + " |")]
    return row


def test_page_numbers_match_the_metrics_files(results):
    page, png = results_page.build_page(results)
    assert page == results.parent / "evidence.md" and png.name == "evidence-curves.png"
    assert png.stat().st_size > 0
    text = page.read_text()
    assert "](evidence-curves.png)" in text
    for head in ("| dataset |",):  # every table's separator has as many columns as its head
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(head):
                assert lines[i + 1].count("|") == line.count("|"), line
    for setting in ("dir=0.1", "iid"):
        for method in ("fedavg", "fedmut", "fedqp"):
            seeds = read_accuracies(results, setting, method)
            row = row_of(text, OURS, "CIFAR-10", "CNN", setting, LABEL[method])
            cells = [c.strip() for c in row.strip("|").split("|")]
            for column, r in zip(cells[6:10], (50, 100, 150, 200), strict=True):
                reached = [acc[r] for acc in seeds.values() if max(acc) >= r]
                expected = by_hand(reached) if reached else "—"
                if 0 < len(reached) < len(seeds):
                    expected += f" ({len(reached)} of {len(seeds)} seeds)"
                assert column == expected, (setting, method, r)
            finals = [acc[max(acc)] for acc in seeds.values()]
            assert cells[10].startswith(by_hand(finals))
    # Literal values: FedAvg dir=0.1 at round 50 is 25.00 (seed 0) and 25.50 (seed 1).
    assert "| 25.25 ± 0.35 |" in row_of(text, OURS, "CIFAR-10", "CNN", "dir=0.1", "FedAvg")
    # The run still going: 110 rounds, nothing at 150 and 200 for its seed.
    stopped = row_of(text, OURS, "CIFAR-10", "CNN", "iid", "FedQP")
    assert "| 200, 110 / 200 |" in stopped and "(rounds 110-200) |" in stopped
    assert "| 36.00 (1 of 2 seeds) | 41.00 (1 of 2 seeds) |" in stopped
    assert "- progress: 11 of 12 runs completed; the shortest has 110 rounds" in text


def test_differences_beside_the_papers(results):
    page, _ = results_page.build_page(results)
    text = page.read_text()
    mut = row_of(text, DIFFERENCES, "CIFAR-10", "CNN", "dir=0.1", "FedMut − FedAvg")
    # The offsets are constant over rounds, so each seed's late difference is its offset:
    # +2.00 and +3.00, ahead at all 10 evaluations of rounds 155-200; spread 1.00, both above
    # it: holds. FedMut Table 1: 51.25 - 47.93 = +3.32
    assert "| +2.50 ± 0.71 | 0: +2.00, 10/10; 1: +3.00, 10/10 | holds | +3.32 |" in mut
    assert "FedMut 51.25, FedAvg 47.93 (fedmut_table1)" in mut
    qp = row_of(text, DIFFERENCES, "CIFAR-10", "CNN", "iid", "FedQP − FedAvg")
    # seed 1's FedQP stopped at 110: its window is the last 6 of the 22 evaluations both runs
    # have (rounds 85-110); +1.00 and +2.00 differ by 1.00, not less than the smaller lead:
    # cannot tell. FedQP Table I iid: 61.15 - 57.46 = +3.69
    assert "| +1.50 ± 0.71 | 0: +1.00, 10/10; 1: +2.00, 6/6 | cannot tell | +3.69 |" in qp
    papers = row_of(text, PAPERS, "CIFAR-10", "CNN", "dir=0.1", "FedQP")
    assert papers.endswith("| — | 53.04 |")  # FedMut Table 1 has no FedQP column
    # a table with no cell for these settings (FedMR Table 1 has no CNN cells) has no column
    head = [line for line in text.split(f"## {PAPERS}\n", 1)[1].splitlines() if line][0]
    assert head.endswith("| fedmut_table1 | fedqp_tableI |")
    reading = text.split("## Reading")[1]
    assert ("CIFAR-10, CNN, dir=0.1: FedMut > FedAvg holds: every seed leads by more than the "
            "seeds' spread (1.00). Mean over the last 10 evaluations (rounds 155-200) of FedMut "
            "minus FedAvg, per seed: seed 0 +2.00, ahead at 10 of 10; seed 1 +3.00, ahead at 10 "
            "of 10. The paper's difference is +3.32, ours +2.50.") in reading
    # iid FedMut: -1.00 and -2.00, spread 1.00: -1.00 is not below -1.00, so not "does not
    # hold" either
    assert ("CIFAR-10, CNN, iid: FedMut > FedAvg cannot tell: the seeds agree on the sign but "
            "differ by 1.00, not less than the smallest difference in size (1.00)") in reading
    assert "CIFAR-10, CNN, dir=0.1: FedQP > FedAvg cannot tell: the seeds disagree on the sign" \
        in reading  # +1.00 and -3.00
    # accuracy rises 1/1000 a round: +5 points from one 50-round window to the next, and the
    # last window's evaluations (rounds 155-200) span 4.5 points
    assert ("CIFAR-10, CNN, dir=0.1: mean accuracy of the last 50 rounds against the 50 "
            "before: FedAvg +5.0 points (its last 50 rounds range over 4.5)") in reading


def test_regenerating_gives_the_same_page(results, tmp_path, capsys):
    page, png = results_page.build_page(results)
    assert page == results.parent / "evidence.md"  # FOLDER.md beside the folder
    first, picture = page.read_text(), png.read_bytes()
    other = tmp_path / "again" / "README.md"
    assert cli_main(["results-page", str(results), "--out", str(other)]) == 0
    # the same page, but for the command in its header, which names the --out it was given
    header = f"results-page {results} --out {other}` from the run folders"
    assert header in other.read_text() and header not in first
    assert other.read_text().replace(f" --out {other}", "") == first
    assert (other.parent / "evidence-curves.png").read_bytes() == picture
    # the reading rule's picture beside it, shown under the differences' table, the same too
    dots = results_page.readings_png(png)
    assert dots.name == "evidence-readings.png" and f"]({dots.name})" in first
    assert (other.parent / dots.name).read_bytes() == dots.read_bytes()
    assert first.index(f"]({dots.name})") > first.index("## Differences to FedAvg")
    results_page.build_page(results)
    assert page.read_text() == first


def test_a_file_no_results_page_wrote_is_not_overwritten(results, capsys):
    """The page goes beside the folder by default; a user's own file there (or at --out) is
    an error that leaves it as it was, while a page results-page wrote is rewritten."""
    mine = results.parent / "README.md"
    mine.write_text("# my notes\n")
    page, _ = results_page.build_page(results)
    assert page.name == "evidence.md" and mine.read_text() == "# my notes\n"
    assert cli_main(["results-page", str(results), "--out", str(mine)]) == 2
    assert f"{mine} exists and no results-page wrote it" in capsys.readouterr().err
    assert mine.read_text() == "# my notes\n"
    page.write_text(page.read_text().replace("## Reading", "## Edited"))
    assert "## Edited" not in results_page.build_page(results)[0].read_text()


def test_settings_section_names_the_command_that_makes_the_runs(results):
    """A cell's grid is named as the sweep command takes it (a shipped grid by name, with
    --smoke for its smoke variant); a data folder is asked for only where a run reads one;
    smoke runs say they are smoke runs."""
    from flnotes.repro import SWEEP_DIR

    for info in results.glob("cells/*/cell.json"):
        info.write_text(json.dumps(dict(json.loads(info.read_text()),
                                        grid_file="benchmarks/evidence.yaml", variant="paper")))
    text = results_page.build_page(results)[0].read_text()
    assert (f"`python -m flnotes sweep benchmarks/evidence.yaml --set data_dir=DIR --out "
            f"{results} --workers 1` (DIR: the dataset's folder)") in text
    assert "Smoke runs" not in text
    for info in results.glob("cells/*/cell.json"):
        info.write_text(json.dumps(dict(json.loads(info.read_text()), variant="smoke",
                                        grid_file=str(SWEEP_DIR / "fedmut_table1.yaml"))))
    for file in results.glob("cells/*/runs/*/seed*/config.json"):
        config = dict(json.loads(file.read_text()), dataset="synthetic", model="mlp")
        file.write_text(json.dumps(config))
        meta = json.loads((file.parent / "run.json").read_text())
        (file.parent / "run.json").write_text(json.dumps(dict(meta, config=config)))
    text = results_page.build_page(results)[0].read_text()
    assert (f"`python -m flnotes sweep fedmut_table1 --smoke --out {results} --workers 1`; it "
            "skips") in text
    assert ("**Smoke runs** (12 of 12): the grid's smoke variant (dataset synthetic, model mlp, "
            "rounds 200) under the labels") in text


def test_a_folder_with_no_method_beside_fedavg_has_no_readings_picture(results):
    """Only FedAvg runs: nothing to read, so no picture (and none left from an earlier page
    of the same folder) and no broken image link."""
    import shutil

    page, png = results_page.build_page(results)
    assert results_page.readings_png(png).is_file()
    for cell in (results / "cells").iterdir():
        if "FedAvg" not in cell.name:
            shutil.rmtree(cell)
    page, png = results_page.build_page(results)
    assert not results_page.readings_png(png).exists()
    assert "readings.png" not in page.read_text()


def test_empty_folder_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli_main(["results-page", str(tmp_path / "empty")]) == 2
    assert "no run folders" in capsys.readouterr().err


@pytest.mark.parametrize("study", list(STUDY_NAMES))
def test_the_committed_results_page_is_what_the_command_makes(tmp_path, monkeypatch, study):
    """Each committed study's page (results/README.md for cifar10-lenet, results/<study>.md
    for the others: flnotes.repro.evidence.STUDIES) is generated, never typed: regenerating it
    from the finished cells' run folders gives the same text (run `python -m flnotes
    results-page results/<study> --out results/<page>` after committing new cells). Cells
    still running on this machine are not committed, so they are left out here."""
    import shutil

    from flnotes.repro import evidence

    root = Path(__file__).resolve().parent.parent
    source = root / "results" / study
    if not source.is_dir():
        pytest.skip(f"no results/{study} in this checkout")
    copy = tmp_path / "results" / study
    for cell in sorted((source / "cells").iterdir()):
        if json.loads((cell / "cell.json").read_text()).get("status") == "completed":
            shutil.copytree(cell, copy / "cells" / cell.name,
                            ignore=shutil.ignore_patterns("*.pt", "notebook.ipynb", "run.lock"))
    monkeypatch.chdir(tmp_path)
    page_name = evidence.STUDIES[study].page
    page, _ = results_page.build_page(f"results/{study}", f"results/{page_name}")
    assert page.read_text() == (root / "results" / page_name).read_text()


def _old_fedavg_beside(results: Path, **changes) -> None:
    """A copy of the seed-0 FedAvg run of dir=0.1 in a cell of its own, with ``changes``."""
    import shutil

    old = results / "cells" / "dir=0.1_FedAvg_seed0-00000000"
    copy = results / "cells" / "dir=0.1_FedAvg_seed0-old"
    shutil.copytree(old, copy)
    folder = copy / "runs" / "fedavg" / "seed0"
    config = dict(json.loads((folder / "config.json").read_text()), **changes,
                  run_dir=str(folder))
    (folder / "config.json").write_text(json.dumps(config))
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps(dict(meta, config=config)))


def test_two_fedavg_runs_of_one_seed_are_read_apart_never_one_chosen(results):
    """An old folder beside a rerun with other settings (another weighting): the page would
    read one of the two seed-0 FedAvg runs and not say which. The setting is read apart by
    that setting instead, each method with the FedAvg of its own value; two FedAvg runs that
    differ in nothing a run computes (only where the data lay) stay an error."""
    before = results_page.build_page(results)[0].read_text()
    _old_fedavg_beside(results, weighting="uniform")
    text = results_page.build_page(results)[0].read_text()
    # every method's reading as before, now under 'dir=0.1, weighting None'
    for method in ("FedMut", "FedQP"):
        old = row_of(before, DIFFERENCES, "CIFAR-10", "CNN", "dir=0.1", f"{method} − FedAvg")
        new = row_of(text, DIFFERENCES, "CIFAR-10", "CNN", "dir=0.1, weighting None",
                     f"{method} − FedAvg")
        assert new.split("|")[5:9] == old.split("|")[5:9]  # ours, per seed, reading, paper
    assert row_of(text, OURS, "CIFAR-10", "CNN", "dir=0.1, weighting uniform", "FedAvg")


def test_two_fedavg_runs_that_differ_in_nothing_computed_are_an_error(results):
    _old_fedavg_beside(results, data_dir="/elsewhere")
    with pytest.raises(ValueError, match="two runs of FedAvg, seed 0, in CIFAR-10, CNN, "
                       "dir=0.1: .* \\(they differ in data_dir\\); move one away"):
        results_page.build_page(results)


@pytest.fixture
def fml_results(tmp_path) -> Path:
    """An FML-style sweep output: FedAvg, FedProx and FML, shards (1), 100 rounds, its grid on
    FML Table 1; FML's rows also carry personal_accuracy, 10 + seed points above its global
    accuracy."""
    root = tmp_path / "results" / "fml"
    offsets = {"fedavg": 0.0, "fedprox": -0.01, "fml": 0.01}
    names = {"fedavg": "FedAvg", "fedprox": "FedProx", "fml": "FML"}
    for method, offset in offsets.items():
        for seed in (0, 1):
            cell = root / "cells" / f"shards-1_{names[method]}_seed{seed}-0000000{seed}"
            run_dir = cell / "runs" / method / f"seed{seed}"
            run_dir.mkdir(parents=True)
            config = {"algorithm": method, "dataset": "cifar10", "model": "lenet-cifar",
                      "partition": "shards", "rounds": 100, "seed": seed, "eval_every": 5,
                      "run_dir": str(run_dir)}
            (run_dir / "config.json").write_text(json.dumps(config))
            (run_dir / "run.json").write_text(json.dumps({"config": config,
                                                          "status": "completed"}))
            rows = []
            for r in range(1, 101):
                row = {"round": r, "train_loss": 1.0}
                if r % 5 == 0:
                    row["accuracy"] = 0.2 + r / 1000 + offset
                    if method == "fml":
                        row["personal_accuracy"] = row["accuracy"] + 0.10 + seed / 100
                rows.append(row)
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (cell / "cell.json").write_text(json.dumps(
                {"paper_table": "fml_table1", "labels": {
                    "dataset": "CIFAR-10", "model": "CNN2", "heterogeneity": "shards-1",
                    "method": names[method]}, "status": "completed"}))
    return root


def test_a_baseline_reads_beside_its_grids_table_and_personal_models_beside_global(fml_results):
    page, _ = results_page.build_page(fml_results)
    text = page.read_text()
    # 100 planned rounds: the accuracy table shows its quarters
    assert "| round 25 | round 50 | round 75 | round 100 | final |" in text
    # FedProx is a baseline: read beside the grid's table (FML Table 1: 80.88 - 82.64)
    prox = row_of(text, DIFFERENCES, "CIFAR-10", "CNN2", "shards-1", "FedProx − FedAvg")
    assert "| -1.00 ± 0.00 |" in prox and "| does not hold | -1.76 |" in prox
    assert "FedProx 80.88, FedAvg 82.64 (fml_table1)" in prox
    fml = row_of(text, DIFFERENCES, "CIFAR-10", "CNN2", "shards-1", "FML − FedAvg")
    assert "| +0.05 |" in fml  # FML Table 1: 82.69 - 82.64
    head = [line for line in text.split(f"## {PAPERS}\n", 1)[1].splitlines() if line][0]
    assert head.endswith("| ours (final) | fml_table1 |")
    # round 100: global 20 + 10 + 1 = 31 (both seeds), personal 41 and 42; personal minus
    # global: +10 and +11 points in every evaluation; spread 1: holds
    personal = row_of(text, "Personal models", "CIFAR-10", "CNN2", "shards-1", "FML")
    assert personal == ("| CIFAR-10 | CNN2 | shards-1 | FML | 0, 1 | 41.50 ± 0.71 | "
                        "31.00 ± 0.00 | +10.50 ± 0.71 | holds |")
    assert ("CIFAR-10, CNN2, shards-1: FML's personal models > its global model holds"
            in text.split("## Reading")[1])
    assert "FedAvg" not in text.split("## Personal models")[1].split("## Reading")[0]


def test_a_notebook_shows_the_pages_reading_or_says_in_one_line_where_it_is(
        results, tmp_path_factory, monkeypatch, capsys):
    """flnotes.repro.evidence: the notebooks' view of a committed study is the results page's
    own tables and reading (found from any folder below the repository), and without the
    results folder one line naming the grid that makes it."""
    import matplotlib

    matplotlib.use("Agg")
    from flnotes.repro import evidence

    page, _ = results_page.build_page(results)
    deep = results.parent.parent / "notebooks" / "copy"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert evidence.find("evidence") == results
    _, _, text = evidence.load("evidence")
    shown = evidence.sections(text)
    for section in ("Differences to FedAvg, beside the papers'", "Reading"):
        part = page.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].strip()
        # less the page's picture of the readings: a notebook draws that figure itself
        part = "\n".join(line for line in part.splitlines()
                         if not line.startswith("![")).strip()
        assert f"### {section}\n\n{part}" in shown
    assert OURS not in shown and PAPERS not in shown
    monkeypatch.setattr(evidence, "STUDIES", {**evidence.STUDIES, "evidence": evidence.Study(
        "benchmarks/x.yaml", "x.md", "a minute")})
    # a notebook's inline backend stays: switching to Agg would hide every later figure
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("backend switched"))
    assert evidence.show("evidence") is not None
    assert capsys.readouterr().out.startswith(
        "12 runs under results/evidence (11 completed, 1 running; a run not completed is drawn")
    monkeypatch.chdir(tmp_path_factory.mktemp("no-results"))  # no results/ above it
    assert evidence.show("evidence") is None
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "No results/evidence folder" in line and "sweep benchmarks/x.yaml" in line


def test_every_study_names_a_grid_that_exists():
    from flnotes.repro import evidence

    root = Path(__file__).resolve().parent.parent
    for name, study in evidence.STUDIES.items():
        assert (root / study.grid).is_file(), name


def test_a_seed_method_reads_beside_the_table_of_its_paper_that_has_the_setting(fml_results):
    """FedMut's own paper has two tables: on Shakespeare its difference is read beside
    Table 2's cells (55.53 - 52.08), not Table 1's (which has no Shakespeare row)."""
    from flnotes.repro.figures import Run

    run = Run({}, {}, 0, "completed", [], "x", "fedmut_table2")
    papers = results_page._paper_cells()
    assert results_page.paper_table_of("FedMut", [run], ("Shakespeare", "LSTM", "leaf"),
                                       papers) == "fedmut_table2"
    assert results_page.paper_table_of("FedMut", [run], ("CIFAR-10", "CNN", "dir=0.1"),
                                       papers) == "fedmut_table1"
    assert results_page.paper_table_of("FedProx", [run], ("Shakespeare", "LSTM", "leaf"),
                                       papers) == "fedmut_table2"
    cells = papers["fedmut_table2", "Shakespeare", "LSTM", "leaf"]
    assert cells["FedMut"] - cells["FedAvg"] == pytest.approx(55.53 - 52.08)


def test_a_stand_in_setting_reads_beside_the_cells_of_the_setting_it_stands_for(fml_results):
    """FedUp's CPU evidence runs Fashion-MNIST for FEMNIST: its grid labels the cells
    paper_dataset FEMNIST / paper_heterogeneity leaf, and the page reads FedProx − FedAvg
    beside FedUp Table 4's FEMNIST cells (78.56 − 78.68), saying which setting they are."""
    for cell_json in fml_results.glob("cells/*/cell.json"):
        cell = json.loads(cell_json.read_text())
        cell["paper_table"] = "fedup_table4"
        cell["labels"].update(dataset="Fashion-MNIST", model="CNN", heterogeneity="dir=0.3",
                              paper_dataset="FEMNIST", paper_heterogeneity="leaf")
        cell_json.write_text(json.dumps(cell))
    text = results_page.build_page(fml_results)[0].read_text()
    prox = row_of(text, DIFFERENCES, "Fashion-MNIST", "CNN", "dir=0.3", "FedProx − FedAvg")
    assert "| does not hold | -0.12 |" in prox
    assert "FedProx 78.56, FedAvg 78.68 (fedup_table4, for FEMNIST/CNN/leaf)" in prox
    assert ("Our Fashion-MNIST/CNN/dir=0.3 stands in for the paper's FEMNIST/CNN/leaf"
            in text.split(f"## {PAPERS}\n", 1)[1])
    papers = row_of(text, PAPERS, "Fashion-MNIST", "CNN", "dir=0.3", "FedAvg")
    assert papers.endswith("| 78.68 |")


def test_a_notebooks_answer_is_the_pages_verdicts(results, fml_results, monkeypatch, capsys):
    """evidence.answer, the line per claim a reproduction notebook ends on, says what the
    page's difference and personal tables say: the same verdict and per-seed differences."""
    from flnotes.repro import evidence

    for root in (results, fml_results):
        text = results_page.build_page(root)[0].read_text()
        lines = evidence.answer(root.name, root)
        assert capsys.readouterr().out.splitlines() == lines
        rows = [line for line in text.split(f"## {DIFFERENCES}\n", 1)[1]
                .split("\n## ", 1)[0].splitlines() if " − FedAvg |" in line]
        assert len(rows) + ("Personal models" in text) == len(lines)
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            method = cells[3].split(" − ")[0]
            per_seed = ", ".join(part.split(": ")[1].split(",")[0]
                                 for part in cells[5].split("; "))
            assert (f"{', '.join(cells[:3])}: {method} > FedAvg {cells[6]} "
                    f"(late difference per seed: {per_seed})") in lines
    assert ("CIFAR-10, CNN2, shards-1: FML's personal models > its global model holds "
            "(late difference per seed: +10.00, +11.00)") in lines
    (tmp := results.parent / "elsewhere").mkdir()
    monkeypatch.chdir(tmp)
    assert evidence.answer("cifar10-lenet") is None  # no results/cifar10-lenet above
    assert "No results/cifar10-lenet folder" in capsys.readouterr().out


def test_tables_reads_every_claim_as_the_page_does(results, fml_results, capsys):
    """`flnotes tables FOLDER` prints, under the paper tables, one line per method against
    FedAvg by the same reading rule: the same lines as the notebooks' answer (which adds
    the personal-model claim of FML)."""
    from flnotes.repro import evidence, tables

    for root in (results, fml_results):
        frame = tables.one_per_run(tables.collect_runs(root))
        claims = tables.readings(frame)
        expected = evidence.verdicts(results_page.by_setting(load_runs(root)))
        assert claims == [line for line in expected if "personal" not in line]
    # the command prints them under the tables (one root: the command reads every table)
    assert cli_main(["tables", str(fml_results), "--table", "fml_table1"]) == 0
    out = capsys.readouterr().out
    printed = out.split("== readings: ", 1)[1].splitlines()[1:]
    assert [line for line in printed if not line.startswith("done in")] == claims
    assert ("CIFAR-10, CNN2, shards-1: FedProx > FedAvg does not hold (late difference per "
            "seed: -1.00, -1.00)") in claims


def test_a_diverged_run_is_named_wherever_its_claim_is_read(results, capsys):
    """A run whose loss became NaN stops ("diverged"): the page's table and reading, the
    tables command and the notebooks' answer all say so beside the claim, since the late
    window then lies before the divergence."""
    from flnotes.repro import evidence, tables

    run_dir = results / "cells" / "dir=0.1_FedQP_seed1-00000001" / "runs" / "fedqp" / "seed1"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = rows[:26] + [{"round": 27, "train_loss": float("nan")}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(dict(meta, status="diverged")))
    note = ("FedQP diverged in seed 1 (round 27): read over the evaluations before, and it has "
            "no model after")
    text = results_page.build_page(results)[0].read_text()
    assert "| cannot tell (a run diverged) |" in row_of(text, DIFFERENCES, "CIFAR-10", "CNN",
                                                        "dir=0.1", "FedQP − FedAvg")
    assert note[0].upper() + note[1:] + "." in text.split("## Reading")[1]
    qp = [line for line in evidence.answer("evidence", results) if "FedQP" in line
          and "dir=0.1" in line]
    assert qp[0].endswith("; " + note)
    claims = tables.readings(tables.one_per_run(tables.collect_runs(results)))
    assert [c for c in claims if "FedQP" in c and "dir=0.1" in c] == qp
    assert not any("diverged" in c for c in claims if "FedQP" not in c or "iid" in c)


def test_the_readings_figure_rings_the_seed_whose_run_diverged(results):
    """The page's table says "(a run diverged)"; its picture rings that seed's dot (an
    unfilled marker in the verdict's colour, with a legend entry), the other seeds' dots
    stay filled."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    run_dir = results / "cells" / "dir=0.1_FedQP_seed1-00000001" / "runs" / "fedqp" / "seed1"
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(dict(meta, status="diverged")))
    groups = results_page.by_setting(load_runs(results))
    setting = next(s for s in groups if s[2] == "dir=0.1")
    reading = results_page.late_reading(groups[setting]["FedQP"], groups[setting]["FedAvg"])
    colour = results_page.VERDICT_COLOURS[reading.verdict]
    fig = results_page.readings_figure(groups)
    try:
        ax = next(a for a in fig.axes if "dir=0.1" in a.get_title())
        row = [t.get_text() for t in ax.get_yticklabels()].index("FedQP")
        dots = [c for c in ax.collections if set(c.get_offsets()[:, 1]) == {row}]
        ring = [c for c in dots if not len(c.get_facecolor()) or c.get_facecolor()[0][3] == 0]
        filled = [c for c in dots if c not in ring]
        by_seed = {s.seed: s.difference for s in reading.seeds}
        assert len(ring) == 1 and list(ring[0].get_offsets()[:, 0]) == [by_seed[1]]
        assert to_hex(ring[0].get_edgecolor()[0]) == colour
        assert sorted(filled[0].get_offsets()[:, 0]) == sorted(
            d for seed, d in by_seed.items() if seed != 1)
        assert results_page.DIVERGED_SEED in [t.get_text() for t in ax.get_legend().texts]
        others = [a for a in fig.axes if a is not ax]
        assert all(results_page.DIVERGED_SEED not in [t.get_text() for t in a.get_legend().texts]
                   for a in others)
    finally:
        plt.close(fig)


def test_a_panel_names_the_model_its_runs_trained_where_the_label_names_another():
    """The tables' "CNN" row of the seed code is its LeNet: the panel says which model ran."""
    def runs(model):
        return {"FedAvg": [Run({}, {"model": model}, 0, "completed", [], "r", None)]}

    setting = ("CIFAR-10", "CNN", "dir=0.1")
    assert results_page.panel_title(setting, runs("lenet-cifar")) == \
        "CIFAR-10, CNN (model lenet-cifar), dir=0.1"
    assert results_page.panel_title(setting, runs("cnn")) == "CIFAR-10, CNN, dir=0.1"
    assert results_page.panel_title(setting, {"FedAvg": []}) == "CIFAR-10, CNN, dir=0.1"


def test_the_settings_and_cost_section_sums_the_rounds_and_names_the_grid(results):
    """Each run's rounds take 0.5 s + seed + a method's share; the section's hours and median
    are those sums by hand, its command names the cells' grid, and a setting is said once
    where it is shared: by every run, by a panel's runs, else on its method's row."""
    share = {"fedavg": 1.0, "fedmut": 2.0, "fedqp": 3.0}
    seconds = {}
    for metrics in results.glob("cells/*/runs/*/seed*/metrics.jsonl"):
        method, seed = metrics.parent.parent.name, int(metrics.parent.name[4:])
        setting = metrics.parents[3].name.split("_")[0]
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        for row in rows:
            row["seconds"] = 0.5 + seed + share[method]
        seconds.setdefault((setting, method), []).extend(r["seconds"] for r in rows)
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cell = metrics.parents[3] / "cell.json"
        cell.write_text(json.dumps({**json.loads(cell.read_text()),
                                    "grid_file": "benchmarks/evidence.yaml"}))
        run_json = metrics.parent / "run.json"
        run_json.write_text(json.dumps({**json.loads(run_json.read_text()), "environment": {
            "device": "cpu", "cpu_threads": 1}}))
    text = results_page.build_page(results)[0].read_text()
    section = text.split("## Settings and cost\n", 1)[1]
    assert ("Made by `python -m flnotes sweep benchmarks/evidence.yaml --set data_dir=DIR "
            f"--out {results} --workers 1`") in section
    shared = next(line for line in section.splitlines() if line.startswith("Every run: "))
    assert "dataset cifar10" in shared and "rounds 200" in shared and "eval_every 5" in shared
    assert "algorithm" not in shared and "partition" not in shared and "seed" not in shared
    assert "on cpu with 1 torch thread per run" in section
    # a partition's own setting only where that partition reads it
    assert "\nCIFAR-10, CNN, dir=0.1: dirichlet_alpha 0.1, partition dirichlet.\n" in section
    assert "\nCIFAR-10, CNN, iid: partition iid.\n" in section
    for (setting, method), values in seconds.items():
        row = row_of(text, "Settings and cost", "CIFAR-10", "CNN", setting, LABEL[method])
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4] == f"algorithm {method}", row  # the panel's own settings said once
        assert cells[5:] == ["2", f"{sum(values) / 3600:.2f}", f"{np.median(values):.1f}"], row
    total = sum(sum(v) for v in seconds.values()) / 3600
    assert f"In all: 12 runs, {total:.1f} hours of rounds." in section


def test_the_readings_figure_draws_each_seeds_late_difference_in_its_verdicts_colour(results):
    """Per setting, one row per method: a dot at each seed's late difference to FedAvg (the
    rule's own numbers, recomputed here from the metrics files), coloured by the verdict."""
    # (pyplot only here, under Agg as build_page sets it: the other tests draw no figure)
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    groups = results_page.by_setting(load_runs(results))
    fig = results_page.readings_figure(groups)
    try:
        panels = [s for s, by_method in groups.items() if len(by_method) > 1]
        assert len(fig.axes) == len(panels)
        for ax, setting in zip(fig.axes, panels, strict=True):
            rows = [t.get_text() for t in ax.get_yticklabels()]
            assert sorted(rows) == sorted(m for m in groups[setting] if m != "FedAvg")
            label = setting[2]
            base = read_accuracies(results, label, "fedavg")
            for y, method in enumerate(rows):
                mine = read_accuracies(results, label, method.lower())
                by_hand = []
                for seed in sorted(mine):
                    common = sorted(set(mine[seed]) & set(base[seed]))
                    late = common[-math.ceil(len(common) / 4):]  # the last quarter
                    by_hand.append(np.mean([mine[seed][r] - base[seed][r] for r in late]))
                dots = next(c for c in ax.collections
                            if set(c.get_offsets()[:, 1]) == {y})
                assert np.allclose(sorted(dots.get_offsets()[:, 0]), sorted(by_hand))
                verdict = results_page.late_reading(groups[setting][method],
                                                    groups[setting]["FedAvg"]).verdict
                assert to_hex(dots.get_facecolor()[0]) == \
                    results_page.VERDICT_COLOURS[verdict]
            means = [np.mean(c.get_offsets()[:, 0]) for c in ax.collections]
            assert means == sorted(means)  # methods sorted by their mean difference
    finally:
        plt.close(fig)
    assert results_page.readings_figure({("a", "b", "c"): {"FedAvg": []}}) is None
