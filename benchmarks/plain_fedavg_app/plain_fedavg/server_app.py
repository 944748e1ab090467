"""The ServerApp: Flower's FedAvg, evaluated centrally on the digits test split."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from plain_fedavg.task import Net, load_arrays, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedAvg on ``fraction-train`` of the nodes for ``num-server-rounds``."""
    run_config = context.run_config
    torch.manual_seed(int(run_config["seed"]))
    model = Net()
    test_set = load_arrays(str(run_config["data-dir"]), "test")

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, test_set)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    # Federated evaluation is off, as in the simulation app: the server evaluates.
    strategy = FedAvg(
        fraction_train=float(run_config["fraction-train"]), fraction_evaluate=0.0
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        train_config=ConfigRecord({"lr": float(run_config["local-lr"])}),
        num_rounds=int(run_config["num-server-rounds"]),
        evaluate_fn=central_evaluate,
    )
