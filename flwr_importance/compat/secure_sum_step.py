"""One SecAgg+ secure sum of small public-weight vectors, run from a fit workflow.

Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` runs one secure
aggregation per call: ``configure_fit`` of the context's strategy says who
takes part and what they are sent, and ``aggregate_fit`` receives every
result with the same parameters, the unmasked weighted mean. A protocol that
needs several sums in a round (AOCS, :mod:`.secure_aocs`) runs the workflow
once per sum with :class:`SecureSumStep` as the strategy: its ``configure_fit``
sends each node its step's public config and its ``aggregate_fit`` keeps the
mean. Every node replies with the same weight (``num-examples`` equal to the
workflow's ``max_weight``), so the mean times the number of results is the sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance.compat.transport import proxies_by_node
from flwr_importance.legacy_wire import ScalarDict


class SecureSumStep(Strategy):
    """The legacy strategy of one secure sum: send the configs, keep the mean.

    Parameters
    ----------
    configs : Mapping[ClientProxy, ScalarDict]
        Each taking node's proxy and the public config it is sent (no arrays).

    Attributes
    ----------
    mean : list of NDArray or None
        The unmasked mean of the nodes' vectors (None until aggregated).
    num_results : int
        The number of vectors in it.
    """

    def __init__(self, *, configs: Mapping[ClientProxy, ScalarDict]) -> None:
        self.configs = dict(configs)
        self.mean: list[NDArray[np.float64]] | None = None
        self.num_results = 0

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """None: the step has no model."""
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Each node's public config, no arrays."""
        empty = ndarrays_to_parameters([])
        return [
            (proxy, FitIns(empty, config)) for proxy, config in self.configs.items()
        ]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Keep the unmasked mean (every result carries it); no model."""
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
            self.num_results = len(results)
        return None, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """No evaluation."""
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """No evaluation."""
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """No evaluation."""
        return None


def secure_sum(
    secure_aggregation: SecAggPlusWorkflow,
    grid: Grid,
    context: LegacyContext,
    configs: Mapping[int, ScalarDict],
) -> list[NDArray[np.float64]] | None:
    """The secure sum of the vectors the nodes of ``configs`` send back.

    Parameters
    ----------
    secure_aggregation : SecAggPlusWorkflow
        The workflow that runs it (its ``max_weight`` is each node's weight).
    grid : Grid
        The ServerApp's grid.
    context : LegacyContext
        The legacy context: its client manager reaches the nodes; its state
        and model are left untouched.
    configs : Mapping[int, ScalarDict]
        Each taking node's id and the public config it is sent.

    Returns
    -------
    list of NDArray or None
        The sum; None (logged) when SecAgg+ did not unmask one over every
        node (a node dropped, or fewer than 2 took part): a partial sum
        would mix different sets of nodes.
    """
    proxies = proxies_by_node(context.client_manager)
    if configs.keys() - proxies.keys():
        log(WARNING, "secure sum: a node left before it; no sum")
        return None
    step = SecureSumStep(
        configs={proxies[node]: config for node, config in configs.items()}
    )
    step_context = LegacyContext(
        context,
        config=context.config,
        strategy=step,
        client_manager=context.client_manager,
    )
    secure_aggregation(grid, step_context)
    if step.mean is None or step.num_results != len(configs):
        log(
            WARNING,
            "secure sum: %d of %d nodes unmasked; the sum is not used",
            step.num_results,
            len(configs),
        )
        return None
    return [array * step.num_results for array in step.mean]
