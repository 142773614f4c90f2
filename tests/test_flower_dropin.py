"""flnotes.flower.dropin: FedMut, FedQP, FedMR, FedExP and CluSamp as Flower strategies for
any ClientApp.

- Against the engine: a drop-in run through Flower's ``Strategy.start`` on an
  :class:`~flnotes.flower.inprocess.InProcessGrid` of six nodes, each node's ClientApp
  training its client with flnotes' own local training from the model it was sent, gives
  ``flnotes.run``'s global model of the same config in float64 (same seed: same clients,
  mutants, recombinations and draws).
- With a plain PyTorch ClientApp that knows nothing of flnotes (the example app,
  examples/flower_dropin/): every drop-in runs a few rounds, each client gets its own model.
- FedExP's step on hand-made updates is ``server_step_size``'s.
- Bad hyperparameters are one line.
- A restarted ServerApp given the state file goes on where the last run stopped and ends
  with the uninterrupted run's model and strategy state; another run's file is refused.
- Nodes that join after round 1 are sampled from then on (numbered as first seen); a node
  that left is not sent a model; CluSamp keeps the nodes of round 1.
- Each drop-in's signature names Flower FedAvg's arguments (help(), Jupyter's tooltips) and
  passes them on.
"""

import inspect
import math
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

import flnotes  # noqa: E402
from flnotes.algorithms import build_strategy, settings_of  # noqa: E402
from flnotes.algorithms.fedexp import server_step_size  # noqa: E402
from flnotes.config import RunConfig  # noqa: E402
from flnotes.engine.backends import train_clients  # noqa: E402
from flnotes.engine.sim import initial_state  # noqa: E402
from flnotes.flower import CluSamp, FedCross, FedExP, FedMR, FedMut, FedQP  # noqa: E402
from flnotes.flower.dropin import DROP_INS, DropInStrategy  # noqa: E402
from flnotes.flower.inprocess import FIRST_NODE_ID, InProcessGrid, server_identity  # noqa: E402
from flnotes.flower.records import flower_task, record_state, state_record  # noqa: E402

TOLERANCE = 1e-10
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flower_dropin"


def small(algorithm: str, **changes) -> RunConfig:
    """6 clients, 3 a round, 3 rounds (as tests/test_flower.py), float64 comparisons."""
    values = dict(algorithm=algorithm, dataset="synthetic", model="mlp", num_clients=6,
                  clients_per_round=3, rounds=3, batch_size=32, lr=0.05, momentum=0.5,
                  seed=1, data_options={"num_train": 600, "num_test": 200}, device="cpu",
                  eval_every=3)
    values.update(changes)
    return RunConfig.from_dict(values)


def flnotes_trained(config: RunConfig, task) -> ClientApp:
    """A ClientApp whose node (partition-id k) trains flnotes client k with the engine's
    local training (batch order from (seed, round, client)) from whatever model it is sent;
    it knows nothing of the method's server side."""
    cfg = config.resolved()
    local = build_strategy(cfg, initial_state(cfg, task))  # for its local hooks (none here)
    app = ClientApp()

    @app.train()
    def train(message: Message, context) -> Message:
        client = int(context.node_config["partition-id"])
        server_round = int(message.content["config"]["server-round"])
        start = record_state(message.content["arrays"])
        [result] = train_clients(task, local, server_round, [client], [start], cfg)
        return Message(RecordDict({
            "arrays": state_record(result.state),
            "metrics": MetricRecord({"num-examples": result.num_samples,
                                     "train_loss": result.train_loss})}), reply_to=message)

    return app


def largest_difference(a, b) -> float:
    assert list(a) == list(b)
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


# method -> (the engine's config changes, the drop-in's arguments). CluSamp with uniform
# importance: Flower's server learns the clients' sample counts only from their replies.
SAME = {
    "fedmut": ({"alpha": 2.0, "beta_rounds": 2}, {"alpha": 2.0, "beta_rounds": 2}),
    "fedqp": ({"qp_prob": 0.5}, {}),
    "fedmr": ({"stage1_rounds": 1}, {"stage1_rounds": 1}),
    "fedexp": ({"fedexp_eps": 1e-4}, {"eps": 1e-4}),
    "clusamp": ({"weighting": "uniform"}, {"weighting": "uniform"}),
    "fedcross": ({"cross_alpha": 0.7}, {"alpha": 0.7}),
}


@pytest.mark.parametrize("method", list(SAME))
def test_the_drop_in_gives_the_engines_global_model(method):
    engine_changes, arguments = SAME[method]
    config = small(method, **engine_changes)
    task = flower_task(config.resolved(), "float64")
    expected = flnotes.run(config, progress=False, task=task).final_state
    nodes = [{"partition-id": k} for k in range(config.num_clients)]
    grid = InProcessGrid(flnotes_trained(config, task), nodes)
    strategy = DROP_INS[method](seed=config.seed, fraction_train=0.5, fraction_evaluate=0.0,
                                **arguments)
    start = state_record(initial_state(config.resolved(), task))
    with server_identity():
        result = strategy.start(grid, start, num_rounds=config.rounds)
    got = record_state(result.arrays)
    assert next(iter(got.values())).dtype == torch.float64
    assert largest_difference(got, expected) <= TOLERANCE
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]


def example_apps():
    """The example's ClientApp and model (examples/flower_dropin/), imported from there."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        from dropin_demo import client_app, task
    finally:
        sys.path.remove(str(EXAMPLE))
    return client_app.app, task


def plain_grid(num_nodes: int = 6, **run_config) -> InProcessGrid:
    app, _ = example_apps()
    nodes = [{"partition-id": k, "num-partitions": num_nodes} for k in range(num_nodes)]
    return InProcessGrid(app, nodes, run_config={"local-epochs": 1, "batch-size": 16,
                                                 "lr": 0.1, **run_config})


class Recording(InProcessGrid):
    """An InProcessGrid that keeps every train message's arrays, by round and node."""

    def __init__(self, grid: InProcessGrid) -> None:
        self.__dict__.update(grid.__dict__)
        self.sent: dict[int, dict[int, OrderedDict]] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == "train":
                rnd = int(m.content["config"]["server-round"])
                self.sent.setdefault(rnd, {})[m.metadata.dst_node_id] = record_state(
                    m.content["arrays"])
        return super().push_messages(messages)


def run_plain(strategy, rounds: int = 3, grid=None, evaluate_fn=None):
    """``rounds`` of ``strategy`` with the example's ClientApp on six nodes, from the same
    initial model every time."""
    _, task = example_apps()
    grid = grid if isinstance(grid, Recording) else Recording(grid or plain_grid())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = task.Net()
    with server_identity():
        result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=rounds,
                                evaluate_fn=evaluate_fn)
    return result, grid


@pytest.mark.parametrize("strategy", [FedMut(seed=0, fraction_train=0.5),
                                      FedQP(seed=0, fraction_train=0.5),
                                      FedMR(seed=0, fraction_train=0.5),
                                      FedExP(seed=0, fraction_train=0.5),
                                      CluSamp(seed=0, fraction_train=0.5),
                                      FedCross(seed=0, fraction_train=0.5)],
                         ids=lambda s: type(s).__name__)
def test_each_drop_in_runs_with_a_plain_torch_clientapp(strategy):
    result, grid = run_plain(strategy)
    state = record_state(result.arrays)
    _, task = example_apps()
    assert list(state) == list(task.Net().state_dict())  # BatchNorm's buffers included
    assert all(torch.isfinite(t.double()).all() for t in state.values())
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]  # FedAvg's evaluation
    assert all(0 <= m["eval_acc"] <= 1 for m in result.evaluate_metrics_clientapp.values())
    assert all(len(grid.sent[r]) == 3 for r in (1, 2, 3)) or type(strategy) is CluSamp
    extra = {"FedExP": "server_step", "FedMR": "model_similarity", "CluSamp": "clusters",
             "FedCross": "model_similarity"}
    if type(strategy).__name__ in extra:
        assert extra[type(strategy).__name__] in result.train_metrics_clientapp[3]


@pytest.mark.parametrize("cls", [FedMut, FedQP, FedMR, FedCross])
def test_each_sampled_client_is_sent_its_own_model(cls):
    """FedMut's mutants, FedMR's recombinations and FedCross's middleware models: round 3's
    three models all differ (FedMR from round 2 on, stage1_rounds=1)."""
    arguments = {"stage1_rounds": 1} if cls is FedMR else {}
    _, grid = run_plain(cls(seed=0, fraction_train=0.5, **arguments))
    models = list(grid.sent[3].values())
    assert len(models) == 3
    for i in range(3):
        for j in range(i):
            assert largest_difference(models[i], models[j]) > 1e-6
    first = list(grid.sent[1].values())  # round 1: the initial model for all
    assert largest_difference(first[0], first[1]) == 0


def test_the_seed_makes_the_mutations_reproducible():
    _, again = run_plain(FedMut(seed=3, fraction_train=0.5))
    _, same = run_plain(FedMut(seed=3, fraction_train=0.5))
    _, other = run_plain(FedMut(seed=4, fraction_train=0.5))
    assert same.sent[3].keys() == again.sent[3].keys()
    for node, state in same.sent[3].items():
        assert largest_difference(state, again.sent[3][node]) == 0
    assert (other.sent[3].keys() != same.sent[3].keys()
            or any(largest_difference(s, other.sent[3][n]) > 0
                   for n, s in same.sent[3].items()))


class Changing(Recording):
    """A Recording grid whose ``late`` nodes connect after round 1 and whose ``gone`` nodes
    disconnect after round 2 (as ``get_node_ids`` says)."""

    def __init__(self, grid: InProcessGrid, late: set[int], gone: set[int]) -> None:
        super().__init__(grid)
        self.late, self.gone = late, gone

    def get_node_ids(self):
        hidden = (self.late if len(self.sent) < 1 else set()) | (
            self.gone if len(self.sent) >= 2 else set())
        return [n for n in super().get_node_ids() if n not in hidden]


@pytest.mark.parametrize("cls, arguments", [(FedMut, {}), (FedMR, {"stage1_rounds": 1}),
                                            (CluSamp, {}), (FedCross, {})],
                         ids=["FedMut", "FedMR", "CluSamp", "FedCross"])
def test_nodes_that_join_later_are_sampled(cls, arguments):
    """Nodes 3, 4, 5 connect after round 1; node 0 leaves after round 2. K = 2 (3 nodes at
    round 1, min_train_nodes=2)."""
    late = {FIRST_NODE_ID + k for k in (3, 4, 5)}
    gone = {FIRST_NODE_ID}
    grid = Changing(plain_grid(), late, gone)
    strategy = cls(seed=0, fraction_train=0.5, fraction_evaluate=0.0, **arguments)
    result, _ = run_plain(strategy, rounds=6, grid=grid)
    assert all(torch.isfinite(t.double()).all() for t in record_state(result.arrays).values())
    assert not set(grid.sent[1]) & late
    later = set().union(*(grid.sent[r] for r in range(2, 7)))
    if cls is CluSamp:  # a fixed population: the nodes of round 1
        assert strategy.nodes == [FIRST_NODE_ID + k for k in range(3)]
        assert not later & late
        return
    assert strategy.nodes == [FIRST_NODE_ID + k for k in range(6)]  # numbered as first seen
    assert later & late
    assert not set().union(*(grid.sent[r] for r in range(3, 7))) & gone
    assert all(len(grid.sent[r]) == 2 for r in range(1, 7))


def same_values(a, b) -> bool:
    """Nested dicts, lists, tensors and numbers equal to the last bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same_values(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same_values(x, y) for x, y in zip(a, b, strict=True)))
    return a == b


RESUMED = [(FedMut, {}), (FedQP, {}), (FedMR, {"stage1_rounds": 1}), (FedExP, {}),
           (CluSamp, {}), (FedCross, {})]


@pytest.mark.parametrize("cls, arguments", RESUMED, ids=[c.__name__ for c, _ in RESUMED])
def test_a_restarted_server_app_resumes_from_the_state_file(cls, arguments, tmp_path):
    """4 rounds in one go against 2 rounds, then a new strategy object (a restarted
    ServerApp) on a new grid with the same state_file and num_rounds=4."""
    def make(**more):
        return cls(seed=0, fraction_train=0.5, **arguments, **more)

    uninterrupted = make()
    whole, _ = run_plain(uninterrupted, rounds=4)
    state_file = tmp_path / "dropin-state.pt"
    first = make(state_file=state_file)
    run_plain(first, rounds=2)
    assert state_file.exists() and not list(tmp_path.glob("*.tmp"))
    restarted = make(state_file=state_file)
    evaluated = []

    def evaluate_fn(server_round, arrays):
        evaluated.append(server_round)
        return None

    result, grid = run_plain(restarted, rounds=4, evaluate_fn=evaluate_fn)
    assert restarted.resumed_round == 2
    assert sorted(grid.sent) == [3, 4]  # rounds 1 and 2 are not run again
    assert evaluated == [3, 4]
    assert sorted(result.train_metrics_clientapp) == [3, 4]
    assert largest_difference(record_state(result.arrays), record_state(whole.arrays)) == 0
    assert same_values(restarted.strategy.state_dict(), uninterrupted.strategy.state_dict())
    assert restarted.sizes == uninterrupted.sizes
    assert restarted.nodes == uninterrupted.nodes
    # the file now says round 4: a start at num_rounds=4 runs nothing, returns that model
    again = make(state_file=state_file)
    done, grid = run_plain(again, rounds=4)
    assert again.resumed_round == 4 and grid.sent == {}
    assert largest_difference(record_state(done.arrays), record_state(whole.arrays)) == 0


def test_another_runs_state_file_is_refused(tmp_path):
    state_file = tmp_path / "state.pt"
    run_plain(FedMut(seed=0, fraction_train=0.5, state_file=state_file), rounds=1)
    with pytest.raises(ValueError, match=r"is another run's \(seed=0, not 1\)") as err:
        run_plain(FedMut(seed=1, fraction_train=0.5, state_file=state_file), rounds=2)
    assert "\n" not in str(err.value)
    state_file.write_bytes(b"not a state file")
    with pytest.raises(ValueError, match="cannot be read"):
        run_plain(FedMut(seed=0, fraction_train=0.5, state_file=state_file), rounds=2)


def handmade_app(deltas: dict[int, dict], sizes: dict[int, int]) -> ClientApp:
    """Node k returns the model it was sent plus deltas[k], with sizes[k] examples."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        start = record_state(message.content["arrays"])
        local = OrderedDict((n, t + deltas[k][n]) for n, t in start.items())
        return Message(RecordDict({"arrays": state_record(local),
                                   "metrics": MetricRecord({"num-examples": sizes[k]})}),
                       reply_to=message)

    return app


def test_fedexp_step_is_server_step_size_on_handmade_updates():
    w0 = OrderedDict([("w", torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)),
                      ("b", torch.tensor([0.25], dtype=torch.float64))])
    deltas = {0: {"w": torch.tensor([1.0, 0.0, 0.0]), "b": torch.tensor([0.5])},
              1: {"w": torch.tensor([-1.0, 0.2, 0.0]), "b": torch.tensor([-0.4])},
              2: {"w": torch.tensor([0.0, 0.0, 2.0]), "b": torch.tensor([0.0])}}
    deltas = {k: {n: t.double() for n, t in d.items()} for k, d in deltas.items()}
    sizes = {0: 10, 1: 30, 2: 20}
    grid = InProcessGrid(handmade_app(deltas, sizes), [{"partition-id": k} for k in range(3)])
    strategy = FedExP(eps=1e-3, seed=0, min_available_nodes=3, min_train_nodes=3)
    with server_identity():
        messages = strategy.configure_train(1, state_record(w0), ConfigRecord(), grid)
        assert len(messages) == 3
        arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    locals_ = [OrderedDict((n, w0[n] + deltas[k][n]) for n in w0) for k in range(3)]
    step = server_step_size(w0, locals_, [10.0, 30.0, 20.0], 1e-3)
    assert step > 1  # the updates disagree: FedExP extrapolates
    assert metrics["server_step"] == pytest.approx(step, rel=1e-12)
    mean = {n: sum(sizes[k] * deltas[k][n] for k in range(3)) / 60 for n in w0}
    got = record_state(arrays)  # round 1: the iterate itself, w0 + step * mean update
    for n in w0:
        assert torch.allclose(got[n], w0[n] + step * mean[n], rtol=0, atol=1e-12)


@pytest.mark.parametrize("make, text", [
    (lambda: FedMut(alpha=-1.0), "FedMut(alpha=-1.0) is invalid"),
    (lambda: FedMut(beta0=1.5), "FedMut(beta0=1.5) is invalid"),
    (lambda: FedMut(beta_rounds=0), "FedMut(beta_rounds=0) is invalid"),
    (lambda: FedMut(mutation="uniform"), "FedMut(mutation='uniform') is invalid"),
    (lambda: FedQP(qp_prob=2.0), "FedQP(qp_prob=2.0) is invalid"),
    (lambda: FedMR(segments=-1), "FedMR(segments=-1) is invalid"),
    (lambda: FedExP(eps=0.0), "FedExP(eps=0.0) is invalid"),
    (lambda: CluSamp(distance="l3"), "CluSamp(distance='l3') is invalid"),
    (lambda: CluSamp(sketch=8, distance="l1"), "CluSamp(sketch=8) is invalid"),
    (lambda: FedMut(weighting="equal"), "FedMut(weighting='equal') is invalid"),
    (lambda: FedMut(seed=-1), "FedMut(seed=-1) is invalid"),
    (lambda: FedMut(alpah=1.0), "did you mean 'alpha'"),
])
def test_bad_hyperparameters_are_one_line(make, text):
    with pytest.raises((ValueError, TypeError)) as err:
        make()
    assert text in str(err.value)
    assert "\n" not in str(err.value)


def _mean_of_nothing(contents, key):
    return MetricRecord({})


def _also_nothing(contents, key):
    return MetricRecord({})


# One value per FedAvg argument, none of them its default.
FEDAVG_VALUES = {"fraction_train": 0.25, "fraction_evaluate": 0.75, "min_train_nodes": 3,
                 "min_evaluate_nodes": 4, "min_available_nodes": 5, "weighted_by_key": "n",
                 "arrayrecord_key": "model", "configrecord_key": "settings",
                 "train_metrics_aggr_fn": _mean_of_nothing,
                 "evaluate_metrics_aggr_fn": _also_nothing}


@pytest.mark.parametrize("cls", list(DROP_INS.values()), ids=lambda c: c.__name__)
def test_each_drop_in_names_fedavgs_arguments(cls):
    fedavg = {n: p for n, p in inspect.signature(FedAvg.__init__).parameters.items()
              if n != "self"}
    # a FedAvg argument the installed Flower added must be listed in the drop-ins too
    assert sorted(FEDAVG_VALUES) == sorted(fedavg)
    parameters = inspect.signature(cls).parameters
    assert not [p for p in parameters.values() if p.kind is p.VAR_KEYWORD]
    for name, parameter in fedavg.items():
        assert parameters[name].default == parameter.default, name
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    strategy = cls(**FEDAVG_VALUES)
    for name, value in FEDAVG_VALUES.items():  # passed on to FedAvg unchanged
        assert getattr(strategy, name) == value, name
    with pytest.raises(TypeError, match="'min_train_node'") as err:
        cls(min_train_node=3)
    assert "did you mean 'min_train_nodes'" in str(err.value)


def test_users_subclasses_keep_their_constructors():
    """A drop-in's made constructor hands on to the next class of a user's MRO, and a user's
    own DropInStrategy that names a method still takes a dict of settings."""
    class Logged(DropInStrategy):
        def __init__(self, settings, **kwargs):
            self.logged = True
            super().__init__(settings, **kwargs)

    class LoggedFedMut(FedMut, Logged):
        pass

    both = LoggedFedMut(alpha=2.0, min_train_nodes=3)
    assert both.logged and both.settings["alpha"] == 2.0 and both.min_train_nodes == 3
    assert both.settings["beta0"] == settings_of("fedmut")["beta0"].default

    class Mine(DropInStrategy):
        method = "fedmut"

    mine = Mine({"alpha": 2.0}, seed=1)
    assert mine.settings == {"alpha": 2.0} and mine.seed == 1
    with pytest.raises(TypeError):
        FedMut({"alpha": 2.0})  # a shipped drop-in takes keywords only


def test_fedmr_segments_beyond_the_model_is_one_line_at_round_1():
    with pytest.raises(ValueError, match=r"FedMR segments=99 is invalid") as err:
        run_plain(FedMR(segments=99, seed=0), rounds=1)
    assert "\n" not in str(err.value)


def test_the_defaults_are_flnotes_defaults():
    renamed = {cls: {v: k for k, v in cls.renamed.items()} for cls in DROP_INS.values()}
    for method, cls in DROP_INS.items():
        parameters = inspect.signature(cls).parameters
        for name, setting in settings_of(method).items():
            if name == "secure_exchanges":  # not offered (see the module doc)
                continue
            argument = renamed[cls].get(name, name)
            assert parameters[argument].default == setting.default, (method, name)


def test_a_failed_node_is_left_out():
    """A node whose ClientApp raises is logged and left out, as FedAvg does; FedMR then
    recombines the models it got, one per client of the next round."""
    grid = plain_grid()
    app = grid.app

    def node_two_fails(message, context):
        if int(context.node_config["partition-id"]) == 2:
            raise RuntimeError("node down")
        return app(message, context)

    grid.app = node_two_fails
    result, sent = run_plain(FedMR(seed=0, fraction_evaluate=0.0), rounds=3, grid=grid)
    state = record_state(result.arrays)
    assert all(torch.isfinite(t.double()).all() for t in state.values())
    assert len(sent.sent[1]) == 6  # fraction_train=1.0: every node
    assert len(sent.sent[2]) == 5  # five models came back to recombine
    assert len(sent.sent[3]) == 5 - (FIRST_NODE_ID + 2 in sent.sent[2])


def test_the_example_app_runs_the_drop_in_fedmut():
    """examples/flower_dropin's ServerApp body (its strategy and evaluation) on six nodes."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        from dropin_demo import server_app
    finally:
        sys.path.remove(str(EXAMPLE))
    grid = plain_grid(**{"num-server-rounds": 3, "fraction-train": 0.5})
    with server_identity():
        result = server_app.run(grid, grid.contexts[FIRST_NODE_ID].run_config)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    assert math.isfinite(result.evaluate_metrics_serverapp[3]["loss"])
