"""The ServerApp: Flower's quickstart-pytorch server with ISFedAvg for FedAvg."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from flwr_importance.strategies import ISFedAvg
from resnetexample.task import Net, load_centralized_dataset
from resnetexample.task import test as test_fn

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's ``main`` with ISFedAvg; central evaluation every round."""
    config = context.run_config
    norm, width = str(config["norm"]), int(config["resnet-width"])
    image_size = int(config["image-size"])
    strategy = ISFedAvg(clients_per_round=int(config["clients-per-round"]))

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net(norm, width)
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(
            model, load_centralized_dataset(image_size), torch.device("cpu")
        )
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net(norm, width).state_dict()),
        train_config=ConfigRecord({"lr": float(config["lr"])}),
        num_rounds=int(config["num-server-rounds"]),
        evaluate_fn=global_evaluate,
    )
    output_dir = str(config["output-dir"])
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        history = {
            "central-evaluation": {
                str(r): dict(m) for r, m in result.evaluate_metrics_serverapp.items()
            },
            "train": {
                str(r): dict(m) for r, m in result.train_metrics_clientapp.items()
            },
        }
        (Path(output_dir) / "history.json").write_text(json.dumps(history, indent=1))
