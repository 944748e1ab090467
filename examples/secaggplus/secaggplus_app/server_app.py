"""The ServerApp: Flower's legacy ``DefaultWorkflow``, its fit by SecAgg+.

As in Flower's flower-secure-aggregation example, ``main`` wraps the context
in a ``LegacyContext`` with the strategy and runs
``DefaultWorkflow(fit_workflow=...)`` around Flower's ``SecAggPlusWorkflow``:
every train reply reaches the server masked, and the strategy sees only
their unmasked sums. FedSampling runs under ``SecAggPlusWorkflow`` itself and
is told it (``secure_aggregation=``), so its nodes send the weight that makes
the aggregate its sum; AOCS runs under ``SecureAOCSWorkflow``, which routes
each of its sums through it (docs/privacy.md). With
``secure-aggregation = false`` the same strategy runs under Flower's plain
fit workflow. The centralized evaluation writes each round's accuracy to
``<output-dir>/history.json`` and its global model to
``<output-dir>/round-<r>.npz``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import cast

import numpy as np
from flwr.app import Context, UserConfig
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.compat.server.typing import Workflow
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

#: A legacy fit workflow; ``DefaultWorkflow`` calls it with its ``LegacyContext``.
FitWorkflow = Callable[[Grid, LegacyContext], None]
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


def initial_parameters(run_config: UserConfig, num_nodes: int) -> Parameters:
    """The run's initial MLP (seeded by the run config), as legacy parameters."""
    return ndarrays_to_parameters(
        get_weights(model_for(run_config, digits(run_config, num_nodes)).model)
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
        initial_parameters=initial_parameters(run_config, num_nodes),
        evaluate_fn=evaluate_fn,
    )


def aocs(
    run_config: UserConfig,
    num_nodes: int,
    workflow: SecAggPlusWorkflow | None,
    evaluate_fn: EvaluateFn,
) -> Strategy:
    """AOCS, ``OptimalClientSampling(approximate=True)``, from the run config.

    Raises
    ------
    ValueError
        Under SecAgg+, fewer than 2 nodes or ``aocs-clients-per-round``
        below 2: SecAgg+ cannot sum one vector, so no round could step.
    """
    clients_per_round = int(run_config["aocs-clients-per-round"])
    if workflow is not None and min(clients_per_round, num_nodes) < 2:
        raise ValueError(
            f"AOCS under SecAgg+ needs at least 2 nodes and "
            f"aocs-clients-per-round >= 2 (SecAgg+ cannot sum one vector), got "
            f"{num_nodes} nodes and aocs-clients-per-round={clients_per_round}"
        )
    return compat.OptimalClientSampling(
        clients_per_round=clients_per_round,
        approximate=True,
        aocs_iterations=int(run_config["aocs-iterations"]),
        server_lr=float(run_config["aocs-server-lr"]),
        seed=int(run_config["seed"]),
        min_available_nodes=num_nodes,
        initial_parameters=initial_parameters(run_config, num_nodes),
        evaluate_fn=evaluate_fn,
    )


def secure_aocs_fit(
    secure_aggregation: SecAggPlusWorkflow, run_config: UserConfig
) -> FitWorkflow:
    """AOCS's fit under SecAgg+: each of its sums one run of ``secure_aggregation``.

    The run config's ``secure-aocs-unsafe-public-draws`` (false by default)
    sends the nodes the plain run's participation draws: tests only.
    """
    return compat.SecureAOCSWorkflow(
        secure_aggregation=secure_aggregation,
        unsafe_public_draws=bool(
            run_config.get("secure-aocs-unsafe-public-draws", False)
        ),
    )


@dataclass(frozen=True)
class Method:
    """A method of the app: its strategy, and its fit workflow under SecAgg+.

    ``secure_fit`` builds that workflow around the run's
    ``SecAggPlusWorkflow``; None runs the method under it directly.
    """

    strategy: StrategyFactory
    secure_fit: Callable[[SecAggPlusWorkflow, UserConfig], FitWorkflow] | None = None


#: The methods this app runs, by the run config's ``strategy``; each has its
#: client side in the ClientApp's ``HANDLERS``.
STRATEGIES: dict[str, Method] = {
    "fedsampling": Method(strategy=fedsampling),
    "aocs": Method(strategy=aocs, secure_fit=secure_aocs_fit),
}


def fit_workflow(
    method: Method,
    secure_aggregation: SecAggPlusWorkflow | None,
    run_config: UserConfig,
) -> FitWorkflow | None:
    """The run's fit: Flower's plain one (None), SecAgg+, or the method's around it."""
    if secure_aggregation is None or method.secure_fit is None:
        return secure_aggregation
    return method.secure_fit(secure_aggregation, run_config)


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
    method = STRATEGIES[name]
    num_nodes = int(run_config["num-supernodes"])
    secure = bool(run_config["secure-aggregation"])
    workflow = secaggplus_workflow(run_config) if secure else None
    strategy = method.strategy(
        run_config, num_nodes, workflow, central_evaluation(run_config, num_nodes)
    )
    fit = fit_workflow(method, workflow, run_config)
    log(INFO, "secaggplus-example: %s, secure aggregation %s", name, secure)
    legacy_context = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=int(run_config["num-server-rounds"])),
        strategy=strategy,
    )
    # DefaultWorkflow types its fit workflow for any Context; it calls it with
    # the LegacyContext it is given.
    DefaultWorkflow(fit_workflow=cast(Workflow | None, fit))(grid, legacy_context)
    if str(run_config["output-dir"]):
        # Each round's fit metrics (AOCS under SecAgg+: its quantization-bound).
        fit_metrics = {
            key: [[server_round, float(value)] for server_round, value in values]
            for key, values in legacy_context.history.metrics_distributed_fit.items()
        }
        path = Path(str(run_config["output-dir"])) / "fit-metrics.json"
        path.write_text(json.dumps(fit_metrics, indent=1))
