"""``strategy = "clustered"``: clustered sampling, Algorithm 1 or 2 (Fraboni et al.).

Options (``[tool.flwr.app.config]``): ``clustered-method`` (``size`` or
``similarity``), ``clustered-distance`` (``arccos``, ``l2``, ``l1``) and
``clustered-projection-dim`` (0: keep representative gradients whole).
"""

from __future__ import annotations

from typing import cast

from flwr_importance.clientapps.clustered import (
    make_clustered_handlers,
)
from flwr_importance.sampling.distances import Distance
from flwr_importance.strategies.clustered import ClusteredSampling, ClusteringMethod
from flwr_importance.tooling.declarations import (
    CannedVariant,
    MethodTooling,
    sampling_arguments,
)
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> ClusteredSampling:
    """``ClusteredSampling`` drawing ``clients-per-round`` clients per round."""
    projection_dim = int(config.option("clustered-projection-dim"))
    return ClusteredSampling(
        clients_per_round=config.clients_per_round,
        method=cast(ClusteringMethod, str(config.option("clustered-method"))),
        distance=cast(Distance, str(config.option("clustered-distance"))),
        projection_dim=projection_dim or None,
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        # The ServerApp evaluates centrally.
        fraction_evaluate=0.0,
    )


#: The ClientApp side: the method's handler set from the library.
client_handlers = make_clustered_handlers

#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="clustered-digits",
    canned=(
        CannedVariant(
            name="clustered-size",
            label="ClusteredSampling (size, Alg. 1)",
            arguments=sampling_arguments(method="size"),
            replies={"query.sizes": "sizes", "train": "model"},
        ),
        CannedVariant(
            name="clustered-similarity",
            label="ClusteredSampling (similarity, Alg. 2)",
            arguments=lambda setup: {
                **sampling_arguments(method="similarity")(setup),
                "projection_dim": setup.projection_dim,
            },
            replies={"query.sizes": "sizes", "train": "model"},
        ),
    ),
    equal_work=lambda work: {"clustered-method": "similarity"},
    smoke={"partitioning": "iid"},
    benchmark="clustered",
)
