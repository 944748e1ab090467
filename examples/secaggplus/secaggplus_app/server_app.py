"""The ServerApp: Flower's legacy ``DefaultWorkflow``, its fit by SecAgg+.

As in Flower's flower-secure-aggregation example, ``main`` wraps the context
in a ``LegacyContext`` with the strategy and runs
``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``: every train reply
reaches the server masked, and the strategy's ``aggregate_fit`` sees only
their unmasked aggregate. The strategy is told the same workflow
(``secure_aggregation=``), so its nodes send the weight that makes the
aggregate its sum. With ``secure-aggregation = false`` the same strategy runs
under Flower's plain fit workflow. The centralized evaluation writes each
round's accuracy to ``<output-dir>/history.json`` and its global model to
``<output-dir>/round-<r>.npz``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Context, UserConfig
from flwr.common import NDArrays, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from flwr_importance import compat
from flwr_importance.compat.adapter import EvaluateFn
from flwr_importance.sampling import (
    epsilon_for_usable_estimate,
    ldp_alpha,
    nodes_for_usable_estimate,
)
from flwr_importance.tasks import evaluate, get_weights, set_weights
from secaggplus_app.task import digits, model_for

#: ``(run_config, num_nodes, workflow or None, evaluate_fn) -> strategy``.
StrategyFactory = Callable[
    [UserConfig, int, SecAggPlusWorkflow | None, EvaluateFn], Strategy
]


def secaggplus_workflow(run_config: UserConfig) -> SecAggPlusWorkflow:
    """SecAgg+ with the run config's shares, threshold, ranges and weight."""
    timeout = float(run_config["timeout"])
    return SecAggPlusWorkflow(
        num_shares=int(run_config["num-shares"]),
        reconstruction_threshold=int(run_config["reconstruction-threshold"]),
        max_weight=float(run_config["max-weight"]),
        clipping_range=float(run_config["clipping-range"]),
        quantization_range=int(run_config["quantization-range"]),
        timeout=timeout if timeout > 0 else None,
    )


def fedsampling(
    run_config: UserConfig,
    num_nodes: int,
    workflow: SecAggPlusWorkflow | None,
    evaluate_fn: EvaluateFn,
) -> Strategy:
    """FedSampling with the run config's settings, if its size estimate can work.

    Raises
    ------
    ValueError
        ``fedsampling-max-size`` does not exceed the largest partition, or
        ``num_nodes`` are too few for the epsilon (the error says which
        epsilon would do).
    """
    max_size = int(run_config["fedsampling-max-size"])
    epsilon = float(run_config["fedsampling-epsilon"])
    largest = int(max(digits(run_config, num_nodes).partition_sizes))
    if max_size <= largest:
        raise ValueError(
            f"fedsampling-max-size={max_size} must exceed the largest partition "
            f"({largest} samples): FedSampling clips every size to max-size - 1"
        )
    needed = nodes_for_usable_estimate(max_size, ldp_alpha(epsilon, max_size))
    if needed > num_nodes:
        raise ValueError(
            f"FedSampling's size estimate is noise on {num_nodes} nodes at "
            f"fedsampling-epsilon={epsilon} (usable from about {needed} nodes): "
            f"set fedsampling-epsilon >= "
            f"{epsilon_for_usable_estimate(num_nodes, max_size):.1f}"
        )
    return compat.FedSampling(
        samples_per_round=int(run_config["fedsampling-samples-per-round"]),
        max_size=max_size,
        epsilon=epsilon,
        server_lr=float(run_config["fedsampling-server-lr"]),
        secure_aggregation=workflow,
        min_available_nodes=num_nodes,
        initial_parameters=ndarrays_to_parameters(
            get_weights(model_for(run_config, digits(run_config, num_nodes)).model)
        ),
        evaluate_fn=evaluate_fn,
    )


#: The methods this app runs, by the run config's ``strategy``; each has its
#: client side in the ClientApp's ``HANDLERS``.
STRATEGIES: dict[str, StrategyFactory] = {"fedsampling": fedsampling}


def central_evaluation(run_config: UserConfig, num_nodes: int) -> EvaluateFn:
    """Accuracy of the global model on the pooled test set, every round.

    With an ``output-dir``, also writes the rounds so far to
    ``history.json`` and the round's global model to ``round-<r>.npz``.
    """
    task = model_for(run_config, digits(run_config, num_nodes))
    output_dir = Path(str(run_config["output-dir"]))
    history: list[dict[str, float]] = []

    def evaluate_fn(
        server_round: int, weights: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, dict[str, Scalar]]:
        set_weights(task.model, weights)
        metrics = evaluate(task.model, task.x, task.y, task.objective)
        if str(run_config["output-dir"]):
            history.append({"round": server_round, **metrics})
            output_dir.mkdir(parents=True, exist_ok=True)
            np.savez(output_dir / f"round-{server_round}.npz", *weights)
            (output_dir / "history.json").write_text(json.dumps(history, indent=1))
        return metrics["loss"], {"accuracy": metrics["accuracy"]}

    return evaluate_fn


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The run's strategy through Flower's legacy workflow, SecAgg+ or plain."""
    run_config = context.run_config
    name = str(run_config["strategy"])
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}', one of {sorted(STRATEGIES)}")
    num_nodes = int(run_config["num-supernodes"])
    secure = bool(run_config["secure-aggregation"])
    workflow = secaggplus_workflow(run_config) if secure else None
    strategy = STRATEGIES[name](
        run_config, num_nodes, workflow, central_evaluation(run_config, num_nodes)
    )
    log(INFO, "secaggplus-example: %s, secure aggregation %s", name, secure)
    legacy_context = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=int(run_config["num-server-rounds"])),
        strategy=strategy,
    )
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy_context)
