"""The legacy ServerApp: ``server_fn`` returns the chosen strategy and the rounds."""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

from flwr.app import Context, UserConfig
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import Strategy

from flwr_importance import compat
from flwr_importance.compat.adapter import EvaluateFn
from flwr_importance.registry import methods
from flwr_importance.sampling import (
    epsilon_for_usable_estimate,
    ldp_alpha,
    nodes_for_usable_estimate,
)
from flwr_importance.tasks import evaluate, get_weights, set_weights
from legacy_app.task import digits, model_for

HistoryRow = dict[str, float]


def central_evaluation(run_config: UserConfig, num_partitions: int) -> EvaluateFn:
    """Accuracy of the global model on the pooled test set, every round.

    Writes the rounds so far to ``<output-dir>/history.json`` after every
    round, and their plot to ``<output-dir>/convergence.png`` after the last
    (when matplotlib is installed), as the simulation app does; an empty
    ``output-dir`` writes nothing.
    """
    task = model_for(run_config, digits(run_config, num_partitions))
    output_dir = Path(str(run_config["output-dir"]))
    last_round = int(run_config["num-server-rounds"])
    title = f"{run_config['strategy']} (legacy API), {num_partitions} clients"
    history: list[HistoryRow] = []

    def evaluate_fn(
        server_round: int, weights: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, dict[str, Scalar]]:
        set_weights(task.model, weights)
        metrics = evaluate(task.model, task.x, task.y, task.objective)
        if str(run_config["output-dir"]):
            history.append({"round": server_round, **metrics})
            output_dir.mkdir(parents=True, exist_ok=True)
            path = output_dir / "history.json"
            path.write_text(json.dumps(history, indent=1))
            if server_round == last_round:
                log(INFO, "History written to %s", path)
                plot_history(history, output_dir / "convergence.png", title)
        return metrics["loss"], {"accuracy": metrics["accuracy"]}

    return evaluate_fn


def plot_history(history: list[HistoryRow], path: Path, title: str) -> None:
    """The central loss and accuracy per round as a PNG, if matplotlib is there.

    matplotlib comes with the ``sim`` extra; without it the history alone is
    written (the server side needs no plotting library).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        log(INFO, "matplotlib not installed: no plot (history.json has the rounds)")
        return
    rounds = [row["round"] for row in history]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, metric in zip(axes, ("loss", "accuracy"), strict=True):
        axis.plot(rounds, [row[metric] for row in history], marker=".")
        axis.set(xlabel="round", ylabel=f"central test {metric}")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    log(INFO, "Plot written to %s", path)


def fedsampling(run_config: UserConfig, num_clients: int) -> compat.FedSampling:
    """FedSampling with the run config's size bound and epsilon, if they can work.

    Raises
    ------
    ValueError
        ``fedsampling-max-size`` does not exceed the largest partition (its
        size would be clipped and the estimate would undercount: this example
        knows the partitions, a deployed server does not), or
        ``num_clients`` nodes are too few for the epsilon to give a usable size
        estimate (the error says which epsilon would do).
    """
    max_size = int(run_config["fedsampling-max-size"])
    epsilon = float(run_config["fedsampling-epsilon"])
    largest = int(max(digits(run_config, num_clients).partition_sizes))
    if max_size <= largest:
        raise ValueError(
            f"fedsampling-max-size={max_size} must exceed the largest partition "
            f"({largest} samples): FedSampling clips every size to max-size - 1"
        )
    needed = nodes_for_usable_estimate(max_size, ldp_alpha(epsilon, max_size))
    if needed > num_clients:
        raise ValueError(
            f"FedSampling's size estimate is noise on {num_clients} nodes at "
            f"fedsampling-epsilon={epsilon} and fedsampling-max-size={max_size} "
            f"(usable from about {needed} nodes): set fedsampling-epsilon >= "
            f"{epsilon_for_usable_estimate(num_clients, max_size):.1f} or run "
            "more SuperNodes"
        )
    samples_per_round = min(int(run_config["clients-per-round"]), num_clients) * int(
        run_config["samples-per-round-factor"]
    )
    return compat.FedSampling(
        samples_per_round=samples_per_round,
        max_size=max_size,
        epsilon=epsilon,
        server_lr=float(run_config["fedsampling-server-lr"]),
        min_available_nodes=num_clients,
        initial_parameters=initial_parameters(run_config, num_clients),
        evaluate_fn=central_evaluation(run_config, num_clients),
    )


def initial_parameters(run_config: UserConfig, num_clients: int) -> Parameters:
    """The run's initial MLP, as the legacy API's ``Parameters``."""
    model = model_for(run_config, digits(run_config, num_clients)).model
    return ndarrays_to_parameters(get_weights(model))


def build_strategy(run_config: UserConfig, num_clients: int) -> Strategy:
    """The legacy strategy named by the run config's ``strategy``."""
    name = str(run_config["strategy"])
    if name == "fedsampling":
        return fedsampling(run_config, num_clients)
    clients_per_round = min(int(run_config["clients-per-round"]), num_clients)
    # Every client-sampling method of the library on the legacy API.
    client_sampling = {
        spec.name: compat.legacy_class(spec.name)
        for spec in methods()
        if spec.legacy_api and spec.clients_per_round
    }
    if name not in client_sampling:
        raise ValueError(
            f"unknown strategy '{name}', one of {sorted(client_sampling)} "
            "or fedsampling"
        )
    # Flower's legacy FedAvg arguments, as a FedAvg-based project passes them;
    # clients_per_round replaces fraction_fit and min_fit_clients.
    return client_sampling[name](
        clients_per_round=clients_per_round,
        seed=int(run_config["seed"]),
        min_available_clients=num_clients,
        initial_parameters=initial_parameters(run_config, num_clients),
        evaluate_fn=central_evaluation(run_config, num_clients),
    )


def server_fn(context: Context) -> ServerAppComponents:
    """The run's strategy and number of rounds."""
    num_clients = int(context.run_config["num-supernodes"])
    return ServerAppComponents(
        strategy=build_strategy(context.run_config, num_clients),
        config=ServerConfig(num_rounds=int(context.run_config["num-server-rounds"])),
    )


app = ServerApp(server_fn=server_fn)
