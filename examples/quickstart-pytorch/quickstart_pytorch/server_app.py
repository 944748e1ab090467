"""The ServerApp: Flower's quickstart-pytorch server, the strategy chosen by name.

Each method replaces Flower's ``FedAvg`` line in :func:`make_strategy`
(marked as the method's snippet region); nothing else on the server changes,
except for MMFL, which trains :data:`NUM_MODELS` models packed in one
ArrayRecord and evaluates each.

The run config's ``strategy`` may name several methods, comma-separated: they
run one after another, each from the same initial model, and with
``output-dir`` set each writes ``<output-dir>/<method>.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from flwr_importance.protocol import query_message_type
from flwr_importance.strategies import (
    FOLB,
    ClusteredSampling,
    FedSampling,
    ISFedAvg,
    MDSampling,
    MultiModelSampling,
    OptimalClientSampling,
    PowerOfChoice,
    pack_models,
    unpack_models,
)
from quickstart_pytorch.client_app import METHOD_QUERY
from quickstart_pytorch.task import Net, load_centralized_dataset
from quickstart_pytorch.task import test as test_fn

app = ServerApp()

#: Models MMFL trains at once (one per task of ``task.load_data``).
NUM_MODELS = 2

#: ``(server_round, arrays) -> metrics``: the central evaluation of a round.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run each method of ``strategy`` with central evaluation every round."""
    methods = [name.strip() for name in str(context.run_config["strategy"]).split(",")]
    initial_arrays = ArrayRecord(Net().state_dict())
    for method in methods:
        if len(methods) > 1:
            start_method(grid, method)
        result = run_method(method, grid, context, initial_arrays)
        output_dir = str(context.run_config["output-dir"])
        if output_dir:
            save_history(result, Path(output_dir) / f"{method}.json")


def run_method(
    method: str, grid: Grid, context: Context, arrays: ArrayRecord
) -> Result:
    """Flower's ``main`` with the method's strategy, from ``arrays``."""
    num_rounds = int(context.run_config["num-server-rounds"])
    lr = float(context.run_config["lr"])
    strategy = make_strategy(method, context)
    evaluate_fn: EvaluateFn = global_evaluate
    if method == "mmfl":
        # --8<-- [start:mmfl-server]
        arrays = pack_models([arrays] * NUM_MODELS)
        evaluate_fn = evaluate_every_model
        # --8<-- [end:mmfl-server]
    return strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=evaluate_fn,
    )


def make_strategy(method: str, context: Context) -> Strategy:
    """Flower's ``FedAvg``, or the method's strategy in its place.

    The library's strategies sample a number of nodes per round: as many as
    FedAvg's ``fraction-train`` of the ``num-supernodes`` nodes.
    """
    fraction_train = float(context.run_config["fraction-train"])
    num_nodes = int(context.run_config["num-supernodes"])
    clients_per_round = round(fraction_train * num_nodes)
    match method:
        case "fedavg":
            strategy: Strategy = FedAvg(fraction_train=fraction_train)
        case "md":
            # --8<-- [start:md-server]
            strategy = MDSampling(clients_per_round=clients_per_round)
            # --8<-- [end:md-server]
        case "clustered":
            # --8<-- [start:clustered-server]
            strategy = ClusteredSampling(clients_per_round=clients_per_round)
            # --8<-- [end:clustered-server]
        case "clustered-size":
            # --8<-- [start:clustered-server]
            strategy = ClusteredSampling(
                clients_per_round=clients_per_round, method="size"
            )
            # --8<-- [end:clustered-server]
        case "power-of-choice":
            # --8<-- [start:power-of-choice-server]
            strategy = PowerOfChoice(clients_per_round=clients_per_round)
            # --8<-- [end:power-of-choice-server]
        case "ocs":
            # --8<-- [start:ocs-server]
            strategy = OptimalClientSampling(clients_per_round=clients_per_round)
            # --8<-- [end:ocs-server]
        case "aocs":
            # --8<-- [start:aocs-server]
            strategy = OptimalClientSampling(
                clients_per_round=clients_per_round, approximate=True
            )
            # --8<-- [end:aocs-server]
        case "mmfl":
            # --8<-- [start:mmfl-server]
            strategy = MultiModelSampling(
                num_models=NUM_MODELS, clients_per_round=clients_per_round
            )
            # --8<-- [end:mmfl-server]
        case "isfedavg":
            # --8<-- [start:isfedavg-server]
            strategy = ISFedAvg(clients_per_round=clients_per_round)
            # --8<-- [end:isfedavg-server]
        case "folb":
            # --8<-- [start:folb-server]
            strategy = FOLB(clients_per_round=clients_per_round, proximal_mu=0.01)
            # --8<-- [end:folb-server]
        case "fedsampling":
            # A size bound above the largest partition (about 144 images) and an
            # epsilon at which 10 nodes' randomized sizes still estimate the total.
            # --8<-- [start:fedsampling-server]
            strategy = FedSampling(
                samples_per_round=32 * clients_per_round,
                max_size=200,
                epsilon=8.0,
                server_lr=0.5,
            )
            # --8<-- [end:fedsampling-server]
        case _:
            raise ValueError(f"unknown strategy '{method}' (known: {METHODS})")
    return strategy


#: The names :func:`make_strategy` knows.
METHODS = (
    "fedavg",
    "md",
    "clustered",
    "clustered-size",
    "power-of-choice",
    "ocs",
    "aocs",
    "mmfl",
    "isfedavg",
    "folb",
    "fedsampling",
)


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on the central test set."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    test_loss, test_acc = test_fn(model, load_centralized_dataset(), device)
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})


def evaluate_every_model(server_round: int, packed: ArrayRecord) -> MetricRecord:
    """MMFL: :func:`global_evaluate` of each model, and their means."""
    per_model = [
        global_evaluate(server_round, arrays) for arrays in unpack_models(packed)
    ]
    accuracies = [float(metrics["accuracy"]) for metrics in per_model]  # type: ignore[arg-type]
    losses = [float(metrics["loss"]) for metrics in per_model]  # type: ignore[arg-type]
    return MetricRecord(
        {
            "accuracy": sum(accuracies) / len(accuracies),
            "loss": sum(losses) / len(losses),
            "accuracy-per-model": accuracies,
        }
    )


def start_method(grid: Grid, method: str) -> None:
    """Tell every node which method runs next (a run of several methods).

    Raises
    ------
    RuntimeError
        If a node does not confirm: it would serve the previous method.
    """
    config = ConfigRecord({"method": method})
    messages = [
        Message(
            RecordDict({"config": config}), node_id, query_message_type(METHOD_QUERY)
        )
        for node_id in grid.get_node_ids()
    ]
    replies = list(grid.send_and_receive(messages))
    failed = [reply for reply in replies if reply.has_error()]
    if failed or len(replies) < len(messages):
        reason = f" ({failed[0].error.reason})" if failed else ""
        raise RuntimeError(
            f"{len(failed)} of {len(messages)} nodes failed{reason} and "
            f"{len(messages) - len(replies)} did not answer the switch to '{method}'"
        )


def save_history(result: Result, path: Path) -> None:
    """Write the run's central evaluation and train metrics, by round, as JSON."""
    history = {
        "evaluate_metrics_serverapp": {
            str(server_round): dict(metrics)
            for server_round, metrics in result.evaluate_metrics_serverapp.items()
        },
        "train_metrics_clientapp": {
            str(server_round): dict(metrics)
            for server_round, metrics in result.train_metrics_clientapp.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history, indent=1))
