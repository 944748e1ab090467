"""The simulation's ServerApp: run the chosen strategy, evaluate centrally, report."""

from __future__ import annotations

import random
import time
from logging import INFO, WARNING

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy

from flwr_importance.strategies import CentralDP
from flwr_importance.tasks import Objective, evaluate
from simulations.config import ExperimentConfig
from simulations.methods import load_method
from simulations.report import (
    HistoryRow,
    history_rows,
    plot_history,
    privacy_ledger_of,
    write_history,
)
from simulations.task import federated_data, global_model

app = ServerApp()


def wait_for_nodes(grid: Grid, timeout: float = 120.0) -> int:
    """Number of connected nodes, once it has been stable for two seconds.

    The simulation registers all its virtual nodes at once, slightly after the
    ServerApp starts; SuperNodes of a deployment connect one by one.
    """
    deadline = time.monotonic() + timeout
    previous, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(list(grid.get_node_ids()))
        if count != previous:
            previous, stable_since = count, time.monotonic()
        elif count > 0 and time.monotonic() - stable_since >= 2.0:
            return count
        time.sleep(0.5)
    raise RuntimeError(f"no stable set of nodes connected within {timeout:.0f} s")


def build_strategy(config: ExperimentConfig, num_clients: int) -> Strategy:
    """The method's strategy for ``config``, in CentralDP where the keys ask.

    With ``central-dp-noise-multiplier`` above 0 the strategy is wrapped in
    :class:`~flwr_importance.strategies.wrappers.CentralDP`, its public
    population the ``num_clients`` nodes.

    Raises
    ------
    ValueError
        The ``central-dp-*`` keys ask for what the method cannot do (FOLB,
        Flower's baselines, ``"poisson"`` for a data-dependent sampler), with
        CentralDP's reason: before round 1.
    """
    strategy = load_method(config.strategy).build_strategy(config, num_clients)
    settings = config.central_dp()
    if settings is None:
        return strategy
    try:
        return CentralDP(
            strategy=strategy,
            noise_multiplier=settings.noise_multiplier,
            clipping_norm=settings.clipping_norm,
            target_delta=settings.target_delta,
            amplification=settings.amplification,
            population_size=num_clients,
            report_noise_multiplier=settings.report_noise_multiplier,
            report_clipping_norm=settings.report_clipping_norm,
        )
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"strategy '{config.strategy}' with central-dp-noise-multiplier="
            f"{settings.noise_multiplier:g}: {error}"
        ) from error


def start_single_model(
    grid: Grid,
    config: ExperimentConfig,
    num_clients: int,
    strategy: Strategy | None = None,
) -> Result:
    """Run the method's strategy on one model, evaluating centrally.

    ``strategy``: the one to run (the caller keeps it, e.g. to read its
    privacy ledger); None builds it from ``config`` (:func:`build_strategy`).
    """
    data = federated_data(config, num_clients)
    model = global_model(config, data)
    objective = Objective(data.task, l2=config.l2)
    if strategy is None:
        strategy = build_strategy(config, num_clients)

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        metrics = evaluate(
            model, data.test.x, data.test.y, objective, optimum=data.optimum
        )
        summary = ", ".join(f"{key}={value:.4g}" for key, value in metrics.items())
        log(INFO, "[%s] round %d: %s", config.strategy, server_round, summary)
        return MetricRecord(dict(metrics))

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=central_evaluate,
    )


def run_experiment(
    grid: Grid, config: ExperimentConfig, num_clients: int | None = None
) -> list[HistoryRow]:
    """Run ``config`` on ``grid``; write ``history.json`` and the plot.

    ``num_clients`` skips waiting for the node count where it is known (the
    in-process grid of tests and benchmarks).

    Returns
    -------
    list[HistoryRow]
        One row per evaluated round (round 0 is the initial model).
    """
    # Flower's stock strategies sample nodes with the global `random` module.
    random.seed(config.seed)
    num_clients = num_clients or wait_for_nodes(grid)
    if num_clients != config.num_supernodes:
        log(
            WARNING,
            "%d nodes connected but the run config is meant for num-supernodes=%d",
            num_clients,
            config.num_supernodes,
        )
    # A method training several models (mmfl) starts its strategy itself.
    method = load_method(config.strategy)
    start_strategy = getattr(method, "start_strategy", None)
    if start_strategy is not None:
        rows = history_rows(start_strategy(grid, config, num_clients))
    else:
        strategy = build_strategy(config, num_clients)
        result = start_single_model(grid, config, num_clients, strategy)
        rows = history_rows(result, privacy_ledger_of(strategy))
    output_dir = config.output_path()
    history_path = write_history(rows, output_dir)
    plot_path = plot_history(
        rows,
        output_dir,
        f"{config.strategy} on {config.dataset} ({num_clients} clients)",
    )
    log(INFO, "History written to %s", history_path)
    log(INFO, "Plot written to %s", plot_path)
    return rows


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run``."""
    run_experiment(grid, ExperimentConfig.from_run_config(context.run_config))
