"""The ServerApp: Flower's quickstart-pytorch server, the strategy chosen by name."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from quickstart_pytorch.task import Net, load_centralized_dataset
from quickstart_pytorch.task import test as test_fn

app = ServerApp()


def make_strategy(context: Context) -> Strategy:
    """Flower's FedAvg, as in the quickstart."""
    return FedAvg(fraction_train=float(context.run_config["fraction-train"]))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy with central evaluation of the global model every round."""
    num_rounds = int(context.run_config["num-server-rounds"])
    lr = float(context.run_config["lr"])
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    strategy = make_strategy(context)
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    output_dir = str(context.run_config["output-dir"])
    if output_dir:
        history = {
            str(server_round): dict(metrics)
            for server_round, metrics in result.evaluate_metrics_serverapp.items()
        }
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "history.json").write_text(json.dumps(history, indent=1))


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on every image (the quickstart's central test set)."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    test_loss, test_acc = test_fn(model, load_centralized_dataset(), device)
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
