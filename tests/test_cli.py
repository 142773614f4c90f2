"""The command line: one-line errors, default run folders, Ctrl-C, help and output."""

import json
import math
import sys

import pytest
import torch

from flnotes.cli.field_help import FIELD_HELP
from flnotes.cli.main import _parse_option, build_parser, main
from flnotes.cli.run import default_run_name
from flnotes.config import RunConfig, field_names

# A run of a fraction of a second: 4 clients on 400 synthetic samples.
SMALL = ["--num-clients", "4", "--clients-per-round", "2", "--data-option", "num_train=400",
         "--data-option", "num_test=100", "--device", "cpu"]


@pytest.mark.parametrize("argv, words", [
    (["run", "--lr", "nan"], ["lr=nan", "finite"]),
    (["run", "--data-option", "foo=1"], ["'foo'", "num_train", "num_test"]),
    (["run", "--dataset", "shakespeare", "--data-option", "max_rolez=3"],
     ["did you mean 'max_roles'"]),
    (["run", "--dataset", "shakespeare", "--data-option", "max_roles=abc"],
     ["max_roles", "'abc'", "integer"]),
    (["run", "--dataset", "shakespeare", "--data-option", "seq_len=-5"], ["seq_len", ">= 1"]),
    (["run", "--preset", "fedmut-papr"], ["did you mean 'fedmut-paper'"]),
    (["presets", "fedmut-papr"], ["did you mean 'fedmut-paper'"]),
    (["tables", "/nonexistent/results", "--table", "fedmut_table1"], ["results folder"]),
])
def test_bad_inputs_exit_2_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1
    for word in words:
        assert word in err, f"{word!r} missing from: {err}"


def test_cuda_without_a_gpu_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", "--device", "cuda"]) == 2
    assert "use --device cpu or auto" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["run", "--roudns", "3"], "error: unrecognized arguments: --roudns (did you mean "
                               "'--rounds'"),
    (["run", "--lr", "abc"], "error: argument --lr: invalid float value: 'abc' (python -m "
                             "flnotes run --help lists the flags)"),
    (["sweep", "--workers", "x"], "error: argument --workers: invalid"),
    (["nosuch"], "error: argument COMMAND: invalid choice: 'nosuch'")])
def test_a_bad_flag_is_one_line_with_the_closest_flag(capsys, argv, words):
    """The problem and where the flags are listed, not run's 85-line usage above it."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(words) and err.count("\n") == 1, err


def test_version_and_the_name_the_user_called(capsys, monkeypatch):
    import flnotes

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"flnotes {flnotes.__version__}\n"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/flnotes", "run", "--roudns"])
    with pytest.raises(SystemExit):
        main(["run", "--roudns"])
    assert "(flnotes run --help lists the flags)" in capsys.readouterr().err


def test_help_explains_every_field_and_lists_choices():
    parser = build_parser()
    run_parser = parser._subparsers._group_actions[0].choices["run"]
    helps = {a.dest: a.help for a in run_parser._actions}
    for name in field_names():
        assert FIELD_HELP[name] in helps[name]
    # Every registered algorithm is listed (sorted; the list grows with the baselines).
    assert "choices: " in helps["algorithm"]
    assert all(f" {name}," in helps["algorithm"] for name in ("fedavg", "fedmr", "fedmut"))
    assert "choices: iid, dirichlet, shards, natural" in helps["partition"]
    # One meaning per name: alpha is the mutation range; FedUp's weight is fedup_alpha.
    assert "mutation range" in helps["alpha"] and "penalty" not in helps["alpha"]
    assert "penalty" in helps["fedup_alpha"] and "true/false" in helps["download"]
    for command in ("run", "demo", "presets", "sweep", "tables"):
        assert command in parser.description


def test_default_run_folder_names_the_settings_but_not_rounds():
    config = RunConfig(algorithm="fedprox", mu=0.01)
    name = default_run_name(config)
    assert name.startswith("fedprox-synthetic-dirichlet-seed0-") and len(name.split("-")[-1]) == 6
    assert default_run_name(config.replace(mu=1.0)) != name
    # What may change on resuming (sim.RESUMABLE_CHANGES) keeps the folder.
    assert default_run_name(config.replace(rounds=500, device="cpu", checkpoint_every=3,
                                           data_dir="/elsewhere")) == name
    seeds = default_run_name(config, seeds=True)
    assert seeds == name.replace("-seed0-", "-seeds-")  # same digest: same settings


def test_run_prints_rounds_and_a_new_setting_gets_its_own_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--algorithm", "fedprox", "--rounds", "2", *SMALL]
    assert main([*argv, "--mu", "0.01"]) == 0
    assert "round    2" in capsys.readouterr().out
    assert main([*argv, "--mu", "1.0"]) == 0  # once refused: "holds a different run"
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(f.startswith("fedprox-synthetic-dirichlet-seed0-")
                                     for f in folders)


def test_ctrl_c_exits_130_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    import flnotes.engine.sim as sim

    real_train = sim.train_clients

    def ctrl_c_in_round_4(task, strategy, rnd, *args):
        if rnd == 4:
            raise KeyboardInterrupt
        return real_train(task, strategy, rnd, *args)

    folder = tmp_path / "r"
    argv = ["run", "--rounds", "5", "--checkpoint-every", "2", "--run-dir", str(folder), *SMALL]
    monkeypatch.setattr(sim, "train_clients", ctrl_c_in_round_4)
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == (
        "interrupted after round 3; run the same command again to resume from the last "
        "checkpoint (round 2)")
    assert "Traceback" not in captured.err and "round    3" in captured.out
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(sim, "train_clients", real_train)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"resuming {folder} from round 2" in out
    assert "round    3" in out and "round    1" not in out


def test_toy_run_says_what_its_accuracy_means(tmp_path, capsys):
    assert main(["run", "--dataset", "toy", "--rounds", "1", "--num-clients", "4",
                 "--clients-per-round", "2", "--run-dir", str(tmp_path / "toy")]) == 0
    out = capsys.readouterr().out
    assert "flat basin" in out and "flat_basin" in out
    assert not any("accuracy" in line for line in out.splitlines() if line.startswith("round"))


def test_seeds_report_the_sample_std(tmp_path, capsys):
    from flnotes.engine.history import History
    from flnotes.repro.tables import run_metrics

    assert main(["run", "--seeds", "0,1", "--rounds", "1", "--backend", "loop",
                 "--run-dir", str(tmp_path / "cell"), *SMALL]) == 0
    out = capsys.readouterr().out
    a, b = (run_metrics(History.load(tmp_path / "cell" / f"seed{s}").metric("accuracy"))
            ["last_mean"] for s in (0, 1))
    std = abs(a - b) / math.sqrt(2)  # sample std (ddof=1) of two values
    assert f"mean +- std over 2 seeds: {(a + b) / 2:.4f} +- {std:.4f}" in out


def test_data_option_values_are_read_as_yaml_and_numbers():
    assert _parse_option("noise=1e-3") == ("noise", 0.001)  # YAML 1.1 alone: the text '1e-3'
    assert _parse_option("num_train=400") == ("num_train", 400)
    assert _parse_option("coarse=true") == ("coarse", True)
    assert _parse_option("source=plays") == ("source", "plays")
    assert _parse_option("max_roles=null") == ("max_roles", None)


def test_a_diverged_folder_is_not_offered_more_rounds(tmp_path, capsys):
    args = ["run", "--lr", "1e6", "--momentum", "0", "--rounds", "3",
            "--run-dir", str(tmp_path / "div"), *SMALL]
    main(args)
    capsys.readouterr()
    main([*args[:6], "6", *args[7:]])  # more rounds: still diverged, not continued
    out = capsys.readouterr().out
    assert "(diverged" in out and "not continued" in out and "raise --rounds" not in out


def test_a_preset_keeps_its_data_options_on_the_command_line():
    """The FedMut 'divergence at momentum 0.9' once reported: `--preset fedmut-official` ran on the
    default per-channel standardisation, because the unset --data-option flag replaced the
    preset's normalize="fedmut-code" with {}. With the seed code's inputs restored, FedMut at
    momentum 0.9 stays finite as the seed code does (fedmut-official's docstring)."""
    from flnotes.cli.main import config_from_args

    parser = build_parser()
    preset = RunConfig.from_preset("fedmut-official")
    assert preset.data_options == {"normalize": "fedmut-code"}
    plain = config_from_args(parser.parse_args(["run", "--preset", "fedmut-official",
                                                "--momentum", "0.9"]))
    assert plain.data_options == preset.data_options and plain.momentum == 0.9
    # A given option adds to the preset's options; a given key replaces the preset's value.
    more = config_from_args(parser.parse_args(["run", "--preset", "fedmut-official",
                                               "--data-option", "coarse=false"]))
    assert more.data_options == {"normalize": "fedmut-code", "coarse": False}
    other = config_from_args(parser.parse_args(["run", "--preset", "fedmut-official",
                                                "--data-option", "normalize=dataset"]))
    assert other.data_options == {"normalize": "dataset"}
    # Without a preset an unset flag still means no options.
    assert config_from_args(parser.parse_args(["run"])).data_options == {}


def test_an_unexpected_error_is_one_line_with_how_to_see_more(monkeypatch, capsys):
    """A fault below the command line (a CUDA error, a bug) is one line, exit 1, and
    FLNOTES_TRACEBACK=1 shows where."""
    import sys

    cli = sys.modules["flnotes.cli.main"]  # flnotes.cli.main is also the function's name

    def broken(args):
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    monkeypatch.setattr(cli, "cmd_run", broken)
    assert cli.main(["run", *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: CUDA error" in err and "FLNOTES_TRACEBACK" in err
    monkeypatch.setenv("FLNOTES_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main(["run", *SMALL])
