"""A Flower Grid in one process: each message goes straight to the ClientApp, in order.

Flower's simulation engine runs the ClientApps in Ray actors, which on a small machine takes seconds
to start; this grid calls the same ClientApp object (``client_app(message, context)``, as a
SuperNode does) with one Context per node that lives as long as the grid, so ``context.state``
persists across rounds as on a real node. The messages are Flower's own (``Message``,
``RecordDict``, ``ArrayRecord``): arrays cross as the bytes an ArrayRecord holds. What it leaves out
is transport: no serialisation to protobuf, no SuperLink, no concurrency, no time-outs. A ClientApp
that raises answers with an error message, as on Flower.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from flnotes.config import RunConfig
from flnotes.engine.history import History
from flnotes.flower.client import client_app
from flnotes.flower.server import FlowerStrategy

FIRST_NODE_ID = 1001  # Flower's node ids are random 64-bit numbers; any distinct ones do


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process (see the module doc)."""

    def __init__(self, app, node_configs: list[dict], run_config: dict | None = None) -> None:
        self.app = app
        self.contexts = {FIRST_NODE_ID + k: Context(
            run_id=1, node_id=FIRST_NODE_ID + k, node_config=dict(node), state=RecordDict(),
            run_config=dict(run_config or {})) for k, node in enumerate(node_configs)}
        self._replies: dict[str, Message] = {}
        self._ids = itertools.count(1)
        self._run = None

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        replies = {str(next(self._ids)): self._deliver(message) for message in messages}
        self._replies.update(replies)
        return list(replies)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, message: Message) -> Message:
        context = self.contexts[message.metadata.dst_node_id]
        try:
            return self.app(message, context)
        except Exception as err:  # noqa: BLE001 - a node's failure is its reply, as on Flower
            return Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=message)


def run_in_process(config: RunConfig, *, dtype: str = "float32", task=None,
                   timeout: float = 600.0) -> History:
    """``config`` through the Flower strategy and ClientApp on an :class:`InProcessGrid` of
    ``num_clients`` nodes (node k has ``partition-id = k``); the engine's History.

    ``task`` goes to the server only: each node builds its own from the config and dtype.
    """
    nodes = [{"partition-id": k, "num-partitions": config.num_clients}
             for k in range(config.num_clients)]
    grid = InProcessGrid(client_app(config, dtype=dtype), nodes)
    strategy = FlowerStrategy(config, task=task, dtype=dtype, timeout=timeout)
    with server_identity():
        return strategy.run(grid)


@contextlib.contextmanager
def server_identity(run_id: int = 1):
    """Within the block, this process is a ServerApp's task, as Flower's runtime says before
    it calls one: a ``Message`` sent by a strategy takes its run and source node from there.
    The previous identity is put back after it."""
    before = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, \
        SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = before
