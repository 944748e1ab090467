"""``strategy = "isfedavg"``: two-level importance sampling (docs/methods.md §1).

Options (run-config keys, see ``pyproject.toml``): ``isfedavg-uniform``,
``isfedavg-min-local-steps``/``isfedavg-max-local-steps`` (``E_k``),
``isfedavg-min-batch-size``/``isfedavg-max-batch-size`` (``B_k``),
``isfedavg-min-relative-client-prob`` and ``isfedavg-min-relative-sample-prob``.
``clients-per-round`` is ``L`` and ``local-lr`` is ``mu``; ``local-steps``,
``local-epochs`` and ``batch-size`` are not used (the strategy sends each node
its ``E_k`` and ``B_k``).
"""

from __future__ import annotations

from flwr_importance.clientapps.isfedavg import (
    make_isfedavg_handlers,
)
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> ISFedAvg:
    """ISFedAvg selecting ``clients-per-round`` nodes; federated evaluation off."""
    clients_per_round = min(config.clients_per_round, num_clients)
    return ISFedAvg(
        clients_per_round=clients_per_round,
        local_steps_range=(
            int(config.option("isfedavg-min-local-steps")),
            int(config.option("isfedavg-max-local-steps")),
        ),
        batch_size_range=(
            int(config.option("isfedavg-min-batch-size")),
            int(config.option("isfedavg-max-batch-size")),
        ),
        uniform=bool(config.option("isfedavg-uniform")),
        min_relative_client_prob=float(
            config.option("isfedavg-min-relative-client-prob")
        ),
        min_relative_sample_prob=float(
            config.option("isfedavg-min-relative-sample-prob")
        ),
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        fraction_evaluate=0.0,
        min_available_nodes=clients_per_round,
    )


#: The ClientApp side: the method's handler set from the library.
client_handlers = make_isfedavg_handlers

#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="isfedavg-logistic",
    canned=(CannedVariant(replies={"train": "isfedavg-train"}),),
    # Fixed E_k and B_k: the same steps and batch as a FedAvg client.
    equal_work=lambda work: {
        "isfedavg-min-local-steps": work.local_steps,
        "isfedavg-max-local-steps": work.local_steps,
        "isfedavg-min-batch-size": work.batch_size,
        "isfedavg-max-batch-size": work.batch_size,
    },
    benchmark="isfedavg",
)
