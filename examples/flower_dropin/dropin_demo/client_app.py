"""A plain PyTorch ClientApp, written as for Flower's own FedAvg: it trains the model it is
sent and returns it. Under FedMut each node is simply sent a different model (a mutant)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dropin_demo.task import Net, load_data, test, train

app = ClientApp()


def _model(message: Message) -> Net:
    model = Net()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train_fn(message: Message, context: Context) -> Message:
    node, run = context.node_config, context.run_config
    partition = int(node["partition-id"])
    x, y = load_data(partition, int(node["num-partitions"]))
    model = _model(message)
    server_round = int(message.content["config"]["server-round"])
    # The batch order from (partition, round): a run is reproducible end to end.
    generator = torch.Generator().manual_seed(10_000 * server_round + partition)
    loss = train(model, x, y, int(run.get("local-epochs", 1)), int(run.get("batch-size", 16)),
                 float(run.get("lr", 0.1)), generator)
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"train_loss": loss,
                                                        "num-examples": len(x)})}),
                   reply_to=message)


@app.evaluate()
def evaluate_fn(message: Message, context: Context) -> Message:
    node = context.node_config
    x, y = load_data(int(node["partition-id"]), int(node["num-partitions"]))
    loss, accuracy = test(_model(message), x, y)
    return Message(RecordDict({"metrics": MetricRecord({"eval_loss": loss, "eval_acc": accuracy,
                                                        "num-examples": len(x)})}),
                   reply_to=message)
