"""``strategy = "ocs"``: optimal client sampling (OCS), or AOCS, for one model.

Options: ``ocs-approximate`` (AOCS instead of the exact probabilities),
``ocs-aocs-iterations`` (its ``j_max``), ``ocs-uniform`` (OCS's uniform
control: ``p_i = m / N`` with OCS's query, estimator and seeded draws),
``ocs-server-lr`` (server step on the unbiased estimate), ``ocs-pool-size``
(the available pool ``n`` queried each round; 0: every node).
``clients-per-round`` is the expected number of participants ``m``.
"""

from __future__ import annotations

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.variance_reduced import make_ocs_handlers
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> OptimalClientSampling:
    """OCS with ``m = clients-per-round`` (at most ``num_clients``)."""
    return OptimalClientSampling(
        clients_per_round=min(config.clients_per_round, num_clients),
        approximate=bool(config.option("ocs-approximate")),
        aocs_iterations=int(config.option("ocs-aocs-iterations")),
        uniform=bool(config.option("ocs-uniform")),
        server_lr=float(config.option("ocs-server-lr")),
        pool_size=int(config.option("ocs-pool-size")) or None,
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        # The ServerApp evaluates centrally.
        fraction_evaluate=0.0,
    )


def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """``query.norm`` (train and keep), ``train`` (send the kept update), evaluate."""
    return make_ocs_handlers(task_factory)


#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="ocs-digits-lognormal",
    canned=(CannedVariant(replies={"query.norm": "norm", "train": "kept-update"}),),
    benchmark="variance_reduced",
)
