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
from pytorchexample.client_app import METHOD_QUERY
from pytorchexample.task import Net, load_centralized_dataset
from pytorchexample.task import test as test_fn

# Each method's import, one a line: the lines its "Use it" diff adds.
# isort: off
# --8<-- [start:md-server]
from flwr_importance.strategies import MDSampling

# --8<-- [end:md-server]
# --8<-- [start:clustered-server]
from flwr_importance.strategies import ClusteredSampling

# --8<-- [end:clustered-server]
# --8<-- [start:power-of-choice-server]
from flwr_importance.strategies import PowerOfChoice

# --8<-- [end:power-of-choice-server]
# --8<-- [start:ocs-server,aocs-server]
from flwr_importance.strategies import OptimalClientSampling

# --8<-- [end:ocs-server,aocs-server]
# --8<-- [start:mmfl-server]
from flwr_importance.strategies import MultiModelSampling, pack_models
from flwr_importance.strategies import evaluate_every_model, per_model_files

# --8<-- [end:mmfl-server]
# --8<-- [start:isfedavg-server]
from flwr_importance.strategies import ISFedAvg

# --8<-- [end:isfedavg-server]
# --8<-- [start:folb-server]
from flwr_importance.strategies import FOLB

# --8<-- [end:folb-server]
# --8<-- [start:fedsampling-server]
from flwr_importance.strategies import FedSampling
# --8<-- [end:fedsampling-server]
# isort: on

app = ServerApp()

# --8<-- [start:mmfl-server]
#: Models MMFL trains at once (one per task of ``task.load_data``).
NUM_MODELS = 2
# --8<-- [end:mmfl-server]


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
            save_final_model(
                method, result, Path(output_dir) / method / "final_model.pt"
            )


def save_final_model(method: str, result: Result, final_model: Path) -> None:
    """Flower's final save of the model to ``final_model``; MMFL's, of each model."""
    final_model.parent.mkdir(parents=True, exist_ok=True)
    if method == "mmfl":
        # --8<-- [start:mmfl-server]
        # replaces: state_dict = ...; torch.save(state_dict, "final_model.pt")
        for arrays, path in per_model_files(result.arrays, final_model):
            torch.save(arrays.to_torch_state_dict(), path)  # loads into Net
        # --8<-- [end:mmfl-server]
        return
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, final_model)


def run_method(
    method: str, grid: Grid, context: Context, arrays: ArrayRecord
) -> Result:
    """Flower's ``main`` with the method's strategy, from ``arrays``."""
    num_rounds = int(context.run_config["num-server-rounds"])
    lr = float(context.run_config["learning-rate"])
    strategy = make_strategy(method, context)
    if method == "mmfl":
        # --8<-- [start:mmfl-server]
        # after: arrays = ArrayRecord(global_model.state_dict())
        arrays = pack_models([arrays] * NUM_MODELS)  # the models, packed in one
        # --8<-- [end:mmfl-server]
        return strategy.start(
            grid=grid,
            initial_arrays=arrays,
            train_config=ConfigRecord({"lr": lr}),
            num_rounds=num_rounds,
            # --8<-- [start:mmfl-server]
            # replaces: evaluate_fn=global_evaluate,
            evaluate_fn=evaluate_every_model(global_evaluate),
            # --8<-- [end:mmfl-server]
        )
    return strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )


def make_strategy(method: str, context: Context) -> Strategy:
    """Flower's ``FedAvg``, or the method's strategy in its place.

    Each library strategy samples 5 nodes a round: run the app on 10
    (``num-supernodes``; Flower's own default of 2 cannot give 5).
    """
    fraction_evaluate = float(context.run_config["fraction-evaluate"])
    lr = float(context.run_config["learning-rate"])
    strategy: Strategy
    match method:
        case "fedavg":
            strategy = FedAvg(fraction_evaluate=fraction_evaluate)
        case "md":
            # --8<-- [start:md-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = MDSampling(
                clients_per_round=5, fraction_evaluate=fraction_evaluate
            )
            # --8<-- [end:md-server]
        case "clustered":
            # --8<-- [start:clustered-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = ClusteredSampling(
                clients_per_round=5, fraction_evaluate=fraction_evaluate
            )
            # --8<-- [end:clustered-server]
        case "clustered-size":
            strategy = ClusteredSampling(
                clients_per_round=5, fraction_evaluate=fraction_evaluate, method="size"
            )
        case "power-of-choice":
            # --8<-- [start:power-of-choice-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = PowerOfChoice(
                clients_per_round=5, fraction_evaluate=fraction_evaluate
            )
            # --8<-- [end:power-of-choice-server]
        case "ocs":
            # --8<-- [start:ocs-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = OptimalClientSampling(
                clients_per_round=5, fraction_evaluate=fraction_evaluate
            )
            # --8<-- [end:ocs-server]
        case "aocs":
            # --8<-- [start:aocs-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = OptimalClientSampling(
                clients_per_round=5,
                fraction_evaluate=fraction_evaluate,
                approximate=True,
            )
            # --8<-- [end:aocs-server]
        case "mmfl":
            # No federated evaluation: each model is evaluated centrally.
            # --8<-- [start:mmfl-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = MultiModelSampling(num_models=NUM_MODELS, clients_per_round=5)
            # --8<-- [end:mmfl-server]
        case "isfedavg":
            # --8<-- [start:isfedavg-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            # The app's learning rate and batch size, and about one epoch of
            # local steps (len(trainloader): here ~144 images / 32 = 5 batches).
            batch_size = int(context.run_config["batch-size"])
            strategy = ISFedAvg(
                clients_per_round=5,
                fraction_evaluate=fraction_evaluate,
                keep_app_step_size=True,
                batch_size_range=(batch_size, batch_size),
                local_steps_range=(5, 5),
            )
            # --8<-- [end:isfedavg-server]
        case "folb":
            # --8<-- [start:folb-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = FOLB(
                clients_per_round=5,
                fraction_evaluate=fraction_evaluate,
                proximal_mu=0.01,
            )
            # --8<-- [end:folb-server]
        case "fedsampling":
            # An epsilon at which 10 nodes' randomized sizes still estimate the
            # total; no federated evaluation (its replies would reveal the sizes).
            # --8<-- [start:fedsampling-server]
            # replaces: strategy = FedAvg(fraction_evaluate=fraction_evaluate)
            strategy = FedSampling(
                samples_per_round=160,
                # above your largest len(trainloader.dataset) (here about 144),
                # else round 1 warns "set max_size (...) above the largest partition"
                max_size=200,
                epsilon=8.0,
                # your learning rate: the nodes' 20 local steps on their kept
                # samples (about 16 each) and the server's step both take it
                server_lr=lr,
                local_steps=20,
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
