"""The ServerApp: Flower's quickstart server_fn, FedAvg replaced per method.

``server_fn`` is what a legacy-API project writes; the methods of
flwr-importance take FedAvg's arguments (``clients_per_round`` replacing
``fraction_fit``), so each changes one line (its snippet region). A project
serves it as ``ServerApp(server_fn=server_fn)``, which Flower runs through its
legacy server loop, ``start_grid``. To run several methods in one ``flwr run``
(the run config's ``strategy``, comma-separated), this app's ``main`` runs that
same loop once per method, in turn, and writes each method's rounds to
``<output-dir>/history.json``.
"""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common import Metrics, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import Grid, ServerApp, ServerAppComponents, ServerConfig
from flwr.server.compat import start_grid
from flwr.server.strategy import FedAvg, Strategy

# isort: off
# --8<-- [start:md-server,clustered-server,ocs-server,aocs-server,power-of-choice-server]  # noqa: E501
from flwr_importance import compat

# --8<-- [end:md-server,clustered-server,ocs-server,aocs-server,power-of-choice-server]
# isort: on
from quickstart_legacy.task import Net, get_weights


def weighted_average(metrics: list[tuple[int, Metrics]]) -> Metrics:
    """The clients' validation accuracy, weighted by their example counts."""
    accuracies = [num_examples * float(m["accuracy"]) for num_examples, m in metrics]
    examples = [num_examples for num_examples, _ in metrics]
    return {"accuracy": sum(accuracies) / sum(examples)}


def strategy_for(method: str, context: Context) -> Strategy:
    """The legacy strategy of ``method``: FedAvg, or a method of the library."""
    num_nodes = int(context.run_config["num-supernodes"])
    fraction_fit = float(context.run_config["fraction-fit"])
    # The methods sample as many clients per round as FedAvg's fraction.
    m = max(1, round(fraction_fit * num_nodes))
    # FedAvg's arguments that every method takes as well (compat.LegacyOptions).
    fedavg_arguments: dict[str, Any] = {
        "fraction_evaluate": 1.0,
        "min_available_clients": num_nodes,
        "initial_parameters": ndarrays_to_parameters(get_weights(Net())),
        "evaluate_metrics_aggregation_fn": weighted_average,
    }
    if method == "fedavg":
        return FedAvg(fraction_fit=fraction_fit, **fedavg_arguments)
    # --8<-- [start:md-server]
    if method == "md":
        return compat.MDSampling(clients_per_round=m, **fedavg_arguments)
    # --8<-- [end:md-server]
    # --8<-- [start:clustered-server]
    if method == "clustered":  # Algorithm 1: clusters by sample size
        return compat.ClusteredSampling(
            clients_per_round=m, method="size", **fedavg_arguments
        )
    # --8<-- [end:clustered-server]
    # --8<-- [start:clustered-server]
    if method == "clustered-similarity":  # Algorithm 2: by model similarity
        return compat.ClusteredSampling(clients_per_round=m, **fedavg_arguments)
    # --8<-- [end:clustered-server]
    # --8<-- [start:ocs-server]
    if method == "ocs":
        return compat.OptimalClientSampling(clients_per_round=m, **fedavg_arguments)
    # --8<-- [end:ocs-server]
    # --8<-- [start:aocs-server]
    if method == "aocs":
        return compat.OptimalClientSampling(
            clients_per_round=m, approximate=True, **fedavg_arguments
        )
    # --8<-- [end:aocs-server]
    # --8<-- [start:power-of-choice-server]
    if method == "power-of-choice":
        return compat.PowerOfChoice(clients_per_round=m, **fedavg_arguments)
    # --8<-- [end:power-of-choice-server]
    raise ValueError(f"unknown strategy '{method}' (known: {METHODS})")


#: The names :func:`strategy_for` knows.
METHODS = (
    "fedavg",
    "md",
    "clustered",
    "clustered-similarity",
    "ocs",
    "aocs",
    "power-of-choice",
)


def server_fn(context: Context) -> ServerAppComponents:
    """The run's strategy and number of rounds, as in Flower's quickstart."""
    num_rounds = int(context.run_config["num-server-rounds"])
    strategy = strategy_for(str(context.run_config["strategy"]), context)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds))


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Each method the run config names, through Flower's legacy server loop."""
    history: dict[str, list[dict[str, float]]] = {}
    for method in str(context.run_config["strategy"]).split(","):
        one_method = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=context.node_config,
            state=context.state,
            run_config={**context.run_config, "strategy": method.strip()},
        )
        components = server_fn(one_method)
        result = start_grid(
            grid=grid, strategy=components.strategy, config=components.config
        )
        accuracy = dict(result.metrics_distributed.get("accuracy", []))
        history[method.strip()] = [
            {
                "round": server_round,
                "loss": loss,
                "accuracy": float(accuracy[server_round]),
            }
            for server_round, loss in result.losses_distributed
        ]
        log(
            INFO,
            "legacy-example %s: %d rounds evaluated",
            method,
            len(history[method.strip()]),
        )
    output_dir = str(context.run_config["output-dir"])
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "history.json").write_text(json.dumps(history, indent=1))
