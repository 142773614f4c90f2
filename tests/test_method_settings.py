"""Each method owns its settings: declared once in its module, everything derived.

The first test is CONTRIBUTING.md's promise: a method written in one file (here, this one)
runs from the command line, has its own help group, validates its settings in one line and
is hashed with them, with no edit anywhere else.
"""

import ast
import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from flnotes.algorithms import (
    Setting,
    Strategy,
    algorithm_names,
    register_algorithm,
    settings_of,
    unregister_algorithm,
)
from flnotes.cli.main import main
from flnotes.config import RunConfig
from flnotes.engine.sim import settings_hash
from flnotes.engine.state import weighted_mean

SMALL = ["--num-clients", "4", "--clients-per-round", "2", "--rounds", "2", "--data-option",
         "num_train=400", "--data-option", "num_test=100", "--device", "cpu"]


class ShrinkAvg(Strategy):
    """FedAvg whose new global model is shrunk toward the old one: w + s (mean - w)."""

    name = "shrinkavg"
    label = "ShrinkAvg"
    settings = (
        Setting("shrink_step", 0.5, "ShrinkAvg: the server's step s toward the clients' mean",
                source="this test", minimum=0, maximum=1, open_minimum=True),
    )

    def aggregate(self, round, results):
        mean = weighted_mean([r.state for r in results], [1.0] * len(results))
        s = self.config.shrink_step
        self.global_state = OrderedDict(
            (n, w + s * (mean[n] - w) if w.is_floating_point() else mean[n])
            for n, w in self.global_state.items())
        return self.global_state


@pytest.fixture
def shrinkavg():
    register_algorithm(ShrinkAvg)
    yield ShrinkAvg
    unregister_algorithm("shrinkavg")


def test_a_method_in_one_file_runs_from_the_cli_with_help_checks_and_hash(
        shrinkavg, tmp_path, capsys):
    assert "shrinkavg" in algorithm_names()
    # Runs from the command line with its own flag, and the run folder records it.
    folder = tmp_path / "run"
    assert main(["run", "--algorithm", "shrinkavg", "--shrink-step", "0.25", *SMALL,
                 "--run-dir", str(folder)]) == 0
    stored = json.loads((folder / "config.json").read_text())
    assert stored["shrink_step"] == 0.25 and "mu" not in stored and "alpha" not in stored
    # Help: a group of its own in run --help, and alone with --algorithm.
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    full = capsys.readouterr().out
    assert "ShrinkAvg settings (--algorithm shrinkavg)" in full and "FedProx settings" in full
    with pytest.raises(SystemExit):
        main(["run", "--algorithm", "shrinkavg", "--help"])
    alone = capsys.readouterr().out
    assert "--shrink-step" in alone and "FedProx settings" not in alone
    assert "--mu" not in alone and "common settings" in alone
    # Validation: one line naming the setting, its value and the rule.
    assert main(["run", "--algorithm", "shrinkavg", "--shrink-step", "1.5", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shrink_step=1.5" in err and "(0, 1]" in err
    with pytest.raises(ValueError, match="shrink_step"):
        RunConfig(algorithm="shrinkavg", shrink_step=0.0)
    # Hashed: another step is another run; the default is what an unset flag gives.
    a = RunConfig(algorithm="shrinkavg", shrink_step=0.25)
    b = RunConfig(algorithm="shrinkavg", shrink_step=0.5)
    assert settings_hash(a) != settings_hash(b)
    assert settings_hash(b) == settings_hash(RunConfig(algorithm="shrinkavg"))


def test_the_one_file_method_is_fedavg_at_step_one(shrinkavg):
    """A behaviour check, so the method above is a method: s = 1 is FedAvg's uniform mean."""
    from flnotes.engine.sim import run

    base = dict(num_clients=4, clients_per_round=2, rounds=2, device="cpu",
                data_options={"num_train": 400, "num_test": 100}, weighting="uniform")
    ours = run(RunConfig(algorithm="shrinkavg", shrink_step=1.0, **base), progress=False)
    fedavg = run(RunConfig(algorithm="fedavg", **base), progress=False)
    for n, t in fedavg.final_state.items():
        assert torch.allclose(ours.final_state[n], t, atol=1e-6)


def test_a_setting_the_method_does_not_read_is_one_line_naming_who_reads_it(capsys):
    assert main(["run", "--personal-models", "cnn", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "personal_models" in err and "fml" in err
    with pytest.raises(ValueError, match="mu=0.1 is not read by fedavg.*fedprox"):
        RunConfig(algorithm="fedavg", mu=0.1)
    # A base config for several methods (no algorithm named) may carry them; each method
    # run from it reads its own and records only those.
    base = RunConfig(mu=0.1, alpha=2.0, rounds=3)
    assert base.replace(algorithm="fedprox").mu == 0.1
    assert "mu" not in base.replace(algorithm="fedmut").to_dict()
    assert base.replace(algorithm="fedmut").to_dict()["alpha"] == 2.0


def test_the_hash_covers_what_the_run_reads():
    plain = RunConfig(algorithm="fedavg", rounds=3)
    carrying = RunConfig(moon_tau=0.1, mu=0.3, rounds=3).replace(algorithm="fedavg")
    assert settings_hash(plain) == settings_hash(carrying)
    assert settings_hash(RunConfig(algorithm="moon", moon_tau=0.1)) != settings_hash(
        RunConfig(algorithm="moon"))


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_the_methods_own_settings_read_as_plain_attributes(monkeypatch, algorithm):
    """The chosen method's settings (given, else their defaults) are plain attributes: a
    training step that reads one (FedProx's mu) under torch.compile met RunConfig's registry
    lookups (lru_cache'd functions, one Dynamo warning each). Other methods' settings a base
    config carries still read through __getattr__, with the same values as before."""
    settings = settings_of(algorithm)
    given = {"mu": 0.25, **{name: s.default for name, s in list(settings.items())[:1]}}
    base = RunConfig(**given)  # no algorithm: may carry several methods' settings
    config = base.replace(algorithm=algorithm)
    expected = {name: getattr(config, name) for name in settings}  # through either path
    assert expected == config.settings_read()
    monkeypatch.setattr(RunConfig, "__getattr__", _no_lookup)
    for name in settings:
        assert getattr(config, name) == expected[name]
    if "mu" not in settings:  # carried for another method: still found by a lookup
        monkeypatch.undo()
        assert config.mu == given["mu"]


def _no_lookup(self, name):
    raise AssertionError(f"config.{name} looked up through __getattr__")


def test_fedups_weight_has_its_own_name():
    config = RunConfig(algorithm="fedup", fedup_alpha=0.2)
    assert config.fedup_alpha == 0.2 and "alpha" not in config.to_dict()
    with pytest.raises(ValueError, match="now called fedup_alpha") as err:
        RunConfig(algorithm="fedup", alpha=0.2)
    assert "\n" not in str(err.value)
    # A base config for several methods may carry FedMut's alpha: FedUp ignores it.
    carried = RunConfig(alpha=3.0).replace(algorithm="fedup")
    assert carried.fedup_alpha == settings_of("fedup")["fedup_alpha"].default
    assert carried.replace(algorithm="fedmut").alpha == 3.0


@pytest.mark.parametrize("algorithm", ["mimelite", "stem"])
def test_methods_with_their_own_momentum_run_with_defaults(algorithm, capsys, tmp_path):
    assert RunConfig(algorithm=algorithm).momentum == 0.0
    assert RunConfig(algorithm="fedavg").momentum == 0.9
    # Switching a default config to them takes their default, not FedAvg's 0.9.
    assert RunConfig(rounds=2).replace(algorithm=algorithm).momentum == 0.0
    assert main(["run", "--algorithm", algorithm, *SMALL, "--run-dir",
                 str(tmp_path / algorithm)]) == 0
    assert main(["run", "--algorithm", algorithm, "--momentum", "0.5", *SMALL]) == 2
    assert "must be 0" in capsys.readouterr().err


def test_every_setting_is_declared_with_help_and_a_default_that_passes_its_check():
    for algorithm in algorithm_names():
        for name, setting in settings_of(algorithm).items():
            assert setting.help and "\n" not in setting.help, (algorithm, name)
            assert setting.problem(setting.default) is None


# Generic code: no test of a method's name and no hand-kept list of methods. The paper-figure
# registry (repro/figures.py) is not generic: each entry describes one paper's figure, whose
# lines are named methods.
GENERIC = ["config", "engine", "repro", "flower", "toy"]
PAPER_SPECIFIC = {"figures.py"}


def _name_tests(path: Path, names: set[str]) -> list[str]:
    """Comparisons with a method name and literal collections of two or more of them."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and side.value in names:
                    found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
                if isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                    values = [e.value for e in side.elts if isinstance(e, ast.Constant)]
                    if any(v in names for v in values):
                        found.append(f"{path.name}:{node.lineno} tests membership in {values}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            values = [e.value for e in elts if isinstance(e, ast.Constant)]
            if sum(v in names for v in values) >= 2:
                found.append(f"{path.name}:{node.lineno} lists methods {values}")
    return found


def test_no_generic_module_tests_a_method_name_or_keeps_a_method_list():
    package = Path(__file__).resolve().parent.parent / "flnotes"
    names = set(algorithm_names())
    found = [f for part in GENERIC for path in sorted((package / part).rglob("*.py"))
             if path.name not in PAPER_SPECIFIC for f in _name_tests(path, names)]
    assert not found, found


def test_notebook_parameters_that_are_method_settings_have_their_declared_type():
    """The papermill parameters cells of the reproduction notebooks name method settings by
    their flat names; each one's annotation is its declaration's type (Optional when None is
    allowed there or in the notebook), so papermill --help-notebook documents them right."""
    import papermill as pm

    from flnotes.algorithms import all_settings

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    words = {bool: "bool", int: "int", float: "float", str: "str"}
    checked = 0
    for name in ("10_reproduce_cifar", "11_reproduce_shakespeare", "12_reproduce_fml"):
        for parameter, info in pm.inspect_notebook(str(notebooks / f"{name}.ipynb")).items():
            declared = all_settings().get(parameter)
            if declared is None:
                continue
            setting = next(iter(declared.values()))
            expected = words[setting.kind]
            assert info["inferred_type_name"] in (expected, f"Optional[{expected}]"), (
                name, parameter, info)
            checked += 1
    assert checked >= 2  # FML's a and b in notebook 12; any other goes in `config`
