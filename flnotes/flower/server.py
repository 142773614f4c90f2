"""The server side: a Flower strategy that is the engine's round, message by message.

:class:`FlowerStrategy` holds an engine :class:`~flnotes.engine.sim.Simulation` (task,
flnotes strategy, History, optional run folder) and maps Flower's four hooks onto its two:

- ``configure_train`` -> ``Simulation.begin_round``: the engine's sampling (or the method's
  ``select_clients``) and ``dispatch``; one train message per client, each with its own
  start state, sent to the node whose ``partition-id`` is that client's index;
- ``aggregate_train`` -> ``Simulation.end_round``: the replies, put back in the engine's
  client order (a sum's order decides its last bits), become ClientResults for the method's
  ``aggregate``; then the engine evaluates on the test set and records the round;
- ``configure_evaluate`` sends nothing: the global model is evaluated on the server, as the
  engine does (the server builds the task from the same RunConfig, so it holds the test set
  and every client's sample count, which CluSamp's importance needs); :meth:`evaluate`, the
  ``evaluate_fn`` of ``Strategy.start``, hands those numbers to Flower's Result.

Flower's ``arrays`` argument (its idea of the global model) is not read: the flnotes strategy
owns the global state, and the ``ArrayRecord`` returned each round is a copy of it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy as FlwrStrategy

from flnotes.algorithms.base import ClientResult
from flnotes.config import RunConfig
from flnotes.engine.history import History
from flnotes.engine.sim import Simulation, settings_hash
from flnotes.flower.records import (
    check_dtype,
    check_supported,
    check_timeout,
    config_from_run_config,
    flower_task,
    record_state,
    state_record,
)

log = logging.getLogger("flwr")


class FlowerStrategy(FlwrStrategy):
    """A flnotes method as a Flower strategy (``flwr.serverapp.strategy.Strategy``).

    ``task``: the engine task to use (default: :func:`~flnotes.flower.records.flower_task`
    of the config and ``dtype``); ``timeout``: seconds to wait for nodes and replies.
    """

    def __init__(self, config: RunConfig, *, task=None, dtype: str = "float32",
                 timeout: float = 600.0) -> None:
        check_supported(config.algorithm)
        check_dtype(dtype)
        timeout = check_timeout(timeout)  # before the run folder is taken
        config = config.resolved()
        self.sim = Simulation(config, task=task if task is not None else
                              flower_task(config, dtype))
        if self.sim.start_round != 1:
            self.sim.release()
            raise ValueError(f"run folder {config.run_dir} holds a run already; a Flower run "
                             "starts from round 1: choose another run_dir")
        if self.sim.strategy.keeps_personal_models:
            # The personal models live on the clients (context.state), not in this process;
            # their accuracy arrives in the replies' metrics instead of round_metrics.
            self.sim.strategy.round_metrics = lambda task: {}
        self.config = config
        self.dtype = dtype
        self.timeout = timeout
        self.settings_hash = settings_hash(config)
        self.node_of: dict[int, int] | None = None  # flnotes client -> Flower node id
        self._round: tuple | None = None  # (round, clients, starts, start time)
        self._evaluated: dict[int, dict] = {}  # round -> the engine's evaluation numbers

    @property
    def history(self) -> History:
        """The engine's History of this run (rows so far; final state once finished)."""
        return self.sim.history

    def initial_arrays(self):
        """The round-0 global model as an ArrayRecord (the engine's seeded initial state)."""
        return state_record(self.sim.strategy.global_state)

    def run(self, grid: Grid) -> History:
        """Every round through Flower's ``Strategy.start``, then the engine's finish (final
        state, and ``global_model.pt`` in a run folder)."""
        try:
            self.start(grid, self.initial_arrays(), num_rounds=self.config.rounds,
                       timeout=self.timeout, evaluate_fn=self.evaluate)
            return self.sim.finish()
        finally:
            self.sim.release()

    # ---- who is who ---------------------------------------------------------------
    def discover(self, grid: Grid) -> dict[int, int]:
        """flnotes client index -> Flower node id, from each node's ``partition-id``.

        Waits (up to ``timeout``) for ``num_clients`` nodes, then sends each a query; its
        ClientApp answers with its node config's partition-id after checking it was built
        from the same settings. Nodes with a partition-id >= num_clients are not used.
        """
        need = self.config.num_clients
        deadline = time.monotonic() + self.timeout
        while len(nodes := sorted(grid.get_node_ids())) < need:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(nodes)} Flower nodes connected within "
                                   f"{self.timeout:g} s; {need} are needed (one per flnotes "
                                   "client: num_clients)")
            time.sleep(0.2)
        query = [Message(RecordDict({"config": ConfigRecord(
                     {"settings-hash": self.settings_hash})}),
                     dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]
        node_of: dict[int, int] = {}
        for reply in grid.send_and_receive(query, timeout=self.timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                raise RuntimeError(f"Flower node {node}: {_reason(reply)}")
            partition = int(reply.content["node"]["partition-id"])
            if partition < 0:
                raise ValueError(f"Flower node {node} has no partition-id in its node config; "
                                 "start it with --node-config 'partition-id=K "
                                 f"num-partitions={need}'")
            if partition in node_of:
                raise ValueError(f"two Flower nodes say partition-id={partition} "
                                 f"({node_of[partition]} and {node}); give each its own")
            if partition < need:
                node_of[partition] = node
        if missing := sorted(set(range(need)) - set(node_of)):
            raise ValueError(f"no Flower node has partition-id {missing[0]} "
                             f"({len(missing)} of num_clients={need} missing)")
        return node_of

    # ---- Flower's hooks -------------------------------------------------------------
    def configure_train(self, server_round: int, arrays, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The engine's sampling and dispatch; one message per sampled client."""
        if not self.sim.running:  # diverged: the engine would have stopped here
            return []
        if self.node_of is None:
            self.node_of = self.discover(grid)
        tic = time.perf_counter()
        clients, starts = self.sim.begin_round(server_round)
        strategy = self.sim.strategy
        messages = []
        for client, start in zip(clients, starts, strict=True):
            content = RecordDict({"arrays": state_record(start), "config": ConfigRecord(
                {"server-round": server_round, "client": client,
                 "settings-hash": self.settings_hash})})
            if strategy.has_penalty and not strategy.custom_local_update:
                # What the penalty measures against, beyond the start state (FedUp: X^(t-1)
                # under previous:<name>); the client puts it over its start state.
                anchor = strategy.penalty_anchor(start, client)
                extra = {n: t for n, t in anchor.items() if n not in start or t is not start[n]}
                if extra:
                    content["anchor"] = state_record(extra)
            messages.append(Message(content, dst_node_id=self.node_of[client],
                                    message_type=MessageType.TRAIN))
        self._round = (server_round, clients, starts, tic)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Replies -> ClientResults in the engine's order -> the method's aggregate."""
        if self._round is None or self._round[0] != server_round:
            return None, None  # nothing was sent this round (a diverged run)
        _, clients, starts, tic = self._round
        self._round = None
        device = next(iter(self.sim.strategy.global_state.values())).device
        by_client: dict[int, ClientResult] = {}
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"round {server_round}, Flower node "
                                   f"{reply.metadata.src_node_id}: {_reason(reply)}")
            client = int(reply.content["config"]["client"])
            metrics = dict(reply.content["metrics"])
            state = record_state(reply.content["arrays"], device)
            by_client[client] = ClientResult(client, state, int(metrics.pop("num-examples")),
                                             float(metrics.pop("train_loss")), metrics)
        if missing := [c for c in clients if c not in by_client]:
            raise RuntimeError(f"round {server_round}: no reply from client(s) {missing} "
                               f"within {self.timeout:g} s")
        results = [by_client[c] for c in clients]
        row = self.sim.end_round(server_round, clients, starts, results, time.perf_counter() - tic)
        # Flower's Result keeps training and evaluation apart: the clients' numbers (loss,
        # their extras) and the round's time are training; what the engine measured on the
        # global model (accuracy, loss, the method's round metrics) is server-side
        # evaluation, handed to Flower by evaluate_fn.
        from_clients = {"train_loss", "seconds"} | {k for r in results for k in r.extra}
        numbers = {k: float(v) for k, v in row.items()
                   if isinstance(v, (int, float)) and k != "round" and math.isfinite(v)}
        self._evaluated[server_round] = {k: v for k, v in numbers.items()
                                         if k not in from_clients}
        train = MetricRecord({k: v for k, v in numbers.items() if k in from_clients})
        return state_record(self.sim.strategy.global_state), train

    def evaluate(self, server_round: int, arrays) -> MetricRecord | None:
        """Flower's ``evaluate_fn``: the engine's evaluation of the round's global model
        (None for round 0 and for rounds the engine does not evaluate, eval_every)."""
        values = self._evaluated.pop(server_round, None)
        return MetricRecord(values) if values else None

    def configure_evaluate(self, server_round: int, arrays, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Nothing: ``aggregate_train`` evaluated the global model on the server's test set."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        """No client evaluation (see configure_evaluate)."""
        return None

    def summary(self) -> None:
        """One log line: the method and the federation."""
        c = self.config
        log.info("flnotes %s on %s: %d clients, %d per round, %d rounds, seed %d, %s",
                 c.algorithm, c.dataset, c.num_clients, c.clients_per_round, c.rounds, c.seed,
                 self.dtype)


def _reason(reply: Message) -> str:
    """The last line of a failed reply's reason (the client's exception, not its traceback)."""
    lines = [line.strip() for line in str(reply.error.reason).splitlines() if line.strip()]
    return lines[-1] if lines else "failed without a reason"


def server_app(config: RunConfig | None = None, *, dtype: str | None = None, task=None,
               on_finish=None) -> ServerApp:
    """A ServerApp running ``config`` (default: from Flower's run config, see
    :func:`~flnotes.flower.records.config_from_run_config`); ``on_finish(history)`` gets the
    engine History at the end (tests and notebooks read the final state from it)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_config, settings = ((config, {}) if config is not None
                                else config_from_run_config(context.run_config))
        strategy = FlowerStrategy(run_config, task=task,
                                  dtype=dtype or settings.get("dtype", "float32"),
                                  timeout=settings.get("timeout", 600.0))
        history = strategy.run(grid)
        if on_finish is not None:
            on_finish(history)

    return app
