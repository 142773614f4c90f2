"""The ServerApp: flnotes' drop-in FedMut in place of Flower's FedAvg, nothing else changed.

Settings from [tool.flwr.app.config] (pyproject.toml). With ``run-dir`` set (an absolute
path), the final model and the metrics are written there.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from dropin_demo.task import Net, load_test_data, test
from flnotes.flower.dropin import FedMut

app = ServerApp()


def run(grid: Grid, run_config) -> object:
    """The whole run on ``grid``; Flower's Result."""
    seed = int(run_config.get("seed", 0))
    run_dir = str(run_config.get("run-dir", "")).strip()
    if run_dir and not Path(run_dir).expanduser().is_absolute():
        raise ValueError(f"run-dir = {run_dir!r} is relative; give an absolute path (the "
                         "ServerApp runs in Flower's app folder, not where `flwr run` was typed)")
    strategy = FedMut(alpha=float(run_config.get("alpha", 4.0)), seed=seed,
                      fraction_train=float(run_config.get("fraction-train", 0.5)),
                      fraction_evaluate=float(run_config.get("fraction-evaluate", 0.5)))
    torch.manual_seed(seed)
    model = Net()
    x_test, y_test = load_test_data()

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, x_test, y_test)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    result = strategy.start(grid, ArrayRecord(model.state_dict()),
                            num_rounds=int(run_config.get("num-server-rounds", 10)),
                            evaluate_fn=central_evaluate)
    if run_dir:
        folder = Path(run_dir).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), folder / "final_model.pt")
        metrics = {str(r): dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return result


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, context.run_config)
