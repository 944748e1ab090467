"""``strategy = "fedsampling"``: uniform data sampling with private sizes."""

from __future__ import annotations

from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> FedSampling:
    """FedSampling with the ``fedsampling-*`` options; every node takes part.

    ``num_clients`` is unused: all available nodes are queried each round, and
    the ServerApp has already waited for them (so one that leaves later does
    not stall the run).
    """
    return FedSampling(
        samples_per_round=int(config.option("fedsampling-samples-per-round")),
        max_size=int(config.option("fedsampling-max-size")),
        epsilon=float(config.option("fedsampling-epsilon")),
        server_lr=float(config.option("fedsampling-server-lr")),
        local_steps=int(config.option("fedsampling-local-steps")),
        min_available_nodes=1,
        server_optimizer=config.server_optimizer(),
    )


#: The ClientApp side: the method's handler set from the library.
client_handlers = make_fedsampling_handlers

#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="fedsampling-lognormal-sigma2",
    canned=(
        CannedVariant(
            arguments=lambda setup: {
                "samples_per_round": setup.total_size // 10,
                "max_size": setup.max_size,
                "fraction_evaluate": 0.0,
            },
            replies={"query.sizes": "size-response", "train": "gradient-sum"},
            # Every node answers the size query and trains on its kept samples.
            baseline="fedavg-all",
        ),
    ),
    equal_work=lambda work: {
        "fedsampling-local-steps": work.local_steps,
        "fedsampling-samples-per-round": work.clients_per_round * work.batch_size,
    },
    smoke_preset="fedsampling-lognormal-sigma1",
    benchmark="fedsampling",
)
