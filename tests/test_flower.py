"""flnotes.flower: the methods on Flower give the engine's global model.

Two ways through Flower, both against ``flnotes.run(config).final_state`` in float64 with the
same seed (so the same sampled clients, mutants and recombinations each round):

- every offered method through Flower's ``Strategy.start`` with the ClientApp called in
  this process (:class:`flnotes.flower.inprocess.InProcessGrid`: Flower's Message,
  RecordDict and ArrayRecord, one Context per node kept across rounds; no Ray, no
  transport), because Flower's simulation engine takes about 15 s to start on two cores;
- FedAvg, FedMut and FedMR through Flower's simulation engine
  (``flwr.simulation.run_simulation``, the ClientApps in Ray actors of other processes), as
  the issue asks: FedMut's mutants and FedMR's recombined models are a different model per
  client.
"""

import subprocess
import sys

import pytest
import torch

flwr = pytest.importorskip("flwr")

import flnotes  # noqa: E402
from flnotes.algorithms.fedup import PREVIOUS  # noqa: E402
from flnotes.config import RunConfig  # noqa: E402
from flnotes.engine.sim import sample_clients  # noqa: E402
from flnotes.flower import (  # noqa: E402
    SUPPORTED,
    FlowerStrategy,
    client_app,
    config_from_run_config,
)
from flnotes.flower.client import ClientView  # noqa: E402
from flnotes.flower.inprocess import InProcessGrid, run_in_process, server_identity  # noqa: E402
from flnotes.flower.records import flower_task  # noqa: E402

TOLERANCE = 1e-10


def small(algorithm: str, **changes) -> RunConfig:
    """6 clients, 3 a round, 3 rounds; FedMR recombines from round 2 (stage1_rounds=1)."""
    values = dict(algorithm=algorithm, dataset="synthetic", model="mlp", num_clients=6,
                  clients_per_round=3, rounds=3, stage1_rounds=1, batch_size=32, lr=0.05,
                  momentum=0.5, seed=1, data_options={"num_train": 600, "num_test": 200},
                  device="cpu", eval_every=3)
    values.update(changes)
    return RunConfig.from_dict(values)  # stage1_rounds is FedMR's: the others leave it out


def engine_run(config: RunConfig):
    """The engine's History on the float64 task."""
    return flnotes.run(config, progress=False, task=flower_task(config.resolved(), "float64"))


def engine_state(config: RunConfig):
    """The engine's final global model on the float64 task."""
    return engine_run(config).final_state


def largest_difference(a, b) -> float:
    assert list(a) == list(b)
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_every_offered_method_on_flower_gives_the_engines_model(algorithm):
    config = small(algorithm)
    expected = engine_run(config)
    history = run_in_process(config, dtype="float64")
    assert next(iter(history.final_state.values())).dtype == torch.float64
    assert largest_difference(history.final_state, expected.final_state) <= TOLERANCE
    assert [r["round"] for r in history.rows] == [1, 2, 3]
    for name in ("accuracy", "loss", "train_loss"):  # the server evaluates as the engine
        assert history.rows[-1][name] == pytest.approx(expected.rows[-1][name], abs=1e-9)


def test_fedups_anchor_is_what_makes_it_fedup():
    """The control: a client that takes its start state for the server's X^(t-1) (the
    anchor not carried) trains FedProx-like from round 2 on and ends elsewhere."""
    config = small("fedup", fedup_alpha=0.05)
    expected = engine_state(config)
    original = ClientView.penalty_anchor
    try:
        ClientView.penalty_anchor = lambda self, start, client: {
            **start, **{PREVIOUS + n: t for n, t in start.items()}}
        history = run_in_process(config, dtype="float64")
    finally:
        ClientView.penalty_anchor = original
    assert largest_difference(history.final_state, expected) > 1e-6


def test_fmls_personal_model_stays_in_the_node_context():
    """FML's personal models are in the nodes' context.state, never in a message."""
    config = small("fml")
    nodes = [{"partition-id": k, "num-partitions": 6} for k in range(6)]
    grid = InProcessGrid(client_app(config, dtype="float64"), nodes)
    strategy = FlowerStrategy(config, dtype="float64")
    with server_identity():
        strategy.run(grid)
    sampled = {c for r in range(1, 4) for c in sample_clients(config, r)}
    kept = {k for k, context in enumerate(grid.contexts.values())
            if f"fml-personal-{k}" in context.state}
    assert kept == sampled


def test_flower_simulation_engine_gives_the_engines_fedavg_fedmut_and_fedmr():
    """FedAvg, FedMut and FedMR through flwr.simulation.run_simulation (the ClientApps in
    Ray actors of other processes): each gives the engine's model. The three runs share one
    simulation, which takes about 15 s to start here: the ServerApp runs them one after
    another, and each node's ClientApp hands a message to the method's own ClientApp, found
    by the settings hash the message carries."""
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from flnotes.engine.sim import settings_hash

    configs = [small(name) for name in ("fedavg", "fedmut", "fedmr")]
    apps = {settings_hash(c.resolved()): client_app(c, dtype="float64") for c in configs}
    node = ClientApp()

    @node.query()
    def query(message: Message, context: Context) -> Message:
        return apps[message.content["config"]["settings-hash"]](message, context)

    @node.train()
    def train(message: Message, context: Context) -> Message:
        return apps[message.content["config"]["settings-hash"]](message, context)

    got = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for config in configs:
            got[config.algorithm] = FlowerStrategy(config, dtype="float64").run(grid)

    run_simulation(server_app=server, client_app=node, num_supernodes=6,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0},
                                   "init_args": {"num_cpus": 1}})
    assert list(got) == ["fedavg", "fedmut", "fedmr"]
    for config in configs:
        expected = engine_state(config)
        assert largest_difference(got[config.algorithm].final_state, expected) <= TOLERANCE


def test_a_node_built_from_other_settings_refuses():
    config = small("fedavg")
    nodes = [{"partition-id": k} for k in range(6)]
    grid = InProcessGrid(client_app(config.replace(lr=0.1)), nodes)
    with server_identity(), pytest.raises(RuntimeError, match="differs from the server's"):
        FlowerStrategy(config).run(grid)


def test_a_node_without_partition_id_is_named():
    config = small("fedavg")
    grid = InProcessGrid(client_app(config), [{} for _ in range(6)])
    with server_identity(), pytest.raises(ValueError, match="no partition-id"):
        FlowerStrategy(config).run(grid)


def test_a_method_not_offered_is_one_line():
    with pytest.raises(ValueError, match="not offered on Flower") as err:
        FlowerStrategy(small("scaffold"))
    assert "\n" not in str(err.value)


def test_flowers_run_config_becomes_a_runconfig():
    config, app = config_from_run_config({
        "algorithm": "fedmut", "num-clients": 6, "clients_per_round": 3, "lr": 0.05,
        "data-options": '{"num_train": 600}', "dtype": "float64"})
    assert config == RunConfig(algorithm="fedmut", num_clients=6, clients_per_round=3,
                               lr=0.05, data_options={"num_train": 600})
    assert app == {"dtype": "float64"}
    with pytest.raises(ValueError, match="not a JSON object"):
        config_from_run_config({"data-options": "{num_train: 1"})
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        config_from_run_config({"learning-rate": 0.1})


def test_import_flnotes_does_not_import_flwr():
    code = "import sys, flnotes; flnotes.RunConfig(); print('flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_without_flwr_the_error_is_one_line(monkeypatch):
    for name in list(sys.modules):
        if name == "flwr" or name.startswith(("flwr.", "flnotes.flower")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    with pytest.raises(ImportError) as err:
        import flnotes.flower  # noqa: F401
    assert str(err.value) == "flnotes.flower needs Flower: pip install 'flnotes[flower]'"
