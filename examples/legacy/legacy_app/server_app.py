"""The legacy ServerApp: ``server_fn`` returns the chosen strategy and the rounds."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context, UserConfig
from flwr.common import NDArrays, Scalar, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import Strategy

from flwr_importance import compat
from flwr_importance.compat.adapter import EvaluateFn
from flwr_importance.tasks import evaluate, get_weights, set_weights
from legacy_app.task import digits, model_for


def central_evaluation(run_config: UserConfig, num_partitions: int) -> EvaluateFn:
    """Accuracy of the global model on the pooled test set, every round.

    Appends ``{"round", "loss", "accuracy"}`` to ``<output-dir>/history.json``
    when the run config names an output directory.
    """
    task = model_for(run_config, digits(run_config, num_partitions))
    output_dir = str(run_config["output-dir"])
    history: list[dict[str, float]] = []

    def evaluate_fn(
        server_round: int, weights: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, dict[str, Scalar]]:
        set_weights(task.model, weights)
        metrics = evaluate(task.model, task.x, task.y, task.objective)
        if output_dir:
            history.append({"round": server_round, **metrics})
            path = Path(output_dir) / "history.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(history))
        return metrics["loss"], {"accuracy": metrics["accuracy"]}

    return evaluate_fn


def build_strategy(run_config: UserConfig, num_clients: int) -> Strategy:
    """The legacy strategy named by the run config's ``strategy``."""
    name = str(run_config["strategy"])
    clients_per_round = min(int(run_config["clients-per-round"]), num_clients)
    seed = int(run_config["seed"])
    initial = model_for(run_config, digits(run_config, num_clients)).model
    legacy = compat.LegacyOptions(
        initial_parameters=ndarrays_to_parameters(get_weights(initial)),
        evaluate_fn=central_evaluation(run_config, num_clients),
    )
    if name == "fedsampling":
        samples_per_round = clients_per_round * int(
            run_config["samples-per-round-factor"]
        )
        return compat.FedSampling(
            samples_per_round, min_available_nodes=num_clients, legacy=legacy
        )
    client_sampling: dict[str, type[compat.LegacyStrategyAdapter]] = {
        "isfedavg": compat.ISFedAvg,
        "folb": compat.FOLB,
        "clustered": compat.ClusteredSampling,
        "md": compat.MDSampling,
        "ocs": compat.OptimalClientSampling,
    }
    if name not in client_sampling:
        raise ValueError(
            f"unknown strategy '{name}', one of {sorted(client_sampling)} "
            "or fedsampling"
        )
    return client_sampling[name](
        clients_per_round, seed=seed, min_available_nodes=num_clients, legacy=legacy
    )


def server_fn(context: Context) -> ServerAppComponents:
    """The run's strategy and number of rounds."""
    num_clients = int(context.run_config["num-supernodes"])
    return ServerAppComponents(
        strategy=build_strategy(context.run_config, num_clients),
        config=ServerConfig(num_rounds=int(context.run_config["num-server-rounds"])),
    )


app = ServerApp(server_fn=server_fn)
