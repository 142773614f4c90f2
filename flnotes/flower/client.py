"""The client side: a ClientApp that trains one flnotes client with the engine's local training.

A node is one flnotes client (its ``partition-id``). It builds the task and the method's strategy
from the same RunConfig as the server, once per process (a Ray actor of Flower's simulation runs
many nodes in turn, so the cache holds nothing of one node's own); the strategy object is used only
for its local-training hooks (FedProx's penalty, FedSAM's gradient, FedNTD's teacher, FML's two
models). Training is :func:`flnotes.engine.backends.train_clients` for the one client, with the
batch order drawn from (seed, round, client) as in the engine, so a node trains exactly what the
engine's backend would.

What a node keeps between rounds: only FML's personal model, in ``context.state`` (Flower keeps a
node's context on the node for the whole run, never sends it, and in the simulation engine keeps it
across the actors that run the node). A per-node file would outlive the run and would have to be
named and cleaned up; the context dies with the run, as the personal model does in the engine.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flnotes.algorithms import build_strategy
from flnotes.algorithms.fml import personal_factory
from flnotes.config import RunConfig
from flnotes.engine.backends import train_clients
from flnotes.engine.sim import initial_state, settings_hash
from flnotes.flower.records import (
    check_dtype,
    check_supported,
    config_from_run_config,
    flower_task,
    record_state,
    state_record,
)

# (settings hash, dtype, given task) -> (resolved config, task, strategy), once per process.
_PREPARED: dict[tuple, tuple] = {}

PERSONAL = "fml-personal-{client}"  # context.state key of FML's personal model


class ClientView:
    """The client's strategy as local training sees it, with the server's anchor.

    Everything is the strategy's own but ``penalty_anchor``: what the penalty measures
    against is the start state with the server-sent entries over it (FedUp's X^(t-1));
    without any, the start state, as FedProx's anchor is.
    """

    def __init__(self, strategy, anchor: dict) -> None:
        self._strategy = strategy
        self._anchor = anchor

    def __getattr__(self, name):
        return getattr(self._strategy, name)

    def penalty_anchor(self, start, client):
        return {**start, **self._anchor}


def prepared(config: RunConfig, dtype: str, task=None) -> tuple:
    """(resolved config, task, strategy) for these settings, built once per process."""
    config = config.resolved()
    key = (settings_hash(config), dtype, None if task is None else id(task))
    if key not in _PREPARED:
        _PREPARED.clear()  # one run per process at a time: let the last one's data go
        task = task if task is not None else flower_task(config, dtype)
        _PREPARED[key] = (config, task, build_strategy(config, initial_state(config, task)))
    return _PREPARED[key]


def client_app(config: RunConfig | None = None, *, dtype: str | None = None,
               task=None) -> ClientApp:
    """A ClientApp for ``config`` (default: from Flower's run config, as the server's)."""
    if config is not None:
        check_supported(config.algorithm)
    if dtype is not None:
        check_dtype(dtype)
    app = ClientApp()

    def settings(context: Context) -> tuple[RunConfig, str]:
        run_config, app_settings = ((config, {}) if config is not None
                                    else config_from_run_config(context.run_config))
        return run_config, dtype or app_settings.get("dtype", "float32")

    def check(message: Message, run_config: RunConfig) -> None:
        if message.content["config"]["settings-hash"] != settings_hash(run_config.resolved()):
            raise ValueError("this node's run config differs from the server's (settings "
                             "hash); give both apps the same [tool.flwr.app.config]")

    @app.query()
    def query(message: Message, context: Context) -> Message:
        """Which flnotes client this node is (its partition-id; -1: none configured)."""
        run_config, _ = settings(context)
        check(message, run_config)
        node = context.node_config
        return Message(RecordDict({"node": ConfigRecord({
            "partition-id": int(node.get("partition-id", -1)),
            "num-partitions": int(node.get("num-partitions", -1))})}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        """One client's local update from the start state the server sent."""
        run_config, data_type = settings(context)
        check(message, run_config)
        orders = message.content["config"]
        client, round = int(orders["client"]), int(orders["server-round"])
        partition = context.node_config.get("partition-id")
        if partition is not None and int(partition) != client:
            raise ValueError(f"node with partition-id {partition} was sent client {client}")
        cfg, work, strategy = prepared(run_config, data_type, task)
        device = work.train_x.device
        start = record_state(message.content["arrays"], device)
        anchor = (record_state(message.content["anchor"], device)
                  if "anchor" in message.content else {})
        fml = strategy.keeps_personal_models
        key = PERSONAL.format(client=client)
        if fml:  # this node's personal model, and no other node's (the strategy is shared)
            strategy.personal = ({client: record_state(context.state[key], device)}
                                 if key in context.state else {})
        [result] = train_clients(work, ClientView(strategy, anchor), round, [client], [start], cfg)
        metrics = {"num-examples": result.num_samples, "train_loss": result.train_loss,
                   **{k: float(v) for k, v in result.extra.items()
                      if isinstance(v, (int, float))}}
        if fml:
            context.state[key] = state_record(strategy.personal[client])
            if work.client_test_indices is not None:
                metrics["personal_accuracy"] = personal_accuracy(work, strategy, client)
        return Message(RecordDict({"arrays": state_record(result.state),
                                   "metrics": MetricRecord(metrics),
                                   "config": ConfigRecord({"client": client})}), reply_to=message)

    return app


def personal_accuracy(task, strategy, client: int) -> float:
    """FML: the client's personal model on its held-out rows (as FML.round_metrics)."""
    model = personal_factory(task, strategy.config.personal_models, client)()
    model.load_state_dict(strategy.personal[client])
    x, y = task.client_test_data(client)
    return float(task.evaluate_on(model, x, y, strategy.config.eval_batch_size)["accuracy"])
