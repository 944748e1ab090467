"""sklearnexample: Flower's quickstart-sklearn ServerApp, the strategy chosen by name.

Each library method replaces Flower's ``FedAvg`` in one line of
:func:`make_strategy` (marked ``<method>-server``); the multi-model method
(``mmfl``) also starts from two models and evaluates both. The run config's
``strategy`` may name several methods, separated by commas: they run one
after another on the same nodes, each from the same initial model, and with
``output-dir`` set each writes ``<output-dir>/<method>.json``. No node state
carries over from one method to the next: the only state, the updates
:class:`~flwr_importance.clientapps.variance_reduced.KeptUpdateMod` keeps, is replaced
by every round's norm query, which OCS, AOCS and MMFL send to every node
before they sample among the nodes that answered it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import joblib
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss

from sklearnexample.task import (
    NUM_TASKS,
    UNIQUE_LABELS,
    get_model,
    get_model_params,
    load_centralized_data,
    set_initial_params,
    set_model_params,
)

# Each method's imports: the lines its "Use it" block adds.
# isort: off
# --8<-- [start:md-server]
from flwr_importance.strategies import MDSampling

# --8<-- [end:md-server]
# --8<-- [start:clustered-server]
from flwr_importance.strategies import ClusteredSampling

# --8<-- [end:clustered-server]
# --8<-- [start:ocs-server,aocs-server]
from flwr_importance.strategies import OptimalClientSampling

# --8<-- [end:ocs-server,aocs-server]
# --8<-- [start:power-of-choice-server]
from flwr_importance.strategies import PowerOfChoice

# --8<-- [end:power-of-choice-server]
# --8<-- [start:mmfl-server]
from flwr_importance.strategies import MultiModelSampling, pack_models
from flwr_importance.strategies import evaluate_every_model, per_model_files
# --8<-- [end:mmfl-server]
# isort: on

# Flower ServerApp
app = ServerApp()

#: ``(server_round, arrays) -> metrics``: the central evaluation of a run.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def make_strategy(method: str, context: Context) -> Strategy:
    """Flower's ``FedAvg`` or the library method that replaces it.

    The library methods sample as many nodes per round as ``FedAvg`` trains.
    """
    fraction_train = float(context.run_config["fraction-train"])
    clients_per_round = round(
        fraction_train * int(context.run_config["num-supernodes"])
    )
    strategy: Strategy
    match method:
        case "fedavg":
            strategy = FedAvg(fraction_train=fraction_train)
        case "md":
            # --8<-- [start:md-server]
            strategy = MDSampling(clients_per_round=clients_per_round)
            # --8<-- [end:md-server]
        case "clustered":
            # Algorithm 2: clusters of similar model updates.
            # --8<-- [start:clustered-server]
            strategy = ClusteredSampling(clients_per_round=clients_per_round)
            # --8<-- [end:clustered-server]
        case "clustered-size":
            # Algorithm 1: clusters of the nodes' sample counts.
            # --8<-- [start:clustered-server]
            strategy = ClusteredSampling(
                clients_per_round=clients_per_round, method="size"
            )
            # --8<-- [end:clustered-server]
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
        case "power-of-choice":
            # --8<-- [start:power-of-choice-server]
            strategy = PowerOfChoice(clients_per_round=clients_per_round)
            # --8<-- [end:power-of-choice-server]
        case "mmfl":
            # --8<-- [start:mmfl-server]
            strategy = MultiModelSampling(
                num_models=NUM_TASKS, clients_per_round=clients_per_round
            )
            # --8<-- [end:mmfl-server]
        case _:
            raise ValueError(f"unknown strategy '{method}' (known: {METHODS})")
    return strategy


#: The names :func:`make_strategy` knows.
METHODS = (
    "fedavg",
    "md",
    "clustered",
    "clustered-size",
    "ocs",
    "aocs",
    "power-of-choice",
    "mmfl",
)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run each method of the run config, with central evaluation every round."""
    # Read run config
    num_rounds = int(context.run_config["num-server-rounds"])
    local_epochs = int(context.run_config["local-epochs"])

    for method in str(context.run_config["strategy"]).split(","):
        # Create LogisticRegression Model and initial parameters
        model = get_model(local_epochs)
        set_initial_params(model)
        arrays = ArrayRecord(get_model_params(model))
        evaluate_fn: EvaluateFn = global_evaluate
        if method == "mmfl":
            # --8<-- [start:mmfl-server]
            arrays = pack_models([arrays] * NUM_TASKS)
            evaluate_fn = evaluate_every_model(
                [evaluate_task(task) for task in range(NUM_TASKS)]
            )
            # --8<-- [end:mmfl-server]

        # Start strategy, run for `num_rounds`
        result = make_strategy(method, context).start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=num_rounds,
            evaluate_fn=evaluate_fn,
        )
        output_dir = str(context.run_config["output-dir"])
        if output_dir:
            write_history(Path(output_dir) / f"{method}.json", result)
            save_final_model(
                method, model, result, Path(output_dir) / method / "logreg_model.pkl"
            )


def save_final_model(
    method: str, model: LogisticRegression, result: Result, final_model: Path
) -> None:
    """The final model saved with joblib to ``final_model``; MMFL's, each model."""
    final_model.parent.mkdir(parents=True, exist_ok=True)
    if method == "mmfl":
        # --8<-- [start:mmfl-server]
        # replaces: set_model_params(model, ...); joblib.dump(model, ...)
        for arrays, path in per_model_files(result.arrays, final_model):
            joblib.dump(set_model_params(model, arrays.to_numpy_ndarrays()), path)
        # --8<-- [end:mmfl-server]
        return
    joblib.dump(set_model_params(model, result.arrays.to_numpy_ndarrays()), final_model)


def central_metrics(arrays: ArrayRecord, task: int) -> tuple[float, float]:
    """Accuracy and log-loss of the model on the central test set of ``task``."""
    model = set_model_params(get_model(1), arrays.to_numpy_ndarrays())
    X_test, y_test = load_centralized_data(task)  # noqa: N806 (scikit-learn's)
    loss = log_loss(y_test, model.predict_proba(X_test), labels=UNIQUE_LABELS)
    return float(model.score(X_test, y_test)), float(loss)


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on the central test set."""
    accuracy, loss = central_metrics(arrays, task=0)
    return MetricRecord({"accuracy": accuracy, "loss": loss})


# --8<-- [start:mmfl-server]
def evaluate_task(task: int) -> EvaluateFn:
    """MMFL: the central evaluation of the model of ``task``, on its test set."""

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        accuracy, loss = central_metrics(arrays, task)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    return evaluate


# --8<-- [end:mmfl-server]
def write_history(path: Path, result: Result) -> None:
    """The run's central evaluation and the nodes' train metrics, by round."""
    history = {
        "central-evaluation": {
            str(server_round): dict(metrics)
            for server_round, metrics in result.evaluate_metrics_serverapp.items()
        },
        "train": {
            str(server_round): dict(metrics)
            for server_round, metrics in result.train_metrics_clientapp.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history, indent=1))
