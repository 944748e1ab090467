"""``strategy = "power-of-choice"``: Power-of-Choice's highest-loss selection.

Options: ``power-of-choice-candidates`` (``d``, the candidate set's size; 0:
the strategy's default) and ``power-of-choice-variant`` (``pow-d`` or
``rpow-d``). ``clients-per-round`` is ``m``.
"""

from __future__ import annotations

from typing import cast

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.standard import method_handlers
from flwr_importance.strategies.power_of_choice import METHOD, PowerOfChoice, Variant
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> PowerOfChoice:
    """Power-of-Choice selecting ``m = clients-per-round`` (at most ``num_clients``)."""
    return PowerOfChoice(
        clients_per_round=min(config.clients_per_round, num_clients),
        candidates=int(config.option("power-of-choice-candidates")),
        # The constructor refuses a name that is not a Variant.
        variant=cast(Variant, config.option("power-of-choice-variant")),
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        # The ServerApp evaluates centrally.
        fraction_evaluate=0.0,
    )


def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FedAvg's train and evaluate, and the ``sizes`` and ``loss`` queries."""
    return method_handlers(METHOD, task_factory)


#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="power-of-choice-digits-dirichlet",
    canned=(
        CannedVariant(
            label="PowerOfChoice (pow-d, d = 2m)",
            replies={
                "query.sizes": "sizes",
                "query.loss": "loss",
                "train": "model",
            },
        ),
    ),
    # The deployment check's 4 nodes and m = 2: IID data (two rounds of the
    # preset's label skew may not improve the model), d = 2m (0) = 4.
    smoke={"partitioning": "iid", "power-of-choice-candidates": 0},
    benchmark="power_of_choice",
)
