"""The ServerApp: Flower's quickstart-pytorch server, the strategy chosen by name.

Each library strategy replaces Flower's ``FedAvg`` in one line of
:func:`make_strategy`; nothing else on the server changes, except for the
multi-model strategy, which trains :data:`NUM_MODELS` models packed in one
ArrayRecord.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from flwr_importance.registry import MethodSpec, methods
from flwr_importance.strategies import (
    FOLB,
    ClusteredSampling,
    FedSampling,
    ISFedAvg,
    MDSampling,
    MultiModelSampling,
    OptimalClientSampling,
    pack_models,
    unpack_models,
)
from quickstart_pytorch.task import Net, load_centralized_dataset
from quickstart_pytorch.task import test as test_fn

app = ServerApp()

#: Models the multi-model strategy trains at once (one per task of task.py).
NUM_MODELS = 2


def with_defaults(spec: MethodSpec) -> Callable[[int], Strategy]:
    """``clients per round -> strategy``: the method with its default settings."""
    return lambda m: spec.build(clients_per_round=m)


#: ``clients per round -> strategy``: Flower's FedAvg and its replacements:
#: every method of the library with its defaults, and those that need more
#: arguments written out.
STRATEGIES: dict[str, Callable[[int], Strategy]] = {
    "fedavg": lambda m: FedAvg(fraction_train=0.5),
    **{spec.name: with_defaults(spec) for spec in methods() if spec.clients_per_round},
    "isfedavg": lambda m: ISFedAvg(clients_per_round=m),
    "folb": lambda m: FOLB(clients_per_round=m, proximal_mu=0.01),
    # A size bound above the largest partition (about 144 images) and an
    # epsilon at which 10 nodes' randomized sizes still estimate the total.
    "fedsampling": lambda m: FedSampling(
        samples_per_round=32 * m, max_size=200, epsilon=8.0, server_lr=0.5
    ),
    "clustered": lambda m: ClusteredSampling(clients_per_round=m),
    "md": lambda m: MDSampling(clients_per_round=m),
    "ocs": lambda m: OptimalClientSampling(clients_per_round=m),
    "aocs": lambda m: OptimalClientSampling(clients_per_round=m, approximate=True),
    "mmfl": lambda m: MultiModelSampling(num_models=NUM_MODELS, clients_per_round=m),
}


def make_strategy(context: Context) -> Strategy:
    """The run config's ``strategy``, with as many clients per round as FedAvg."""
    clients_per_round = round(
        float(context.run_config["fraction-train"])
        * int(context.run_config["num-supernodes"])
    )
    return STRATEGIES[str(context.run_config["strategy"])](clients_per_round)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy with central evaluation of the global model every round."""
    num_rounds = int(context.run_config["num-server-rounds"])
    lr = float(context.run_config["lr"])
    multi_model = context.run_config["strategy"] == "mmfl"
    if multi_model:
        arrays = pack_models(
            [ArrayRecord(Net().state_dict()) for _ in range(NUM_MODELS)]
        )
    else:
        arrays = ArrayRecord(Net().state_dict())

    strategy = make_strategy(context)
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=evaluate_every_model if multi_model else global_evaluate,
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


def evaluate_every_model(server_round: int, packed: ArrayRecord) -> MetricRecord:
    """Each model of the multi-model run, and their mean accuracy and loss."""
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    losses, accuracies = [], []
    for arrays in unpack_models(packed):
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        test_loss, test_acc = test_fn(model, load_centralized_dataset(), device)
        losses.append(test_loss)
        accuracies.append(test_acc)
    return MetricRecord(
        {
            "accuracy": sum(accuracies) / len(accuracies),
            "loss": sum(losses) / len(losses),
            "accuracy-per-model": accuracies,
        }
    )
