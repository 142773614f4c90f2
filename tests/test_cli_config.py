"""run --config FILE|FOLDER (a run folder's settings, flags override them) and run --resume
FOLDER (continue it under its own settings), through the command line in-process."""

import json
from pathlib import Path

import pytest

from flnotes.cli.main import main
from flnotes.config import RunConfig

TINY = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2",
        "--data-option", "num_train=400", "--data-option", "num_test=100", "--device", "cpu"]


def _stored(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _written_config(tmp_path: Path, **values) -> Path:
    """A config.json as a run folder holds it (no run needed)."""
    base = dict(num_clients=4, clients_per_round=2, rounds=2, device="cpu",
                data_options={"num_train": 400, "num_test": 100},
                run_dir=str(tmp_path / "old"))
    folder = tmp_path / "old"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(RunConfig(**{**base, **values}).resolved().to_json())
    return folder


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_config_takes_a_folders_settings_and_flags_override_them(tmp_path, capsys):
    old = _written_config(tmp_path, algorithm="fedprox", mu=0.02, lr=0.03)
    new = tmp_path / "new"
    assert main(["run", "--config", str(old / "config.json"), "--lr", "0.05",
                 "--data-option", "num_test=120", "--run-dir", str(new)]) == 0
    stored = _stored(new)
    assert stored["algorithm"] == "fedprox" and stored["mu"] == 0.02  # the file's
    assert stored["lr"] == 0.05  # the flag's
    assert stored["data_options"] == {"num_train": 400, "num_test": 120}  # merged
    assert stored["run_dir"] == str(new)


def test_config_of_a_folder_runs_in_a_folder_of_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    old = _written_config(tmp_path, lr=0.03)
    assert main(["run", "--config", str(old), "--seed", "5"]) == 0
    made = [p for p in (tmp_path / "runs").iterdir()]
    assert len(made) == 1 and "seed5" in made[0].name
    assert _stored(made[0])["lr"] == 0.03
    assert not (old / "metrics.jsonl").exists()  # the source folder is only read


def test_config_drops_the_files_settings_of_another_method_but_refuses_a_flags(tmp_path,
                                                                              capsys):
    old = _written_config(tmp_path, algorithm="fedprox", mu=0.02)
    assert main(["run", "--config", str(old), "--algorithm", "fedavg",
                 "--run-dir", str(tmp_path / "avg")]) == 0
    assert "mu" not in _stored(tmp_path / "avg")
    capsys.readouterr()
    assert main(["run", "--config", str(old), "--algorithm", "fedavg", "--mu", "0.1"]) == 2
    assert "not read by fedavg" in _one_line_error(capsys)


def test_resume_continues_a_folder_and_more_rounds_extend_it(tmp_path, capsys):
    folder = tmp_path / "r"
    assert main(["run", *TINY, "--lr", "0.03", "--run-dir", str(folder)]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(folder), "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {folder} from round 2" in out
    assert "round    3" in out and "round    1" not in out
    rows = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == [1, 2, 3]
    assert _stored(folder)["rounds"] == 3 and _stored(folder)["lr"] == 0.03
    # Again without --rounds: the folder's own count, a finished run shown.
    assert main(["run", "--resume", str(folder)]) == 0
    assert "already holds this run (completed, 3 rounds)" in capsys.readouterr().out


def test_resume_finds_a_folder_moved_since_it_was_written(tmp_path, capsys):
    folder = tmp_path / "first"
    assert main(["run", *TINY, "--run-dir", str(folder)]) == 0
    moved = folder.rename(tmp_path / "moved")
    assert main(["run", "--resume", str(moved), "--rounds", "3"]) == 0
    assert f"resuming {moved} from round 2" in capsys.readouterr().out
    assert _stored(moved)["run_dir"] == str(moved)


@pytest.mark.parametrize("extra, words", [
    (["--lr", "0.5"], "--lr would change"),
    (["--seed", "2"], "--seed would change"),
    (["--run-dir", "elsewhere"], "drop --run-dir"),
    (["--preset", "fedmut-paper"], "drop --preset"),
    (["--config", "x.json"], "drop --config"),
    (["--seeds", "0,1"], "drop --seeds"),
])
def test_resume_refuses_what_would_change_the_run(extra, words, tmp_path, capsys):
    folder = _written_config(tmp_path)
    assert main(["run", "--resume", str(folder), *extra]) == 2
    assert words in _one_line_error(capsys)


def _damaged(tmp_path: Path, content) -> str:
    path = tmp_path / "config.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


@pytest.mark.parametrize("flag", ["--config", "--resume"])
@pytest.mark.parametrize("make, words", [
    (lambda t: str(t / "missing"), "does not exist"),
    (lambda t: _damaged(t, '{"lr": 0.1,'), "is damaged (not JSON"),
    (lambda t: _damaged(t, "[1, 2]"), "is damaged (a list"),
    (lambda t: _damaged(t, b"\xff\xfe\x00"), "cannot read"),
    (lambda t: _damaged(t, '{"lr": 0.1, "rounds_": 3}'), "unknown RunConfig field"),
    (lambda t: _damaged(t, '{"lr": -1}'), "lr"),
    (lambda t: "", "not a"),
])
def test_a_missing_or_damaged_file_or_folder_is_one_line(flag, make, words, tmp_path, capsys):
    target = make(tmp_path)
    if flag == "--resume" and target.endswith("config.json"):
        target = str(Path(target).parent)  # --resume names the folder
    assert main(["run", flag, target]) == 2
    assert words in _one_line_error(capsys)


def test_resume_of_a_folder_that_is_not_a_run_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["run", "--resume", str(tmp_path / "empty")]) == 2
    assert "holds no config.json" in _one_line_error(capsys)
    (tmp_path / "file").write_text("x")
    assert main(["run", "--resume", str(tmp_path / "file")]) == 2
    assert "is a file" in _one_line_error(capsys)
    seeds = tmp_path / "seeds"
    (seeds / "seed0").mkdir(parents=True)
    (seeds / "seed0" / "config.json").write_text("{}")
    assert main(["run", "--resume", str(seeds)]) == 2
    assert "folders of a --seeds run (seed0)" in _one_line_error(capsys)


def test_config_and_preset_together_are_refused(tmp_path, capsys):
    old = _written_config(tmp_path)
    assert main(["run", "--config", str(old), "--preset", "fedmut-paper"]) == 2
    assert "give one" in _one_line_error(capsys)


def test_config_reads_yaml_and_json_with_1e_numbers(tmp_path, capsys):
    text = ("algorithm: fedprox\nmu: 1e-2\nlr: 0.03\nnum_clients: 4\nclients_per_round: 2\n"
            "rounds: 1\ndevice: cpu\ndata_options:\n  num_train: 400\n  num_test: 100\n")
    (tmp_path / "exp.yaml").write_text(text)
    assert main(["run", "--config", str(tmp_path / "exp.yaml"),
                 "--run-dir", str(tmp_path / "y")]) == 0
    stored = _stored(tmp_path / "y")
    assert (stored["algorithm"], stored["mu"], stored["lr"]) == ("fedprox", 0.01, 0.03)
    assert stored["data_options"] == {"num_train": 400, "num_test": 100}


@pytest.mark.parametrize("name, text", [
    ("c.json", '{"algorithm": "fedavg", "mu": 0.5}'),
    ("c.yaml", "algorithm: fedavg\nmu: 0.5\n"),
    ("c.json", '{"mu": 0.5}'),  # fedavg by default
])
def test_config_refuses_a_setting_its_method_does_not_read_as_the_flag_does(name, text,
                                                                          tmp_path, capsys):
    (tmp_path / name).write_text(text)
    assert main(["run", "--config", str(tmp_path / name)]) == 2
    line = _one_line_error(capsys)
    assert "mu=0.5 is not read by fedavg" in line and str(tmp_path / name) in line, line
    assert not (tmp_path / "runs").exists()


def test_config_of_an_old_folder_with_every_methods_defaults_still_runs(tmp_path, capsys):
    """A folder written before settings belonged to methods holds each method's setting at
    its default: those say nothing and are left out, as before."""
    from flnotes.algorithms import all_settings

    folder = _written_config(tmp_path, algorithm="fedavg")
    values = _stored(folder)
    values.update((n, next(iter(by.values())).default) for n, by in all_settings().items()
                  if next(iter(by.values())).default is not None)
    (folder / "config.json").write_text(json.dumps(values))
    assert main(["run", "--config", str(folder), "--run-dir", str(tmp_path / "n")]) == 0
    assert "mu" not in _stored(tmp_path / "n")


@pytest.mark.parametrize("name, text", [
    ("c.json", '{"lr": 0.1, "rounds": 2, "lr": 0.5}'),
    ("c.json", '{"data_options": {"num_train": 400, "num_train": 9}}'),
    ("c.yaml", "lr: 0.1\nrounds: 2\nlr: 0.5\n"),
])
def test_config_refuses_a_key_given_twice(name, text, tmp_path, capsys):
    (tmp_path / name).write_text(text)
    assert main(["run", "--config", str(tmp_path / name)]) == 2
    line = _one_line_error(capsys)
    key = "num_train" if "num_train" in text else "lr"
    assert f"gives '{key}' twice" in line, line


def test_config_that_is_neither_json_nor_yaml_is_one_line(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("lr: [0.1\nrounds: 2\n")
    assert main(["run", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "is damaged (not JSON or YAML" in _one_line_error(capsys)


def test_config_yaml_merge_keys_yaml_12_booleans_and_a_list_key(tmp_path, capsys):
    """YAML as a user writes it: a merge key's values (overridden by the mapping's own),
    `compile: off` as the text "off" (YAML 1.1 would make it False, which RunConfig
    refuses), and a key that is a list as a one-line error naming the line."""
    text = ("defaults: &base\n  lr: 0.5\n  rounds: 1\nrun:\n  <<: *base\n  lr: 0.03\n"
            "  compile: off\n  num_clients: 4\n  clients_per_round: 2\n  device: cpu\n"
            "  data_options: {num_train: 400, num_test: 100}\n")
    (tmp_path / "anchors.yaml").write_text(text)
    from flnotes.config.yaml_text import read_yaml

    run = read_yaml(text)["run"]
    assert (run["lr"], run["rounds"], run["compile"]) == (0.03, 1, "off")
    (tmp_path / "exp.yaml").write_text("".join(
        line[2:] + "\n" for line in text.splitlines()[4:] if line.startswith("  ")
        and "<<" not in line) + "rounds: 1\n")
    assert main(["run", "--config", str(tmp_path / "exp.yaml"),
                 "--run-dir", str(tmp_path / "y")]) == 0
    assert _stored(tmp_path / "y")["compile"] == "off"
    (tmp_path / "bad.yaml").write_text("lr: 0.1\n[a, b]: 1\n")
    assert main(["run", "--config", str(tmp_path / "bad.yaml")]) == 2
    line = _one_line_error(capsys)
    assert "a key must be a name or a number, not a list at line 2" in line, line
    assert read_yaml("on: yes\nx: True\n") == {"on": "yes", "x": True}
